"""DeepSpeed with its weights from ckptd: inference (AutoTP) and ZeRO-3 / MiCS.

    import ckpt.deepspeed
    # inference: the model built on the meta device, deepspeed.init_inference (AutoTP for
    # world > 1), then every parameter filled with this rank's shard from ckptd
    engine = ckpt.deepspeed.init_inference("gpt-neo", dtype=torch.float16)

    # ZeRO-3 / MiCS: the model built under zero.Init / zero.MiCS_Init from the config alone,
    # then each parameter's ds_tensor filled with ckptd's partition for this rank
    model = ckpt.deepspeed.zero3_model("bloom", ds_config, mics=True)
    # or, for a model you built under zero.Init yourself:
    ckpt.deepspeed.fill_zero3(model, ckpt.connect().attach("bloom"))

No rank holds the full state dict: CPU tensors are views of the daemon's one shared copy,
and each rank copies only its shard (inference) or its flat partition (ZeRO-3) to its
device. docs/deepspeed.md says which DeepSpeed versions this knows and what was measured.

DeepSpeed's internals this relies on (the attributes ZeRO-3 puts on a parameter, AutoTP's
layers and slicing helpers) change between releases, so a version it was not checked
against is refused with ckpt.Unsupported naming it (KNOWN_VERSIONS).
"""
import contextlib
import re
import sys
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple, Union

import torch
from torch import nn

from .launcher import resolve_rank_world

# DeepSpeed releases (major.minor) whose ZeRO-3 parameter attributes and AutoTP layout
# ckpt.deepspeed mirrors and was checked against (docs/deepspeed.md).
KNOWN_VERSIONS = ("0.14",)

_NAMES_SHOWN = 8


def check_version(version: str) -> str:
    """`version` (a DeepSpeed version string, e.g. "0.14.5+eb07d41f9") if ckpt.deepspeed
    knows its release, else raises ckpt.Unsupported naming it and the known ones."""
    from . import Unsupported
    m = re.match(r"^\s*(\d+)\.(\d+)(?:\.|$|\+)", str(version))
    if not m or f"{m.group(1)}.{m.group(2)}" not in KNOWN_VERSIONS:
        known = ", ".join(f"{v}.x" for v in KNOWN_VERSIONS)
        raise Unsupported(f"DeepSpeed {version} is not a version ckpt.deepspeed knows (known: {known}): "
                          "its ZeRO-3 parameter attributes and AutoTP layout were checked only there")
    return str(version)


def _deepspeed():
    from . import Unsupported
    try:
        import deepspeed
    except ImportError as e:
        raise Unsupported("ckpt.deepspeed needs DeepSpeed (docs/deepspeed.md: tools/deepspeed-src/obtain.sh)") from e
    check_version(getattr(deepspeed, "__version__", "unknown"))
    return deepspeed


def _listing(kind: str, names: Sequence[str]) -> str:
    names = list(names)
    shown = ", ".join(names[:_NAMES_SHOWN])
    more = f" and {len(names) - _NAMES_SHOWN} more" if len(names) > _NAMES_SHOWN else ""
    return f"{len(names)} {kind}: {shown}{more}"


def _attach(checkpoint, client, socket):
    """(Checkpoint, attached here) for a name or a Checkpoint."""
    if isinstance(checkpoint, str):
        from . import connect
        return (client or connect(socket)).attach(checkpoint), True
    return checkpoint, False


def _groups(module: nn.Module) -> Dict[int, Tuple[nn.Parameter, List[str]]]:
    """Parameters by identity, with every name they are reachable under (tied ones share)."""
    groups: Dict[int, Tuple[nn.Parameter, List[str]]] = {}
    for mod_name, mod in module.named_modules(remove_duplicate=False):
        prefix = f"{mod_name}." if mod_name else ""
        for p_name, p in mod._parameters.items():
            if p is not None:
                groups.setdefault(id(p), (p, []))[1].append(prefix + p_name)
    return groups


def _all_parameters(module: nn.Module) -> List[Tuple[str, nn.Parameter]]:
    """(name, parameter) under every name, tied ones repeated (named_parameters'
    remove_duplicate is torch >= 2.0)."""
    out = []
    for mod_name, mod in module.named_modules(remove_duplicate=False):
        prefix = f"{mod_name}." if mod_name else ""
        out.extend((prefix + n, p) for n, p in mod._parameters.items() if p is not None)
    return out


