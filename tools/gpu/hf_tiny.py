"""Tiny random models of any transformers model type, for the plan generator and the family check.

`tiny_config(model_type)` takes the config class's defaults and shrinks every size field it
knows (in the config and each of its sub-configs: text, vision, audio) to a few dozen units:
hidden 64, 2 layers, 8 heads, 4 key/value heads, 4 experts, vocabulary 128 (or the multiple of 64 above the
largest special token id). Needs transformers (the GPU machine); nothing here is used by ckpt
itself (the model class for a model type: python/ckpt/hf_plans.py's model_class).
"""
import copy
import re

# Field -> tiny value. A field is set only where the config already has it.
SIZES = {
    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 8,
    "num_key_value_heads": 4, "head_dim": 8, "max_position_embeddings": 128,
    "moe_intermediate_size": 32, "shared_expert_intermediate_size": 64, "expert_intermediate_size": 32,
    "num_experts": 4, "num_local_experts": 4, "n_routed_experts": 4, "num_experts_per_tok": 2, "moe_topk": 2,
    "n_shared_experts": 1, "num_shared_experts": 1, "n_group": 1, "topk_group": 1, "first_k_dense_replace": 1,
    "q_lora_rank": 32, "kv_lora_rank": 16, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 8,
    "n_embd": 64, "n_layer": 2, "n_layers": 2, "n_head": 8, "n_inner": 128, "d_model": 64, "num_layers": 2, "num_heads": 8,
    "ffn_dim": 128, "d_ff": 128, "n_positions": 128, "sliding_window": 32, "decoder_sparse_step": 1,
    "linear_num_key_heads": 4, "linear_num_value_heads": 8, "linear_key_head_dim": 8, "linear_value_head_dim": 8,
    "num_kv_heads": 4, "n_head_kv": 4, "rotary_dim": 4,
    # where the attention layers are among mamba/linear ones (jamba): layer 1 of 2 attends
    "attn_layer_period": 2, "attn_layer_offset": 1, "expert_layer_period": 2, "expert_layer_offset": 1,
    "full_attention_interval": 2, "num_kv_shared_layers": 0,
    "word_embed_proj_dim": 64, "embedding_size": 64, "projection_dim": 64, "attention_window": 32,
    # vision / audio towers
    "image_size": 32, "patch_size": 8, "num_channels": 3, "depth": 2, "embed_dim": 64, "out_hidden_size": 64,
    "spatial_merge_size": 2, "temporal_patch_size": 2, "vision_feature_layer": -1, "num_mel_bins": 16,
    "hidden_size_per_layer_input": 8, "text_hidden_size": 64, "vision_hidden_size": 64, "audio_hidden_size": 64,
    "encoder_attention_heads": 8, "decoder_attention_heads": 8, "encoder_layers": 2, "decoder_layers": 2,
    "encoder_ffn_dim": 128, "decoder_ffn_dim": 128, "moe_ffn_hidden_size": 32, "expert_ffn_hidden_size": 32,
    "encoder_hidden_size": 64, "projector_hidden_size": 64, "mm_hidden_size": 64,
    # convolutional audio codecs and tokenizers (mimi's grouped upsampling spans its hidden size)
    "num_filters": 8, "upsample_groups": 64, "num_timestamp_prediction_layers": 1,
}
# Per-stage lists (a convolutional tower's blocks per stage: vibevoice's tokenizers): each
# stage shrunk to this, the stage count kept.
PER_STAGE = {"depths": 1}
# A tiny model above this many parameters means a size field SIZES does not know: refused
# (tiny_model) rather than filling the machine's memory and disk. (gemma3n's timm vision
# tower, which no config field shrinks, is 300M of its 356M.)
MAX_PARAMETERS = 384 << 20
LIST_PER_LAYER = ("layer_types", "mlp_only_layers_list", "attention_types_per_layer")
TOKEN_FIELDS = ("pad_token_id", "bos_token_id", "eos_token_id", "sep_token_id", "decoder_start_token_id")
VOCAB = 128


# Fields a config leaves None where the model still needs a number (deepseek_v2's routed
# experts per token): set where the config has experts.
UNSET_NEEDED = {"num_experts_per_tok": 2}
# The multimodal rotary sections transformers' models take when the config names none
# (rope_parameters.get("mrope_section", [16, 24, 24]); glm's [8, 12, 12] in the same ratio).
MROPE_DEFAULT = [16, 24, 24]


