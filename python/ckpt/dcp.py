"""PyTorch Distributed Checkpoint (DCP) storage backed by ckptd.

    import torch.distributed.checkpoint as dcp            # torch 2.x
    dcp.save(state_dict, storage_writer=ckpt.dcp.StorageWriter("job-step-1000"))
    dcp.load(state_dict, storage_reader=ckpt.dcp.StorageReader("job-step-1000"))
    fut = dcp.async_save(state_dict, storage_writer=ckpt.dcp.StorageWriter("job-step-2000"))

    # torch 1.13: torch.distributed._shard.checkpoint.save_state_dict / load_state_dict

Saving: every rank that has items to write is one part of ONE multi-part generation
(`Client.writer`, docs/write-path.md): each tensor item (a whole tensor, or a chunk of a
ShardedTensor / DTensor) is added as a box piece of its global tensor, so the published
generation holds every tensor whole, under its state-dict key. Non-tensor items (DCP's
BYTE_IO, e.g. an int or a dict pickled by torch.save) are stored as uint8 tensors named
``BYTES_PREFIX + key``. The coordinator adds DCP's ``Metadata`` (pickled) as the side file
``METADATA_FILE``. The generation is published when every part sealed, or not at all;
``save`` returns after that.

Loading: the reader attaches the generation (read-only) and serves each read item from a
zero-copy view of the global tensor narrowed to the requested box, copied into the target
(on any device): any world size or sharding can read what any other wrote.

The metadata side file is unpickled with an allow-list (torch.distributed classes, torch
dtypes/layouts/sizes, plain containers), not with pickle.load; bytes items are handed to
the planner as DCP's own FileSystemReader does (the default planner torch.load()s them).
"""
import dataclasses
import importlib.abc
import importlib.util
import io
import pickle
import sys
import uuid
from typing import Any, List, Optional

import torch

import ckpt


