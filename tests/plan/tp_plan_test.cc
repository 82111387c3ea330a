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

// transformers' packed styles on 1-d tensors: packed_colwise's Shard(-1) (plain torch.chunk
// parts, not the two blocks of the weight), packed_rowwise's Replicate (any 1-d tensor).
TEST(TpPlanTest, PackedStylesSplitVectorsAsTransformersDoes) {
  auto plan = TpPlan::FromJson(R"({"rules": [{"pattern": "^a[.]", "rule": "packed_colwise"},
                                             {"pattern": "^b[.]", "rule": "packed_rowwise"}]})");
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  const std::vector<TensorInfo> ts = {T("a.weight", {8, 4}), T("a.bias", {10}), T("b.weight", {4, 8}),
                                      T("b.scale", {8})};
  auto outs = plan->Resolve(ts, 1, 2);
  ASSERT_TRUE(outs.ok()) << outs.status().ToString();
  auto m = ByName(*outs);
  EXPECT_EQ(m["a.weight"].pieces.at(0).spec.fused_chunks, 2);
  const ShardSpec bias = m["a.bias"].pieces.at(0).spec;
  EXPECT_EQ(bias.kind, ShardSpec::Kind::kSplit);
  EXPECT_EQ(bias.fused_chunks, 1);
  auto out = PlanOutput(m["a.bias"], ts);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_EQ(out->shape, (std::vector<int64_t>{5}));  // rows [5, 10), not rows 3-4 and 8-9
  EXPECT_EQ(m["b.weight"].pieces.at(0).spec.fused_chunks, 2);
  EXPECT_EQ(m["b.scale"].pieces.at(0).spec.kind, ShardSpec::Kind::kReplicate);
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

TEST(TpPlanTest, ChunkPartsFollowTorchChunkAndTensorSplitStays) {
  auto hf = TpPlan::FromJson(R"({"rules": [{"pattern": "^lm_head", "rule": "colwise"}]})");
  ASSERT_TRUE(hf.ok()) << hf.status().ToString();
  auto meg = TpPlan::FromJson(R"({"rules": [{"pattern": "^lm_head", "rule": "vocab"}]})");
  ASSERT_TRUE(meg.ok());
  // 10 rows over 4 ranks: torch.chunk gives 3, 3, 3, 1; torch.tensor_split 3, 3, 2, 2.
  const std::vector<int64_t> chunk = {3, 3, 3, 1}, split = {3, 3, 2, 2};
  for (int r = 0; r < 4; ++r) {
    auto a = hf->Resolve({T("lm_head.weight", {10, 2})}, r, 4);
    auto b = meg->Resolve({T("lm_head.weight", {10, 2})}, r, 4);
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(PlanOutput((*a)[0], {T("lm_head.weight", {10, 2})})->shape[0], chunk[r]);
    EXPECT_EQ(PlanOutput((*b)[0], {T("lm_head.weight", {10, 2})})->shape[0], split[r]);
  }
  // 5 rows over 4: chunk gives 2, 2, 1, 0 (an empty part for the last rank).
  auto last = hf->Resolve({T("lm_head.weight", {5, 2})}, 3, 4);
  ASSERT_TRUE(last.ok());
  EXPECT_EQ(PlanOutput((*last)[0], {T("lm_head.weight", {5, 2})})->shape, (std::vector<int64_t>{0, 2}));
}

TEST(TpPlanTest, KvHeadsAreReplicatedWholeAndQHeadsNever) {
  auto plan = TpPlan::FromJson(R"({"rules": [
      {"pattern": "^q$", "rule": {"split": 0, "heads": 4}},
      {"pattern": "^k$", "rule": {"split": 0, "kv_heads": 2}}]})");
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  const std::vector<TensorInfo> t = {T("q", {16, 8}), T("k", {8, 8})};
  for (int r = 0; r < 4; ++r) {
    auto outs = plan->Resolve(t, r, 4);
    ASSERT_TRUE(outs.ok()) << outs.status().ToString();
    auto m = ByName(*outs);
    auto k = PlanOutput(m["k"], t);
    ASSERT_TRUE(k.ok());
    EXPECT_EQ(k->shape, (std::vector<int64_t>{4, 8}));               // one whole kv head (4 rows)
    EXPECT_EQ(k->pieces[0].regions[0].src_offset, (r / 2) * 4 * 8 * 4u);  // ranks 0, 1: head 0; 2, 3: head 1
  }
  auto eight = plan->Resolve(t, 0, 8);
  ASSERT_FALSE(eight.ok());
  EXPECT_NE(eight.status().message().find("4 heads do not divide over world 8"), std::string::npos)
      << eight.status().ToString();
  auto three = plan->Resolve({T("k", {8, 8}), T("q", {12, 8})}, 0, 3);
  ASSERT_FALSE(three.ok());
  EXPECT_NE(three.status().message().find("'k'"), std::string::npos) << three.status().ToString();
  EXPECT_NE(three.status().message().find("2 key/value heads cannot be replicated evenly over world 3"),
            std::string::npos);
  auto bad = plan->Resolve({T("q", {18, 8}), T("k", {8, 8})}, 0, 2);  // 18 rows are not 4 heads
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("does not hold 4 equal heads"), std::string::npos) << bad.status().ToString();
}

