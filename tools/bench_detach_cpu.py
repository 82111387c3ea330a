#!/usr/bin/python3
"""load_model(name)'s detach on the CPU (issue 16): detach="background" against "now", on a
real ckptd, with the stand-in transformers of tests/python/test_transformers_adapter.py
(no transformers needed): a 32-layer, hidden-1024 model (0.94 GiB fp32) loaded on the CPU
(copy=True: the copy reads, so faults in, every page of the mapping), REPS rounds, each
mode once per round, the background detach waited for outside the clock. Prints each
mode's median call time and the background thread's own time (the unmap it does).

  CKPTD_BIN=build/bin/ckptd CKPT_TOOLS_DIR=tools PYTHONPATH=build/python \
      /usr/bin/python3 tools/bench_detach_cpu.py [--reps 7] [--layers 32]
"""
import argparse
import gc
import os
import shutil
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "python"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--hidden", type=int, default=1024)
    args = ap.parse_args()
    import torch
    import test_ckpt
    import test_transformers_adapter as adapter
    import ckpt
    tmp = tempfile.mkdtemp()
    daemon = None
    try:
        pkg = os.path.join(tmp, "standin", "transformers")
        os.makedirs(pkg)
        with open(os.path.join(pkg, "__init__.py"), "w") as f:
            f.write(adapter.STAND_IN)
        sys.path.insert(0, os.path.dirname(pkg))
        import transformers
        import ckpt.transformers as lm
        cfg = dict(adapter.CONFIG, hidden_size=args.hidden, num_hidden_layers=args.layers)
        model = transformers.TinyForCausalLM(transformers.TinyConfig(**{k: v for k, v in cfg.items()
                                                                        if k != "model_type"}))
        sd = {k: v.detach().clone() for k, v in model.state_dict().items() if k != "lm_head.weight"}
        nbytes = sum(t.numel() * t.element_size() for t in sd.values())
        del model
        daemon = test_ckpt.Daemon(tmp)
        daemon.start()
        client = ckpt.connect(daemon.socket)
        path = os.path.join(tmp, "big.safetensors")
        test_ckpt.make_checkpoint.write_safetensors(path, sd)
        del sd
        client.load(path, "big")
        os.unlink(path)
        print(f"{nbytes / 2**30:.2f} GiB, {os.cpu_count()} CPUs, torch {torch.__version__}", flush=True)
        calls = {"background": [], "now": []}
        threads = []
        for _ in range(args.reps + 1):  # the first round is a warm-up
            for mode in ("background", "now"):
                gc.collect()
                t0 = time.perf_counter()
                m = lm.load_model("big", client=client, rank=0, world=1, device="cpu", config=cfg, detach=mode)
                calls[mode].append(time.perf_counter() - t0)
                lm.wait_detached()
                if mode == "background":
                    threads.append(m.ckpt_times["detach_background"])
                else:
                    calls.setdefault("now: detach inside", []).append(m.ckpt_times["detach"])
                del m
        for mode, seconds in calls.items():
            rest = seconds[1:]
            print(f"{mode}: median {statistics.median(rest):.3f} s (min {min(rest):.3f}, max {max(rest):.3f})")
        print(f"background: the detach thread's own time, median {statistics.median(threads[1:]):.3f} s")
        client = None
        gc.collect()
    finally:
        if daemon is not None:
            daemon.cleanup()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
