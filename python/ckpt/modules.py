"""Filling a torch.nn.Module (typically built on the meta device) with this rank's shards.

    with ckpt.meta.parameters_on_meta():        # or torch.device("meta") on torch >= 2
        model = MyModel(config)
    report = ckpt.fill_module(model, ckpt.connect().attach("my-model"), rank, world, plan,
                              device="cuda:0")

fill_module is all-or-nothing: it fetches and checks every tensor first, and only when
nothing is missing, unexpected or of the wrong shape does it replace the module's
parameters (new nn.Parameters stored in their owners' _parameters, as setattr would store
them: no load_state_dict(assign=True), so it works on torch 1.13 as on current torch). On an
error the module is untouched, and no parameter is ever left on the meta device without an
error naming it.
"""
import re
from typing import Callable, Dict, Iterable, List, Mapping, NamedTuple, Optional, Sequence, Tuple, Union

import torch
from torch import nn

from .launcher import Launch, launcher_env, resolve_rank_world  # noqa: F401  (re-exported)

_NAMES_SHOWN = 8  # names listed per kind in an error; the rest are counted


class FillReport(NamedTuple):
    """What fill_module did. loaded: parameter names filled (every alias of a tied
    parameter included); buffers: persistent buffers filled from the checkpoint; tied:
    groups of names that share one parameter; missing / unexpected: names left out
    (non-empty only with strict=False); ignored: checkpoint tensors not used (matched
    `ignore`, or non-persistent buffers the module computes itself)."""
    loaded: List[str]
    buffers: List[str]
    tied: List[Tuple[str, ...]]
    missing: List[str]
    unexpected: List[str]
    ignored: List[str]


def _listing(kind: str, names: Sequence[str]) -> str:
    shown = ", ".join(names[:_NAMES_SHOWN])
    more = f" and {len(names) - _NAMES_SHOWN} more" if len(names) > _NAMES_SHOWN else ""
    return f"{len(names)} {kind}: {shown}{more}"


