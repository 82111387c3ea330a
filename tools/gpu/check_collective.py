#!/usr/bin/env python3
"""GPU check of collective loads from Python (issue 7): N processes (one per GPU) with a
torch.distributed NCCL process group load a checkpoint through ckptd with
state_dict(group=...): whole replicas and TP shards (replicated tensors shared), and with a
group set up through the daemon (Client.nccl_group). Every tensor must equal the file's
(safetensors.torch.load_file) or its reference slice.

  tools/gpu/check_collective.py --ckptd build-gpu/bin/ckptd --checkpoint /tmp/neo/small/model.safetensors
"""
import argparse
import os
import re
import signal
import subprocess
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import ckpt
import ckpt.plans  # noqa: F401

# The GPT-Neo layout the built-in "gpt-neo" plan (megatron) gives, written out as the check's
# own reference: {regex: split dim}; unmatched tensors whole.
GPT_NEO_SPLITS = {r"attn\.attention\.[qkv]_proj\.weight$": 0, r"attn\.attention\.out_proj\.weight$": -1,
                  r"mlp\.c_fc\.(weight|bias)$": 0, r"mlp\.c_proj\.weight$": -1, r"(^|\.)wte\.weight$": 0,
                  r"^lm_head\.weight$": 0}


def rank_main(rank, world, sock, path, port):
    torch.cuda.set_device(rank)
    dev = torch.device("cuda", rank)
    dist.init_process_group("nccl", rank=rank, world_size=world, init_method=f"tcp://127.0.0.1:{port}",
                            device_id=dev)
    from safetensors.torch import load_file
    ref = {k: v.to(dev) for k, v in load_file(path).items()}
    client = ckpt.connect(sock)
    ck = client.attach("m")
    t0 = time.perf_counter()
    whole = ck.state_dict(device=dev, group=dist.group.WORLD, collective="always")
    t_whole = time.perf_counter() - t0
    assert set(whole) == set(ref), "names differ"
    for k, v in ref.items():
        assert torch.equal(whole[k], v), f"replica: {k}"
    tp = ck.state_dict(rank, world, "gpt-neo", device=dev, group=dist.group.WORLD, collective="always")
    for k, v in ref.items():
        dim = next((d for p, d in GPT_NEO_SPLITS.items() if re.search(p, k)), None)
        want = torch.tensor_split(v, world, dim)[rank] if dim is not None else v
        assert torch.equal(tp[k], want), f"TP: {k}"
    group = client.nccl_group(f"check-{port}", rank, world, dev, timeout=60)
    again = ck.state_dict(device=dev, group=group, collective="always")
    for k, v in ref.items():
        assert torch.equal(again[k], v), f"daemon group: {k}"
    print(f"rank {rank}: replica ({t_whole:.3f} s, process group), TP={world} shards and replica through a "
          f"daemon-made group: every tensor equals the reference", flush=True)
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ckptd", required=True)
    ap.add_argument("--checkpoint", required=True)
    args = ap.parse_args()
    world = torch.cuda.device_count()
    sock = f"/tmp/ckptd-coll-{os.getpid()}.sock"
    daemon = subprocess.Popen([args.ckptd, "--socket", sock, "--shm-prefix", f"coll{os.getpid()}", "--cleanup-on-exit",
                               "--state-dir", f"/tmp/ckptd-coll-{os.getpid()}.state"])
    try:
        ckpt.connect(sock, wait=10).load(args.checkpoint, "m")
        mp.spawn(rank_main, args=(world, sock, args.checkpoint, 29500 + os.getpid() % 1000), nprocs=world)
        print(f"collective loads from Python on {world} GPUs: OK")
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait()


if __name__ == "__main__":
    main()
