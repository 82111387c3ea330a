"""ckpt: PyTorch front end of ckptd, the per-node shared-memory checkpoint daemon.

    import ckpt
    client = ckpt.connect()                       # $CKPTD_SOCKET or /run/ckptd/ckptd.sock
    client.load("/models/gpt-neo/model.safetensors", name="gpt-neo")
    sd = client.state_dict("gpt-neo", rank=rank, world=world, plan=ckpt.plans.GPT_NEO,
                           device=f"cuda:{rank}", dtype=torch.float16)
    model.load_state_dict(sd, strict=False)

Every rank attaches the daemon's one copy read-only; tensors are zero-copy views of it
(read-only CPU tensors) until a shard is gathered or moved to a device. Errors raise
ckpt.CkptError subclasses that carry the daemon's message.
"""
import json
import json
import os
import re
import warnings
from typing import Callable, Dict, Mapping, Optional, Tuple, Union

import torch

from . import _ckpt
from ._ckpt import (AlreadyExists, CkptError, Corrupt, DeadlineExceeded, FailedPrecondition, Internal,
                    InvalidArgument, IoError, NotFound, PermissionDenied, ResourceExhausted, Unavailable,
                    Unsupported)

__all__ = [
    "connect", "Client", "Checkpoint", "Rule", "REPLICATE", "column", "row", "fused", "partition_rule",
    "CkptError", "InvalidArgument", "NotFound", "AlreadyExists", "Corrupt", "Unsupported", "ResourceExhausted",
    "FailedPrecondition", "Unavailable", "IoError", "Internal", "PermissionDenied", "DeadlineExceeded",
    "NcclGroup", "nccl_group",
    "ds_partition_size",
]

DTYPES = {
    "BOOL": torch.bool, "U8": torch.uint8, "I8": torch.int8, "I16": torch.int16, "I32": torch.int32,
    "I64": torch.int64, "F16": torch.float16, "BF16": torch.bfloat16, "F32": torch.float32, "F64": torch.float64,
    "C64": torch.complex64, "C128": torch.complex128,
}
for _name, _attr in (("F8_E4M3", "float8_e4m3fn"), ("F8_E5M2", "float8_e5m2")):
    if hasattr(torch, _attr):  # torch >= 2.1
        DTYPES[_name] = getattr(torch, _attr)


class Rule(tuple):
    """How a tensor is sharded: (kind, dim, fused_chunks, allow_uneven).

    kind is "replicate", "split" (along dim, each of fused_chunks chunks split) or
    "partition" (ZeRO-3 / MiCS flat partition, padded like DeepSpeed)."""

    def __new__(cls, kind: str, dim: int = 0, fused_chunks: int = 1, allow_uneven: bool = False):
        return super().__new__(cls, (kind, dim, fused_chunks, allow_uneven))


REPLICATE = Rule("replicate")


def column(dim: int = 0, allow_uneven: bool = False) -> Rule:
    """Column parallel for an nn.Linear weight [out, in]: split the output dim (0)."""
    return Rule("split", dim, 1, allow_uneven)


def row(dim: int = -1, allow_uneven: bool = False) -> Rule:
    """Row parallel for an nn.Linear weight [out, in]: split the input dim (-1)."""
    return Rule("split", dim, 1, allow_uneven)


def fused(chunks: int = 3, dim: int = 0) -> Rule:
    """A fused tensor (QKV: 3 chunks) split chunk by chunk along dim."""
    return Rule("split", dim, chunks, False)


def partition_rule() -> Rule:
    return Rule("partition")


# A plan: {regex: Rule} (the first pattern that re.search-matches a name wins, tensors
# that match none are replicated), or a callable (name, info dict) -> Rule.
Plan = Union[None, Mapping[str, Rule], Callable[[str, dict], Rule]]


def _rule_for(plan: Plan, name: str, info: dict) -> Rule:
    if plan is None:
        return REPLICATE
    if callable(plan):
        return plan(name, info)
    for pattern, rule in plan.items():
        if re.search(pattern, name):
            return rule
    return REPLICATE


_DTYPE_NAMES = {torch.float16: "F16", torch.bfloat16: "BF16", torch.float32: "F32", torch.float64: "F64"}


