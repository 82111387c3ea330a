"""Where this process sits in a distributed job, read from the launcher's environment.

The C++ library reads the variables (include/ckpt/launcher.h, ckpt::LauncherEnv: one
source of truth for C++ and Python): torchrun / torch.distributed.launch / accelerate /
DeepSpeed's RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE (or DeepSpeed's LOCAL_SIZE);
Open MPI's OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE; MVAPICH2's
MV2_COMM_WORLD_*; MPICH / Intel MPI's PMI_RANK, PMI_SIZE, MPI_LOCALRANKID,
MPI_LOCALNRANKS; Slurm's SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID (the node's task count
from SLURM_TASKS_PER_NODE at SLURM_NODEID, else SLURM_NTASKS_PER_NODE). The first family
whose rank and size are both set wins, in that order.
"""
import os
from typing import Mapping, NamedTuple, Optional

from . import _ckpt


class Launch(NamedTuple):
    """This process's place: global rank and world size, rank and process count on this
    node, and which launcher's variables said so ("none" when no launcher was found:
    rank 0 of 1; "arguments" when the caller's rank/world were not the launcher's)."""
    rank: int
    world: int
    local_rank: int
    local_world: int
    source: str


def _env(environ: Optional[Mapping[str, str]]) -> dict:
    return {str(k): str(v) for k, v in (os.environ if environ is None else environ).items()}


def launcher_env(environ: Optional[Mapping[str, str]] = None) -> Launch:
    """The Launch read from `environ` (default os.environ) by ckpt::LauncherEnv. With no
    launcher variables: Launch(0, 1, 0, 1, "none"). A local rank the launcher does not
    give is the global rank when the job is one node (local world = world), else 0.
    Raises ckpt.InvalidArgument (a ValueError) naming the variable for a value that is not
    an integer, a world below 1, a rank outside [0, world), a local rank outside
    [0, local world), and contradictory values (a local world above the world, a local
    rank above the rank)."""
    return Launch(*_ckpt.launcher_env(_env(environ)))


def resolve_rank_world(rank: Optional[int], world: Optional[int],
                       environ: Optional[Mapping[str, str]] = None) -> Launch:
    """rank and world as given, each one left None taken from the launcher. The local rank
    and local world are the launcher's when (rank, world) is the launcher's place, else
    rank and world themselves (one node, source "arguments"). Raises InvalidArgument for a
    rank outside [0, world) and for launcher_env's errors."""
    return Launch(*_ckpt.resolve_launch(None if rank is None else int(rank), None if world is None else int(world),
                                        _env(environ)))
