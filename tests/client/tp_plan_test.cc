#include "ckpt/tp_plan.h"

#include <gtest/gtest.h>

#include <map>

namespace ckpt {
namespace {

TensorInfo T(const std::string& name, std::vector<int64_t> shape, DType d = DType::kF32) {
  TensorInfo t{name, d, std::move(shape), 0, 0};
  t.nbytes = NumElements(t.shape) * DTypeSize(d);
  return t;
}

std::map<std::string, ShardOutput> ByName(const std::vector<ShardOutput>& outs) {
  std::map<std::string, ShardOutput> m;
  for (const auto& o : outs) m[o.name] = o;
  return m;
}

std::vector<TensorInfo> GptNeo() {
  return {T("transformer.wte.weight", {50257, 64}), T("transformer.wpe.weight", {32, 64}),
          T("transformer.h.0.ln_1.weight", {64}),
          T("transformer.h.0.attn.attention.q_proj.weight", {64, 64}),
          T("transformer.h.0.attn.attention.k_proj.weight", {64, 64}),
          T("transformer.h.0.attn.attention.v_proj.weight", {64, 64}),
          T("transformer.h.0.attn.attention.out_proj.weight", {64, 64}),
          T("transformer.h.0.attn.attention.out_proj.bias", {64}),
          T("transformer.h.0.mlp.c_fc.weight", {256, 64}), T("transformer.h.0.mlp.c_fc.bias", {256}),
          T("transformer.h.0.mlp.c_proj.weight", {64, 256}), T("transformer.h.0.mlp.c_proj.bias", {64})};
}

TEST(TpPlanTest, GptNeoRules) {
  auto plan = TpPlan::BuiltIn("gpt-neo");
  ASSERT_TRUE(plan.ok());
  auto outs = plan->Resolve(GptNeo(), 1, 4);
  ASSERT_TRUE(outs.ok()) << outs.status().ToString();
  auto m = ByName(*outs);
  ASSERT_EQ(m.size(), GptNeo().size());
  auto spec = [&](const std::string& n) { return m[n].pieces.at(0).spec; };
  EXPECT_EQ(spec("transformer.wpe.weight").kind, ShardSpec::Kind::kReplicate);
  EXPECT_EQ(spec("transformer.h.0.ln_1.weight").kind, ShardSpec::Kind::kReplicate);
  EXPECT_EQ(spec("transformer.h.0.attn.attention.q_proj.weight").dim, 0);
  EXPECT_EQ(spec("transformer.h.0.attn.attention.q_proj.weight").rank, 1);
  EXPECT_EQ(spec("transformer.h.0.attn.attention.out_proj.weight").dim, -1);
  EXPECT_EQ(spec("transformer.h.0.attn.attention.out_proj.bias").kind, ShardSpec::Kind::kReplicate);
  EXPECT_EQ(spec("transformer.h.0.mlp.c_fc.bias").kind, ShardSpec::Kind::kSplit);
  EXPECT_EQ(spec("transformer.h.0.mlp.c_proj.bias").kind, ShardSpec::Kind::kReplicate);
  EXPECT_TRUE(spec("transformer.wte.weight").allow_uneven);  // 50257 rows over 4 ranks
  auto wte = PlanOutput(m["transformer.wte.weight"], GptNeo());
  ASSERT_TRUE(wte.ok());
  EXPECT_EQ(wte->shape, (std::vector<int64_t>{12564, 64}));  // rank 1 of tensor_split(50257, 4)
}

TEST(TpPlanTest, FusedQkvConcatenatesInOrder) {
  TpPlan::BuiltInOptions o;
  o.fuse_qkv = true;
  auto plan = TpPlan::BuiltIn("gpt-neo", o);
  ASSERT_TRUE(plan.ok());
  auto outs = plan->Resolve(GptNeo(), 0, 2);
  ASSERT_TRUE(outs.ok()) << outs.status().ToString();
  auto m = ByName(*outs);
  ASSERT_TRUE(m.count("transformer.h.0.attn.attention.qkv_proj.weight"));
  const auto& qkv = m["transformer.h.0.attn.attention.qkv_proj.weight"];
  ASSERT_EQ(qkv.pieces.size(), 3u);
  EXPECT_EQ(qkv.pieces[0].source, "transformer.h.0.attn.attention.q_proj.weight");  // q, k, v order
  EXPECT_EQ(qkv.pieces[1].source, "transformer.h.0.attn.attention.k_proj.weight");
  EXPECT_EQ(qkv.pieces[2].source, "transformer.h.0.attn.attention.v_proj.weight");
  EXPECT_FALSE(m.count("transformer.h.0.attn.attention.q_proj.weight"));
  auto layout = PlanOutput(qkv, GptNeo());
  ASSERT_TRUE(layout.ok());
  EXPECT_EQ(layout->shape, (std::vector<int64_t>{96, 64}));
  EXPECT_EQ(layout->piece_offsets, (std::vector<uint64_t>{0, 32 * 64 * 4, 2 * 32 * 64 * 4}));
}

TEST(TpPlanTest, Gpt2Conv1DIsSplitOnTheOtherDimAndCanBeTransposed) {
  std::vector<TensorInfo> t = {T("h.0.attn.c_attn.weight", {64, 192}), T("h.0.attn.c_attn.bias", {192}),
                               T("h.0.attn.c_proj.weight", {64, 64}), T("h.0.attn.c_proj.bias", {64}),
                               T("h.0.mlp.c_fc.weight", {64, 256}), T("h.0.mlp.c_fc.bias", {256}),
                               T("h.0.mlp.c_proj.weight", {256, 64})};
  TpPlan::BuiltInOptions o;
  o.transpose_conv1d = true;
  auto plan = TpPlan::BuiltIn("gpt2", o);
  ASSERT_TRUE(plan.ok());
  auto outs = plan->Resolve(t, 1, 2);
  ASSERT_TRUE(outs.ok()) << outs.status().ToString();
  auto m = ByName(*outs);
  EXPECT_EQ(m["h.0.attn.c_attn.weight"].pieces[0].spec.dim, -1);
  EXPECT_EQ(m["h.0.attn.c_attn.weight"].pieces[0].spec.fused_chunks, 3);
  EXPECT_TRUE(m["h.0.attn.c_attn.weight"].transpose);
  EXPECT_EQ(m["h.0.attn.c_attn.bias"].pieces[0].spec.dim, 0);
  EXPECT_EQ(m["h.0.attn.c_attn.bias"].pieces[0].spec.fused_chunks, 3);
  EXPECT_EQ(m["h.0.attn.c_proj.weight"].pieces[0].spec.dim, 0);   // row-parallel in Conv1D layout
  EXPECT_EQ(m["h.0.attn.c_proj.bias"].pieces[0].spec.kind, ShardSpec::Kind::kReplicate);
  EXPECT_EQ(m["h.0.mlp.c_fc.weight"].pieces[0].spec.dim, -1);
  auto layout = PlanOutput(m["h.0.attn.c_attn.weight"], t);
  ASSERT_TRUE(layout.ok());
  EXPECT_EQ(layout->shape, (std::vector<int64_t>{96, 64}));  // [3 * 32, 64] after the transpose
}

TEST(TpPlanTest, EveryFamilyResolvesItsOwnNames) {
  std::map<std::string, std::vector<TensorInfo>> models = {
      {"gptj", {T("transformer.h.0.attn.q_proj.weight", {64, 64}), T("transformer.h.0.mlp.fc_in.bias", {256}),
                T("transformer.h.0.mlp.fc_out.weight", {64, 256}), T("lm_head.bias", {100})}},
      {"llama", {T("model.layers.0.self_attn.q_proj.weight", {64, 64}), T("model.layers.0.self_attn.v_proj.weight", {32, 64}),
                 T("model.layers.0.self_attn.o_proj.weight", {64, 64}),
                 T("model.layers.0.self_attn.k_proj.weight", {32, 64}), T("model.layers.0.mlp.up_proj.weight", {128, 64}),
                 T("model.layers.0.mlp.down_proj.weight", {64, 128}), T("model.norm.weight", {64})}},
      {"mistral", {T("model.layers.0.self_attn.q_proj.weight", {64, 64}), T("model.layers.0.self_attn.k_proj.weight", {32, 64}),
                   T("model.layers.0.self_attn.v_proj.weight", {32, 64}),
                   T("model.layers.0.self_attn.o_proj.weight", {64, 64}), T("model.embed_tokens.weight", {101, 64})}},
      {"bloom", {T("h.0.self_attention.query_key_value.weight", {192, 64}), T("h.0.self_attention.dense.weight", {64, 64}),
                 T("h.0.mlp.dense_4h_to_h.bias", {64})}},
      {"opt", {T("model.decoder.layers.0.fc1.weight", {256, 64}), T("model.decoder.layers.0.fc2.weight", {64, 256}),
               T("model.decoder.layers.0.self_attn.q_proj.weight", {64, 64}),
               T("model.decoder.layers.0.self_attn.v_proj.bias", {64})}},
  };
  std::map<std::string, std::pair<bool, int>> expect = {  // split?, dim
      {"transformer.h.0.attn.q_proj.weight", {true, 0}}, {"transformer.h.0.mlp.fc_in.bias", {true, 0}},
      {"transformer.h.0.mlp.fc_out.weight", {true, -1}}, {"lm_head.bias", {true, 0}},
      {"model.layers.0.self_attn.k_proj.weight", {true, 0}}, {"model.layers.0.mlp.up_proj.weight", {true, 0}},
      {"model.layers.0.self_attn.q_proj.weight", {true, 0}}, {"model.layers.0.self_attn.v_proj.weight", {true, 0}},
      {"model.decoder.layers.0.self_attn.q_proj.weight", {true, 0}},
      {"model.layers.0.mlp.down_proj.weight", {true, -1}}, {"model.norm.weight", {false, 0}},
      {"model.layers.0.self_attn.o_proj.weight", {true, -1}}, {"model.embed_tokens.weight", {true, 0}},
      {"h.0.self_attention.query_key_value.weight", {true, 0}}, {"h.0.self_attention.dense.weight", {true, -1}},
      {"h.0.mlp.dense_4h_to_h.bias", {false, 0}}, {"model.decoder.layers.0.fc1.weight", {true, 0}},
      {"model.decoder.layers.0.fc2.weight", {true, -1}}, {"model.decoder.layers.0.self_attn.v_proj.bias", {true, 0}}};
  for (const auto& [family, tensors] : models) {
    auto plan = TpPlan::BuiltIn(family);
    ASSERT_TRUE(plan.ok()) << family;
    auto outs = plan->Resolve(tensors, 1, 2);
    ASSERT_TRUE(outs.ok()) << family << ": " << outs.status().ToString();
    for (const auto& o : *outs) {
      const auto& e = expect.at(o.name);
      EXPECT_EQ(o.pieces[0].spec.kind == ShardSpec::Kind::kSplit, e.first) << family << " " << o.name;
      if (e.first) EXPECT_EQ(o.pieces[0].spec.dim, e.second) << family << " " << o.name;
    }
  }
}

TEST(TpPlanTest, PlanFileRulesAndErrors) {
  auto plan = TpPlan::FromJson(R"({"default": "replicate", "rules": [
      {"pattern": "^a$", "rule": {"split": 1, "chunks": 2}},
      {"pattern": "^b$", "rule": "row", "transpose": true}]})");
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  auto outs = plan->Resolve({T("a", {2, 8}), T("b", {4, 4}), T("c", {3})}, 1, 2);
  ASSERT_TRUE(outs.ok()) << outs.status().ToString();
  auto m = ByName(*outs);
  EXPECT_EQ(m["a"].pieces[0].spec.fused_chunks, 2);
  EXPECT_TRUE(m["b"].transpose);
  EXPECT_EQ(m["c"].pieces[0].spec.kind, ShardSpec::Kind::kReplicate);