TEST(TpPlanTest, SectionsExpertsStacksAndConditions) {
  auto plan = TpPlan::FromJson(R"({"rules": [
      {"pattern": "^qkv$", "rule": {"split": 0, "sections": [{"rows": 8, "heads": 4}, {"rows": 2, "kv_heads": 1},
                                                             {"rows": 2, "kv_heads": 1}]}},
      {"pattern": "^(x)\\.(\\d+)\\.(w1|w3)$", "rule": {"expert": 2, "experts": 4},
       "fuse_into": "$1.gate_up", "fuse_key": [2, 3], "fuse_order": ["w1", "w3"], "stack": 2, "stack_count": 4},
      {"pattern": "^emb$", "rule": "embedding_rowwise", "if_absent": "^head$"}]})");
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  std::vector<TensorInfo> t = {T("qkv", {12, 3}), T("emb", {6, 3})};
  for (int e : {3, 0, 2, 1})
    for (const char* w : {"w3", "w1"}) t.push_back(T("x." + std::to_string(e) + "." + w, {5, 3}));
  auto outs = plan->Resolve(t, 1, 2);
  ASSERT_TRUE(outs.ok()) << outs.status().ToString();
  auto m = ByName(*outs);
  // qkv: q rows [4, 8) + the one k row block + the one v row block (replicated).
  auto qkv = PlanOutput(m["qkv"], t);
  ASSERT_TRUE(qkv.ok());
  EXPECT_EQ(qkv->shape, (std::vector<int64_t>{8, 3}));
  ASSERT_EQ(qkv->pieces.size(), 3u);
  EXPECT_EQ(qkv->pieces[0].regions[0].src_offset, 4 * 3 * 4u);
  EXPECT_EQ(qkv->pieces[1].regions[0].src_offset, 8 * 3 * 4u);
  EXPECT_EQ(qkv->pieces[2].regions[0].src_offset, 10 * 3 * 4u);
  // rank 1 of 2 owns experts 2 and 3, stacked [2, 2 * 5, 3], w1 before w3.
  const ShardOutput& gu = m["x.gate_up"];
  ASSERT_EQ(gu.pieces.size(), 4u);
  EXPECT_EQ(gu.pieces[0].source, "x.2.w1");
  EXPECT_EQ(gu.pieces[1].source, "x.2.w3");
  EXPECT_EQ(gu.pieces[2].source, "x.3.w1");
  EXPECT_EQ(gu.shape, (std::vector<int64_t>{2, 10, 3}));
  EXPECT_EQ(PlanOutput(gu, t)->shape, (std::vector<int64_t>{2, 10, 3}));
  EXPECT_FALSE(m.count("x.0.w1"));
  EXPECT_EQ(m["emb"].pieces[0].spec.kind, ShardSpec::Kind::kSplit);  // no head: tied, so split
  t.push_back(T("head", {6, 3}));
  auto with_head = plan->Resolve(t, 1, 2);
  ASSERT_TRUE(with_head.ok());
  EXPECT_EQ(ByName(*with_head)["emb"].pieces[0].spec.kind, ShardSpec::Kind::kReplicate);
  // A missing expert is named by the stack count.
  std::vector<TensorInfo> missing;
  for (const auto& x : t)
    if (x.name != "x.3.w1" && x.name != "x.3.w3") missing.push_back(x);
  auto short_stack = plan->Resolve(missing, 1, 2);
  ASSERT_FALSE(short_stack.ok());
  EXPECT_NE(short_stack.status().message().find("stacks 1 experts on rank 1, the config names 2"), std::string::npos)
      << short_stack.status().ToString();
  // Sections that do not add up to the tensor.
  auto wrong = plan->Resolve({T("qkv", {14, 3})}, 0, 2);
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.status().message().find("sections (config) add up to 12"), std::string::npos) << wrong.status().ToString();
}

TEST(TpPlanTest, BuiltInConventionsConfigsAndErrors) {
  EXPECT_EQ(*ParseConvention("hf"), Convention::kHf);
  EXPECT_EQ(std::string(ConventionName(Convention::kMegatron)), "megatron");
  EXPECT_FALSE(ParseConvention("deepspeed").ok());
  auto unknown = TpPlan::BuiltIn("gpt-5");
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("built-in families: llama"), std::string::npos);
  EXPECT_NE(unknown.status().message().find("plan file"), std::string::npos);
  auto fam = TpPlan::FamilyOf(R"({"model_type": "qwen2_moe"})");
  ASSERT_TRUE(fam.ok());
  EXPECT_EQ(*fam, "qwen2_moe");
  EXPECT_EQ(*TpPlan::FamilyOf(R"({"architectures": ["MixtralForCausalLM"]})"), "mixtral");
  EXPECT_EQ(*TpPlan::FamilyOf(R"({"model_type": "gpt_neo"})"), "gpt-neo");
  EXPECT_FALSE(TpPlan::FamilyOf(R"({"model_type": "t5"})").ok());
  EXPECT_FALSE(TpPlan::FamilyOf("").ok());
  EXPECT_FALSE(TpPlan::FamilyOf("[1, 2").ok());
  auto typed = TpPlan::ForConfig(R"({"model_type": "llama", "num_key_value_heads": 2.5})");
  ASSERT_FALSE(typed.ok());
  EXPECT_NE(typed.status().message().find("'num_key_value_heads'"), std::string::npos) << typed.status().ToString();
  auto gqa = TpPlan::ForConfig(R"({"model_type": "llama", "num_attention_heads": 6, "num_key_value_heads": 4})");
  ASSERT_FALSE(gqa.ok());
  EXPECT_NE(gqa.status().message().find("not a multiple of num_key_value_heads"), std::string::npos);
  TpPlan::Options hf;
  hf.convention = Convention::kHf;
  auto no_hf = TpPlan::BuiltIn("bloom", hf);  // transformers has no plan: whole at world 1 only
  ASSERT_TRUE(no_hf.ok()) << no_hf.status().ToString();
  const std::vector<TensorInfo> bloom = {T("h.0.self_attention.query_key_value.weight", {12, 4})};
  EXPECT_TRUE(no_hf->Resolve(bloom, 0, 1).ok());
  auto two = no_hf->Resolve(bloom, 0, 2);
  ASSERT_FALSE(two.ok());
  EXPECT_NE(two.status().message().find("\"megatron\""), std::string::npos) << two.status().ToString();
  auto phi3 = TpPlan::BuiltIn("phi3");
  ASSERT_FALSE(phi3.ok());
  EXPECT_NE(phi3.status().message().find("needs the model's config"), std::string::npos);
  TpPlan::Options ep;
  ep.expert_parallel = true;
  EXPECT_FALSE(TpPlan::BuiltIn("mixtral", ep).ok());  // the expert count comes from the config
  TpPlan::Options hf_fused = hf;
  hf_fused.fuse_qkv = true;
  auto contradiction = TpPlan::BuiltIn("llama", hf_fused);
  ASSERT_FALSE(contradiction.ok());
  EXPECT_NE(contradiction.status().message().find("options of the \"megatron\" convention"), std::string::npos);
  auto plan = TpPlan::BuiltIn("llama", hf);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->convention(), Convention::kHf);
  EXPECT_EQ(plan->family(), "llama");
  EXPECT_NE(plan->json().find("colwise_gather_output"), std::string::npos);
  // A plan whose rules match nothing is an error, not a full replica.
  auto gpt = plan->Resolve({T("h.0.attn.c_attn.weight", {8, 24})}, 0, 2);
  ASSERT_FALSE(gpt.ok());
  EXPECT_NE(gpt.status().message().find("another family"), std::string::npos) << gpt.status().ToString();
  auto file = TpPlan::FromJson(R"({"rules": [{"pattern": "^nothing$", "rule": "column"}]})");
  ASSERT_TRUE(file.ok());
  auto none = file->Resolve({T("w", {4, 4})}, 0, 2);
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("none of its rules matches any tensor"), std::string::npos);
}

