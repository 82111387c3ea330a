#include "plan/hf_plans.h"

#include <cctype>
#include <algorithm>
#include <optional>
#include <set>

#include <nlohmann/json.hpp>

#include "plan/plan_text.h"
#include "plan/tp_families.h"

namespace ckpt {
extern const char kHfTpPlansJson[];  // generated from src/plan/hf_tp_plans.json (cmake/embed_text.cmake)
extern const size_t kHfTpPlansJsonSize;
}  // namespace ckpt

namespace ckpt::hf_plans {

namespace {

using json = nlohmann::json;
using plan_text::PlanKeyRegex;
using plan_text::RegexEscape;

// The embedded data file, parsed once (a parse failure is a build bug: no model types).
const json& Data() {
  static const json kData = [] {
    json j = json::parse(std::string(kHfTpPlansJson, kHfTpPlansJsonSize), nullptr, /*allow_exceptions=*/false);
    if (!j.is_object() || !j.contains("families") || !j["families"].is_object()) return json::object();
    return j;
  }();
  return kData;
}

// ---------------------------------------------------------------------------------------
// What the plan needs of the model's config.json.

struct ModelConfig {
  json raw;                         // the whole config.json (null when none was given)
  std::optional<bool> tie;          // tie_word_embeddings (the text config's, for composite models)
  std::optional<int64_t> experts;   // the routed expert count
  int64_t zero_experts = 0;         // longcat_flash's zero_expert_num: identity experts beside them
  std::optional<int64_t> hidden;    // the text model's hidden_size
};

std::optional<bool> TieOf(const json& c) {
  if (c.is_object() && c.contains("tie_word_embeddings") && c["tie_word_embeddings"].is_boolean())
    return c["tie_word_embeddings"].get<bool>();
  return std::nullopt;
}

std::optional<int64_t> ExpertsOf(const json& c) {
  if (!c.is_object()) return std::nullopt;
  for (const char* k : tp_families::kExpertCountFields) {
    if (c.contains(k) && c[k].is_number_integer() && c[k].get<int64_t>() > 0) return c[k].get<int64_t>();
  }
  return std::nullopt;
}

Result<ModelConfig> ReadConfig(const std::string& config_json, const json& entry) {
  ModelConfig mc;
  if (config_json.empty()) return mc;
  const json c = json::parse(config_json, nullptr, /*allow_exceptions=*/false);
  if (!c.is_object()) return InvalidArgument("config is not a JSON object");
  mc.raw = c;
  const json* text = &c;
  if (entry.contains("text_config") && entry["text_config"].is_string()) {
    const std::string key = entry["text_config"].get<std::string>();
    if (c.contains(key) && c[key].is_object()) text = &c[key];
  }
  mc.tie = TieOf(*text);
  if (!mc.tie) mc.tie = TieOf(c);
  mc.experts = ExpertsOf(*text);
  if (!mc.experts) mc.experts = ExpertsOf(c);
  for (const json* j : {text, &c}) {
    if (!mc.hidden && j->contains("hidden_size") && (*j)["hidden_size"].is_number_integer())
      mc.hidden = (*j)["hidden_size"].get<int64_t>();
    if (j->contains("zero_expert_num") && (*j)["zero_expert_num"].is_number_integer() && mc.zero_experts == 0)
      mc.zero_experts = std::max<int64_t>(0, (*j)["zero_expert_num"].get<int64_t>());
  }
  return mc;
}

// ---------------------------------------------------------------------------------------
// transformers' conversions (core_model_loading.py) as plan renames and fusions.

// A source pattern of a WeightRenaming/WeightConverter as PCRE2: transformers compiles it as
// Python regex with ".*." widened to r"\..*\."; PCRE2 reads that syntax the same way.
std::string SourceRegex(const std::string& pattern) {
  std::string out = pattern;
  for (size_t at = out.find(".*."); at != std::string::npos; at = out.find(".*.", at + 6)) out.replace(at, 3, "\\..*\\.");
  return out;
}

// A WeightRenaming target as a Regex::Substitute template: "\N" is group N, the rest literal.
std::string TargetTemplate(const std::string& target) {
  std::string out;
  for (size_t i = 0; i < target.size(); ++i) {
    if (target[i] == '\\' && i + 1 < target.size() && std::isdigit(static_cast<unsigned char>(target[i + 1]))) {
      size_t end = i + 1;
      while (end < target.size() && std::isdigit(static_cast<unsigned char>(target[end]))) ++end;
      out += "${" + target.substr(i + 1, end - i - 1) + "}";
      i = end - 1;
    } else {
      out += target[i] == '$' ? "$$" : std::string(1, target[i]);
    }
  }
  return out;
}

std::vector<std::string> Strings(const json& e, const char* key) {
  std::vector<std::string> out;
  if (e.contains(key) && e[key].is_array())
    for (const auto& s : e[key])
      if (s.is_string()) out.push_back(s.get<std::string>());
  return out;
}

// The operations of a converter that the engine's fusion reproduces: MergeModulelist(dim 0)
// (experts stacked on a new dim 0), optionally then Concatenate(dim 1) (the sources, in
// order, along each expert's dim 0).
bool IsExpertFusion(const json& c, bool* concatenates) {
  const json ops = c.value("operations", json::array());
  if (ops.empty() || ops[0].value("op", "") != "MergeModulelist" || ops[0].value("dim", 0) != 0) return false;
  *concatenates = ops.size() == 2 && ops[1].value("op", "") == "Concatenate" && ops[1].value("dim", -1) == 1;
  return ops.size() == 1 || *concatenates;
}

// The text a converter's source pattern matches when it is a plain name (letters, digits,
// '_', '.' and "\\."), for ordering the sources of a concatenation; nullopt otherwise.
std::optional<std::string> PlainText(const std::string& pattern) {
  std::string out;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size() && pattern[i + 1] == '.') {
      out += '.';
      ++i;
    } else if (std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.') {
      out += c;
    } else {
      return std::nullopt;
    }
  }
  return out;
}

