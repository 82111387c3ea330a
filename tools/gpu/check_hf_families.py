#!/usr/bin/env python3
"""Issues 16 and 25, "What must be shown": every model type transformers shards, sharded as it does.

The model types are those of the plan data (src/plan/hf_tp_plans.json, tools/gpu/gen_hf_plans.py:
every model type of the installed transformers with a tensor-parallel plan), plus the families
ckptd serves with no transformers plan (NO_PLAN_FAMILIES). For each, a tiny random model of the
data's model class is built from transformers' own config class (tools/gpu/hf_tiny.py: hidden
64, 2 layers, 8 heads, ...), saved with save_pretrained and loaded into a ckptd started here
(`ckptctl load FOLDER`). Then, one process per rank:
  - world 1, on the GPU (cuda:0): the "hf" state dict (state_dict(0, 1, plan="auto",
    convention="hf", device="cuda:0")) against from_pretrained(folder, device_map="cuda:0")'s
    tensors, and ckpt.transformers.load_model's logits against from_pretrained's;
  - world 2 and 4 (--worlds), on the CPU with gloo (CUDA_VISIBLE_DEVICES=, RANK/WORLD_SIZE/
    MASTER_ADDR as torchrun sets them): every rank's state_dict(rank, world, plan="auto",
    convention="hf") against from_pretrained(folder, tp_plan="auto")'s local parameter tensors
    (DTensor.to_local() where transformers holds DTensors), names, shapes, dtypes and bytes;
    load_model's logits against from_pretrained(tp_plan="auto")'s at world 2 and 4 (--logits-worlds).
    (A base model without an LM head: its last hidden state stands for the logits.)
Writes a markdown table (model type x world) to --out and prints a traceback for everything
that failed. A model type transformers itself cannot build, save or shard is listed with
transformers' own error. One family failing or hanging (--family-timeout without progress)
does not stop the others; the families are spread over --shards rank groups per world.

  python3 tools/gpu/check_hf_families.py --ckptd build-gpu/bin/ckptd --out /tmp/hf_families.md
      [--worlds 2,4] [--logits-worlds 2,4] [--families llama,gpt2] [--workdir /tmp/hf-families]
      [--no-gpu] [--shards 2] [--family-timeout 120] [--data src/plan/hf_tp_plans.json]
No network: nothing is downloaded. Needs transformers and torch >= 2.5 (torch.distributed).
"""
import argparse
import datetime
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import forked  # noqa: E402
import hf_tiny  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
COMMON = dict(vocab_size=128, pad_token_id=0, bos_token_id=1, eos_token_id=2)

# Families ckptd serves that transformers has no tensor-parallel plan for (world 1 only under
# "hf"): (row name, config class, its kwargs); causal LMs.
NO_PLAN_FAMILIES = [
    ("falcon", "FalconConfig", dict(COMMON, hidden_size=64, num_hidden_layers=2, num_attention_heads=8,
                                    new_decoder_architecture=True, num_kv_heads=4)),
    ("gpt-neo", "GPTNeoConfig", dict(COMMON, hidden_size=64, num_layers=2, num_heads=8, intermediate_size=128,
                                     attention_types=[[["global", "local"], 1]], max_position_embeddings=128,
                                     window_size=32)),
    ("gpt2", "GPT2Config", dict(COMMON, n_embd=64, n_layer=2, n_head=8, n_positions=128, n_inner=128)),
    ("gptj", "GPTJConfig", dict(COMMON, n_embd=64, n_layer=2, n_head=8, rotary_dim=4, n_positions=128, n_inner=128)),
    ("bloom", "BloomConfig", dict(COMMON, hidden_size=64, n_layer=2, n_head=8)),
    ("opt", "OPTConfig", dict(COMMON, hidden_size=64, num_hidden_layers=2, num_attention_heads=8, ffn_dim=128,
                              max_position_embeddings=128, word_embed_proj_dim=64)),
]
NAMES_SHOWN = 3


