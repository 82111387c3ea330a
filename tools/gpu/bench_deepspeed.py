#!/usr/bin/env python3
"""The two DeepSpeed reports measured with DeepSpeed itself (issue 27): per-rank and node host
memory, time, and logits, with and without ckptd.

  inference  (report 1) each rank: from_pretrained(GPT-Neo folder) + deepspeed.init_inference
             (AutoTP, replace_with_kernel_inject=False) -- against --
             ckpt.deepspeed.init_inference(name): the model on the meta device, AutoTP, each
             rank's shards from ckptd
  zero3      (report 2) each rank: HfDeepSpeedConfig + zero.MiCS_Init + from_pretrained(bloom
             folder) -- against -- ckpt.deepspeed.zero3_model(name, ds_config, mics=True).
             On the CPU also "deepspeed-waited": the same from_pretrained inside
             ckpt.deepspeed.gathers_waited() (DeepSpeed 0.14.5's coalesced gather waits for
             its last all-gather only, which over gloo leaves the others writing into what
             transformers' rank 0 loads; docs/deepspeed.md), and every mode's partitions
             are checked against the safetensors file itself, element for element.

Models are transformers config classes with random weights of the real shapes, written with
save_pretrained (no hub). Ranks are processes of this script (--worker); the parent samples
the node's Shmem + AnonPages (/proc/meminfo) for the peak while they hold what they loaded,
minus the node before they start (the daemon's shared copy is counted, loaded before: it is
part of ckptd's figure), and the node at hold (all ranks loaded). Each rank reports its
peak RSS (VmHWM), what it holds then (RssAnon: private; RssShmem: ckptd's segment mapped,
counted once in the node's Shmem; RssFile: mapped files), its load time and its logits (or,
on the CPU, checksums of its partitions), compared across modes. Ranks beyond the GPUs
share them (--backend gloo, the default there: NCCL refuses two ranks on one GPU).

  tools/gpu/bench_deepspeed.py --ckptd BIN --workdir DIR --case inference|zero3
      [--shape full|small] [--ranks 1] [--device cuda|cpu] [--markdown OUT.md] [--json OUT.jsonl]

DeepSpeed from PYTHONPATH (tools/deepspeed-src/obtain.sh, DS_BUILD_OPS=0).
"""
import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
SHAPES = {
    # report 1: EleutherAI/gpt-neo-2.7B's config (fp32, as the report ran it)
    ("inference", "full"): ("GPTNeoConfig", dict(hidden_size=2560, num_layers=32, num_heads=20,
                                                 attention_types=[[["global", "local"], 16]],
                                                 max_position_embeddings=2048, vocab_size=50257), torch.float32),
    ("inference", "small"): ("GPTNeoConfig", dict(hidden_size=256, num_layers=4, num_heads=8,
                                                  attention_types=[[["global", "local"], 2]],
                                                  max_position_embeddings=512, vocab_size=50257), torch.float32),
    # report 2: bigscience/bloom-7b1's config (fp16, as the report loaded it)
    ("zero3", "full"): ("BloomConfig", dict(hidden_size=4096, n_layer=30, n_head=32, vocab_size=250880), torch.float16),
    # bloom-7b1's widths with 2 of its 30 layers: for several CPU ranks in the machine's memory
    ("zero3", "layers2"): ("BloomConfig", dict(hidden_size=4096, n_layer=2, n_head=32, vocab_size=250880),
                           torch.float16),
    ("zero3", "small"): ("BloomConfig", dict(hidden_size=256, n_layer=2, n_head=8, vocab_size=250880), torch.float16),
}


def meminfo():
    out = {}
    with open("/proc/meminfo") as f:
        for line in f:
            key, value = line.split(":", 1)
            out[key] = int(value.split()[0]) * 1024
    return out


def node_bytes():
    """The node's anonymous + shared memory (what private copies and ckptd's segment take)."""
    m = meminfo()
    return m["AnonPages"] + m["Shmem"]