// Whether converter `c`'s only operation is `op` along `dim` (Chunk, Concatenate).
bool IsOnly(const json& c, const char* op, int dim) {
  const json ops = c.value("operations", json::array());
  return ops.size() == 1 && ops[0].value("op", "") == op && ops[0].value("dim", -1) == dim;
}

// Converter `c`'s Interleave (not inverse) when it is its only operation or is followed
// only by a Chunk along the same dim, or null.
const json* InterleaveOf(const json& c) {
  if (!c.contains("operations") || !c["operations"].is_array()) return nullptr;
  const json& ops = c["operations"];  // a reference into `c`: the result points into it
  if (ops.empty() || ops.size() > 2 || ops[0].value("op", "") != "Interleave" || ops[0].value("inverse", false) ||
      !ops[0].contains("dim") || !ops[0]["dim"].is_number_integer())
    return nullptr;
  if (ops.size() == 2 && (ops[1].value("op", "") != "Chunk" || ops[1].value("dim", -1) != ops[0]["dim"].get<int>()))
    return nullptr;
  return &ops[0];
}

// The PermuteForRope (not inverse) that follows a Chunk(dim 0) as converter `c`'s second and
// last operation, or null.
const json* RopePermutationAfterChunk(const json& c) {
  if (!c.contains("operations") || !c["operations"].is_array()) return nullptr;
  const json& ops = c["operations"];  // a reference into `c`: the result points into it
  if (ops.size() != 2 || ops[0].value("op", "") != "Chunk" || ops[0].value("dim", -1) != 0) return nullptr;
  const json& p = ops[1];
  if (p.value("op", "") != "PermuteForRope" || p.value("inverse", false)) return nullptr;
  return &p;
}

class PlanWriter {
 public:
  PlanWriter(const std::string& model_type, const json& entry, const ModelConfig& config, const std::string& source)
      : model_type_(model_type), entry_(entry), config_(config), source_(source) {}

  Result<std::string> Write() {
    CKPT_ASSIGN_OR_RETURN(const json* plan, ChoosePlan());
    plan_ = plan;
    for (const auto& c : entry_.value("conversions", json::array())) CKPT_RETURN_IF_ERROR(AddConversion(c));
    AddPlanKeys();
    json doc = {{"family", model_type_}, {"convention", "hf"}, {"default", "replicate"}, {"rules", rules_},
                {"comment", "transformers' own plan for model type '" + model_type_ + "' (" + source_ + ")"}};
    if (!renames_.empty()) doc["renames"] = renames_;
    // the model's own names that transformers' loader keeps where its renames would make
    // them names the model lacks (the data's "kept_names", layer numbers as '*')
    const json names = entry_.value("kept_names", json::array());
    json kept = json::array();
    for (const auto& k : names.is_array() ? names : json::array({json()})) {
      if (!k.is_string()) return InvalidArgument(Where() + ": \"kept_names\" must be a list of names");
      kept.push_back("^" + PlanKeyRegex(k.get<std::string>()) + "$");
    }
    if (!kept.empty()) doc["not_renamed"] = kept;
    return doc.dump(1);
  }