def log(*parts):
    print(f"[{time.strftime('%H:%M:%S')}]", *parts, flush=True)


def first_line(e):
    """The exception's first line, with the next one where the first only introduces it
    (transformers' "Class validation error for validator '...':")."""
    return hf_tiny.first_lines(e, 200)


# ---------------------------------------------------------------------------------------
# Parent: models, daemon, rank groups, table.

def family_specs(data_path):
    """[(row name, spec)]: every model type of the plan data (spec {"model_class", "task"}),
    then NO_PLAN_FAMILIES (spec {"config_class", "kwargs"})."""
    with open(data_path) as f:
        data = json.load(f)
    specs = [(mt, {"model_class": e.get("model_class"), "task": e.get("task")})
             for mt, e in sorted(data["families"].items())]
    specs += [(name, {"config_class": cls, "kwargs": kwargs}) for name, cls, kwargs in NO_PLAN_FAMILIES]
    return specs, data.get("transformers")


# Files a model's from_pretrained reads beside its weights that save_pretrained does not write
# (its hub folder has them): written into the saved folder as the hub's are, with no content
# that matters to the weights (qwen2_5_omni's speaker table: no speakers).
HUB_SIDE_FILES = {"qwen2_5_omni": {"spk_dict.pt": {}}}


def make_model(item):
    """(row name, entry) for one family: builds its tiny model and saves it; never raises.
    entry: {"status": "ok" | "absent" | "error", "folder", "detail", "tp_plan", "class"}."""
    fam, spec, folder = item
    spec = json.loads(spec)
    entry = {"folder": folder, "status": "ok", "detail": "", "tp_plan": None}
    try:
        import torch
        import transformers
        if "config_class" in spec:
            config_cls = getattr(transformers, spec["config_class"], None)
            if config_cls is None:
                entry.update(status="absent", detail=f"transformers {transformers.__version__} has no "
                             f"{spec['config_class']}")
                return fam, entry
            config = config_cls(**spec["kwargs"])
            class_name = "AutoModelForCausalLM"

            def build():
                return transformers.AutoModelForCausalLM.from_config(config)
        else:
            model_cls = getattr(transformers, spec["model_class"] or "", None)
            if model_cls is None:
                entry.update(status="absent", detail=f"transformers {transformers.__version__} has no "
                             f"{spec['model_class']}")
                return fam, entry
            try:
                config = hf_tiny.tiny_config(fam)
            except Exception as e:
                entry.update(status="error", detail=f"transformers' config class: {first_line(e)}")
                return fam, entry
            class_name = model_cls.__name__

            def build():
                return hf_tiny.tiny_model(model_cls, config)
        torch.manual_seed(0)
        try:
            model = build()
        except Exception as e:
            entry.update(status="error", detail=f"transformers builds no {class_name}: {first_line(e)}")
            traceback.print_exc()
            return fam, entry
        with torch.no_grad():  # every tensor random (biases and norms too), so a wrong slice shows
            for p in model.parameters():
                if p.is_floating_point():
                    p.normal_(0.0, 0.2)
        entry["tp_plan"] = dict(getattr(model, "tp_plan", None) or {})
        entry["class"] = type(model).__name__
        shutil.rmtree(folder, ignore_errors=True)
        try:
            model.save_pretrained(folder)
        except Exception as e:
            entry.update(status="error", detail=f"transformers' save_pretrained: {first_line(e)}")
            traceback.print_exc()
            return fam, entry
        for name, content in HUB_SIDE_FILES.get(fam, {}).items():
            torch.save(content, os.path.join(folder, name))
        log(f"{fam}: {entry['class']} saved ({', '.join(sorted(os.listdir(folder)))}); transformers TP plan: "
            f"{len(entry['tp_plan'])} rules")
    except Exception as e:
        entry.update(status="error", detail=f"building/saving the model: {first_line(e)}")
        traceback.print_exc()
    sys.stdout.flush()
    return fam, entry


