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
``BYTES_PREFIX + key``. The coordinator adds DCP's ``Metadata`` as the side file
``METADATA_FILE``: JSON that carries data only (docs/dcp.md, "The metadata file"). The generation is published when every part sealed, or not at all;
``save`` returns after that.

Loading: the reader attaches the generation (read-only) and serves each read item from a
zero-copy view of the global tensor narrowed to the requested box, copied into the target
(on any device): any world size or sharding can read what any other wrote.

The metadata is rebuilt into this torch's Metadata classes field by field; nothing read
from shared memory names a class or a function. Metadata pickled by an earlier version
(``LEGACY_METADATA_FILE``) is run by a small pickle machine of this module's (exact
globals, no calls but the constructions DCP's metadata needs), never by pickle.
Bytes items are handed to the planner as DCP's own FileSystemReader does (the default
planner torch.load()s them: they are the user's own objects, as with any DCP storage).
"""
import dataclasses
import importlib.abc
import importlib.util
import io
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
    from torch.distributed.checkpoint.metadata import (BytesStorageMetadata, ChunkStorageMetadata, Metadata,
                                                       TensorStorageMetadata)
    from torch.distributed.checkpoint.planner import LoadItemType, WriteItemType
    from torch.distributed.checkpoint.storage import WriteResult
    from torch.distributed.checkpoint.metadata import TensorProperties
    _BASE_WRITER, _BASE_READER = _dcp.StorageWriter, _dcp.StorageReader
except ImportError:  # torch 1.13
    from torch.distributed._shard import checkpoint as _dcp
    from torch.distributed._shard.checkpoint.metadata import (BytesStorageMetadata, ChunkStorageMetadata,
                                                              Metadata, TensorStorageMetadata)
    from torch.distributed._shard.checkpoint.planner import LoadItemType, WriteItemType
    from torch.distributed._shard.checkpoint.storage import WriteResult
    from torch.distributed._shard.sharded_tensor.metadata import TensorProperties
    _BASE_WRITER, _BASE_READER = _dcp.StorageWriter, _dcp.StorageReader
try:  # torch >= 2.3
    from torch.distributed.checkpoint.metadata import StorageMeta
except ImportError:
    StorageMeta = None

__all__ = ["StorageWriter", "StorageReader", "METADATA_FILE", "LEGACY_METADATA_FILE", "BYTES_PREFIX"]

METADATA_FILE = "dcp.metadata.json"  # side file: DCP's Metadata as data-only JSON (_encode_metadata)
LEGACY_METADATA_FILE = "dcp.metadata"  # what earlier versions wrote: Metadata pickled (read, never written)
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
        if StorageMeta is None:
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
                w.side_file(METADATA_FILE, _encode_metadata(md))
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


# ---- The metadata side file: data only -------------------------------------------------
#
# DCP's Metadata is stored as JSON (METADATA_FILE) and rebuilt into this torch's Metadata
# classes field by field; nothing in the file names a class, a module or a function. An
# older generation's pickled metadata (LEGACY_METADATA_FILE) is read by _load_legacy_metadata:
# an exact allow-list of classes and opcodes, then re-encoded and rebuilt the same way.

_FORMAT = "ckpt.dcp.metadata"
_VERSION = 1
_MAX_DEPTH = 64            # nesting of planner_data / storage_data values
_MAX_METADATA_BYTES = 64 << 20

# torch's own objects by name, from this torch's namespace (never a getattr on a stored name).
_DTYPES = {n: v for n, v in vars(torch).items() if isinstance(v, torch.dtype)}
_LAYOUTS = {n: v for n, v in vars(torch).items() if isinstance(v, torch.layout)}
_MEMORY_FORMATS = {n: v for n, v in vars(torch).items() if isinstance(v, torch.memory_format)}


def _torch_name(table, obj, what):
    for n, v in table.items():
        if v is obj and not n.startswith("_"):
            return n
    raise ckpt.InvalidArgument("ckpt.dcp: the checkpoint metadata holds %s %r, which has no name in torch" % (what, obj))


class _Bad(Exception):
    """A malformed metadata document (turned into ckpt.Corrupt naming the checkpoint)."""


def _encode_value(v, depth=0):
    """planner_data / storage_data: None, bool, int, float, str, list, tuple, dict, torch.Size."""
    if depth > _MAX_DEPTH:
        raise ckpt.InvalidArgument("ckpt.dcp: the planner's metadata is nested deeper than %d" % _MAX_DEPTH)
    if v is None or isinstance(v, (bool, str)):
        return v
    if isinstance(v, (int, float)) and type(v) in (int, float):
        return v
    if isinstance(v, torch.Size):
        return {"size": [int(x) for x in v]}
    if type(v) is tuple:
        return {"tuple": [_encode_value(x, depth + 1) for x in v]}
    if type(v) is list:
        return [_encode_value(x, depth + 1) for x in v]
    if isinstance(v, dict) and type(v) in (dict, __import__("collections").OrderedDict):
        return {"dict": [[_encode_value(k, depth + 1), _encode_value(x, depth + 1)] for k, x in v.items()]}
    raise ckpt.InvalidArgument("ckpt.dcp: the planner's metadata holds a %s, which cannot be stored as data "
                               "(only None, bool, int, float, str, list, tuple, dict and torch.Size)"
                               % type(v).__name__)


def _decode_value(v, depth=0):
    if depth > _MAX_DEPTH:
        raise _Bad("a value is nested deeper than %d" % _MAX_DEPTH)
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, list):
        return [_decode_value(x, depth + 1) for x in v]
    if isinstance(v, dict) and len(v) == 1:
        (tag, body), = v.items()
        if isinstance(body, list):
            if tag == "size":
                return torch.Size(_ints(body, "a size"))
            if tag == "tuple":
                return tuple(_decode_value(x, depth + 1) for x in body)
            if tag == "dict":
                out = {}
                for pair in body:
                    if not (isinstance(pair, list) and len(pair) == 2):
                        raise _Bad("a dict entry is not a [key, value] pair")
                    key = _decode_value(pair[0], depth + 1)
                    try:
                        out[key] = _decode_value(pair[1], depth + 1)
                    except TypeError:
                        raise _Bad("a dict key is a %s, which is not hashable" % type(key).__name__) from None
                return out
    raise _Bad("a value is %s, not a value of this format" % _short(v))


def _short(v):
    text = repr(v)
    return text if len(text) <= 80 else text[:77] + "..."


def _ints(v, what):
    if not isinstance(v, list) or not all(type(x) is int and 0 <= x < (1 << 63) for x in v):
        raise _Bad("%s is %s, not a list of integers in [0, 2^63)" % (what, _short(v)))
    return v


def _field(obj: dict, key: str, kind, what: str):
    if key not in obj:
        raise _Bad("%s has no '%s'" % (what, key))
    v = obj[key]
    if kind is bool and type(v) is not bool or kind is str and not isinstance(v, str) or \
            kind is dict and not isinstance(v, dict) or kind is list and not isinstance(v, list):
        raise _Bad("%s: '%s' is %s, not a %s" % (what, key, _short(v), kind.__name__))
    return v


def _named(table, name, what):
    if not isinstance(name, str) or name.startswith("_") or name not in table:
        raise _Bad("%s %s is not one of this torch's" % (what, _short(name)))
    return table[name]


def _encode_metadata(md) -> bytes:
    """DCP's Metadata as the JSON of METADATA_FILE. InvalidArgument if it holds anything
    that is not data (a custom planner's objects in planner_data, say)."""
    import json
    entries = {}
    for fqn, m in md.state_dict_metadata.items():
        if not isinstance(fqn, str):
            raise ckpt.InvalidArgument("ckpt.dcp: a state dict key is a %s, not a str" % type(fqn).__name__)
        if isinstance(m, BytesStorageMetadata):
            entries[fqn] = {"bytes": {}}
        elif isinstance(m, TensorStorageMetadata):
            p = m.properties
            entries[fqn] = {"tensor": {
                "size": [int(x) for x in m.size],
                "dtype": _torch_name(_DTYPES, p.dtype, "the dtype"),
                "layout": _torch_name(_LAYOUTS, p.layout, "the layout"),
                "requires_grad": bool(p.requires_grad),
                "memory_format": _torch_name(_MEMORY_FORMATS, p.memory_format, "the memory format"),
                "pin_memory": bool(p.pin_memory),
                "chunks": [{"offsets": [int(x) for x in c.offsets], "sizes": [int(x) for x in c.sizes]}
                           for c in m.chunks]}}
        else:
            raise ckpt.InvalidArgument("ckpt.dcp: '%s' is described by a %s, not DCP's tensor or bytes metadata"
                                       % (fqn, type(m).__name__))
    doc = {"format": _FORMAT, "version": _VERSION, "state_dict_metadata": entries,
           "planner_data": _encode_value(getattr(md, "planner_data", None)),
           "storage_data": _encode_value(getattr(md, "storage_data", None))}
    sm = getattr(md, "storage_meta", None)
    if sm is not None:
        doc["storage_meta"] = {"checkpoint_id": None if sm.checkpoint_id is None else str(sm.checkpoint_id),
                               "save_id": sm.save_id, "load_id": sm.load_id,
                               "modules": [str(x) for x in getattr(sm, "modules", None) or []]}
    if getattr(md, "version", None) is not None:
        doc["version_of_torch_metadata"] = str(md.version)
    return json.dumps(doc, allow_nan=False, separators=(",", ":")).encode("utf-8")


def _decode_metadata(raw: bytes, where: str = "the checkpoint"):
    """This torch's Metadata from METADATA_FILE's bytes; ckpt.Corrupt naming `where` and
    the cause for anything else (bad UTF-8 or JSON, nesting, a wrong type or field)."""
    import json
    try:
        if len(raw) > _MAX_METADATA_BYTES:
            raise _Bad("it is %d bytes, more than %d" % (len(raw), _MAX_METADATA_BYTES))
        try:
            doc = json.loads(bytes(raw).decode("utf-8"))
        except UnicodeDecodeError as e:
            raise _Bad("it is not UTF-8 (%s)" % e) from None
        except RecursionError:
            raise _Bad("it is nested too deeply") from None
        except ValueError as e:
            raise _Bad("it is not JSON (%s)" % e) from None
        return _build_metadata(doc)
    except _Bad as e:
        raise ckpt.Corrupt("ckpt.dcp: %s has a malformed '%s': %s" % (where, METADATA_FILE, e)) from None
    except RecursionError:
        raise ckpt.Corrupt("ckpt.dcp: %s has a malformed '%s': it is nested too deeply"
                           % (where, METADATA_FILE)) from None


def _build_metadata(doc):
    if not isinstance(doc, dict) or doc.get("format") != _FORMAT:
        raise _Bad("it is not a %s document" % _FORMAT)
    if doc.get("version") != _VERSION:
        raise _Bad("its version is %s; this ckpt reads version %d" % (_short(doc.get("version")), _VERSION))
    sd_md = {}
    for fqn, entry in _field(doc, "state_dict_metadata", dict, "the document").items():
        what = "entry '%s'" % fqn
        if not isinstance(entry, dict) or len(entry) != 1 or next(iter(entry)) not in ("bytes", "tensor"):
            raise _Bad("%s is %s, not {\"bytes\": {}} or {\"tensor\": {...}}" % (what, _short(entry)))
        if "bytes" in entry:
            sd_md[fqn] = BytesStorageMetadata()
            continue
        t = _field(entry, "tensor", dict, what)
        size = _ints(_field(t, "size", list, what), what + " size")
        chunks = []
        for c in _field(t, "chunks", list, what):
            if not isinstance(c, dict):
                raise _Bad("%s has a chunk %s, not an object" % (what, _short(c)))
            offsets = _ints(_field(c, "offsets", list, what + " chunk"), what + " chunk offsets")
            sizes = _ints(_field(c, "sizes", list, what + " chunk"), what + " chunk sizes")
            if len(offsets) != len(size) or len(sizes) != len(size) or \
                    any(o + n > s for o, n, s in zip(offsets, sizes, size)):
                raise _Bad("%s has a chunk at %s of %s outside its size %s" % (what, offsets, sizes, size))
            chunks.append(ChunkStorageMetadata(offsets=torch.Size(offsets), sizes=torch.Size(sizes)))
        props = TensorProperties(dtype=_named(_DTYPES, _field(t, "dtype", str, what), "dtype"),
                                 layout=_named(_LAYOUTS, _field(t, "layout", str, what), "layout"),
                                 requires_grad=_field(t, "requires_grad", bool, what),
                                 memory_format=_named(_MEMORY_FORMATS, _field(t, "memory_format", str, what),
                                                      "memory format"),
                                 pin_memory=_field(t, "pin_memory", bool, what))
        sd_md[fqn] = TensorStorageMetadata(properties=props, size=torch.Size(size), chunks=chunks)
    kwargs = {"state_dict_metadata": sd_md, "planner_data": _decode_value(doc.get("planner_data")),
              "storage_data": _decode_value(doc.get("storage_data"))}
    names = {f.name for f in dataclasses.fields(Metadata)}
    sm = doc.get("storage_meta")
    if sm is not None and StorageMeta is not None and "storage_meta" in names:  # torch 1.13 has none: dropped
        if not isinstance(sm, dict):
            raise _Bad("storage_meta is %s, not an object" % _short(sm))
        strings = {}
        for k in ("checkpoint_id", "save_id", "load_id"):
            v = sm.get(k)
            if v is not None and not isinstance(v, str):
                raise _Bad("storage_meta '%s' is %s, not a string" % (k, _short(v)))
            strings[k] = v
        modules = sm.get("modules", [])
        if not isinstance(modules, list) or not all(isinstance(x, str) for x in modules):
            raise _Bad("storage_meta 'modules' is %s, not a list of strings" % _short(modules))
        if "modules" in {f.name for f in dataclasses.fields(StorageMeta)}:
            strings["modules"] = modules
        kwargs["storage_meta"] = StorageMeta(**strings)
    version = doc.get("version_of_torch_metadata")
    if version is not None and "version" in names:
        if not isinstance(version, str):
            raise _Bad("version_of_torch_metadata is %s, not a string" % _short(version))
        kwargs["version"] = version
    return Metadata(**kwargs)


# ---- Metadata pickled by an earlier ckpt.dcp: read by a small pickle machine -----------
#
# Not pickle.Unpickler: its REDUCE calls whatever is on the stack, BUILD sets attributes on
# whatever is on the stack, protocol 4 resolves dotted names and extension codes bypass
# find_class. This machine runs the opcodes of a data pickle itself: a global is only a
# marker from an exact (module, name) list, the only "calls" are the few constructions
# DCP's metadata needs (checked argument by argument), and the result is a tree of inert
# records rebuilt into Metadata through the same path as the JSON.

class _Global:
    __slots__ = ("kind",)

    def __init__(self, kind):
        self.kind = kind

    def __repr__(self):
        return "<allowed global %s>" % self.kind


class _Record:
    """An object of one of DCP's metadata classes, as pickled: its kind and its state."""
    __slots__ = ("kind", "state")

    def __init__(self, kind):
        self.kind, self.state = kind, None


class _Member:
    """A member of DCP's memory-format enum, by name."""
    __slots__ = ("name",)

    def __init__(self, name):
        self.name = name


_ENUM_MEMBERS = {0: "TORCH_CONTIGUOUS_FORMAT", 1: "TORCH_CHANNELS_LAST", 2: "TORCH_PRESERVE_FORMAT"}
_ENUM_FORMATS = {"TORCH_CONTIGUOUS_FORMAT": "contiguous_format", "TORCH_CHANNELS_LAST": "channels_last",
                 "TORCH_PRESERVE_FORMAT": "preserve_format"}
_MARK = object()


def _legacy_globals():
    """(module, name) -> _Global or a torch value; exact pairs only (no prefix, no dotted name)."""
    g = {("torch", "Size"): _Global("size"), ("torch.serialization", "_get_layout"): _Global("layout"),
         ("collections", "OrderedDict"): _Global("ordered_dict"), ("builtins", "getattr"): _Global("getattr"),
         ("copyreg", "_reconstructor"): _Global("reconstructor"), ("builtins", "object"): _Global("object")}
    for (module, name), v in list(g.items()):  # protocols 0-2 write Python 2's module names
        g[({"copyreg": "copy_reg", "builtins": "__builtin__"}.get(module, module), name)] = v
    for table in (_DTYPES, _MEMORY_FORMATS):
        for n, v in table.items():
            if not n.startswith("_"):
                g[("torch", n)] = v
    for module in ("torch.distributed._shard.checkpoint.metadata", "torch.distributed.checkpoint.metadata"):
        for kind in ("Metadata", "TensorStorageMetadata", "BytesStorageMetadata", "ChunkStorageMetadata",
                     "StorageMeta", "TensorProperties"):
            g[(module, kind)] = _Global(kind)
        g[(module, "_MEM_FORMAT_ENCODING")] = _Global("enum")
    g[("torch.distributed._shard.sharded_tensor.metadata", "TensorProperties")] = _Global("TensorProperties")
    g[("torch.distributed._shard.sharded_tensor.metadata", "MEM_FORMAT_ENCODING")] = _Global("enum")
    return g


_LEGACY_GLOBALS = _legacy_globals()
_RECORD_KINDS = {"Metadata", "TensorStorageMetadata", "BytesStorageMetadata", "ChunkStorageMetadata", "StorageMeta",
                 "TensorProperties"}


def _legacy_call(fn, args):
    """REDUCE: the constructions a DCP metadata pickle makes, nothing else."""
    kind = fn.kind if isinstance(fn, _Global) else None
    if not isinstance(args, tuple):
        raise _Bad("REDUCE with arguments %s" % _short(args))
    if kind == "size" and len(args) <= 1:
        values = args[0] if args else ()
        if isinstance(values, (tuple, list)) and all(type(x) is int for x in values):
            return torch.Size(values)
    elif kind == "layout" and len(args) == 1 and isinstance(args[0], str) and args[0].startswith("torch.") \
            and args[0][6:] in _LAYOUTS:
        return _LAYOUTS[args[0][6:]]
    elif kind == "enum" and len(args) == 1 and args[0] in _ENUM_MEMBERS and type(args[0]) is int:
        return _Member(_ENUM_MEMBERS[args[0]])
    elif kind == "getattr" and len(args) == 2 and isinstance(args[0], _Global) and args[0].kind == "enum" \
            and args[1] in _ENUM_FORMATS:
        return _Member(args[1])
    elif kind == "ordered_dict" and args == ():
        return {}
    elif kind == "reconstructor" and len(args) == 3 and isinstance(args[0], _Global) and \
            args[0].kind in _RECORD_KINDS and isinstance(args[1], _Global) and args[1].kind == "object" and \
            args[2] is None:
        return _Record(args[0].kind)
    raise _Bad("a call of %s with %s is not allowed" % (kind or _short(fn), _short(args)))


def _legacy_machine(raw: bytes):
    """The object a DCP metadata pickle describes, as records; _Bad for anything else."""
    import pickletools
    stack, marks, memo = [], [], {}

    def pop_mark():
        if not marks:
            raise _Bad("a MARK is missing")
        at = marks.pop()
        items = stack[at:]
        del stack[at:]
        return items

    def pop(n=1):
        if len(stack) < n:
            raise _Bad("the stack is empty")
        items = stack[len(stack) - n:]
        del stack[len(stack) - n:]
        return items

    def hashable(k):
        if isinstance(k, (str, int, float, bool, type(None), tuple, torch.Size)):
            try:
                hash(k)
                return k
            except TypeError:
                pass
        raise _Bad("a dict key %s" % _short(k))

    for op, arg, pos in pickletools.genops(raw):
        name = op.name
        if name in ("PROTO", "FRAME"):
            continue
        if name == "STOP":
            if len(stack) != 1 or marks:
                raise _Bad("it ends with %d values on the stack" % len(stack))
            return stack[0]
        if name in ("NONE", "NEWTRUE", "NEWFALSE", "INT", "BININT", "BININT1", "BININT2", "LONG", "LONG1", "LONG4",
                    "FLOAT", "BINFLOAT", "STRING", "BINSTRING", "SHORT_BINSTRING", "UNICODE", "BINUNICODE",
                    "SHORT_BINUNICODE", "BINUNICODE8", "BINBYTES", "SHORT_BINBYTES", "BINBYTES8", "BYTEARRAY8"):
            stack.append({"NONE": None, "NEWTRUE": True, "NEWFALSE": False}.get(name, arg) if arg is None else arg)
        elif name == "MARK":
            marks.append(len(stack))
        elif name == "EMPTY_DICT":
            stack.append({})
        elif name == "EMPTY_LIST":
            stack.append([])
        elif name == "EMPTY_TUPLE":
            stack.append(())
        elif name == "EMPTY_SET":
            stack.append(set())
        elif name in ("TUPLE1", "TUPLE2", "TUPLE3"):
            stack.append(tuple(pop(int(name[-1]))))
        elif name == "TUPLE":
            stack.append(tuple(pop_mark()))
        elif name == "LIST":
            stack.append(list(pop_mark()))
        elif name == "DICT":
            items = pop_mark()
            if len(items) % 2:
                raise _Bad("DICT at byte %d with an odd number of items" % pos)
            stack.append({hashable(items[i]): items[i + 1] for i in range(0, len(items), 2)})
        elif name == "FROZENSET":
            stack.append(frozenset(hashable(x) for x in pop_mark()))
        elif name in ("APPEND", "APPENDS"):
            items = pop() if name == "APPEND" else pop_mark()
            if not stack or type(stack[-1]) is not list:
                raise _Bad("%s at byte %d onto %s" % (name, pos, _short(stack[-1] if stack else None)))
            stack[-1].extend(items)
        elif name in ("SETITEM", "SETITEMS"):
            items = pop(2) if name == "SETITEM" else pop_mark()
            if not stack or type(stack[-1]) is not dict or len(items) % 2:
                raise _Bad("%s at byte %d onto %s" % (name, pos, _short(stack[-1] if stack else None)))
            for i in range(0, len(items), 2):
                stack[-1][hashable(items[i])] = items[i + 1]
        elif name == "ADDITEMS":
            items = pop_mark()
            if not stack or type(stack[-1]) is not set:
                raise _Bad("ADDITEMS at byte %d onto a non-set" % pos)
            stack[-1].update(hashable(x) for x in items)
        elif name in ("PUT", "BINPUT", "LONG_BINPUT", "MEMOIZE"):
            if not stack:
                raise _Bad("%s at byte %d with an empty stack" % (name, pos))
            memo[len(memo) if name == "MEMOIZE" else arg] = stack[-1]
        elif name in ("GET", "BINGET", "LONG_BINGET"):
            if arg not in memo:
                raise _Bad("%s at byte %d of an unset memo entry" % (name, pos))
            stack.append(memo[arg])
        elif name == "POP":
            pop()
        elif name == "POP_MARK":
            pop_mark()
        elif name == "DUP":
            stack.append(pop()[0])
            stack.append(stack[-1])
        elif name in ("GLOBAL", "STACK_GLOBAL"):
            if name == "GLOBAL":
                module, _, attr = arg.partition(" ")
            else:
                module, attr = pop(2)
            key = (module, attr)
            if not (isinstance(module, str) and isinstance(attr, str)) or key not in _LEGACY_GLOBALS:
                raise _Bad("it refers to %s.%s, which is not allowed" % (_short(module), _short(attr)))
            stack.append(_LEGACY_GLOBALS[key])
        elif name == "REDUCE":
            fn, args = pop(2)
            stack.append(_legacy_call(fn, args))
        elif name in ("NEWOBJ", "NEWOBJ_EX"):
            if name == "NEWOBJ":
                cls, args = pop(2)
                kwargs = {}
            else:
                cls, args, kwargs = pop(3)
            if not (isinstance(cls, _Global) and cls.kind in _RECORD_KINDS) or args != () or kwargs != {}:
                raise _Bad("%s of %s with %s is not allowed" % (name, _short(cls), _short(args)))
            stack.append(_Record(cls.kind))
        elif name == "BUILD":
            state, = pop()
            if not stack or not isinstance(stack[-1], _Record) or stack[-1].state is not None:
                raise _Bad("BUILD at byte %d of %s" % (pos, _short(stack[-1] if stack else None)))
            stack[-1].state = state
        else:  # INST, OBJ, EXT1/2/4, PERSID, BINPERSID, NEXT_BUFFER, READONLY_BUFFER, ...
            raise _Bad("opcode %s at byte %d is not allowed" % (name, pos))
    raise _Bad("it has no STOP")


def _record_fields(rec, kind):
    if not isinstance(rec, _Record) or rec.kind != kind:
        raise _Bad("it holds %s where a %s belongs" % (_short(rec), kind))
    state = rec.state if rec.state is not None else {}
    if kind == "TensorProperties" and isinstance(state, tuple) and len(state) == 5:
        state = dict(zip(("dtype", "layout", "requires_grad", "memory_format", "pin_memory"), state))
    if not isinstance(state, dict) or not all(isinstance(k, str) for k in state):
        raise _Bad("a %s with state %s" % (kind, _short(state)))
    return state


def _legacy_name(table, obj):
    if isinstance(obj, _Member):
        return _ENUM_FORMATS[obj.name]
    for n, v in table.items():
        if v is obj and not n.startswith("_"):
            return n
    raise _Bad("%s is not one of torch's" % _short(obj))


def _legacy_sizes(v):
    if not isinstance(v, (torch.Size, tuple, list)):
        raise _Bad("a size is %s" % _short(v))
    return list(v)


def _legacy_value(v, depth=1):
    try:
        return _encode_value(v, depth)
    except ckpt.InvalidArgument as e:
        raise _Bad(str(e)) from None


def _legacy_document(obj):
    """The records of a legacy pickle as the JSON document _build_metadata reads."""
    f = _record_fields(obj, "Metadata")
    sd = f.get("state_dict_metadata")
    if not isinstance(sd, dict):
        raise _Bad("its state_dict_metadata is %s" % _short(sd))
    entries = {}
    for fqn, m in sd.items():
        if isinstance(m, _Record) and m.kind == "BytesStorageMetadata":
            entries[fqn] = {"bytes": {}}
            continue
        t = _record_fields(m, "TensorStorageMetadata")
        p = _record_fields(t.get("properties"), "TensorProperties")
        chunks = t.get("chunks")
        if not isinstance(chunks, list):
            raise _Bad("'%s' has chunks %s" % (fqn, _short(chunks)))
        entries[fqn] = {"tensor": {
            "size": _legacy_sizes(t.get("size")), "dtype": _legacy_name(_DTYPES, p.get("dtype")),
            "layout": _legacy_name(_LAYOUTS, p.get("layout")), "requires_grad": p.get("requires_grad", False),
            "memory_format": _legacy_name(_MEMORY_FORMATS, p.get("memory_format", torch.contiguous_format)),
            "pin_memory": p.get("pin_memory", False),
            "chunks": [{"offsets": _legacy_sizes(c.get("offsets")), "sizes": _legacy_sizes(c.get("sizes"))}
                       for c in (_record_fields(x, "ChunkStorageMetadata") for x in chunks)]}}
    doc = {"format": _FORMAT, "version": _VERSION, "state_dict_metadata": entries,
           "planner_data": _legacy_value(f.get("planner_data")),
           "storage_data": _legacy_value(f.get("storage_data"))}
    if f.get("storage_meta") is not None:
        sm = _record_fields(f["storage_meta"], "StorageMeta")
        doc["storage_meta"] = {k: sm.get(k) for k in ("checkpoint_id", "save_id", "load_id")}
        doc["storage_meta"]["modules"] = sm.get("modules", [])
    if f.get("version") is not None:
        doc["version_of_torch_metadata"] = f["version"]
    return doc


def _load_legacy_metadata(raw: bytes, where: str = "the checkpoint"):
    """Metadata pickled by an earlier ckpt.dcp (LEGACY_METADATA_FILE), run by
    _legacy_machine (exact globals, no calls but DCP's constructions, no INST/OBJ,
    extension codes, persistent ids or buffers), then rebuilt as data by _build_metadata.
    ckpt.Corrupt naming `where` and the cause for anything else."""
    try:
        if len(raw) > _MAX_METADATA_BYTES:
            raise _Bad("it is %d bytes, more than %d" % (len(raw), _MAX_METADATA_BYTES))
        try:
            obj = _legacy_machine(bytes(raw))
        except (ValueError, TypeError, IndexError, EOFError) as e:  # pickletools on malformed bytes
            raise _Bad("it is not a pickle (%s)" % e) from None
        return _build_metadata(_legacy_document(obj))
    except _Bad as e:
        raise ckpt.Corrupt("ckpt.dcp: %s has a refused '%s': %s" % (where, LEGACY_METADATA_FILE, e)) from None
    except RecursionError:
        raise ckpt.Corrupt("ckpt.dcp: %s has a refused '%s': it is nested too deeply"
                           % (where, LEGACY_METADATA_FILE)) from None


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
        where = "checkpoint '%s' (generation %d)" % (c.name, c.generation)
        if METADATA_FILE in c.side_files:
            return _decode_metadata(c.side_file(METADATA_FILE), where)
        if LEGACY_METADATA_FILE in c.side_files:  # written by an earlier ckpt.dcp
            return _load_legacy_metadata(c.side_file(LEGACY_METADATA_FILE), where)
        raise ckpt.NotFound("%s was not saved by ckpt.dcp: it has no '%s'" % (where, METADATA_FILE))

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
