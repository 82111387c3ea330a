"""Hand-made checkpoints with Hugging Face names and config.json for every built-in family,
and what each rank must hold under each convention, computed here with plain torch slicing
(the reference: written from docs/tp-plans.md and transformers' source, not from the plan
engine). Used by tests/python/test_plans.py and tests/plan/tp_families_test.cc.

    python3 tp_cases.py OUT_DIR [FAMILY...]
writes OUT_DIR/<family>/model.safetensors, config.json, expected.safetensors (keys
"<convention>/w<world>/r<rank>/<name>") and cases.json ({convention: [worlds]}).
"""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
import make_checkpoint  # noqa: E402

H, NH, KV, HD, I, V, L, E, IM = 16, 4, 2, 4, 24, 37, 2, 4, 8  # V: uneven over 2 and 4
WORLDS = (1, 2, 4)


# ---- splitting arithmetic, written out -------------------------------------------------
def part_tensor_split(n, r, w):  # torch.tensor_split: the first n % w parts one longer
    base, extra = divmod(n, w)
    begin = r * base + min(r, extra)
    return begin, base + (1 if r < extra else 0)


def part_chunk(n, r, w):  # torch.chunk / DTensor Shard: ceil-sized parts, late ones short
    size = -(-n // w)
    begin = min(n, r * size)
    return begin, min(size, n - begin)


def even(n, r, w):
    assert n % w == 0, (n, w)
    return r * (n // w), n // w


def take(t, dim, span):
    return t.narrow(dim, span[0], span[1])


def heads_rows(t, n, r, w, dim=0):
    """Whole heads along `dim`: n % w == 0, or each of n < w heads held by w / n ranks."""
    rows = t.shape[dim] // n
    if n >= w:
        return take(t, dim, (r * (n // w) * rows, (n // w) * rows))
    h = r * n // w
    return take(t, dim, (h * rows, rows))


# ---- roles: what a tensor is, and what each convention gives a rank ----------------------
def megatron(role, t, r, w):
    kind = role[0]
    if kind == "rep":
        return t
    if kind == "vocab":
        return take(t, 0, part_tensor_split(t.shape[0], r, w))
    if kind == "heads":  # ("heads", n[, dim])
        return heads_rows(t, role[1], r, w, role[2] if len(role) > 2 else 0)
    if kind == "col":
        return take(t, 0, even(t.shape[0], r, w))
    if kind == "row":
        return t if t.dim() == 1 else take(t, t.dim() - 1, even(t.shape[-1], r, w))
    if kind == "sections":  # dim 0 sections [(rows, heads)], each split by its heads
        parts, begin = [], 0
        for rows, n in role[1]:
            parts.append(heads_rows(t[begin:begin + rows], n, r, w))
            begin += rows
        return torch.cat(parts, 0)
    if kind == "chunks":  # ("chunks", k, dim): k fused chunks along dim, each split evenly
        k, dim = role[1], role[2]
        return torch.cat([take(c, dim, even(c.shape[dim], r, w)) for c in t.chunk(k, dim)], dim)
    if kind == "groups":  # whole groups along dim 0
        return take(t, 0, even(t.shape[0], r, w))
    if kind == "conv_qkv":  # GPT-2 c_attn [in, 3 * out] (or bias [3 * out]): q, k, v by heads
        dim = t.dim() - 1
        return torch.cat([heads_rows(c, role[1], r, w, dim) for c in t.chunk(3, dim)], dim)
    if kind == "conv_col":
        return take(t, t.dim() - 1, even(t.shape[-1], r, w))
    if kind == "conv_row":
        return t if t.dim() == 1 else take(t, 0, even(t.shape[0], r, w))
    raise ValueError(role)


def hf(role, t, r, w, name):
    kind = role[0]
    if kind == "rep":
        return t
    if kind == "colwise":  # weight dim -2, 1-d dim -1; ceil parts
        dim = t.dim() - 2 if t.dim() > 1 else 0
        return take(t, dim, part_chunk(t.shape[dim], r, w))
    if kind == "rowwise":  # weight dim -1, bias replicated, other 1-d split
        if t.dim() == 1 and name.endswith("bias"):
            return t
        return take(t, t.dim() - 1, part_chunk(t.shape[-1], r, w))
    if kind == "embedding_rowwise":
        return take(t, 0, part_chunk(t.shape[0], r, w))
    if kind == "packed_colwise":  # dim -2 holds [gate; up]: each block's part
        dim = t.dim() - 2
        return torch.cat([take(c, dim, even(c.shape[dim], r, w)) for c in t.chunk(2, dim)], dim)
    if kind == "grouped_gemm":
        return take(t, 0, even(t.shape[0], r, w))
    raise ValueError(role)


class Model:
    def __init__(self, family, config, seed):
        self.family, self.config = family, config
        self.g = torch.Generator().manual_seed(seed)
        self.tensors = {}   # name -> tensor
        self.meg = {}       # name -> megatron role
        self.hfr = {}       # name -> hf role
        self.experts = []   # (layer prefix, expert, kind, name): per-expert MoE sources
        self.hf_ok = True

    def add(self, name, shape, meg=("rep",), hf=("rep",), dtype=torch.float32):
        self.tensors[name] = torch.randn(*shape, generator=self.g).to(dtype)
        self.meg[name], self.hfr[name] = meg, hf

    # Expected state dicts -------------------------------------------------------------
    def expect(self, convention, r, w):
        out = {}
        if convention == "megatron":
            for name, t in self.tensors.items():
                out[name] = megatron(self.meg[name], t, r, w)
            return out
        fused = {}
        for name, t in self.tensors.items():
            role = self.hfr[name]
            if role[0] == "expert":  # ("expert", target, expert, slot, target_style)
                fused.setdefault(role[1], {})[(role[2], role[3])] = (t, role[4])
                continue
            if role[0] == "rename":  # ("rename", new name[, style]): transformers renames at load
                out[role[1]] = t if len(role) < 3 else hf((role[2],), t, r, w, role[1])
                continue
            out[name] = hf(role, t, r, w, name)
        for target, pieces in fused.items():
            # transformers' conversion: stack experts (dim 0), concat gate then up (dim 1)
            experts = sorted({e for e, _ in pieces})
            slots = sorted({s for _, s in pieces})
            stacked = torch.stack([torch.cat([pieces[(e, s)][0] for s in slots], 0) for e in experts], 0)
            style = next(iter(pieces.values()))[1]
            out[target] = stacked if style == "rep" else hf((style,), stacked, r, w, target)
        return out


def llama_like(family, seed, *, tie=False, qkv_bias=False, o_bias=False, qk_norm=None, mlp="gud", moe=None,
               hf_attn=("colwise", "rowwise"), dtype=torch.float32, extra_config=None):
    cfg = {"model_type": family, "architectures": [], "hidden_size": H, "num_attention_heads": NH,
           "num_key_value_heads": KV, "head_dim": HD, "num_hidden_layers": L, "intermediate_size": I,
           "vocab_size": V, "tie_word_embeddings": tie}
    cfg.update(extra_config or {})
    m = Model(family, cfg, seed)
    m.add("model.embed_tokens.weight", (V, H), ("vocab",), ("embedding_rowwise",) if tie else ("rep",), dtype)
    for i in range(L):
        p = f"model.layers.{i}."
        a = p + "self_attn."
        cw, rw = hf_attn
        if mlp == "phi3":
            m.add(a + "qkv_proj.weight", ((NH + 2 * KV) * HD, H),
                  ("sections", [(NH * HD, NH), (KV * HD, KV), (KV * HD, KV)]), ("colwise",), dtype)
        else:
            for proj, n in (("q", NH), ("k", KV), ("v", KV)):
                m.add(a + f"{proj}_proj.weight", (n * HD, H), ("heads", n), (cw,), dtype)
                if qkv_bias:
                    m.add(a + f"{proj}_proj.bias", (n * HD,), ("heads", n), (cw,), dtype)
        m.add(a + "o_proj.weight", (H, NH * HD), ("row",), (rw,), dtype)
        if o_bias:
            m.add(a + "o_proj.bias", (H,), ("rep",), (rw,), dtype)
        if qk_norm == "head_dim":
            m.add(a + "q_norm.weight", (HD,), dtype=dtype)
            m.add(a + "k_norm.weight", (HD,), dtype=dtype)
        elif qk_norm == "full":  # olmo2: over the whole projection
            m.add(a + "q_norm.weight", (NH * HD,), dtype=dtype)
            m.add(a + "k_norm.weight", (KV * HD,), dtype=dtype)
        elif qk_norm == "per_head":  # cohere: [heads, head_dim]
            m.add(a + "q_norm.weight", (NH, HD), ("heads", NH), dtype=dtype)
            m.add(a + "k_norm.weight", (KV, HD), ("heads", KV), dtype=dtype)
        m.add(p + "input_layernorm.weight", (H,), dtype=dtype)
        m.add(p + "post_attention_layernorm.weight", (H,), dtype=dtype)
        if moe:
            moe(m, i, p)
        elif mlp == "gud":
            m.add(p + "mlp.gate_proj.weight", (I, H), ("col",), ("colwise",), dtype)
            m.add(p + "mlp.up_proj.weight", (I, H), ("col",), ("colwise",), dtype)
            m.add(p + "mlp.down_proj.weight", (H, I), ("row",), ("rowwise",), dtype)
        elif mlp == "starcoder2":
            m.add(p + "mlp.c_fc.weight", (I, H), ("col",), ("colwise",), dtype)
            m.add(p + "mlp.c_fc.bias", (I,), ("col",), ("colwise",), dtype)
            m.add(p + "mlp.c_proj.weight", (H, I), ("row",), ("rowwise",), dtype)
            m.add(p + "mlp.c_proj.bias", (H,), ("rep",), ("rowwise",), dtype)
        elif mlp == "phi3":
            m.add(p + "mlp.gate_up_proj.weight", (2 * I, H), ("chunks", 2, 0), ("colwise",), dtype)
            m.add(p + "mlp.down_proj.weight", (H, I), ("row",), ("rowwise",), dtype)
    m.add("model.norm.weight", (H,), dtype=dtype)
    if not tie:
        m.add("lm_head.weight", (V, H), ("vocab",), ("colwise",), dtype)
    return m


def per_expert(m, p, names, hf_gate_up, hf_down, target_prefix, router):
    """Per-expert MoE tensors (names: gate, up, down leaf names)."""
    gate, up, down = names
    m.add(router, (E, H))
    for e in range(E):
        for slot, leaf in ((0, gate), (1, up)):
            n = f"{p}experts.{e}.{leaf}.weight"
            m.add(n, (IM, H), ("col",), ("expert", target_prefix + "experts.gate_up_proj", e, slot, hf_gate_up))
        n = f"{p}experts.{e}.{down}.weight"
        m.add(n, (H, IM), ("row",), ("expert", target_prefix + "experts.down_proj", e, 0, hf_down))


def build(family):
    seed = sum(map(ord, family))
    if family in ("llama", "mistral", "granite"):
        return llama_like(family, seed)
    if family == "qwen2":
        return llama_like(family, seed, tie=True, qkv_bias=True)
    if family == "qwen3":
        return llama_like(family, seed, qk_norm="head_dim", dtype=torch.bfloat16)
    if family == "gemma":
        return llama_like(family, seed, tie=True)
    if family == "gemma2":
        m = llama_like(family, seed, tie=True)
        for i in range(L):
            m.add(f"model.layers.{i}.pre_feedforward_layernorm.weight", (H,))
            m.add(f"model.layers.{i}.post_feedforward_layernorm.weight", (H,))
        return m
    if family == "gemma3":
        return llama_like("gemma3_text", seed, tie=True, qk_norm="head_dim")
    if family == "olmo2":
        return llama_like(family, seed, qk_norm="full", hf_attn=("colwise", "rowwise"))
    if family == "cohere":
        return llama_like(family, seed, tie=True, qk_norm="per_head", extra_config={"use_qk_norm": True})
    if family == "starcoder2":
        return llama_like(family, seed, tie=True, qkv_bias=True, o_bias=True, mlp="starcoder2")
    if family == "phi3":
        return llama_like(family, seed, mlp="phi3")
    if family == "mixtral":
        def moe(m, i, p):
            per_expert(m, p + "block_sparse_moe.", ("w1", "w3", "w2"), "packed_colwise", "rowwise",
                       p + "mlp.", p + "block_sparse_moe.gate.weight")
            m.hfr[p + "block_sparse_moe.gate.weight"] = ("rename", p + "mlp.gate.weight")
        return llama_like(family, seed, moe=moe, extra_config={"num_local_experts": E, "num_experts_per_tok": 2})
    if family == "qwen2_moe":
        def moe(m, i, p):
            per_expert(m, p + "mlp.", ("gate_proj", "up_proj", "down_proj"), "rep", "rep", p + "mlp.",
                       p + "mlp.gate.weight")
            m.add(p + "mlp.shared_expert.gate_proj.weight", (I, H), ("col",))
            m.add(p + "mlp.shared_expert.up_proj.weight", (I, H), ("col",))
            m.add(p + "mlp.shared_expert.down_proj.weight", (H, I), ("row",))
            m.add(p + "mlp.shared_expert_gate.weight", (1, H))
        return llama_like(family, seed, qkv_bias=True, moe=moe,
                          extra_config={"num_experts": E, "moe_intermediate_size": IM})
    if family == "qwen3_moe":
        def moe(m, i, p):
            per_expert(m, p + "mlp.", ("gate_proj", "up_proj", "down_proj"), "packed_colwise", "rowwise", p + "mlp.",
                       p + "mlp.gate.weight")
        return llama_like(family, seed, qk_norm="head_dim", moe=moe,
                          extra_config={"num_experts": E, "moe_intermediate_size": IM})
    if family == "deepseek_v3":
        return deepseek(seed)
    if family == "gpt_oss":
        return gpt_oss(seed)
    return older(family, seed)


def deepseek(seed):
    QL, KVL, NOPE, ROPE, VD = 8, 8, 4, 2, 4
    cfg = {"model_type": "deepseek_v3", "hidden_size": H, "num_attention_heads": NH, "num_key_value_heads": NH,
           "num_hidden_layers": L, "intermediate_size": I, "moe_intermediate_size": IM, "vocab_size": V,
           "n_routed_experts": E, "n_shared_experts": 1, "q_lora_rank": QL, "kv_lora_rank": KVL,
           "qk_nope_head_dim": NOPE, "qk_rope_head_dim": ROPE, "v_head_dim": VD, "head_dim": ROPE,
           "first_k_dense_replace": 1, "tie_word_embeddings": False}
    m = Model("deepseek_v3", cfg, seed)
    m.add("model.embed_tokens.weight", (V, H), ("vocab",))
    for i in range(L):
        p = f"model.layers.{i}."
        a = p + "self_attn."
        m.add(a + "q_a_proj.weight", (QL, H))
        m.add(a + "q_a_layernorm.weight", (QL,))
        m.add(a + "q_b_proj.weight", (NH * (NOPE + ROPE), QL), ("heads", NH))  # hf: whole (transformers 5.17)
        m.add(a + "kv_a_proj_with_mqa.weight", (KVL + ROPE, H))
        m.add(a + "kv_a_layernorm.weight", (KVL,))
        m.add(a + "kv_b_proj.weight", (NH * (NOPE + VD), KVL), ("heads", NH))
        m.add(a + "o_proj.weight", (H, NH * VD), ("row",))
        m.add(p + "input_layernorm.weight", (H,))
        m.add(p + "post_attention_layernorm.weight", (H,))
        if i == 0:
            m.add(p + "mlp.gate_proj.weight", (I, H), ("col",), ("colwise",))
            m.add(p + "mlp.up_proj.weight", (I, H), ("col",), ("colwise",))
            m.add(p + "mlp.down_proj.weight", (H, I), ("row",), ("rowwise",))
        else:
            per_expert(m, p + "mlp.", ("gate_proj", "up_proj", "down_proj"), "packed_colwise", "rowwise", p + "mlp.",
                       p + "mlp.gate.weight")
            m.add(p + "mlp.gate.e_score_correction_bias", (E,))
            m.add(p + "mlp.shared_experts.gate_proj.weight", (IM, H), ("col",), ("colwise",))
            m.add(p + "mlp.shared_experts.up_proj.weight", (IM, H), ("col",), ("colwise",))
            m.add(p + "mlp.shared_experts.down_proj.weight", (H, IM), ("row",), ("rowwise",))
    m.add("model.norm.weight", (H,))
    m.add("lm_head.weight", (V, H), ("vocab",), ("colwise",))
    return m


def gpt_oss(seed):
    cfg = {"model_type": "gpt_oss", "hidden_size": H, "num_attention_heads": NH, "num_key_value_heads": KV,
           "head_dim": HD, "num_hidden_layers": L, "intermediate_size": IM, "vocab_size": V,
           "num_local_experts": E, "tie_word_embeddings": False}
    m = Model("gpt_oss", cfg, seed)
    # "hf": transformers 5.17 holds every attention and expert tensor whole on every rank
    # (measured with tools/gpu/check_hf_families.py); the head is split like llama's.
    m.add("model.embed_tokens.weight", (V, H), ("vocab",))
    for i in range(L):
        p = f"model.layers.{i}."
        a = p + "self_attn."
        for proj, n in (("q", NH), ("k", KV), ("v", KV)):
            m.add(a + f"{proj}_proj.weight", (n * HD, H), ("heads", n))
            m.add(a + f"{proj}_proj.bias", (n * HD,), ("heads", n))
        m.add(a + "o_proj.weight", (H, NH * HD), ("row",))
        m.add(a + "o_proj.bias", (H,), ("rep",))
        m.add(a + "sinks", (NH,), ("heads", NH))
        m.add(p + "input_layernorm.weight", (H,))
        m.add(p + "post_attention_layernorm.weight", (H,))
        m.add(p + "mlp.router.weight", (E, H))
        m.add(p + "mlp.router.bias", (E,))
        x = p + "mlp.experts."
        # gate_up_proj [E, H, 2I] interleaves gate and up columns: whole pairs per rank
        m.add(x + "gate_up_proj", (E, H, 2 * IM), ("heads", IM, 2))
        m.add(x + "gate_up_proj_bias", (E, 2 * IM), ("heads", IM, 1))
        m.add(x + "down_proj", (E, IM, H), ("heads", IM, 1))
        m.add(x + "down_proj_bias", (E, H), ("rep",))
    m.add("model.norm.weight", (H,))
    m.add("lm_head.weight", (V, H), ("vocab",), ("colwise",))
    return m


def older(family, seed):
    cfg = {"model_type": {"gpt-neo": "gpt_neo"}.get(family, family), "vocab_size": V, "num_hidden_layers": L}
    heads_key = {"gpt-neo": "num_heads", "gpt2": "n_head", "gptj": "n_head", "bloom": "n_head"}.get(
        family, "num_attention_heads")
    cfg[heads_key] = NH
    cfg[{"gpt2": "n_embd", "gptj": "n_embd"}.get(family, "hidden_size")] = H
    if family == "gpt-neo":
        cfg["num_layers"] = cfg.pop("num_hidden_layers")
    if family in ("gpt2", "gptj", "bloom"):
        cfg["n_layer"] = cfg.pop("num_hidden_layers")
    m = Model(family, cfg, seed)
    m.hf_ok = family == "gpt_neox"
    if family == "gpt-neo":
        m.add("transformer.wte.weight", (V, H), ("vocab",))
        m.add("transformer.wpe.weight", (32, H))
        for i in range(L):
            p = f"transformer.h.{i}."
            m.add(p + "ln_1.weight", (H,))
            for proj in "qkv":
                m.add(p + f"attn.attention.{proj}_proj.weight", (H, H), ("heads", NH))
            m.add(p + "attn.attention.out_proj.weight", (H, H), ("row",))
            m.add(p + "attn.attention.out_proj.bias", (H,), ("rep",))
            m.add(p + "mlp.c_fc.weight", (I, H), ("col",))
            m.add(p + "mlp.c_fc.bias", (I,), ("col",))
            m.add(p + "mlp.c_proj.weight", (H, I), ("row",))
            m.add(p + "mlp.c_proj.bias", (H,), ("rep",))
        m.add("transformer.ln_f.weight", (H,))
    elif family == "gpt2":
        m.add("transformer.wte.weight", (V, H), ("vocab",))
        m.add("transformer.wpe.weight", (32, H))
        for i in range(L):
            p = f"transformer.h.{i}."
            m.add(p + "ln_1.weight", (H,))
            m.add(p + "attn.c_attn.weight", (H, 3 * H), ("conv_qkv", NH))
            m.add(p + "attn.c_attn.bias", (3 * H,), ("conv_qkv", NH))
            m.add(p + "attn.c_proj.weight", (H, H), ("conv_row",))
            m.add(p + "attn.c_proj.bias", (H,), ("conv_row",))
            m.add(p + "mlp.c_fc.weight", (H, I), ("conv_col",))
            m.add(p + "mlp.c_fc.bias", (I,), ("conv_col",))
            m.add(p + "mlp.c_proj.weight", (I, H), ("conv_row",))
            m.add(p + "mlp.c_proj.bias", (H,), ("conv_row",))
        m.add("transformer.ln_f.weight", (H,))
    elif family == "gptj":
        m.add("transformer.wte.weight", (V, H), ("vocab",))
        for i in range(L):
            p = f"transformer.h.{i}."
            m.add(p + "ln_1.weight", (H,))
            for proj in "qkv":
                m.add(p + f"attn.{proj}_proj.weight", (H, H), ("heads", NH))
            m.add(p + "attn.out_proj.weight", (H, H), ("row",))
            m.add(p + "mlp.fc_in.weight", (I, H), ("col",))
            m.add(p + "mlp.fc_in.bias", (I,), ("col",))
            m.add(p + "mlp.fc_out.weight", (H, I), ("row",))
            m.add(p + "mlp.fc_out.bias", (H,), ("rep",))
        m.add("transformer.ln_f.weight", (H,))
        m.add("lm_head.weight", (V, H), ("vocab",))
        m.add("lm_head.bias", (V,), ("vocab",))
    elif family == "bloom":
        m.add("transformer.word_embeddings.weight", (V, H), ("vocab",))
        m.add("transformer.word_embeddings_layernorm.weight", (H,))
        for i in range(L):
            p = f"transformer.h.{i}."
            m.add(p + "input_layernorm.weight", (H,))
            m.add(p + "self_attention.query_key_value.weight", (3 * H, H), ("heads", NH))
            m.add(p + "self_attention.query_key_value.bias", (3 * H,), ("heads", NH))
            m.add(p + "self_attention.dense.weight", (H, H), ("row",))
            m.add(p + "self_attention.dense.bias", (H,), ("rep",))
            m.add(p + "mlp.dense_h_to_4h.weight", (I, H), ("col",))
            m.add(p + "mlp.dense_h_to_4h.bias", (I,), ("col",))
            m.add(p + "mlp.dense_4h_to_h.weight", (H, I), ("row",))
            m.add(p + "mlp.dense_4h_to_h.bias", (H,), ("rep",))
        m.add("transformer.ln_f.weight", (H,))
    elif family == "opt":
        m.add("model.decoder.embed_tokens.weight", (V, H), ("vocab",))
        m.add("model.decoder.embed_positions.weight", (34, H))
        for i in range(L):
            p = f"model.decoder.layers.{i}."
            for proj in "qkv":
                m.add(p + f"self_attn.{proj}_proj.weight", (H, H), ("heads", NH))
                m.add(p + f"self_attn.{proj}_proj.bias", (H,), ("heads", NH))
            m.add(p + "self_attn.out_proj.weight", (H, H), ("row",))
            m.add(p + "self_attn.out_proj.bias", (H,), ("rep",))
            m.add(p + "self_attn_layer_norm.weight", (H,))
            m.add(p + "fc1.weight", (I, H), ("col",))
            m.add(p + "fc1.bias", (I,), ("col",))
            m.add(p + "fc2.weight", (H, I), ("row",))
            m.add(p + "fc2.bias", (H,), ("rep",))
        m.add("model.decoder.final_layer_norm.weight", (H,))
    elif family == "falcon":
        cfg.update({"multi_query": True, "new_decoder_architecture": False, "tie_word_embeddings": True})
        m.add("transformer.word_embeddings.weight", (V, H), ("vocab",))
        for i in range(L):
            p = f"transformer.h.{i}."
            m.add(p + "input_layernorm.weight", (H,))
            m.add(p + "self_attention.query_key_value.weight", ((NH + 2) * HD, H),
                  ("sections", [(NH * HD, NH), (HD, 1), (HD, 1)]))
            m.add(p + "self_attention.dense.weight", (H, H), ("row",))
            m.add(p + "mlp.dense_h_to_4h.weight", (I, H), ("col",))
            m.add(p + "mlp.dense_4h_to_h.weight", (H, I), ("row",))
        m.add("transformer.ln_f.weight", (H,))
    elif family == "gpt_neox":
        cfg["tie_word_embeddings"] = False
        m.add("gpt_neox.embed_in.weight", (V, H), ("vocab",))
        for i in range(L):
            p = f"gpt_neox.layers.{i}."
            m.add(p + "input_layernorm.weight", (H,))
            m.add(p + "input_layernorm.bias", (H,))
            m.add(p + "attention.query_key_value.weight", (3 * H, H), ("heads", NH), ("colwise",))
            m.add(p + "attention.query_key_value.bias", (3 * H,), ("heads", NH), ("colwise",))
            m.add(p + "attention.dense.weight", (H, H), ("row",), ("rowwise",))
            m.add(p + "attention.dense.bias", (H,), ("rep",), ("rowwise",))
            m.add(p + "mlp.dense_h_to_4h.weight", (I, H), ("col",), ("colwise",))
            m.add(p + "mlp.dense_h_to_4h.bias", (I,), ("col",), ("colwise",))
            m.add(p + "mlp.dense_4h_to_h.weight", (H, I), ("row",), ("rowwise",))
            m.add(p + "mlp.dense_4h_to_h.bias", (H,), ("rep",), ("rowwise",))
        m.add("gpt_neox.final_layer_norm.weight", (H,))
        # transformers 5.17 names the head lm_head (measured: tools/gpu/check_hf_families.py)
        m.add("embed_out.weight", (V, H), ("vocab",), ("rename", "lm_head.weight", "colwise"))
    else:
        raise ValueError(family)
    return m


FAMILIES = ["llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "gemma", "gemma2", "gemma3",
            "phi3", "olmo2", "starcoder2", "granite", "cohere", "gpt_neox", "falcon", "deepseek_v3", "gpt_oss",
            "gpt-neo", "gpt2", "gptj", "bloom", "opt"]


def write(out_dir, families=None):
    for family in families or FAMILIES:
        m = build(family)
        d = os.path.join(out_dir, family)
        os.makedirs(d, exist_ok=True)
        make_checkpoint.write_safetensors(os.path.join(d, "model.safetensors"), m.tensors)
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(m.config, f)
        # hf for a family transformers has no TP plan for: whole tensors at world 1 only.
        conventions = {"megatron": list(WORLDS), "hf": list(WORLDS) if m.hf_ok else [1]}
        expected = {}
        for conv, worlds in conventions.items():
            for w in worlds:
                for r in range(w):
                    for name, t in m.expect(conv, r, w).items():
                        expected[f"{conv}/w{w}/r{r}/{name}"] = t.contiguous()
        make_checkpoint.write_safetensors(os.path.join(d, "expected.safetensors"), expected)
        with open(os.path.join(d, "cases.json"), "w") as f:
            json.dump({"conventions": conventions}, f)


if __name__ == "__main__":
    write(sys.argv[1], sys.argv[2:] or None)
