#!/usr/bin/env python3
"""Issue 16 benchmark: ckpt.transformers.load_model for the GPT-Neo-2.7B shape on one GPU,
against the engine's own state_dict (same plan, same device) and transformers'
from_pretrained, in the same run: REPS rounds, each method once per round (interleaved), the
median reported. Goals: load_model within 1.25x of the engine, at least 4x faster than
from_pretrained.

Methods, in pairs that do the same attach work:
  engine, attached       Checkpoint.state_dict on a checkpoint attached once (its mapping
                         faulted in by the warm-up round)
  load_model, attached   load_model(that Checkpoint): no attach, no fresh mapping
  engine, fresh attach   client.attach(name).state_dict(...), detached before the clock stops
  load_model             load_model(name): attaches, maps, detaches, as a new process would
  load_model, attached, torch's threads  (ablation: ckpt.transformers._BUILD_THREADS = None, torch's
                         own intra-op thread count while the model is built beside the copy)
  from_pretrained        GPTNeoForCausalLM.from_pretrained(folder, device_map="cuda:0")
Also: the model build alone (no copy beside it), load_model's own phase times
(model.ckpt_times, medians) and a cProfile of one load_model call (--profile FILE).

  python3 tools/gpu/bench_load_model.py --ckptd build-gpu/bin/ckptd --workdir /tmp/neo
      [--shape 2.7B|small] [--reps 5] [--markdown OUT.md] [--profile OUT.txt] [--prepare-only]

The model folder is WORKDIR/SHAPE (config.json + model.safetensors), the one
tools/gpu/check_gpt_neo.py writes; it is made here (random weights) when missing
(--prepare-only: make it and exit, e.g. while the project builds).
"""
import argparse
import ast
import cProfile
import inspect
import io
import os
import pstats
import signal
import statistics
import subprocess
import time

import torch


