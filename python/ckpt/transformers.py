"""A Hugging Face transformers model in one call, filled from ckptd.

    import ckpt.transformers
    model = ckpt.transformers.load_model("llama")          # rank/world/device from torchrun
    logits = model(input_ids).logits

load_model builds the model class from the config.json ckptd keeps with the checkpoint
(Checkpoint.config; or config=) on the meta device, fills it with this rank's shards
(ckpt.fill_module: the CUDA copy engine for a CUDA device, torch on the CPU), ties its
weights and checks the keys strictly. With world > 1 and the "hf" convention it is
transformers' own tensor-parallel model: transformers' TP plan is applied to the meta model
as from_pretrained(tp_plan="auto") applies it (forward hooks doing the collectives over a
device mesh of the default process group), and each rank's parameters are the local shards
transformers itself would hold.

transformers is an optional dependency: it is imported by load_model, never by `import ckpt`.
"""
import contextlib
import inspect
import os
import threading
import time
import warnings
from typing import Any, Dict, Optional, Union

import torch
from torch import nn

from . import Checkpoint, InvalidArgument, Unsupported
from .launcher import Launch, resolve_rank_world
from . import plans as _plans
from .meta import parameters_on_meta
from .modules import _fill, _walk

__all__ = ["load_model", "build_model", "model_config", "wait_detached"]

# Checkpoint names transformers itself never loads into a model (recomputed buffers, old
# causal-mask buffers); the model class adds its own _keys_to_ignore_on_load_unexpected.
_ALWAYS_IGNORED = (r"(^|\.)rotary_emb\.inv_freq$", r"(^|\.)position_ids$")

# torch's intra-op threads while load_model builds the model beside a CUDA copy; None leaves
# torch's setting alone. The copy engine's 16 staging threads keep the cores and the memory
# bus busy meanwhile, and buffers a model computes on the CPU in its __init__ then run
# several times slower than alone with torch's 16 OpenMP threads. GPT-Neo 2.7B with its
# masks computed on the CPU (_DEVICE_MASKS = False): 0.42 s with 1 or 16 threads, 0.27 s
# with 2, 0.26 s with 4; with the masks on the GPU (the default) 0.25 s with 1 or 16
# (docs/benchmarks.md, "load_model"): 1 is the setting measured with the default.
_BUILD_THREADS: Optional[int] = 1

# Whether load_model, for a CUDA device, has the model's __init__ make its boolean tensors
# (causal masks) on that device (build_model's masks_device) instead of computing them on
# the CPU beside the copy and moving them: GPT-Neo 2.7B's 48 torch.tril, 32 torch.ones and
# 16 bitwise_xor of 2048 x 2048 took 0.36 s of the main thread beside the copy, the build
# 0.07 s with them on the GPU (docs/benchmarks.md, "load_model"). Every buffer still
# equals a CPU build's (see _BoolTensorsOn).
_DEVICE_MASKS: bool = True


def _transformers():
    try:
        import transformers
    except ImportError as e:
        raise Unsupported("ckpt.transformers needs the transformers package (pip install transformers); "
                          "ckpt.fill_module fills any torch.nn.Module without it") from e
    return transformers


class _NoTpMachinery(Exception):
    """The installed transformers has no tensor-parallel entry point ckpt knows."""


def model_config(checkpoint=None, config: Union[None, dict, str, os.PathLike, Any] = None):
    """The transformers config for a checkpoint: `config` when given (a PretrainedConfig,
    or what ckpt.plans.config_dict reads: a dict as in config.json, the path of a
    config.json or of a model folder, JSON text), else the
    config.json ckptd stored with the checkpoint (Checkpoint.config). Raises
    InvalidArgument when there is neither, or for an unknown model_type (naming it and the
    installed transformers version)."""
    tf = _transformers()
    base = getattr(tf, "PreTrainedConfig", None) or tf.PretrainedConfig
    if isinstance(config, base):
        return config
    from .plans import config_dict
    config = config_dict(config)  # a path, JSON text or a dict, as everywhere in ckpt
    if config is None and checkpoint is not None:
        config = getattr(checkpoint, "config", None)
    if config is None:
        what = f"checkpoint '{checkpoint.name}'" if checkpoint is not None else "load_model"
        raise InvalidArgument(f"{what} has no config.json (ckptd keeps it when it loads a model folder); "
                              "pass config= (a dict, a config.json path or a PretrainedConfig)")
    if not isinstance(config, dict):
        raise InvalidArgument(f"config must be a dict, a path or a PretrainedConfig, not {type(config).__name__}")
    model_type = config.get("model_type")
    if not model_type:
        raise InvalidArgument("the model config has no model_type")
    if not isinstance(model_type, str):
        raise InvalidArgument(f"the model config's model_type is a {type(model_type).__name__}, not a string")
    mapping = getattr(tf, "CONFIG_MAPPING", None)
    if mapping is None:
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING as mapping
    if model_type not in mapping:
        raise Unsupported(f"model_type '{model_type}' is not known to transformers {tf.__version__}")
    return mapping[model_type].from_dict(_special_floats(dict(config)))


