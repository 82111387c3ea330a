"""transformers' tensor-parallel plans as data: the one description of an entry, live or embedded.

The library embeds src/plan/hf_tp_plans.json (tools/gpu/gen_hf_plans.py writes it from an
installed transformers): for each model type, the model's full plan, the plan with tied word
embeddings, the base-model prefix, the text sub-config of composite models and the checkpoint
conversions. `entry_of_model` makes such an entry from a live transformers model; the
generator and `live_entry` (used by ckpt.plans when the installed transformers is another
version than the data's) both call it. This module imports neither ckpt's extension nor
transformers at load, so the generator can load it by path on a machine without ckpt built.
"""
import copy

TASKS = (("causal_lm", "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES"),
         ("image_text_to_text", "MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES"),
         ("multimodal_lm", "MODEL_FOR_MULTIMODAL_LM_MAPPING_NAMES"),
         ("vision_to_seq", "MODEL_FOR_VISION_2_SEQ_MAPPING_NAMES"),
         ("base", "MODEL_MAPPING_NAMES"))


def _first_line(e):
    return f"{type(e).__name__}: {e}".splitlines()[0][:300]


def model_class(model_type):
    """(task, class) transformers' Auto mappings give `model_type`: causal LM, else
    image-text-to-text, ..., else the base model; (None, None) when none has it."""
    import transformers
    from transformers.models.auto import modeling_auto
    for task, mapping_name in TASKS:
        name = (getattr(modeling_auto, mapping_name, None) or {}).get(model_type)
        if isinstance(name, (list, tuple)):
            name = name[0]
        if name and getattr(transformers, name, None) is not None:
            return task, getattr(transformers, name)
    return None, None


def _plain(value):
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, (list, tuple)):
        items = [_plain(v) for v in value]
        return items if all(i is not None or v is None for i, v in zip(items, value)) else None
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return None


def _attributes(obj):
    """obj's instance attributes: its __dict__ and its classes' __slots__ (transformers'
    WeightTransform classes are slotted)."""
    out = dict(getattr(obj, "__dict__", {}))
    for cls in type(obj).__mro__:
        slots = getattr(cls, "__slots__", ())
        for name in [slots] if isinstance(slots, str) else slots:
            if name not in out and not name.startswith("__") and hasattr(obj, name):
                out[name] = getattr(obj, name)
    return out


def _conversion(c):
    """One WeightRenaming / WeightConverter (transformers.core_model_loading) as data."""
    out = {"kind": type(c).__name__}
    for attr in ("source_patterns", "target_patterns"):
        v = getattr(c, attr, None)
        out[attr] = [v] if isinstance(v, str) else list(v or [])
    for attr, v in _attributes(c).items():  # scope and prefix fields, as far as they are plain data
        if not attr.startswith("_") and attr not in out and attr not in ("operations", "collected_tensors",
                                                                            "layer_targets", "compiled_sources"):
            if _plain(v) is not None:
                out[attr] = _plain(v)
    ops = []
    for op in getattr(c, "operations", None) or []:
        fields = {k: _plain(v) for k, v in _attributes(op).items()
                  if not k.startswith("_") and _plain(v) is not None}
        ops.append({"op": type(op).__name__, **fields})
    if ops:
        out["operations"] = ops
    return out


def _conversions(model):
    from transformers.conversion_mapping import get_model_conversion_mapping
    try:
        mapping = get_model_conversion_mapping(model, add_legacy=False)
    except TypeError:
        mapping = get_model_conversion_mapping(model)
    return [_conversion(c) for c in mapping or []]


def loader_renames(model, keys):
    """{checkpoint key: the model key transformers' from_pretrained loads it into} for `keys`:
    rename_source_key with the model's conversions (legacy ones included), then the loader's
    rule that a key whose renamed form is no key of the model but which is one itself keeps its
    own name (core_model_loading.convert_and_load_state_dict_in_model)."""
    return {key: loaded for key, _, loaded in _renames(model, keys)}