def file_cache_bytes():
    """The node's page cache of files (Cached counts shared memory too)."""
    m = meminfo()
    return m["Cached"] - m["Shmem"]


def drop_file_cache(paths):
    """Drops the page cache of `paths` (no root needed), so a run's file reads are counted."""
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def own_peak():
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmHWM", "VmRSS", "RssAnon", "RssShmem", "RssFile")):
                k, v = line.split(":", 1)
                out[k] = int(v.split()[0]) * 1024
    return out


def make_folder(folder, case, shape, device):
    import transformers
    if os.path.exists(os.path.join(folder, "config.json")):
        return
    cfg_name, kwargs, dtype = SHAPES[(case, shape)]
    config = getattr(transformers, cfg_name)(**kwargs)
    torch.manual_seed(0)
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype)
    tmp = folder + ".partial"
    model.save_pretrained(tmp, max_shard_size="1000GB")
    os.replace(tmp, folder)
    del model
    if device == "cuda":
        torch.cuda.empty_cache()


def ds_config(world, dtype):
    half = {"enabled": True}
    cfg = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3, "mics_shard_size": world}}
    cfg["fp16" if dtype == torch.float16 else "bf16"] = half
    return cfg


def backend(args, world):
    """nccl with a GPU per rank; gloo on the CPU, and where ranks share a GPU (NCCL refuses
    two ranks of one communicator on one device), unless --backend says."""
    if args.backend:
        return args.backend
    if args.device == "cpu" or world > torch.cuda.device_count():
        return "gloo"
    return "nccl"