_SPECIAL_FLOATS = {"Infinity": float("inf"), "-Infinity": float("-inf"), "NaN": float("nan")}


def _special_floats(value):
    """`value` with transformers' config.json spelling of non-finite floats ({"__float__":
    "Infinity"}, as save_pretrained writes falcon_h1's time_step_limit) back to floats, as
    transformers' own config file reader does; from_dict takes the floats."""
    if isinstance(value, dict):
        if len(value) == 1 and value.get("__float__") in _SPECIAL_FLOATS:
            return _SPECIAL_FLOATS[value["__float__"]]
        return {k: _special_floats(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_special_floats(v) for v in value]
    return value


_CLASSES: Dict[Any, type] = {}  # (transformers module, names, config class, named) -> model class


def _model_class(tf, config, model_class):
    """model_class, else the first of config.architectures this transformers has, else the
    causal-LM class of the config's type; resolved once per (transformers, names, config class)."""
    if model_class is not None and not isinstance(model_class, str):
        return model_class
    names = [model_class] if isinstance(model_class, str) else list(getattr(config, "architectures", None) or [])
    key = (tf, tuple(names), type(config), isinstance(model_class, str))
    cls = _CLASSES.get(key)
    if cls is None:
        cls = _CLASSES[key] = _resolve_model_class(tf, config, model_class, names)
    return cls


def _resolve_model_class(tf, config, model_class, names):
    for name in names:
        cls = getattr(tf, name, None)
        if cls is not None:
            return cls
    if isinstance(model_class, str):
        raise InvalidArgument(f"transformers {tf.__version__} has no model class '{model_class}'")
    mapping = getattr(tf, "MODEL_FOR_CAUSAL_LM_MAPPING", None)
    if mapping is None:
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING as mapping
    try:
        return mapping[type(config)]
    except KeyError:
        raise Unsupported(f"no causal-LM class for {type(config).__name__} in transformers {tf.__version__} "
                          f"(architectures {names}); pass model_class=") from None


@contextlib.contextmanager
def _no_init_weights(tf):
    """transformers' own switch that skips weight initialisation, where it has one."""
    for where in ("transformers.initialization", "transformers.modeling_utils"):
        try:
            module = __import__(where, fromlist=["no_init_weights"])
        except ImportError:
            continue
        ctx = getattr(module, "no_init_weights", None)
        if ctx is not None:
            with ctx():
                yield
            return
    yield


def _tensors_in(value):
    """The tensors in `value` and in the lists, tuples and dicts it holds, depth first."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _tensors_in(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _tensors_in(v)


def _any_on(value, device, floating_only: bool = False) -> bool:
    """Whether a tensor in `value` (see _tensors_in) is on `device` (and floating-point)."""
    return any(t.device == device and (t.is_floating_point() or not floating_only) for t in _tensors_in(value))


def _on_cpu(value, device, copy):
    """`value` with every tensor on `device` replaced by copy(tensor) (lists, tuples, dicts)."""
    if isinstance(value, torch.Tensor):
        return copy(value) if value.device == device else value
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        return type(value)(_on_cpu(v, device, copy) for v in value)
    if isinstance(value, dict):
        return {k: _on_cpu(v, device, copy) for k, v in value.items()}
    return value


try:
    from torch.overrides import TorchFunctionMode as _TorchFunctionMode
except ImportError:  # torch < 1.13
    _TorchFunctionMode = None

# Factories whose boolean result has the same bytes on every device (no randomness).
_BOOL_FACTORIES = frozenset((torch.ones, torch.zeros, torch.full, torch.empty, torch.eye))


if _TorchFunctionMode is not None:
    class _BoolTensorsOn(_TorchFunctionMode):
        """Inside, a boolean tensor made by a deterministic factory (torch.ones, zeros,
        full, empty, eye with dtype=torch.bool) with no device given is made on `device`,
        and so are the results of operations on it (tril, xor, view, ...): booleans, and
        integers computed from them, have the same bytes on any device. A floating-point result computed from a tensor on `device` (a mask turned
        into a float bias, for instance) is computed again on the CPU from CPU copies of its
        inputs, as a build without this mode computes it: float arithmetic on a GPU may
        differ from the CPU's in the last bit (exp, pow, reductions), so no float tensor of
        the build ever comes from the device. An operation mixing a tensor on `device` with
        CPU tensors runs on the CPU; an in-place one runs where its target is. `made`
        counts the tensors made on `device`, `recomputed` the results computed on the CPU."""

        def __init__(self, device):
            super().__init__()
            device = torch.device(device)
            if device.type == "cuda" and device.index is None:
                device = torch.device("cuda", torch.cuda.current_device())
            self.device = device
            self.made = 0
            self.recomputed = 0

        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func in _BOOL_FACTORIES and kwargs.get("device") is None:
                dtype = kwargs.get("dtype")
                if dtype is torch.bool or dtype is bool:
                    self.made += 1
                    return func(*args, **dict(kwargs, device=self.device))
            if not _any_on((args, kwargs), self.device):
                out = func(*args, **kwargs)  # the fast path: nothing of ours among the inputs
                if kwargs.get("device") is not None and _any_on(out, self.device, floating_only=True):
                    # A float made on the device by name (torch.arange(..., device=mask.device)):
                    # made on the CPU instead, as a build without this mode makes it.
                    self.recomputed += 1
                    return func(*args, **dict(kwargs, device=torch.device("cpu")))
                return out
            inputs = list(_tensors_in((args, kwargs)))
            name = getattr(func, "__name__", "")
            in_place = (name.endswith("_") and not name.endswith("__")) or name == "__setitem__" or "out" in kwargs
            if in_place:
                # Runs where its target is (a copy of the target would lose the write).
                target = kwargs["out"] if "out" in kwargs else inputs[0]
                if isinstance(target, torch.Tensor) and target.device == self.device:
                    return func(*args, **kwargs)
                self.recomputed += 1
                return func(*_on_cpu(args, self.device, self._cpu_copy),
                            **_on_cpu(kwargs, self.device, self._cpu_copy))
            # A device tensor with CPU ones: computed on the CPU. Else on the device, unless
            # the result is floating-point: then computed again on the CPU.
            if not any(t.device.type == "cpu" and t.dim() > 0 for t in inputs):
                out = func(*args, **kwargs)
                if not _any_on(out, self.device, floating_only=True):
                    return out
            self.recomputed += 1
            return func(*_on_cpu(args, self.device, self._cpu_copy), **_on_cpu(kwargs, self.device, self._cpu_copy))

        def _cpu_copy(self, t: torch.Tensor) -> torch.Tensor:
            return t.cpu()
else:
    _BoolTensorsOn = None


def build_model(config, *, model_class=None, dtype: Optional[torch.dtype] = None,
                buffers_device: Union[None, str, torch.device] = None, attn_implementation: Optional[str] = None,
                masks_device: Union[None, str, torch.device] = None):
    """The transformers model for `config` (see model_config) with every parameter on the
    meta device and real buffers (rotary inv_freq and the like, computed by the model's
    own __init__; on `buffers_device` with torch >= 2, else on the CPU). The class is
    model_class (a class or a transformers class name), else config.architectures[0],
    else the AutoModelForCausalLM class for the config. Tied parameters are one Parameter.
    masks_device (torch >= 1.13): the boolean tensors the __init__ makes (causal masks)
    and what it computes from them are made there, byte for byte what the CPU makes, while
    every floating-point buffer is still computed on the CPU (_BoolTensorsOn); None: all
    on the CPU (or buffers_device)."""
    tf = _transformers()
    from . import as_dtype
    dtype = as_dtype(dtype)  # a torch.dtype or a name ("float16", "bf16", ...)
    config = model_config(None, config)
    cls = _model_class(tf, config, model_class)
    kwargs = {}
    if attn_implementation is not None:
        kwargs["attn_implementation"] = attn_implementation
    device_ctx = contextlib.nullcontext()
    if buffers_device is not None and hasattr(torch, "get_default_device"):  # torch >= 2.3
        device_ctx = torch.device(buffers_device)
    masks_ctx = contextlib.nullcontext()
    if masks_device is not None and _BoolTensorsOn is not None and torch.device(masks_device).type != "cpu":
        masks_ctx = _BoolTensorsOn(masks_device)
    build = getattr(cls, "_from_config", None) or cls
    # Parameters go to the meta device as they are registered (the model's init functions,
    # switched off as well, then touch no memory); buffers are computed for real.
    with parameters_on_meta(), _no_init_weights(tf), device_ctx, masks_ctx:
        model = None
        if dtype is not None:
            for key in ("dtype", "torch_dtype"):  # transformers 5 / 4 spelling
                try:
                    model = build(config, **{key: dtype}, **kwargs)
                    break
                except TypeError:
                    continue
        if model is None:
            model = build(config, **kwargs)
    _tie(model)  # tied names become one Parameter (the model's __init__ usually did it already)
    return model


def _tie(model):
    tie = getattr(model, "tie_weights", None)
    if tie is not None:
        tie()


@contextlib.contextmanager
def _intra_op_threads(n: Optional[int]):
    """torch's intra-op thread count at most n inside (None: unchanged), restored after."""
    old = torch.get_num_threads()
    if n is None or old <= n:
        yield
        return
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def _buffers_to(model: nn.Module, device: torch.device) -> int:
    """Moves the model's non-persistent buffers (what its __init__ computed: rotary inv_freq,
    causal masks; never in a checkpoint) to `device`, one copy per tensor, however many
    modules hold it; returns how many bytes moved. load_model does it while the shards are
    still being copied, so the fill afterwards has no buffer left to move."""
    moved: Dict[int, torch.Tensor] = {}
    nbytes = 0
    for mod in model.modules():
        for name, b in list(mod._buffers.items()):
            if b is None or name not in mod._non_persistent_buffers_set or b.device == device or b.is_meta:
                continue
            if id(b) not in moved:
                moved[id(b)] = b.to(device)
                nbytes += b.numel() * b.element_size()
            mod._buffers[name] = moved[id(b)]
    return nbytes


def _default_device(launch: Launch) -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", launch.local_rank % max(torch.cuda.device_count(), 1))
    return torch.device("cpu")


def _supports_conventions(checkpoint) -> bool:
    try:
        return "convention" in inspect.signature(checkpoint.state_dict).parameters
    except (TypeError, ValueError):
        return False


def _families():
    from . import _ckpt, plans
    listing = getattr(plans, "families", None) or _ckpt.plan_families
    return list(listing())


def _ckpt_plan(checkpoint, tp_plan, config, world):
    """What load_model passes to Checkpoint.state_dict as its plan."""
    if not isinstance(tp_plan, str) or tp_plan != "auto":
        return tp_plan
    if getattr(checkpoint, "config", None) is not None:
        return "auto"
    # No stored config.json (config= given): the family named by model_type.
    families = _families()
    for name in (config.model_type, config.model_type.replace("_", "-")):
        if name in families:
            return name
    if world == 1:
        return None  # nothing to split
    raise InvalidArgument(f"no built-in plan for model_type '{config.model_type}' (families: {families}); "
                          "pass tp_plan= (a family, a plan file or a dict plan)")


def _init_tp(launch: Launch, device: torch.device):
    """The default process group (initialised from the launcher's env:// variables if it is
    not yet) and a 1-D device mesh over it, as transformers' initialize_tensor_parallelism
    makes them."""
    import torch.distributed as dist
    if not dist.is_available():
        raise Unsupported("tensor parallelism needs torch.distributed, which this torch lacks")
    try:
        from torch.distributed.device_mesh import init_device_mesh
    except ImportError as e:
        raise Unsupported(f"transformers' tensor parallelism needs torch >= 2.5 (this is {torch.__version__}); "
                          "convention='megatron' fills the model's modules with shards without it") from e
    if not dist.is_initialized():
        if device.type == "cuda":
            torch.cuda.set_device(device)
        try:
            dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo",
                                    rank=launch.rank, world_size=launch.world)
        except ValueError as e:
            raise InvalidArgument(f"cannot initialise torch.distributed for rank {launch.rank} of {launch.world} "
                                  f"({e}); launch with torchrun or set MASTER_ADDR and MASTER_PORT") from e
    if (dist.get_rank(), dist.get_world_size()) != (launch.rank, launch.world):
        raise InvalidArgument(f"the default process group is rank {dist.get_rank()} of {dist.get_world_size()}, "
                              f"load_model was asked for rank {launch.rank} of {launch.world}")
    return init_device_mesh(device.type, (launch.world,), mesh_dim_names=("tp",))


