#!/usr/bin/env python3
"""GPU-load baselines for tools/bench_gpu.sh (issue 4), with the GPU PyTorch of the bench host.

  bench_baselines.py gen DIR              GPT-Neo-2.7B-shaped fp32 state dict (420 tensors,
                                          9.88 GiB, random) as DIR/model.safetensors + DIR/model.pt
  bench_baselines.py safetensors FILE RANK WORLD START_AT [DEVICE]
  bench_baselines.py torchload FILE RANK WORLD START_AT [DEVICE]    torch.load(mmap=True)
  bench_baselines.py torchfull FILE RANK WORLD START_AT [DEVICE]    torch.load (whole file into memory)

The loaders take the rank's tensor-parallel shards (same rules as TpPlan "gpt-neo":
q/k/v/c_fc column-parallel, out_proj/c_proj weights row-parallel, wte vocab-split
(torch.tensor_split), the rest replicated) onto cuda:DEVICE (default: RANK) and print one JSON line: the
time from START_AT (after CUDA init) to all shards on the GPU.
"""
import torch_python  # noqa: F401  (first: re-runs this script under a Python with torch if need be)
import json
import re
import sys
import time

import torch


def gen(d):
    from safetensors.torch import save_file
    from make_checkpoint import gpt_neo_state_dict
    sd = gpt_neo_state_dict("cuda", out_device="cpu")
    nbytes = sum(t.numel() * t.element_size() for t in sd.values())
    t0 = time.time(); save_file(sd, f"{d}/model.safetensors"); t1 = time.time()
    torch.save(sd, f"{d}/model.pt"); t2 = time.time()
    print(json.dumps({"what": "gen", "tensors": len(sd), "GiB": round(nbytes / 2**30, 3),
                      "safetensors_s": round(t1 - t0, 1), "pt_s": round(t2 - t1, 1)}))


def rule(name, ndim):
    if re.search(r"wte\.weight$", name): return ("split", 0, True)
    if re.search(r"\.attn\.attention\.(q|k|v)_proj\.(weight|bias)$", name): return ("split", 0, False)
    if re.search(r"\.mlp\.c_fc\.(weight|bias)$", name): return ("split", 0, False)
    if re.search(r"\.(attn\.attention\.out_proj|mlp\.c_proj)\.(weight|bias)$", name):
        return ("split", 1, False) if ndim == 2 else ("replicate",)
    return ("replicate",)


def bounds(n, rank, world):
    base, extra = divmod(n, world)
    b = rank * base + min(rank, extra)
    return b, b + base + (1 if rank < extra else 0)


def wait(start_at):
    while time.time() < start_at:
        time.sleep(0.0002)


def run(kind, f, rank, world, start_at, device):
    dev = torch.device("cuda", device)
    torch.cuda.set_device(dev)
    torch.empty(1, device=dev)
    torch.cuda.synchronize()
    wait(start_at)
    t0 = time.time()
    out = {}
    if kind == "safetensors":
        from safetensors import safe_open
        with safe_open(f, framework="pt", device=f"cuda:{device}") as sf:
            for name in sf.keys():
                sl = sf.get_slice(name)
                shape = sl.get_shape()
                r = rule(name, len(shape))
                if r[0] == "replicate":
                    out[name] = sl[:]
                else:
                    b, e = bounds(shape[r[1]], rank, world)
                    out[name] = sl[b:e] if r[1] == 0 else sl[:, b:e]
    else:
        sd = torch.load(f, mmap=(kind == "torchload"), weights_only=True)
        for name, t in sd.items():
            r = rule(name, t.dim())
            if r[0] != "replicate":
                b, e = bounds(t.shape[r[1]], rank, world)
                t = t.narrow(r[1], b, e - b)
            out[name] = t.to(dev)
    torch.cuda.synchronize()
    dt = time.time() - t0
    gib = sum(t.numel() * t.element_size() for t in out.values()) / 2**30
    print(json.dumps({"what": kind, "rank": rank, "world": world, "seconds": round(dt, 4),
                      "out_GiB": round(gib, 3), "tensors": len(out)}), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "gen":
        gen(sys.argv[2])
    else:
        run(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5]),
            int(sys.argv[6]) if len(sys.argv) > 6 else int(sys.argv[3]))
