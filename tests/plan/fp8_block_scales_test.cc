// FP8 block scales (src/plan/block_scales.h) through TpPlan::Resolve and GatherOutput: every
// rank's scale holds exactly the blocks of its weight shard. The engine places by names and
// shapes only, so the weights here are I32 holding their own flat index (and the scales the
// index of their block): each gathered weight element then names the scale element that must
// sit at its block of the rank's scale shard. tests/python/test_fp8_block_scales.py does the
// same with real F8_E4M3 bytes, dequantized.
#include <gtest/gtest.h>

#include <algorithm>
#include <iterator>
#include <map>
#include <numeric>

#include "ckpt/tp_plan.h"

namespace ckpt {
namespace {

TensorInfo T(const std::string& name, std::vector<int64_t> shape, DType d = DType::kI32) {
  TensorInfo t{name, d, std::move(shape), 0, 0};
  t.nbytes = NumElements(t.shape) * DTypeSize(d);
  return t;
}

int64_t Ceil(int64_t a, int64_t b) { return (a + b - 1) / b; }

// A weight [out, in] and its scale of blocks `b`.
void AddWeight(std::vector<TensorInfo>* ts, const std::string& name, int64_t out, int64_t in, int64_t b = 128) {
  ts->push_back(T(name + ".weight", {out, in}));
  ts->push_back(T(name + ".weight_scale_inv", {Ceil(out, b), Ceil(in, b)}, DType::kI32));
}

// Source bytes: each tensor holds consecutive numbers from its own base (the sum of the
// element counts before it), so a gathered value names its tensor and its place in it.
struct Sources {
  explicit Sources(const std::vector<TensorInfo>& ts) {
    int64_t base = 0;
    for (const auto& t : ts) {
      auto& v = data[t.name];
      v.resize(NumElements(t.shape));
      std::iota(v.begin(), v.end(), static_cast<int32_t>(base));
      bases[base] = &t;
      base_of[t.name] = base;
      base += static_cast<int64_t>(v.size());
    }
  }
  // The tensor holding value `g`, and g's flat index in it.
  std::pair<const TensorInfo*, int64_t> Locate(int64_t g) const {
    auto it = std::prev(bases.upper_bound(g));
    return {it->second, g - it->first};
  }
  // The output gathered by GatherOutput, and its shape.
  std::vector<int32_t> Gather(const ShardOutput& o, const std::vector<TensorInfo>& ts, std::vector<int64_t>* shape) {
    auto layout = PlanOutput(o, ts);
    EXPECT_TRUE(layout.ok()) << layout.status().ToString();
    if (!layout.ok()) return {};
    std::vector<const std::byte*> src;
    for (const auto& p : o.pieces) src.push_back(reinterpret_cast<const std::byte*>(data.at(p.source).data()));
    std::vector<int32_t> out(layout->nbytes / 4);
    EXPECT_TRUE(GatherOutput(o, *layout, src, out.data(), layout->nbytes).ok());
    *shape = layout->shape;
    return out;
  }
  std::map<std::string, std::vector<int32_t>> data;
  std::map<int64_t, const TensorInfo*> bases;
  std::map<std::string, int64_t> base_of;
};

// [rows, cols] of a (possibly stacked) output: all dims but the last as rows.
std::pair<int64_t, int64_t> Flat(const std::vector<int64_t>& shape) {
  int64_t rows = 1;
  for (size_t i = 0; i + 1 < shape.size(); ++i) rows *= shape[i];
  return {rows, shape.back()};
}

// Every element of each (fused or not) weight output of the rank finds its own block's scale
// at its local block of the rank's scale output; `scales` outputs are expected in all.
void ExpectScalesFollow(const TpPlan& plan, const std::vector<TensorInfo>& ts, int world, int64_t b0 = 128,
                        int64_t b1 = 128, size_t scales = 0) {
  Sources src(ts);
  std::map<std::string, const TensorInfo*> infos;
  for (const auto& t : ts) infos[t.name] = &t;
  const std::string suffix = "_scale_inv";
  for (int rank = 0; rank < world; ++rank) {
    auto outs = plan.Resolve(ts, rank, world);
    ASSERT_TRUE(outs.ok()) << "rank " << rank << "/" << world << ": " << outs.status().ToString();
    std::map<std::string, const ShardOutput*> by;
    for (const auto& o : *outs) by[o.name] = &o;
    size_t seen = 0;
    for (const auto& o : *outs) {
      if (o.name.size() < suffix.size() || o.name.compare(o.name.size() - suffix.size(), suffix.size(), suffix)) continue;
      const std::string w = o.name.substr(0, o.name.size() - suffix.size());
      SCOPED_TRACE(w + " rank " + std::to_string(rank) + "/" + std::to_string(world));
      ASSERT_TRUE(by.count(w));
      ++seen;
      std::vector<int64_t> ws, ss;
      auto wv = src.Gather(*by[w], ts, &ws);
      auto sv = src.Gather(o, ts, &ss);
      ASSERT_EQ(ws.size(), ss.size());
      const auto [wr, wc] = Flat(ws);
      const auto [sr, sc] = Flat(ss);
      ASSERT_EQ(sr, Ceil(wr, b0));
      ASSERT_EQ(sc, Ceil(wc, b1));
      std::map<const TensorInfo*, std::pair<const TensorInfo*, int64_t>> scale_of;  // weight -> scale, its base
      for (int64_t i = 0; i < wr; ++i) {
        for (int64_t j = 0; j < wc; ++j) {
          const auto [t, idx] = src.Locate(wv[i * wc + j]);
          auto sc_it = scale_of.find(t);
          if (sc_it == scale_of.end()) {
            const TensorInfo* scale = infos.at(t->name + suffix);
            sc_it = scale_of.emplace(t, std::make_pair(scale, src.base_of.at(scale->name))).first;
          }
          const auto [scale, base] = sc_it->second;
          const int64_t gi = idx / t->shape[1], gj = idx % t->shape[1];
          const int64_t want = base + (gi / b0) * scale->shape[1] + gj / b1;
          ASSERT_EQ(sv[(i / b0) * sc + j / b1], want) << "at " << i << ", " << j << " of " << t->name;
        }
      }
    }
    if (scales) EXPECT_EQ(seen, scales);
  }
}

TpPlan::Options Hf() {
  TpPlan::Options o;
  o.convention = Convention::kHf;
  return o;
}

std::string Cfg(const std::string& extra = "", const std::string& type = "llama") {
  return R"({"model_type": ")" + type + R"(", "hidden_size": 1024, "num_attention_heads": 16, "num_key_value_heads": 8,
             "head_dim": 128, "intermediate_size": 2048, "num_hidden_layers": 1, "vocab_size": 256,
             "tie_word_embeddings": false)" + extra + "}";
}

