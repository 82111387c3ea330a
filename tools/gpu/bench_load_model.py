#!/usr/bin/env python3
"""Issue 16 benchmark: ckpt.transformers.load_model for the GPT-Neo-2.7B shape on one GPU,
against the engine's own state_dict (same plan, same device) and transformers'
from_pretrained, in the same run: REPS rounds, each method once per round (interleaved), the
median reported. Goals: load_model within 1.25x of the engine, at least 4x faster than
from_pretrained.

  python3 tools/gpu/bench_load_model.py --ckptd build-gpu/bin/ckptd --workdir /tmp/neo
      [--shape 2.7B|small] [--reps 5] [--markdown OUT.md]

The model folder is WORKDIR/SHAPE (config.json + model.safetensors), the one
tools/gpu/check_gpt_neo.py writes; it is made here (random weights) when missing.
"""
import argparse
import inspect
import os
import signal
import statistics
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check_gpt_neo import SHAPES  # noqa: E402  (the same shapes as the GPT-Neo check)


def make_folder(folder, config):
    from transformers import GPTNeoForCausalLM
    if os.path.exists(os.path.join(folder, "model.safetensors")) and os.path.exists(os.path.join(folder, "config.json")):
        return
    torch.manual_seed(0)
    with torch.device("cuda", 0):
        model = GPTNeoForCausalLM(config)
    model.save_pretrained(folder, max_shard_size="1000GB")
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
    ap.add_argument("--ckptd", required=True)
    ap.add_argument("--workdir", default="/tmp/neo")
    ap.add_argument("--shape", default="2.7B", choices=SHAPES)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--markdown", help="also write the table here")
    args = ap.parse_args()

    import transformers
    from transformers import GPTNeoConfig, GPTNeoForCausalLM
    import ckpt
    import ckpt.transformers

    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    config = GPTNeoConfig(**SHAPES[args.shape])
    folder = os.path.join(args.workdir, args.shape)
    make_folder(folder, config)
    size = os.path.getsize(os.path.join(folder, "model.safetensors"))
    print(f"GPT-Neo {args.shape}: {size / 2**30:.2f} GiB; transformers {transformers.__version__}, "
          f"torch {torch.__version__}, {torch.cuda.get_device_name(dev)}", flush=True)

    sock = os.path.join(args.workdir, f"bench-lm-{args.shape}.sock")
    if os.path.exists(sock):
        os.unlink(sock)
    daemon = subprocess.Popen([args.ckptd, "--socket", sock, "--shm-prefix", f"benchlm{os.getpid()}",
                               "--cleanup-on-exit", "--load-threads", "16"])
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
        engine_plan = ckpt.transformers._ckpt_plan(checkpoint, "auto",
                                                   ckpt.transformers.model_config(checkpoint, config_arg), 1)
        print(f"plan {engine_plan!r}, {engine_kwargs or 'no convention= in this build'}; config "
              f"{'stored by ckptd' if has_config else 'from the folder (this ckptd stores none)'}", flush=True)

        def engine():
            return checkpoint.state_dict(0, 1, engine_plan, device=dev, **engine_kwargs)

        def load_model():
            return ckpt.transformers.load_model("neo", rank=0, world=1, device=dev, client=client, config=config_arg)

        def from_pretrained():
            return GPTNeoForCausalLM.from_pretrained(folder, device_map=str(dev))

        methods = [("engine state_dict", engine), ("ckpt.transformers.load_model", load_model),
                   ("transformers from_pretrained", from_pretrained)]
        # One untimed round (CUDA context, kernels, page cache), then a logits check.
        for _, fn in methods:
            out = fn()
            del out
        model, ref = load_model(), from_pretrained().eval()
        ids = torch.randint(0, config.vocab_size, (2, 64), generator=torch.Generator().manual_seed(1)).to(dev)
        with torch.no_grad():
            got, want = model(ids).logits, ref(ids).logits
        same = torch.equal(got, want)
        print(f"load_model logits equal from_pretrained's: {same} (max |diff| {(got - want).abs().max().item():.3g}); "
              f"fill={getattr(model, 'ckpt_fill', '?')}", flush=True)
        del model, ref, got, want
        torch.cuda.empty_cache()

        times = {name: [] for name, _ in methods}
        for rep in range(args.reps):
            for name, fn in methods:
                seconds, out = timed(fn, dev)
                times[name].append(seconds)
                del out
                torch.cuda.empty_cache()
            print(f"round {rep + 1}: " + ", ".join(f"{n} {t[-1]:.3f} s" for n, t in times.items()), flush=True)
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=60)

    med = {n: statistics.median(t) for n, t in times.items()}
    base = med["engine state_dict"]
    rows = [f"GPT-Neo {args.shape} ({size / 2**30:.2f} GiB fp32) on 1 x {torch.cuda.get_device_name(dev)}, "
            f"median of {args.reps} interleaved rounds; transformers {transformers.__version__}, torch {torch.__version__}",
            "", "| method | median s | min s | max s | vs engine |", "|---|---|---|---|---|"]
    for n, t in times.items():
        rows.append(f"| {n} | {med[n]:.3f} | {min(t):.3f} | {max(t):.3f} | {med[n] / base:.2f}x |")
    lm, fp = med["ckpt.transformers.load_model"], med["transformers from_pretrained"]
    rows += ["", f"load_model / engine = {lm / base:.2f} (goal <= 1.25: {'met' if lm / base <= 1.25 else 'NOT met'}); "
                 f"from_pretrained / load_model = {fp / lm:.2f} (goal >= 4: {'met' if fp / lm >= 4 else 'NOT met'}); "
                 f"logits equal: {same}"]
    table = "\n".join(rows)
    print(table, flush=True)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(table + "\n")


if __name__ == "__main__":
    main()
