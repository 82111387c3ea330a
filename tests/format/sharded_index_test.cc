#include "format/sharded_index.h"

#include <gtest/gtest.h>

#include <cctype>

#include "format/checkpoint_formats.h"
#include "support/test_env.h"

namespace ckpt::format {
namespace {

using testing::ScratchDir;
using testing::WriteFile;

// A safetensors file with one F32 scalar per name.
std::string Safetensors(const std::vector<std::string>& names) {
  std::vector<testing::TestTensor> tensors;
  for (const std::string& name : names) tensors.push_back({name, DType::kF32, {}, std::string(4, '\1')});
  return testing::SafetensorsOf(tensors);
}

TEST(ShardIndexTest, ParsesWeightMap) {
  std::vector<std::string> shards;
  std::vector<std::pair<std::string, std::string>> map;
  ASSERT_TRUE(ParseShardIndex(R"({"metadata":{"total_size":8},"weight_map":{"a":"s1","b":"s2","c":"s1"}})", &shards, &map).ok());
  EXPECT_EQ(shards, (std::vector<std::string>{"s1", "s2"}));
  EXPECT_EQ(map.size(), 3u);
}

TEST(ShardIndexTest, BadIndexesRefused) {
  for (const char* bad : {"", "[]", "{}", R"({"weight_map":[]})", R"({"weight_map":{}})", R"({"weight_map":{"a":1}})",
                          R"({"weight_map":{"a":"../x"}})", R"({"weight_map":{"a":"/etc/passwd"}})", R"({"weight_map":{"a":".."}})"}) {
    std::vector<std::string> shards;
    std::vector<std::pair<std::string, std::string>> map;
    Status st = ParseShardIndex(bad, &shards, &map);
    EXPECT_EQ(st.code(), StatusCode::kCorrupt) << bad;
  }
}

struct ShardCase {
  const char* what;
  std::vector<std::string> shard1, shard2;
  const char* index;
  const char* needle;  // nullptr: loads
};

class ShardedCheckpointTest : public ::testing::TestWithParam<ShardCase> {};

TEST_P(ShardedCheckpointTest, EveryTensorOnceInItsShard) {
  ScratchDir dir;
  WriteFile(dir.File("s1.safetensors"), Safetensors(GetParam().shard1));
  WriteFile(dir.File("s2.safetensors"), Safetensors(GetParam().shard2));
  WriteFile(dir.File("model.safetensors.index.json"), GetParam().index);
  auto plan = PlanCheckpoint(dir.path());
  if (!GetParam().needle) {
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    EXPECT_EQ(plan->format, "safetensors-sharded");
    EXPECT_EQ(plan->files.size(), 2u);
    EXPECT_EQ(plan->tensors.size(), 3u);
    for (const auto& t : plan->tensors) EXPECT_EQ(plan->files[t.file_index]->path, dir.File(t.name == "c" ? "s2.safetensors" : "s1.safetensors"));
    return;
  }
  ASSERT_FALSE(plan.ok()) << GetParam().what;
  EXPECT_EQ(plan.status().code(), StatusCode::kCorrupt) << plan.status().ToString();
  EXPECT_NE(plan.status().message().find(GetParam().needle), std::string::npos) << plan.status().message();
}

INSTANTIATE_TEST_SUITE_P(
    Cases, ShardedCheckpointTest,
    ::testing::Values(
        ShardCase{"ok", {"a", "b"}, {"c"}, R"({"weight_map":{"a":"s1.safetensors","b":"s1.safetensors","c":"s2.safetensors"}})", nullptr},
        ShardCase{"duplicate", {"a", "b"}, {"b", "c"}, R"({"weight_map":{"a":"s1.safetensors","b":"s1.safetensors","c":"s2.safetensors"}})", "is in both"},
        ShardCase{"missing", {"a"}, {"c"}, R"({"weight_map":{"a":"s1.safetensors","b":"s1.safetensors","c":"s2.safetensors"}})", "'b' is not in its shard"},
        ShardCase{"wrong shard", {"a", "c"}, {"b"}, R"({"weight_map":{"a":"s1.safetensors","b":"s2.safetensors","c":"s2.safetensors"}})", "mapped to s2.safetensors"},
        ShardCase{"unlisted", {"a", "x"}, {"c"}, R"({"weight_map":{"a":"s1.safetensors","c":"s2.safetensors"}})", "'x' of s1.safetensors is not in the weight_map"},
        ShardCase{"escape", {"a"}, {"c"}, R"({"weight_map":{"a":"../s1.safetensors"}})", "not a file beside the index"}),
    [](const ::testing::TestParamInfo<ShardCase>& info) {
      std::string n = info.param.what;
      for (char& c : n) c = std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
      return n;
    });

TEST(ShardedCheckpointTest2, MissingShardFileIsNotFound) {
  ScratchDir dir;
  WriteFile(dir.File("model.safetensors.index.json"), R"({"weight_map":{"a":"gone.safetensors"}})");
  auto plan = PlanCheckpoint(dir.path());
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), StatusCode::kNotFound);
  EXPECT_NE(plan.status().message().find("gone.safetensors"), std::string::npos);
}

}  // namespace
}  // namespace ckpt::format
