"""One rank of the DCP tests (tests/python/test_dcp.py), started with torchrun's environment
(RANK, WORLD_SIZE, MASTER_ADDR/PORT), gloo on the CPU (torch 1.13's torch.distributed._shard.checkpoint; 2.x's
torch.distributed.checkpoint works the same through ckpt.dcp).

  dcp_worker.py save NAME SOCKET    every rank holds rows of a ShardedTensor "layer.w"
                                    [12, 4] (split evenly over the world), a replicated
                                    "bias" and a non-tensor "step"; saved as one generation
  dcp_worker.py load NAME SOCKET    reads it back into a ShardedTensor split over THIS
                                    world (any world size) and checks every value
  dcp_worker.py fail NAME SOCKET    rank 1 raises while its data is resolved: the whole
                                    save must fail on every rank, nothing published
Prints "RANK r OK" on success."""
import sys

import torch
import torch.distributed as dist

import ckpt
import ckpt.dcp

from dcp_compat import CheckpointException, DefaultSavePlanner, load, save
from torch.distributed._shard.sharded_tensor import Shard, init_from_local_shards

ROWS, COLS = 12, 4


def full():
    return torch.arange(ROWS * COLS, dtype=torch.float32).reshape(ROWS, COLS) / 7


def sharded(rank, world, fill):
    per = ROWS // world
    local = fill[rank * per:(rank + 1) * per].clone()
    return init_from_local_shards([Shard.from_tensor_and_offsets(local, [rank * per, 0], rank)], [ROWS, COLS])


class FailingPlanner(DefaultSavePlanner):
    def resolve_data(self, write_item):
        if dist.get_rank() == 1:
            raise RuntimeError("rank 1 fails while resolving its data")
        return super().resolve_data(write_item)


def main():
    mode, name, socket = sys.argv[1:4]
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    client = ckpt.connect(socket)
    if mode in ("save", "fail"):
        sd = {"layer.w": sharded(rank, world, full()), "bias": torch.linspace(0, 1, 5).to(torch.bfloat16),
              "step": 1234}
        writer = ckpt.dcp.StorageWriter(name, client, timeout=60 if mode == "save" else 10)
        if mode == "save":
            save(sd, writer)
        else:
            try:
                save(sd, writer, planner=FailingPlanner())
            except CheckpointException as e:  # on every rank
                print("RANK %d FAILED %s" % (rank, type(e).__name__), flush=True)
                dist.barrier()
                return
            raise SystemExit("rank %d: the save did not fail" % rank)
    else:
        sd = {"layer.w": sharded(rank, world, torch.zeros(ROWS, COLS)), "bias": torch.zeros(5, dtype=torch.bfloat16),
              "step": 0}
        load(sd, ckpt.dcp.StorageReader(name, client))
        per = ROWS // world
        got = sd["layer.w"].local_shards()[0].tensor
        assert torch.equal(got, full()[rank * per:(rank + 1) * per]), (rank, got)
        assert torch.equal(sd["bias"], torch.linspace(0, 1, 5).to(torch.bfloat16)), sd["bias"]
        assert sd["step"] == 1234, sd["step"]
    dist.barrier()
    print("RANK %d OK" % rank, flush=True)


if __name__ == "__main__":
    main()