def _ds_tensors(module: nn.Module) -> List[Tuple[str, nn.Module, str, torch.Tensor]]:
    """What a fill after AutoTP writes: (name, owner, attribute, tensor) for every parameter
    under every name, and the biases DeepSpeed's LinearLayer holds as plain tensors (AutoTP's
    fused-QKV path hands it a tensor, not a Parameter: neither parameter nor buffer)."""
    out = []
    try:
        from deepspeed.module_inject.layers import LinearLayer
    except ImportError:
        LinearLayer = ()
    for mod_name, mod in module.named_modules(remove_duplicate=False):
        prefix = f"{mod_name}." if mod_name else ""
        out.extend((prefix + n, mod, n, p) for n, p in mod._parameters.items() if p is not None)
        if LinearLayer and isinstance(mod, LinearLayer) and "bias" not in mod._parameters:
            bias = mod.__dict__.get("bias")
            if isinstance(bias, torch.Tensor):
                out.append((prefix + "bias", mod, "bias", bias))
    return out


def _persistent_buffers(module: nn.Module) -> Dict[str, torch.Tensor]:
    out = {}
    for mod_name, mod in module.named_modules(remove_duplicate=False):
        prefix = f"{mod_name}." if mod_name else ""
        for b_name, b in mod._buffers.items():
            if b is not None and b_name not in mod._non_persistent_buffers_set:
                out[prefix + b_name] = b
    return out


def _ignored(module) -> List["re.Pattern"]:
    patterns = [r"rotary_emb\.inv_freq$", r"\.attn\.bias$", r"\.attn\.masked_bias$", r"\.attention\.bias$",
                r"\.attention\.masked_bias$"]
    patterns += list(getattr(module, "_keys_to_ignore_on_load_unexpected", None) or ())
    return [re.compile(p) for p in patterns]


def _check_names(groups, buffers: Dict[str, torch.Tensor], names, label: str, ignore) -> Dict[int, str]:
    """{id(parameter): the checkpoint name that fills it}; raises ckpt.InvalidArgument naming
    the parameters the checkpoint lacks and the tensors nothing takes."""
    from . import InvalidArgument
    names = set(names)
    source: Dict[int, str] = {}
    missing: List[str] = []
    for key, (_, aliases) in groups.items():
        present = [n for n in aliases if n in names]
        if present:
            source[key] = present[0]
        else:
            missing.extend(aliases)
    used = {n for _, aliases in groups.values() for n in aliases} | set(buffers)
    unexpected = sorted(n for n in names - used if not any(p.search(n) for p in ignore))
    problems = []
    if missing:
        problems.append(_listing("parameters the checkpoint lacks", sorted(missing)))
    if unexpected:
        problems.append(_listing("checkpoint tensors no parameter or buffer takes", unexpected))
    if problems:
        raise InvalidArgument(f"{label}: " + "; ".join(problems))
    return source


# ---------------------------------------------------------------------------------------
# ZeRO-3 / MiCS


class ZeroFill(NamedTuple):
    """What fill_zero3 did: parameters filled (by checkpoint name), persistent buffers
    filled, the partition layout (partition rank, partitions) of this rank, bytes copied."""
    parameters: List[str]
    buffers: List[str]
    layout: Tuple[int, int]
    bytes: int


def _zero_layout(param, name: str) -> Tuple[int, int]:
    """(partition rank, partitions) DeepSpeed gave `param`: its ds_process_group (the whole
    world for zero.Init, the shard group for MiCS_Init)."""
    import torch.distributed as dist
    comm = getattr(param, "comm", None)  # MiCS: the parameter's shard group
    group = getattr(comm, "param_shard_group", None) if comm is not None else None
    if group is None:
        group = getattr(param, "ds_process_group", None)
    return dist.get_rank(group=group), dist.get_world_size(group=group)