class _ShardedTensorMetadataFix(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """torch 1.13 does not import on Python >= 3.11 (Debian 12's python3-torch):
    torch/distributed/_shard/sharded_tensor/metadata.py declares
    `tensor_properties: TensorProperties = field(default=TensorProperties())`, a mutable
    dataclass default that Python 3.11 refuses (ValueError at import), and DCP imports it.
    This loads that one module with the line torch 2.0 has instead
    (`field(default_factory=TensorProperties)`); nothing else changes, and nothing at all
    when the bug is not there."""

    NAME = "torch.distributed._shard.sharded_tensor.metadata"
    BUGGY = "field(default=TensorProperties())"
    FIXED = "field(default_factory=TensorProperties)"

    def find_spec(self, fullname, path, target=None):
        if fullname != self.NAME:
            return None
        sys.meta_path.remove(self)  # find the real file once, without this finder
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or not spec.origin:
            return None
        with open(spec.origin, encoding="utf-8") as f:
            source = f.read()
        if self.BUGGY not in source:
            return None
        self._source, self._origin = source.replace(self.BUGGY, self.FIXED), spec.origin
        return importlib.util.spec_from_file_location(fullname, spec.origin, loader=self)

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        exec(compile(self._source, self._origin, "exec"), module.__dict__)


if sys.version_info >= (3, 11) and torch.__version__.startswith("1.") and \
        _ShardedTensorMetadataFix.NAME not in sys.modules:
    sys.meta_path.insert(0, _ShardedTensorMetadataFix())

try:  # torch >= 2.0
    from torch.distributed import checkpoint as _dcp
    from torch.distributed.checkpoint.metadata import (BytesStorageMetadata, Metadata,
                                                       TensorStorageMetadata)
    from torch.distributed.checkpoint.planner import LoadItemType, WriteItemType
    from torch.distributed.checkpoint.storage import WriteResult
    _BASE_WRITER, _BASE_READER = _dcp.StorageWriter, _dcp.StorageReader
except ImportError:  # torch 1.13
    from torch.distributed._shard import checkpoint as _dcp
    from torch.distributed._shard.checkpoint.metadata import (BytesStorageMetadata, Metadata,
                                                              TensorStorageMetadata)
    from torch.distributed._shard.checkpoint.planner import LoadItemType, WriteItemType
    from torch.distributed._shard.checkpoint.storage import WriteResult
    _BASE_WRITER, _BASE_READER = _dcp.StorageWriter, _dcp.StorageReader

__all__ = ["StorageWriter", "StorageReader", "METADATA_FILE", "BYTES_PREFIX"]

METADATA_FILE = "dcp.metadata"      # side file: pickled torch.distributed.checkpoint Metadata
BYTES_PREFIX = "__dcp_bytes__/"     # tensor name prefix of BYTE_IO items (uint8 tensors)


@dataclasses.dataclass(frozen=True)
class _Local:
    """What a rank's local plan tells the coordinator."""
    coordinator: bool


@dataclasses.dataclass(frozen=True)
class _Part:
    """What the coordinator's global plan gives each rank: its part of the generation."""
    job: str
    part: Optional[int]  # None: this rank writes nothing
    parts: int


def _client(client) -> "ckpt.Client":
    return client if client is not None else ckpt.connect()


def _bytes_key(fqn: str) -> str:
    return BYTES_PREFIX + fqn


class StorageWriter(_BASE_WRITER):
    """A DCP StorageWriter that publishes the checkpoint as generation `name` of ckptd.

    name: the checkpoint name (or give it as dcp.save's checkpoint_id on torch 2.x).
    client: a ckpt.Client (default: ckpt.connect()). replace: publish a new generation over
    an existing name (False: AlreadyExists if the name is taken). timeout: seconds each part
    waits for the others (a rank that never comes fails the whole generation).
    persist_dir: also write the published generation to this folder as safetensors
    (Client.persist, by the coordinator, after publish).

    After save, `summary` holds the published generation's summary (on every writing rank)."""

    def __init__(self, name: Optional[str] = None, client=None, *, replace: bool = False, timeout: float = 600.0,
                 persist_dir: Optional[str] = None):
        super().__init__()
        self.name = name
        self._client_arg = client
        self.replace = replace
        self.timeout = float(timeout)
        self.persist_dir = persist_dir
        self.is_coordinator = False
        self.summary = None
        self._global_plans = None

    # torch 2.x
    def reset(self, checkpoint_id=None) -> None:
        if checkpoint_id is not None:
            self.name = str(checkpoint_id)
        self.summary = None
        self._global_plans = None

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id) -> bool:
        return isinstance(checkpoint_id, str) and len(checkpoint_id) > 0

    def storage_meta(self):
        try:
            from torch.distributed.checkpoint.metadata import StorageMeta
        except ImportError:
            return None
        return StorageMeta(checkpoint_id=self.name, save_id=uuid.uuid4().hex)

    def set_up_storage_writer(self, is_coordinator: bool, *args, **kwargs) -> None:
        self.init(is_coordinator)

    # torch 1.13 (and the shared steps)
    def init(self, is_coordinator: bool) -> None:
        if not self.name:
            raise ValueError("ckpt.dcp.StorageWriter needs a checkpoint name (or dcp.save's checkpoint_id)")
        self.is_coordinator = is_coordinator

    def prepare_local_plan(self, plan):
        # Marks the coordinator's plan: it is a part even with no items (it adds the metadata).
        return dataclasses.replace(plan, storage_data=_Local(self.is_coordinator))

    def prepare_global_plan(self, plans: List[Any]) -> List[Any]:
        # One part per rank that has items, and the coordinator; one job id for all of them.
        job = "dcp-" + uuid.uuid4().hex
        marked = [i for i, p in enumerate(plans) if isinstance(p.storage_data, _Local) and p.storage_data.coordinator]
        coordinator = marked[0] if marked else 0
        writing = [i for i, p in enumerate(plans) if p.items or i == coordinator]
        numbers = {rank: k for k, rank in enumerate(writing)}
        self._global_plans = plans
        return [dataclasses.replace(p, storage_data=_Part(job, numbers.get(i), len(writing))) for i, p in enumerate(plans)]

    def _metadata(self, planner) -> "Metadata":
        md = getattr(planner, "metadata", None)
        if isinstance(md, Metadata):
            return md
        # A planner that keeps no metadata: rebuild it from the global plan as DCP's default does.
        sd_md = {}
        for plan in self._global_plans or []:
            for item in plan.items:
                if item.type == WriteItemType.BYTE_IO:
                    sd_md[item.index.fqn] = BytesStorageMetadata()
                else:
                    t = sd_md.setdefault(item.index.fqn, TensorStorageMetadata(
                        properties=item.tensor_data.properties, size=item.tensor_data.size, chunks=[]))
                    t.chunks.append(item.tensor_data.chunk)
        return Metadata(state_dict_metadata=sd_md)

    def write_data(self, plan, planner):
        part = plan.storage_data
        if not isinstance(part, _Part):
            raise ckpt.FailedPrecondition("ckpt.dcp.StorageWriter: the plan carries no part (was prepare_global_plan run?)")
        results = []
        fut = torch.futures.Future()
        if part.part is None:  # nothing to write on this rank
            fut.set_result(results)
            return fut
        w = _client(self._client_arg).writer(self.name, part=part.part, parts=part.parts, job=part.job,
                                             replace=self.replace, timeout=self.timeout)
        try:
            keep = []  # tensors must live until commit() has streamed them
            for item in plan.items:
                data = planner.resolve_data(item)
                if item.type == WriteItemType.BYTE_IO:
                    raw = bytes(data.getbuffer()) if isinstance(data, io.BytesIO) else bytes(data)
                    t = torch.frombuffer(bytearray(raw), dtype=torch.uint8) if raw else torch.empty(0, dtype=torch.uint8)
                    w.add(_bytes_key(item.index.fqn), t)
                    size = len(raw)
                else:
                    t = data.detach()
                    w.add(item.index.fqn, t, global_shape=list(item.tensor_data.size),
                          offsets=list(item.tensor_data.chunk.offsets))
                    size = t.numel() * t.element_size()
                keep.append(t)
                results.append(WriteResult(index=item.index, size_in_bytes=size, storage_data=None))
            if self.is_coordinator:
                md = self._metadata(planner)
                self._stored_sd_md = md.state_dict_metadata
                w.side_file(METADATA_FILE, pickle.dumps(md))
            self.summary = w.commit()
        except BaseException:
            try:
                w.abort()
            except Exception:
                pass
            raise
        if self.is_coordinator and self.persist_dir:
            _client(self._client_arg).persist(self.name, self.persist_dir, replace=True,
                                              generation=int(self.summary["generation"]))
        fut.set_result(results)
        return fut

    def finish(self, metadata, results) -> None:
        # The metadata went in with the coordinator's part (it had to: the generation is
        # published once every part sealed). A planner that changed it after write_data
        # would leave it stale: say so rather than return as if it were stored.
        stored = getattr(self, "_stored_sd_md", None)
        if stored is not None and metadata.state_dict_metadata != stored:
            raise ckpt.FailedPrecondition("ckpt.dcp: the planner changed the checkpoint metadata after the data was "
                                          "published; generation '%s' holds the earlier metadata" % self.name)


