"""Tensor parallelism by hand: every rank attaches the node's one copy and takes only its
shards (rank and world from torchrun's environment), then runs its part of the block and
the ranks add their partial sums. Rank 0 checks the result against the whole model.

    python3 docs/examples/demo_model.py /tmp/demo.safetensors && ckptctl load /tmp/demo.safetensors --name demo
    CKPTD_SOCKET=/run/ckptd/ckptd.sock python3 -m torch.distributed.run --nproc_per_node 2 \\
        docs/examples/tp_shards.py --name demo

CPU with gloo here; on GPUs pass device=f"cuda:{launch.local_rank}" to state_dict (the copy
engine then DMAs each shard from shared memory) and use NCCL.

Debian 12's torch 1.13 (Python 3.11): add `--redirects 1 --tee 1` after --nproc_per_node,
its torchrun's defaults fail there ('NoneType' object has no attribute 'get').
"""
import argparse
import os
import sys

import torch
import torch.distributed as dist

import ckpt

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import demo_model  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--name", default="demo", help="the checkpoint's name in ckptd")
    args = ap.parse_args()
    launch = ckpt.launcher_env()                      # RANK, WORLD_SIZE, LOCAL_RANK from torchrun
    dist.init_process_group("gloo")                   # env:// from the same variables
    model = ckpt.connect().attach(args.name)          # $CKPTD_SOCKET or /run/ckptd/ckptd.sock
    sd = model.state_dict(plan=demo_model.tp_plan())  # this rank's shards: zero-copy views
    held = sum(t.numel() * t.element_size() for t in sd.values())

    ids = torch.arange(16).reshape(2, 8)
    x = torch.nn.functional.gelu(torch.nn.functional.embedding(ids, sd["embed.weight"]) @ sd["fc1.weight"].T
                                 + sd["fc1.bias"])
    y = x @ sd["fc2.weight"].T                        # this rank's partial sum
    dist.all_reduce(y)
    y = y + sd["fc2.bias"]

    whole = {n: model.tensor(n) for n in model.keys()}  # only to check the example
    ref = torch.nn.functional.gelu(torch.nn.functional.embedding(ids, whole["embed.weight"]) @ whole["fc1.weight"].T
                                   + whole["fc1.bias"]) @ whole["fc2.weight"].T + whole["fc2.bias"]
    err = (y - ref).abs().max().item()
    total = sum(t.numel() * t.element_size() for t in whole.values())
    print(f"tp_shards rank {launch.rank}/{launch.world} (local {launch.local_rank}): holds {held} of {total} "
          f"bytes, fc1.weight {tuple(sd['fc1.weight'].shape)}, fc2.weight {tuple(sd['fc2.weight'].shape)}", flush=True)
    dist.barrier()
    if launch.rank == 0:
        assert err < 1e-4, err
        print(f"tp_shards: {launch.world} ranks agree with the whole model (max error {err:.2e})", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