def fill_zero3(module: nn.Module, checkpoint, *, rank: Optional[int] = None, world: Optional[int] = None,
               group_size: Optional[int] = None, strict: bool = True, label: Optional[str] = None) -> ZeroFill:
    """Fills every ZeRO-3 parameter of `module` (built under deepspeed.zero.Init or
    zero.MiCS_Init) with this rank's flat partition of the checkpoint tensor of its name:
    `param.ds_tensor` gets Checkpoint.partition(name, rank, world, group_size=...), on the
    ds_tensor's device and in its dtype. Persistent buffers the checkpoint holds are copied
    whole (ZeRO-3 does not partition buffers).

    rank / world: default from the launcher (ckpt.launcher_env()); group_size: MiCS's
    mics_shard_size (None: plain ZeRO-3, partitions over the whole world). They must
    describe the layout DeepSpeed built: a parameter partitioned over another number of
    ranks, or at another partition rank, raises ckpt.InvalidArgument naming the parameter,
    both layouts and the world size. Before any ds_tensor is written every name, size and
    layout is checked: a parameter the checkpoint lacks, a checkpoint tensor nothing takes
    (strict), a size that differs, or a parameter that is no ZeRO-3 parameter raises
    InvalidArgument naming it and the module is untouched. Hierarchical partitioning
    (zero_hpz_partition_size > 1) and parameters offloaded to NVMe raise ckpt.Unsupported."""
    from . import InvalidArgument, Unsupported, _partition_coords, ds_partition_size
    loaded = sys.modules.get("deepspeed")  # ZeRO-3 parameters exist only where DeepSpeed was imported
    if loaded is not None:
        check_version(getattr(loaded, "__version__", "unknown"))
    place = resolve_rank_world(rank, world)
    want_rank, want_parts = _partition_coords(place.rank, place.world, group_size)
    what = label or getattr(checkpoint, "name", "checkpoint")
    groups = _groups(module)
    buffers = _persistent_buffers(module)
    infos = {t: checkpoint.info(t) for t in checkpoint.keys()}
    ignore = _ignored(module) if strict else [re.compile(".*")]
    if strict:
        source = _check_names(groups, buffers, infos, what, ignore)
    else:
        source = {k: next(n for n in al if n in infos) for k, (_, al) in groups.items() if any(n in infos for n in al)}
    import torch.distributed as dist
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() != place.world:
        raise InvalidArgument(f"world size {place.world} does not match torch.distributed's "
                              f"{dist.get_world_size()}, over which DeepSpeed partitioned the model")
    plan: List[Tuple[nn.Parameter, str]] = []
    for key, (param, aliases) in groups.items():
        if key not in source:
            continue
        name = source[key]
        if not hasattr(param, "ds_tensor") or param.ds_tensor is None:
            raise InvalidArgument(f"{what}: parameter {aliases[0]} is not a ZeRO-3 parameter (build the model under "
                                  "deepspeed.zero.Init or zero.MiCS_Init)")
        if getattr(param, "ds_secondary_tensor", None) is not None:
            raise Unsupported(f"parameter {aliases[0]} has a secondary (hpZ) partition: "
                              "zero_hpz_partition_size > 1 is not supported")
        location = getattr(param.ds_tensor, "final_location", None)
        if location is not None and "nvme" in str(location).lower():
            raise Unsupported(f"parameter {aliases[0]} is offloaded to NVMe: not supported")
        part_rank, parts = _zero_layout(param, aliases[0])
        if (part_rank, parts) != (want_rank, want_parts):
            mics = f", MiCS shard group {group_size}" if group_size else ""
            raise InvalidArgument(
                f"{what}: rank {place.rank} of world {place.world}{mics} takes partition {want_rank} of "
                f"{want_parts}, but DeepSpeed partitioned parameter {aliases[0]} into {parts} partitions and "
                f"gave this rank partition {part_rank}: the world size does not match the partition layout")
        numel = 1
        for d in infos[name]["shape"]:
            numel *= int(d)
        if numel != param.ds_numel:
            raise InvalidArgument(f"{what}: tensor {name} has {numel} elements (shape {list(infos[name]['shape'])}), "
                                  f"parameter {aliases[0]} {param.ds_numel} (shape {list(param.ds_shape)})")
        if param.ds_tensor.numel() != ds_partition_size(numel, parts):
            raise InvalidArgument(f"{what}: parameter {aliases[0]}'s partition holds {param.ds_tensor.numel()} "
                                  f"elements, ckptd's {ds_partition_size(numel, parts)} for {parts} partitions")
        plan.append((param, name))
    for b_name, b in buffers.items():
        if b_name in infos and tuple(int(d) for d in infos[b_name]["shape"]) != tuple(b.shape):
            raise InvalidArgument(f"{what}: buffer {b_name} has shape {tuple(b.shape)}, the checkpoint "
                                  f"{list(infos[b_name]['shape'])}")
    copied = 0
    filled: List[str] = []
    with torch.no_grad():
        # One partition (world 1, or MiCS groups of 1) is the whole tensor: on a CUDA device
        # the copy engine moves them all in one call, per (device, dtype).
        whole: Dict[Tuple[torch.device, torch.dtype], List[str]] = {}
        if want_parts == 1:
            for param, name in plan:
                if param.ds_tensor.device.type == "cuda":
                    whole.setdefault((param.ds_tensor.device, param.ds_tensor.dtype), []).append(name)
        fetched: Dict[str, torch.Tensor] = {}
        for (device, dtype), names in whole.items():
            fetched.update(checkpoint.state_dict(0, 1, None, names=names, device=device, dtype=dtype))
        for param, name in plan:
            dst = param.ds_tensor.data
            if dst.device.type == "cpu":
                # Straight from the shared memory into the ds_tensor (converted as it is
                # copied): no partition-sized copy of its own per parameter.
                per = dst.numel()
                start = per * want_rank
                valid = max(0, min(per, param.ds_numel - start))
                flat = dst.view(-1)
                if valid:
                    flat[:valid].copy_(checkpoint.tensor(name).reshape(-1)[start:start + valid])
                flat[valid:].zero_()  # the padding, zero as Checkpoint.partition gives it
                copied += per * dst.element_size()
                filled.append(name)
                continue
            part = fetched.pop(name, None)
            if part is None or part.dtype != dst.dtype or part.device != dst.device:
                part = checkpoint.partition(name, place.rank, place.world, group_size=group_size,
                                            device=dst.device, dtype=dst.dtype)
            dst.copy_(part.reshape(dst.shape))
            copied += part.numel() * part.element_size()
            filled.append(name)
            del part
        del fetched
        done_buffers = []
        for b_name, b in buffers.items():
            if b_name in infos:
                b.copy_(checkpoint.tensor(b_name))
                done_buffers.append(b_name)
    return ZeroFill(filled, done_buffers, (want_rank, want_parts), copied)