def first_lines(e, limit):
    """`Type: message`'s first line, and the next where the first ends with ':'."""
    lines = [l for l in f"{type(e).__name__}: {e}".splitlines() if l.strip()]
    text = " ".join(l.strip() for l in lines[:2]) if len(lines) > 1 and lines[0].rstrip().endswith(":") else lines[0]
    return text[:limit]


def _special_ids(d):
    """Token ids a model embeds (image/video/audio placeholders and the like), anywhere in the
    config dict: the vocabulary must exceed them."""
    ids = []
    for key, value in d.items():
        if isinstance(value, dict):
            ids += _special_ids(value)
        elif isinstance(key, str) and key.endswith(("_token_id", "_token_index")) and isinstance(value, int) and not isinstance(value, bool) \
                and value >= 0:
            ids.append(value)
    return ids


def shrink_dict(d, vocab, mrope=False):
    """The config dict `d` (config.to_dict()) with every known size field shrunk, recursively
    through sub-config dicts; a field is changed only where the dict has it. A list as long
    as the layer count (layer_types, mlp_layer_types, ...) is cut to the new count."""
    old_layers = d.get("num_hidden_layers") or d.get("num_layers")
    out = {}
    for key, value in d.items():
        named = isinstance(key, str)  # a dict keyed by layer or label numbers has int keys
        if isinstance(value, dict) and ("model_type" in value or (named and key.endswith("_config"))):
            out[key] = shrink_dict(value, vocab, mrope)
        elif key in SIZES and isinstance(value, (int, float)) and not isinstance(value, bool) and value != 0:
            out[key] = type(value)(SIZES[key])  # a 0 stays: the feature is off (glm5_next's NoPE layers)
        elif named and key.startswith("vocab_size") and isinstance(value, int) and not isinstance(value, bool):
            out[key] = vocab
        elif key in PER_STAGE and isinstance(value, (list, tuple)) and all(isinstance(v, int) for v in value):
            out[key] = [PER_STAGE[key]] * len(value)
        else:
            out[key] = value
    layers = out.get("num_hidden_layers") or out.get("num_layers")
    for key, value in list(out.items()):
        if isinstance(value, list) and layers and value and (key in LIST_PER_LAYER or len(value) == old_layers):
            out[key] = _per_layer(value, layers)
    if isinstance(out.get("per_layer_config"), dict) and layers:
        out["per_layer_config"] = _per_layer_overrides(out["per_layer_config"], d.get("layer_types"),
                                                       out.get("layer_types"), layers)
    if "kv_lora_rank" in out and "num_key_value_heads" in out:
        # multi-head latent attention: keys have every head (transformers' own configs say
        # num_key_value_heads = num_attention_heads; sdpa would repeat them otherwise)
        out["num_key_value_heads"] = out.get("num_attention_heads", SIZES["num_attention_heads"])
    if isinstance(out.get("partial_rotary_factor"), float) and not _even_rotary(out["partial_rotary_factor"]):
        out["partial_rotary_factor"] = 0.5
    for key, value in UNSET_NEEDED.items():
        if key in out and out[key] is None and any(k in out for k in ("n_routed_experts", "num_experts", "num_local_experts")):
            out[key] = value
    _fit_mrope(out, mrope)
    if out.get("mlp_only_layers"):
        out["mlp_only_layers"] = []
    for key in TOKEN_FIELDS:
        if isinstance(out.get(key), int) and out[key] >= vocab:
            out[key] = 0 if key == "pad_token_id" else 2
    return out


def _per_layer_overrides(overrides, old_types, new_types, layers):
    """A per-layer override dict ({layer index: {field: value}}: gemma4's full-attention
    layers, neomme) for the tiny layer count: each tiny layer takes the overrides of the first
    old layer of its type (its layer_types entry), else none; the overrides' sizes shrunk."""
    by_index = {int(k): v for k, v in overrides.items() if str(k).lstrip("-").isdigit()}
    out = {}
    for i in range(layers):
        if old_types and new_types and i < len(new_types):
            same = [j for j, t in enumerate(old_types) if t == new_types[i] and j in by_index]
            source = same[0] if same else None
        else:
            source = i if i in by_index else None
        if source is not None and isinstance(by_index[source], dict):
            out[i] = {k: (type(v)(SIZES[k]) if k in SIZES and isinstance(v, int) and not isinstance(v, bool) else v)
                      for k, v in by_index[source].items()}
    return out