// A malformed config.json is an InvalidArgument naming the cause, never a crash or an
// exception: nesting far deeper than any recursion survives (as a field's value, where an
// error message used to dump it, and as the document), bytes that are not UTF-8, numbers
// too large for any type, wrong types.
TEST(TpPlanTest, MalformedConfigsAreTypedErrorsNotCrashes) {
  const size_t depth = 300000;
  const std::string deep = std::string(depth, '[') + std::string(depth, ']');
  struct Case {
    std::string config;
    const char* expected;
  } cases[] = {
      {R"({"model_type": "llama", "num_attention_heads": )" + deep + "}", "'num_attention_heads' must be a positive integer, got an array"},
      {R"({"model_type": "llama", "tie_word_embeddings": {"a": )" + deep + "}}", "must be true or false, got an object"},
      {deep, "config must be a JSON object"},
      {std::string(depth, '{'), "not valid JSON"},
      {"{\"model_type\": \"llama\xff\xfe\"}", "not valid JSON"},
      {"\xef\xbb\xbf\xc3\x28{}", "not valid JSON"},
      {R"({"model_type": "llama", "num_attention_heads": 1e400})", "number overflow"},
      {R"({"model_type": "llama", "num_attention_heads": 18446744073709551615})", "must be a positive integer"},
      {R"({"model_type": "llama", "num_attention_heads": 1000000000000000000000000000000})", "must be a positive integer"},
      {R"({"model_type": "llama", "hidden_size": -4096})", "'hidden_size' must be a positive integer"},
      {R"({"model_type": ["llama"]})", "'model_type' must be a string"},
      {R"({"architectures": "LlamaForCausalLM"})", "'architectures' must be a list of strings"},
      {R"({"model_type": "llama", "num_attention_heads": ")" + std::string(1000, 'x') + "\"}", "must be a positive integer"},
      {R"({"model_type": "llama", "intermediate_size": [128, -1]})", "'intermediate_size' must be a positive integer"},
      {R"({"model_type": "llama", "intermediate_size": [128, [1]]})", "'intermediate_size' must be a positive integer"},
      {R"({"model_type": "llama", "intermediate_size": [null]})", "'intermediate_size' must be a positive integer or a list"},
      {R"({"model_type": "llama", "intermediate_size": [128, 256, -1]})", "'intermediate_size' must be a positive integer"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.config.substr(0, 60));
    auto plan = TpPlan::ForConfig(c.config);
    ASSERT_FALSE(plan.ok());
    EXPECT_EQ(plan.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(plan.status().message().find(c.expected), std::string::npos) << plan.status().ToString();
    EXPECT_LT(plan.status().message().size(), 600u) << "an error message bounded whatever the config holds";
  }
  auto deep_rule = TpPlan::FromJson(R"({"rules": [{"pattern": "x", "rule": )" + deep + "}]}");
  ASSERT_FALSE(deep_rule.ok());
  EXPECT_LT(deep_rule.status().message().size(), 600u);
}

// transformers gives some sizes per layer (gemma3n: intermediate_size [8192, 8192, ...]): a
// list is read, equal or not, where a plan needs no single value.
TEST(TpPlanTest, PerLayerSizesAreLists) {
  for (const char* sizes : {"[128, 128]", "[128, 256]", "[]"}) {
    SCOPED_TRACE(sizes);
    auto plan = TpPlan::ForConfig(std::string(R"({"model_type": "llama", "intermediate_size": )") + sizes + "}");
    EXPECT_TRUE(plan.ok()) << plan.status().ToString();
  }
}