def _mics_shard_size(ds_config) -> Optional[int]:
    if isinstance(ds_config, dict):
        size = ds_config.get("zero_optimization", {}).get("mics_shard_size")
        return int(size) if size is not None and int(size) > 0 else None
    return None


@contextlib.contextmanager
def zero3_init(ds_config, *, mics: bool = False, **init_kwargs):
    """deepspeed.zero.Init(config_dict_or_path=ds_config, **init_kwargs) (zero.MiCS_Init
    with mics=True), for a model that fill_zero3 fills next: every parameter is
    overwritten, so two things DeepSpeed does while the model is built are left out.
    DeepSpeed builds each module's parameters whole, converts them to the Init's dtype
    (writing them) and broadcasts them from rank 0 (writing them on every other rank),
    then keeps this rank's partition: each rank holds every module's parameters whole in
    turn (bloom-7b1's 250880 x 4096 embedding: 2 GB a rank, all ranks at once), and the
    broadcast of the whole model costs its time. Inside this context torch's default dtype
    is the Init's (DeepSpeed's tensor constructors then convert nothing) and Init's
    broadcast of a new parameter is skipped: a module's full tensors are allocated but
    never written (no memory is charged for pages never touched), and only this rank's
    partition is. Yields the Init. Partitions hold garbage until fill_zero3 fills them."""
    ds = _deepspeed()
    from deepspeed.runtime.zero import partition_parameters as pp
    init = (ds.zero.MiCS_Init if mics else ds.zero.Init)(config_dict_or_path=ds_config, **init_kwargs)
    real_init_param = pp.Init._zero_init_param

    def partition_only(self, param):  # Init._zero_init_param without its broadcast
        self._convert_to_deepspeed_param(param)
        param.partition()

    old_dtype = torch.get_default_dtype()
    pp.Init._zero_init_param = partition_only
    try:
        torch.set_default_dtype(init.dtype)  # half, bfloat16 or float (Init asserts it)
        with init:
            yield init
    finally:
        torch.set_default_dtype(old_dtype)
        pp.Init._zero_init_param = real_init_param


@contextlib.contextmanager
def gathers_waited():
    """Inside, DeepSpeed's coalesced ZeRO-3 gather (Init._allgather_params_coalesced: what
    GatheredParameters of several parameters runs, as transformers' from_pretrained under
    zero.Init does module by module) waits for every all-gather it launched. DeepSpeed 0.14.5
    waits for the last one only, which is enough on NCCL (one stream), not on gloo: there
    each launched collective runs on a thread of its own and the CPU accelerator's
    synchronize does nothing, so GatheredParameters' body can run while the earlier
    parameters are still being gathered into, and what rank 0 loads there is partly
    overwritten (docs/deepspeed.md; deepspeedai/DeepSpeed PR #8539 waits for all of them).
    ckpt.deepspeed's own fill gathers nothing; this is for DeepSpeed's gather on CPU ranks."""
    _deepspeed()
    from deepspeed.runtime.zero import partition_parameters as pp
    comm = pp.dist
    real_coalesced = pp.Init._allgather_params_coalesced
    names = ("all_gather_into_tensor", "all_gather")

    def waited(self, *args, **kwargs):
        handles = []
        real = {n: getattr(comm, n) for n in names}

        def keeping(fn):
            def call(*a, **k):
                handle = fn(*a, **k)
                if handle is not None and k.get("async_op", False):
                    handles.append(handle)
                return handle
            return call

        for n in names:
            setattr(comm, n, keeping(real[n]))
        try:
            out = real_coalesced(self, *args, **kwargs)
        finally:
            for n in names:
                setattr(comm, n, real[n])
        for handle in handles:
            handle.wait()
        return out

    pp.Init._allgather_params_coalesced = waited
    try:
        yield
    finally:
        pp.Init._allgather_params_coalesced = real_coalesced


