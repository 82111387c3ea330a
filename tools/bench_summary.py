#!/usr/bin/env python3
"""Summarises tools/bench_gpu.sh's results.jsonl as a Markdown table (duplicates dropped).

  bench_summary.py RESULTS.jsonl [--plot FILE.png]

--plot also draws per-rank time by TP degree (slowest rank, log scale): the fastest ckpt
configuration, the Python loaders, and the time the pinned host->device limit allows.
"""
import collections
import json
import sys

rows, seen = [], set()
for line in open(sys.argv[1]):
    if not line.startswith("{"):
        continue
    r = json.loads(line)
    key = tuple((k, v) for k, v in sorted(r.items()) if k not in ("rep", "node_mem"))
    if key in seen:
        continue
    seen.add(key)
    rows.append(r)
lim = [r for r in rows if r["what"] == "limit"]
print("\npinned H2D, one GPU alone: %s GiB/s; pageable %s GiB/s" % (
    ", ".join("%.1f" % r["pinned_GiBps"] for r in lim), ", ".join("%.1f" % r["pageable_GiBps"] for r in lim)))
la = [r for r in rows if r["what"] == "limit_all"]
if la:
    print("pinned H2D, all GPUs at once: %s GiB/s each" % ", ".join("%.1f" % r["pinned_GiBps"] for r in la))
limit = min(r["pinned_GiBps"] for r in (la or lim))
g = collections.defaultdict(list)
for r in rows:
    if r["what"] in ("load", "safetensors", "torchload", "torchfull"):
        if r["what"] == "load":
            name = "ckpt %s, %d streams, %g MiB chunks%s%s%s" % (
                r["path"], r["streams"], r["chunk_MiB"],
                ", %d register threads" % r["reg_threads"] if r["path"] == "register" else "",
                ", %d buffers/stream" % r["buffers"] if r["path"] == "bounce" and r.get("buffers", 2) != 2 else "",
                ", fp32->" + r["dtype"] if r.get("dtype", "-") != "-" else "")
        else:
            name = {"safetensors": "safetensors safe_open(cuda) + get_slice",
                    "torchload": "torch.load(mmap=True) + slice + .to(cuda)",
                    "torchfull": "torch.load (full) + slice + .to(cuda)"}[r["what"]]
        g[(r["world"], name)].append(r)
print("\n| TP | loader | per-rank s (slowest rank) | GiB/rank | GiB/s/rank | % of pinned limit | node mem peak GiB | notes |")
print("|---|---|---|---|---|---|---|---|")
for (w, name), rs in sorted(g.items(), key=lambda kv: (kv[0][0], min(x["seconds"] for x in kv[1]))):
    sec = max(x["seconds"] for x in rs)
    gib = max(x.get("copied_GiB", x["out_GiB"]) for x in rs)
    mem = max(x.get("node_mem", -1) for x in rs)
    notes = ""
    if name.startswith("ckpt register"):
        notes = "register %.2f s of %.2f GiB, unregister %.2f s" % (
            max(x["register_s"] for x in rs), max(x["registered_GiB"] for x in rs), max(x["unregister_s"] for x in rs))
    print("| %d | %s | %.3f | %.2f | %.1f | %.0f%% | %s | %s |" % (
        w, name, sec, gib, gib / sec, 100 * gib / sec / limit, "%.2f" % (mem / 2**30) if mem >= 0 else "-", notes))


def plot(path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    worlds = sorted({w for w, _ in g})
    series = collections.OrderedDict()
    for w in worlds:
        ckpt = [max(x["seconds"] for x in rs) for (ww, n), rs in g.items() if ww == w and n.startswith("ckpt")]
        if ckpt:
            series.setdefault("ckpt (fastest configuration)", {})[w] = min(ckpt)
        for (ww, n), rs in g.items():
            if ww == w and not n.startswith("ckpt"):
                series.setdefault(n, {})[w] = max(x["seconds"] for x in rs)
        gib = max(x.get("copied_GiB", x["out_GiB"]) for (ww, n), rs in g.items() if ww == w for x in rs)
        series.setdefault("pinned host->device limit", {})[w] = gib / limit
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.8 / len(series)
    for i, (name, by_w) in enumerate(series.items()):
        xs = [k + i * width for k, w in enumerate(worlds) if w in by_w]
        ax.bar(xs, [by_w[w] for w in worlds if w in by_w], width, label=name)
    ax.set_xticks([k + 0.4 - width / 2 for k in range(len(worlds))])
    ax.set_xticklabels(["TP=%d" % w for w in worlds])
    ax.set_yscale("log")
    ax.set_ylabel("seconds per rank, attach to shards on GPU")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print("\nplot written to %s" % path)


if any(r.get("alone") for r in rows):
    print("\n(ALONE=1: each rank ran alone on GPU 0; node memory is one rank's)")
if "--plot" in sys.argv:
    try:
        plot(sys.argv[sys.argv.index("--plot") + 1])
    except ImportError as e:
        print("\nno plot: %s" % e)
