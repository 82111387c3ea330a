"""Publishing checkpoints into ckptd from processes (issue 15; docs/write-path.md).

    summary = client.publish("step-100", model.state_dict())        # one process

    w = client.writer("step-100")              # one per rank; part/parts from the launcher
    for name, shard in my_shards.items():
        w.add(name, shard, global_shape=full_shape[name], offsets=my_offsets[name])
    w.add_flat("flat.param", my_partition, global_shape=(4096, 4096), start=rank * n)
    summary = w.commit()                       # returns when every rank committed

Nothing is visible until every part committed; then the generation is an ordinary ckptd
checkpoint (attach, shards of any TP degree or ZeRO world, verify, evict, re-adopted after
a daemon restart). The writer never maps the checkpoint's shared memory: it stages bytes
in a small ring (a sealed memfd, by default 4 x 64 MiB) that the daemon copies from.
"""
import ctypes
import os
import re
from typing import Mapping, Optional, Sequence

import torch

from . import _ckpt

_TORCH_TO_NAME = {
    torch.bool: "BOOL", torch.uint8: "U8", torch.int8: "I8", torch.int16: "I16", torch.int32: "I32",
    torch.int64: "I64", torch.float16: "F16", torch.bfloat16: "BF16", torch.float32: "F32", torch.float64: "F64",
    torch.complex64: "C64", torch.complex128: "C128",
}
for _name, _attr in (("F8_E4M3", "float8_e4m3fn"), ("F8_E5M2", "float8_e5m2")):
    if hasattr(torch, _attr):
        _TORCH_TO_NAME[getattr(torch, _attr)] = _name


def _dtype_name(t: torch.Tensor) -> str:
    from . import Unsupported
    try:
        return _TORCH_TO_NAME[t.dtype]
    except KeyError:
        raise Unsupported(f"ckptd cannot store tensors of {t.dtype}") from None


def _bytes_of(t: torch.Tensor) -> torch.Tensor:
    """The tensor's row-major bytes as a flat uint8 tensor on its device (a copy only when
    it is not contiguous)."""
    c = t if t.is_contiguous() else t.contiguous()
    flat = c.reshape(-1)
    if flat.dtype in (torch.complex64, torch.complex128):
        flat = torch.view_as_real(flat).reshape(-1)
    return flat.view(torch.uint8) if flat.dtype != torch.uint8 else flat


def _default_job(name: str, environ: Mapping[str, str]) -> Optional[str]:
    """A job id every rank of a launch derives alike: the name, the launcher's run id or
    rendezvous address (TORCHELASTIC_RUN_ID, MASTER_ADDR:MASTER_PORT, SLURM_JOB_ID)."""
    parts = [environ.get("TORCHELASTIC_RUN_ID", ""), environ.get("MASTER_ADDR", ""),
             environ.get("MASTER_PORT", ""), environ.get("SLURM_JOB_ID", ""),
             environ.get("SLURM_STEP_ID", "")]
    if not any(parts):
        return None
    job = ":".join([name] + [p for p in parts if p])
    return re.sub(r"[^A-Za-z0-9_.:-]", "_", job)[:200]


