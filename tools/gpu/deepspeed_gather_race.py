#!/usr/bin/env python3
"""Why DeepSpeed's own ZeRO-3 from_pretrained leaves other partitions than ckptd on CPU ranks
(issue 27): transformers' loader under zero.Init / MiCS_Init, with DeepSpeed's CPU
accelerator and gloo, against the checkpoint's own elements.

transformers' _load_state_dict_into_zero3_model gathers each module's parameters with
GatheredParameters(modifier_rank=0), loads the full state dict into them on rank 0, and
DeepSpeed broadcasts and re-partitions them. For a module of several parameters DeepSpeed
0.14.5's Init._allgather_params_coalesced launches one asynchronous all-gather each and
waits for the last only: on NCCL the others are done by then (one stream), on gloo each
runs on a thread of its own and the CPU accelerator's synchronize does nothing, so rank 0
loads while the earlier gathers still write the old partitions into the same memory. This
runs the loader (the same steps, on a model of bloom-like widths with no transformers) as
DeepSpeed ships it ("as released") and inside ckpt.deepspeed.gathers_waited() ("waited"),
and prints per rank which partitions differ from the checkpoint. A race: how many differ
varies from run to run (none is possible); "waited" must always be 0.

  PYTHONPATH=.carry-ds:build/python tools/gpu/deepspeed_gather_race.py [--world 2] [--mics]

Each rank is this script (--rank); torch 1.13's gloo lacks all_gather_into_tensor, which
is then the list all_gather into views of the output (as asynchronous as the real one).
"""
import argparse
import os
import socket
import subprocess
import sys

H = 1024


def rank_main(args):
    import torch
    import torch.distributed as dist
    from torch import nn
    if int(torch.__version__.split(".")[0]) < 2:
        real = dist.all_gather

        def all_gather_into_tensor(output_tensor, input_tensor, group=None, async_op=False):
            n = dist.get_world_size(group)
            return real(list(output_tensor.view(-1).chunk(n)), input_tensor.view(-1), group=group, async_op=async_op)

        dist.all_gather_into_tensor = all_gather_into_tensor
    import deepspeed
    import ckpt.deepspeed as ckds
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False  # no JIT build (docs/deepspeed.md)
    deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
    rank, world = dist.get_rank(), dist.get_world_size()

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln = nn.LayerNorm(H)
            self.up = nn.Linear(H, 4 * H)
            self.down = nn.Linear(4 * H, H)

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(3000, H)
            self.blocks = nn.ModuleList([Block() for _ in range(2)])

    torch.manual_seed(1)
    full = {n: p.detach().clone() for n, p in Model().named_parameters()}
    zero = {"stage": 3}
    if args.mics:
        zero["mics_shard_size"] = world
    cfg = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": zero}
    init = deepspeed.zero.MiCS_Init if args.mics else deepspeed.zero.Init
    for how in ("as released", "waited"):
        torch.manual_seed(2)
        with init(config_dict_or_path=cfg):
            model = Model()

        def load(module, prefix=""):  # transformers' _load_state_dict_into_zero3_model
            params = [(prefix + n, p) for n, p in module.named_parameters(recurse=False)]
            if params:
                with deepspeed.zero.GatheredParameters([p for _, p in params], modifier_rank=0):
                    if rank == 0:
                        with torch.no_grad():
                            for n, p in params:
                                p.copy_(full[n])
            for name, child in module._modules.items():
                load(child, prefix + name + ".")

        if how == "waited":
            with ckds.gathers_waited():
                load(model)
        else:
            load(model)
        differ = []
        for n, p in model.named_parameters():
            per = p.ds_tensor.numel()
            valid = max(0, min(per, p.ds_numel - per * rank))
            want = full[n].reshape(-1)[per * rank:per * rank + valid]
            bad = int((p.ds_tensor[:valid] != want).sum())
            if bad:
                differ.append(f"{n} ({bad} of {valid} elements)")
        print(f"rank {rank} of {world}, {'MiCS_Init' if args.mics else 'zero.Init'}, {how}: {len(differ)} of "
              f"{len(full)} partitions differ from the checkpoint{': ' if differ else ''}{', '.join(differ)}",
              flush=True)
        dist.barrier()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--mics", action="store_true")
    ap.add_argument("--rank", type=int)
    args = ap.parse_args()
    if args.rank is not None:
        return rank_main(args)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, DS_ACCELERATOR="cpu", DS_BUILD_OPS="0", OMP_NUM_THREADS="1", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(port), WORLD_SIZE=str(args.world), LOCAL_WORLD_SIZE=str(args.world),
               NDEV_PER_NODE=str(args.world))
    procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), "--rank", str(r), "--world", str(args.world)]
                              + (["--mics"] if args.mics else []), env=dict(env, RANK=str(r), LOCAL_RANK=str(r)))
             for r in range(args.world)]
    return max(p.wait() for p in procs)


if __name__ == "__main__":
    sys.exit(main())
