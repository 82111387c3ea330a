"""Tensor-parallel plans: the C++ plan engine (ckpt._ckpt.TpPlan), the one place plans live.

    import ckpt.plans
    plan = ckpt.plans.for_config(config, convention="hf")      # family from model_type
    plan = ckpt.plans.builtin("llama", convention="megatron", config=config, fuse_qkv=True)
    plan = ckpt.plans.from_file("my_plan.json")                  # format: docs/tp-plans.md
    outs = plan.resolve(checkpoint.tensors(), rank, world)       # what each rank holds

Conventions: "megatron" (default; the layout fused inference kernels use) and "hf" (what
transformers' own tensor parallelism holds on each rank). docs/tp-plans.md says exactly what
each rank gets, per family. Checkpoint.state_dict(plan=...) accepts a TpPlan, "auto" (the
family from the checkpoint's config), a family name, a plan file path, or a {regex: Rule}
dict (turned into a plan file here, resolved by the same engine).
"""
import json
import os
from typing import Mapping, Optional, Union

from . import _ckpt, hf_plans

TpPlan = _ckpt.TpPlan
ShardOutput = _ckpt.ShardOutput

# Family names, kept for code that passed ckpt.plans.GPT_NEO: the plans themselves are in C++.
GPT_NEO = "gpt-neo"
GPT2 = "gpt2"
LLAMA = "llama"

CONVENTIONS = ("megatron", "hf")


def families():
    """The built-in families (canonical names): the "megatron" convention's, and those
    transformers has no plan for. The "hf" convention also takes hf_model_types()."""
    return list(TpPlan.families())


def hf_model_types():
    """The transformers model types whose tensor-parallel plan the library carries as data
    (src/plan/hf_tp_plans.json, from transformers hf_plans_version())."""
    return list(TpPlan.hf_model_types())


def hf_plans_version():
    """The transformers version the embedded plan data was generated from."""
    return TpPlan.hf_plans_version()


def _live_hf_plan(config_text: str):
    """The "hf" plan of the model `config_text` describes from the installed transformers'
    own classes, when it is another version than the embedded data's (CKPT_HF_PLANS=live:
    always; =data: never); None to use the data."""
    mode = os.environ.get("CKPT_HF_PLANS", "auto")
    if mode not in ("auto", "live", "data"):
        raise _ckpt.InvalidArgument(f"CKPT_HF_PLANS={mode!r}: use auto, live or data")
    installed = hf_plans.installed_transformers_version()
    if mode == "data" or installed is None or (mode == "auto" and installed == hf_plans_version()):
        return None
    config = parse_config(config_text)
    try:
        entry = hf_plans.live_entry(config)
    except Exception as e:
        if mode == "live" or config.get("model_type") not in hf_model_types():
            raise _ckpt.InvalidArgument(f"transformers {installed} cannot describe the plan of model type "
                                        f"{config.get('model_type')!r}: {type(e).__name__}: {e}") from None
        return None  # the data's plan (transformers hf_plans_version())
    return TpPlan.from_hf_entry(config["model_type"], json.dumps(entry), config_text,
                                f"transformers {installed}, live")


def parse_config(raw: Union[bytes, bytearray, str], where: str = "the model config", error=None) -> dict:
    """config.json's bytes (or text) as a dict. Anything else raises `error` (default
    ckpt.InvalidArgument) naming `where` and the cause: bytes that are not UTF-8, text that
    is not JSON, nesting deeper than Python's parser goes, a number too long to read, or a
    document that is not a JSON object. The one parser of config.json in ckpt's Python."""
    error = error or _ckpt.InvalidArgument
    try:
        text = raw if isinstance(raw, str) else bytes(raw).decode("utf-8")
    except UnicodeDecodeError as e:
        raise error(f"{where} is not UTF-8 ({e})") from None
    try:
        doc = json.loads(text)
    except RecursionError:
        raise error(f"{where} is nested too deeply to parse") from None
    except ValueError as e:  # JSONDecodeError, or an integer of more digits than Python reads
        raise error(f"{where} is not valid JSON ({e})") from None
    if not isinstance(doc, dict):
        raise error(f"{where} is a JSON {type(doc).__name__}, not an object")
    return doc


