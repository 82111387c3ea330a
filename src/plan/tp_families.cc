#include "plan/tp_families.h"

#include <map>
#include <optional>
#include <set>

#include <nlohmann/json.hpp>

#include "plan/hf_plans.h"

namespace ckpt::tp_families {

namespace {

using json = nlohmann::json;

// ---------------------------------------------------------------------------------------
// The model's config.json, as far as plans need it.

struct Config {
  bool present = false;
  std::string model_type;
  std::vector<std::string> architectures;
  std::optional<int64_t> heads, kv_heads, head_dim, hidden, layers, experts, intermediate, moe_intermediate;
  std::optional<bool> tie, multi_query, new_arch;
};

// A config value as an error message shows it: scalars as JSON (cut at 80 bytes), objects
// and arrays by kind only (a dump would recurse through whatever nesting the file has).
std::string Shown(const json& v) {
  if (v.is_object()) return "an object";
  if (v.is_array()) return "an array";
  std::string text = v.dump(-1, ' ', false, json::error_handler_t::replace);
  if (text.size() > 80) text = text.substr(0, 77) + "...";
  return text;
}

// A config value that must be a positive integer (a size or a count), `name` in errors.
Result<int64_t> PositiveInt(const json& v, const char* name) {
  if (!v.is_number_integer() || v.get<int64_t>() < 1 || v.get<int64_t>() > (int64_t{1} << 40))
    return InvalidArgument(std::string("config field '") + name + "' must be a positive integer, got " + Shown(v));
  return v.get<int64_t>();
}

Result<std::optional<int64_t>> IntField(const json& j, const std::vector<const char*>& names) {
  for (const char* n : names) {
    if (!j.contains(n) || j[n].is_null()) continue;
    CKPT_ASSIGN_OR_RETURN(auto v, PositiveInt(j[n], n));
    return std::optional<int64_t>(v);
  }
  return std::optional<int64_t>();
}

// A size transformers may give per layer (gemma3n's intermediate_size): a positive integer,
// or a list of them, which is that integer where every layer agrees and unknown otherwise.
Result<std::optional<int64_t>> PerLayerIntField(const json& j, const char* name) {
  if (!j.contains(name) || !j[name].is_array()) return IntField(j, {name});
  std::optional<int64_t> common;
  bool agree = true;
  for (const json& layer : j[name]) {
    if (layer.is_null())
      return InvalidArgument(std::string("config field '") + name + "' must be a positive integer or a list of them");
    CKPT_ASSIGN_OR_RETURN(auto v, PositiveInt(layer, name));
    agree = agree && (!common || *common == v);
    common = v;
  }
  return agree ? common : std::optional<int64_t>();
}

Result<std::optional<bool>> BoolField(const json& j, const char* name) {
  if (!j.contains(name) || j[name].is_null()) return std::optional<bool>();
  if (!j[name].is_boolean())
    return InvalidArgument(std::string("config field '") + name + "' must be true or false, got " + Shown(j[name]));
  return std::optional<bool>(j[name].get<bool>());
}

Result<Config> ParseConfig(const std::string& text) {
  Config c;
  if (text.empty()) return c;
  json j;
  try {
    j = json::parse(text);
  } catch (const std::exception& e) {
    return InvalidArgument(std::string("config is not valid JSON: ") + e.what());
  }
  if (!j.is_object()) return InvalidArgument("config must be a JSON object");
  c.present = true;
  if (j.contains("model_type")) {
    if (!j["model_type"].is_string()) return InvalidArgument("config field 'model_type' must be a string");
    c.model_type = j["model_type"].get<std::string>();
  }
  if (j.contains("architectures") && !j["architectures"].is_null()) {
    if (!j["architectures"].is_array()) return InvalidArgument("config field 'architectures' must be a list of strings");
    for (const auto& a : j["architectures"]) {
      if (!a.is_string()) return InvalidArgument("config field 'architectures' must be a list of strings");
      c.architectures.push_back(a.get<std::string>());
    }
  }
  CKPT_ASSIGN_OR_RETURN(c.heads, IntField(j, {"num_attention_heads", "n_head", "num_heads"}));
  CKPT_ASSIGN_OR_RETURN(c.kv_heads, IntField(j, {"num_key_value_heads", "num_kv_heads", "n_head_kv"}));
  // head_dim 0 is "not given" (transformers' default where the model derives it: glm5_next)
  const bool head_dim_unset = j.contains("head_dim") && j["head_dim"].is_number_integer() && j["head_dim"] == 0;
  if (!head_dim_unset) {
    CKPT_ASSIGN_OR_RETURN(c.head_dim, IntField(j, {"head_dim"}));
  }
  CKPT_ASSIGN_OR_RETURN(c.hidden, IntField(j, {"hidden_size", "n_embd", "d_model"}));
  CKPT_ASSIGN_OR_RETURN(c.layers, IntField(j, {"num_hidden_layers", "n_layer", "num_layers"}));
  CKPT_ASSIGN_OR_RETURN(c.experts, IntField(j, kExpertCountFields));
  CKPT_ASSIGN_OR_RETURN(c.intermediate, PerLayerIntField(j, "intermediate_size"));
  CKPT_ASSIGN_OR_RETURN(c.moe_intermediate, PerLayerIntField(j, "moe_intermediate_size"));
  CKPT_ASSIGN_OR_RETURN(c.tie, BoolField(j, "tie_word_embeddings"));
  CKPT_ASSIGN_OR_RETURN(c.multi_query, BoolField(j, "multi_query"));
  CKPT_ASSIGN_OR_RETURN(c.new_arch, BoolField(j, "new_decoder_architecture"));
  if (c.heads && !c.kv_heads) c.kv_heads = c.heads;
  if (c.kv_heads && c.heads && *c.kv_heads > *c.heads)
    return InvalidArgument("config: num_key_value_heads " + std::to_string(*c.kv_heads) + " exceeds num_attention_heads " +
                           std::to_string(*c.heads));
  if (c.heads && c.kv_heads && *c.heads % *c.kv_heads != 0)
    return InvalidArgument("config: num_attention_heads " + std::to_string(*c.heads) +
                           " is not a multiple of num_key_value_heads " + std::to_string(*c.kv_heads));
  if (c.heads && !c.head_dim && c.hidden) {
    if (*c.hidden % *c.heads != 0)
      return InvalidArgument("config: hidden_size " + std::to_string(*c.hidden) + " is not a multiple of num_attention_heads " +
                             std::to_string(*c.heads) + " (and no head_dim)");
    c.head_dim = *c.hidden / *c.heads;
  }
  return c;
}

// ---------------------------------------------------------------------------------------
// Families.

struct FamilyName {
  const char* name;
  std::vector<const char*> model_types;    // config model_type values
  std::vector<const char*> architectures;  // config architectures prefixes
};

const std::vector<FamilyName>& Table() {
  static const std::vector<FamilyName> kTable = {
      {"llama", {"llama"}, {"LlamaFor", "LlamaModel"}},
      {"mistral", {"mistral"}, {"MistralFor", "MistralModel"}},
      {"mixtral", {"mixtral"}, {"MixtralFor", "MixtralModel"}},
      {"qwen2", {"qwen2"}, {"Qwen2For", "Qwen2Model"}},
      {"qwen2_moe", {"qwen2_moe"}, {"Qwen2MoeFor", "Qwen2MoeModel"}},
      {"qwen3", {"qwen3"}, {"Qwen3For", "Qwen3Model"}},
      {"qwen3_moe", {"qwen3_moe"}, {"Qwen3MoeFor", "Qwen3MoeModel"}},
      {"gemma", {"gemma"}, {"GemmaFor", "GemmaModel"}},
      {"gemma2", {"gemma2"}, {"Gemma2For", "Gemma2Model"}},
      {"gemma3", {"gemma3_text"}, {"Gemma3ForCausalLM", "Gemma3TextModel"}},
      {"phi3", {"phi3"}, {"Phi3For", "Phi3Model"}},
      {"olmo2", {"olmo2"}, {"Olmo2For", "Olmo2Model"}},
      {"starcoder2", {"starcoder2"}, {"Starcoder2For", "Starcoder2Model"}},
      {"granite", {"granite"}, {"GraniteFor", "GraniteModel"}},
      {"cohere", {"cohere"}, {"CohereFor", "CohereModel"}},
      {"gpt_neox", {"gpt_neox", "gpt-neox"}, {"GPTNeoXFor", "GPTNeoXModel"}},
      {"falcon", {"falcon"}, {"FalconFor", "FalconModel"}},
      {"deepseek_v3", {"deepseek_v3"}, {"DeepseekV3For", "DeepseekV3Model"}},
      {"gpt_oss", {"gpt_oss"}, {"GptOssFor", "GptOssModel"}},
      {"gpt-neo", {"gpt_neo", "gpt-neo"}, {"GPTNeoFor", "GPTNeoModel"}},
      {"gpt2", {"gpt2"}, {"GPT2LMHeadModel", "GPT2Model"}},
      {"gptj", {"gptj"}, {"GPTJFor", "GPTJModel"}},
      {"bloom", {"bloom"}, {"BloomFor", "BloomModel"}},
      {"opt", {"opt"}, {"OPTFor", "OPTModel"}},
  };
  return kTable;
}

std::string KnownList() {
  std::string known;
  for (const auto& f : Table()) known += (known.empty() ? "" : ", ") + std::string(f.name);
  return known;
}

std::string FormatHint() {
  return "built-in families: " + KnownList() +
         "; for another model pass a plan file: {\"rules\": [{\"pattern\": regex, \"rule\": name}, ...]} "
         "(docs/tp-plans.md)";
}

std::optional<std::string> Canonical(const std::string& name) {
  for (const auto& f : Table()) {
    if (name == f.name) return std::string(f.name);
    for (const char* t : f.model_types)
      if (name == t) return std::string(f.name);
  }
  return std::nullopt;
}

struct Builder {
  const TpPlan::Options& o;
  const Config& c;
  std::string family;
  bool hf = false;
  json rules = json::array();
  json require = json::array();

