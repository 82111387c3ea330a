"""ckpt: PyTorch front end of ckptd, the per-node shared-memory checkpoint daemon.

    import ckpt
    client = ckpt.connect()                       # $CKPTD_SOCKET or /run/ckptd/ckptd.sock
    client.load("/models/llama/model.safetensors", name="llama")
    sd = client.state_dict("llama", plan="auto", convention="hf",   # rank/world from torchrun's env
                           device=f"cuda:{rank}", dtype="float16")  # plans: docs/tp-plans.md
    ckpt.fill_module(model, client.attach("llama"), plan="auto", convention="hf", shapes="global")

Every rank attaches the daemon's one copy read-only; CPU tensors are zero-copy views of it,
copy-on-write like torch.load(mmap=True) (a write copies the pages written into this
process; the checkpoint never changes), until a shard is gathered or moved to a device.
Errors raise ckpt.CkptError subclasses that carry the daemon's message.
"""
import functools
from typing import Callable, Dict, Mapping, Optional, Tuple, Union

import torch

from . import _ckpt
from ._ckpt import (AlreadyExists, Cancelled, CkptError, Corrupt, DeadlineExceeded, FailedPrecondition, Internal,
                    InvalidArgument, IoError, NotFound, PermissionDenied, ResourceExhausted, Unavailable,
                    Unsupported)

__all__ = [
    "connect", "Client", "Checkpoint", "Rule", "REPLICATE", "column", "row", "fused", "partition_rule",
    "CkptError", "InvalidArgument", "NotFound", "AlreadyExists", "Corrupt", "Unsupported", "ResourceExhausted",
    "FailedPrecondition", "Unavailable", "IoError", "Internal", "PermissionDenied", "DeadlineExceeded", "Cancelled",
    "NcclGroup", "nccl_group",
    "ds_partition_size", "plans", "as_dtype", "as_device", "gpu_available", "__version__",
]

__version__ = _ckpt.__version__  # the project's version (CMake's project(VERSION); ckptd --version)

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


# A plan: None (every tensor whole), "auto" (the family from the checkpoint's config), a
# built-in family name, a plan file, a ckpt.plans.TpPlan, {regex: Rule} (first match wins,
# others replicated), or a callable (name, info dict) -> Rule applied tensor by tensor.
Plan = Union[None, str, "plans.TpPlan", Mapping[str, Rule], Callable[[str, dict], Rule]]


_DTYPE_NAMES = {torch.float16: "F16", torch.bfloat16: "BF16", torch.float32: "F32", torch.float64: "F64"}

# Short names people write for dtypes, besides the checkpoint table's (F16, BF16, ...) and
# torch's own attribute names (float16, half, bfloat16, float, ...).
_DTYPE_ALIASES = {"fp16": torch.float16, "fp32": torch.float32, "fp64": torch.float64, "bf16": torch.bfloat16,
                  "fp8_e4m3": "float8_e4m3fn", "fp8_e5m2": "float8_e5m2"}


@functools.lru_cache(maxsize=1)
def _dtype_names() -> Dict[str, torch.dtype]:
    names = {k.lower(): v for k, v in DTYPES.items()}
    for attr in dir(torch):
        value = getattr(torch, attr, None)
        if isinstance(value, torch.dtype):
            names[attr.lower()] = value
    for alias, value in _DTYPE_ALIASES.items():
        value = getattr(torch, value, None) if isinstance(value, str) else value
        if value is not None:
            names[alias] = value
    return names


def as_dtype(dtype) -> Optional[torch.dtype]:
    """A torch.dtype from a torch.dtype, None (None) or a name: torch's ("float16", "half",
    "bfloat16", "float32", "float", "torch.float16", ...), the checkpoint table's ("F16",
    "BF16", "F32", ...) or a short one ("fp16", "bf16", "fp32", "fp64"); any case. Raises
    ckpt.InvalidArgument (a ValueError) listing the valid names for anything else."""
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    if isinstance(dtype, str):
        names = _dtype_names()  # (cached: callers must not change it)
        key = dtype.strip().lower()
        key = key[len("torch."):] if key.startswith("torch.") else key
        if key in names:
            return names[key]
        valid = ", ".join(sorted(names))
        raise InvalidArgument(f"unknown dtype {dtype!r}: use a torch.dtype or one of {valid}")
    raise InvalidArgument(f"dtype must be a torch.dtype or a name such as 'float16', not {type(dtype).__name__} "
                          f"{dtype!r}")