def zero3_model(checkpoint, ds_config, *, mics: bool = False, config=None, model_class=None,
                rank: Optional[int] = None, world: Optional[int] = None, client=None, socket: Optional[str] = None,
                **init_kwargs) -> nn.Module:
    """The transformers model of `checkpoint` (a name or a Checkpoint) built under
    zero3_init(ds_config, mics=mics) (zero.Init / zero.MiCS_Init without the whole-parameter
    writes a fill makes needless) from its config alone (weight initialisation skipped),
    then filled by fill_zero3 (group_size: ds_config's zero_optimization.mics_shard_size
    with mics=True). What `with MiCS_Init(...): from_pretrained(...)` gives, without the
    state dict on every rank. The model is returned for deepspeed.initialize;
    model.ckpt_fill is fill_zero3's report."""
    from . import InvalidArgument
    from . import transformers as ckt
    _deepspeed()
    tf = ckt._transformers()
    ck, attached = _attach(checkpoint, client, socket)
    cfg = ckt.model_config(ck, config)
    cls = ckt._model_class(tf, cfg, model_class)
    group_size = _mics_shard_size(ds_config) if mics else None
    if mics and group_size is None:
        raise InvalidArgument("mics=True needs zero_optimization.mics_shard_size in ds_config (a dict)")
    build = getattr(cls, "_from_config", None) or cls
    with zero3_init(ds_config, mics=mics, **init_kwargs) as init, ckt._no_init_weights(tf), _no_hf_zero3(tf):
        model = None
        if build is not cls:  # transformers sets the default dtype from the config: the Init's instead
            for key in ("dtype", "torch_dtype"):  # transformers 5 / 4 spelling
                try:
                    model = build(cfg, **{key: init.dtype})
                    break
                except TypeError:
                    continue
        if model is None:
            model = build(cfg)
        ckt._tie(model)  # tied names one (ZeRO-3) parameter, as from_pretrained leaves them
    report = fill_zero3(model, ck, rank=rank, world=world, group_size=group_size)
    model.ckpt_fill = report
    if attached:
        del ck
    return model


@contextlib.contextmanager
def _no_hf_zero3(tf):
    """transformers' _from_config opens a zero.Init of its own when it sees an
    HfDeepSpeedConfig; the caller's Init is already open, so that one is skipped."""
    try:
        import transformers.modeling_utils as mu
    except ImportError:
        yield
        return
    old = getattr(mu, "is_deepspeed_zero3_enabled", None)
    if old is None:
        yield
        return
    mu.is_deepspeed_zero3_enabled = lambda: False
    try:
        yield
    finally:
        mu.is_deepspeed_zero3_enabled = old


# ---------------------------------------------------------------------------------------
# Inference: AutoTP


class Piece(NamedTuple):
    """Where a DeepSpeed parameter's bytes come from: checkpoint tensor `source`, whole
    (dim None), a run [start, start + length) of dim `dim`, or the rows `rows` of dim 0."""
    source: str
    dim: Optional[int] = None
    start: int = 0
    length: int = 0
    rows: Optional[torch.Tensor] = None


def _ds_leaf_name(path: str, block_path: str) -> str:
    """The name AutoTP's _replace_module hands _replace for the module at `path` inside the
    injection block at `block_path`: its parent's attribute name '.' its own ('' for a
    direct child of the block), as deepspeed.module_inject.auto_tp builds it."""
    rel = path[len(block_path) + 1:] if block_path else path
    parts = rel.split(".")
    return (parts[-2] if len(parts) > 1 else "") + "." + parts[-1]