def make_models(families, workdir, jobs, deadline_at):
    """{family: entry} (make_model), built by `jobs` forked processes side by side."""
    items = [(fam, json.dumps(spec), os.path.join(workdir, "models", fam)) for fam, spec in families]

    def failed(item, why):
        return item[0], {"folder": item[2], "status": "error", "detail": f"building the model: {why}", "tp_plan": None}
    built = dict(result for _, result in forked.forked(items, make_model, jobs, deadline_at, 180, failed))
    out = {fam: built[fam] for fam, _ in families}
    for fam, entry in out.items():
        if entry["status"] != "ok":
            log(f"{fam}: {entry['detail']}")
    return out


def start_daemon(ckptd, workdir):
    sock = os.path.join(workdir, "ckptd.sock")
    if os.path.exists(sock):
        os.unlink(sock)
    logf = open(os.path.join(workdir, "ckptd.log"), "ab")
    proc = subprocess.Popen([ckptd, "--socket", sock, "--shm-prefix", f"hffam{os.getpid()}", "--cleanup-on-exit"],
                            stdout=logf, stderr=logf)
    deadline = time.time() + 20
    while time.time() < deadline and not os.path.exists(sock):
        if proc.poll() is not None:
            raise RuntimeError(f"ckptd exited with {proc.returncode}; see {workdir}/ckptd.log")
        time.sleep(0.05)
    return proc, sock