def gpu_available() -> bool:
    """True when ckpt's CUDA copy engine can run in this process: the GPU plugin
    (libckptclient-cuda.so.0, beside _ckpt) is installed, the NVIDIA driver loads and a GPU
    is visible. The first call opens the plugin (about 30 ms); later calls are cheap. It
    says nothing about torch: a CPU-only torch cannot hold CUDA tensors even then
    (as_device says so). False, never an exception, on a machine without any of them."""
    return bool(_ckpt.gpu_available())


def _torch_cuda_build() -> Optional[str]:
    """The CUDA (or ROCm) version the installed torch was built for; None for a CPU-only torch."""
    return getattr(torch.version, "cuda", None) or getattr(torch.version, "hip", None)


def _parse_device(device) -> torch.device:
    """`device` (a torch.device, a name or a CUDA index) as a torch.device, whether or not
    this torch can use it; InvalidArgument for anything torch cannot even name."""
    if isinstance(device, bool) or not isinstance(device, (str, int, torch.device)):
        raise InvalidArgument(f"device must be a torch.device, a name such as 'cuda:0' or 'cpu', or a CUDA index, "
                              f"not {type(device).__name__} {device!r}")
    try:
        return torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
    except (RuntimeError, ValueError, TypeError) as e:
        raise InvalidArgument(f"unknown device {device!r}: use 'cpu', 'cuda' or 'cuda:N' (torch {torch.__version__} "
                              f"says: {str(e).splitlines()[0] if str(e) else type(e).__name__})") from None