// head_dim 0 is transformers' "derive it" (glm5_next's default): hidden / heads, as without it.
TEST(TpPlanTest, HeadDimZeroIsDerived) {
  const std::string tensors = R"([{"name": "model.layers.0.self_attn.q_proj.weight", "dtype": "F32", "shape": [64, 64]}])";
  auto zero = TpPlan::ForConfig(R"({"model_type": "llama", "hidden_size": 64, "num_attention_heads": 8, "head_dim": 0})");
  ASSERT_TRUE(zero.ok()) << zero.status().ToString();
  auto negative = TpPlan::ForConfig(R"({"model_type": "llama", "hidden_size": 64, "num_attention_heads": 8, "head_dim": -1})");
  ASSERT_FALSE(negative.ok());
  EXPECT_NE(negative.status().message().find("'head_dim' must be a positive integer"), std::string::npos);
}

TEST(TpPlanTest, PlanFileErrorsNameTheEntry) {
  for (const char* bad : {
           R"J({"rules": [{"pattern": "(", "rule": "column"}]})J",
           R"({"rules": [{"pattern": "x", "rule": {"split": 0, "heads": 0}}]})",
           R"({"rules": [{"pattern": "x", "rule": {"split": 0, "heads": 2, "kv_heads": 2}}]})",
           R"({"rules": [{"pattern": "x", "rule": {"split": 1, "sections": [{"rows": 2}]}}]})",
           R"({"rules": [{"pattern": "x", "rule": {"expert": 1, "experts": 4}}]})",
           R"J({"rules": [{"pattern": "(x)", "rule": "column", "fuse_into": "$2"}]})J",
           R"J({"rules": [{"pattern": "(x)", "rule": "column", "fuse_into": "a$"}]})J",
           R"J({"rules": [{"pattern": "(x)", "rule": "column", "stack": 1}]})J",
           R"J({"rules": [{"pattern": "(x)", "rule": "column", "fuse_into": "y", "stack": 0}]})J",
           R"J({"rules": [{"pattern": "x", "rule": "column", "if_absent": "("}]})J",
           R"({"convention": "deepspeed"})",
           R"({"require": [{"count": 1}]})",
           R"({"rules": [{"pattern": "x", "rule": {"split": 0, "uneven": "sometimes"}}]})"}) {
    auto plan = TpPlan::FromJson(bad);
    ASSERT_FALSE(plan.ok()) << bad;
    EXPECT_EQ(plan.status().code(), StatusCode::kInvalidArgument) << bad;
  }
  auto bad = TpPlan::FromJson(R"J({"rules": [{"pattern": "ok"}, {"pattern": "q(", "rule": "column"}]})J");
  ASSERT_FALSE(bad.ok());
  auto bad2 = TpPlan::FromJson(R"J({"rules": [{"pattern": "ok", "rule": "row"}, {"pattern": "q(", "rule": "column"}]})J");
  ASSERT_FALSE(bad2.ok());
  EXPECT_NE(bad2.status().message().find("plan rule #1"), std::string::npos) << bad2.status().ToString();
  EXPECT_NE(bad2.status().message().find("/q(/"), std::string::npos) << bad2.status().ToString();
}

}  // namespace
}  // namespace ckpt

namespace ckpt {
namespace {

// The bytes of output `o` gathered from float sources whose element i is their base + i.
std::vector<float> GatherFloats(const ShardOutput& o, const std::vector<TensorInfo>& t,
                                const std::map<std::string, std::vector<float>>& data) {
  auto layout = PlanOutput(o, t);
  EXPECT_TRUE(layout.ok()) << layout.status().ToString();
  if (!layout.ok()) return {};
  std::vector<const std::byte*> sources;
  for (const ShardPiece& p : o.pieces) sources.push_back(reinterpret_cast<const std::byte*>(data.at(p.source).data()));
  std::vector<float> out(layout->nbytes / sizeof(float));
  EXPECT_TRUE(GatherOutput(o, *layout, sources, out.data(), layout->nbytes).ok());
  return out;
}

std::vector<float> Iota(int64_t n, float base) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = base + static_cast<float>(i);
  return v;
}

// chunk_into: the parts are rows of their source, each placed by its own name's rule;
// the bytes are torch.chunk's parts split by their styles.
TEST(TpPlanChunkTest, PartsAreRowsOfTheSourcePlacedByTheirOwnRules) {
  auto plan = TpPlan::FromJson(R"J({"rules": [
      {"pattern": "^(.*?)gate_up\\.weight(.*)$", "chunk_into": ["$1gate.weight$2", "$1up.weight$2"]},
      {"pattern": "^(.*?)qkv\\.bias$", "chunk_into": ["$1q.bias", "$1k.bias", "$1v.bias"]},
      {"pattern": "\\.gate\\.weight$", "rule": "colwise"},
      {"pattern": "\\.up\\.weight$", "rule": "rowwise"},
      {"pattern": "\\.q\\.bias$", "rule": "colwise"}]})J");
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  const std::vector<TensorInfo> t = {T("m.gate_up.weight", {8, 6}), T("m.qkv.bias", {12})};
  const std::map<std::string, std::vector<float>> data = {{"m.gate_up.weight", Iota(48, 0)},
                                                          {"m.qkv.bias", Iota(12, 100)}};
  for (int world : {1, 2}) {
    for (int rank = 0; rank < world; ++rank) {
      auto outs = plan->Resolve(t, rank, world);
      ASSERT_TRUE(outs.ok()) << outs.status().ToString();
      auto m = ByName(*outs);
      ASSERT_EQ(m.size(), 5u);  // gate, up, q, k, v: the sources themselves are no outputs
      // gate: rows [0, 4) colwise (dim 0): rank's rows [rank * 4 / world, ...)
      std::vector<float> gate;
      for (int r = rank * 4 / world; r < (rank + 1) * 4 / world; ++r)
        for (int c = 0; c < 6; ++c) gate.push_back(static_cast<float>(r * 6 + c));
      EXPECT_EQ(GatherFloats(m["m.gate.weight"], t, data), gate);
      // up: rows [4, 8) rowwise (dim -1): the rank's columns of each row
      std::vector<float> up;
      for (int r = 4; r < 8; ++r)
        for (int c = rank * 6 / world; c < (rank + 1) * 6 / world; ++c) up.push_back(static_cast<float>(r * 6 + c));
      EXPECT_EQ(GatherFloats(m["m.up.weight"], t, data), up);
      // q: elements [0, 4) split; k, v whole (no rule: replicated)
      EXPECT_EQ(GatherFloats(m["m.q.bias"], t, data), Iota(4 / world, 100.f + static_cast<float>(rank * 4 / world)));
      EXPECT_EQ(GatherFloats(m["m.k.bias"], t, data), Iota(4, 104));
      EXPECT_EQ(GatherFloats(m["m.v.bias"], t, data), Iota(4, 108));
    }
  }
}

TEST(TpPlanChunkTest, BadChunksAreClearErrors) {
  for (const char* bad : {
           R"J({"rules": [{"pattern": "x", "chunk_into": ["a", "b"], "rule": "column"}]})J",  // both
           R"J({"rules": [{"pattern": "x", "chunk_into": ["a"]}]})J",                         // one part
           R"J({"rules": [{"pattern": "x", "chunk_into": "a"}]})J",
           R"J({"rules": [{"pattern": "x", "chunk_into": ["a", ""]}]})J",
           R"J({"rules": [{"pattern": "(x)", "chunk_into": ["$2", "b"]}]})J",                 // no group 2
           R"J({"rules": [{"pattern": "x", "chunk_into": ["a", "b"], "transpose": true}]})J",
           R"J({"rules": [{"pattern": "x", "chunk_into": ["a", "b"], "fuse_into": "y"}]})J"}) {
    auto plan = TpPlan::FromJson(bad);
    ASSERT_FALSE(plan.ok()) << bad;
    EXPECT_EQ(plan.status().code(), StatusCode::kInvalidArgument) << bad;
  }
  auto plan = TpPlan::FromJson(R"J({"rules": [
      {"pattern": "^w$", "chunk_into": ["a", "b", "c"]},
      {"pattern": "^again$", "chunk_into": ["w", "z"]},
      {"pattern": "^taken$", "chunk_into": ["other", "p"]}]})J");
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  auto uneven = plan->Resolve({T("w", {8, 2})}, 0, 2);
  ASSERT_FALSE(uneven.ok());
  EXPECT_NE(uneven.status().message().find("tensor 'w'"), std::string::npos) << uneven.status().ToString();
  EXPECT_NE(uneven.status().message().find("does not cut into 3 equal parts"), std::string::npos);
  auto scalar = plan->Resolve({T("w", {})}, 0, 1);
  EXPECT_FALSE(scalar.ok());
  auto twice = plan->Resolve({T("again", {4, 2})}, 0, 1);  // part 'w' matches a chunk rule
  ASSERT_FALSE(twice.ok());
  EXPECT_NE(twice.status().message().find("a part is cut again"), std::string::npos) << twice.status().ToString();
  auto collide = plan->Resolve({T("taken", {4, 2}), T("other", {2, 2})}, 0, 1);  // a part named as a tensor
  ASSERT_FALSE(collide.ok());
  EXPECT_NE(collide.status().message().find("'other' is already taken"), std::string::npos)
      << collide.status().ToString();
  // FP8: a chunked weight's block scale is refused, naming both.
  auto fp8 = plan->Resolve({T("w", {384, 256}, DType::kF8E4M3), T("w_scale_inv", {3, 2})}, 0, 1);
  ASSERT_FALSE(fp8.ok());
  EXPECT_NE(fp8.status().message().find("weight 'w' is cut into parts"), std::string::npos) << fp8.status().ToString();
}