 private:
  std::string Where() const { return "model type '" + model_type_ + "' (" + source_ + ")"; }

  // The plan for this config (ChooseTiedOrNot). A tied config's plan that shards only the
  // output embedding (lfm2) has nothing to shard in a checkpoint, which holds that weight
  // once, as the replicated input embedding: it is then the empty plan (all replicated).
  Result<const json*> ChoosePlan() {
    CKPT_ASSIGN_OR_RETURN(const json* plan, ChooseTiedOrNot());
    const bool tie = Tied();
    const auto output_embedding = [](const std::string& k) {
      return k == "lm_head" || (k.size() > 8 && k.compare(k.size() - 8, 8, ".lm_head") == 0);
    };
    bool only_output_embedding = tie && !plan->empty();
    for (auto it = plan->begin(); it != plan->end(); ++it) only_output_embedding &= output_embedding(it.key());
    if (!only_output_embedding) return plan;
    adjusted_ = json::object();
    return &adjusted_;
  }

  // The plan transformers uses for this config: the tied one when the word embeddings are
  // tied. An entry with one plan (made for tie_default) gets transformers' tie rule
  // (configuration_utils, >= 5.15): a tied config adds "embed_tokens": "embedding_rowwise"
  // to its text model's plan, an untied one does not have it.
  Result<const json*> ChooseTiedOrNot() {
    if (!entry_.contains("tp_plan") || !entry_["tp_plan"].is_object())
      return InvalidArgument(Where() + ": the entry has no \"tp_plan\" object");
    const bool tie_default = entry_.value("tie_default", false);
    const bool tie = Tied();
    if (entry_.contains("tp_plan_tied") && entry_["tp_plan_tied"].is_object())
      return tie ? &entry_["tp_plan_tied"] : &entry_["tp_plan"];
    if (tie == tie_default) return &entry_["tp_plan"];
    adjusted_ = entry_["tp_plan"];
    const std::string embedding = TextModelPrefix() + "embed_tokens";
    if (tie) adjusted_[embedding] = "embedding_rowwise";
    else if (adjusted_.value(embedding, std::string()) == "embedding_rowwise") adjusted_.erase(embedding);
    return &adjusted_;
  }

  // Whether the word embeddings are tied: the config's tie_word_embeddings, else the model
  // type's default.
  bool Tied() const { return config_.tie.value_or(entry_.value("tie_default", false)); }

  // The text model's prefix in the plan's keys ("model.", "model.language_model."): what
  // precedes "layers.*." in the first key that has it.
  std::string TextModelPrefix() const {
    for (auto it = entry_["tp_plan"].begin(); it != entry_["tp_plan"].end(); ++it) {
      const size_t at = it.key().find("layers.*.");
      if (at != std::string::npos && (at == 0 || it.key()[at - 1] == '.')) return it.key().substr(0, at);
    }
    const std::string prefix = entry_.value("base_model_prefix", std::string());
    return prefix.empty() ? prefix : prefix + ".";
  }