def _distribute(model, mesh, world):
    """Applies transformers' TP plan to the meta `model` through the function
    from_pretrained(tp_plan="auto") calls: distribute_model(model, tp_plan, distributed_config,
    device_mesh, tp_size) (forward hooks only; transformers 4.5x to 5.x) or, in the DTensor
    backend of later releases, apply_tensor_parallelism(model, tp_mesh) (hooks, and the
    parameters become DTensor placeholders whose placements say what each rank holds)."""
    offer = {"model": model, "tp_plan": "auto", "distributed_config": None, "device_mesh": mesh, "tp_mesh": mesh,
             "tp_size": world}
    tried = []
    for where in ("transformers.integrations.tensor_parallel", "transformers.distributed.tensor_parallel"):
        try:
            tpi = __import__(where, fromlist=["ALL_PARALLEL_STYLES"])
        except ImportError:
            continue
        for fn_name in ("distribute_model", "apply_tensor_parallelism"):
            fn = getattr(tpi, fn_name, None)
            if fn is None:
                continue
            params = inspect.signature(fn).parameters
            unknown = [p.name for p in params.values() if p.default is p.empty and p.name not in offer
                       and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
            if unknown:
                tried.append(f"{where}.{fn_name}{inspect.signature(fn)} (needs {unknown})")
                continue
            out = fn(**{k: v for k, v in offer.items() if k in params})
            model = out if isinstance(out, nn.Module) else model
            for attr, value in (("_tp_size", world), ("_device_mesh", mesh)):
                if getattr(model, attr, None) is None:
                    try:
                        setattr(model, attr, value)
                    except AttributeError:
                        pass
            return model, tpi
    raise _NoTpMachinery("no tensor-parallel entry point ckpt knows" + (f" ({'; '.join(tried)})" if tried else ""))


# Placements of parameters in transformers versions whose TP layers hold DTensors
# (TensorParallelLayer.use_dtensor): {style: {parameter kind: placement}}.
_DTENSOR_PLACEMENTS = {
    "colwise": {"weight": ("shard", -2), "bias": ("shard", -1)},
    "colwise_rep": {"weight": ("shard", -2), "bias": ("shard", -1)},
    "colwise_gather_output": {"weight": ("shard", -2), "bias": ("shard", -1)},
    "packed_colwise": {"weight": ("shard", -2), "bias": ("shard", -1)},
    "rowwise": {"weight": ("shard", -1), "bias": ("replicate", None)},
    "rowwise_rep": {"weight": ("shard", -1), "bias": ("replicate", None)},
    "rowwise_split_input": {"weight": ("shard", -1), "bias": ("replicate", None)},
    "packed_rowwise": {"weight": ("shard", -1), "bias": ("replicate", None)},
    "sequence_parallel": {"weight": ("replicate", None), "bias": ("replicate", None)},
}


def _parameter_style(tpi, model, name):
    plan = getattr(model, "tp_plan", None) or getattr(model, "_tp_plan", None) or {}
    get = getattr(tpi, "_get_parameter_tp_plan", None)
    if get is None or not plan:
        return None
    try:
        return get(parameter_name=name, tp_plan=plan, is_weight=True)
    except TypeError:
        return get(name, plan)


def _dtensor_maker(tpi, model, mesh):
    """make_parameter for fill_module: wraps a shard in a DTensor where this transformers
    version's TP layer would (old use_dtensor layers), leaves it a plain tensor otherwise."""
    styles = getattr(tpi, "ALL_PARALLEL_STYLES", None) or {}

    def make(name, shard, old):
        if hasattr(old, "placements") and hasattr(old, "to_local"):
            # A DTensor placeholder (transformers' DTensor backend): the same mesh and
            # placements around this rank's shard (fill_module checked its local shape).
            from torch.distributed.tensor import DTensor
            return DTensor.from_local(shard, old.device_mesh, old.placements, run_check=False,
                                      shape=old.shape, stride=old.stride())
        style = _parameter_style(tpi, model, name)
        layer = styles.get(style) if style is not None and hasattr(styles, "get") else None
        if layer is None or not getattr(layer, "use_dtensor", False):
            return shard
        kind = name.rsplit(".", 1)[-1]
        placement = _DTENSOR_PLACEMENTS.get(style, {}).get("bias" if kind == "bias" else "weight")
        if placement is None:
            raise _NoTpMachinery(f"transformers style '{style}' of {name} holds a DTensor of unknown placement")
        from torch.distributed.tensor import DTensor, Replicate, Shard
        p = Shard(placement[1]) if placement[0] == "shard" else Replicate()
        return DTensor.from_local(shard, mesh, [p], run_check=False, shape=old.shape, stride=old.stride())

    return make


def _ignored(model):
    patterns = list(_ALWAYS_IGNORED)
    for attr in ("_keys_to_ignore_on_load_unexpected",):
        extra = getattr(model, attr, None) or ()
        patterns.extend(extra)
    return patterns


# Detaches load_model left running after its return (detach="background"), by thread.
_detaching: set = set()
_detaching_lock = threading.Lock()


def _drop(box: list) -> None:
    """Drops the last reference to a Checkpoint: its destructor unmaps the segment with the
    GIL released, then closes the lease (the daemon then counts the attachment gone)."""
    box.clear()


def _detach_in_background(box: list, times: Dict[str, float]) -> None:
    """Hands the Checkpoint in `box` (a one-element list holding the caller's only
    reference, so that the caller cannot be the one that drops the last) to a new thread
    that drops it; times["detach_background"] is its duration once it ended. The thread is
    not a daemon thread: the interpreter's exit waits for the unmap and the lease's close.
    If no thread can be started, the detach happens here."""

    def run():
        t0 = time.perf_counter()
        try:
            _drop(box)
        finally:
            box.clear()
            times["detach_background"] = time.perf_counter() - t0
            with _detaching_lock:
                _detaching.discard(threading.current_thread())

    thread = threading.Thread(target=run, name="ckpt-detach", daemon=False)
    with _detaching_lock:
        _detaching.add(thread)
    try:
        thread.start()
    except RuntimeError:  # no thread left: detach now
        with _detaching_lock:
            _detaching.discard(thread)
        box.clear()


def wait_detached(timeout: Optional[float] = None) -> bool:
    """Waits until every detach that load_model left running in the background (a
    checkpoint it attached by name) has ended: the mapping unmapped and the attachment
    gone from the daemon (ckptctl status). timeout in seconds (None: no limit); returns
    whether all ended."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        with _detaching_lock:
            pending = list(_detaching)
        if not pending:
            return True
        for thread in pending:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            thread.join(left)
            if thread.is_alive():
                return False


def load_model(name: Union[str, Checkpoint], *, rank: Optional[int] = None, world: Optional[int] = None,
               device: Union[None, str, torch.device] = None, dtype: Optional[torch.dtype] = None,
               convention: Optional[str] = "hf", tp_plan="auto", client=None, socket: Optional[str] = None,
               model_class=None, config=None, strict: bool = True, attn_implementation: Optional[str] = None,
               copy: Optional[bool] = None, fill: str = "ckpt", allow_meta: bool = False,
               detach: str = "background", **state_dict_kwargs):
    """The transformers model of checkpoint `name` for this rank, in eval mode.

    name: the checkpoint's name (attached for this call), or a ckpt.Checkpoint already
    attached (client.attach(name)), which is used as it is and stays attached: a process
    that loads several models of one checkpoint, or keeps it attached anyway, skips the
    attach and the mapping's first touch (page faults of a fresh mapping of shared memory).
    rank / world: default from the launcher (RANK/WORLD_SIZE, OMPI_COMM_WORLD_*, PMI_*,
    SLURM_*; ckpt.launcher_env()); device: default cuda:LOCAL_RANK when CUDA is there,
    else the CPU. dtype converts floating-point tensors (on the GPU for a CUDA device).
    convention: "hf" (default) gives transformers' own layout: with world > 1 the model is
    transformers' tensor-parallel model (the default torch.distributed group, initialised
    from the launcher's variables if it is not yet: NCCL for CUDA, gloo for the CPU; a
    device mesh over it; transformers' TP plan applied as from_pretrained(tp_plan="auto")
    applies it), and its forward does the collectives. "megatron" (world > 1): the model's
    modules hold megatron shards and its forward does no collectives (for kernels that
    take those shards, e.g. DeepSpeed inference injection).
    tp_plan: the plan ckptd shards by: "auto" (from the stored config), a family name, a
    plan file, a dict plan or a TpPlan; transformers' own plan is always its "auto".
    client / socket: the ckptd connection (default ckpt.connect(socket)); unused when
    `name` is a Checkpoint.
    model_class: a class or a transformers class name (default config.architectures[0],
    else AutoModelForCausalLM's); config: overrides the stored config.json.
    strict: a parameter the checkpoint lacks or a tensor the model has no place for is an
    error naming them (buffers the model computes and tied weights excepted); the model is
    then not returned. strict=False reports them in ckpt_report instead, but a parameter
    left on the meta device is still an error unless allow_meta=True (ckpt.fill_module).
    dtype: a torch.dtype or a name ("float16", "bf16", ...; ckpt.as_dtype).
    fill: "ckpt" (default): ckptd's shards go into the model; "transformers": transformers'
    from_pretrained(state_dict=zero-copy views of the whole tensors, tp_plan="auto") does
    the sharding and filling (a fallback taken automatically, with a warning, when the
    installed transformers has no tensor-parallel entry point ckpt knows).
    detach (a checkpoint attached by name, fill="ckpt"): "background" (default): the attachment is
    handed to a thread that unmaps the mapping (the GIL released; 0.13 s for 9.88 GiB of
    4 KiB pages, 2 ms on huge pages) and then closes the lease, so the call returns
    without waiting for it; until that thread ends the attachment is still attached, in
    `ckptctl status` and in the daemon's accounting, as it truly is, and the process's
    exit waits for it. ckpt.transformers.wait_detached() waits for it. "now": detached
    before the call returns. Tensors of the model never view the mapping (the CPU path
    copies, copy=True) unless copy=False is given, which keeps the mapping alive either way.
    Other keyword arguments go to Checkpoint.state_dict (engine=, group=, host_path=, ...).

    How (fill="ckpt"): the shards are copied on a second thread (the copy engine runs
    without the GIL) while this one builds the model with its parameters on the meta
    device and transformers' weight initialisation off, applies the TP plan (world > 1),
    moves the non-persistent buffers to the device and walks the model; then the shards
    are checked and stored into the parameters, the tied weights tied, the model put in
    eval mode.

    The model has attributes ckpt_fill ("ckpt" or "transformers"), ckpt_report (the
    FillReport, or None) and ckpt_times: {phase: seconds} of this call (attach, build, tp,
    buffers, walk, wait (this thread waiting for the shards), fill, tie (tie_weights and
    eval), total (without the detach of a checkpoint attached by name, at the return);
    engine: the copy's own time on its thread, engine_start: when it began after the
    call's start; detach: the detach with detach="now"; detach_background: the background
    detach's duration, set by its thread when it ends).
    Raises Unsupported without transformers, InvalidArgument for a missing config, a plan
    that does not fit or keys that do not match (naming them)."""
    started = time.perf_counter()
    times: Dict[str, float] = {}
    tf = _transformers()
    convention = _checked_load_args(name, convention, fill, detach)
    from . import as_device, as_dtype
    dtype = as_dtype(dtype)
    launch = resolve_rank_world(rank, world)
    device = as_device(device) if device is not None else _default_device(launch)
    attached_here = not isinstance(name, Checkpoint)
    if not attached_here:
        checkpoint = name
    else:
        if client is None:
            from . import connect
            client = connect(socket)
        checkpoint = client.attach(name)
    cfg = model_config(checkpoint, config)
    tp = launch.world > 1 and convention == "hf"
    mesh = _init_tp(launch, device) if tp else None
    times["attach"] = time.perf_counter() - started

    if fill == "transformers":
        return _load_through_transformers(tf, checkpoint, cfg, launch, device, dtype, mesh, model_class,
                                          attn_implementation, strict, started)
    model = _load_through_ckpt(tf, checkpoint, cfg, launch, device, dtype, mesh, tp, tp_plan, convention, copy,
                               model_class, attn_implementation, strict, allow_meta, state_dict_kwargs, times,
                               started)
    if model.ckpt_fill != "ckpt":  # fell back to fill="transformers", which keeps views of the mapping
        return model
    if attached_here:
        # The only reference left is this frame's (`checkpoint`): moved into a box, so that
        # this frame holds none when the box is handed over (else the detach thread could
        # drop its reference first and the unmap would run here).
        box, checkpoint = [checkpoint], None
        times["total"] = time.perf_counter() - started
        if detach == "background":
            _detach_in_background(box, times)
        else:
            box.clear()  # unmaps (GIL released) and closes the lease here
            times["detach"] = time.perf_counter() - started - times["total"]
        del box
    else:
        times["total"] = time.perf_counter() - started
    return model


def _checked_load_args(name, convention, fill, detach) -> str:
    """load_model's choices checked (InvalidArgument naming the one that is wrong); the
    convention, "hf" for None."""
    convention = "hf" if convention is None else convention
    if convention not in ("hf", "megatron"):
        raise InvalidArgument(f"convention must be 'hf' or 'megatron', not {convention!r}")
    if fill not in ("ckpt", "transformers"):
        raise InvalidArgument(f"fill must be 'ckpt' or 'transformers', not {fill!r}")
    if not isinstance(name, (str, Checkpoint)):
        raise InvalidArgument(f"name must be a checkpoint name or a ckpt.Checkpoint, not {type(name).__name__}")
    if detach not in ("background", "now"):
        raise InvalidArgument(f"detach must be 'background' or 'now', not {detach!r}")
    return convention


def _load_through_ckpt(tf, checkpoint, cfg, launch, device, dtype, mesh, tp, tp_plan, convention, copy,
                       model_class, attn_implementation, strict, allow_meta, state_dict_kwargs, times, started):
    """load_model with fill="ckpt": the shards fetched on a second thread while this one
    builds the model skeleton (both must succeed), then filled in, tied, in eval mode; the
    model of fill="transformers" where transformers lacks the TP machinery. Holds no
    reference to `checkpoint` once it returned."""
    plan = _ckpt_plan(checkpoint, tp_plan, cfg, launch.world)
    kwargs = dict(state_dict_kwargs)
    if _supports_conventions(checkpoint) and plan is not None and not isinstance(plan, (dict, list)) \
            and not callable(plan):
        kwargs["convention"] = convention  # a built-in family, "auto", a plan file or a TpPlan
    if copy is None:
        copy = True  # CPU shards as private copies up front (views would copy on the first write)

    def fetch():
        t0 = time.perf_counter()
        times["engine_start"] = t0 - started
        try:
            return checkpoint.state_dict(launch.rank, launch.world, plan, device=device, dtype=dtype, copy=copy,
                                         **kwargs)
        finally:
            times["engine"] = time.perf_counter() - t0

    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="ckpt-load") as pool:
        pending = pool.submit(fetch)
        try:
            model, make, walk, ignore, t = _build_skeleton(cfg, model_class, dtype, attn_implementation, device,
                                                           tp, mesh, launch.world, times)
        except _NoTpMachinery as e:
            pending.result()  # its errors first: they say more about the checkpoint
            warnings.warn(f"transformers {tf.__version__}: {e}; load_model falls back to fill='transformers'")
            return _load_through_transformers(tf, checkpoint, cfg, launch, device, dtype, mesh, model_class,
                                              attn_implementation, strict, started)
        except BaseException:
            pending.cancel()
            raise
        shards = pending.result()
        t = _lap(times, "wait", t)
    report = _fill(model, walk, shards, launch, device, strict=strict,
                   shapes="local" if launch.world == 1 else "global", ignore=ignore, make_parameter=make,
                   label=checkpoint.name, allow_meta=allow_meta)
    del shards
    t = _lap(times, "fill", t)
    _tie(model)
    model.eval()
    t = _lap(times, "tie", t)
    model.ckpt_fill = "ckpt"
    model.ckpt_report = report
    model.ckpt_times = times
    return model


def _lap(times: Dict[str, float], phase: str, since: float) -> float:
    """times[phase] = the seconds since `since`; returns now."""
    now = time.perf_counter()
    times[phase] = now - since
    return now


def _build_skeleton(cfg, model_class, dtype, attn_implementation, device, tp, mesh, world, times):
    """The model with its parameters on the meta device, the TP plan applied (tp), its
    non-persistent buffers on `device`, walked: (model, make_parameter, walk, ignored
    patterns, the time it ended); times gets build, tp, buffers, walk."""
    t = time.perf_counter()
    with _intra_op_threads(_BUILD_THREADS if device.type == "cuda" else None):
        # Float buffers are computed on the CPU and then moved, as from_pretrained
        # computes them (rotary inv_freq on a GPU can differ from the CPU's in the
        # last bit); boolean masks are made on the device (exact anywhere).
        masks = device if device.type == "cuda" and _DEVICE_MASKS else None
        model = build_model(cfg, model_class=model_class, dtype=dtype,
                            attn_implementation=attn_implementation, masks_device=masks)
        t = _lap(times, "build", t)
        make = None
        if tp:
            model, tpi = _distribute(model, mesh, world)
            _tie(model)  # a backend that replaced parameters by placeholders: one per tied group again
            make = _dtensor_maker(tpi, model, mesh)
            t = _lap(times, "tp", t)
        _buffers_to(model, device)
        t = _lap(times, "buffers", t)
        walk = _walk(model)
        ignore = _ignored(model)
        t = _lap(times, "walk", t)
    return model, make, walk, ignore, t


def _load_through_transformers(tf, checkpoint, cfg, launch, device, dtype, mesh, model_class,
                               attn_implementation, strict, started):
    cls = _model_class(tf, cfg, model_class)
    views = {n: checkpoint.tensor(n) for n in checkpoint.keys()}
    kwargs: Dict[str, Any] = {"config": cfg, "state_dict": views}
    if dtype is not None:
        kwargs["dtype"] = dtype
    if attn_implementation is not None:
        kwargs["attn_implementation"] = attn_implementation
    if mesh is not None:
        kwargs.update(tp_plan="auto", device_mesh=mesh)
    else:
        kwargs["device_map"] = str(device)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # read-only views: transformers copies what it changes
        model, info = cls.from_pretrained(None, output_loading_info=True, **kwargs)
    missing = sorted(info.get("missing_keys") or [])
    unexpected = sorted(info.get("unexpected_keys") or [])
    if strict and (missing or unexpected):
        raise InvalidArgument(f"checkpoint '{checkpoint.name}' does not fit {cls.__name__}: "
                              f"missing {missing[:8]}, unexpected {unexpected[:8]}")
    model.eval()
    model.ckpt_fill = "transformers"
    model.ckpt_report = None
    model.ckpt_times = {"total": time.perf_counter() - started}
    return model