def autotp_layout(module: nn.Module, sources: Dict[str, str], shapes: Dict[str, Sequence[int]], rank: int,
                  world: int, block_classes: Sequence[type]) -> Dict[str, Piece]:
    """{parameter name: Piece} of this rank for `module` after deepspeed.init_inference's
    AutoTP (world > 1): LinearAllreduce and LmHeadLinearAllreduce weights cut along dim 1,
    LinearLayer weights and biases along dim 0 (fused QKV by DeepSpeed's own
    prepare_tp_fused_qkvw, run on row indices), embeddings inside a block along dim 1, all
    with DeepSpeed's own get_shard_size_list; everything else whole. `sources`: parameter
    name -> checkpoint name; `shapes`: checkpoint name -> shape. AutoTP branches this does
    not mirror (Conv1D layers, chunked MLPs, Yuan) raise ckpt.Unsupported naming the module."""
    from . import Unsupported
    from deepspeed.module_inject import layers as ds_layers
    from deepspeed.module_inject.fusedqkv_utils import prepare_tp_fused_qkvw, require_tp_fused_qkvw
    from deepspeed.module_inject.tp_shard import get_shard_size_list
    blocks = {path: m for path, m in module.named_modules() if isinstance(m, tuple(block_classes))}
    out: Dict[str, Piece] = {}

    def block_of(path):
        best = ""
        for b in blocks:
            if path.startswith(b + ".") and len(b) > len(best):
                best = b
        return best

    def run(src, dim, name):
        sizes = get_shard_size_list(int(shapes[src][dim]), world, name)
        return Piece(src, dim, sum(sizes[:rank]), sizes[rank])

    for path, mod in module.named_modules():
        prefix = f"{path}." if path else ""
        own = {n: p for n, p in mod._parameters.items() if p is not None}
        if isinstance(mod, ds_layers.LinearLayer) and isinstance(mod.__dict__.get("bias"), torch.Tensor):
            own["bias"] = mod.__dict__["bias"]  # a plain tensor (AutoTP's fused-QKV bias)
        if not own:
            continue
        block = block_of(path)
        block_mod = blocks.get(block)
        if isinstance(mod, (ds_layers.LmHeadLinearAllreduce, ds_layers.LinearAllreduce)):
            name = path.split(".")[-1] if isinstance(mod, ds_layers.LmHeadLinearAllreduce) else _ds_leaf_name(path, block)
            w = prefix + "weight"
            out[w] = run(sources[w], 1, name)
            if "bias" in own:  # added after the all-reduce: whole on every rank
                out[prefix + "bias"] = Piece(sources[prefix + "bias"])
        elif isinstance(mod, ds_layers.LinearLayer):
            name = _ds_leaf_name(path, block)
            text = str(block_mod) if block_mod is not None else ""
            if "gate_up_proj" in name or ("dense_h_to_4h" in name and "GLM" in text) or "Yuan" in text:
                raise Unsupported(f"AutoTP's chunked-MLP / Yuan layout of {path} is not mirrored by ckpt.deepspeed")
            for attr in ("weight", "bias"):
                if attr not in own:
                    continue
                src = sources[prefix + attr]
                if require_tp_fused_qkvw(name, world):
                    rows_n = int(shapes[src][0])
                    index = torch.arange(rows_n, dtype=torch.int64)
                    if attr == "weight":
                        index = index.unsqueeze(1).expand(rows_n, int(shapes[src][1]))
                    picked = prepare_tp_fused_qkvw(block_mod, index, world, rank)
                    rows = picked[:, 0].contiguous() if picked.dim() == 2 else picked.contiguous()
                    out[prefix + attr] = Piece(src, rows=rows)
                else:
                    out[prefix + attr] = run(src, 0, name)
        elif isinstance(mod, nn.Embedding) and block_mod is not None and world > 1:
            out[prefix + "weight"] = run(sources[prefix + "weight"], 1, _ds_leaf_name(path, block))
        else:
            if block_mod is not None and world > 1 and type(mod).__name__ == "Conv1D":
                raise Unsupported(f"AutoTP's Conv1D layout of {path} is not mirrored by ckpt.deepspeed")
            for attr in own:
                out[prefix + attr] = Piece(sources[prefix + attr])
    return out


def _retie(module: nn.Module, groups) -> None:
    """Names that shared one Parameter before DeepSpeed (tied weights) share one again:
    DeepSpeed's to_empty gives each owner a new tensor."""
    owners = {}
    for mod_name, mod in module.named_modules(remove_duplicate=False):
        prefix = f"{mod_name}." if mod_name else ""
        for p_name in mod._parameters:
            owners[prefix + p_name] = (mod, p_name)
    for _, aliases in groups.values():
        if len(aliases) > 1 and all(a in owners for a in aliases):
            first = owners[aliases[0]]
            keep = first[0]._parameters[first[1]]
            for a in aliases[1:]:
                mod, attr = owners[a]
                mod._parameters[attr] = keep


def _piece_tensor(checkpoint, piece: Piece, device, dtype) -> torch.Tensor:
    view = checkpoint.tensor(piece.source)  # zero-copy view of the shared memory
    if piece.rows is not None:
        part = view.index_select(0, piece.rows)
    elif piece.dim is not None:
        part = view.narrow(piece.dim, piece.start, piece.length)
    else:
        part = view
    # On the CPU a copy (copy=True), so that parameters own their memory, as fill_module's.
    return part.to(device=device, dtype=dtype if part.is_floating_point() and dtype is not None else part.dtype,
                   copy=torch.device(device).type == "cpu")