def _shape_ok(got: Sequence[int], want: Sequence[int], world: int, shapes: str) -> bool:
    got, want = tuple(got), tuple(want)
    if shapes == "local" or world == 1:
        return got == want
    # "global": the module holds unsharded shapes; a shard keeps every dim or cuts one or
    # more of them into `world` parts (even, or uneven as torch.chunk and tensor_split cut:
    # no part larger than ceil(dim / world)).
    if len(got) != len(want):
        return False
    # Megatron layouts also give whole key/value heads replicated over ranks when the
    # TP degree exceeds them: any whole fraction of the dim no finer than 1/world.
    for g, w in zip(got, want):
        if g == w or 0 <= g <= -(-w // world):  # even, ceil-chunked (torch.chunk) or empty parts
            continue
        if g > 0 and w % g == 0 and w // g <= world:
            continue
        return False
    return True


def fill_module(module: nn.Module, checkpoint, rank: Optional[int] = None, world: Optional[int] = None,
                plan=None, *, convention: Optional[str] = None, device: Union[str, torch.device] = "cpu",
                dtype: Union[None, str, torch.dtype] = None, strict: bool = True, shapes: str = "local",
                copy: Optional[bool] = None, ignore: Iterable[str] = (), allow_meta: bool = False,
                make_parameter: Optional[Callable[[str, torch.Tensor, nn.Parameter], torch.Tensor]] = None,
                label: Optional[str] = None, **state_dict_kwargs) -> FillReport:
    """Replaces `module`'s parameters (and persistent buffers the checkpoint holds) with
    this rank's shards of `checkpoint` and returns a FillReport.

    checkpoint: a ckpt.Checkpoint (its state_dict(rank, world, plan, device=, dtype=,
    copy=, convention=, **state_dict_kwargs) is taken; convention is passed only when
    given) or a mapping {name: tensor} already sharded for this rank (plan, convention,
    dtype, copy and state_dict_kwargs are then unused).
    rank / world: default from the launcher's environment (ckpt.launcher_env()).
    shapes: "local" (default): each shard must have the module's parameter shape (a module
    built for its shards, e.g. Megatron-style parallel layers, or world 1); "global": the
    module holds the unsharded shapes (transformers' tensor-parallel models) and a shard
    must keep or split each dim by world.
    dtype: a torch.dtype or a name ("float16", "bf16", ...; ckpt.as_dtype).
    copy: with copy=False, CPU shards that are one contiguous run of their tensor are
    zero-copy, copy-on-write views of the shared memory (a write, e.g. an optimizer step,
    copies the pages written into this process); default True on the CPU, so parameters
    own their memory. Devices always copy.
    strict=False: parameters the checkpoint lacks and tensors no parameter takes are
    reported (missing / unexpected) instead of raising, but a missing parameter that is on
    the meta device (it has no data: the module could not run) is still an error naming
    it, unless allow_meta=True.
    ignore: regexes (re.search) of checkpoint names to leave unused without error.
    make_parameter(name, shard, old_parameter) -> tensor: what the parameter holds (e.g. a
    DTensor around the shard); default the shard itself.
    label: how errors name the source (default: the checkpoint's name).

    Tied parameters (one Parameter object under several names, as module.tie_weights()
    leaves them) stay tied: the first name the checkpoint holds fills them all; if the
    checkpoint holds several of those names their tensors must be equal.
    Parameters take the shard's dtype (dtype= converts floating-point tensors). Buffers
    the checkpoint does not hold are moved to `device`; a buffer still on the meta device
    is reported missing.

    Raises ckpt.InvalidArgument (a ValueError) naming the tensors when, with strict=True,
    a parameter has no tensor, a checkpoint tensor matches no parameter or buffer, or
    (always) a shape does not fit; the module is then untouched. Errors of the checkpoint
    itself (ckpt.NotFound, InvalidArgument for a plan that does not divide, ...), of
    make_parameter and of moving buffers also leave it untouched: everything that can fail
    runs before the first attribute is set. Not thread-safe against other users of
    `module` while it runs."""
    from . import InvalidArgument, as_device, as_dtype
    dtype = as_dtype(dtype)
    if shapes not in ("local", "global"):
        raise InvalidArgument(f"shapes must be 'local' or 'global', not {shapes!r}")
    place = resolve_rank_world(rank, world)
    device = as_device(device)
    walk = _walk(module)

    # Every shard first: nothing is assigned until all of them are there and fit.
    if isinstance(checkpoint, Mapping):
        shards = dict(checkpoint)
    else:
        kwargs = dict(state_dict_kwargs)
        if convention is not None:
            kwargs["convention"] = convention
        if copy is None:
            copy = True
        shards = checkpoint.state_dict(place.rank, place.world, plan, device=device, dtype=dtype, copy=copy,
                                       **kwargs)
    what = label if label is not None else getattr(checkpoint, "name", None)
    return _fill(module, walk, shards, place, device, strict=strict, shapes=shapes, ignore=ignore,
                 make_parameter=make_parameter, label=what, allow_meta=allow_meta)


class _Walk(NamedTuple):
    """A module's parameters grouped by identity (tied parameters share one object), its
    buffers, and the (owner module, attribute) of every name under which each is reachable."""
    groups: Dict[int, List[str]]
    params: Dict[int, nn.Parameter]
    buffers: Dict[str, Tuple[torch.Tensor, bool]]  # name -> (tensor, persistent)
    owners: Dict[str, Tuple[nn.Module, str]]


def _walk(module: nn.Module) -> _Walk:
    """What _fill needs of `module`, walked once (named_parameters(remove_duplicate=False) is
    torch >= 2.0, so the modules are walked here). Valid until the module is changed."""
    groups: Dict[int, List[str]] = {}
    params: Dict[int, nn.Parameter] = {}
    buffers: Dict[str, Tuple[torch.Tensor, bool]] = {}
    owners: Dict[str, Tuple[nn.Module, str]] = {}
    for mod_name, mod in module.named_modules(remove_duplicate=False):
        prefix = f"{mod_name}." if mod_name else ""
        for p_name, p in mod._parameters.items():
            if p is not None:
                groups.setdefault(id(p), []).append(prefix + p_name)
                params[id(p)] = p
                owners[prefix + p_name] = (mod, p_name)
        for b_name, b in mod._buffers.items():
            if b is not None:
                buffers[prefix + b_name] = (b, b_name not in mod._non_persistent_buffers_set)
                owners[prefix + b_name] = (mod, b_name)
    return _Walk(groups, params, buffers, owners)


class _Match:
    """How a state dict's tensors meet a walked module: what goes where and what is wrong."""

    def __init__(self):
        self.assign: List[Tuple[List[str], torch.Tensor, nn.Parameter]] = []  # (tied names, tensor, old)
        self.buffer_fill: List[Tuple[str, torch.Tensor]] = []
        self.used = set()
        self.missing: List[str] = []
        self.bad_shapes: List[str] = []
        self.tied_differ: List[str] = []
        self.ignored: List[str] = []
        self.unexpected: List[str] = []


def _fill(module: nn.Module, walk: _Walk, shards: Mapping[str, torch.Tensor], place: Launch,
          device: torch.device, *, strict: bool, shapes: str, ignore: Iterable[str],
          make_parameter: Optional[Callable[[str, torch.Tensor, nn.Parameter], torch.Tensor]],
          label: Optional[str], allow_meta: bool = False) -> FillReport:
    """fill_module's checks and commit, for shards already fetched and a walk of `module`
    taken since its last change (load_model walks the model while the shards are copied)."""
    from . import InvalidArgument
    m = _Match()
    _match_parameters(walk, shards, place, shapes, m)
    _match_buffers(walk, shards, m)
    ignore_re = [re.compile(p) for p in ignore]
    for name in shards:
        if name in m.used:
            continue
        if any(r.search(name) for r in ignore_re):
            m.ignored.append(name)
        else:
            m.unexpected.append(name)
    problems = _fill_problems(walk, m, strict, allow_meta)
    if problems:
        where = f"checkpoint '{label}'" if isinstance(label, str) else "the state dict"
        raise InvalidArgument(f"cannot fill {type(module).__name__} from {where} (rank {place.rank} of "
                              f"{place.world}): " + "; ".join(problems) + ". The module is unchanged.")
    new_params, new_buffers = _new_values(walk, m, make_parameter, device)
    loaded, tied = _commit(walk, new_params, new_buffers)
    filled_buffers = [name for name, _ in m.buffer_fill]
    return FillReport(loaded, filled_buffers, tied, m.missing, m.unexpected, m.ignored)


def _match_parameters(walk: _Walk, shards: Mapping[str, torch.Tensor], place: Launch, shapes: str,
                      m: _Match) -> None:
    """Each group of tied parameters against the shards: its tensor (the first name present),
    a shape that does not fit, tied names whose tensors differ, or missing."""
    for key, names in walk.groups.items():
        old = walk.params[key]
        present = [n for n in names if n in shards]
        if not present:
            m.missing.extend(names)
            continue
        source = present[0]
        t = shards[source]
        if hasattr(old, "to_local") and hasattr(old, "placements"):
            # A DTensor parameter (e.g. transformers' TP placeholders): the shard must be
            # exactly its local part.
            want = tuple(old.to_local().shape)
            if tuple(t.shape) != want:
                m.bad_shapes.append(f"{source} {tuple(t.shape)} (local part of the module's DTensor {want})")
        elif not _shape_ok(t.shape, old.shape, place.world, shapes):
            m.bad_shapes.append(f"{source} {tuple(t.shape)} (module {tuple(old.shape)})")
        for other in present[1:]:
            o = shards[other]
            if o.shape != t.shape or o.dtype != t.dtype or not torch.equal(o.to(t.device), t):
                m.tied_differ.append(f"{other} != {source}")
        m.used.update(present)
        m.assign.append((names, t, old))


def _match_buffers(walk: _Walk, shards: Mapping[str, torch.Tensor], m: _Match) -> None:
    """Each buffer against the shards: persistent ones filled (shape checked), the ones the
    module computes ignored, a buffer on the meta device with no tensor missing."""
    for name, (b, persistent) in walk.buffers.items():
        if name in shards:
            m.used.add(name)
            if not persistent:
                m.ignored.append(name)  # the module computes it (rotary inv_freq, causal masks)
                continue
            t = shards[name]
            if tuple(t.shape) != tuple(b.shape):
                m.bad_shapes.append(f"{name} {tuple(t.shape)} (buffer {tuple(b.shape)})")
            m.buffer_fill.append((name, t))
        elif b.device.type == "meta":
            m.missing.append(f"{name} (buffer on the meta device)")


def _fill_problems(walk: _Walk, m: _Match, strict: bool, allow_meta: bool) -> List[str]:
    """What makes the fill fail, one listing per kind; empty if it may go ahead."""
    problems = []
    if m.bad_shapes:
        problems.append(_listing("tensors whose shape does not fit", m.bad_shapes))
    if m.tied_differ:
        problems.append(_listing("tied parameters with different tensors in the checkpoint", m.tied_differ))
    if strict and m.missing:
        problems.append(_listing("missing (no tensor in the checkpoint)", m.missing))
    elif m.missing and not allow_meta:
        on_meta = [n for key, names in walk.groups.items() if walk.params[key].device.type == "meta"
                   for n in names if n in m.missing]
        on_meta += [n for n in m.missing if n.endswith("(buffer on the meta device)")]
        if on_meta:
            problems.append(_listing("left on the meta device (no tensor in the checkpoint; strict=False "
                                     "fills only what the checkpoint has: pass allow_meta=True to accept)",
                                     on_meta))
    if strict and m.unexpected:
        problems.append(_listing("unexpected (no such parameter or buffer)", m.unexpected))
    return problems


def _new_values(walk: _Walk, m: _Match, make_parameter, device: torch.device):
    """Every new parameter and buffer value (make_parameter, moves to the device: the steps
    that can still fail), prepared before the module is touched: (new_params, new_buffers)."""
    new_params: List[Tuple[List[str], nn.Parameter]] = []
    for names, t, old in m.assign:
        value = make_parameter(names[0], t, old) if make_parameter is not None else t
        grad = bool(old.requires_grad) and (t.is_floating_point() or t.is_complex())
        new_params.append((names, value if isinstance(value, nn.Parameter) else nn.Parameter(value, requires_grad=grad)))
    new_buffers: List[Tuple[str, torch.Tensor]] = list(m.buffer_fill)
    filled = {name for name, _ in m.buffer_fill}
    moved: Dict[int, torch.Tensor] = {}  # one copy per buffer object, however many names it has
    for name, (b, _) in walk.buffers.items():
        if name not in filled and b.device.type != "meta" and b.device != device:
            if id(b) not in moved:
                moved[id(b)] = b.to(device)
            new_buffers.append((name, moved[id(b)]))
    return new_params, new_buffers


def _commit(walk: _Walk, new_params, new_buffers):
    """Stores the new values: dictionary stores only. Every name is a registered parameter
    (or buffer) of its owner (the walk found it there), so replacing the entry is what
    setattr would end up doing, without Module.__setattr__'s type dispatch per name.
    Returns (loaded names, tied groups)."""
    loaded: List[str] = []
    tied: List[Tuple[str, ...]] = []
    owners = walk.owners
    for names, new in new_params:
        for name in names:
            owner, attr = owners[name]
            owner._parameters[attr] = new
        loaded.extend(names)
        if len(names) > 1:
            tied.append(tuple(names))
    for name, value in new_buffers:
        owner, attr = owners[name]
        owner._buffers[attr] = value
    return loaded, tied