  void Add(const std::string& pattern, json rule, json extra = json::object()) {
    json e = {{"pattern", pattern}, {"rule", std::move(rule)}};
    for (auto it = extra.begin(); it != extra.end(); ++it) e[it.key()] = it.value();
    rules.push_back(std::move(e));
  }
  // Tensors matching `pattern`: one per layer when the config gives the layer count.
  void Require(const std::string& pattern, const std::string& what, bool per_layer = true) {
    const int64_t n = per_layer && c.layers ? *c.layers : 1;
    require.push_back({{"pattern", pattern}, {"count", n}, {"what", what + (per_layer && c.layers ? " (one per layer)" : "")}});
  }
  // A dim-0 split over `heads` heads, heads % world == 0 (plain column without a config).
  json Heads(std::optional<int64_t> heads) const {
    if (!heads) return "column";
    return {{"split", 0}, {"heads", *heads}};
  }
  // The same for key/value heads: replicated when there are fewer than ranks.
  json KvHeads(std::optional<int64_t> heads) const {
    if (!heads) return "column";
    return {{"split", 0}, {"kv_heads", *heads}};
  }
  Result<std::string> Finish() const {
    json plan = {{"family", family}, {"convention", hf ? "hf" : "megatron"}, {"default", "replicate"},
                 {"rules", rules}, {"require", require}};
    return plan.dump(1);
  }
};

Status NeedConfig(const Builder& b, const std::string& why) {
  return InvalidArgument(b.family + " (" + (b.hf ? "hf" : "megatron") + "): " + why +
                         " needs the model's config (config.json: pass it, or use plan=\"auto\")");
}

// ---------------------------------------------------------------------------------------
// Llama-like decoders: model.embed_tokens, model.layers.N.{self_attn,mlp}, lm_head.

struct LlamaLike {
  enum class Mlp { kGateUpDown, kStarcoder2, kPhi3 } mlp = Mlp::kGateUpDown;
  enum class Moe { kNone, kMixtral, kQwen, kGptOss } moe = Moe::kNone;
  bool phi3_qkv = false;
  bool mla = false;
  bool sinks = false;
  bool per_head_norms = false;  // cohere: q_norm [nh, hd], k_norm [kv, hd]
};

// The megatron layout of each llama-like family (transformers' own plans, for "hf", are data:
// hf_plans.h).
LlamaLike Describe(const std::string& f) {
  LlamaLike d;
  if (f == "cohere") d.per_head_norms = true;
  if (f == "starcoder2") d.mlp = LlamaLike::Mlp::kStarcoder2;
  if (f == "phi3") {
    d.mlp = LlamaLike::Mlp::kPhi3;
    d.phi3_qkv = true;
  }
  if (f == "mixtral") d.moe = LlamaLike::Moe::kMixtral;
  if (f == "qwen2_moe" || f == "qwen3_moe") d.moe = LlamaLike::Moe::kQwen;
  if (f == "deepseek_v3") {
    d.moe = LlamaLike::Moe::kQwen;
    d.mla = true;
  }
  if (f == "gpt_oss") {
    d.moe = LlamaLike::Moe::kGptOss;
    d.sinks = true;
  }
  return d;
}

const char* kLayer = "^(model\\.layers\\.\\d+\\.";  // opens group 1

// Per-expert checkpoint tensors: groups 1 (layer prefix), 2 (expert), 3 (projection).
struct ExpertNames {
  std::string gate_up;        // pattern of gate/up sources
  std::string down;           // pattern of down sources
  std::string gate_up_out;    // fused output template
  std::string down_out;
  std::vector<std::string> order;  // gate before up
};

ExpertNames PerExpert(LlamaLike::Moe moe) {
  if (moe == LlamaLike::Moe::kMixtral)
    return {std::string(kLayer) + ")block_sparse_moe\\.experts\\.(\\d+)\\.(w1|w3)\\.weight$",
            std::string(kLayer) + ")block_sparse_moe\\.experts\\.(\\d+)\\.(w2)\\.weight$",
            "$1mlp.experts.gate_up_proj", "$1mlp.experts.down_proj", {"w1", "w3"}};
  return {std::string(kLayer) + "mlp\\.)experts\\.(\\d+)\\.(gate_proj|up_proj)\\.weight$",
          std::string(kLayer) + "mlp\\.)experts\\.(\\d+)\\.(down_proj)\\.weight$", "$1experts.gate_up_proj",
          "$1experts.down_proj", {"gate_proj", "up_proj"}};
}

json Fuse(const std::string& into, const std::vector<std::string>& order, std::optional<int64_t> count) {
  json f = {{"fuse_into", into}, {"fuse_key", {2, 3}}, {"fuse_order", order}, {"stack", 2}};
  if (count) f["stack_count"] = *count;
  return f;
}

Result<std::string> LlamaLikePlan(Builder& b) {
  const LlamaLike d = Describe(b.family);
  const Config& c = b.c;
  const std::string attn = std::string(kLayer) + "self_attn\\.)";
  // Requirements: one attention block per layer.
  if (d.phi3_qkv) {
    b.Require("^model\\.layers\\.\\d+\\.self_attn\\.qkv_proj\\.weight$", "fused qkv_proj weights");
  } else if (d.mla) {
    b.Require("^model\\.layers\\.\\d+\\.self_attn\\.(q_proj|q_b_proj)\\.weight$", "query projections (q_proj or q_b_proj)");
    b.Require("^model\\.layers\\.\\d+\\.self_attn\\.kv_b_proj\\.weight$", "kv_b_proj weights");
  } else {
    for (const char* p : {"q", "k", "v"})
      b.Require("^model\\.layers\\.\\d+\\.self_attn\\." + std::string(p) + "_proj\\.weight$",
                std::string(p) + "_proj weights");
  }
  b.Require("^model\\.layers\\.\\d+\\.self_attn\\.o_proj\\.weight$", "o_proj weights");
  const std::optional<int64_t> experts = c.experts;
  const ExpertNames en = PerExpert(d.moe);

  // megatron
  const bool have_heads = c.heads.has_value() && c.kv_heads.has_value();
  b.Add("^model\\.embed_tokens\\.weight$", "vocab");
  b.Add("^lm_head\\.weight$", "vocab");
  if (d.phi3_qkv) {
    if (!have_heads || !c.head_dim) return NeedConfig(b, "splitting the fused qkv_proj into q, k and v heads");
    const int64_t hd = *c.head_dim;
    json sections = json::array({{{"rows", *c.heads * hd}, {"heads", *c.heads}},
                                 {{"rows", *c.kv_heads * hd}, {"kv_heads", *c.kv_heads}},
                                 {{"rows", *c.kv_heads * hd}, {"kv_heads", *c.kv_heads}}});
    b.Add(attn + "qkv_proj\\.(weight|bias)$", {{"split", 0}, {"sections", sections}});
  } else if (d.mla) {
    b.Add(attn + "(q_proj|q_b_proj|kv_b_proj)\\.weight$", b.Heads(c.heads));
    b.Add(attn + "(q_a_proj|kv_a_proj_with_mqa|q_a_layernorm|kv_a_layernorm)\\.", "replicate");
  } else if (b.o.fuse_qkv) {
    json fuse = {{"fuse_into", "$1qkv_proj.$3"}, {"fuse_key", 2}, {"fuse_order", {"q", "k", "v"}}};
    b.Add(attn + "(q)_proj\\.(weight|bias)$", b.Heads(c.heads), fuse);
    b.Add(attn + "(k|v)_proj\\.(weight|bias)$", b.KvHeads(c.kv_heads), fuse);
  } else {
    b.Add(attn + "q_proj\\.(weight|bias)$", b.Heads(c.heads));
    b.Add(attn + "(k|v)_proj\\.(weight|bias)$", b.KvHeads(c.kv_heads));
  }
  b.Add(attn + "o_proj\\.(weight|bias)$", "row");
  if (d.sinks) b.Add(attn + "sinks$", b.Heads(c.heads));
  if (d.per_head_norms) {  // cohere's LayerNorm over [heads, head_dim]: each rank its heads
    b.Add(attn + "q_norm\\.weight$", b.Heads(c.heads));
    b.Add(attn + "k_norm\\.weight$", b.KvHeads(c.kv_heads));
  }
  // MoE experts (before the dense MLP rules, whose names they share).
  if (d.moe == LlamaLike::Moe::kMixtral || d.moe == LlamaLike::Moe::kQwen) {
    json gu = "column", dn = "row";
    if (b.o.expert_parallel) {
      if (!experts) return NeedConfig(b, "expert parallelism (the expert count)");
      gu = dn = {{"expert", 2}, {"experts", *experts}};
    }
    if (b.o.fuse_experts) {
      b.Add(en.gate_up, gu, Fuse(en.gate_up_out, en.order, experts));
      b.Add(en.down, dn, Fuse(en.down_out, en.order, experts));
    } else {
      b.Add(en.gate_up, gu);
      b.Add(en.down, dn);
    }
    // Already fused 3-d experts ([E, 2I, H] and [E, H, I]).
    const std::string fused3 = "^model\\.layers\\.\\d+\\.mlp\\.experts\\.";
    if (b.o.expert_parallel) {
      b.Add(fused3 + "(gate_up_proj|down_proj)$", {{"split", 0}, {"experts", *experts}});
    } else {
      b.Add(fused3 + "gate_up_proj$", {{"split", 1}, {"chunks", 2}});
      b.Add(fused3 + "down_proj$", {{"split", 2}});
    }
    b.Add(std::string(kLayer) + ")(block_sparse_moe|mlp)\\.gate\\.", "replicate");  // the router
  }
  if (d.moe == LlamaLike::Moe::kGptOss) {
    const std::string ex = "^model\\.layers\\.\\d+\\.mlp\\.experts\\.";
    if (b.o.expert_parallel) {
      b.Add(ex + "(gate_up_proj|gate_up_proj_bias|down_proj|down_proj_bias)$",
            experts ? json{{"split", 0}, {"experts", *experts}} : json("grouped_gemm"));
    } else {
      // gate_up_proj [E, H, 2I] interleaves gate and up columns: a contiguous part keeps pairs.
      json pairs = {{"split", 2}};
      if (c.intermediate) pairs["heads"] = *c.intermediate;
      b.Add(ex + "gate_up_proj$", pairs);
      json bias_pairs = {{"split", 1}};
      if (c.intermediate) bias_pairs["heads"] = *c.intermediate;
      b.Add(ex + "gate_up_proj_bias$", bias_pairs);
      b.Add(ex + "down_proj$", {{"split", 1}});
      b.Add(ex + "down_proj_bias$", "replicate");
    }
    b.Add("^model\\.layers\\.\\d+\\.mlp\\.router\\.", "replicate");
  }
  // Dense MLPs (and shared experts).
  const std::string mlp = std::string(kLayer) + "mlp\\.(?:shared_experts?\\.)?)";
  if (d.mlp == LlamaLike::Mlp::kGateUpDown) {
    if (b.o.fuse_gate_up) {
      b.Add(mlp + "(gate|up)_proj\\.(weight|bias)$", "column",
            {{"fuse_into", "$1gate_up_proj.$3"}, {"fuse_key", 2}, {"fuse_order", {"gate", "up"}}});
    } else {
      b.Add(mlp + "(gate|up)_proj\\.(weight|bias)$", "column");
    }
    b.Add(mlp + "down_proj\\.(weight|bias)$", "row");
  } else if (d.mlp == LlamaLike::Mlp::kStarcoder2) {
    b.Add(mlp + "c_fc\\.(weight|bias)$", "column");
    b.Add(mlp + "c_proj\\.(weight|bias)$", "row");
  } else {
    b.Add(mlp + "gate_up_proj\\.weight$", {{"split", 0}, {"chunks", 2}});
    b.Add(mlp + "down_proj\\.weight$", "row");
  }
  return b.Finish();
}

// ---------------------------------------------------------------------------------------
// Older families: megatron only (transformers has no TP plan for them).

Result<std::string> OlderPlan(Builder& b) {
  const Config& c = b.c;
  const TpPlan::Options& o = b.o;
  const std::string& f = b.family;
  auto qkv = [&](const std::string& prefix, bool with_bias) {
    const std::string kinds = with_bias ? "(weight|bias)" : "(weight)";
    if (o.fuse_qkv) {
      b.Add("^(.*" + prefix + ")(q|k|v)_proj\\." + kinds + "$", b.Heads(c.heads),
            {{"fuse_into", "$1qkv_proj.$3"}, {"fuse_key", 2}, {"fuse_order", {"q", "k", "v"}}});
    } else {
      b.Add(prefix + "(q|k|v)_proj\\.(weight|bias)$", b.Heads(c.heads));
    }
  };
  if (f == "gpt-neo") {
    b.Require("\\.attn\\.attention\\.q_proj\\.weight$", "q_proj weights");
    b.Add("wte\\.weight$", "vocab");
    qkv("\\.attn\\.attention\\.", false);
    b.Add("\\.attn\\.attention\\.out_proj\\.(weight|bias)$", "row");
    b.Add("\\.mlp\\.c_fc\\.(weight|bias)$", "column");
    b.Add("\\.mlp\\.c_proj\\.(weight|bias)$", "row");
    b.Add("lm_head\\.weight$", "vocab");
  } else if (f == "gpt2") {
    b.Require("(^|\\.)h\\.\\d+\\.attn\\.c_attn\\.weight$", "attn.c_attn weights");
    auto conv = [&](const std::string& pattern, json rule) {
      b.Add(pattern + "\\.weight$", rule, {{"transpose", o.transpose_conv1d}});
      b.Add(pattern + "\\.bias$", rule);
    };
    b.Add("wte\\.weight$", "vocab");
    json cattn = "conv1d_fused_qkv";
    if (c.heads) cattn = {{"split", -1}, {"chunks", 3}, {"vector", "split"}, {"heads", *c.heads}};
    conv("\\.attn\\.c_attn", cattn);
    conv("\\.attn\\.c_proj", "conv1d_row");
    conv("\\.mlp\\.c_fc", "conv1d_column");
    conv("\\.mlp\\.c_proj", "conv1d_row");
    b.Add("lm_head\\.weight$", "vocab");
  } else if (f == "gptj") {
    b.Require("\\.attn\\.q_proj\\.weight$", "q_proj weights");
    b.Add("wte\\.weight$", "vocab");
    qkv("\\.attn\\.", false);
    b.Add("\\.attn\\.out_proj\\.(weight|bias)$", "row");
    b.Add("\\.mlp\\.fc_in\\.(weight|bias)$", "column");
    b.Add("\\.mlp\\.fc_out\\.(weight|bias)$", "row");
    b.Add("lm_head\\.(weight|bias)$", "vocab");
  } else if (f == "bloom") {
    // query_key_value is [n_head, 3, head_dim] along its out dim: whole heads are contiguous.
    b.Require("\\.self_attention\\.query_key_value\\.weight$", "query_key_value weights");
    b.Add("word_embeddings\\.weight$", "vocab");
    b.Add("\\.self_attention\\.query_key_value\\.(weight|bias)$", b.Heads(c.heads));
    b.Add("\\.self_attention\\.dense\\.(weight|bias)$", "row");
    b.Add("\\.mlp\\.dense_h_to_4h\\.(weight|bias)$", "column");
    b.Add("\\.mlp\\.dense_4h_to_h\\.(weight|bias)$", "row");
    b.Add("lm_head\\.weight$", "vocab");
  } else if (f == "opt") {
    b.Require("\\.self_attn\\.q_proj\\.weight$", "q_proj weights");
    b.Add("embed_tokens\\.weight$", "vocab");
    qkv("\\.self_attn\\.", true);
    b.Add("\\.self_attn\\.out_proj\\.(weight|bias)$", "row");
    b.Add("\\.fc1\\.(weight|bias)$", "column");
    b.Add("\\.fc2\\.(weight|bias)$", "row");
    b.Add("lm_head\\.weight$", "vocab");
  } else if (f == "falcon") {
    if (!c.present || !c.heads || !c.head_dim)
      return NeedConfig(b, "falcon's fused query_key_value (its layout follows new_decoder_architecture, multi_query "
                           "and num_kv_heads)");
    b.Require("^transformer\\.h\\.\\d+\\.self_attention\\.query_key_value\\.weight$", "query_key_value weights");
    b.Add("^transformer\\.word_embeddings\\.weight$", "vocab");
    b.Add("^lm_head\\.weight$", "vocab");
    const std::string qkvp = "^transformer\\.h\\.\\d+\\.self_attention\\.query_key_value\\.(weight|bias)$";
    const int64_t hd = *c.head_dim;
    if (c.new_arch.value_or(false)) {
      // [kv groups, heads / kv + 2, head_dim]: whole groups per rank (a group carries q heads
      // too, so it cannot be replicated).
      const int64_t kv = c.kv_heads && *c.kv_heads != *c.heads ? *c.kv_heads : (c.multi_query.value_or(true) ? 1 : *c.heads);
      b.Add(qkvp, {{"split", 0}, {"groups", kv}});
    } else if (c.multi_query.value_or(true)) {
      b.Add(qkvp, {{"split", 0},
                   {"sections", json::array({{{"rows", *c.heads * hd}, {"heads", *c.heads}},
                                             {{"rows", hd}, {"kv_heads", 1}},
                                             {{"rows", hd}, {"kv_heads", 1}}})}});
    } else {
      b.Add(qkvp, b.Heads(c.heads));  // [n_head, 3, head_dim]
    }
    b.Add("^transformer\\.h\\.\\d+\\.self_attention\\.dense\\.(weight|bias)$", "row");
    b.Add("^transformer\\.h\\.\\d+\\.mlp\\.dense_h_to_4h\\.(weight|bias)$", "column");
    b.Add("^transformer\\.h\\.\\d+\\.mlp\\.dense_4h_to_h\\.(weight|bias)$", "row");
  } else if (f == "gpt_neox") {
    b.Require("^gpt_neox\\.layers\\.\\d+\\.attention\\.query_key_value\\.weight$", "query_key_value weights");
    // query_key_value is [n_head, 3, head_dim]: whole heads are contiguous.
    b.Add("^gpt_neox\\.embed_in\\.weight$", "vocab");
    b.Add("^embed_out\\.weight$", "vocab");
    b.Add("^gpt_neox\\.layers\\.\\d+\\.attention\\.query_key_value\\.(weight|bias)$", b.Heads(c.heads));
    b.Add("^gpt_neox\\.layers\\.\\d+\\.attention\\.dense\\.(weight|bias)$", "row");
    b.Add("^gpt_neox\\.layers\\.\\d+\\.mlp\\.dense_h_to_4h\\.(weight|bias)$", "column");
    b.Add("^gpt_neox\\.layers\\.\\d+\\.mlp\\.dense_4h_to_h\\.(weight|bias)$", "row");
  }
  return b.Finish();
}

}  // namespace

std::vector<std::string> Names() {
  std::vector<std::string> out;
  for (const auto& f : Table()) out.push_back(f.name);
  return out;
}

std::string HfOptionsError() {
  return "fuse_qkv, fuse_gate_up, expert_parallel and fuse_experts are options of the \"megatron\" convention; "
         "\"hf\" is transformers' own layout (its MoE experts are always fused)";
}

Result<std::string> PlanJson(const std::string& family, const TpPlan::Options& options) {
  auto canonical = Canonical(family);
  if (!canonical) {
    if (hf_plans::Knows(family))
      return InvalidArgument("model type '" + family + "' has transformers' tensor-parallel plan only: use convention "
                             "\"hf\" (the \"megatron\" convention's " + FormatHint() + ")");
    return InvalidArgument("unknown model family '" + family + "' (" + FormatHint() + ")");
  }
  auto config = ParseConfig(options.config_json);
  if (!config.ok()) return config.status();
  Builder b{options, *config, *canonical, options.convention == Convention::kHf};
  if (b.hf && (options.fuse_qkv || options.fuse_gate_up || options.expert_parallel || options.fuse_experts))
    return InvalidArgument(HfOptionsError());
  static const std::set<std::string> kOlder = {"gpt-neo", "gpt2", "gptj", "bloom", "opt", "falcon", "gpt_neox"};
  static const std::set<std::string> kNoHfPlan = {"gpt-neo", "gpt2", "gptj", "bloom", "opt", "falcon"};
  if (b.hf && !kNoHfPlan.count(*canonical))  // TpPlan::BuiltIn takes the others from transformers' plan data
    return InvalidArgument("family '" + *canonical + "': transformers' plan data (transformers " +
                           hf_plans::TransformersVersion() + ") has no entry for it; use convention \"megatron\"");
  if (b.hf) {
    // transformers has no TP plan for these: at world 1 its model holds every tensor whole;
    // beyond, there is nothing to match (use megatron). The family's requirements stay.
    Builder m{options, *config, *canonical, false};
    auto megatron = OlderPlan(m);
    if (!megatron.ok() && config->present) return megatron.status();
    json plan = {{"family", *canonical}, {"convention", "hf"}, {"default", "replicate"}, {"rules", json::array()},
                 {"require", m.require},
                 {"max_world", {{"world", 1}, {"why", "family '" + *canonical +
                                                          "' has no tensor-parallel plan in transformers, so the "
                                                          "\"hf\" convention has nothing to match; use convention "
                                                          "\"megatron\""}}}};
    return plan.dump(1);
  }
  if (kOlder.count(*canonical)) return OlderPlan(b);
  return LlamaLikePlan(b);
}

namespace {

// A config's model_type and architectures, read without checking its other fields (an
// "hf" plan from data needs nothing else).
Result<std::pair<std::string, std::vector<std::string>>> TypeAndArchitectures(const std::string& config_json) {
  const json j = json::parse(config_json, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return InvalidArgument("config is not a JSON object");
  std::pair<std::string, std::vector<std::string>> out;
  if (j.contains("model_type") && j["model_type"].is_string()) out.first = j["model_type"].get<std::string>();
  if (j.contains("architectures") && j["architectures"].is_array())
    for (const auto& a : j["architectures"])
      if (a.is_string()) out.second.push_back(a.get<std::string>());
  return out;
}

}  // namespace

Result<std::string> HfModelType(const std::string& family, const std::string& config_json) {
  if (!config_json.empty()) {
    CKPT_ASSIGN_OR_RETURN(auto ta, TypeAndArchitectures(config_json));
    if (hf_plans::Knows(ta.first)) return ta.first;
  }
  if (hf_plans::Knows(family)) return family;
  for (const auto& f : Table())
    if (family == f.name && !f.model_types.empty()) return std::string(f.model_types[0]);
  return family;
}

Result<std::string> FamilyOf(const std::string& config_json) {
  if (config_json.empty())
    return InvalidArgument("plan \"auto\" needs the checkpoint's config.json (none is stored with it); name a family "
                           "or a plan file instead (" + FormatHint() + ")");
  CKPT_ASSIGN_OR_RETURN(Config c, ParseConfig(config_json));
  const std::string& model_type = c.model_type;
  const std::vector<std::string>& architectures = c.architectures;
  if (!model_type.empty()) {
    if (auto f = Canonical(model_type)) return *f;
    if (hf_plans::Knows(model_type)) return model_type;
  }
  for (const std::string& a : architectures) {
    for (const auto& f : Table()) {
      for (const char* prefix : f.architectures) {
        if (a.rfind(prefix, 0) == 0) return std::string(f.name);
      }
    }
    if (auto mt = hf_plans::ModelTypeOfClass(a)) return *mt;
  }
  std::string arch;
  for (const auto& a : architectures) arch += (arch.empty() ? "" : ", ") + a;
  return InvalidArgument("config model_type '" + model_type + "' (architectures [" + arch +
                         "]) is not a built-in family nor a model type of transformers' plan data (transformers " +
                         hf_plans::TransformersVersion() + ", " + std::to_string(hf_plans::ModelTypes().size()) +
                         " model types; " + FormatHint() + ")");
}

}  // namespace ckpt::tp_families