// transformers' PermuteForRope of a 2-d weight or 1-d bias of `heads` heads (rows h * hd +
// 2j + s become h * hd + s * hd / 2 + j), written as its _apply is: view(heads, half, 2, cols)
// .transpose(1, 2).
std::vector<float> PermutedForRope(const std::vector<float>& w, int64_t rows, int64_t cols, int64_t heads) {
  const int64_t half = rows / heads / 2;
  std::vector<float> out(w.size());
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t j = 0; j < half; ++j)
      for (int64_t s = 0; s < 2; ++s)
        for (int64_t c = 0; c < cols; ++c)
          out[static_cast<size_t>(((h * 2 + s) * half + j) * cols + c)] =
              w[static_cast<size_t>(((h * half + j) * 2 + s) * cols + c)];
  return out;
}

// chunk_into with permute_for_rope: the permuted parts hold their rows in transformers'
// order, whole or split along a later dim; a rule that splits the rows is refused.
TEST(TpPlanChunkTest, RopePermutedPartsAreTransformersRowOrder) {
  auto plan = TpPlan::FromJson(R"J({"rules": [
      {"pattern": "^(.*?)wqkv(.*)$", "chunk_into": ["$1q$2", "$1k$2", "$1v$2"],
       "permute_for_rope": {"parts": [0, 1], "heads": 2}},
      {"pattern": "\\.k\\.weight$", "rule": "rowwise"}]})J");
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  const int64_t rows = 8, cols = 3;  // 2 heads of 4 rows (2 rotary pairs) per part
  const std::vector<TensorInfo> t = {T("a.wqkv.weight", {3 * rows, cols}), T("a.wqkv.bias", {3 * rows})};
  const std::vector<float> w = Iota(3 * rows * cols, 0), b = Iota(3 * rows, 1000);
  const std::map<std::string, std::vector<float>> data = {{"a.wqkv.weight", w}, {"a.wqkv.bias", b}};
  auto part = [](const std::vector<float>& v, int64_t k, int64_t n) {
    return std::vector<float>(v.begin() + k * n, v.begin() + (k + 1) * n);
  };
  for (int world : {1, 2, 3}) {
    for (int rank = 0; rank < world; ++rank) {
      auto outs = plan->Resolve(t, rank, world);
      ASSERT_TRUE(outs.ok()) << outs.status().ToString();
      auto m = ByName(*outs);
      ASSERT_EQ(m.size(), 6u);
      EXPECT_EQ(GatherFloats(m["a.q.weight"], t, data), PermutedForRope(part(w, 0, rows * cols), rows, cols, 2));
      EXPECT_EQ(GatherFloats(m["a.q.bias"], t, data), PermutedForRope(part(b, 0, rows), rows, 1, 2));
      EXPECT_EQ(GatherFloats(m["a.k.bias"], t, data), PermutedForRope(part(b, 1, rows), rows, 1, 2));
      EXPECT_EQ(GatherFloats(m["a.v.weight"], t, data), part(w, 2, rows * cols));  // not permuted
      EXPECT_EQ(GatherFloats(m["a.v.bias"], t, data), part(b, 2, rows));
      // k's weight permuted, then split rowwise (its columns): torch.chunk parts of 3 columns
      const std::vector<float> k = PermutedForRope(part(w, 1, rows * cols), rows, cols, 2);
      const int64_t c0 = world == 2 ? rank * 2 : (world == 3 ? rank : 0);
      const int64_t c1 = world == 2 ? std::min<int64_t>(3, c0 + 2) : (world == 3 ? c0 + 1 : 3);
      std::vector<float> k_cols;
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = c0; c < c1; ++c) k_cols.push_back(k[static_cast<size_t>(r * cols + c)]);
      EXPECT_EQ(GatherFloats(m["a.k.weight"], t, data), k_cols) << "world " << world << " rank " << rank;
    }
  }
  // A split of the permuted rows, heads that do not divide the rows, bad settings: refused.
  auto by_rows = TpPlan::FromJson(R"J({"rules": [
      {"pattern": "^(.*?)wqkv(.*)$", "chunk_into": ["$1q$2", "$1k$2", "$1v$2"],
       "permute_for_rope": {"parts": [0], "heads": 2}},
      {"pattern": "\\.q\\.", "rule": "colwise"}]})J");
  ASSERT_TRUE(by_rows.ok()) << by_rows.status().ToString();
  auto split = by_rows->Resolve(t, 0, 2);
  ASSERT_FALSE(split.ok());
  EXPECT_NE(split.status().message().find("splits the rows that transformers' PermuteForRope reorders"),
            std::string::npos) << split.status().ToString();
  EXPECT_NE(split.status().message().find("'a.q.weight'"), std::string::npos) << split.status().ToString();
  EXPECT_TRUE(by_rows->Resolve(t, 0, 1).ok());
  auto odd = plan->Resolve({T("a.wqkv.weight", {3 * 6, cols})}, 0, 1);  // 6 rows: not 2 heads of pairs
  ASSERT_FALSE(odd.ok());
  EXPECT_NE(odd.status().message().find("6 rows are not 2 heads of rotary pairs"), std::string::npos)
      << odd.status().ToString();
  for (const char* bad : {
           R"J({"rules": [{"pattern": "x", "chunk_into": ["a", "b"], "permute_for_rope": {"parts": [2], "heads": 1}}]})J",
           R"J({"rules": [{"pattern": "x", "chunk_into": ["a", "b"], "permute_for_rope": {"parts": [0], "heads": 0}}]})J",
           R"J({"rules": [{"pattern": "x", "chunk_into": ["a", "b"], "permute_for_rope": {"parts": [0]}}]})J",
           R"J({"rules": [{"pattern": "x", "chunk_into": ["a", "b"], "permute_for_rope": {"parts": [], "heads": 1}}]})J",
           R"J({"rules": [{"pattern": "x", "rule": "replicate", "permute_for_rope": {"parts": [0], "heads": 1}}]})J"}) {
    auto p = TpPlan::FromJson(bad);
    EXPECT_FALSE(p.ok()) << bad;
  }
}

