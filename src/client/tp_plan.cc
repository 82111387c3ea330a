#include "ckpt/tp_plan.h"

#include <algorithm>
#include <fstream>
#include <map>
#include <sstream>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "common/pattern.h"

namespace ckpt {

namespace {

// A rule after parsing: split along `dim` (from the end if negative) in `chunks` chunks.
struct Rule {
  bool replicate = true;
  int dim = 0;
  int chunks = 1;
  bool uneven = false;
  bool vector_replicates = false;  // a 1-d tensor is replicated (row-parallel biases)
  bool vector_dim0 = false;        // a 1-d tensor splits dim 0 (Conv1D column biases)
};

Result<Rule> ParseRule(const nlohmann::json& j) {
  Rule r;
  if (j.is_string()) {
    const std::string name = j.get<std::string>();
    if (name == "replicate") return r;
    r.replicate = false;
    if (name == "column") { r.dim = 0; return r; }
    if (name == "row") { r.dim = -1; r.vector_replicates = true; return r; }
    if (name == "vocab") { r.dim = 0; r.uneven = true; return r; }
    if (name == "fused_qkv") { r.dim = 0; r.chunks = 3; return r; }
    if (name == "conv1d_column") { r.dim = -1; r.vector_dim0 = true; return r; }
    if (name == "conv1d_row") { r.dim = 0; r.vector_replicates = true; return r; }
    if (name == "conv1d_fused_qkv") { r.dim = -1; r.chunks = 3; r.vector_dim0 = true; return r; }
    return InvalidArgument("unknown sharding rule '" + name +
                           "' (known: replicate, column, row, vocab, fused_qkv, conv1d_column, "
                           "conv1d_row, conv1d_fused_qkv, {\"split\": dim, ...})");
  }
  if (j.is_object() && j.contains("split") && j["split"].is_number_integer()) {
    r.replicate = false;
    r.dim = j["split"].get<int>();
    if (j.contains("chunks")) {
      if (!j["chunks"].is_number_integer() || j["chunks"].get<int>() < 1)
        return InvalidArgument("\"chunks\" must be an integer >= 1");
      r.chunks = j["chunks"].get<int>();
    }
    if (j.contains("uneven")) {
      if (!j["uneven"].is_boolean()) return InvalidArgument("\"uneven\" must be a boolean");
      r.uneven = j["uneven"].get<bool>();
    }
    for (auto it = j.begin(); it != j.end(); ++it) {
      if (it.key() != "split" && it.key() != "chunks" && it.key() != "uneven")
        return InvalidArgument("unknown key '" + it.key() + "' in a split rule");
    }
    return r;
  }
  return InvalidArgument("a rule is a rule name or {\"split\": dim, \"chunks\": k, \"uneven\": b}, got " +
                         j.dump());
}

}  // namespace

struct TpPlan::Entry {
  std::string pattern_text;
  Pattern pattern;
  Rule rule;
  bool transpose = false;
  std::string fuse_into;  // empty: no fusion
  int fuse_key = 0;
  std::vector<std::string> fuse_order;
};

TpPlan::TpPlan() = default;
TpPlan::~TpPlan() = default;
TpPlan::TpPlan(TpPlan&&) noexcept = default;
TpPlan& TpPlan::operator=(TpPlan&&) noexcept = default;
TpPlan::TpPlan(const TpPlan&) = default;
TpPlan& TpPlan::operator=(const TpPlan&) = default;

Result<TpPlan> TpPlan::FromJson(const std::string& json_text) {
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(json_text);
  } catch (const std::exception& e) {
    return InvalidArgument(std::string("plan is not valid JSON: ") + e.what());
  }
  if (!doc.is_object()) return InvalidArgument("plan must be a JSON object");
  TpPlan plan;
  for (auto it = doc.begin(); it != doc.end(); ++it) {
    if (it.key() != "rules" && it.key() != "default" && it.key() != "comment")
      return InvalidArgument("unknown key '" + it.key() + "' in plan");
  }
  if (doc.contains("default")) {
    auto r = ParseRule(doc["default"]);
    if (!r.ok()) return r.status().WithContext("plan \"default\"");
    if (!doc["default"].is_string()) return InvalidArgument("plan \"default\" must be a rule name");
    plan.default_rule_ = doc["default"].get<std::string>();
  }
  if (doc.contains("rules")) {
    if (!doc["rules"].is_array()) return InvalidArgument("plan \"rules\" must be an array");
    int index = 0;
    for (const auto& e : doc["rules"]) {
      const std::string where = "plan rule #" + std::to_string(index++);
      if (!e.is_object() || !e.contains("pattern") || !e["pattern"].is_string() || !e.contains("rule"))
        return InvalidArgument(where + ": needs \"pattern\" (string) and \"rule\"");
      for (auto it = e.begin(); it != e.end(); ++it) {
        static const char* kKeys[] = {"pattern", "rule", "transpose", "fuse_into", "fuse_key", "fuse_order", "comment"};
        if (std::find(std::begin(kKeys), std::end(kKeys), it.key()) == std::end(kKeys))
          return InvalidArgument(where + ": unknown key '" + it.key() + "'");
      }
      auto entry = std::make_shared<Entry>();
      entry->pattern_text = e["pattern"].get<std::string>();
      auto compiled = Pattern::Compile(entry->pattern_text);
      if (!compiled.ok()) return compiled.status().WithContext(where);
      entry->pattern = std::move(*compiled);
      auto rule = ParseRule(e["rule"]);
      if (!rule.ok()) return rule.status().WithContext(where);
      entry->rule = *rule;
      if (e.contains("transpose")) {
        if (!e["transpose"].is_boolean()) return InvalidArgument(where + ": \"transpose\" must be a boolean");
        entry->transpose = e["transpose"].get<bool>();
      }
      if (e.contains("fuse_into")) {
        if (!e["fuse_into"].is_string() || e["fuse_into"].get<std::string>().empty())
          return InvalidArgument(where + ": \"fuse_into\" must be a non-empty string");
        entry->fuse_into = e["fuse_into"].get<std::string>();
        if (e.contains("fuse_key")) {
          if (!e["fuse_key"].is_number_integer() || e["fuse_key"].get<int>() < 0 ||
              static_cast<size_t>(e["fuse_key"].get<int>()) > entry->pattern.groups())
            return InvalidArgument(where + ": \"fuse_key\" must name a capture group of the pattern");
          entry->fuse_key = e["fuse_key"].get<int>();
        }
        if (e.contains("fuse_order")) {
          if (!e["fuse_order"].is_array()) return InvalidArgument(where + ": \"fuse_order\" must be an array");
          for (const auto& k : e["fuse_order"]) {
            if (!k.is_string()) return InvalidArgument(where + ": \"fuse_order\" holds strings");
            entry->fuse_order.push_back(k.get<std::string>());
          }
        }
      } else if (e.contains("fuse_key") || e.contains("fuse_order")) {
        return InvalidArgument(where + ": \"fuse_key\"/\"fuse_order\" without \"fuse_into\"");
      }
      plan.entries_.push_back(std::move(entry));
    }
  }
  return plan;
}

