#!/usr/bin/env python3
"""Issue 16 benchmark: ckpt.transformers.load_model for the GPT-Neo-2.7B shape on one GPU,
against the engine's own state_dict (same plan, same device) and transformers'
from_pretrained, in the same run: REPS rounds, each method once per round (interleaved), the
median reported. Goals: load_model within 1.25x of the engine, at least 4x faster than
from_pretrained.

First, buffers: build_model(masks_device=cuda) against a CPU build for every family of
tools/gpu/check_hf_families.py and the GPT-Neo 2.7B shape (every buffer equal, no float
buffer made on the GPU). Then one pass on 4 KiB pages and, with --huge-dir, one with the
segment on huge pages. Methods, in pairs that do the same attach work:
  engine, attached       Checkpoint.state_dict on a checkpoint attached once (its mapping
                         faulted in by the warm-up round)
  load_model, attached   load_model(that Checkpoint): no attach, no fresh mapping
  engine, fresh attach   client.attach(name).state_dict(...), detached before the clock stops
  load_model             load_model(name): attaches, maps, detaches (default: in the background,
                         after the return; the next method waits for it outside the clock)
  load_model, detach='now'  the same, detached before the return
  ablations              load_model(Checkpoint) with the masks computed on the CPU and 1, 2, 4 or
                         torch's build threads (ckpt.transformers._DEVICE_MASKS, _BUILD_THREADS),
                         and with the masks on the GPU and torch's threads
  from_pretrained        GPTNeoForCausalLM.from_pretrained(folder, device_map="cuda:0")
Also: the model build alone (no copy beside it), load_model's own phase times
(model.ckpt_times, medians) and a cProfile of one load_model call (--profile FILE).

  python3 tools/gpu/bench_load_model.py --ckptd build-gpu/bin/ckptd --workdir /tmp/neo
      [--shape 2.7B|small] [--reps 5] [--markdown OUT.md] [--profile OUT.txt] [--prepare-only]
      [--huge-dir DIR (a huge=within_size tmpfs, e.g. /run/benchlmhuge)] [--no-variants]

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
LM_ATT = "load_model(Checkpoint), attached (default: masks on the GPU, 1 build thread)"
LM = "load_model(name) (default: detach in the background)"
LM_NOW = "load_model(name), detach='now'"
FP = "transformers from_pretrained"


def lm_variant(masks, threads):
    return f"load_model(Checkpoint), masks on the {'GPU' if masks else 'CPU'}, " \
           f"{'torch threads' if threads is None else f'{threads} build thread' + ('s' if threads > 1 else '')}"


# Ablations of load_model(Checkpoint), attached: (masks on the GPU, _BUILD_THREADS).
VARIANTS = [(False, 1), (False, 2), (False, 4), (False, None), (True, None)]


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


def masks_check(dev):
    """Every family of tools/gpu/check_hf_families.py (tiny configs) and GPT-Neo 2.7B's shape:
    build_model with masks_device=cuda against a CPU build: same buffer names, every buffer
    equal byte for byte (torch.equal on the CPU), floating-point buffers never on the GPU.
    Plus _BoolTensorsOn's float rule on the GPU: a float computed from a mask on the GPU is
    the CPU's. Returns (rows, all equal)."""
    import importlib.util
    import ckpt.transformers as lm
    import transformers
    spec = importlib.util.spec_from_file_location(
        "check_hf_families", os.path.join(os.path.dirname(os.path.abspath(__file__)), "check_hf_families.py"))
    hf = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hf)
    rows, ok = [], True
    families = [(f, c, k) for f, c, k in hf.FAMILIES] + [("gpt-neo 2.7B", "GPTNeoConfig", SHAPES["2.7B"])]
    for fam, config_name, kwargs in families:
        cls = getattr(transformers, config_name, None)
        if cls is None:
            rows.append((fam, "absent", 0, 0, ""))
            continue
        try:
            config = cls(**kwargs)
            cpu = dict(lm.build_model(config).named_buffers())
            gpu = dict(lm.build_model(config, masks_device=dev).named_buffers())
            bad = sorted(set(cpu) ^ set(gpu))
            on_gpu = [n for n, b in gpu.items() if b.device.type == "cuda"]
            bad += [n for n in on_gpu if gpu[n].is_floating_point()]
            bad += [n for n, b in cpu.items() if n in gpu and not (b.dtype == gpu[n].dtype
                                                                    and torch.equal(b, gpu[n].cpu()))]
            rows.append((fam, "equal" if not bad else "DIFFERENT", len(cpu), len(on_gpu), ", ".join(bad[:4])))
            ok = ok and not bad
        except Exception as e:  # noqa: BLE001 (reported in the table)
            rows.append((fam, "error", 0, 0, f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"))
            ok = False
    mode = lm._BoolTensorsOn(dev)
    with mode:
        mask = torch.tril(torch.ones((512, 512), dtype=torch.bool))
        bias = torch.where(mask, 0.0, torch.finfo(torch.float32).min) if hasattr(torch, "where") else None
        soft = torch.softmax(mask.float() * 0.37, -1)
        e = torch.exp(mask.float().cumsum(-1) * 0.01)
    cpu_mask = torch.tril(torch.ones((512, 512), dtype=torch.bool))
    want = (torch.where(cpu_mask, 0.0, torch.finfo(torch.float32).min), torch.softmax(cpu_mask.float() * 0.37, -1),
            torch.exp(cpu_mask.float().cumsum(-1) * 0.01))
    synth = mask.is_cuda and all(t.device.type == "cpu" and torch.equal(t, w) for t, w in zip((bias, soft, e), want))
    rows.append(("synthetic: floats from a GPU mask", "equal" if synth else "DIFFERENT", 3, 1,
                 f"recomputed on the CPU: {mode.recomputed}"))
    return rows, ok and synth


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ckptd")
    ap.add_argument("--workdir", default="/tmp/neo")
    ap.add_argument("--shape", default="2.7B", choices=SHAPES)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--markdown", help="also write the table here")
    ap.add_argument("--profile", help="write a cProfile of one load_model call here")
    ap.add_argument("--huge-dir", help="a second pass on huge pages: a ckptd with --segment-dir this, a tmpfs "
                    "mounted huge=within_size where only root can create names (e.g. /run/benchlmhuge)")
    ap.add_argument("--no-variants", action="store_true", help="skip the load_model ablations")
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
    import ckpt.transformers as lm
    size = os.path.getsize(os.path.join(folder, "model.safetensors"))
    head = (f"GPT-Neo {args.shape}: {size / 2**30:.2f} GiB; transformers {transformers.__version__}, "
            f"torch {torch.__version__}, {torch.cuda.get_device_name(dev)}, {os.cpu_count()} CPUs, "
            f"torch intra-op threads {torch.get_num_threads()}")
    print(head, flush=True)
    report = [head, ""]

    def flush_report():
        if args.markdown:
            with open(args.markdown, "w") as f:
                f.write("\n".join(report) + "\n")

    t0 = time.perf_counter()
    try:
        rows, masks_ok = masks_check(dev)
    except Exception as e:  # noqa: BLE001 (reported; the timings still run)
        import traceback
        traceback.print_exc()
        rows, masks_ok = [("masks check", "error", 0, 0, f"{type(e).__name__}: {e}")], False
    report += [f"Buffers of build_model(masks_device=cuda:0) against a CPU build ({time.perf_counter() - t0:.1f} s):",
               "", "| family | buffers | count | on the GPU | detail |", "|---|---|---|---|---|"]
    report += [f"| {f} | {st} | {n} | {g} | {d} |" for f, st, n, g, d in rows]
    report += ["", f"- masks check: {'all equal' if masks_ok else 'NOT all equal'}", ""]
    print("\n".join(report[-len(rows) - 6:]), flush=True)
    flush_report()

    def from_pretrained():
        return GPTNeoForCausalLM.from_pretrained(folder, device_map=str(dev))

    passes = [("4 KiB pages (/dev/shm)", f"benchlm{os.getpid()}", True, [])]
    if args.huge_dir:
        passes.append(("huge pages (tmpfs huge=within_size)", f"benchlmhuge{os.getpid()}", False,
                       ["--segment-dir", args.huge_dir]))
    fp_median = None
    all_same = masks_ok
    for label, prefix, full, segment_args in passes:
        sock = os.path.join(args.workdir, f"bench-lm-{prefix}.sock")
        if os.path.exists(sock):
            os.unlink(sock)
        daemon = subprocess.Popen([args.ckptd, "--socket", sock, "--shm-prefix", prefix,
                                   "--cleanup-on-exit", "--load-threads", "16"] + segment_args)
        try:
            out = run_pass(args, label, sock, folder, config, dev, full, from_pretrained, ckpt, lm)
        except Exception as e:  # noqa: BLE001 (reported; the next pass still runs)
            import traceback
            traceback.print_exc()
            report += ["", f"### {label}: FAILED: {type(e).__name__}: {e}"]
            all_same = False
            flush_report()
            continue
        finally:
            daemon.send_signal(signal.SIGTERM)
            daemon.wait(timeout=60)
        times, phases, extra, same = out
        all_same = all_same and same
        med = {n: statistics.median(t) for n, t in times.items()}
        if FP in med:
            fp_median = med[FP]
        report += table(label, args, size, times, phases, extra, fp_median, same)
        print("\n".join(report), flush=True)
        flush_report()
    report += ["", f"- logits equal and buffers equal in every check: {all_same}"]
    flush_report()
    print(report[-1], flush=True)


def run_pass(args, label, sock, folder, config, dev, full, from_pretrained, ckpt, lm):
    """One daemon (4 KiB or huge pages): every method REPS times, interleaved."""
    client = ckpt.connect(sock, wait=20)
    t0 = time.perf_counter()
    client.load(folder, "neo")  # the folder: ckptd keeps config.json with the segment
    status = client.status()
    print(f"== {label}: ckptd load {time.perf_counter() - t0:.2f} s; segment pages: "
          f"{status.get('segment_pages', '?')} ({status.get('segment_page_bytes', '?')} bytes)", flush=True)
    checkpoint = client.attach("neo")
    has_config = getattr(checkpoint, "config", None) is not None
    config_arg = None if has_config else folder
    conventions = "convention" in inspect.signature(checkpoint.state_dict).parameters
    engine_kwargs = {"convention": "hf"} if conventions else {}
    cfg = lm.model_config(checkpoint, config_arg)
    engine_plan = lm._ckpt_plan(checkpoint, "auto", cfg, 1)

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
        del c  # detached (unmapped) here, inside the timing
        fresh_parts.append((t1 - t0, t2 - t1, time.perf_counter() - t2))
        return out

    def with_knobs(masks, threads, fn):
        def run():
            old = lm._DEVICE_MASKS, lm._BUILD_THREADS
            lm._DEVICE_MASKS, lm._BUILD_THREADS = masks, threads
            try:
                return fn()
            finally:
                lm._DEVICE_MASKS, lm._BUILD_THREADS = old
        return run

    def load_model_attached():
        return lm.load_model(checkpoint, rank=0, world=1, device=dev, config=config_arg)

    def load_model():
        return lm.load_model("neo", rank=0, world=1, device=dev, client=client, config=config_arg)

    def load_model_now():
        return lm.load_model("neo", rank=0, world=1, device=dev, client=client, config=config_arg, detach="now")

    methods = [(ENGINE, engine), (LM_ATT, load_model_attached)]
    if full and not args.no_variants:
        methods += [(lm_variant(m, t), with_knobs(m, t, load_model_attached)) for m, t in VARIANTS]
    methods += [(FRESH, engine_fresh), (LM, load_model), (LM_NOW, load_model_now)]
    if full:
        methods.append((FP, from_pretrained))
    # One untimed round (CUDA context, kernels, page cache, the mapping faulted in).
    for _, fn in methods:
        out = fn()
        del out
        lm.wait_detached()
    same = True
    ids = torch.randint(0, config.vocab_size, (2, 64), generator=torch.Generator().manual_seed(1)).to(dev)
    ref = from_pretrained().eval()
    with torch.no_grad():
        want = ref(ids).logits
        checks = [(LM, load_model), (LM_ATT, load_model_attached), (LM_NOW, load_model_now)]
        if full:
            checks.append((lm_variant(False, 1), with_knobs(False, 1, load_model_attached)))
        for label_, fn in checks:
            model = fn()
            got = model(ids).logits
            eq = torch.equal(got, want)
            same = same and eq
            print(f"{label_}: logits equal from_pretrained's: {eq} (max |diff| "
                  f"{(got - want).abs().max().item():.3g}); fill={getattr(model, 'ckpt_fill', '?')}", flush=True)
            del model, got
            lm.wait_detached()
    del ref, want
    torch.cuda.empty_cache()

    extra = {}
    if full:
        build_alone = []
        for _ in range(max(3, args.reps)):
            torch.cuda.synchronize(dev)
            t0 = time.perf_counter()
            m = lm.build_model(cfg)
            t1 = time.perf_counter()
            nbytes = lm._buffers_to(m, dev)
            torch.cuda.synchronize(dev)
            t2 = time.perf_counter()
            del m
            m = lm.build_model(cfg, masks_device=dev)
            torch.cuda.synchronize(dev)
            build_alone.append((t1 - t0, t2 - t1, time.perf_counter() - t2))
            del m
        extra["build"] = [statistics.median(b[i] for b in build_alone) for i in range(3)] + [nbytes]

    times = {name: [] for name, _ in methods}
    phases = {}
    for rep in range(args.reps):
        for name, fn in methods:
            seconds, out = timed(fn, dev)
            times[name].append(seconds)
            if hasattr(out, "ckpt_times"):
                lm.wait_detached()  # outside the clock: the next method starts with no unmap beside it
                for k, v in out.ckpt_times.items():
                    phases.setdefault(name, {}).setdefault(k, []).append(v)
            del out
            torch.cuda.empty_cache()
        print(f"round {rep + 1}: " + ", ".join(f"{n} {t[-1]:.3f} s" for n, t in times.items()), flush=True)
    parts = fresh_parts[-args.reps:]
    extra["fresh"] = [statistics.median(p[i] for p in parts) for i in range(3)]

    if args.profile and full:
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
        lm.wait_detached()
        print(f"profile written to {args.profile}", flush=True)
    del checkpoint
    lm.wait_detached()
    return times, phases, extra, same


def table(label, args, size, times, phases, extra, fp_median, same):
    med = {n: statistics.median(t) for n, t in times.items()}
    rows = ["", f"### {label}", "",
            f"GPT-Neo {args.shape} ({size / 2**30:.2f} GiB fp32) on 1 x {torch.cuda.get_device_name(0)}, "
            f"median of {args.reps} interleaved rounds", "",
            "| method | median s | min s | max s | vs engine, attached | vs engine, fresh attach | "
            "from_pretrained / this |", "|---|---|---|---|---|---|---|"]
    for n, t in times.items():
        fp = f"{fp_median / med[n]:.2f}x" if fp_median else "-"
        rows.append(f"| {n} | {med[n]:.3f} | {min(t):.3f} | {max(t):.3f} | {med[n] / med[ENGINE]:.2f}x "
                    f"| {med[n] / med[FRESH]:.2f}x | {fp} |")
    order = ["attach", "engine_start", "build", "tp", "buffers", "walk", "wait", "fill", "tie", "total", "engine",
             "detach", "detach_background"]
    keys = [k for k in order if any(k in ph for ph in phases.values())]
    keys += sorted({k for ph in phases.values() for k in ph} - set(keys))
    rows += ["", "load_model's phases (model.ckpt_times, medians, s; engine = the copy on its own thread, "
             "engine_start = when it began; total excludes the detach; detach_background = the background "
             "detach's own time, after the return):", "",
             "| method | " + " | ".join(keys) + " |", "|---|" + "---|" * len(keys)]
    for n, ph in phases.items():
        rows.append(f"| {n} | " + " | ".join(f"{statistics.median(ph[k]):.3f}" if k in ph else "-" for k in keys)
                    + " |")
    if "build" in extra:
        b, m, g, nbytes = extra["build"]
        rows += ["", f"Build alone (no copy beside it): build_model with the masks on the CPU {b:.3f} s + buffers "
                 f"to the GPU {m:.3f} s ({nbytes / 2**20:.0f} MiB); with the masks made on the GPU {g:.3f} s."]
    a, c, d = extra["fresh"]
    rows += [f"Engine, fresh attach: attach {a:.3f} s, copy (first touch of the new mapping) {c:.3f} s, "
             f"detach (unmap) {d:.3f} s (medians).", ""]
    goals = []
    pairs = [(LM_ATT, ENGINE), (LM, FRESH), (LM, ENGINE)]
    for lm_, eng in pairs:
        if lm_ in med:
            r = med[lm_] / med[eng]
            goals.append(f"{lm_} / {eng} = {r:.2f} (goal <= 1.25: {'met' if r <= 1.25 else 'NOT met'})")
    for lm_ in (LM, LM_NOW, LM_ATT):
        if lm_ in med and fp_median:
            r = fp_median / med[lm_]
            goals.append(f"from_pretrained / {lm_} = {r:.2f} (goal >= 4: {'met' if r >= 4 else 'NOT met'})")
    rows += [f"- {g}" for g in goals] + [f"- logits equal: {same}"]
    return rows


if __name__ == "__main__":
    main()