def _enum_member(cls, name):
    """getattr for the unpickler, limited to a member of an Enum class it allowed."""
    import enum
    if not (isinstance(cls, type) and issubclass(cls, enum.Enum)) or name.startswith("_"):
        raise pickle.UnpicklingError("ckpt.dcp: the metadata asks for attribute %r of %r" % (name, cls))
    return cls[name]


class _MetadataUnpickler(pickle.Unpickler):
    """Loads DCP metadata: torch.distributed dataclasses, torch dtypes/layouts/memory
    formats/Size, and plain containers; anything else is refused."""

    _BUILTINS = {"set", "frozenset", "list", "dict", "tuple", "slice", "complex", "bytearray", "object"}

    def find_class(self, module, name):
        if module.startswith("torch.distributed.") or module == "collections" and name == "OrderedDict":
            return super().find_class(module, name)
        if module == "torch":
            obj = getattr(torch, name, None)
            if name == "Size" or isinstance(obj, (torch.dtype, torch.layout, torch.memory_format)):
                return obj
        if module == "torch.serialization" and name == "_get_layout":  # how torch.layout pickles
            return super().find_class(module, name)
        if module == "builtins" and name in self._BUILTINS:
            return super().find_class(module, name)
        if module == "builtins" and name == "getattr":  # how enum members pickle (Python >= 3.11)
            return _enum_member
        if module == "copyreg" and name == "_reconstructor":
            return super().find_class(module, name)
        raise pickle.UnpicklingError("ckpt.dcp: the metadata refers to %s.%s, which is not allowed" % (module, name))