class Writer:
    """One part (rank) of a checkpoint generation being written. Tensors added are read
    when commit() runs (CPU or CUDA tensors, contiguous or not); keep them unchanged until
    it returns. Not thread-safe."""

    def __init__(self, socket: str, name: str, *, part: Optional[int] = None, parts: Optional[int] = None,
                 job: Optional[str] = None, replace: bool = False, timeout: float = 600.0,
                 slots: int = 4, slot_bytes: int = 64 << 20, environ: Optional[Mapping[str, str]] = None):
        from . import InvalidArgument
        from .launcher import launcher_env
        env = os.environ if environ is None else environ
        if part is None or parts is None:
            launch = launcher_env(env)
            # ckptd is per node: the parts of a node's generation are the node's ranks.
            part = launch.local_rank if part is None else part
            parts = launch.local_world if parts is None else parts
        if job is None and parts > 1:
            job = _default_job(name, env)
            if job is None:
                raise InvalidArgument(f"a write in {parts} parts needs a job id shared by every part: pass job=, or "
                                      "launch with torchrun/srun (MASTER_ADDR/PORT, TORCHELASTIC_RUN_ID or SLURM_JOB_ID)")
        self.name = name
        self.part, self.parts, self.job = int(part), int(parts), job
        self._tensors = []  # what the fill functions read, kept alive until commit returns
        self._cuda = False
        self._ring = None
        self._registered = None
        self._w = _ckpt.Writer.create(socket, name, job or "", self.part, self.parts, bool(replace), float(timeout),
                                      int(slots), int(slot_bytes), self._on_ring, self._off_ring)

    # ---- declarations ----

    def add(self, key: str, tensor: torch.Tensor, *, global_shape: Optional[Sequence[int]] = None,
            offsets: Optional[Sequence[int]] = None) -> None:
        """Adds `tensor` as the box of global tensor `key` that starts at `offsets` (default
        all 0) of a tensor of `global_shape` (default: the tensor's own shape: it is whole)."""
        t = tensor.detach()
        shape = list(t.shape)
        gshape = shape if global_shape is None else [int(d) for d in global_shape]
        offs = [0] * len(gshape) if offsets is None else [int(o) for o in offsets]
        self._w.add_box(key, _dtype_name(t), gshape, offs, shape, self._filler(t))

    def add_flat(self, key: str, tensor: torch.Tensor, *, global_shape: Sequence[int], start: int) -> None:
        """Adds `tensor`'s elements (flattened) as the elements [start, start + numel) of the
        flattened global tensor `key` of `global_shape` (a ZeRO-3 partition without its
        padding: pass only the elements inside the tensor)."""
        t = tensor.detach()
        self._w.add_flat(key, _dtype_name(t), [int(d) for d in global_shape], int(start), t.numel(),
                         self._filler(t))

    def side_file(self, fname: str, data: bytes) -> None:
        """Stores `data` with the generation as side file `fname` (Checkpoint.side_file)."""
        self._w.side_file(fname, bytes(data))

    # ---- commit ----

    def commit(self) -> dict:
        """Declares this part, waits for every part, streams the bytes and seals. Returns the
        published generation's summary (as load() does) once every part committed, or raises
        ckpt.CkptError with the reason the whole generation failed (nothing published)."""
        try:
            return self._w.commit()
        finally:
            self._tensors = []

    def abort(self) -> None:
        """Abandons the write: the whole generation fails, nothing is published."""
        self._w.abort()

    @property
    def nbytes(self) -> int:
        return self._w.nbytes

    # ---- internals ----

    def _filler(self, t: torch.Tensor):
        if t.is_cuda:
            self._cuda = True
        self._tensors.append(t)
        state = {"bytes": None}
        total = t.numel() * t.element_size()

        def fill(offset: int, ring_offset: int, size: int) -> None:
            b = state["bytes"]
            if b is None:
                b = state["bytes"] = _bytes_of(t)
            self._ring[ring_offset:ring_offset + size].copy_(b[offset:offset + size])
            if offset + size >= total:
                state["bytes"] = None  # a contiguous copy lives only while its tensor streams
        return fill

    def _on_ring(self, address: int, nbytes: int) -> None:
        buf = (ctypes.c_uint8 * nbytes).from_address(address)
        self._ring = torch.frombuffer(buf, dtype=torch.uint8)
        if self._cuda and torch.cuda.is_available():
            # Pinned: device-to-host copies into the ring run at DMA speed.
            err = torch.cuda.cudart().cudaHostRegister(address, nbytes, 0)
            if int(getattr(err, "value", err)) == 0:
                self._registered = address

    def _off_ring(self, address: int, nbytes: int) -> None:
        if self._registered is not None:
            torch.cuda.synchronize()
            torch.cuda.cudart().cudaHostUnregister(self._registered)
            self._registered = None
        self._ring = None


def publish(client, name: str, state_dict: Mapping[str, torch.Tensor], *, replace: bool = False,
            side_files: Optional[Mapping[str, bytes]] = None, timeout: float = 600.0) -> dict:
    """Client.publish: see ckpt.Client.publish."""
    w = Writer(client._c.socket_path, name, part=0, parts=1, replace=replace, timeout=timeout)
    for key, tensor in state_dict.items():
        if not isinstance(tensor, torch.Tensor):
            from . import InvalidArgument
            raise InvalidArgument(f"state_dict['{key}'] is a {type(tensor).__name__}, not a tensor")
        w.add(key, tensor)
    for fname, data in (side_files or {}).items():
        w.side_file(fname, data)
    return w.commit()