// A llama layer with FP8 projections (q [2048, 1024], k/v [1024, 1024], o [1024, 2048], mlp 2048).
std::vector<TensorInfo> Llama(int64_t b = 128) {
  std::vector<TensorInfo> ts = {T("model.embed_tokens.weight", {256, 1024}, DType::kBF16),
                                T("model.layers.0.input_layernorm.weight", {1024}, DType::kBF16)};
  const std::string p = "model.layers.0.";
  AddWeight(&ts, p + "self_attn.q_proj", 2048, 1024, b);
  AddWeight(&ts, p + "self_attn.k_proj", 1024, 1024, b);
  AddWeight(&ts, p + "self_attn.v_proj", 1024, 1024, b);
  AddWeight(&ts, p + "self_attn.o_proj", 1024, 2048, b);
  AddWeight(&ts, p + "mlp.gate_proj", 2048, 1024, b);
  AddWeight(&ts, p + "mlp.up_proj", 2048, 1024, b);
  AddWeight(&ts, p + "mlp.down_proj", 1024, 2048, b);
  ts.push_back(T("model.norm.weight", {1024}, DType::kBF16));
  ts.push_back(T("lm_head.weight", {256, 1024}, DType::kBF16));
  return ts;
}

TEST(Fp8BlockScalesTest, LlamaBothConventionsTp248) {
  for (Convention c : {Convention::kHf, Convention::kMegatron}) {
    TpPlan::Options o;
    o.convention = c;
    auto plan = TpPlan::ForConfig(Cfg(), o);
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    for (int world : {1, 2, 4, 8}) {
      SCOPED_TRACE(std::string(ConventionName(c)) + " world " + std::to_string(world));
      ExpectScalesFollow(*plan, Llama(), world);
    }
  }
}