def _per_layer(value, layers):
    """A per-layer list cut to `layers` entries keeping one layer of each kind first (a
    hybrid model's full-attention layer among its linear-attention ones), then the pattern."""
    if any(isinstance(v, (list, dict)) for v in value):
        return (value * layers)[:layers]
    first = list(dict.fromkeys(value))[:layers]
    return first + (value * layers)[:layers - len(first)]


def _even_rotary(factor, head_dim=SIZES["head_dim"]):
    """Whether `factor` of the tiny head dimension is a whole, even number of rotary dims."""
    dims = head_dim * factor
    return dims == int(dims) and int(dims) % 2 == 0 and dims > 0


ROPE_KEYS = ("rope_parameters", "rope_scaling")


def _fit_mrope(d, mrope):
    """Multimodal rotary sections (`mrope_section`, summing to half the rotary dims) rescaled
    to the tiny head in every rope dict of `d` (one per layer type where rope_parameters has
    them); where the model reads sections (`mrope`) but its rope parameters name none, the
    model's default, rescaled."""
    head_dim = d.get("head_dim") or (d.get("hidden_size", 0) // max(1, d.get("num_attention_heads", 1)))
    if not head_dim:
        return
    for key, value in list(d.items()):
        if not isinstance(value, dict):
            continue
        if key in ROPE_KEYS and value and all(isinstance(v, dict) for v in value.values()):  # per layer type
            d[key] = {kind: _fitted_rope(rope, head_dim, 1.0, mrope, whole_pairs=True) for kind, rope in value.items()}
        else:
            d[key] = _fitted_rope(value, head_dim, d.get("partial_rotary_factor", 1.0), mrope and key in ROPE_KEYS)


def _fitted_rope(rope, head_dim, factor, add_default, whole_pairs=False):
    """A copy of one rope dict for the tiny head: with `whole_pairs`, a rotary factor turning a
    whole multiple of 4 dims (two M-RoPE axes alternate pairs: neomme); the default sections
    where `add_default` and it has none; its sections rescaled (largest remainders, same order)
    to half the rotary dims (its own factor, else `factor`)."""
    rope = dict(rope)
    if whole_pairs and isinstance(rope.get("partial_rotary_factor"), float) and (head_dim * rope["partial_rotary_factor"]) % 4:
        rope["partial_rotary_factor"] = 0.5
    if add_default and "mrope_section" not in rope:
        rope["mrope_section"] = list(MROPE_DEFAULT)
    sections = rope.get("mrope_section")
    if not isinstance(sections, list):
        return rope
    target = int(head_dim * (rope.get("partial_rotary_factor", factor) or 1.0)) // 2
    total = sum(sections)
    if total and total != target:
        exact = [s * target / total for s in sections]
        fitted = [int(x) for x in exact]
        for i in sorted(range(len(exact)), key=lambda i: exact[i] - fitted[i], reverse=True)[:target - sum(fitted)]:
            fitted[i] += 1
        rope["mrope_section"] = fitted
    return rope


def _reads_mrope(model_type, d):
    """Whether the modeling code of `model_type` (or of its sub-configs' types) reads
    mrope_section: then its default applies where the config has none."""
    import importlib
    try:
        from transformers.models.auto.configuration_auto import model_type_to_module_name
    except ImportError:  # a transformers without per-model modules: nothing reads sections
        return False
    types = {model_type} | {v["model_type"] for v in d.values() if isinstance(v, dict) and isinstance(v.get("model_type"), str)}
    for mt in types:
        name = model_type_to_module_name(mt)
        try:
            module = importlib.import_module(f"transformers.models.{name}.modeling_{name}")
            with open(module.__file__) as f:
                if "mrope_section" in f.read():
                    return True
        except (ImportError, OSError):
            continue
    return False


def tiny_config(model_type, text_config_key=None, **overrides):
    """A config of `model_type` with transformers' defaults shrunk (see SIZES); `overrides`
    given to the constructor (so that what the config derives from them at init, such as the
    tied-embedding plan rule, follows), at the top and in the `text_config_key` sub-config."""
    import transformers
    default = transformers.AutoConfig.for_model(model_type)
    d = default.to_dict()
    vocab = -(-max([VOCAB] + [i + 1 for i in _special_ids(d)]) // 64) * 64  # a multiple of 64: any TP size divides it
    d = shrink_dict(d, vocab, _reads_mrope(model_type, d))
    d.pop("transformers_version", None)
    d.update(overrides)
    if text_config_key and isinstance(d.get(text_config_key), dict):
        d[text_config_key].update(overrides)
    try:
        return type(default).from_dict(d)
    except Exception as refused:
        first = refused
    for _ in range(4):  # what a config class's own validation asks for, a refusal at a time
        fixes = [fix for refusal, fix in REFUSAL_FIXES if refusal in str(first)]
        if not fixes:
            break
        d = fixes[0](d, str(first))
        try:
            return type(default).from_dict(d)
        except Exception as refused:
            first = refused
    # a config class whose from_dict refuses its own to_dict: kwargs
    kwargs = {k: v for k, v in d.items() if k not in ("model_type", "architectures")}
    try:
        return transformers.AutoConfig.for_model(model_type, **kwargs)
    except Exception:  # sub-configs as the class's defaults
        flat = {k: v for k, v in kwargs.items() if not isinstance(v, dict)}
        try:
            return transformers.AutoConfig.for_model(model_type, **flat)
        except Exception as second:
            raise RuntimeError(f"from_dict: {first}; for_model(**sizes): {second}") from second


def _all_heads_keyed(d):
    """`d` with num_key_value_heads = num_attention_heads, in it and its sub-configs."""
    out = {k: _all_heads_keyed(v) if isinstance(v, dict) else v for k, v in d.items()}
    if "num_key_value_heads" in out and "num_attention_heads" in out:
        out["num_key_value_heads"] = out["num_attention_heads"]
    return out


def _mamba_heads_fit(d):
    """`d` with 8 Mamba heads that together span the mixer's width (mamba_expand x hidden)."""
    out = {k: _mamba_heads_fit(v) if isinstance(v, dict) else v for k, v in d.items()}
    if isinstance(out.get("mamba_n_heads"), int) and isinstance(out.get("hidden_size"), int):
        out["mamba_n_heads"] = 8
        out["mamba_d_head"] = int(out.get("mamba_expand") or 2) * out["hidden_size"] // 8
    return out


# A validation that names the field and the value it must have: "`adaptor_config.
# intermediate_size` (32) must equal `text_config.hidden_size // 4` (16)." (fun_asr_nano).
NAMED_VALUE = re.compile(r"`([\w.]+)` \(-?\d+\) must (?:equal|match) `[^`]+` \((-?\d+)\)")


def _named_value_set(d, refusal):
    """`d` with the field the refusal names set to the value it asks for."""
    found = NAMED_VALUE.search(refusal)
    out = copy.deepcopy(d)
    if found:
        *parents, leaf = found.group(1).split(".")
        node = out
        for p in parents:
            node = node.setdefault(p, {}) if isinstance(node, dict) else {}
        if isinstance(node, dict):
            node[leaf] = int(found.group(2))
    return out


# (text of a config class's refusal, the change that meets it given `d` and the refusal),
# tried in turn where the shrunk config is refused: a model without grouped-query attention
# (esmc), Mamba heads that must span the mixer (bamba, granitemoehybrid), a field that must
# have a value another field gives.
REFUSAL_FIXES = [
    ("num_key_value_heads", lambda d, _: _all_heads_keyed(d)),
    ("Mamba head state do not match", lambda d, _: _mamba_heads_fit(d)),
    ("must equal `", _named_value_set),
    ("must match `", _named_value_set),
]


def tiny_model(model_cls, config):
    """model_cls._from_config(config), first counted on the meta device: ValueError where it
    would exceed MAX_PARAMETERS (naming the largest tensors), so that no huge model is built."""
    import torch
    if not hasattr(torch.device, "__enter__"):  # torch < 2.0: no meta-device context; build and count
        meta = model_cls._from_config(config)
    else:
        with torch.device("meta"):
            meta = model_cls._from_config(config)
    sizes = sorted(((p.numel(), n) for n, p in meta.named_parameters()), reverse=True)
    total = sum(n for n, _ in sizes)
    if total > MAX_PARAMETERS:
        raise ValueError(f"the tiny config is not tiny: {total / 1e6:.0f}M parameters (largest: "
                         + ", ".join(f"{n} {c / 1e6:.1f}M" for c, n in sizes[:3]) + "); hf_tiny.SIZES lacks a size field")
    del meta
    return model_cls._from_config(config)