def _renames(model, keys):
    """(key, its name after the model's renames, the name from_pretrained gives it) for `keys`,
    in the loader's order (GroupWeightRename is stateful)."""
    from transformers import core_model_loading as cml
    from transformers.conversion_mapping import get_model_conversion_mapping
    mapping = get_model_conversion_mapping(model)
    renamings = [c for c in mapping if isinstance(c, cml.WeightRenaming)]
    converters = [c for c in mapping if isinstance(c, cml.WeightConverter)]
    meta = model.state_dict()
    prefix = getattr(model, "base_model_prefix", None)
    out = []
    for key in sorted(keys, key=cml.dot_natural_key):
        renamed = cml.rename_source_key(key, renamings, converters, prefix, meta)[0]
        loaded = renamed
        if renamed not in meta and key in meta:
            loaded = cml.rename_source_key(key, [], [], prefix, meta)[0]
        out.append((key, renamed, loaded))
    return out


def _kept_names(model):
    """The model's own keys (layer numbers as '*') that its renames would move to a key the
    model lacks, so that from_pretrained keeps them as they are (loader_renames)."""
    import re
    return sorted({re.sub(r"(?<=\.)\d+(?=\.)", "*", key)
                   for key, renamed, loaded in _renames(model, list(model.state_dict())) if renamed != loaded})


def _text_config_key(config):
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    if text is config:
        return None
    for key in getattr(config, "sub_configs", {}) or {}:
        if getattr(config, key, None) is text:
            return key
    return None


def _meta_model(model_cls, config):
    import torch
    with torch.device("meta"):
        return model_cls._from_config(config)


def _tp_plan(model):
    return dict(sorted((getattr(model, "tp_plan", None) or getattr(model, "_tp_plan", None) or {}).items()))


def entry_of_model(model_cls, config, task=None, tied_config=None):
    """The data entry of `model_cls` built (on the meta device) from `config`; with
    `tied_config` (the same config with tie_word_embeddings=True), the tied plan too where it
    differs. Raises what transformers raises building the model."""
    model = _meta_model(model_cls, config)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    entry = {"config_class": type(config).__name__, "model_class": model_cls.__name__, "task": task,
             "base_model_prefix": getattr(model_cls, "base_model_prefix", ""),
             "tie_default": bool(getattr(text, "tie_word_embeddings", False)),
             "text_config": _text_config_key(config), "tp_plan": _tp_plan(model)}
    if tied_config is not None:
        tied = _tp_plan(_meta_model(model_cls, tied_config))
        if tied != entry["tp_plan"]:
            entry["tp_plan_tied"] = tied
    ep = getattr(model, "_ep_plan", None)
    if ep:
        entry["ep_plan"] = dict(sorted(ep.items()))
    try:
        entry["conversions"] = _conversions(model)
    except Exception as e:  # an older transformers without conversion_mapping
        entry["conversions_error"] = _first_line(e)
        return entry
    try:
        kept = _kept_names(model)
    except Exception as e:  # a loader without rename_source_key: renames as they are
        entry["kept_names_error"] = _first_line(e)
    else:
        if kept:
            entry["kept_names"] = kept
    return entry


def live_entry(config_dict):
    """The entry of the model `config_dict` (config.json as a dict) describes, from the
    installed transformers: its config class's own plan, for this config."""
    import transformers
    model_type = config_dict.get("model_type")
    if not model_type or model_type not in transformers.CONFIG_MAPPING:
        raise ValueError(f"transformers {transformers.__version__} has no model type {model_type!r}")
    config_cls = transformers.CONFIG_MAPPING[model_type]
    config = config_cls.from_dict({k: v for k, v in config_dict.items() if k != "transformers_version"})
    task, model_cls = model_class(model_type)
    if model_cls is None:
        raise ValueError(f"transformers {transformers.__version__} has no model class for {model_type!r}")
    return entry_of_model(model_cls, config, task)


def installed_transformers_version():
    """The installed transformers' version without importing it, or None."""
    try:
        from importlib.metadata import version, PackageNotFoundError
    except ImportError:
        return None
    try:
        return version("transformers")
    except PackageNotFoundError:
        return None