def _plan_for_gpu(plan: Plan):
    """(kind, text) for the CUDA engine's TpPlan, or None if the plan has no such form."""
    if plan is None:
        return "json", json.dumps({"default": "replicate", "rules": []})
    if isinstance(plan, str):
        if plan in _ckpt.plan_families():
            return "family", plan
        if os.path.isfile(plan):
            return "file", plan
        raise InvalidArgument(f"unknown plan '{plan}': not a built-in family {_ckpt.plan_families()} nor a file")
    if callable(plan):
        return None
    rules = []
    for pattern, (kind, dim, chunks, uneven) in plan.items():
        if kind == "replicate":
            rules.append({"pattern": pattern, "rule": "replicate"})
        elif kind == "split":
            rules.append({"pattern": pattern, "rule": {"split": dim, "chunks": chunks, "uneven": bool(uneven)}})
        else:
            return None  # flat partitions: not a tensor-parallel plan
    return "json", json.dumps({"default": "replicate", "rules": rules})


def ds_partition_size(numel: int, world: int) -> int:
    """Elements each rank holds under DeepSpeed ZeRO-3 partitioning (padded)."""
    return -(-numel // world)


class Checkpoint:
    """An attached checkpoint generation. Tensors it returns may view its shared memory;
    the mapping lives as long as any of them (or this object) does."""

    def __init__(self, handle: "_ckpt.Checkpoint"):
        self._h = handle
        self._infos = {t["name"]: t for t in handle.tensors()}

    @property
    def name(self) -> str:
        return self._h.name

    @property
    def generation(self) -> int:
        return self._h.generation

    def keys(self):
        return list(self._infos)

    @property
    def side_files(self) -> list:
        """Names of the side files the daemon kept from the checkpoint's folder
        (config.json, generation_config.json, ...), in stored order."""
        return list(self._h.side_files)

    def side_file(self, name: str) -> bytes:
        """The bytes of side file `name`, exactly as they were in the file (read from the
        attachment, not the file). NotFound if it was not kept."""
        return self._h.side_file(name)

    @property
    def config(self) -> Optional[dict]:
        """config.json parsed as a dict, or None if the checkpoint has none."""
        if "config.json" not in self._h.side_files:
            return None
        return json.loads(self._h.side_file("config.json").decode("utf-8"))

    @property
    def metadata(self) -> Dict[str, str]:
        """The checkpoint's metadata (a safetensors file's __metadata__, a sharded index's
        "metadata"); empty if none."""
        return dict(self._h.metadata)

    def info(self, name: str) -> dict:
        try:
            return self._infos[name]
        except KeyError:
            raise NotFound(f"checkpoint '{self.name}' has no tensor '{name}'") from None

    def tensor(self, name: str) -> torch.Tensor:
        """The whole tensor as a read-only, zero-copy CPU tensor (do not write to it)."""
        info = self.info(name)
        dtype = _torch_dtype(info["dtype"])
        if info["nbytes"] == 0:
            return torch.empty(info["shape"], dtype=dtype)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "buffer is not writable": it is shared memory
            flat = torch.frombuffer(self._h.buffer(name), dtype=dtype)
        return flat.view(info["shape"])

    def shard(self, name: str, rule: Rule = REPLICATE, rank: int = 0, world: int = 1, *,
              device: Union[str, torch.device] = "cpu", dtype: Optional[torch.dtype] = None,
              copy: bool = False) -> torch.Tensor:
        """This rank's part of tensor `name` under `rule`. On the CPU, a contiguous part
        with copy=False is a zero-copy (read-only) view; otherwise the part is gathered
        into a new tensor. For a device, the part is copied there from shared memory
        and converted to `dtype` on the device."""
        kind, dim, chunks, uneven = rule
        shape, nbytes, contiguous, offset = self._h.shard_info(name, kind, dim, rank, world, chunks, uneven)
        src_dtype = _torch_dtype(self.info(name)["dtype"])
        device = torch.device(device)
        if contiguous and nbytes > 0 and (device.type != "cpu" or not copy):
            whole = self.tensor(name).reshape(-1).view(torch.uint8)
            out = whole[offset:offset + nbytes].view(src_dtype).view(shape)  # zero copy
        else:
            out = torch.empty(shape, dtype=src_dtype)
            if nbytes > 0:
                self._h.copy_shard(name, out.data_ptr(), nbytes, kind, dim, rank, world, chunks, uneven)
        if device.type != "cpu":
            out = out.to(device)
        if dtype is not None and dtype != out.dtype:
            out = out.to(dtype)
        return out

    def partition(self, name: str, rank: int, world: int, *, group_size: Optional[int] = None,
                  device: Union[str, torch.device] = "cpu", dtype: Optional[torch.dtype] = None) -> torch.Tensor:
        """The ZeRO-3 partition of tensor `name` for global `rank` of `world`: 1/N of the
        flattened tensor, zero-padded like DeepSpeed. With MiCS, group_size is
        mics_shard_size: partitions are taken within the rank's shard group."""
        part_rank, parts = _partition_coords(rank, world, group_size)
        return self.shard(name, partition_rule(), part_rank, parts, device=device, dtype=dtype, copy=True)

    def state_dict(self, rank: int = 0, world: int = 1, plan: Plan = None, *,
                   device: Union[str, torch.device] = "cpu", dtype: Optional[torch.dtype] = None,
                   copy: bool = False, names=None, engine: str = "auto", group=None,
                   collective: str = "auto", host_path: str = "bounce") -> Dict[str, torch.Tensor]:
        """{name: this rank's shard} for every tensor (or `names`), sharded by `plan`: a
        {regex: Rule} dict, a callable, a built-in family name ("gpt-neo", "llama", ...;
        see _ckpt.plan_families()) or a JSON plan file. dtype converts floating-point
        tensors only, on the device when there is one.

        engine: "gpu" copies through the CUDA copy engine (pinned bounce buffers, 2D DMA,
        several streams, conversion on the GPU) into one device allocation; "torch" copies
        tensor by tensor with torch; "auto" takes "gpu" for a CUDA device when the engine
        is available and the plan has a tensor-parallel form (a dict of split/replicate
        rules, a family name or a plan file; not a callable).

        group: load collectively with the other ranks of a node (they must all call this,
        each with its own rank/world/plan): a torch.distributed ProcessGroup (an NCCL
        communicator is set up once per group and device and cached) or a NcclGroup from
        nccl_group() / Client.nccl_group(). Tensors several ranks need are copied from host
        memory by one of them and sent over NVLink. collective: "auto" (only where it pays),
        "always", "never". Implies engine "gpu".

        host_path (gpu engine): "bounce" (16 threads stage through 1 MiB pinned buffers,
        32 MiB per call while it runs; the fastest), "register" (pins the mapping's pages
        in place: no extra host memory, several times slower), "pageable"."""
        device = torch.device(device)
        if group is not None:
            if engine == "torch":
                raise InvalidArgument("a collective load (group=) needs the gpu engine")
            engine = "gpu"
            if device.type == "cuda" and not isinstance(group, _ckpt.NcclGroup):
                group = nccl_group(group, device=device)
        gpu_plan = _plan_for_gpu(plan) if device.type == "cuda" and names is None else None
        use_gpu = engine == "gpu" or (engine == "auto" and gpu_plan is not None
                                       and _ckpt.gpu_available() and (dtype is None or dtype in _DTYPE_NAMES))
        if use_gpu:
            if gpu_plan is None:
                raise InvalidArgument("the GPU engine needs a CUDA device, all tensors, and a dict, family or file plan")
            capsules = self._h.load_gpu(gpu_plan[0], gpu_plan[1], rank, world, _cuda_index(device),
                                        _DTYPE_NAMES.get(dtype, "") if dtype is not None else "",
                                        group=group, collective=collective, host_path=host_path)
            return {name: torch.utils.dlpack.from_dlpack(c) for name, c in capsules.items()}
        if engine not in ("auto", "torch"):
            raise InvalidArgument(f"engine must be auto, gpu or torch, not '{engine}'")
        if isinstance(plan, str):
            from . import plans as _plans
            plan = _plans.BY_FAMILY.get(plan) or _plans.from_file(plan)
        out = {}
        for name in (names if names is not None else self._infos):
            info = self.info(name)
            rule = _rule_for(plan, name, info)
            want = dtype if (dtype is not None and _torch_dtype(info["dtype"]).is_floating_point) else None
            out[name] = self.shard(name, rule, rank, world, device=device, dtype=want, copy=copy)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return out

    def partitions(self, rank: int, world: int, *, group_size: Optional[int] = None,
                   device: Union[str, torch.device] = "cpu", dtype: Optional[torch.dtype] = None,
                   names=None) -> Dict[str, torch.Tensor]:
        """{name: ZeRO-3 / MiCS partition} for every tensor (or `names`)."""
        return {name: self.partition(name, rank, world, group_size=group_size, device=device, dtype=dtype)
                for name in (names if names is not None else self._infos)}

    def verify(self) -> None:
        """Recomputes every checksum; raises Corrupt on a mismatch."""
        self._h.verify()


class Client:
    """A connection to ckptd."""

    def __init__(self, socket: Optional[str] = None):
        self._c = _ckpt.Client.connect(socket or "")

    def load(self, path: str, name: Optional[str] = None, progress: Optional[Callable[[int, int], None]] = None) -> dict:
        return self._c.load(str(path), name or "", progress)

    def evict(self, name: str, force: bool = False) -> None:
        self._c.evict(name, force)

    def list(self):
        return self._c.list()

    def info(self, name: str):
        return self._c.info(name)

    def status(self) -> dict:
        return self._c.status()

    def attach(self, name: str) -> Checkpoint:
        return Checkpoint(self._c.attach(name))

    def state_dict(self, name: str, rank: int = 0, world: int = 1, plan: Plan = None, **kwargs) -> Dict[str, torch.Tensor]:
        return self.attach(name).state_dict(rank, world, plan, **kwargs)

    def rendezvous(self, job: str, rank: int, world: int, value: bytes = b"", timeout: float = 60.0) -> bytes:
        """Exchanges a small blob (an NCCL unique id) among the `world` ranks of `job` on
        this node. Rank 0 passes `value` (1 to 4096 bytes) and gets it back at once; ranks
        1..world-1 wait up to `timeout` seconds (0 to 3600) for it. Raises DeadlineExceeded
        (a TimeoutError) if rank 0 never published, InvalidArgument (a ValueError) for a bad
        job name, rank, world or value, or a world other than the one rank 0 published for.
        `job` must be unique to the run (e.g. include a launch id)."""
        return self._c.rendezvous(job, rank, world, bytes(value), float(timeout))

    def nccl_group(self, job: str, rank: int, size: int, device: Union[str, torch.device, int],
                   timeout: float = 300.0) -> "NcclGroup":
        """An NcclGroup of `size` ranks of this node with the NCCL unique id handed out by the
        daemon under `job` (unique per run), for state_dict(group=...). Raises
        DeadlineExceeded if a rank does not join within `timeout` seconds."""
        return _ckpt.NcclGroup.join(self._c, job, rank, size, _cuda_index(device), float(timeout))


NcclGroup = _ckpt.NcclGroup
_GROUPS = {}  # (id(process group), device index) -> (process group, NcclGroup)


def nccl_group(process_group=None, *, device: Union[str, torch.device, int, None] = None,
               timeout: float = 300.0) -> "NcclGroup":
    """The NcclGroup of a torch.distributed process group (the default group if None) on
    `device` (default: the current CUDA device), for state_dict(group=...). Every rank of
    the group must call it; rank 0 makes an NCCL unique id and torch.distributed hands it
    to the others (any backend). Cached per group and device. Raises DeadlineExceeded if
    a rank does not join within `timeout` seconds."""
    import torch.distributed as dist
    index = _cuda_index(device)
    key = (id(process_group), index)
    if key in _GROUPS and _GROUPS[key][0] is process_group and not _GROUPS[key][1].broken:
        return _GROUPS[key][1]
    # (A broken group, after a timeout or a dead rank, is replaced: every rank of the group
    # must then call again, as for the first time.)
    rank = dist.get_rank(process_group)
    size = dist.get_world_size(process_group)
    box = [_ckpt.NcclGroup.unique_id() if rank == 0 else None]
    src = 0 if process_group is None else dist.get_global_rank(process_group, 0)
    dist.broadcast_object_list(box, src=src, group=process_group)
    group = _ckpt.NcclGroup.create(box[0], rank, size, index, float(timeout))
    _GROUPS[key] = (process_group, group)
    return group


def connect(socket: Optional[str] = None, wait: float = 0.0) -> Client:
    """Connects to ckptd at `socket` ($CKPTD_SOCKET or /run/ckptd/ckptd.sock by default),
    retrying for up to `wait` seconds while nobody listens (a daemon just started).
    Raises Unavailable after that."""
    import time
    deadline = time.monotonic() + wait
    while True:
        try:
            return Client(socket)
        except Unavailable:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.02)


def _cuda_index(device) -> int:
    """The CUDA device index of an int, "cuda:N", torch.device or None; "cuda" and None
    mean the current device (as torch itself reads them)."""
    if isinstance(device, int):
        return device
    index = torch.device(device).index if device is not None else None
    return torch.cuda.current_device() if index is None else index


def _torch_dtype(name: str) -> torch.dtype:
    try:
        return DTYPES[name]
    except KeyError:
        raise Unsupported(f"dtype {name} has no torch equivalent in torch {torch.__version__}") from None


def _partition_coords(rank: int, world: int, group_size: Optional[int]) -> Tuple[int, int]:
    if world < 1 or not 0 <= rank < world:
        raise InvalidArgument(f"rank {rank} out of range for world {world}")
    if group_size is None:
        return rank, world
    if group_size < 1 or world % group_size != 0:
        raise InvalidArgument(f"MiCS shard group size {group_size} must divide world {world}")
    return rank % group_size, group_size
