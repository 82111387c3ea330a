"""Where this process sits in a distributed job, read from the launcher's environment.

torchrun / torch.distributed.launch / accelerate / DeepSpeed set RANK, WORLD_SIZE,
LOCAL_RANK and LOCAL_WORLD_SIZE; Open MPI's mpirun sets OMPI_COMM_WORLD_RANK, _SIZE,
_LOCAL_RANK, _LOCAL_SIZE; MPICH / Intel MPI (Hydra) set PMI_RANK and PMI_SIZE (with
MPI_LOCALRANKID for the rank on the node); Slurm's srun sets SLURM_PROCID, SLURM_NTASKS,
SLURM_LOCALID. The first family whose rank and size are both set wins, in that order.
"""
import os
from typing import Mapping, NamedTuple, Optional

# (rank, world size, local rank, local world size) variable names per launcher, in the
# order they are tried. None: that launcher has no such variable.
_FAMILIES = (
    ("torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"),
    ("open-mpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE"),
    ("pmi", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
    ("slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"),
)


class Launch(NamedTuple):
    """This process's place: global rank and world size, rank and process count on this
    node, and which launcher's variables said so ("none" when no launcher was found:
    rank 0 of 1)."""
    rank: int
    world: int
    local_rank: int
    local_world: int
    source: str


def _int(env: Mapping[str, str], name: Optional[str], counts: bool = False) -> Optional[int]:
    if name is None or name not in env or env[name].strip() == "":
        return None
    text = env[name].strip()
    if counts and "(" in text:  # Slurm's per-node counts: "4(x2)" is 4 on each of 2 nodes
        text = text.split("(", 1)[0]
    try:
        return int(text)
    except ValueError:
        from . import InvalidArgument
        raise InvalidArgument(f"launcher variable {name}={text!r} is not an integer") from None


def launcher_env(environ: Optional[Mapping[str, str]] = None) -> Launch:
    """The Launch read from `environ` (default os.environ). With no launcher variables:
    Launch(0, 1, 0, 1, "none"). A local rank the launcher does not give is the global rank
    when the job is one node (local world = world), else 0 with local world 1.
    Raises ckpt.InvalidArgument (a ValueError) naming the variable for a value that is not
    an integer, a world below 1 or a rank outside [0, world)."""
    from . import InvalidArgument
    env = os.environ if environ is None else environ
    for source, rank_var, world_var, local_var, local_world_var in _FAMILIES:
        rank, world = _int(env, rank_var), _int(env, world_var)
        if rank is None or world is None:
            continue
        if world < 1:
            raise InvalidArgument(f"launcher variable {world_var}={world} must be at least 1")
        if not 0 <= rank < world:
            raise InvalidArgument(f"launcher variable {rank_var}={rank} is outside [0, {world_var}={world})")
        local_rank, local_world = _int(env, local_var), _int(env, local_world_var, counts=True)
        if local_rank is None:
            local_rank = rank if local_world in (None, world) else 0
        if local_world is None:
            local_world = world if local_rank == rank else max(local_rank + 1, 1)
        if local_world < 1 or not 0 <= local_rank < local_world:
            raise InvalidArgument(f"launcher variable {local_var}={local_rank} is outside "
                                  f"[0, {local_world_var}={local_world})")
        return Launch(rank, world, local_rank, local_world, source)
    return Launch(0, 1, 0, 1, "none")


def resolve_rank_world(rank: Optional[int], world: Optional[int],
                       environ: Optional[Mapping[str, str]] = None) -> Launch:
    """rank and world as given, each one left None taken from the launcher. The local rank
    and local world are the launcher's when (rank, world) is the launcher's place, else
    rank and world themselves (one node). Raises InvalidArgument for a rank outside
    [0, world)."""
    from . import InvalidArgument
    launch = launcher_env(environ)
    r = launch.rank if rank is None else int(rank)
    w = launch.world if world is None else int(world)
    if w < 1 or not 0 <= r < w:
        where = f" (launcher: {launch.source})" if rank is None or world is None else ""
        raise InvalidArgument(f"rank {r} out of range for world {w}{where}")
    if (r, w) == (launch.rank, launch.world):
        return Launch(r, w, launch.local_rank, launch.local_world, launch.source)
    return Launch(r, w, r, w, "arguments")
