"""Tensor-parallel plans for Hugging Face model families, as {regex: ckpt.Rule}.

Megatron-style: attention q/k/v and the MLP up-projection are column parallel (split the
output dim of the [out, in] weight and its bias); attention output and MLP down-projection
are row parallel (split the input dim; bias replicated); embeddings are split along the
vocabulary (uneven allowed); everything else (norms, position embeddings) is replicated.
"""
from . import Rule, column, row

_VOCAB = column(0, allow_uneven=True)

GPT_NEO = {
    r"attn\.attention\.[qkv]_proj\.weight$": column(),
    r"attn\.attention\.out_proj\.weight$": row(),
    r"mlp\.c_fc\.(weight|bias)$": column(),
    r"mlp\.c_proj\.weight$": row(),
    r"(^|\.)wte\.weight$": _VOCAB,
    r"^lm_head\.weight$": _VOCAB,
}

# GPT-2 uses Conv1D: weights are [in, out], so column parallel splits dim 1 and the fused
# c_attn (q, k, v along the output dim) splits each of its 3 chunks.
GPT2 = {
    r"attn\.c_attn\.weight$": Rule("split", 1, 3),
    r"attn\.c_attn\.bias$": Rule("split", 0, 3),
    r"attn\.c_proj\.weight$": Rule("split", 0),
    r"mlp\.c_fc\.weight$": Rule("split", 1),
    r"mlp\.c_fc\.bias$": Rule("split", 0),
    r"mlp\.c_proj\.weight$": Rule("split", 0),
    r"(^|\.)wte\.weight$": _VOCAB,
}

LLAMA = {
    r"self_attn\.[qkv]_proj\.weight$": column(),
    r"self_attn\.o_proj\.weight$": row(),
    r"mlp\.(gate|up)_proj\.weight$": column(),
    r"mlp\.down_proj\.weight$": row(),
    r"embed_tokens\.weight$": _VOCAB,
    r"^lm_head\.weight$": _VOCAB,
}


# Family names as the C++ TpPlan::BuiltIn knows them (used when the CUDA engine is absent).
BY_FAMILY = {"gpt-neo": GPT_NEO, "gpt2": GPT2, "llama": LLAMA, "mistral": LLAMA}


def from_file(path):
    """A {regex: Rule} plan from a JSON plan file whose rules are "replicate" or
    {"split": d, "chunks": k, "uneven": b} (named rules such as "column" need the CUDA
    engine's TpPlan)."""
    import json
    import os
    from . import InvalidArgument
    if not os.path.isfile(path):
        raise InvalidArgument(f"unknown plan '{path}': not a known family nor a file")
    with open(path) as f:
        spec = json.load(f)
    plan = {}
    for entry in spec.get("rules", []):
        rule = entry["rule"]
        if rule == "replicate":
            plan[entry["pattern"]] = Rule("replicate")
        elif isinstance(rule, dict) and "split" in rule:
            plan[entry["pattern"]] = Rule("split", rule["split"], rule.get("chunks", 1), rule.get("uneven", False))
        else:
            raise InvalidArgument(f"plan rule {rule!r} needs the CUDA engine")
    return plan
