#!/usr/bin/env python3
"""GPU check for the Python module (issue 5): a GPT-Neo model loaded through ckptd gives
logits identical to from_pretrained, and its tensor-parallel shards equal the reference
slices. Needs transformers, a GPU, a running-capable ckptd and the ckpt module.

  tools/gpu/check_gpt_neo.py --ckptd build-gpu/bin/ckptd --workdir /tmp/neo [--shape small|2.7B]
"""
import argparse
import os
import signal
import subprocess
import time

import torch
from transformers import GPTNeoConfig, GPTNeoForCausalLM

import ckpt
import ckpt.plans  # noqa: F401

# The GPT-Neo layout the built-in "gpt-neo" plan (megatron) gives, written out as the check's
# own reference: {regex: split dim}; unmatched tensors whole.
GPT_NEO_SPLITS = {r"attn\.attention\.[qkv]_proj\.weight$": 0, r"attn\.attention\.out_proj\.weight$": -1,
                  r"mlp\.c_fc\.(weight|bias)$": 0, r"mlp\.c_proj\.weight$": -1, r"(^|\.)wte\.weight$": 0,
                  r"^lm_head\.weight$": 0}
from ckpt.meta import parameters_on_meta

SHAPES = {
    "small": dict(hidden_size=256, num_layers=4, num_heads=8, attention_types=[[["global", "local"], 2]],
                  max_position_embeddings=512, vocab_size=50257),
    "2.7B": dict(hidden_size=2560, num_layers=32, num_heads=20, attention_types=[[["global", "local"], 16]],
                 max_position_embeddings=2048, vocab_size=50257),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ckptd", required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--shape", default="small", choices=SHAPES)
    args = ap.parse_args()
    dev = torch.device("cuda", 0)
    config = GPTNeoConfig(**SHAPES[args.shape])
    folder = os.path.join(args.workdir, args.shape)
    torch.manual_seed(0)
    if not os.path.exists(os.path.join(folder, "model.safetensors")):
        with torch.device(dev):
            model = GPTNeoForCausalLM(config)
        model.save_pretrained(folder, max_shard_size="1000GB", safe_serialization=True)
        del model
    size = os.path.getsize(os.path.join(folder, "model.safetensors"))
    ids = torch.randint(0, config.vocab_size, (2, 64), generator=torch.Generator().manual_seed(1)).to(dev)

    t0 = time.perf_counter()
    ref = GPTNeoForCausalLM.from_pretrained(folder).to(dev).eval()
    t_ref = time.perf_counter() - t0
    with torch.no_grad():
        want = ref(ids).logits

    sock = os.path.join(args.workdir, f"ckptd-{args.shape}.sock")
    daemon = subprocess.Popen([args.ckptd, "--socket", sock, "--shm-prefix", f"neo{os.getpid()}", "--cleanup-on-exit",
                               "--state-dir", os.path.join(args.workdir, "ckptd-state"), "--load-threads", "16"])
    try:
        client = ckpt.connect(sock, wait=10)
        t0 = time.perf_counter()
        client.load(os.path.join(folder, "model.safetensors"), "neo")
        t_load = time.perf_counter() - t0

        # (1) Build on meta, fill from the daemon, run: identical logits.
        t0 = time.perf_counter()
        with parameters_on_meta():
            model = GPTNeoForCausalLM(config)
        shards = client.state_dict("neo", device=dev)
        missing, unexpected = model.load_state_dict(shards, strict=False, assign=True)
        model.tie_weights()
        model = model.to(dev).eval()
        t_ckpt = time.perf_counter() - t0
        assert not unexpected, unexpected
        assert all(k == "lm_head.weight" for k in missing), missing
        with torch.no_grad():
            got = model(ids).logits
        same = torch.equal(got, want)
        print(f"[{args.shape}] checkpoint {size / 2**30:.2f} GiB; from_pretrained {t_ref:.2f} s; "
              f"ckptd load {t_load:.2f} s; meta model filled from ckptd {t_ckpt:.2f} s; "
              f"logits identical: {same} (max |diff| {(got - want).abs().max().item():.3g})", flush=True)
        assert same, "logits differ"

        # (2) Tensor-parallel shards equal the reference slices, through the CUDA copy
        # engine and through the per-tensor torch path.
        reference = {k: v for k, v in ref.state_dict().items() if k in shards}
        import re
        for world, engine in ((2, "gpu"), (4, "gpu"), (4, "torch")):
            t0 = time.perf_counter()
            for rank in range(world):
                sd = client.state_dict("neo", rank, world, "gpt-neo", device=dev, engine=engine)
                for name, t in reference.items():
                    dim = next((d for p, d in GPT_NEO_SPLITS.items() if re.search(p, name)), None)
                    want_t = torch.tensor_split(t, world, dim)[rank] if dim is not None else t
                    assert torch.equal(sd[name], want_t), f"{name} rank {rank}/{world}"
            print(f"[{args.shape}] TP={world} engine={engine}: every shard of {len(reference)} tensors equals the "
                  f"reference slice ({(time.perf_counter() - t0) / world:.3f} s per rank incl. checks)", flush=True)
        half = client.state_dict("neo", 0, 4, "gpt-neo", device=dev, dtype=torch.bfloat16, engine="gpu")
        name = "transformer.h.0.mlp.c_fc.weight"
        assert half[name].dtype == torch.bfloat16
        assert torch.equal(half[name], torch.tensor_split(reference[name], 4, 0)[0].to(torch.bfloat16))
        print(f"[{args.shape}] fp32 -> bf16 on the GPU equals torch's conversion", flush=True)
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait()


if __name__ == "__main__":
    main()