def as_device(device) -> torch.device:
    """A torch.device the installed torch can put tensors on, from a torch.device, a name
    ("cpu", "cuda", "cuda:1") or a CUDA index (an int); "cuda" without an index is the
    current CUDA device, made explicit (cuda:N). Raises ckpt.InvalidArgument (a
    ValueError) naming the device and what to do for: a name torch does not know, a CUDA
    device with a CPU-only torch, a CUDA device when torch sees no GPU, a CUDA index past
    the GPUs torch sees, and another device type its torch backend says is unavailable."""
    d = _parse_device(device)
    if d.type in ("cpu", "meta"):
        return d
    if d.type == "cuda":
        if _torch_cuda_build() is None:
            raise InvalidArgument(f"device '{d}' needs a CUDA build of torch, but torch {torch.__version__} here is "
                                  "CPU-only (torch.version.cuda is None): install a CUDA build of torch "
                                  "(https://pytorch.org/get-started/locally/) or load to device='cpu'")
        count = torch.cuda.device_count()
        if count == 0:
            import os
            hidden = os.environ.get("CUDA_VISIBLE_DEVICES")
            why = (f"CUDA_VISIBLE_DEVICES={hidden!r} hides every GPU" if hidden is not None
                   else "no NVIDIA driver or no GPU: see nvidia-smi")
            raise InvalidArgument(f"device '{d}': torch {torch.__version__} (CUDA {_torch_cuda_build()}) sees no GPU "
                                  f"({why}); load to device='cpu' instead")
        index = torch.cuda.current_device() if d.index is None else d.index
        if index >= count:
            raise InvalidArgument(f"device '{d}' is out of range: torch sees {count} GPU(s), cuda:0 to "
                                  f"cuda:{count - 1} (CUDA_VISIBLE_DEVICES renumbers them from 0)")
        return torch.device("cuda", index)
    backend = getattr(torch, d.type, None)
    available = getattr(backend, "is_available", None)
    if callable(available) and not available():
        raise InvalidArgument(f"device '{d}' is not available to torch {torch.__version__} here: use 'cpu' or "
                              "'cuda:N'")
    return d


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

    @property
    def owner_uid(self) -> int:
        """The uid that loaded or published this generation, as the daemon recorded it in the
        segment (only the daemon writes it); 0xffffffff for a segment of an older ckptd."""
        return self._h.owner_uid

    @property
    def owner_admin(self) -> bool:
        """Whether the owner had the admin role when it created this generation."""
        return self._h.owner_admin

    def keys(self):
        return list(self._infos)

    @property
    def private_bytes(self) -> int:
        """This process's own memory that writes into this attachment's zero-copy views
        have cost so far (pages copied on write); 0 while they are only read."""
        return self._h.private_bytes

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
        """config.json parsed as a dict, or None if the checkpoint has none. Corrupt naming
        the checkpoint and the cause if it is not a UTF-8 JSON object (ckpt.plans.parse_config)."""
        if "config.json" not in self._h.side_files:
            return None
        return plans.parse_config(self._h.side_file("config.json"),
                                   f"the config.json of checkpoint '{self.name}'", Corrupt)

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
        """The whole tensor as a zero-copy CPU tensor, copy-on-write like
        torch.load(mmap=True): reads share the daemon's one copy; writing to it copies the
        pages written into this process's memory (charged to it) and never changes the
        checkpoint, which other processes, copies (copy=True, gathered shards), device
        loads and verify() keep seeing unchanged. Views of one tensor in this process see
        each other's writes, as views of one storage do."""
        info = self.info(name)
        dtype = _torch_dtype(info["dtype"])
        if info["nbytes"] == 0:
            return torch.empty(info["shape"], dtype=dtype)
        flat = torch.frombuffer(self._h.buffer(name), dtype=dtype)
        return flat.view(info["shape"])

    def shard(self, name: str, rule: Rule = REPLICATE, rank: Optional[int] = None, world: Optional[int] = None, *,
              device: Union[str, torch.device] = "cpu", dtype: Union[None, str, torch.dtype] = None,
              copy: bool = False) -> torch.Tensor:
        """This rank's part of tensor `name` under `rule`; rank / world default from the
        launcher's environment (ckpt.launcher_env()). On the CPU, a contiguous part with
        copy=False is a zero-copy, copy-on-write view (see tensor()); otherwise the part is
        gathered into a new tensor. For a device, the part is copied there from shared
        memory and converted to `dtype` (a torch.dtype or a name, see ckpt.as_dtype)."""
        from .launcher import resolve_rank_world
        if rule[0] == "replicate" and rank is None and world is None:
            rank, world = 0, 1  # nothing to split: no launcher needed
        place = resolve_rank_world(rank, world)
        rank, world = place.rank, place.world
        dtype = as_dtype(dtype)
        kind, dim, chunks, uneven = rule
        shape, nbytes, contiguous, offset = self._h.shard_info(name, kind, dim, rank, world, chunks, uneven)
        src_dtype = _torch_dtype(self.info(name)["dtype"])
        device = as_device(device)
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

    def partition(self, name: str, rank: Optional[int] = None, world: Optional[int] = None, *,
                  group_size: Optional[int] = None, device: Union[str, torch.device] = "cpu",
                  dtype: Union[None, str, torch.dtype] = None) -> torch.Tensor:
        """The ZeRO-3 partition of tensor `name` for global `rank` of `world` (default: the
        launcher's, ckpt.launcher_env()): 1/N of the flattened tensor, zero-padded like
        DeepSpeed. With MiCS, group_size is mics_shard_size: partitions are taken within the
        rank's shard group."""
        from .launcher import resolve_rank_world
        place = resolve_rank_world(rank, world)
        part_rank, parts = _partition_coords(place.rank, place.world, group_size)
        return self.shard(name, partition_rule(), part_rank, parts, device=device, dtype=dtype, copy=True)

    def resolve(self, rank: Optional[int] = None, world: Optional[int] = None, plan: Plan = None, *,
                convention: str = "megatron", config=None, **options):
        """This rank's outputs under `plan` (ckpt.plans.ShardOutput: name, pieces, transpose,
        view), as the plan engine resolves them for both the CPU and the CUDA path. `config`
        (ckpt.plans.config_dict: a dict, a config.json or model folder path, JSON text)
        defaults to the checkpoint's own (self.config). rank / world
        default from the launcher's environment (ckpt.launcher_env())."""
        from . import plans as _plans
        from .launcher import resolve_rank_world
        place = resolve_rank_world(rank, world)
        rank, world = place.rank, place.world
        if config is None:
            config = getattr(self, "config", None)
        tp = _plans.make(plan, config=config, convention=convention, **options)
        return self._h.resolve(tp, rank, world)

    def state_dict(self, rank: Optional[int] = None, world: Optional[int] = None, plan: Plan = None, *,
                   convention: str = "megatron",
                   config=None, fuse_qkv: bool = False, fuse_gate_up: bool = False, expert_parallel: bool = False,
                   fuse_experts: bool = False, transpose_conv1d: bool = False,
                   device: Union[str, torch.device] = "cpu", dtype: Union[None, str, torch.dtype] = None,
                   copy: bool = False, names=None, engine: str = "auto", group=None,
                   collective: str = "auto", host_path: str = "bounce") -> Dict[str, torch.Tensor]:
        """{name: this rank's tensor} of the rank's state dict under `plan`: "auto" (the family
        from the checkpoint's config.json: `config`, else self.config), a built-in family name
        (ckpt.plans.families()), a plan file, a ckpt.plans.TpPlan, a {regex: Rule} dict, None
        (every tensor whole) or a callable (name, info) -> Rule. `convention`: "megatron"
        (default) or "hf" (names, shapes and bytes of transformers' own tensor-parallel model
        on this rank, per-expert MoE tensors fused into 3-d experts.* as transformers does);
        docs/tp-plans.md says what each rank gets. Options (megatron): fuse_qkv, fuse_gate_up,
        expert_parallel (whole experts per rank), fuse_experts (3-d experts outputs),
        transpose_conv1d (GPT-2). `names` keeps only those outputs. dtype (a torch.dtype
        or a name: "float16", "bf16", ...; ckpt.as_dtype) converts floating-point tensors
        only, on the device when there is one. Every plan but a callable goes through the
        C++ plan engine, for the CPU as for the CUDA path. rank / world default from the
        launcher's environment (ckpt.launcher_env(): torchrun, DeepSpeed, mpirun, srun).
        On the CPU with copy=False, outputs that are one contiguous run of their tensor are
        zero-copy, copy-on-write views (see tensor()).

        engine: "gpu" copies through the CUDA copy engine (pinned bounce buffers, 2D DMA,
        several streams, conversion on the GPU) into one device allocation; "torch" copies
        output by output on the CPU (zero-copy views where an output is one contiguous run)
        and moves them with torch; "auto" takes "gpu" for a CUDA device when the engine is
        available and the plan is not a callable.

        group: load collectively with the other ranks of a node (they must all call this,
        each with its own rank/world/plan): a torch.distributed ProcessGroup (an NCCL
        communicator is set up once per group and device and cached) or a NcclGroup from
        nccl_group() / Client.nccl_group(). Tensors several ranks need are copied from host
        memory by one of them and sent over NVLink. collective: "auto" (only where it pays),
        "always", "never". Implies engine "gpu".

        host_path (gpu engine): "bounce" (16 threads stage through 1 MiB pinned buffers,
        32 MiB per call while it runs; the fastest), "register" (pins the mapping's pages
        in place: no extra host memory, several times slower), "pageable"."""
        from .launcher import resolve_rank_world
        place = resolve_rank_world(rank, world)
        rank, world = place.rank, place.world
        dtype = as_dtype(dtype)
        device = _parse_device(device)
        if engine not in ("auto", "gpu", "torch"):
            raise InvalidArgument(f"engine must be auto, gpu or torch, not '{engine}'")
        if group is not None:
            if engine == "torch":
                raise InvalidArgument("a collective load (group=) needs the gpu engine")
            engine = "gpu"
        # The copy engine, asked for where it cannot run (no plugin, driver or GPU), says
        # what is missing itself; otherwise the device must be one this torch can use.
        if not (engine == "gpu" and device.type == "cuda" and not _ckpt.gpu_available()):
            device = as_device(device)
        if group is not None and device.type == "cuda" and not isinstance(group, _ckpt.NcclGroup):
            group = nccl_group(group, device=device)
        if callable(plan) and not isinstance(plan, (str, _ckpt.TpPlan)):
            if engine == "gpu":
                raise InvalidArgument("the GPU engine needs a plan the plan engine resolves (not a callable)")
            return self._state_dict_by_rule(plan, rank, world, device, dtype, copy, names)
        options = dict(fuse_qkv=fuse_qkv, fuse_gate_up=fuse_gate_up, expert_parallel=expert_parallel,
                       fuse_experts=fuse_experts, transpose_conv1d=transpose_conv1d)
        outputs = self.resolve(rank, world, plan, convention=convention, config=config, **options)
        if names is not None:
            wanted = set(names)
            known = {o.name for o in outputs}
            missing = sorted(wanted - known)
            if missing:
                raise NotFound(f"rank {rank}'s state dict has no {missing[:5]} (of {len(known)} outputs)")
            outputs = [o for o in outputs if o.name in wanted]
        use_gpu = engine == "gpu" or (engine == "auto" and device.type == "cuda" and _ckpt.gpu_available()
                                       and (dtype is None or dtype in _DTYPE_NAMES))
        if use_gpu:
            if device.type != "cuda":
                raise InvalidArgument("the GPU engine needs a CUDA device")
            capsules = self._h.load_gpu(outputs, _cuda_index(device),
                                        _DTYPE_NAMES.get(dtype, "") if dtype is not None else "",
                                        group=group, collective=collective, host_path=host_path)
            return {name: torch.utils.dlpack.from_dlpack(c) for name, c in capsules.items()}
        out = {}
        for o in outputs:
            t = self._output_on_cpu(o, copy)
            want = dtype if (dtype is not None and t.is_floating_point()) else None
            if device.type != "cpu":
                t = t.to(device)
            if want is not None and want != t.dtype:
                t = t.to(want)
            out[o.name] = t
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return out

    def _output_on_cpu(self, output, copy: bool) -> torch.Tensor:
        """One resolved output on the CPU: a zero-copy (copy-on-write) view when it is one
        contiguous run of its source and copy is False, else gathered by the plan engine."""
        shape, dtype_name, nbytes, offset = self._h.output_layout(output)
        dtype = _torch_dtype(dtype_name)
        if offset >= 0 and not copy:
            whole = self.tensor(output.pieces[0]["source"]).reshape(-1).view(torch.uint8)
            return whole[offset:offset + nbytes].view(dtype).view(shape)
        t = torch.empty(shape, dtype=dtype)
        if nbytes > 0:
            self._h.copy_output(output, t.data_ptr(), nbytes)
        return t

    def _state_dict_by_rule(self, plan, rank, world, device, dtype, copy, names):
        """A callable plan: plan(name, info) -> Rule, tensor by tensor (user code)."""
        out = {}
        device = as_device(device)
        for name in (names if names is not None else self._infos):
            info = self.info(name)
            rule = plan(name, info)
            want = dtype if (dtype is not None and _torch_dtype(info["dtype"]).is_floating_point) else None
            out[name] = self.shard(name, rule, rank, world, device=device, dtype=want, copy=copy)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return out

    def partitions(self, rank: Optional[int] = None, world: Optional[int] = None, *,
                   group_size: Optional[int] = None, device: Union[str, torch.device] = "cpu",
                   dtype: Union[None, str, torch.dtype] = None, names=None) -> Dict[str, torch.Tensor]:
        """{name: ZeRO-3 / MiCS partition} for every tensor (or `names`); rank / world
        default from the launcher's environment."""
        from .launcher import resolve_rank_world
        place = resolve_rank_world(rank, world)
        rank, world = place.rank, place.world
        dtype = as_dtype(dtype)
        return {name: self.partition(name, rank, world, group_size=group_size, device=device, dtype=dtype)
                for name in (names if names is not None else self._infos)}

    def verify(self) -> None:
        """Recomputes every checksum; raises Corrupt on a mismatch."""
        self._h.verify()