def worker(args):
    """One rank: loads as --mode says, reports, waits for the parent's release (SIGUSR1)."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    import deepspeed
    if args.device == "cpu":
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False  # no JIT build (docs/deepspeed.md)
    deepspeed.init_distributed(dist_backend=backend(args, world), auto_mpi_discovery=False)
    if args.device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
    import transformers
    import ckpt
    import ckpt.deepspeed as ckds
    _, _, dtype = SHAPES[(args.case, args.shape)]
    if args.device == "cpu" and dtype == torch.float16:
        dtype = torch.bfloat16
    vocab = SHAPES[(args.case, args.shape)][1]["vocab_size"]
    ids = torch.randint(0, vocab, (1, 32), generator=torch.Generator().manual_seed(1))
    t0 = time.perf_counter()
    logits = checksum = mem = None
    if args.case == "inference":
        if args.mode == "deepspeed":
            model = transformers.AutoModelForCausalLM.from_pretrained(args.folder, dtype=dtype)
            engine = deepspeed.init_inference(model, tensor_parallel={"tp_size": world}, dtype=dtype,
                                              replace_with_kernel_inject=False)
        else:
            engine = ckds.init_inference(args.name, dtype=dtype, socket=args.socket)
        if args.device == "cuda":
            torch.cuda.synchronize()
        load_s = time.perf_counter() - t0
        mem = own_peak()
        with torch.no_grad():
            logits = engine.module(ids.to(next(engine.module.parameters()).device)).logits.float().cpu()
    else:
        cfg = ds_config(world, dtype)
        if args.mode.startswith("deepspeed"):
            try:
                from transformers.integrations import HfDeepSpeedConfig
            except ImportError:
                from transformers.integrations.deepspeed import HfDeepSpeedConfig
            keep = HfDeepSpeedConfig(cfg)  # noqa: F841 (transformers reads it while it lives)
            waited = ckds.gathers_waited() if args.mode == "deepspeed-waited" else contextlib.nullcontext()
            with waited, deepspeed.zero.MiCS_Init(config_dict_or_path=cfg):
                model = transformers.AutoModelForCausalLM.from_pretrained(args.folder, dtype=dtype)
        else:
            model = ckds.zero3_model(args.name, cfg, mics=True, socket=args.socket)
        if args.device == "cuda":
            torch.cuda.synchronize()
        load_s = time.perf_counter() - t0
        mem = own_peak()
        if args.device == "cuda":
            try:
                engine, *_ = deepspeed.initialize(model=model, config=cfg)
                engine.eval()
                with torch.no_grad():
                    logits = engine(ids.to(engine.device)).logits.float().cpu()
            except Exception as e:  # noqa: BLE001 (reported; the partitions are compared instead)
                import traceback
                traceback.print_exc()
                print(f"LOGITS FAILED: {type(e).__name__}: {e}", flush=True)
        if logits is None:
            # ZeRO-3's forward gathers with all_gather_into_tensor; a checksum of this rank's
            # partitions is what such a run compares.
            # Only the elements a partition holds: DeepSpeed leaves the padding of the last
            # partition uninitialised (torch.empty), ckptd zero-fills it.
            checksum = {}
            for n, p in model.named_parameters():
                part_rank, _ = ckds._zero_layout(p, n)
                per = p.ds_tensor.numel()
                valid = max(0, min(per, p.ds_numel - per * part_rank))
                checksum[n] = float(torch.sum(p.ds_tensor[:valid], dtype=torch.float64))
    out = {"rank": rank, "load_s": load_s, **mem}
    if logits is not None:
        torch.save(logits, os.path.join(args.workdir, f"logits-{args.case}-{args.mode}-{world}-{rank}.pt"))
    if checksum is not None:
        with open(os.path.join(args.workdir, f"sums-{args.case}-{args.mode}-{world}-{rank}.json"), "w") as f:
            json.dump(checksum, f)
    released = threading.Event()
    signal.signal(signal.SIGUSR1, lambda *_: released.set())
    print("RESULT " + json.dumps(out), flush=True)
    print("READY", flush=True)
    released.wait(600)
    if checksum is not None:  # after the release: the file's pages are not the load's
        print("CHECK " + json.dumps(against_file(model, args.folder, ckds)), flush=True)


def against_file(model, folder, ckds):
    """This rank's partitions against the safetensors file's own elements (in the
    partitions' dtype): which parameters differ and in how many elements."""
    from safetensors import safe_open
    differ, elements, checked = [], 0, 0
    files = [os.path.join(folder, f) for f in os.listdir(folder) if f.endswith(".safetensors")]
    where = {}
    for f in files:
        with safe_open(f, "pt") as h:
            where.update({k: f for k in h.keys()})
    for n, p in model.named_parameters():
        if n not in where:
            continue
        with safe_open(where[n], "pt") as h:
            full = h.get_tensor(n).reshape(-1).to(p.ds_tensor.dtype)
        part_rank, _ = ckds._zero_layout(p, n)
        per = p.ds_tensor.numel()
        start = per * part_rank
        valid = max(0, min(per, p.ds_numel - start))
        bad = int((p.ds_tensor[:valid] != full[start:start + valid]).sum())
        checked += 1
        if bad:
            differ.append(f"{n} ({bad} of {valid})")
            elements += bad
        del full
    return {"checked": checked, "differ": differ, "elements": elements}


def run_ranks(args, mode, world):
    env = dict(os.environ, WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(29500 + (os.getpid() + world) % 1000), DS_BUILD_OPS="0", NDEV_PER_NODE=str(world))
    if args.device == "cpu":
        env.update(DS_ACCELERATOR="cpu", OMP_NUM_THREADS=str(max(1, (os.cpu_count() or 2) // world)),
                   CUDA_VISIBLE_DEVICES="")
    drop_file_cache(args.files)
    base, fbase = node_bytes(), file_cache_bytes()
    peak, fpeak = [base], [fbase]
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            peak[0] = max(peak[0], node_bytes())
            fpeak[0] = max(fpeak[0], file_cache_bytes())
            time.sleep(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    t0 = time.perf_counter()
    procs = []
    for r in range(world):
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--mode", mode] + args.passthrough
        # LOCAL_RANK is the GPU DeepSpeed's InferenceEngine takes (set_device(LOCAL_RANK)):
        # ranks sharing the GPUs take rank % GPUs, and each block of GPUs ranks is described
        # as one node (LOCAL_WORLD_SIZE), so the launcher variables agree with each other
        # (ckpt refuses LOCAL_RANK=0 of LOCAL_WORLD_SIZE=2 for RANK=1 of WORLD_SIZE=2).
        gpus = max(1, torch.cuda.device_count()) if args.device == "cuda" else world
        local = r % gpus
        rank_env = dict(env, RANK=str(r), LOCAL_RANK=str(local), LOCAL_WORLD_SIZE=str(min(gpus, world - (r - local))))
        procs.append(subprocess.Popen(cmd, env=rank_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    # Every rank's output is read as it comes, each by a thread of its own: a rank whose
    # pipe filled (transformers' progress bars) while this read another would block in its
    # write, and the collective the others wait in with it.
    logs = [[] for _ in procs]
    ready = [threading.Event() for _ in procs]

    def drain(r, p):
        for line in p.stdout:
            logs[r].append(line)
            if line.startswith("READY"):
                ready[r].set()
        ready[r].set()  # exited (or READY): nothing more to wait for

    readers = [threading.Thread(target=drain, args=(r, p), daemon=True) for r, p in enumerate(procs)]
    for t in readers:
        t.start()
    # A rank that fails before READY ends the run at once (the others would wait for it in
    # DeepSpeed's collectives until its 30-minute timeout), with that rank's output.
    while not all(e.is_set() for e in ready):
        failed = [r for r, p in enumerate(procs) if p.poll() not in (None, 0)]
        if failed:
            for p in procs:
                if p.poll() is None:
                    p.kill()
            for t in readers:
                t.join(timeout=10)
            for r in failed:
                sys.stderr.write(f"rank {r} exited with {procs[r].returncode}:\n" + "".join(logs[r][-200:]))
            stop.set()
            raise RuntimeError(f"{mode} world {world}: rank(s) {failed} failed before they were ready")
        time.sleep(0.1)
    wall = time.perf_counter() - t0
    hold = node_bytes()
    peak[0] = max(peak[0], hold)
    stop.set()
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGUSR1)
    for p in procs:
        p.wait(timeout=300)
    for t in readers:
        t.join(timeout=60)
    results, checks = [], {}
    for r, lines in enumerate(logs):
        for line in lines:
            if line.startswith("RESULT "):
                results.append(json.loads(line[7:]))
            if line.startswith("CHECK "):
                checks[r] = json.loads(line[6:])
    for p, lines in zip(procs, logs):
        if p.returncode not in (0, None) or len(results) != world:
            sys.stderr.write("".join(lines[-400:]))
    if len(results) != world:
        raise RuntimeError(f"{mode} world {world}: {len(results)} of {world} ranks reported "
                           f"(exit codes {[p.returncode for p in procs]})")
    results = sorted(results, key=lambda r: r["rank"])
    for r in results:
        r["check"] = checks.get(r["rank"])
    return peak[0] - base, fpeak[0] - fbase, hold - base, results, wall


def compare(args, world, mode_a, mode_b):
    """(equal, max abs diff) of mode_b's logits (or partition checksums) against mode_a's."""
    worst, equal = 0.0, True
    for r in range(world):
        if os.path.exists(os.path.join(args.workdir, f"logits-{args.case}-{mode_b}-{world}-{r}.pt")):
            a = torch.load(os.path.join(args.workdir, f"logits-{args.case}-{mode_a}-{world}-{r}.pt"))
            b = torch.load(os.path.join(args.workdir, f"logits-{args.case}-{mode_b}-{world}-{r}.pt"))
            equal = equal and torch.equal(a, b)
            worst = max(worst, float((a - b).abs().max()))
        else:
            with open(os.path.join(args.workdir, f"sums-{args.case}-{mode_a}-{world}-{r}.json")) as f:
                a = json.load(f)
            with open(os.path.join(args.workdir, f"sums-{args.case}-{mode_b}-{world}-{r}.json")) as f:
                b = json.load(f)
            differ = sorted(k for k in a if a[k] != b.get(k))
            if differ or a.keys() != b.keys():
                equal = False
                print(f"rank {r}: {len(differ)} of {len(a)} partition sums of {mode_b} differ from {mode_a}'s: " + ", ".join(
                    f"{k} ({a[k]:.6g} vs {b.get(k, float('nan')):.6g})" for k in differ[:12]), flush=True)
            worst = max([worst] + [abs(a[k] - b.get(k, float("nan"))) for k in a])
    return equal, worst


GIB = 2**30


def label(mode):
    return {"deepspeed": "DeepSpeed (from_pretrained per rank)",
            "deepspeed-waited": "DeepSpeed, gathers_waited (PR #8539's fix)",
            "ckptd": "ckptd (ckpt.deepspeed)"}.get(mode, mode)


def file_check(results):
    """The partitions against the file, over all ranks: '' where not checked."""
    checks = [r.get("check") for r in results]
    if not checks or any(c is None for c in checks):
        return ""
    differ = sorted({d.split(" (")[0] for c in checks for d in c["differ"]})
    elements = sum(c["elements"] for c in checks)
    if not differ:
        return f"equal ({checks[0]['checked']} parameters)"
    return f"**{len(differ)} of {checks[0]['checked']} differ** ({elements} elements: {', '.join(differ[:4])}" + \
        (f" and {len(differ) - 4} more" if len(differ) > 4 else "") + ")"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worker", action="store_true")
    ap.add_argument("--prepare-only", action="store_true", help="write the model folder and stop (no ckpt needed)")
    ap.add_argument("--mode", default="deepspeed")
    ap.add_argument("--ckptd")
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--case", required=True, choices=["inference", "zero3"])
    ap.add_argument("--shape", default="full")
    ap.add_argument("--ranks", default="1")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--modes", default="deepspeed,ckptd",
                    help="deepspeed, deepspeed-waited (zero3: from_pretrained inside ckpt.deepspeed.gathers_waited), ckptd")
    ap.add_argument("--backend", help="torch.distributed backend (default: nccl, gloo on the CPU or ranks sharing a GPU)")
    ap.add_argument("--markdown")
    ap.add_argument("--json")
    ap.add_argument("--folder")
    ap.add_argument("--name")
    ap.add_argument("--socket")
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    os.makedirs(args.workdir, exist_ok=True)
    folder = os.path.join(args.workdir, f"{args.case}-{args.shape}")
    t0 = time.perf_counter()
    make_folder(folder, args.case, args.shape, "cuda" if torch.cuda.is_available() else "cpu")
    if args.prepare_only:
        print(f"{folder} ready ({time.perf_counter() - t0:.1f} s)", flush=True)
        return 0
    import ckpt
    files = [os.path.join(folder, f) for f in os.listdir(folder) if f.endswith(".safetensors")]
    args.files = files
    size = sum(os.path.getsize(f) for f in files)
    print(f"{folder}: {size / 2**30:.2f} GiB ({time.perf_counter() - t0:.1f} s to write)", flush=True)
    sock = os.path.join(args.workdir, f"ckptd-{args.case}.sock")
    name = f"{args.case}-{args.shape}"
    args.passthrough = ["--workdir", args.workdir, "--case", args.case, "--shape", args.shape, "--device",
                        args.device, "--folder", folder, "--name", name, "--socket", sock] + \
        (["--backend", args.backend] if args.backend else [])
    rows = []
    daemon = None
    modes = args.modes.split(",")
    try:
        for world in [int(w) for w in args.ranks.split(",")]:
            for mode in modes:
                if mode == "ckptd" and daemon is None:
                    if os.path.exists(sock):
                        os.unlink(sock)
                    daemon = subprocess.Popen([args.ckptd, "--socket", sock, "--shm-prefix", f"ckds{os.getpid()}",
                                               "--cleanup-on-exit", "--state-dir", os.path.join(args.workdir, "state"),
                                               "--load-threads", "16"])
                    client = ckpt.connect(sock, wait=10)
                    before = node_bytes()
                    t1 = time.perf_counter()
                    client.load(folder, name=name)
                    daemon_bytes = node_bytes() - before  # the node's one shared copy
                    print(f"ckptd load {time.perf_counter() - t1:.2f} s, +{daemon_bytes / GIB:.2f} GiB", flush=True)
                mem, cache, hold, results, wall = run_ranks(args, mode, world)
                if mode == "ckptd":
                    mem += daemon_bytes  # loaded before the ranks started: part of ckptd's figure
                    hold += daemon_bytes
                row = {"case": args.case, "shape": args.shape, "device": args.device, "mode": mode, "world": world,
                       "backend": backend(args, world), "checkpoint_bytes": size, "node_bytes": mem,
                       "node_hold_bytes": hold, "file_cache_bytes": cache, "node_x": (mem + cache) / size,
                       "wall_s": wall, "load_s": [r["load_s"] for r in results],
                       "rank_hwm": [r.get("VmHWM", 0) for r in results],
                       "rank_anon": [r.get("RssAnon", 0) for r in results],
                       "rank_shmem": [r.get("RssShmem", 0) for r in results],
                       "rank_file": [r.get("RssFile", 0) for r in results],
                       "against_file": file_check(results), "checks": [r.get("check") for r in results]}
                if mode == "ckptd":
                    row["daemon_bytes"] = daemon_bytes
                rows.append(row)
                print(json.dumps(row), flush=True)
            ref = "deepspeed-waited" if "deepspeed-waited" in modes else "deepspeed"
            for other in [m for m in modes if m != ref]:
                if ref in modes:
                    equal, worst = compare(args, world, ref, other)
                    rows.append({"case": args.case, "world": world, "ref": ref, "other": other, "equal": equal,
                                 "max_abs_diff": worst})
                    what = "logits" if args.device == "cuda" or args.case == "inference" else "partition sums"
                    print(f"world {world}: {other}'s {what} equal to {ref}'s: {equal} (max abs diff {worst})", flush=True)
    finally:
        if daemon is not None:
            daemon.send_signal(signal.SIGTERM)
            daemon.wait(timeout=60)
    if args.json:
        with open(args.json, "a") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
    table = [f"### {args.case}, {args.shape} shape, {args.device}, checkpoint {size / GIB:.2f} GiB", "",
             "| ranks | loading | node anon + shm, peak (+GiB) | at hold (+GiB) | node file cache, peak (+GiB) | "
             "node total, x checkpoint | per-rank peak RSS (GiB) | per-rank anon / shm at hold (GiB) | "
             "per-rank load (s) | against the file |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "mode" in r:
            table.append(f"| {r['world']} | {label(r['mode'])} | {r['node_bytes'] / GIB:.2f} | "
                         f"{r['node_hold_bytes'] / GIB:.2f} | {r['file_cache_bytes'] / GIB:.2f} | {r['node_x']:.2f} | "
                         f"{', '.join(f'{h / GIB:.2f}' for h in r['rank_hwm'])} | "
                         f"{', '.join(f'{a / GIB:.2f} / {m / GIB:.2f}' for a, m in zip(r['rank_anon'], r['rank_shmem']))} | "
                         f"{', '.join(f'{t:.2f}' for t in r['load_s'])} | {r['against_file']} |")
        else:
            table.append(f"| {r['world']} | {label(r['other'])} = {label(r['ref'])}? | equal: {r['equal']} "
                         f"(max abs diff {r['max_abs_diff']:g}) | | | | | | | |")
    print("\n".join(table), flush=True)
    if args.markdown:
        with open(args.markdown, "a") as f:
            f.write("\n".join(table) + "\n\n")


if __name__ == "__main__":
    sys.exit(main())