// "stack_count" as a list: the stack holds one of the counts (longcat_flash's gate/up
// experts, which transformers stacks for its zero experts too); any other is refused.
TEST(TpPlanChunkTest, StackCountListAcceptsEachCount) {
  auto plan = TpPlan::FromJson(R"J({"rules": [
      {"pattern": "^(m)\\.e\\.(\\d+)\\.w$", "rule": "replicate", "fuse_into": "$1.w", "fuse_key": 2, "stack": 2,
       "stack_count": [2, 3]}]})J");
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  for (int n : {2, 3}) {
    std::vector<TensorInfo> t;
    for (int e = 0; e < n; ++e) t.push_back(T("m.e." + std::to_string(e) + ".w", {4, 2}));
    auto outs = plan->Resolve(t, 0, 1);
    ASSERT_TRUE(outs.ok()) << outs.status().ToString();
    EXPECT_EQ((*outs)[0].shape, (std::vector<int64_t>{n, 4, 2}));
  }
  auto four = plan->Resolve({T("m.e.0.w", {4, 2}), T("m.e.1.w", {4, 2}), T("m.e.2.w", {4, 2}), T("m.e.3.w", {4, 2})}, 0, 1);
  ASSERT_FALSE(four.ok());
  EXPECT_NE(four.status().message().find("stacks 4 experts, the config names 2 or 3"), std::string::npos)
      << four.status().ToString();
  EXPECT_FALSE(TpPlan::FromJson(R"J({"rules": [{"pattern": "(m)(\\d)", "rule": "replicate", "fuse_into": "x",
      "stack": 2, "stack_count": []}]})J").ok());
  EXPECT_FALSE(TpPlan::FromJson(R"J({"rules": [{"pattern": "(m)(\\d)", "rule": "replicate", "fuse_into": "x",
      "stack": 2, "stack_count": [2, 0]}]})J").ok());
}