TEST(Fp8BlockScalesTest, ScaleShapesPerRank) {
  auto plan = TpPlan::ForConfig(Cfg(), {});  // megatron
  ASSERT_TRUE(plan.ok());
  auto outs = plan->Resolve(Llama(), 3, 4);
  ASSERT_TRUE(outs.ok()) << outs.status().ToString();
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const auto& o : *outs) shapes[o.name] = PlanOutput(o, Llama())->shape;
  const std::string p = "model.layers.0.";
  EXPECT_EQ(shapes[p + "self_attn.q_proj.weight_scale_inv"], (std::vector<int64_t>{4, 8}));  // rows [1536, 2048)
  EXPECT_EQ(shapes[p + "self_attn.o_proj.weight_scale_inv"], (std::vector<int64_t>{8, 4}));  // cols [1536, 2048)
  EXPECT_EQ(shapes[p + "mlp.down_proj.weight_scale_inv"], (std::vector<int64_t>{8, 4}));
}

TEST(Fp8BlockScalesTest, EveryPlanFileRule) {
  std::vector<TensorInfo> ts;
  AddWeight(&ts, "column", 1024, 1024);
  AddWeight(&ts, "row", 1024, 1024);
  AddWeight(&ts, "vocab", 511, 256);        // tensor_split: 128, 128, 128, 127 at 4
  AddWeight(&ts, "colwise", 511, 256);      // torch.chunk: the same at 4
  AddWeight(&ts, "rowwise", 256, 1023);
  AddWeight(&ts, "qkv", 3 * 1024, 256);     // fused_qkv: each third split
  AddWeight(&ts, "heads", 1024, 256);       // 8 heads of 128
  AddWeight(&ts, "kvheads", 256, 256);      // 2 key/value heads, replicated past world 2
  AddWeight(&ts, "sections", 1536, 256);    // q (8 heads) then k, v (2 heads each)
  AddWeight(&ts, "packed", 256, 2048);      // dim 1 holds 2 blocks, each split
  AddWeight(&ts, "embcol", 256, 1024);      // embedding_colwise: dim 1 chunks
  AddWeight(&ts, "whole", 300, 200);        // replicated: the whole scale
  auto plan = TpPlan::FromJson(R"({"rules": [
    {"pattern": "^column\\.", "rule": "column"}, {"pattern": "^row\\.", "rule": "row"},
    {"pattern": "^vocab\\.", "rule": "vocab"}, {"pattern": "^colwise\\.", "rule": "colwise"},
    {"pattern": "^rowwise\\.", "rule": "rowwise"}, {"pattern": "^qkv\\.", "rule": "fused_qkv"},
    {"pattern": "^heads\\.", "rule": {"split": 0, "heads": 8}},
    {"pattern": "^kvheads\\.", "rule": {"split": 0, "kv_heads": 2}},
    {"pattern": "^sections\\.", "rule": {"split": 0, "sections": [{"rows": 1024, "heads": 8},
        {"rows": 256, "kv_heads": 2}, {"rows": 256, "kv_heads": 2}]}},
    {"pattern": "^packed\\.", "rule": "packed_rowwise"}, {"pattern": "^embcol\\.", "rule": "embedding_colwise"}]})");
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  for (int world : {1, 2, 4, 8}) {
    SCOPED_TRACE("world " + std::to_string(world));
    std::vector<TensorInfo> fit;
    for (const auto& t : ts) {  // 511 rows / 1023 cols cut blocks at 8 (parts of 64), not at 1, 2, 4
      const bool odd = t.name.rfind("vocab", 0) == 0 || t.name.rfind("colwise", 0) == 0 || t.name.rfind("rowwise", 0) == 0;
      if (!odd || world != 8) fit.push_back(t);
    }
    ExpectScalesFollow(*plan, fit, world);
  }
}

