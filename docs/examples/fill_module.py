"""A module built on the meta device (no memory for its weights) and filled with this
rank's shards by ckpt.fill_module: strict keys, all or nothing, no
load_state_dict(assign=True) (so torch 1.13 works too), rank and world from torchrun.

    python3 docs/examples/demo_model.py /tmp/demo.safetensors && ckptctl load /tmp/demo.safetensors --name demo
    python3 -m torch.distributed.run --nproc_per_node 2 docs/examples/fill_module.py --name demo

Each rank's Block holds its shards (fc1 column parallel, fc2 row parallel); its forward
adds the ranks' partial sums. Rank 0 compares with the whole Block filled at world 1.

Debian 12's torch 1.13 (Python 3.11): add `--redirects 1 --tee 1` after --nproc_per_node,
its torchrun's defaults fail there ('NoneType' object has no attribute 'get').
"""
import argparse
import os
import sys

import torch
import torch.distributed as dist

import ckpt
from ckpt.meta import parameters_on_meta

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import demo_model  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--name", default="demo", help="the checkpoint's name in ckptd")
    ap.add_argument("--dtype", default=None, help="e.g. float16, bf16 (default: as stored)")
    args = ap.parse_args()
    launch = ckpt.launcher_env()
    dist.init_process_group("gloo")
    checkpoint = ckpt.connect().attach(args.name)

    with parameters_on_meta():                          # parameters on meta, buffers real
        block = demo_model.Block(world=launch.world)
    report = ckpt.fill_module(block, checkpoint, plan=demo_model.tp_plan(), dtype=args.dtype)
    assert not any(p.is_meta for p in block.parameters())
    ids = torch.arange(16).reshape(2, 8)
    with torch.no_grad():
        out = block(ids)

    with parameters_on_meta():
        whole = demo_model.Block(world=1)
    ckpt.fill_module(whole, checkpoint, 0, 1, dtype=args.dtype)  # explicit rank/world win
    with torch.no_grad():
        ref = whole(ids)
    err = (out.float() - ref.float()).abs().max().item()
    print(f"fill_module rank {launch.rank}/{launch.world}: filled {len(report.loaded)} parameters, "
          f"fc1.weight {tuple(block.fc1.weight.shape)} {block.fc1.weight.dtype}", flush=True)
    dist.barrier()
    if launch.rank == 0:
        assert err < (1e-4 if args.dtype is None else 0.1), err
        print(f"fill_module: {launch.world} ranks agree with the whole module (max error {err:.2e})", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