  Status AddConversion(const json& c) {
    const std::string kind = c.value("kind", "");
    const std::vector<std::string> sources = Strings(c, "source_patterns");
    const std::vector<std::string> targets = Strings(c, "target_patterns");
    if (kind == "WeightRenaming" || kind == "PrefixChange" || kind == "GroupWeightRename") {
      // One rename whose branches are the sources (the leftmost match applies): a renaming's
      // sources all go to its first target; a GroupWeightRename's source i to its target i,
      // and only in a checkpoint that has its first source (transformers: once it was seen).
      const bool group = kind == "GroupWeightRename";
      if (sources.empty() || targets.empty() || (group && targets.size() != sources.size())) return Status::Ok();
      json search = json::array(), to = json::array();
      for (size_t i = 0; i < sources.size(); ++i) {
        search.push_back(SourceRegex(sources[i]));
        to.push_back(TargetTemplate(targets[group ? i : 0]));
      }
      json rename = {{"search", search}, {"to", to}};
      if (group) rename["if_any"] = SourceRegex(sources[0]);
      if (c.contains("scope_prefix") && c["scope_prefix"].is_string()) {  // a sub-model's transform
        rename["scope"] = c["scope_prefix"];
        if (c.contains("base_model_prefix") && c["base_model_prefix"].is_string())
          rename["base_prefix"] = c["base_model_prefix"];
      }
      renames_.push_back(std::move(rename));
      return Status::Ok();
    }
    if (kind != "WeightConverter") return Status::Ok();
    const json operations = c.value("operations", json::array());
    if (sources.size() == 1 && targets.size() == 1 && operations.size() == 1 &&
        operations[0].value("op", "") == "Transpose" && PlainText(sources[0]) && PlainText(targets[0]))
      return AddTranspose(sources[0], *PlainText(targets[0]), operations[0]);
    bool concatenates = false;
    if (targets.size() == 1 && IsExpertFusion(c, &concatenates)) return AddExpertFusion(sources, targets[0], concatenates);
    if (targets.size() >= 2 && operations.size() == 1 &&
        operations[0].value("op", "") == "ErnieFuseAndSplitTextVisionExperts" &&
        operations[0].value("stack_dim", -1) == 0 && operations[0].value("concat_dim", -1) == 1)
      return AddExpertSplit(sources, targets);
    std::vector<std::optional<std::string>> plain;
    for (const std::string& s : sources) plain.push_back(PlainText(s));
    std::vector<std::optional<std::string>> plain_targets;
    for (const std::string& t : targets) plain_targets.push_back(PlainText(t));
    const auto all_plain = [](const auto& v) {
      return std::all_of(v.begin(), v.end(), [](const auto& p) { return p.has_value(); });
    };
    if (all_plain(plain) && all_plain(plain_targets)) {
      if (sources.size() == 1 && targets.size() >= 2 && IsOnly(c, "Chunk", 0)) return AddChunk(sources[0], plain_targets);
      if (const json* interleave = InterleaveOf(c); interleave && sources.size() == 1) {
        if (targets.size() == 1 && operations.size() == 1) return AddInterleave(sources[0], *plain_targets[0], *interleave);
        if (targets.size() == 2) return AddChunk(sources[0], plain_targets, nullptr, interleave);
      }
      if (const json* rope = RopePermutationAfterChunk(c); rope && sources.size() == 1 && targets.size() >= 2)
        return AddChunk(sources[0], plain_targets, rope);
      for (int dim : {0, 1}) {
        if (sources.size() >= 2 && targets.size() == 1 && IsOnly(c, "Concatenate", dim))
          return AddConcatenation(sources, plain, *plain_targets[0], dim);
      }
    }
    std::string ops;
    for (const auto& op : c.value("operations", json::array())) ops += (ops.empty() ? "" : ", ") + op.value("op", "?");
    for (const std::string& s : sources)
      rules_.push_back({{"pattern", SourceRegex(s)},  // searched anywhere in the name, as transformers does
                        {"rule", {{"refuse", Where() + ": transformers converts this tensor at load (" + ops +
                                                 ") in a way ckptd does not shard; use convention \"megatron\" "
                                                 "where a built-in family has it, or a plan file (docs/tp-plans.md)"}}}});
    return Status::Ok();
  }

  // `source` converted into `target` (its plain text; a rename where they differ) by one
  // operation on the tensor alone, its entry's `keys` (beside pattern, rule and fuse_into):
  // for each plan key that styles the target, its prefix split by that style, then any other
  // prefix replicated.
  void AddStyledAsTarget(const std::string& source, const std::string& target, const json& keys) {
    std::vector<std::pair<std::string, json>> prefixes;  // (prefix regex, rule)
    for (const TargetKey& k : StyledKeysOf(target)) prefixes.emplace_back(k.prefix, json(k.style));
    prefixes.emplace_back(".*?", "replicate");
    for (const auto& [prefix, rule] : prefixes) {
      json e = {{"pattern", "^(" + prefix + ")(" + SourceRegex(source) + ")(.*)$"}, {"rule", rule}};
      e.update(keys);
      if (PlainText(source) != target) e["fuse_into"] = "$1" + target + "$3";
      rules_.push_back(std::move(e));
    }
  }

  // Interleave(dim) of `source` as `target`: the rows of each matrix taken apart (2j to j,
  // 2j + 1 to half + j), split by the target's style (inkling's stacked experts' w13_weight
  // into gate_up_proj).
  Status AddInterleave(const std::string& source, const std::string& target, const json& op) {
    AddStyledAsTarget(source, target, {{"interleave", {{"dim", op.value("dim", 0)}}}});
    return Status::Ok();
  }