TEST(Fp8BlockScalesTest, BlockSizeFromConfigAndPlanFile) {
  auto plan = TpPlan::ForConfig(Cfg(R"(, "quantization_config": {"quant_method": "fp8", "weight_block_size": [64, 256]})"),
                                Hf());
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_NE(plan->json().find("block_scales"), std::string::npos);
  std::vector<TensorInfo> ts = Llama();
  for (auto& t : ts) {  // the scales in [64, 256] blocks
    for (const auto& w : Llama()) {
      if (w.name + "_scale_inv" == t.name) t = T(t.name, {Ceil(w.shape[0], 64), Ceil(w.shape[1], 256)});
    }
  }
  ExpectScalesFollow(*plan, ts, 4, 64, 256);
  // With the default blocks the [64, 256] grid is the wrong shape: an error naming both.
  auto dflt = TpPlan::ForConfig(Cfg(), Hf());
  auto bad = dflt->Resolve(ts, 0, 2);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("model.layers.0.self_attn.q_proj.weight_scale_inv' has shape [32, 4]"),
            std::string::npos) << bad.status().ToString();
  EXPECT_NE(bad.status().message().find("weight 'model.layers.0.self_attn.q_proj.weight' [2048, 1024]"),
            std::string::npos);
  auto file = TpPlan::FromJson(R"({"block_scales": {"block": [64, 256]}, "rules": [
      {"pattern": "q_proj", "rule": "colwise"}, {"pattern": "o_proj", "rule": "rowwise"}]})");
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  ExpectScalesFollow(*file, ts, 8, 64, 256);
}

Status ResolveStatus(const std::string& plan_json, const std::vector<TensorInfo>& ts, int rank, int world) {
  auto plan = TpPlan::FromJson(plan_json);
  if (!plan.ok()) return plan.status();
  auto outs = plan->Resolve(ts, rank, world);
  return outs.ok() ? Status::Ok() : outs.status();
}

TEST(Fp8BlockScalesTest, UnevenSplitCuttingABlockIsAClearError) {
  std::vector<TensorInfo> ts;
  AddWeight(&ts, "mlp.up", 320, 256);  // torch.chunk at 2: 160 rows each
  Status s = ResolveStatus(R"({"rules": [{"pattern": "up", "rule": "colwise"}]})", ts, 1, 2);
  ASSERT_FALSE(s.ok());
  const std::string m = s.message();
  for (const char* want : {"'mlp.up.weight'", "rank 1 of world 2", "rows [160, 320)", "blocks of 128",
                           "'mlp.up.weight_scale_inv' [3, 2]", "whole blocks here: 1", "megatron"})
    EXPECT_NE(m.find(want), std::string::npos) << want << " in: " << m;
  // Row-parallel: columns [128, 256) of 384 at world 3 are fine, 96-wide parts at 4 are not.
  std::vector<TensorInfo> rw;
  AddWeight(&rw, "o", 256, 384);
  const std::string row = R"({"rules": [{"pattern": "^o", "rule": "rowwise"}]})";
  EXPECT_TRUE(ResolveStatus(row, rw, 2, 3).ok());
  s = ResolveStatus(row, rw, 0, 4);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("columns [0, 96) of weight 'o.weight'"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find("whole blocks here: 1, 3"), std::string::npos) << s.ToString();
  // megatron's even split: 1024 rows at 16 are 64-row parts.
  std::vector<TensorInfo> col;
  AddWeight(&col, "q", 1024, 128);
  s = ResolveStatus(R"({"convention": "megatron", "rules": [{"pattern": "q", "rule": "column"}]})", col, 5, 16);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("rows [320, 384)"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find("1, 2, 4, 8"), std::string::npos) << s.ToString();
}

TEST(Fp8BlockScalesTest, LastRankEndingAtTheDimensionEndIsAllowed) {
  std::vector<TensorInfo> ts;
  AddWeight(&ts, "w", 255, 300);  // 2 x 3 blocks; ranks of 2 take rows [0, 128) and [128, 255)
  auto plan = TpPlan::FromJson(R"({"rules": [{"pattern": "^w", "rule": "colwise"}]})");
  ASSERT_TRUE(plan.ok());
  ExpectScalesFollow(*plan, ts, 2);
  auto outs = plan->Resolve(ts, 1, 2);
  ASSERT_TRUE(outs.ok());
  for (const auto& o : *outs) {
    if (o.name == "w.weight_scale_inv") {
      EXPECT_EQ(PlanOutput(o, ts)->shape, (std::vector<int64_t>{1, 3}));
    }
  }
}