class StorageReader(_BASE_READER):
    """A DCP StorageReader serving the generation `name` (or dcp.load's checkpoint_id) of
    ckptd from a read-only attachment. The attachment is held from read_metadata until
    the reader is garbage collected (or reset), so one generation is read throughout even
    if the name is replaced meanwhile."""

    def __init__(self, name: Optional[str] = None, client=None):
        super().__init__()
        self.name = name
        self._client_arg = client
        self._ckpt = None

    def reset(self, checkpoint_id=None) -> None:
        if checkpoint_id is not None:
            self.name = str(checkpoint_id)
        self._ckpt = None

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id) -> bool:
        return isinstance(checkpoint_id, str) and len(checkpoint_id) > 0

    def _attached(self):
        if self._ckpt is None:
            if not self.name:
                raise ValueError("ckpt.dcp.StorageReader needs a checkpoint name (or dcp.load's checkpoint_id)")
            self._ckpt = _client(self._client_arg).attach(self.name)
        return self._ckpt

    def read_metadata(self):
        c = self._attached()
        if METADATA_FILE not in c.side_files:
            raise ckpt.NotFound("checkpoint '%s' (generation %d) was not saved by ckpt.dcp: it has no '%s'"
                                % (c.name, c.generation, METADATA_FILE))
        return _MetadataUnpickler(io.BytesIO(c.side_file(METADATA_FILE))).load()

    def set_up_storage_reader(self, metadata, is_coordinator: bool, *args, **kwargs) -> None:
        self.init(metadata, is_coordinator)

    def init(self, metadata, is_coordinator: bool) -> None:
        self._attached()

    def prepare_local_plan(self, plan):
        return plan

    def prepare_global_plan(self, plans):
        return plans

    def read_data(self, plan, planner):
        c = self._attached()
        for req in plan.items:
            fqn = req.storage_index.fqn
            if req.type == LoadItemType.BYTE_IO:
                raw = c.tensor(_bytes_key(fqn))
                value = io.BytesIO(raw.numpy().tobytes())
                value.seek(0)
                planner.load_bytes(req, value)
                continue
            src = c.tensor(fqn)  # the global tensor, zero-copy, read-only
            base = req.storage_index.offset or [0] * src.dim()
            for d, (start, off, length) in enumerate(zip(base, req.storage_offsets, req.lengths)):
                src = src.narrow(d, int(start) + int(off), int(length))
            target = planner.resolve_tensor(req).detach()
            if target.size() != src.size():
                raise ckpt.Corrupt("ckpt.dcp: '%s' read as %s but the target is %s"
                                   % (fqn, tuple(src.size()), tuple(target.size())))
            target.copy_(src)
            planner.commit_tensor(req, target)
        fut = torch.futures.Future()
        fut.set_result(None)
        return fut