  auto unknown = TpPlan::FromJson(R"({"rules": [{"pattern": "x", "rule": "diagonal"}]})");
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(unknown.status().message().find("unknown sharding rule 'diagonal'"), std::string::npos);
  EXPECT_FALSE(TpPlan::FromJson("{not json").ok());
  EXPECT_FALSE(TpPlan::FromJson(R"({"rules": [{"pattern": "(", "rule": "row"}]})").ok());
  EXPECT_FALSE(TpPlan::FromJson(R"({"rules": [{"pattern": "x", "rule": "row", "colour": 1}]})").ok());
  EXPECT_FALSE(TpPlan::FromJson(R"({"rules": [{"pattern": "x", "rule": "row", "fuse_key": 1}]})").ok());
  EXPECT_FALSE(TpPlan::BuiltIn("gpt-5").ok());
  EXPECT_EQ(TpPlan::FromJsonFile("/nonexistent/plan.json").status().code(), StatusCode::kNotFound);

  // Splits that do not divide, rank out of range, transposing a vector.
  auto col = TpPlan::FromJson(R"({"default": "column"})");
  ASSERT_TRUE(col.ok());
  auto bad = col->Resolve({T("w", {10, 4})}, 0, 4);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("'w'"), std::string::npos) << bad.status().ToString();
  EXPECT_EQ(col->Resolve({T("w", {8, 4})}, 4, 4).status().code(), StatusCode::kInvalidArgument);
  auto tv = TpPlan::FromJson(R"({"rules": [{"pattern": "v", "rule": "replicate", "transpose": true}]})");
  ASSERT_TRUE(tv.ok());
  EXPECT_FALSE(tv->Resolve({T("v", {8})}, 0, 1).ok());
}

TEST(TpPlanTest, FusedPiecesMustAgree) {
  auto plan = TpPlan::FromJson(R"({"rules": [{"pattern": "^(q|k)$", "rule": "column", "fuse_into": "qk",
                                              "fuse_key": 1, "fuse_order": ["q", "k"]}]})");
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_TRUE(plan->Resolve({T("k", {4, 8}), T("q", {4, 8})}, 0, 2).ok());
  EXPECT_FALSE(plan->Resolve({T("k", {4, 8}), T("q", {4, 6})}, 0, 2).ok());
  EXPECT_FALSE(plan->Resolve({T("k", {4, 8}, DType::kF16), T("q", {4, 8})}, 0, 2).ok());
}

}  // namespace
}  // namespace ckpt