TEST(Fp8BlockScalesTest, BadScaleShapeMissingWeightAndNot2d) {
  std::vector<TensorInfo> ts = {T("a.weight", {256, 256}), T("a.weight_scale_inv", {2, 3})};
  Status s = ResolveStatus(R"({"rules": [{"pattern": "a", "rule": "colwise"}]})", ts, 0, 2);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("'a.weight_scale_inv' has shape [2, 3], but weight 'a.weight' [256, 256]"),
            std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find("needs [2, 2]"), std::string::npos);
  s = ResolveStatus(R"({"rules": [{"pattern": "b", "rule": "colwise"}]})", {T("b.weight_scale_inv", {2, 2})}, 0, 2);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("no weight 'b.weight'"), std::string::npos) << s.ToString();
  s = ResolveStatus("{}", {T("c.weight", {4, 256, 256}), T("c.weight_scale_inv", {4, 2, 2})}, 0, 1);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("2-d weights with 2-d scales only"), std::string::npos) << s.ToString();
  // "block_scales": false: the scale follows its own rule again (here: split like any tensor).
  auto off = TpPlan::FromJson(R"({"block_scales": false, "rules": [{"pattern": "a", "rule": "colwise"}]})");
  ASSERT_TRUE(off.ok());
  EXPECT_TRUE(off->Resolve(ts, 0, 2).ok());
  EXPECT_FALSE(TpPlan::FromJson(R"({"block_scales": {"blocks": [1, 2]}})").ok());
  EXPECT_FALSE(TpPlan::FromJson(R"({"block_scales": {"block": [0, 128]}})").ok());
  EXPECT_FALSE(TpPlan::ForConfig(Cfg(R"(, "quantization_config": {"weight_block_size": 128})")).ok());
}

TEST(Fp8BlockScalesTest, ReplicatedWeightGivesTheWholeScale) {
  std::vector<TensorInfo> ts;
  AddWeight(&ts, "norm_like", 300, 200);
  auto plan = TpPlan::FromJson(R"({"rules": [{"pattern": "nothing", "rule": "colwise"}]})");
  ASSERT_TRUE(plan.ok());
  auto outs = plan->Resolve(ts, 1, 8);
  ASSERT_FALSE(outs.ok());  // no rule matches: a wrong plan, as for any checkpoint
  auto whole = TpPlan::FromJson(R"({"default": "replicate"})");
  outs = whole->Resolve(ts, 5, 8);
  ASSERT_TRUE(outs.ok());
  for (const auto& o : *outs) EXPECT_EQ(o.pieces.at(0).spec.kind, ShardSpec::Kind::kReplicate);
  ExpectScalesFollow(*whole, ts, 8);
}

TEST(Fp8BlockScalesTest, MegatronFusedQkvAndGateUpFuseTheirScales) {
  TpPlan::Options o;
  o.fuse_qkv = o.fuse_gate_up = true;
  auto plan = TpPlan::ForConfig(Cfg(), o);
  ASSERT_TRUE(plan.ok());
  for (int world : {1, 2, 4, 8}) {
    SCOPED_TRACE("world " + std::to_string(world));
    ExpectScalesFollow(*plan, Llama(), world, 128, 128, 4);  // qkv, o, gate_up, down
  }
  auto outs = plan->Resolve(Llama(), 1, 4);
  ASSERT_TRUE(outs.ok());
  for (const auto& out : *outs) {
    if (out.name == "model.layers.0.self_attn.qkv_proj.weight_scale_inv") {
      EXPECT_EQ(PlanOutput(out, Llama())->shape, (std::vector<int64_t>{4 + 2 + 2, 8}));  // q 4, k 2, v 2 blocks
    }
  }
}