  // Transpose(dim0, dim1) of `source` as `target`: the whole tensor transposed, not where
  // transformers' check_dims finds it in the model's layout already. That layout is the
  // Linear one of transformers' stacked experts ([E, out, in]): a down projection's out,
  // every other one's in is the hidden size.
  Status AddTranspose(const std::string& source, const std::string& target, const json& op) {
    json swap = {{"dims", {op.value("dim0", 0), op.value("dim1", 1)}}};
    const std::string refused = Where() + ": transformers transposes this tensor at load only where it is not in its "
                                          "model's layout (check_dims), which ";
    std::optional<std::string> refusal;
    if (op.value("check_dims", false)) {
      const bool down = target.size() >= 9 && target.compare(target.size() - 9, 9, "down_proj") == 0;
      if (config_.hidden) swap["unless"] = {down ? op.value("dim0", 0) : op.value("dim1", 1), *config_.hidden};
      else refusal = refused + "needs the hidden_size of the model's config.json";
      if (PlainText(source) != target) refusal = refused + "ckptd does not do under another name";
    }
    if (refusal)  // searched anywhere in a name, as transformers does
      rules_.push_back({{"pattern", SourceRegex(source)}, {"rule", {{"refuse", *refusal}}}});
    else
      AddStyledAsTarget(source, target, {{"swap_dims", swap}});
    return Status::Ok();
  }

  // Chunk(dim 0) of `source` into `targets` (their plain texts): a matching tensor is cut
  // into equal parts, part k named as the tensor with the source's text replaced by target
  // k (transformers: full_layer_name.replace), each part placed by the plan's own rules.
  // With `rope` (a PermuteForRope after the Chunk), the parts whose target names one of its
  // permute_layer_names get their rows reordered, over the heads of its sub-config.
  // With `interleave` (an Interleave before a Chunk along the same dim: inkling's shared and
  // dense w13), part k is rows k, k + 2, ... of each matrix.
  Status AddChunk(const std::string& source, const std::vector<std::optional<std::string>>& targets,
                  const json* rope = nullptr, const json* interleave = nullptr) {
    json parts = json::array();
    for (const auto& t : targets) parts.push_back("$1" + *t + "$2");
    json rule = {{"pattern", "^(.*?)" + SourceRegex(source) + "(.*)$"}, {"chunk_into", parts}};
    if (interleave) rule["interleave"] = {{"dim", interleave->value("dim", 0)}};
    if (rope) {
      json permuted = json::array();
      const std::vector<std::string> layers = Strings(*rope, "permute_layer_names");
      for (size_t k = 0; k < targets.size(); ++k) {
        if (std::any_of(layers.begin(), layers.end(), [&](const std::string& l) { return targets[k]->find(l) != std::string::npos; }))
          permuted.push_back(k);
      }
      auto heads = RopeHeads(*rope);
      if (!heads.ok()) {  // refused where such a tensor is, not for the whole plan
        rules_.push_back({{"pattern", SourceRegex(source)}, {"rule", {{"refuse", heads.status().message()}}}});
        return Status::Ok();
      }
      if (!permuted.empty()) rule["permute_for_rope"] = {{"parts", permuted}, {"heads", *heads}};
    }
    rules_.push_back(std::move(rule));
    return Status::Ok();
  }

  // The head count PermuteForRope reads: num_attention_heads of the config's `subconfig_key`
  // sub-config (else of the config itself), 1 where it has none, as transformers does.
  Result<int64_t> RopeHeads(const json& rope) const {
    if (!config_.raw.is_object())
      return InvalidArgument(Where() + ": transformers permutes rotary rows at load (PermuteForRope) by the head "
                             "count of the model's config.json, which was not given");
    const std::string key = rope.value("subconfig_key", std::string());
    const json& sub = !key.empty() && config_.raw.contains(key) && config_.raw[key].is_object() ? config_.raw[key] : config_.raw;
    if (!sub.contains("num_attention_heads")) return 1;
    if (!sub["num_attention_heads"].is_number_integer() || sub["num_attention_heads"].get<int64_t>() < 1)
      return InvalidArgument(Where() + ": config field " + (key.empty() ? "" : key + ".") +
                             "num_attention_heads must be an integer >= 1");
    return sub["num_attention_heads"].get<int64_t>();
  }