class Client:
    """A connection to ckptd."""

    def __init__(self, socket: Optional[str] = None):
        self._c = _ckpt.Client.connect(socket or "")

    def load(self, path: str, name: Optional[str] = None, progress: Optional[Callable[[int, int], None]] = None,
             replace: bool = False, allow_expansion: bool = False) -> dict:
        """Has the daemon load `path` under `name` and returns its summary. `progress(done,
        total)` is called about every 100 ms. If it raises (or Ctrl-C arrives), the load is
        cancelled, nothing is published, and the exception propagates; the client stays
        usable (its next call gets its own answer). replace=True publishes a new
        generation under an existing name (processes attached to the old one keep it
        until they detach); without it, an existing name raises AlreadyExists. The
        summary's "evicted" lists what the memory budget evicted to make room."""
        return self._c.load(str(path), name or "", progress, replace, allow_expansion)

    def ensure(self, path: str, name: Optional[str] = None, progress: Optional[Callable[[int, int], None]] = None,
               allow_expansion: bool = False) -> dict:
        """Makes sure `name` holds the current content of `path`, loading it only if it is
        absent or its files changed (device, inode, size, mtime, ctime). Safe for every
        rank at once: one load runs, the others wait for it. Returns the summary with
        "action" ("loaded", "reloaded", "joined" or "current") and "evicted". Raises
        FailedPrecondition if `name` is loaded from another path. See docs/operations.md."""
        return self._c.ensure(str(path), name or "", progress, allow_expansion)

    def evict(self, name: str, force: bool = False, wait: float = 0.0) -> dict:
        """Removes `name`; returns what was evicted. NotFound if unknown. While it is
        attached: with force, evicted at once (attached processes keep their mapping);
        else, with wait (seconds, 0 to 86400, like ckptctl evict --wait), the call waits up
        to that long for the last attachment to go, then raises FailedPrecondition."""
        return self._c.evict(name, force, float(wait))

    def verify(self, name: str) -> dict:
        """Has the daemon re-hash `name` against its checksums (admin only)."""
        return self._c.verify(name)

    def metrics(self) -> str:
        return self._c.metrics()

    def list(self):
        return self._c.list()

    def info(self, name: str):
        return self._c.info(name)

    def status(self) -> dict:
        return self._c.status()

    def attach(self, name: str) -> Checkpoint:
        return Checkpoint(self._c.attach(name))

    def state_dict(self, name: str, rank: Optional[int] = None, world: Optional[int] = None, plan: Plan = None,
                   **kwargs) -> Dict[str, torch.Tensor]:
        """attach(name).state_dict(rank, world, plan, **kwargs): rank / world default from
        the launcher's environment."""
        return self.attach(name).state_dict(rank, world, plan, **kwargs)

    def rendezvous(self, job: str, rank: int, world: int, value: bytes = b"", timeout: float = 60.0) -> bytes:
        """Exchanges a small blob (an NCCL unique id) among the `world` ranks of `job` on
        this node. Rank 0 passes `value` (1 to 4096 bytes) and gets it back at once; ranks
        1..world-1 wait up to `timeout` seconds (0 to 3600) for it. Raises DeadlineExceeded
        (a TimeoutError) if rank 0 never published, InvalidArgument (a ValueError) for a bad
        job name, rank, world or value, or a world other than the one rank 0 published for.
        `job` must be unique to the run (e.g. include a launch id)."""
        return self._c.rendezvous(job, rank, world, bytes(value), float(timeout))

    def persist(self, name: str, dir: str, *, max_shard_size: Union[int, str] = "5GB", replace: bool = False,
                generation: int = 0, progress: Optional[Callable[[int, int], None]] = None) -> dict:
        """Writes the current generation of `name` (or exactly `generation`) to folder `dir` as
        safetensors, from this process with its own file permissions: one model.safetensors,
        or model-0000K-of-0000N.safetensors + model.safetensors.index.json above
        `max_shard_size` (bytes, or "5GB" = 5*10^9 / "500MiB" like transformers), the side files
        (config.json ...) beside them. Atomic: written into a temporary folder beside `dir`,
        fsync'ed, renamed into place; on any error (full disk, Ctrl-C, an exception from
        `progress(done, total)`) nothing is left behind and an existing `dir` is as it was.
        A non-empty `dir` is replaced only with replace=True (and only if it holds just
        files). Returns {"name", "generation", "dir", "files", "side_files", "tensor_count",
        "data_bytes", "bytes_written", "seconds"}."""
        if isinstance(max_shard_size, str):
            max_shard_size = _ckpt.parse_byte_size(max_shard_size)
        return _ckpt.persist(self._c, name, str(dir), int(max_shard_size), bool(replace), int(generation), progress)

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
    mean the current device (as torch itself reads them). InvalidArgument for a device
    that is not a CUDA device, and (as_device) for "cuda" alone with a torch that cannot
    use CUDA."""
    d = _parse_device("cuda" if device is None else device)
    if d.type != "cuda":
        raise InvalidArgument(f"device '{d}' is not a CUDA device: use 'cuda:N' or a CUDA index")
    # An index given is taken as it is (the engine reports a GPU it cannot use); "cuda"
    # alone is torch's current device, which only a torch that can use CUDA knows.
    return d.index if d.index is not None else as_device(d).index


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

from . import plans  # noqa: E402  (the plan engine, C++; imported last: it needs _ckpt only)
from .modules import FillReport, Launch, fill_module, launcher_env  # noqa: E402  (needs the names above)
__all__ += ["fill_module", "FillReport", "launcher_env", "Launch"]

from . import writer as _writer  # noqa: E402  (the write path; needs the names above)
Writer = _writer.Writer


def _client_publish(self, name: str, state_dict, *, replace: bool = False, side_files=None,
                    timeout: float = 600.0) -> dict:
    """Publishes `state_dict` ({name: tensor}, CPU or CUDA, contiguous or not) as checkpoint
    `name` from this one process and returns its summary (as load() does). Needs the writer
    role (the daemon's writer group, or admin). Nothing is visible until it returns; then no
    process, this one included, can change a byte of it. `replace` publishes a new
    generation of an existing name; `side_files` ({file name: bytes}) are stored with it.
    Raises AlreadyExists (name in use), ResourceExhausted (budget), PermissionDenied, ..."""
    return _writer.publish(self, name, state_dict, replace=replace, side_files=side_files, timeout=timeout)


def _client_writer(self, name: str, *, part=None, parts=None, job=None, replace: bool = False,
                   timeout: float = 600.0) -> "Writer":
    """A Writer for this rank's part of generation `name` (see ckpt.writer). part/parts
    default to the launcher's local rank/world (ckptd is per node); job, shared by every
    part, defaults to one derived from the name and the launcher's rendezvous variables."""
    return Writer(self._c.socket_path, name, part=part, parts=parts, job=job, replace=replace, timeout=timeout)


Client.publish = _client_publish
Client.writer = _client_writer
__all__ += ["Writer"]

_publish_in_memory = Client.publish


def _client_publish_and_persist(self, name: str, state_dict, *, persist_dir: Optional[str] = None,
                                persist_max_shard_size: Union[int, str] = "5GB", **kwargs) -> dict:
    """Client.publish (above) with one more option: `persist_dir`, a folder the published
    generation is then written to as safetensors (Client.persist with replace=True, pinned to
    the generation just published: FailedPrecondition if another replaced it meanwhile).
    The generation stays published if the persist fails; the persist's error is raised."""
    summary = _publish_in_memory(self, name, state_dict, **kwargs)
    if persist_dir is not None:
        self.persist(name, persist_dir, max_shard_size=persist_max_shard_size, replace=True,
                     generation=int(summary["generation"]))
    return summary


Client.publish = _client_publish_and_persist
