"""ZeRO-3 under torchrun: every rank takes only its flat partition of each parameter
(1/world of the flattened tensor, zero-padded like DeepSpeed), never the whole state dict;
an all_gather checks that the partitions put back together equal the checkpoint.

    python3 docs/examples/demo_model.py /tmp/demo.safetensors && ckptctl load /tmp/demo.safetensors --name demo
    python3 -m torch.distributed.run --nproc_per_node 2 docs/examples/zero3_torchrun.py --name demo

With DeepSpeed, fill the partitions zero.Init / zero.MiCS_Init created (group_size:
mics_shard_size):

    part = checkpoint.partition(name, group_size=mics_shard_size,
                                device=param.ds_tensor.device, dtype=param.ds_tensor.dtype)
    param.ds_tensor.data.copy_(part[:param.ds_tensor.numel()])

Debian 12's torch 1.13 (Python 3.11): add `--redirects 1 --tee 1` after --nproc_per_node,
its torchrun's defaults fail there ('NoneType' object has no attribute 'get').
"""
import argparse

import torch
import torch.distributed as dist

import ckpt


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--name", default="demo", help="the checkpoint's name in ckptd")
    ap.add_argument("--dtype", default=None, help="e.g. bf16 (default: as stored)")
    args = ap.parse_args()
    launch = ckpt.launcher_env()
    dist.init_process_group("gloo")
    checkpoint = ckpt.connect().attach(args.name)
    parts = checkpoint.partitions(dtype=args.dtype)    # rank and world from the launcher
    held = sum(p.numel() * p.element_size() for p in parts.values())
    print(f"zero3 rank {launch.rank}/{launch.world}: holds {held} bytes in {len(parts)} partitions", flush=True)

    for name in checkpoint.keys():
        gathered = [torch.empty_like(parts[name]) for _ in range(launch.world)]
        dist.all_gather(gathered, parts[name])
        whole = checkpoint.tensor(name).reshape(-1)
        want = whole if args.dtype is None else whole.to(ckpt.as_dtype(args.dtype))
        assert torch.equal(torch.cat(gathered)[:whole.numel()], want), name
    dist.barrier()
    if launch.rank == 0:
        print(f"zero3: the partitions of {launch.world} ranks reassemble all {len(parts)} tensors", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
