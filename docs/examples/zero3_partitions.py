#!/usr/bin/env python3
"""ZeRO-3 / MiCS flow: every rank fills only its own parameter partitions from ckptd, so no
rank ever materialises the full state dict (the 14 GB per rank of the bloom-7b1 report).

  PYTHONPATH=build/python docs/examples/zero3_partitions.py CHECKPOINT.safetensors \
      --ckptd build/bin/ckptd --world 4 [--mics-shard-size 2]

It starts a private ckptd, loads the checkpoint once, then runs WORLD processes that each
take their partitions (padded like DeepSpeed) and report what they hold; rank 0 checks that
the partitions of one shard group put back together equal the checkpoint.

With DeepSpeed, the same call fills the partitions that zero.Init / zero.MiCS_Init created:

    with deepspeed.zero.MiCS_Init(config_dict_or_path=ds_config):      # or zero.Init
        model = AutoModelForCausalLM.from_config(config)               # no from_pretrained
    ckpt_model = ckpt.connect().attach("bloom-7b1")
    for name, param in model.named_parameters():
        part = ckpt_model.partition(name, rank, world, group_size=mics_shard_size,
                                    device=param.ds_tensor.device, dtype=param.ds_tensor.dtype)
        param.ds_tensor.data.copy_(part[:param.ds_tensor.numel()])
"""
import argparse
import multiprocessing as mp
import os
import signal
import subprocess
import tempfile

import torch

import ckpt


def rank_main(rank, world, group, socket, queue):
    model = ckpt.connect(socket).attach("model")
    parts = model.partitions(rank, world, group_size=group)
    held = sum(p.numel() * p.element_size() for p in parts.values())
    queue.put((rank, held))
    if rank == 0:
        g = group or world
        for name in model.keys():
            whole = torch.cat([model.partition(name, r, world, group_size=group) for r in range(g)])
            ref = model.tensor(name).reshape(-1)
            assert torch.equal(whole[:ref.numel()], ref), name
        queue.put(("check", "partitions of one shard group reassemble every tensor exactly"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("checkpoint")
    ap.add_argument("--ckptd", default="build/bin/ckptd")
    ap.add_argument("--world", type=int, default=4)
    ap.add_argument("--mics-shard-size", type=int, default=None)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        sock = os.path.join(tmp, "ckptd.sock")
        daemon = subprocess.Popen([args.ckptd, "--socket", sock, "--shm-prefix", f"zero{os.getpid()}",
                                   "--cleanup-on-exit"], stderr=subprocess.DEVNULL)
        try:
            client = ckpt.connect(sock, wait=10)
            summary = client.load(os.path.abspath(args.checkpoint), "model")
            ctx = mp.get_context("spawn")
            queue = ctx.Queue()
            procs = [ctx.Process(target=rank_main, args=(r, args.world, args.mics_shard_size, sock, queue))
                     for r in range(args.world)]
            for p in procs:
                p.start()
            for _ in range(args.world + 1):
                key, value = queue.get()
                if key == "check":
                    print(value)
                else:
                    print(f"rank {key}: holds {value / 2**20:.1f} MiB of partitions "
                          f"(checkpoint {summary['data_bytes'] / 2**20:.1f} MiB)")
            for p in procs:
                p.join()
        finally:
            daemon.send_signal(signal.SIGTERM)
            daemon.wait()


if __name__ == "__main__":
    main()