  // Concatenate(`dim`) of `sources` (plain names; `plain` their texts) into `target`, in the
  // sources' order: dim 0, the tensors of one module as one fused output; dim 1, stacked
  // experts [E, r, c] side by side ([E, 2r, c]: step3p7's gate and up). Where the plan gives
  // the target a style, each source is split as SourceRule says (its rank's contiguous part
  // along the style's dim, so the fused shard is each source's shard in order, as the
  // module's forward splits it); elsewhere it is whole.
  Status AddConcatenation(const std::vector<std::string>& sources, const std::vector<std::optional<std::string>>& plain,
                          const std::string& target, int dim) {
    json order = json::array();
    for (const auto& p : plain) order.push_back(*p);
    std::vector<std::pair<std::string, json>> prefixes;  // (prefix regex, rule)
    for (const TargetKey& k : StyledKeysOf(target)) {
      Result<json> rule = InvalidArgument("");
      if (k.style != "grouped_gemm") rule = SourceRule(k.style, /*concatenates=*/true, k.key);
      else if (dim == 1) rule = json("grouped_gemm");  // stacked sources: whole experts along dim 0
      prefixes.emplace_back(k.prefix, rule.ok() ? *rule
                                                : json{{"refuse", Where() + ": transformers concatenates " +
                                                                      std::to_string(sources.size()) + " tensors" +
                                                                      (dim == 1 ? " along dim 1" : "") + " into '" +
                                                                      k.key + "' and splits the result " + k.style +
                                                                      ", which ckptd does not do; use convention "
                                                                      "\"megatron\" where a built-in family has it, "
                                                                      "or a plan file (docs/tp-plans.md)"}});
    }
    prefixes.emplace_back(".*?", "replicate");
    for (const auto& [prefix, rule] : prefixes) {
      for (const std::string& s : sources) {
        json e = {{"pattern", "^(" + prefix + ")(" + SourceRegex(s) + ")(.*)$"}, {"rule", rule},
                  {"fuse_into", "$1" + target + "$3"}, {"fuse_key", 2}, {"fuse_order", order},
                  {"fuse_count", sources.size()}};
        if (dim == 1) {
          e["fuse_dim"] = 1;
          if (config_.experts) e["stack_count"] = *config_.experts;
        }
        rules_.push_back(std::move(e));
      }
    }
    return Status::Ok();
  }

  // The plan keys that name `target` (a fused parameter's name after its module prefix; a
  // leading '.' joins it to the prefix without one) or, with `module_too`, its module: for
  // each, the prefix before it as a plan-key regex, the key and its style (StyleOf).
  struct TargetKey {
    std::string prefix;
    std::string key;
    std::string style;
  };
  std::vector<TargetKey> KeysOf(const std::string& target, bool module_too) const {
    const std::string bare = target[0] == '.' ? target.substr(1) : target;
    const size_t dot = bare.rfind('.');
    std::vector<std::string> tails = {bare};
    if (module_too && dot != std::string::npos) tails.push_back(bare.substr(0, dot));
    std::vector<TargetKey> out;
    for (auto it = plan_->begin(); it != plan_->end(); ++it) {
      const std::string& key = it.key();
      for (const std::string& tail : tails) {
        if (key.size() <= tail.size() || key.compare(key.size() - tail.size(), tail.size(), tail) != 0 ||
            key[key.size() - tail.size() - 1] != '.')
          continue;
        std::string prefix = key.substr(0, key.size() - tail.size());  // "model.layers.*." (ends with '.')
        if (target[0] == '.') prefix.pop_back();
        out.push_back({PlanKeyRegex(prefix), key, StyleOf(key)});
      }
    }
    return out;
  }

  // The plan keys that give the fused parameter `target` a style, one per prefix, as
  // transformers looks it up: the parameter's own key, else its module's.
  std::vector<TargetKey> StyledKeysOf(const std::string& target) const {
    std::vector<TargetKey> out;
    for (bool module : {false, true}) {
      for (TargetKey& k : KeysOf(target, module)) {
        const bool seen = std::any_of(out.begin(), out.end(), [&](const TargetKey& o) { return o.prefix == k.prefix; });
        if (!k.style.empty() && !seen) out.push_back(std::move(k));
      }
    }
    return out;
  }