def init_inference(checkpoint, *, dtype: Union[None, str, torch.dtype] = None, config=None, model_class=None,
                   rank: Optional[int] = None, world: Optional[int] = None, client=None,
                   socket: Optional[str] = None, strict: bool = True, **init_inference_kwargs):
    """deepspeed.init_inference over the transformers model of `checkpoint` (a name or a
    Checkpoint), its weights from ckptd: the model is built with its parameters on the
    meta device (buffers real, ckpt.transformers.build_model), handed to
    deepspeed.init_inference(model, tensor_parallel={"tp_size": world}, dtype=dtype,
    replace_with_kernel_inject=False, **init_inference_kwargs) (AutoTP cuts the meta model
    for world > 1 and leaves uninitialised tensors of this rank's shapes), and every
    parameter is then filled with this rank's part as AutoTP lays it out (autotp_layout),
    copied from the shared memory straight to the device (world 1: the whole checkpoint in
    one CUDA copy-engine call). Buffers the model computed are put back (DeepSpeed's
    to_empty drops them). Returns DeepSpeed's InferenceEngine; engine.ckpt_layout is the
    {parameter: Piece} used.

    Names are checked before DeepSpeed runs: a parameter the checkpoint lacks, or (strict)
    a checkpoint tensor no parameter or buffer takes, raises ckpt.InvalidArgument naming
    it. A shard whose shape differs from DeepSpeed's parameter raises InvalidArgument
    naming the parameter and both shapes."""
    from . import as_dtype
    from . import transformers as ckt
    ds = _deepspeed()
    dtype = as_dtype(dtype)
    place = resolve_rank_world(rank, world)
    ck, attached = _attach(checkpoint, client, socket)
    what = getattr(ck, "name", "checkpoint")
    cfg = ckt.model_config(ck, config)
    model = ckt.build_model(cfg, model_class=model_class, dtype=dtype)
    infos = {t: ck.info(t) for t in ck.keys()}
    groups = _groups(model)
    buffers = _persistent_buffers(model)
    ignore = _ignored(model) if strict else [re.compile(".*")]
    source_of = _check_names(groups, buffers, infos, what, ignore)
    sources = {n: source_of[k] for k, (_, aliases) in groups.items() for n in aliases}
    shapes = {n: [int(d) for d in infos[n]["shape"]] for n in infos}
    saved = {n: b for n, b in model.named_buffers()}  # real: the model's own __init__ computed them
    from deepspeed.module_inject.auto_tp import AutoTP
    block_classes = [c for c, _ in AutoTP.tp_parser(model)] if place.world > 1 else []
    kwargs = dict(init_inference_kwargs)
    kwargs.setdefault("replace_with_kernel_inject", False)
    if dtype is not None:
        kwargs.setdefault("dtype", dtype)
    kwargs.setdefault("tensor_parallel", {"tp_size": place.world})
    engine = ds.init_inference(model, **kwargs)
    engine.ckpt_layout = _fill_after_autotp(engine.module, ck, sources, shapes, infos, set(buffers), saved, place,
                                            block_classes, dtype, groups, what)
    if attached:
        del ck
    return engine


def fill_autotp(module: nn.Module, checkpoint, *, rank: Optional[int] = None, world: Optional[int] = None,
                block_classes: Sequence[type] = (), dtype: Union[None, str, torch.dtype] = None,
                buffers: Optional[Dict[str, torch.Tensor]] = None, tied: Optional[Dict[str, str]] = None,
                strict: bool = True) -> Dict[str, Piece]:
    """Fills `module` after deepspeed.init_inference (AutoTP with tensor_parallel tp_size
    = world, the model built on the meta device) with this rank's parts of `checkpoint`, as
    init_inference does for a transformers model; for your own model classes.
    block_classes: the injection policy's layer classes (the keys of init_inference's
    injection_policy, or AutoTP.tp_parser's); buffers: {name: tensor} to put back (what the
    model computed before DeepSpeed's to_empty); tied: {parameter name: checkpoint name}
    for parameters stored under another name (a tied lm_head.weight). Returns the layout.
    Raises ckpt.InvalidArgument naming a parameter no checkpoint tensor fills, (strict) a
    tensor nothing takes, or a shard whose shape is not DeepSpeed's."""
    from . import InvalidArgument, as_dtype
    _deepspeed()
    dtype = as_dtype(dtype)
    place = resolve_rank_world(rank, world)
    what = getattr(checkpoint, "name", "checkpoint")
    infos = {t: checkpoint.info(t) for t in checkpoint.keys()}
    tied = dict(tied or {})
    names = [n for n, *_ in _ds_tensors(module)]
    sources = {n: (n if n in infos else tied.get(n)) for n in names}
    missing = sorted(n for n, src in sources.items() if src not in infos)
    persistent = set(_persistent_buffers(module))
    unexpected = sorted(set(infos) - set(sources.values()) - persistent) if strict else []
    problems = []
    if missing:
        problems.append(_listing("parameters the checkpoint lacks", missing))
    if unexpected:
        problems.append(_listing("checkpoint tensors no parameter or buffer takes", unexpected))
    if problems:
        raise InvalidArgument(f"{what}: " + "; ".join(problems))
    shapes = {n: [int(d) for d in infos[n]["shape"]] for n in infos}
    return _fill_after_autotp(module, checkpoint, sources, shapes, infos, persistent, dict(buffers or {}), place,
                              list(block_classes), dtype, {}, what)