def config_dict(config) -> Optional[dict]:
    """The model config as a dict, from whatever `config=` takes anywhere in ckpt
    (Checkpoint.state_dict / resolve, the plans here, ckpt.transformers.load_model): None
    (None), a dict, a pathlib.Path or other os.PathLike, a string naming a file (a
    config.json) or a model folder (its config.json), JSON text (a string that starts with
    "{", or bytes), or an object with to_dict() (a transformers PretrainedConfig). Raises
    ckpt.InvalidArgument naming the path for a file that cannot be read or is not a JSON
    object, and for JSON text that is not one."""
    if config is None:
        return None
    if isinstance(config, Mapping):
        return dict(config)
    if isinstance(config, (bytes, bytearray)):
        return parse_config(config, "config")
    if isinstance(config, (str, os.PathLike)):
        path = os.fspath(config)
        if isinstance(config, os.PathLike) or not path.lstrip().startswith("{"):
            if os.path.isdir(path):
                path = os.path.join(path, "config.json")
            try:
                with open(path, "rb") as f:
                    raw = f.read()
            except OSError as e:
                raise _ckpt.InvalidArgument(f"cannot read the model config {path}: {e}") from None
            return parse_config(raw, f"the model config {path}")
        return parse_config(path, "config")
    to_dict = getattr(config, "to_dict", None)
    if callable(to_dict):
        return dict(to_dict())
    raise _ckpt.InvalidArgument(f"config must be a dict, a config.json path, JSON text or a PretrainedConfig, "
                                f"not {type(config).__name__}")


def _config_text(config) -> str:
    value = config_dict(config)
    if value is None:
        return ""
    try:
        return json.dumps(value, allow_nan=False)
    except RecursionError:
        raise _ckpt.InvalidArgument("config is nested too deeply to pass to the plan engine") from None
    except (TypeError, ValueError) as e:  # an object JSON cannot hold, NaN or infinity
        raise _ckpt.InvalidArgument(f"config cannot be passed to the plan engine as JSON: {e}") from None


def builtin(family: str, convention: str = "megatron", *, config=None, fuse_qkv: bool = False,
            fuse_gate_up: bool = False, transpose_conv1d: bool = False, expert_parallel: bool = False,
            fuse_experts: bool = False) -> TpPlan:
    """The built-in plan of `family` (see families()); `config` (see config_dict: a dict, a
    config.json path or JSON text) gives head and expert counts. Raises InvalidArgument for an unknown family or convention."""
    return TpPlan.builtin(family, convention, _config_text(config), fuse_qkv, fuse_gate_up, transpose_conv1d,
                          expert_parallel, fuse_experts)


def for_config(config, convention: str = "megatron", **options) -> TpPlan:
    """The built-in plan of the family `config` names (model_type, else architectures)."""
    text = _config_text(config)
    if not text:
        return TpPlan.for_config("", convention)  # raises: plan "auto" needs a config
    if convention == "hf" and not any(options.values()):
        live = _live_hf_plan(text)
        if live is not None:
            return live
    return TpPlan.for_config(text, convention, **options)


def from_json(text: str) -> TpPlan:
    return TpPlan.from_json(text)


def from_file(path: str) -> TpPlan:
    return TpPlan.from_file(str(path))


def from_rules(rules: Mapping, convention: str = "megatron") -> TpPlan:
    """A plan from {regex: ckpt.Rule} (first match wins; unmatched tensors replicated)."""
    entries = []
    for pattern, rule in rules.items():
        kind, dim, chunks, uneven = rule
        if kind == "replicate":
            entries.append({"pattern": pattern, "rule": "replicate"})
        elif kind == "split":
            entries.append({"pattern": pattern, "rule": {"split": dim, "chunks": chunks, "uneven": bool(uneven)}})
        else:
            raise _ckpt.InvalidArgument(f"rule {kind!r} for /{pattern}/ is not a tensor-parallel rule "
                                        "(flat partitions: Checkpoint.partitions())")
    return TpPlan.from_json(json.dumps({"convention": convention, "default": "replicate", "rules": entries}))


def make(plan, *, config=None, convention: str = "megatron", **options) -> TpPlan:
    """A TpPlan from what state_dict(plan=...) accepts: None (every tensor whole), a TpPlan,
    "auto" (the family from `config`), a family name, a plan file path, or {regex: Rule}."""
    if convention not in CONVENTIONS:
        raise _ckpt.InvalidArgument(f"unknown convention '{convention}' (known: megatron, hf)")
    if plan is None:
        return TpPlan.from_json(json.dumps({"convention": convention, "default": "replicate", "rules": []}))
    if isinstance(plan, TpPlan):
        return plan
    if isinstance(plan, str):
        if plan == "auto":
            return for_config(config, convention, **options)
        if plan in families() or plan in hf_model_types() or _is_alias(plan):
            return builtin(plan, convention, config=config, **options)
        if os.path.isfile(plan):
            return from_file(plan)
        raise _ckpt.InvalidArgument(f"unknown plan '{plan}': not \"auto\", a built-in family {families()} "
                                    "nor a plan file (format: docs/tp-plans.md)")
    if isinstance(plan, Mapping):
        return from_rules(plan, convention)
    raise _ckpt.InvalidArgument(f"a plan is None, \"auto\", a family name, a plan file, a TpPlan or "
                                f"{{regex: Rule}}, not {type(plan).__name__}")


def _is_alias(name: str) -> bool:
    try:
        TpPlan.builtin(name)
        return True
    except _ckpt.InvalidArgument as e:
        return "unknown model family" not in str(e)