Result<TpPlan> TpPlan::FromJsonFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return NotFound("cannot open plan file '" + path + "'");
  std::stringstream ss;
  ss << in.rdbuf();
  auto plan = FromJson(ss.str());
  if (!plan.ok()) return plan.status().WithContext(path);
  return plan;
}

std::vector<std::string> TpPlan::Families() {
  return {"gpt-neo", "gpt2", "gptj", "llama", "mistral", "bloom", "opt"};
}

Result<TpPlan> TpPlan::BuiltIn(const std::string& family, const BuiltInOptions& options) {
  using nlohmann::json;
  json rules = json::array();
  auto add = [&](const std::string& pattern, json rule) {
    rules.push_back({{"pattern", pattern}, {"rule", std::move(rule)}});
  };
  // Separate q/k/v projections with `prefix` before "(q|k|v)_proj": column-parallel,
  // fused into one qkv_proj output if asked.
  auto qkv = [&](const std::string& prefix, bool with_bias) {
    const std::string kinds = with_bias ? "(weight|bias)" : "(weight)";
    if (options.fuse_qkv) {
      rules.push_back({{"pattern", "^(.*" + prefix + ")(q|k|v)_proj\\." + kinds + "$"},
                       {"rule", "column"},
                       {"fuse_into", "$1qkv_proj.$3"},
                       {"fuse_key", 2},
                       {"fuse_order", {"q", "k", "v"}}});
    } else {
      add(prefix + "(q|k|v)_proj\\.(weight|bias)$", "column");
    }
  };
  if (family == "gpt-neo") {
    add("wte\\.weight$", "vocab");
    qkv("\\.attn\\.attention\\.", false);
    add("\\.attn\\.attention\\.out_proj\\.(weight|bias)$", "row");
    add("\\.mlp\\.c_fc\\.(weight|bias)$", "column");
    add("\\.mlp\\.c_proj\\.(weight|bias)$", "row");
    add("lm_head\\.weight$", "vocab");
  } else if (family == "gpt2") {
    auto conv = [&](const std::string& pattern, const char* rule) {
      rules.push_back({{"pattern", pattern + "\\.weight$"}, {"rule", rule}, {"transpose", options.transpose_conv1d}});
      add(pattern + "\\.bias$", rule);
    };
    add("wte\\.weight$", "vocab");
    conv("\\.attn\\.c_attn", "conv1d_fused_qkv");
    conv("\\.attn\\.c_proj", "conv1d_row");
    conv("\\.mlp\\.c_fc", "conv1d_column");
    conv("\\.mlp\\.c_proj", "conv1d_row");
    add("lm_head\\.weight$", "vocab");
  } else if (family == "gptj") {
    add("wte\\.weight$", "vocab");
    qkv("\\.attn\\.", false);
    add("\\.attn\\.out_proj\\.(weight|bias)$", "row");
    add("\\.mlp\\.fc_in\\.(weight|bias)$", "column");
    add("\\.mlp\\.fc_out\\.(weight|bias)$", "row");
    add("lm_head\\.(weight|bias)$", "vocab");
  } else if (family == "llama" || family == "mistral") {
    add("embed_tokens\\.weight$", "vocab");
    qkv("\\.self_attn\\.", true);
    add("\\.self_attn\\.o_proj\\.(weight|bias)$", "row");
    add("\\.mlp\\.(gate_proj|up_proj)\\.(weight|bias)$", "column");
    add("\\.mlp\\.down_proj\\.(weight|bias)$", "row");
    add("lm_head\\.weight$", "vocab");
  } else if (family == "bloom") {
    // query_key_value is [n_head, 3, head_dim] along its out dim: a head range is a
    // contiguous column split.
    add("word_embeddings\\.weight$", "vocab");
    add("\\.self_attention\\.query_key_value\\.(weight|bias)$", "column");
    add("\\.self_attention\\.dense\\.(weight|bias)$", "row");
    add("\\.mlp\\.dense_h_to_4h\\.(weight|bias)$", "column");
    add("\\.mlp\\.dense_4h_to_h\\.(weight|bias)$", "row");
    add("lm_head\\.weight$", "vocab");
  } else if (family == "opt") {
    add("embed_tokens\\.weight$", "vocab");
    qkv("\\.self_attn\\.", true);
    add("\\.self_attn\\.out_proj\\.(weight|bias)$", "row");
    add("\\.fc1\\.(weight|bias)$", "column");
    add("\\.fc2\\.(weight|bias)$", "row");
    add("lm_head\\.weight$", "vocab");
  } else {
    std::string known;
    for (const auto& f : Families()) known += (known.empty() ? "" : ", ") + f;
    return InvalidArgument("unknown model family '" + family + "' (built-in: " + known + ")");
  }
  return FromJson(json{{"default", "replicate"}, {"rules", rules}}.dump());
}