def _fill_after_autotp(module, ck, sources, shapes, infos, persistent, saved, place, block_classes, dtype, groups,
                       what) -> Dict[str, Piece]:
    """init_inference's and fill_autotp's fill of DeepSpeed's model (see init_inference)."""
    from . import InvalidArgument
    group = _tp_group(module)
    if group is not None:
        import torch.distributed as dist
        cut_for = dist.get_world_size(group=group)
        if cut_for != place.world:
            raise InvalidArgument(f"{what}: world size {place.world} does not match the {cut_for} ranks AutoTP cut "
                                  "the model for (tensor_parallel tp_size)")
    device = next((p.device for p in module.parameters()), torch.device("cpu"))
    # AutoTP keeps every parameter's name (a tied lm_head becomes a Parameter of its own,
    # still named lm_head.weight, cut from the embedding it was tied to).
    targets = {n: (owner, attr, t) for n, owner, attr, t in _ds_tensors(module)}
    new = sorted(n for n in targets if n not in sources)
    if new:
        raise InvalidArgument(f"{what}: " + _listing("parameters of DeepSpeed's model no checkpoint tensor fills", new))
    layout = autotp_layout(module, sources, shapes, place.rank, place.world, block_classes) if place.world > 1 \
        else {n: Piece(sources[n]) for n in targets}
    params = {n: t for n, (_, _, t) in targets.items()}
    unplaced = sorted(set(params) - set(layout))
    if unplaced:  # a tensor of DeepSpeed's model that the layout does not place would keep garbage
        raise InvalidArgument(f"{what}: " + _listing("tensors of DeepSpeed's model the AutoTP layout does not place",
                                                     unplaced))
    for n, piece in layout.items():
        want = tuple(params[n].shape)
        got = tuple(piece.rows.shape[:1]) + tuple(shapes[piece.source][1:]) if piece.rows is not None else \
            tuple(shapes[piece.source][:piece.dim]) + (piece.length,) + tuple(shapes[piece.source][piece.dim + 1:]) \
            if piece.dim is not None else tuple(shapes[piece.source])
        if got != want:
            raise InvalidArgument(f"{what}: DeepSpeed's parameter {n} has shape {want}, ckptd's part of "
                                  f"{piece.source} {got}")
    whole = sorted({p.source for p in layout.values() if p.dim is None and p.rows is None})
    with torch.no_grad():
        fetched = ck.state_dict(0, 1, None, names=whole, device=device, dtype=dtype) if device.type == "cuda" and whole else {}
        done = {}
        for n, piece in layout.items():
            p = params[n]
            if id(p) in done:
                continue
            t = fetched.get(piece.source) if piece.dim is None and piece.rows is None else None
            if t is None:
                t = _piece_tensor(ck, piece, device, dtype)
            elif dtype is None and t.dtype != p.dtype:
                t = t.to(p.dtype)
            t = t.to(p.dtype) if t.is_floating_point() and t.dtype != p.dtype else t
            if isinstance(p, nn.Parameter):
                p.data = t
            else:  # a plain tensor attribute: replaced
                owner, attr, _ = targets[n]
                owner.__dict__[attr] = t
            done[id(p)] = n
        del fetched
        for n, b in module.named_buffers():
            if n in infos and n in persistent:
                b.copy_(ck.tensor(n))
            elif n in saved:
                b.copy_(saved[n])
        if place.world == 1:
            _retie(module, groups)
    return layout


def _tp_group(module: nn.Module):
    """The tensor-parallel group AutoTP's all-reduce layers of `module` use, else None."""
    return next((m.mp_group for m in module.modules() if getattr(m, "mp_group", None) is not None), None)