// "fuse_dim": 1: stacked [E, r, c] gate and up side by side along dim 1 (torch.cat(dim=1)),
// each split as its block of a packed_colwise output, the view [E, 2r/world, c].
TEST(TpPlanChunkTest, FuseDim1ConcatenatesStackedSlabs) {
  auto plan = TpPlan::FromJson(R"J({"rules": [
      {"pattern": "^(m\\.)(gate|up)(\\.w)$", "rule": {"split": -2}, "fuse_into": "$1gate_up", "fuse_key": 2,
       "fuse_order": ["gate", "up"], "fuse_count": 2, "fuse_dim": 1, "stack_count": 3}]})J");
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  const int64_t E = 3, r = 4, c = 2;
  const std::vector<TensorInfo> t = {T("m.up.w", {E, r, c}), T("m.gate.w", {E, r, c})};
  const std::map<std::string, std::vector<float>> data = {{"m.gate.w", Iota(E * r * c, 0)},
                                                          {"m.up.w", Iota(E * r * c, 1000)}};
  for (int world : {1, 2, 4}) {
    for (int rank = 0; rank < world; ++rank) {
      auto outs = plan->Resolve(t, rank, world);
      ASSERT_TRUE(outs.ok()) << outs.status().ToString();
      ASSERT_EQ(outs->size(), 1u);
      const ShardOutput& o = (*outs)[0];
      EXPECT_EQ(o.name, "m.gate_up");
      const int64_t rows = r / world;
      EXPECT_EQ(o.shape, (std::vector<int64_t>{E, 2 * rows, c}));
      // expert e: gate's rows of this rank, then up's (torch.cat([gate, up], dim=1) split per block)
      std::vector<float> want;
      for (int64_t e = 0; e < E; ++e)
        for (float base : {0.f, 1000.f})
          for (int64_t i = rank * rows; i < (rank + 1) * rows; ++i)
            for (int64_t j = 0; j < c; ++j) want.push_back(base + static_cast<float>((e * r + i) * c + j));
      EXPECT_EQ(GatherFloats(o, t, data), want) << "world " << world << " rank " << rank;
    }
  }
  // Missing source, another expert count, a split of dim 0, a 1-d source, bad settings.
  auto missing = plan->Resolve({t[1]}, 0, 1);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("fuses 1 tensors"), std::string::npos) << missing.status().ToString();
  auto four = plan->Resolve({T("m.up.w", {4, r, c}), T("m.gate.w", {4, r, c})}, 0, 1);
  ASSERT_FALSE(four.ok());
  EXPECT_NE(four.status().message().find("stacks 4 experts, the config names 3"), std::string::npos)
      << four.status().ToString();
  auto dim0 = TpPlan::FromJson(R"J({"rules": [{"pattern": "^(m\\.)(gate|up)(\\.w)$", "rule": "column",
      "fuse_into": "$1gate_up", "fuse_key": 2, "fuse_dim": 1}]})J");
  ASSERT_TRUE(dim0.ok()) << dim0.status().ToString();
  auto across = dim0->Resolve(t, 0, 3);
  ASSERT_FALSE(across.ok());
  EXPECT_NE(across.status().message().find("splits dim 0, across the slabs"), std::string::npos)
      << across.status().ToString();
  auto flat = dim0->Resolve({T("m.gate.w", {4}), T("m.up.w", {4})}, 0, 1);
  ASSERT_FALSE(flat.ok());
  EXPECT_NE(flat.status().message().find("needs tensors of 2 or more dims"), std::string::npos) << flat.status().ToString();
  for (const char* bad : {
           R"J({"rules": [{"pattern": "(x)", "rule": "replicate", "fuse_dim": 1}]})J",
           R"J({"rules": [{"pattern": "(x)", "rule": "replicate", "fuse_into": "y", "fuse_dim": 2}]})J",
           R"J({"rules": [{"pattern": "(x)", "rule": "replicate", "fuse_into": "y", "fuse_dim": 1, "stack": 1}]})J",
           R"J({"rules": [{"pattern": "(x)", "rule": "replicate", "fuse_into": "y", "fuse_dim": 1, "transpose": true}]})J",
           R"J({"rules": [{"pattern": "(x)", "rule": "replicate", "fuse_into": "y", "stack_count": 2}]})J"}) {
    EXPECT_FALSE(TpPlan::FromJson(bad).ok()) << bad;
  }
}