  // The style transformers gives the fused parameter `prefix + target`: the plan's exact
  // key, else its module's key; "" when the plan has neither.
  std::string StyleOf(const std::string& key) const {
    if (plan_->contains(key) && (*plan_)[key].is_string()) return (*plan_)[key].get<std::string>();
    const size_t dot = key.rfind('.');
    if (dot != std::string::npos && plan_->contains(key.substr(0, dot)) && (*plan_)[key.substr(0, dot)].is_string())
      return (*plan_)[key.substr(0, dot)].get<std::string>();
    return "";
  }

  // What each source tensor of a fused parameter of `style` gets. A concatenated source
  // (per-expert 2-d or stacked 3-d alike) is split along dim -2, the rows the style splits,
  // into its rank's contiguous part: packed_colwise's sources are its blocks, so each is
  // split on its own. (transformers does that for per-expert sources; a stacked source it
  // splits as if it were the packed target, two blocks of its own: docs/tp-plans.md.)
  Result<json> SourceRule(const std::string& style, bool concatenates, const std::string& target) const {
    if (style.empty()) return json("replicate");
    if (style == "packed_colwise") return concatenates ? json{{"split", -2}} : json{{"split", 0}, {"chunks", 2}};
    if (style == "colwise" || style == "colwise_gather_output")
      return json{{"split", concatenates ? -2 : 0}, {"uneven", "chunk"}};
    if (style == "rowwise" || style == "rowwise_split_input") return json{{"split", -1}, {"uneven", "chunk"}};
    if (style == "grouped_gemm") {
      if (!config_.experts)
        return InvalidArgument(Where() + ": '" + target + "' is split by whole experts (grouped_gemm), which needs "
                               "the expert count from the model's config.json");
      return json{{"expert", 2}, {"experts", *config_.experts}};
    }
    return json(style);  // a replicated style, or one the engine names in its error
  }

  // Per-expert sources ("mlp.experts.*.gate_proj.weight", ...) fused into `target` [E, ...]:
  // one entry per source, keyed by (expert, source order), stacked by expert. Where the plan
  // has keys for the target, each key's prefix gets its own entry (its style), then any
  // other prefix the target's module style (or replicate).
  // With `experts` (AddExpertSplit), only the checkpoint's experts [begin, end), stacked in order.
  struct ExpertRange {
    int64_t begin = 0, end = 0;
  };
  Status AddExpertFusion(const std::vector<std::string>& sources, const std::string& target, bool concatenates,
                         std::optional<ExpertRange> experts = std::nullopt) {
    std::string index = "\\d+";
    if (experts) {
      index.clear();
      for (int64_t e = experts->begin; e < experts->end; ++e) index += (index.empty() ? "" : "|") + std::to_string(e);
    }
    std::vector<std::string> order, bodies;
    for (const std::string& s : sources) {
      const size_t star = s.find(".*.");
      if (star == std::string::npos) return Status::Ok();  // not per-expert: nothing to fuse
      order.push_back(s.substr(star + 3));
      bodies.push_back(SourceRegex(s.substr(0, star)) + "\\.(" + index + ")\\.(" + RegexEscape(s.substr(star + 3)) + ")");
    }
    std::vector<std::pair<std::string, std::string>> prefixes;  // (prefix regex, style)
    for (const TargetKey& k : KeysOf(target, /*module_too=*/false)) prefixes.emplace_back(k.prefix, k.style);
    prefixes.emplace_back(".*?", "");
    for (const auto& [prefix, style] : prefixes) {
      CKPT_ASSIGN_OR_RETURN(json rule, SourceRule(style, concatenates, target));
      for (size_t i = 0; i < bodies.size(); ++i) {
        json e = {{"pattern", "^(" + prefix + ")" + bodies[i] + "$"}, {"rule", rule}, {"fuse_into", "$1" + target},
                  {"fuse_key", {2, 3}}, {"fuse_order", order}, {"stack", 2}};
        // transformers' model stacks gate/up for the zero experts too (longcat_flash's
        // LongcatFlashExperts), so a checkpoint it saved holds either count
        if (experts) e["stack_count"] = experts->end - experts->begin;
        else if (config_.experts) e["stack_count"] = config_.zero_experts > 0
                                                         ? json{*config_.experts, *config_.experts + config_.zero_experts}
                                                         : json(*config_.experts);
        rules_.push_back(std::move(e));
      }
    }
    return Status::Ok();
  }