Result<std::vector<ShardOutput>> TpPlan::Resolve(const std::vector<TensorInfo>& tensors, int rank,
                                                 int world) const {
  if (world < 1 || rank < 0 || rank >= world)
    return InvalidArgument("rank " + std::to_string(rank) + " out of range for world " + std::to_string(world));
  auto default_rule = ParseRule(nlohmann::json(default_rule_));
  if (!default_rule.ok()) return default_rule.status();

  std::vector<ShardOutput> outputs;
  std::unordered_map<std::string, size_t> by_name;
  // Per fused output: the sort key of each piece.
  std::unordered_map<std::string, std::vector<std::pair<std::string, size_t>>> keys;
  std::unordered_map<std::string, const Entry*> fused_entry;

  for (const TensorInfo& t : tensors) {
    const Entry* match = nullptr;
    std::vector<std::string> m;  // the match's groups
    for (const auto& e : entries_) {
      auto found = e->pattern.Search(t.name);
      if (!found.ok()) return found.status().WithContext("tensor '" + t.name + "'");
      m = std::move(*found);
      if (!m.empty()) {
        match = e.get();
        break;
      }
    }
    const Rule rule = match ? match->rule : *default_rule;
    ShardSpec spec = ShardSpec::Replicate();
    const int ndim = static_cast<int>(t.shape.size());
    if (!rule.replicate && ndim > 0) {
      int dim = rule.dim;
      bool replicate = false;
      if (ndim == 1) {
        if (rule.vector_replicates) replicate = true;
        if (rule.vector_dim0) dim = 0;
      }
      if (!replicate) spec = ShardSpec::Split(dim, rank, world, rule.chunks, rule.uneven);
    }
    if (spec.kind == ShardSpec::Kind::kSplit) {
      auto layout = PlanShard(t.dtype, t.shape, spec);
      if (!layout.ok()) {
        return layout.status().WithContext("tensor '" + t.name + "'" +
                                           (match ? " (rule /" + match->pattern_text + "/)" : ""));
      }
    }
    std::string out_name = t.name;
    if (match && !match->fuse_into.empty()) out_name = Pattern::Expand(match->fuse_into, m);
    auto it = by_name.find(out_name);
    if (it == by_name.end()) {
      it = by_name.emplace(out_name, outputs.size()).first;
      ShardOutput out;
      out.name = out_name;
      out.transpose = match && match->transpose;
      outputs.push_back(std::move(out));
    } else if (!match || match->fuse_into.empty()) {
      return InvalidArgument("tensor '" + t.name + "': output name '" + out_name + "' is already taken");
    }
    ShardOutput& out = outputs[it->second];
    if (match && !match->fuse_into.empty()) {
      const std::string key = m[match->fuse_key];
      auto pos = std::find(match->fuse_order.begin(), match->fuse_order.end(), key);
      std::string sort_key = (pos != match->fuse_order.end())
                                 ? "0" + std::string(1, static_cast<char>('A' + (pos - match->fuse_order.begin())))
                                 : "1" + t.name;
      keys[out_name].push_back({sort_key, out.pieces.size()});
      fused_entry[out_name] = match;
    }
    out.pieces.push_back({t.name, spec});
  }
  // Order fused pieces.
  for (auto& [name, ks] : keys) {
    ShardOutput& out = outputs[by_name[name]];
    std::stable_sort(ks.begin(), ks.end());
    std::vector<ShardPiece> ordered;
    for (const auto& k : ks) ordered.push_back(out.pieces[k.second]);
    out.pieces = std::move(ordered);
  }
  // Check that fused pieces fit together.
  for (const ShardOutput& out : outputs) {
    auto layout = PlanOutput(out, tensors);
    if (!layout.ok()) return layout.status();
  }
  return outputs;
}