// "swap_dims": transformers' Transpose at load: a stacked [E, a, b] whole tensor becomes
// [E, b, a] (each expert's matrix transposed), not where check_dims ("unless") finds it in
// the model's layout; a rename through fuse_into; a split of it is refused.
TEST(TpPlanChunkTest, SwapDimsTransposesWholeTensorsUnlessInTheModelsLayout) {
  auto plan = TpPlan::FromJson(R"J({"rules": [
      {"pattern": "^(.*?)(experts\\.down)(.*)$", "rule": "replicate", "swap_dims": {"dims": [1, 2], "unless": [1, 4]}},
      {"pattern": "^(.*?)(gate\\.w1)(.*)$", "rule": "replicate", "swap_dims": {"dims": [0, 1]},
       "fuse_into": "$1vision.gate$3"}]})J");
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  const std::vector<TensorInfo> hub = {T("l.experts.down", {2, 3, 4}), T("l.gate.w1", {3, 2})};
  const std::map<std::string, std::vector<float>> data = {{"l.experts.down", Iota(24, 0)}, {"l.gate.w1", Iota(6, 100)}};
  for (int world : {1, 2}) {
    auto outs = plan->Resolve(hub, world - 1, world);
    ASSERT_TRUE(outs.ok()) << outs.status().ToString();
    auto m = ByName(*outs);
    ASSERT_EQ(m.size(), 2u);
    auto down = PlanOutput(m["l.experts.down"], hub);
    ASSERT_TRUE(down.ok()) << down.status().ToString();
    EXPECT_EQ(down->shape, (std::vector<int64_t>{2, 4, 3}));
    std::vector<float> want;  // torch.transpose(x, 1, 2).contiguous()
    for (int e = 0; e < 2; ++e)
      for (int j = 0; j < 4; ++j)
        for (int i = 0; i < 3; ++i) want.push_back(static_cast<float>(e * 12 + i * 4 + j));
    EXPECT_EQ(GatherFloats(m["l.experts.down"], hub, data), want);
    EXPECT_EQ(GatherFloats(m["l.vision.gate"], hub, data), (std::vector<float>{100, 102, 104, 101, 103, 105}));
  }
  // Already in the model's layout (dim 1 is 4): the tensor as it is.
  auto model = plan->Resolve({T("l.experts.down", {2, 4, 3})}, 0, 1);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  EXPECT_FALSE((*model)[0].transpose);
  // Neither way round, not the last two dims, or split: refused naming the tensor.
  auto neither = plan->Resolve({T("l.experts.down", {2, 3, 5})}, 0, 1);
  ASSERT_FALSE(neither.ok());
  EXPECT_NE(neither.status().message().find("neither as it is nor transposed"), std::string::npos)
      << neither.status().ToString();
  EXPECT_NE(neither.status().message().find("'l.experts.down'"), std::string::npos);
  auto not_last = plan->Resolve({T("l.gate.w1", {3, 2, 2})}, 0, 1);
  ASSERT_FALSE(not_last.ok());
  EXPECT_NE(not_last.status().message().find("are not its last two"), std::string::npos) << not_last.status().ToString();
  auto split_plan = TpPlan::FromJson(R"J({"rules": [{"pattern": "w", "rule": "column", "swap_dims": {"dims": [0, 1]}}]})J");
  ASSERT_TRUE(split_plan.ok());
  EXPECT_TRUE(split_plan->Resolve({T("w", {4, 2})}, 0, 1).ok());
  auto split = split_plan->Resolve({T("w", {4, 2})}, 0, 2);
  ASSERT_FALSE(split.ok());
  EXPECT_NE(split.status().message().find("its rule then splits it"), std::string::npos) << split.status().ToString();
  for (const char* bad : {R"J({"rules": [{"pattern": "w", "rule": "replicate", "swap_dims": {"dims": [0]}}]})J",
                          R"J({"rules": [{"pattern": "w", "rule": "replicate", "swap_dims": {"dims": [0, 1], "x": 1}}]})J",
                          R"J({"rules": [{"pattern": "w", "rule": "replicate", "swap_dims": {"dims": [0, 1]}, "transpose": true}]})J",
                          R"J({"rules": [{"pattern": "w", "rule": "replicate", "swap_dims": {"dims": [0, 1], "unless": [0, -1]}}]})J"}) {
    EXPECT_FALSE(TpPlan::FromJson(bad).ok()) << bad;
  }
}

TEST(TpPlanChunkTest, FuseCountNamesAMissingSource) {
  auto plan = TpPlan::FromJson(R"J({"rules": [
      {"pattern": "^(m\\.)(q|k|v)c$", "rule": "replicate", "fuse_into": "$1c", "fuse_key": 2,
       "fuse_order": ["q", "k", "v"], "fuse_count": 3}]})J");
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  const std::vector<TensorInfo> all = {T("m.vc", {2, 3}), T("m.qc", {2, 3}), T("m.kc", {2, 3})};
  auto outs = plan->Resolve(all, 1, 2);
  ASSERT_TRUE(outs.ok()) << outs.status().ToString();
  ASSERT_EQ(outs->size(), 1u);
  const ShardOutput& c = (*outs)[0];
  EXPECT_EQ(c.name, "m.c");
  ASSERT_EQ(c.pieces.size(), 3u);
  EXPECT_EQ(c.pieces[0].source, "m.qc");
  EXPECT_EQ(c.pieces[2].source, "m.vc");
  auto missing = plan->Resolve({T("m.vc", {2, 3}), T("m.qc", {2, 3})}, 0, 1);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("output 'm.c' fuses 2 tensors"), std::string::npos)
      << missing.status().ToString();
  EXPECT_FALSE(TpPlan::FromJson(R"J({"rules": [{"pattern": "x", "rule": "column", "fuse_count": 2}]})J").ok());
  EXPECT_FALSE(TpPlan::FromJson(R"J({"rules": [{"pattern": "(x)", "rule": "column", "fuse_into": "y", "fuse_count": 0}]})J").ok());
}

}  // namespace
}  // namespace ckpt