  // ErnieFuseAndSplitTextVisionExperts: the per-expert sources' experts cut into
  // len(targets) consecutive groups of ceil(total / len(targets)) (transformers'
  // split_list_into_chunks), group j fused into target j as MergeModulelist (+ Concatenate
  // along dim 1 for several sources) would. The total: the config's moe_num_experts, a list
  // (summed) or one count per group.
  Status AddExpertSplit(const std::vector<std::string>& sources, const std::vector<std::string>& targets) {
    const json* text = config_.raw.is_object() && config_.raw.contains(entry_.value("text_config", std::string("")))
                           ? &config_.raw[entry_["text_config"].get<std::string>()]
                           : &config_.raw;
    int64_t total = 0;
    const json n = text->is_object() ? text->value("moe_num_experts", json()) : json();
    if (n.is_number_integer()) total = n.get<int64_t>() * static_cast<int64_t>(targets.size());
    for (const auto& x : n.is_array() ? n : json::array()) total += x.is_number_integer() ? x.get<int64_t>() : 0;
    if (total <= 0) {
      for (const std::string& s : sources)
        rules_.push_back({{"pattern", SourceRegex(s)},
                          {"rule", {{"refuse", Where() + ": transformers splits these experts into " +
                                                   std::to_string(targets.size()) + " groups by the config's "
                                                   "moe_num_experts, which the model's config.json does not give"}}}});
      return Status::Ok();
    }
    const int64_t k = static_cast<int64_t>(targets.size()), per = (total + k - 1) / k;
    for (int64_t j = 0; j < k && j * per < total; ++j)
      CKPT_RETURN_IF_ERROR(AddExpertFusion(sources, targets[static_cast<size_t>(j)], sources.size() > 1,
                                           ExpertRange{j * per, std::min(total, (j + 1) * per)}));
    return Status::Ok();
  }

  // The plan's keys, as transformers looks a parameter up: its generic name (layer numbers
  // as "*") first, then its module's name.
  void AddPlanKeys() {
    for (auto it = plan_->begin(); it != plan_->end(); ++it)
      rules_.push_back({{"pattern", "^" + PlanKeyRegex(it.key()) + "$"}, {"rule", it.value()}});
    for (auto it = plan_->begin(); it != plan_->end(); ++it)
      rules_.push_back({{"pattern", "^" + PlanKeyRegex(it.key()) + "\\.[^.]+$"}, {"rule", it.value()}});
  }

  const std::string& model_type_;
  const json& entry_;
  const ModelConfig& config_;
  const std::string& source_;
  const json* plan_ = nullptr;
  json adjusted_;  // the plan with the tie rule applied, where ChoosePlan made one
  json rules_ = json::array();
  json renames_ = json::array();
};

}  // namespace

const std::vector<std::string>& ModelTypes() {
  static const std::vector<std::string> kTypes = [] {
    std::vector<std::string> out;
    if (Data().contains("families"))
      for (auto it = Data()["families"].begin(); it != Data()["families"].end(); ++it) out.push_back(it.key());
    std::sort(out.begin(), out.end());
    return out;
  }();
  return kTypes;
}

bool Knows(const std::string& model_type) {
  return Data().contains("families") && Data()["families"].contains(model_type);
}

const std::string& TransformersVersion() {
  static const std::string kVersion = Data().value("transformers", std::string("unknown"));
  return kVersion;
}

std::optional<std::string> ModelTypeOfClass(const std::string& class_name) {
  for (const std::string& mt : ModelTypes())
    if (Data()["families"][mt].value("model_class", std::string()) == class_name) return mt;
  return std::nullopt;
}

Result<std::string> EntryJson(const std::string& model_type) {
  if (!Knows(model_type)) return NotFound("transformers " + TransformersVersion() + " has no tensor-parallel plan for "
                                          "model type '" + model_type + "'");
  return Data()["families"][model_type].dump();
}

Result<std::string> PlanJson(const std::string& model_type, const std::string& entry_json,
                             const std::string& config_json, const std::string& source) {
  const json entry = json::parse(entry_json, nullptr, /*allow_exceptions=*/false);
  if (!entry.is_object()) return InvalidArgument("model type '" + model_type + "' (" + source + "): entry is not a JSON object");
  CKPT_ASSIGN_OR_RETURN(ModelConfig config, ReadConfig(config_json, entry));
  return PlanWriter(model_type, entry, config, source).Write();
}

}  // namespace ckpt::hf_plans