Result<OutputLayout> PlanOutput(const ShardOutput& output, const std::vector<TensorInfo>& tensors) {
  if (output.pieces.empty()) return InvalidArgument("output '" + output.name + "' has no pieces");
  OutputLayout result;
  for (size_t i = 0; i < output.pieces.size(); ++i) {
    const ShardPiece& piece = output.pieces[i];
    const TensorInfo* info = nullptr;
    for (const TensorInfo& t : tensors) {
      if (t.name == piece.source) {
        info = &t;
        break;
      }
    }
    if (!info) return NotFound("output '" + output.name + "': no tensor '" + piece.source + "'");
    auto layout = PlanShard(info->dtype, info->shape, piece.spec);
    if (!layout.ok()) return layout.status().WithContext("tensor '" + piece.source + "'");
    if (i == 0) {
      result.dtype = layout->dtype;
      result.shape = layout->shape;
    } else {
      if (layout->dtype != result.dtype)
        return InvalidArgument("output '" + output.name + "': fused pieces differ in dtype ('" +
                               piece.source + "')");
      if (layout->shape.size() != result.shape.size() || layout->shape.empty() ||
          !std::equal(layout->shape.begin() + 1, layout->shape.end(), result.shape.begin() + 1))
        return InvalidArgument("output '" + output.name + "': fused piece '" + piece.source +
                               "' does not match the others' shape after dim 0");
      result.shape[0] += layout->shape[0];
    }
    result.piece_offsets.push_back(result.nbytes);
    result.nbytes += layout->nbytes;
    result.pieces.push_back(std::move(*layout));
  }
  if (output.transpose) {
    if (result.shape.size() != 2)
      return InvalidArgument("output '" + output.name + "': transpose needs a 2-d tensor");
    std::swap(result.shape[0], result.shape[1]);
  }
  return result;
}

}  // namespace ckpt