// A qwen3_moe layer with FP8 experts (E 4, moe_intermediate 1024): hf fuses them into 3-d.
std::vector<TensorInfo> Qwen3Moe() {
  std::vector<TensorInfo> ts = Llama();
  ts.erase(std::remove_if(ts.begin(), ts.end(), [](const TensorInfo& t) { return t.name.find(".mlp.") != std::string::npos; }),
           ts.end());
  ts.push_back(T("model.layers.0.self_attn.q_norm.weight", {128}, DType::kBF16));
  ts.push_back(T("model.layers.0.self_attn.k_norm.weight", {128}, DType::kBF16));
  ts.push_back(T("model.layers.0.mlp.gate.weight", {4, 1024}, DType::kBF16));
  for (int e = 0; e < 4; ++e) {
    const std::string p = "model.layers.0.mlp.experts." + std::to_string(e) + ".";
    AddWeight(&ts, p + "gate_proj", 1024, 1024);
    AddWeight(&ts, p + "up_proj", 1024, 1024);
    AddWeight(&ts, p + "down_proj", 1024, 1024);
  }
  return ts;
}

TEST(Fp8BlockScalesTest, HfFusedMoeExpertsFuseTheirScales) {
  const std::string cfg = Cfg(R"(, "num_experts": 4, "moe_intermediate_size": 1024)", "qwen3_moe");
  for (bool hf : {true, false}) {
    TpPlan::Options o;
    if (hf) o.convention = Convention::kHf;
    o.fuse_experts = !hf;
    auto plan = TpPlan::ForConfig(cfg, o);
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    for (int world : {1, 2, 4, 8}) {
      SCOPED_TRACE(std::string(hf ? "hf" : "megatron") + " world " + std::to_string(world));
      ExpectScalesFollow(*plan, Qwen3Moe(), world, 128, 128, 4 + 2);  // q, k, v, o; gate_up, down
    }
    auto outs = plan->Resolve(Qwen3Moe(), 0, 2);
    ASSERT_TRUE(outs.ok());
    for (const auto& out : *outs) {
      if (out.name == "model.layers.0.mlp.experts.gate_up_proj_scale_inv") {
        EXPECT_EQ(PlanOutput(out, Qwen3Moe())->shape, (std::vector<int64_t>{4, 8, 8}));  // [E, 2 * 512 / 128, 8]
      }
      if (out.name == "model.layers.0.mlp.experts.down_proj_scale_inv") {
        EXPECT_EQ(PlanOutput(out, Qwen3Moe())->shape, (std::vector<int64_t>{4, 8, 4}));
      }
    }
  }
}

TEST(Fp8BlockScalesTest, FusingPartBlocksOrUnscaledWeightsIsAClearError) {
  const std::string fuse = R"({"rules": [{"pattern": "^(a|b)\\.weight$", "rule": "colwise", "fuse_into": "ab.weight",
                                "fuse_key": 1}]})";
  std::vector<TensorInfo> ts;
  AddWeight(&ts, "a", 256, 256);
  AddWeight(&ts, "b", 256, 256);
  EXPECT_TRUE(ResolveStatus(fuse, ts, 1, 2).ok());
  Status s = ResolveStatus(fuse, ts, 1, 4);  // 64 rows of each: blocks cut (and not whole blocks to fuse)
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("'a.weight'"), std::string::npos) << s.ToString();
  std::vector<TensorInfo> part;
  AddWeight(&part, "a", 192, 256);  // 192 rows end at the dim end, but fused they would misplace b's blocks
  AddWeight(&part, "b", 192, 256);
  s = ResolveStatus(fuse, part, 0, 1);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("weight 'a.weight' is fused along dim 0"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find("holds 192 rows of it, not whole blocks of 128"), std::string::npos) << s.ToString();
  std::vector<TensorInfo> mixed;
  AddWeight(&mixed, "a", 256, 256);
  mixed.push_back(T("b.weight", {256, 256}));  // no scale
  s = ResolveStatus(fuse, mixed, 0, 2);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("holds weight 'b.weight', which has no block scale 'b.weight_scale_inv'"),
            std::string::npos) << s.ToString();
}

}  // namespace
}  // namespace ckpt
