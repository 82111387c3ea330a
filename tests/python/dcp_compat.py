"""DCP save/load across torch versions for the tests: torch 1.13's
torch.distributed._shard.checkpoint.save_state_dict/load_state_dict and torch 2.x's
torch.distributed.checkpoint.save/load (no process group: one process)."""
import torch.distributed as dist

import ckpt.dcp  # noqa: F401  (first: on torch 1.13 + Python 3.11 it makes DCP importable)

try:  # torch >= 2.2
    import torch.distributed.checkpoint as _dcp
    from torch.distributed.checkpoint import CheckpointException, DefaultSavePlanner
    _NEW = hasattr(_dcp, "save")
except ImportError:  # torch 1.13
    from torch.distributed._shard import checkpoint as _dcp
    from torch.distributed._shard.checkpoint import CheckpointException  # a BaseException
    from torch.distributed._shard.checkpoint.default_planner import DefaultSavePlanner
    _NEW = False


def save(state_dict, writer, planner=None):
    if _NEW:
        return _dcp.save(state_dict, storage_writer=writer, planner=planner)
    return _dcp.save_state_dict(state_dict, writer, planner=planner, no_dist=not dist.is_initialized())


def load(state_dict, reader, planner=None):
    if _NEW:
        return _dcp.load(state_dict, storage_reader=reader, planner=planner)
    return _dcp.load_state_dict(state_dict, reader, planner=planner, no_dist=not dist.is_initialized())
