// ValidatePlan (names, sizes, views, totals with checked arithmetic), CheckExpansion and
// duplicate detection while parsing headers and indexes.
#include "format/load_plan.h"

#include <gtest/gtest.h>

#include "format/safetensors.h"
#include "format/sharded_index.h"

namespace ckpt::format {
namespace {

LoadPlan OneFilePlan() {
  LoadPlan plan;
  auto file = std::make_shared<OpenedFile>();
  file->identity.size = 1 << 20;
  plan.files.push_back(file);
  return plan;
}

PlannedTensor U8(const std::string& name, int64_t n) {
  PlannedTensor t;
  t.name = name;
  t.dtype = DType::kU8;
  t.shape = {n};
  t.nbytes = static_cast<uint64_t>(n);
  return t;
}

TEST(LoadPlanTest, Utf8) {
  EXPECT_TRUE(IsValidUtf8("model.layers.0.w"));
  EXPECT_TRUE(IsValidUtf8("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"));
  EXPECT_FALSE(IsValidUtf8("\xff"));
  EXPECT_FALSE(IsValidUtf8("\xc0\xaf"));          // overlong '/'
  EXPECT_FALSE(IsValidUtf8("\xed\xb3\xbf"));      // a surrogate (Python's surrogateescape)
  EXPECT_FALSE(IsValidUtf8("\xf4\x90\x80\x80"));  // past U+10FFFF
  EXPECT_FALSE(IsValidUtf8("\xe2\x82"));          // truncated
  EXPECT_EQ(EscapedName("a\x1b[31m\xff"), "a\\x1b[31m\\xff");
}

TEST(LoadPlanTest, ValidatePlanRefusesBadNamesAndWrappingSizes) {
  LoadPlan plan = OneFilePlan();
  plan.tensors = {U8("a", 4), U8("b", 4)};
  EXPECT_TRUE(ValidatePlan(plan).ok());
  for (const std::string& bad : {std::string(""), std::string(1025, 'x'), std::string("w\xed\xb3\xbf"),
                                 std::string("a\0b", 3)}) {
    LoadPlan p = plan;
    p.tensors[1].name = bad;
    EXPECT_EQ(ValidatePlan(p).code(), StatusCode::kInvalidArgument) << EscapedName(bad);
  }
  LoadPlan dup = plan;
  dup.tensors[1].name = "a";
  EXPECT_NE(ValidatePlan(dup).message().find("duplicate tensor name"), std::string::npos);
  // Sixteen 2^60-byte tensors: each fine, the total wraps.
  LoadPlan wrap = OneFilePlan();
  for (int i = 0; i < 16; ++i) {
    PlannedTensor t = U8("t" + std::to_string(i), int64_t{1} << 60);
    t.strides = {0};
    t.source_bytes = 1;
    wrap.tensors.push_back(t);
  }
  Status st = ValidatePlan(wrap);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("overflows 64 bits"), std::string::npos) << st.ToString();
  // A view whose extent overflows, and one that reaches past its source bytes.
  LoadPlan view = OneFilePlan();
  PlannedTensor v = U8("v", 4);
  v.shape = {2, 2};
  v.strides = {INT64_MAX, 1};
  v.source_bytes = 4;
  view.tensors = {v};
  EXPECT_EQ(ValidatePlan(view).code(), StatusCode::kInvalidArgument);
  view.tensors[0].strides = {3, 1};
  EXPECT_NE(ValidatePlan(view).message().find("beyond its source bytes"), std::string::npos);
}

TEST(LoadPlanTest, CheckExpansion) {
  LoadPlan plan = OneFilePlan();  // 1 MiB of file
  PlannedTensor t = U8("x", int64_t{60} << 20);
  t.shape = {60, 1 << 20};
  t.strides = {0, 1};
  t.source_bytes = 1 << 20;
  plan.tensors = {t};
  EXPECT_TRUE(CheckExpansion(plan, 16).ok()) << "within the 64 MiB slack";
  plan.tensors[0].shape = {200, 1 << 20};
  plan.tensors[0].nbytes = uint64_t{200} << 20;
  Status st = CheckExpansion(plan, 16);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("--allow-expansion"), std::string::npos) << st.ToString();
  EXPECT_TRUE(CheckExpansion(plan, 0).ok());
  EXPECT_TRUE(CheckExpansion(plan, 500).ok());
  // Aliases count once.
  PlannedTensor alias = plan.tensors[0];
  alias.name = "y";
  alias.alias_of = 0;
  plan.tensors[0].shape = {60, 1 << 20};
  plan.tensors[0].nbytes = uint64_t{60} << 20;
  alias.shape = plan.tensors[0].shape;
  alias.nbytes = plan.tensors[0].nbytes;
  plan.tensors.push_back(alias);
  EXPECT_TRUE(CheckExpansion(plan, 16).ok());
}

TEST(LoadPlanTest, DuplicateNamesAreFoundWhileParsing) {
  const std::string d1 = R"({"dtype":"U8","shape":[4],"data_offsets":[0,4]})";
  const std::string d2 = R"({"dtype":"U8","shape":[4],"data_offsets":[4,8]})";
  LoadPlan plan;
  Status st = ParseSafetensorsHeader("{\"a\":" + d1 + ",\"a\":" + d2 + "}", 0, 8, 0, &plan);
  EXPECT_EQ(st.code(), StatusCode::kCorrupt);
  EXPECT_NE(st.message().find("more than once"), std::string::npos) << st.ToString();
  // Nested keys may repeat names of tensors; only top-level keys are tensor names.
  EXPECT_TRUE(ParseSafetensorsHeader("{\"__metadata__\":{\"a\":\"x\"},\"a\":" + d1 + "}", 0, 8, 0, &plan).ok());
  std::vector<std::string> shards;
  std::vector<std::pair<std::string, std::string>> map;
  st = ParseShardIndex(R"({"weight_map":{"a":"s1","a":"s2"}})", &shards, &map);
  EXPECT_EQ(st.code(), StatusCode::kCorrupt);
  EXPECT_NE(st.message().find("more than once"), std::string::npos) << st.ToString();
  shards.clear();
  map.clear();
  std::map<std::string, std::string> md;
  EXPECT_TRUE(ParseShardIndex(R"({"metadata":{"total_size":8,"a":"b"},"weight_map":{"a":"s1"}})", &shards, &map, &md).ok());
  EXPECT_EQ(md, (std::map<std::string, std::string>{{"a", "b"}, {"total_size", "8"}}));
}

}  // namespace
}  // namespace ckpt::format