def load_into_daemon(ckptctl, sock, models):
    for fam, entry in models.items():
        if entry["status"] != "ok":
            continue
        r = subprocess.run([ckptctl, "--socket", sock, "load", entry["folder"], "--name", f"hf-{fam}"],
                           capture_output=True, text=True)
        if r.returncode != 0:
            entry.update(status="error", detail=f"ckptctl load: {(r.stderr or r.stdout).strip().splitlines()[-1:]}")
            log(f"{fam}: ckptctl load failed:\n{r.stdout}{r.stderr}")
        else:
            log(f"{fam}: loaded into ckptd as hf-{fam}")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_group(args, world, families, device, logits, results_dir, shard=0):
    """Runs `world` worker processes over `families`; returns {family: [per-rank results]}.
    A group that dies, or whose ranks write no result for --family-timeout seconds, is
    restarted without the family it was on."""
    remaining = list(families)
    collected = {}
    attempt = 0
    while remaining and attempt < len(families) + 1:
        attempt += 1
        tag = f"w{world}-{device}-s{shard}-a{attempt}"
        port = free_port()
        procs = []
        paths = []
        for rank in range(world):
            env = dict(os.environ, CKPT_CHECK_RANK=str(rank), CKPT_CHECK_WORLD=str(world),
                       OMP_NUM_THREADS=str(max(1, (os.cpu_count() or 2) // (2 * world))))
            for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
                env.pop(var, None)
            if world > 1:  # as torchrun sets them (world 1: a plain process, as a user runs one)
                env.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
                           MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
            if device == "cpu":
                env["CUDA_VISIBLE_DEVICES"] = ""
            path = os.path.join(results_dir, f"{tag}-r{rank}.jsonl")
            paths.append(path)
            cmd = [sys.executable, "-X", "faulthandler", os.path.abspath(__file__), "--worker",
                   "--socket", args.socket, "--models", args.models_json, "--results", path,
                   "--families", ",".join(remaining), "--device", device, "--collective-timeout",
                   str(args.collective_timeout)] + (["--logits"] if logits else [])
            out = open(os.path.join(results_dir, f"{tag}-r{rank}.log"), "w")
            procs.append((subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT), out))
        def progress():
            return sum(os.path.getsize(p) for p in paths if os.path.exists(p))
        seen, last = progress(), time.time()
        while time.time() - last < args.family_timeout and time.time() < args.deadline_at \
                and any(p.poll() is None for p, _ in procs):
            time.sleep(0.5)
            now = progress()
            if now != seen:
                seen, last = now, time.time()
        timed_out = any(p.poll() is None for p, _ in procs)
        for p, out in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
            p.wait()
            out.close()
        per_rank = []
        for path in paths:
            rows = {}
            if os.path.exists(path):
                with open(path) as f:
                    for line in f:
                        try:
                            row = json.loads(line)
                        except ValueError:
                            continue
                        rows[row["family"]] = row
            per_rank.append(rows)
        for rank in range(world):  # the ranks' logs: tracebacks per family are in them
            with open(os.path.join(results_dir, f"{tag}-r{rank}.log")) as f:
                text = f.read()
            if text.strip() and (args.verbose or "Traceback" in text):
                print(f"----- {tag} rank {rank} log -----\n{text}", flush=True)
        done = [fam for fam in remaining if all(fam in rows for rows in per_rank)]
        for fam in done:
            collected[fam] = [rows[fam] for rows in per_rank]
        remaining = [fam for fam in remaining if fam not in done]
        started = any(f"=== {remaining[0]} " in open(os.path.join(results_dir, f"{tag}-r{r}.log")).read()
                      for r in range(world)) if remaining else True
        if remaining and not done and not started:
            log(f"world {world} on {device}: the rank group failed before its first family (see the logs above)")
            for fam in remaining:
                collected[fam] = [{"family": fam, "rank": r, "error": "the rank group failed before its first "
                                   "family (see its log)"} for r in range(world)]
            break
        if remaining and time.time() >= args.deadline_at:
            log(f"world {world} on {device}: the check's deadline passed; {len(remaining)} families not run")
            break
        if remaining:
            stuck = remaining.pop(0)
            why = "timed out" if timed_out else "died (exit codes " + ",".join(str(p.returncode) for p, _ in procs) + ")"
            log(f"world {world} on {device}: the rank group {why} during {stuck}; restarting without it")
            collected[stuck] = [{"family": stuck, "rank": r, "error": f"rank group {why} during this family "
                                 "(see its log above)"} for r in range(world)]
    return collected


def summarize_tensors(rows):
    errs = [r[k] for k in ("transformers_unloaded", "tensors_error", "error") for r in rows if r.get(k)]
    if errs:
        return "error: " + errs[0]
    bad = []
    for r in rows:
        bad.extend(f"r{r['rank']}: {d}" for d in r.get("tensors_diff", []))
    n = rows[0].get("tensors_compared", 0) if rows else 0
    if not bad:
        return f"equal ({n} tensors x {len(rows)} ranks)"
    return f"**different** ({len(bad)}): " + "; ".join(bad[:NAMES_SHOWN])


def summarize_logits(rows):
    errs = [r.get("logits_error") for r in rows if r.get("logits_error")] + [r.get("error") for r in rows if r.get("error")]
    if errs:
        return "error: " + errs[0]
    if not rows or "logits_equal" not in rows[0]:
        return "-"
    fills = sorted({r.get("fill", "?") for r in rows})
    if all(r["logits_equal"] for r in rows):
        text = "equal"
    else:
        text = f"**max abs diff {max(r['logits_max_diff'] for r in rows):.3g}**"
    model_diff = [d for r in rows for d in r.get("model_diff", [])]
    if model_diff:
        text += f"; model tensors differ: {'; '.join(model_diff[:NAMES_SHOWN])}"
    layout = [d for r in rows for d in r.get("layout_diff", [])]
    if layout and not all(r["logits_equal"] for r in rows):
        text += f"; unlike transformers' model: {'; '.join(layout[:NAMES_SHOWN])}"
    return text + ("" if fills == ["ckpt"] else f" (fill={','.join(fills)})")


def esc(text):
    return str(text).replace("|", "\\|").replace("\n", " ")


def write_table(path, models, results, worlds, logits_worlds, gpu, versions, with_plan):
    cols = []
    if gpu:
        cols += [("gpu", 1, "tensors"), ("gpu", 1, "logits")]
    for w in worlds:
        cols.append(("cpu", w, "tensors"))
        if w in logits_worlds:
            cols.append(("cpu", w, "logits"))
    head = ["family"] + [f"{'GPU' if d == 'gpu' else 'CPU/gloo'} TP={w} {k}" for d, w, k in cols]
    counts = {}
    for fam, entry in models.items():
        if fam not in with_plan or entry["status"] != "ok":
            continue
        cells = {(d, w, k): (summarize_tensors if k == "tensors" else summarize_logits)(
            results.get((d, w), {}).get(fam) or [{"error": "not run"}]) for d, w, k in cols}
        if all(c.startswith("equal") for (_, _, k), c in cells.items() if k == "tensors"):
            counts["tensors"] = counts.get("tensors", 0) + 1
            logits = [c for (_, _, k), c in cells.items() if k == "logits"]
            if logits and all(c.startswith("equal") for c in logits):
                counts["logits"] = counts.get("logits", 0) + 1
            elif any("transformers' own forward" in c for c in logits) and not any("load_model" in c for c in logits):
                counts["own"] = counts.get("own", 0) + 1
    lines = [f"Generated by `tools/gpu/check_hf_families.py` on "
             f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; "
             f"{versions}. {len(with_plan)} model types with a transformers TP plan: "
             f"{counts.get('tensors', 0)} with every rank's tensors equal at every world "
             f"({counts.get('logits', 0)} of them with load_model's logits equal at every world too, "
             f"{counts.get('own', 0)} where transformers' own model does not run forward at some world), "
             f"{len(with_plan) - counts.get('tensors', 0)} not (each row says why).", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for fam in models:
        entry = models[fam]
        if entry["status"] != "ok":
            lines.append(f"| {fam} | " + " | ".join([esc(entry["detail"])] + ["-"] * (len(cols) - 1)) + " |")
            continue
        cells = []
        for d, w, k in cols:
            rows = results.get((d, w), {}).get(fam)
            if not rows:
                cells.append("not run")
            elif k == "tensors":
                cells.append(esc(summarize_tensors(rows)))
            else:
                cells.append(esc(summarize_logits(rows)))
        note = "" if entry.get("tp_plan") else " (no transformers TP plan)"
        lines.append(f"| {fam}{note} | " + " | ".join(cells) + " |")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def parent(args):
    import torch
    import transformers
    versions = f"transformers {transformers.__version__}, torch {torch.__version__}"
    log(versions)
    os.makedirs(args.workdir, exist_ok=True)
    specs, data_version = family_specs(args.data)
    if data_version != transformers.__version__:
        log(f"note: the plan data is for transformers {data_version}, this is {transformers.__version__}")
    known = [f for f, _ in specs]
    wanted = [f for f in args.families.split(",") if f] if args.families else known
    unknown = [f for f in wanted if f not in known]
    if unknown:
        sys.exit(f"unknown families {unknown}; known: {known}")
    families = [(f, spec) for f, spec in specs if f in wanted]
    with_plan = {f for f, spec in families if "model_class" in spec}
    t0 = time.time()
    models = make_models(families, args.workdir, args.jobs, args.deadline_at)
    log(f"{sum(e['status'] == 'ok' for e in models.values())} of {len(models)} models built and saved "
        f"({time.time() - t0:.0f} s)")
    args.models_json = os.path.join(args.workdir, "models.json")
    with open(args.models_json, "w") as f:
        json.dump(models, f)
    ckptctl = args.ckptctl or os.path.join(os.path.dirname(os.path.abspath(args.ckptd)), "ckptctl")
    daemon, args.socket = start_daemon(args.ckptd, args.workdir)
    results = {}
    try:
        load_into_daemon(ckptctl, args.socket, models)
        with open(args.models_json, "w") as f:
            json.dump(models, f)
        ok = [f for f, e in models.items() if e["status"] == "ok"]
        results_dir = os.path.join(args.workdir, "results")
        shutil.rmtree(results_dir, ignore_errors=True)
        os.makedirs(results_dir)
        gpu = not args.no_gpu and torch.cuda.is_available()
        groups = ([("gpu", 1, "cuda", True)] if gpu else []) + [("cpu", w, "cpu", w in args.logits_worlds)
                                                               for w in args.worlds]

        def run(key, world, device, logits, shard, fams):  # the groups run side by side
            try:
                got = run_group(args, world, fams, device, logits, results_dir, shard)
                results.setdefault((key, world), {}).update(got)
            except Exception:
                log(f"world {world} on {device}, shard {shard}: the driver failed")
                traceback.print_exc()

        import threading
        threads = []
        for key, world, device, logits in groups:
            for shard in range(args.shards):
                fams = ok[shard::args.shards]
                log(f"world {world} on {device}, shard {shard}: {len(fams)} families")
                threads.append(threading.Thread(target=run, args=(key, world, device, logits, shard, fams)))
                threads[-1].start()
        for t in threads:
            t.join()
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=30)
    write_table(args.out, models, results, args.worlds, args.logits_worlds, gpu, versions, with_plan)
    log(f"table written to {args.out} ({time.time() - t0:.0f} s)")
    with open(args.out) as f:
        print(f.read(), flush=True)


# ---------------------------------------------------------------------------------------
# Worker: one rank, every family in turn.

def local(t):
    return t.to_local() if hasattr(t, "to_local") else t


def same_bytes(a, b):
    if a.dtype != b.dtype or tuple(a.shape) != tuple(b.shape):
        return False
    import torch
    a = a.detach().contiguous().cpu().reshape(-1)
    b = b.detach().contiguous().cpu().reshape(-1)
    if a.numel() == 0:
        return True
    return torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def describe(t):
    return f"{tuple(t.shape)} {str(t.dtype).replace('torch.', '')}"


def compare(ours, ref_model):
    """Differences between {name: tensor} and the reference model's local tensors (its
    state_dict; names it holds only as tied aliases of a compared tensor are fine)."""
    ref = {n: local(t) for n, t in ref_model.state_dict().items()}
    diffs = []
    for name, t in ours.items():
        r = ref.get(name)
        if r is None:
            diffs.append(f"{name}: not in transformers' model")
        elif not same_bytes(local(t), r):
            diffs.append(f"{name}: {describe(local(t))} vs transformers {describe(r)}"
                         + ("" if describe(local(t)) != describe(r) else " (bytes differ)"))
    ptrs = {r.data_ptr() for n, r in ref.items() if n in ours and r.numel()}
    for name, r in ref.items():
        if name not in ours and not (r.numel() and r.data_ptr() in ptrs):
            diffs.append(f"{name}: missing (transformers holds {describe(r)})")
    return diffs


def kind(t):
    """A parameter's kind as the TP forward sees it: a DTensor's placements, or a plain tensor."""
    if hasattr(t, "placements"):
        return "DTensor(" + ",".join(str(p) for p in t.placements) + ")"
    return "Tensor"


def layout_diff(model, ref_model):
    """Where `model` is laid out unlike transformers' own: parameters and buffers of another
    kind (DTensor or not), tied groups it lacks, modules with another number of TP hooks."""
    def layout(m):
        kinds, owners = {}, {}
        for n, t in list(m.named_parameters(remove_duplicate=False)) + list(m.named_buffers(remove_duplicate=False)):
            kinds[n] = kind(t)
            owners.setdefault(id(t), []).append(n)
        tied = {n: tuple(sorted(g)) for g in owners.values() if len(g) > 1 for n in g}
        hooks = {n: (len(x._forward_pre_hooks), len(x._forward_hooks)) for n, x in m.named_modules()}
        return kinds, tied, hooks
    (k1, t1, h1), (k2, t2, h2) = layout(model), layout(ref_model)
    out = [f"{n} is {k1[n]}, transformers' {k2[n]}" for n in k2 if n in k1 and k1[n] != k2[n]]
    out += [f"{n} tied with {t2[n]} there, with {t1.get(n, 'nothing')} here" for n in t2 if t1.get(n) != t2[n]]
    out += [f"module {n or '(root)'} has (pre, post) hooks {h1[n]}, transformers' {h2[n]}"
            for n in h2 if n in h1 and h1[n] != h2[n]]
    return out


def output_of(model, ids):
    """The model's logits for `ids`, or its last hidden state where it has no LM head."""
    extra = {"decoder_input_ids": ids} if getattr(model.config, "is_encoder_decoder", False) else {}
    out = model(input_ids=ids, **extra)
    logits = getattr(out, "logits", None)
    return local(logits if logits is not None else out.last_hidden_state)


def worker(args):
    import torch
    import torch.distributed as dist
    import transformers
    import ckpt
    import ckpt.transformers
    rank, world = int(os.environ["CKPT_CHECK_RANK"]), int(os.environ["CKPT_CHECK_WORLD"])
    device = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    if world > 1:
        dist.init_process_group("gloo", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=args.collective_timeout))
    with open(args.models) as f:
        models = json.load(f)
    client = ckpt.connect(args.socket)
    out = open(args.results, "a")
    # Ordinary token ids: above the special ones (pad/bos/eos 0-2), below the tiny vocabulary.
    ids = torch.randint(3, COMMON["vocab_size"], (2, 12), generator=torch.Generator().manual_seed(1234)).to(device)
    for fam in args.families.split(","):
        entry = models[fam]
        row = {"family": fam, "rank": rank, "world": world}
        t0 = time.time()
        print(f"=== {fam} rank {rank}/{world} on {device}", flush=True)
        ref = None
        try:
            kwargs = {"tp_plan": "auto"} if world > 1 else {"device_map": str(device)}
            cls = getattr(transformers, entry["class"])
            # a class with a from_pretrained of its own (qwen2_5_omni's) may not pass the
            # loading info through: asked of transformers' own only
            own = getattr(cls.from_pretrained, "__func__", None) is transformers.PreTrainedModel.from_pretrained.__func__
            ref = cls.from_pretrained(entry["folder"], output_loading_info=own, **kwargs)
            ref, info = ref if own else (ref, {})
            ref.eval()
            missing, unexpected = sorted(info.get("missing_keys") or []), sorted(info.get("unexpected_keys") or [])
            if missing and unexpected:  # its own loader maps its saved names to names its model lacks
                row["transformers_unloaded"] = (
                    f"transformers' from_pretrained of its own save_pretrained folder leaves {len(missing)} "
                    f"parameters at their init ({', '.join(missing[:2])}, ...) and loads {len(unexpected)} saved "
                    f"tensors into no parameter ({', '.join(unexpected[:2])}, ...)")
        except Exception as e:
            row["error"] = f"transformers' from_pretrained({'tp_plan=auto' if world > 1 else ''}): {first_line(e)}"
            traceback.print_exc()
        checkpoint = client.attach(f"hf-{fam}")
        # A ckptd that keeps no config.json with the segment: the folder's, and the family's
        # built-in plan by model_type instead of "auto".
        config = None if getattr(checkpoint, "config", None) is not None else entry["folder"]
        plan = "auto"
        if config is not None:
            try:
                plan = ckpt.transformers._ckpt_plan(checkpoint, "auto", ckpt.transformers.model_config(None, config),
                                                    world)
            except Exception as e:
                row["note"] = f"no plan for this family without a stored config: {first_line(e)}"
        if ref is not None:
            try:
                sd = checkpoint.state_dict(rank, world, plan, convention="hf", device=device)
                row["tensors_compared"] = len(sd)
                row["tensors_diff"] = compare(sd, ref)
                del sd
            except Exception as e:
                row["tensors_error"] = f"ckpt state_dict(plan=auto, convention=hf): {first_line(e)}"
                traceback.print_exc()
            want = None
            if args.logits:
                try:  # transformers' own forward first: a model it cannot run is its row's cause
                    with torch.no_grad():
                        want = output_of(ref, ids)
                except Exception as e:
                    row["logits_error"] = f"transformers' own forward: {first_line(e)}"
                    traceback.print_exc()
            if want is not None:
                model = None
                try:
                    model = ckpt.transformers.load_model(f"hf-{fam}", rank=rank, world=world, device=device,
                                                         client=client, config=config)
                    row["fill"] = getattr(model, "ckpt_fill", "?")
                    row["model_diff"] = compare({n: t for n, t in model.state_dict().items()}, ref)
                    with torch.no_grad():
                        got = output_of(model, ids)
                    row["logits_equal"] = bool(torch.equal(got, want))
                    row["logits_max_diff"] = float((got.float() - want.float()).abs().max().item())
                    if not row["logits_equal"]:
                        row["layout_diff"] = layout_diff(model, ref)[:8]
                except Exception as e:
                    row["logits_error"] = f"load_model: {first_line(e)}"
                    if model is not None:
                        unlike = layout_diff(model, ref)
                        if unlike:
                            row["logits_error"] += f" (unlike transformers' model: {'; '.join(unlike[:4])})"
                    traceback.print_exc()
                del model
        row["seconds"] = round(time.time() - t0, 2)
        print(f"=== {fam} rank {rank}: {json.dumps({k: v for k, v in row.items() if k != 'tensors_diff'})}"
              + (f"\n    differences: {row['tensors_diff'][:10]}" if row.get("tensors_diff") else ""), flush=True)
        out.write(json.dumps(row) + "\n")
        out.flush()
        os.fsync(out.fileno())
        del ref
        if world > 1:
            dist.barrier()  # ranks go on to the next family together
        if device.type == "cuda":
            torch.cuda.empty_cache()
    out.close()
    if world > 1:
        dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ckptd", help="ckptd binary (parent)")
    ap.add_argument("--ckptctl", help="ckptctl binary (default: next to ckptd)")
    ap.add_argument("--out", help="markdown table to write (parent)")
    ap.add_argument("--workdir", default="/tmp/hf-families")
    ap.add_argument("--worlds", default="2,4", help="CPU/gloo TP degrees")
    ap.add_argument("--logits-worlds", default="2,4", help="CPU TP degrees that also compare load_model's logits")
    ap.add_argument("--families", default="", help="comma-separated subset (default: all)")
    ap.add_argument("--no-gpu", action="store_true", help="skip the world-1 GPU column")
    ap.add_argument("--family-timeout", type=float, default=120,
                    help="seconds a rank group may run without finishing a family")
    ap.add_argument("--deadline", type=float, default=0,
                    help="seconds: stop the rank groups then and write the table of what is done")
    ap.add_argument("--shards", type=int, default=2, help="rank groups per world, side by side")
    ap.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 2) - 2),
                    help="processes building the models")
    ap.add_argument("--data", default=os.path.join(ROOT, "src", "plan", "hf_tp_plans.json"),
                    help="the plan data whose model types are checked")
    ap.add_argument("--verbose", action="store_true", help="print every rank log, not only those with tracebacks")
    ap.add_argument("--collective-timeout", type=float, default=60, help="gloo timeout in the workers")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--socket", help=argparse.SUPPRESS)
    ap.add_argument("--models", help=argparse.SUPPRESS)
    ap.add_argument("--results", help=argparse.SUPPRESS)
    ap.add_argument("--device", default="cpu", help=argparse.SUPPRESS)
    ap.add_argument("--logits", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return
    if not args.ckptd or not args.out:
        ap.error("--ckptd and --out are required")
    args.worlds = [int(w) for w in args.worlds.split(",") if w]
    args.logits_worlds = [int(w) for w in args.logits_worlds.split(",") if w]
    args.deadline_at = time.time() + args.deadline if args.deadline else float("inf")
    parent(args)


if __name__ == "__main__":
    main()