def _check_gpt_neo_shapes():
    """check_gpt_neo.SHAPES (the same shapes as the GPT-Neo check), read from its source: that
    script imports ckpt, which --prepare-only runs without (while the project builds)."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "check_gpt_neo.py")
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "SHAPES" for t in node.targets):
            return eval(compile(ast.Expression(node.value), path, "eval"), {"__builtins__": {}, "dict": dict})
    raise RuntimeError(f"{path} has no SHAPES")


SHAPES = _check_gpt_neo_shapes()

ENGINE, FRESH = "engine state_dict, attached", "engine state_dict, fresh attach"
LM_ATT, LM, LM_1T = "load_model(Checkpoint), attached", "load_model(name)", "load_model(Checkpoint), torch's threads"
FP = "transformers from_pretrained"


def make_folder(folder, config):
    from transformers import GPTNeoForCausalLM
    if os.path.exists(os.path.join(folder, "model.safetensors")) and os.path.exists(os.path.join(folder, "config.json")):
        return
    torch.manual_seed(0)
    with torch.device("cuda", 0):
        model = GPTNeoForCausalLM(config)
    tmp = folder + ".partial"
    model.save_pretrained(tmp, max_shard_size="1000GB")
    os.replace(tmp, folder)
    del model
    torch.cuda.empty_cache()


def timed(fn, dev):
    torch.cuda.synchronize(dev)
    t0 = time.perf_counter()
    out = fn()
    torch.cuda.synchronize(dev)
    return time.perf_counter() - t0, out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ckptd")
    ap.add_argument("--workdir", default="/tmp/neo")
    ap.add_argument("--shape", default="2.7B", choices=SHAPES)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--markdown", help="also write the table here")
    ap.add_argument("--profile", help="write a cProfile of one load_model call here")
    ap.add_argument("--prepare-only", action="store_true", help="write the model folder and exit")
    args = ap.parse_args()

    import transformers
    from transformers import GPTNeoConfig, GPTNeoForCausalLM

    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    config = GPTNeoConfig(**SHAPES[args.shape])
    folder = os.path.join(args.workdir, args.shape)
    t0 = time.perf_counter()
    make_folder(folder, config)
    if args.prepare_only:
        print(f"folder {folder} ready ({time.perf_counter() - t0:.1f} s)", flush=True)
        return
    if not args.ckptd:
        ap.error("--ckptd is required")
    import ckpt
    import ckpt.transformers
    size = os.path.getsize(os.path.join(folder, "model.safetensors"))
    print(f"GPT-Neo {args.shape}: {size / 2**30:.2f} GiB; transformers {transformers.__version__}, "
          f"torch {torch.__version__}, {torch.cuda.get_device_name(dev)}, {os.cpu_count()} CPUs, "
          f"torch intra-op threads {torch.get_num_threads()}", flush=True)

    sock = os.path.join(args.workdir, f"bench-lm-{args.shape}.sock")
    if os.path.exists(sock):
        os.unlink(sock)
    daemon = subprocess.Popen([args.ckptd, "--socket", sock, "--shm-prefix", f"benchlm{os.getpid()}",
                               "--cleanup-on-exit", "--load-threads", "16"])
    phases = {}
    try:
        client = ckpt.connect(sock, wait=20)
        t0 = time.perf_counter()
        client.load(folder, "neo")  # the folder: ckptd keeps config.json with the segment
        print(f"ckptd load {time.perf_counter() - t0:.2f} s", flush=True)
        checkpoint = client.attach("neo")
        has_config = getattr(checkpoint, "config", None) is not None
        config_arg = None if has_config else folder  # a ckptd without stored configs: give the folder's
        # The plan and convention load_model uses at world 1, given to the engine too.
        conventions = "convention" in inspect.signature(checkpoint.state_dict).parameters
        engine_kwargs = {"convention": "hf"} if conventions else {}
        cfg = ckpt.transformers.model_config(checkpoint, config_arg)
        engine_plan = ckpt.transformers._ckpt_plan(checkpoint, "auto", cfg, 1)
        print(f"plan {engine_plan!r}, {engine_kwargs or 'no convention= in this build'}; config "
              f"{'stored by ckptd' if has_config else 'from the folder (this ckptd stores none)'}", flush=True)

        def engine():
            return checkpoint.state_dict(0, 1, engine_plan, device=dev, **engine_kwargs)

        fresh_parts = []  # (attach, copy, detach) seconds per fresh-attach call

        def engine_fresh():
            t0 = time.perf_counter()
            c = client.attach("neo")
            t1 = time.perf_counter()
            out = c.state_dict(0, 1, engine_plan, device=dev, **engine_kwargs)
            torch.cuda.synchronize(dev)
            t2 = time.perf_counter()
            del c  # detached (unmapped) here, inside the timing, as load_model(name) does at its return
            fresh_parts.append((t1 - t0, t2 - t1, time.perf_counter() - t2))
            return out

        def load_model_attached():
            return ckpt.transformers.load_model(checkpoint, rank=0, world=1, device=dev, config=config_arg)

        def load_model():
            return ckpt.transformers.load_model("neo", rank=0, world=1, device=dev, client=client, config=config_arg)

        def load_model_1t():
            old = ckpt.transformers._BUILD_THREADS
            ckpt.transformers._BUILD_THREADS = None
            try:
                return load_model_attached()
            finally:
                ckpt.transformers._BUILD_THREADS = old

        def from_pretrained():
            return GPTNeoForCausalLM.from_pretrained(folder, device_map=str(dev))

        methods = [(ENGINE, engine), (LM_ATT, load_model_attached), (FRESH, engine_fresh), (LM, load_model),
                   (LM_1T, load_model_1t), (FP, from_pretrained)]
        # One untimed round (CUDA context, kernels, page cache), then a logits check.
        for _, fn in methods:
            out = fn()
            del out
        ref = from_pretrained().eval()
        ids = torch.randint(0, config.vocab_size, (2, 64), generator=torch.Generator().manual_seed(1)).to(dev)
        same = True
        with torch.no_grad():
            want = ref(ids).logits
            for label, fn in ((LM, load_model), (LM_ATT, load_model_attached), (LM_1T, load_model_1t)):
                model = fn()
                got = model(ids).logits
                eq = torch.equal(got, want)
                same = same and eq
                print(f"{label}: logits equal from_pretrained's: {eq} (max |diff| "
                      f"{(got - want).abs().max().item():.3g}); fill={getattr(model, 'ckpt_fill', '?')}", flush=True)
                del model, got
        del ref, want
        torch.cuda.empty_cache()

        # The build alone: what load_model does beside the copy, with nothing beside it.
        build_alone = []
        for _ in range(max(3, args.reps)):
            torch.cuda.synchronize(dev)
            t0 = time.perf_counter()
            m = ckpt.transformers.build_model(cfg)
            t1 = time.perf_counter()
            nbytes = ckpt.transformers._buffers_to(m, dev)
            torch.cuda.synchronize(dev)
            build_alone.append((t1 - t0, time.perf_counter() - t1))
            del m
        print(f"build alone (no copy beside it): build_model {statistics.median(b for b, _ in build_alone):.3f} s, "
              f"non-persistent buffers to the GPU {statistics.median(m for _, m in build_alone):.3f} s "
              f"({nbytes / 2**20:.1f} MiB)", flush=True)

        times = {name: [] for name, _ in methods}
        for rep in range(args.reps):
            for name, fn in methods:
                seconds, out = timed(fn, dev)
                times[name].append(seconds)
                if hasattr(out, "ckpt_times"):
                    for k, v in out.ckpt_times.items():
                        phases.setdefault(name, {}).setdefault(k, []).append(v)
                del out
                torch.cuda.empty_cache()
            print(f"round {rep + 1}: " + ", ".join(f"{n} {t[-1]:.3f} s" for n, t in times.items()), flush=True)

        if args.profile:
            prof = cProfile.Profile()
            torch.cuda.synchronize(dev)
            prof.enable()
            model = load_model()
            torch.cuda.synchronize(dev)
            prof.disable()
            s = io.StringIO()
            st = pstats.Stats(prof, stream=s)
            st.sort_stats("cumulative").print_stats(45)
            st.sort_stats("tottime").print_stats(30)
            with open(args.profile, "w") as f:
                f.write(f"cProfile of one load_model('neo') call (main thread only; the copy runs on a "
                        f"second thread); ckpt_times {model.ckpt_times}\n\n" + s.getvalue())
            del model
            print(f"profile written to {args.profile}", flush=True)
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=60)

    med = {n: statistics.median(t) for n, t in times.items()}
    rows = [f"GPT-Neo {args.shape} ({size / 2**30:.2f} GiB fp32) on 1 x {torch.cuda.get_device_name(dev)}, "
            f"median of {args.reps} interleaved rounds; transformers {transformers.__version__}, torch {torch.__version__}",
            "", "| method | median s | min s | max s | vs engine, attached | vs engine, fresh attach |",
            "|---|---|---|---|---|---|"]
    for n, t in times.items():
        rows.append(f"| {n} | {med[n]:.3f} | {min(t):.3f} | {max(t):.3f} | {med[n] / med[ENGINE]:.2f}x "
                    f"| {med[n] / med[FRESH]:.2f}x |")
    order = ["attach", "engine_start", "build", "tp", "buffers", "walk", "wait", "fill", "tie", "total", "engine"]
    keys = [k for k in order if any(k in ph for ph in phases.values())]
    keys += sorted({k for ph in phases.values() for k in ph} - set(keys))
    rows += ["", "load_model's phases (model.ckpt_times, medians, s; engine = the copy on its own thread, "
             "engine_start = when it began; total excludes the detach at return):", "",
             "| method | " + " | ".join(keys) + " |", "|---|" + "---|" * len(keys)]
    for n, ph in phases.items():
        rows.append(f"| {n} | " + " | ".join(f"{statistics.median(ph[k]):.3f}" if k in ph else "-" for k in keys)
                    + " |")
    b, m = statistics.median(b for b, _ in build_alone), statistics.median(m for _, m in build_alone)
    rows += ["", f"Build alone: build_model {b:.3f} s, buffers to the GPU {m:.3f} s."]
    parts = fresh_parts[-args.reps:]
    rows += [f"Engine, fresh attach: attach {statistics.median(p[0] for p in parts):.3f} s, copy (first touch of "
             f"the new mapping) {statistics.median(p[1] for p in parts):.3f} s, detach (unmap) "
             f"{statistics.median(p[2] for p in parts):.3f} s (medians)."]
    goal = []
    for lm, eng in ((LM_ATT, ENGINE), (LM_1T, ENGINE), (LM, FRESH)):
        r = med[lm] / med[eng]
        goal.append(f"{lm} / {eng} = {r:.2f} (goal <= 1.25: {'met' if r <= 1.25 else 'NOT met'})")
    for lm in (LM, LM_ATT):
        r = med[FP] / med[lm]
        goal.append(f"from_pretrained / {lm} = {r:.2f} (goal >= 4: {'met' if r >= 4 else 'NOT met'})")
    rows += [""] + [f"- {g}" for g in goal] + [f"- logits equal: {same}"]
    table = "\n".join(rows)
    print(table, flush=True)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(table + "\n")


if __name__ == "__main__":
    main()
