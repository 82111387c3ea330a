// Built-in family plans on the C++ path, through the real ckptd: for every family,
// tests/python/tp_cases.py (real PyTorch) writes a checkpoint with Hugging Face names and
// config.json, and every rank's expected state dict under each convention (world 1, 2, 4)
// computed with torch slicing. Here TpPlan::ForConfig + Resolve + PlanOutput + GatherOutput
// must reproduce those names, shapes and bytes (the Python CPU path is held to the same
// files by tests/python/test_plans.py, so the two paths agree).
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "ckpt/client.h"
#include "ckpt/tp_plan.h"
#include "support/test_env.h"

namespace ckpt {
namespace {

using testing::DaemonProcess;
using testing::ReadFile;
using testing::RunCommand;
using testing::ScratchDir;

class TpFamiliesTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new ScratchDir();
    auto r = RunCommand({CKPT_TORCH_PYTHON, std::string(CKPT_TESTS_DIR) + "/python/tp_cases.py", dir_->path()});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    daemon_ = new DaemonProcess();
    ASSERT_TRUE(daemon_->Start());
  }
  static void TearDownTestSuite() {
    delete daemon_;
    delete dir_;
    daemon_ = nullptr;
    dir_ = nullptr;
  }
  static std::string FamilyDir(const std::string& f) { return dir_->path() + "/" + f; }

  static ScratchDir* dir_;
  static DaemonProcess* daemon_;
};

ScratchDir* TpFamiliesTest::dir_ = nullptr;
DaemonProcess* TpFamiliesTest::daemon_ = nullptr;

const std::vector<std::string> kFamilies = {
    "llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "gemma", "gemma2", "gemma3", "phi3", "olmo2",
    "starcoder2", "granite", "cohere", "gpt_neox", "falcon", "deepseek_v3", "gpt_oss", "gpt-neo", "gpt2", "gptj", "bloom",
    "opt"};

TEST_F(TpFamiliesTest, FamiliesAreTheOnesIssue16Names) {
  EXPECT_EQ(TpPlan::Families(), kFamilies);
}

TEST_F(TpFamiliesTest, EveryFamilyEveryConventionEveryRankMatchesTorchSlices) {
  auto client = Client::Connect(daemon_->socket());
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  int compared = 0;
  for (const std::string& family : kFamilies) {
    SCOPED_TRACE(family);
    const std::string d = FamilyDir(family);
    ASSERT_TRUE((*client)->Load(d + "/model.safetensors", family).ok());
    ASSERT_TRUE((*client)->Load(d + "/expected.safetensors", family + ".expected").ok());
    auto model = (*client)->Attach(family);
    auto expected = (*client)->Attach(family + ".expected");
    ASSERT_TRUE(model.ok() && expected.ok());
    const std::string config = ReadFile(d + "/config.json");
    auto family_of = TpPlan::FamilyOf(config);
    ASSERT_TRUE(family_of.ok()) << family_of.status().ToString();
    EXPECT_EQ(*family_of, family);
    const auto cases = nlohmann::json::parse(ReadFile(d + "/cases.json"));
    for (const auto& [conv, worlds] : cases["conventions"].items()) {
      const nlohmann::json conv_name = conv;
      TpPlan::Options o;
      o.convention = *ParseConvention(conv);
      auto plan = TpPlan::ForConfig(config, o);
      ASSERT_TRUE(plan.ok()) << plan.status().ToString();
      EXPECT_EQ(plan->family(), family);
      for (int world : worlds.get<std::vector<int>>()) {
        for (int rank = 0; rank < world; ++rank) {
          SCOPED_TRACE(conv_name.get<std::string>() + " world " + std::to_string(world) + " rank " + std::to_string(rank));
          const std::string prefix = conv_name.get<std::string>() + "/w" + std::to_string(world) + "/r" + std::to_string(rank) + "/";
          std::map<std::string, const TensorInfo*> want;
          for (const TensorInfo& t : (*expected)->tensors())
            if (t.name.rfind(prefix, 0) == 0) want[t.name.substr(prefix.size())] = &t;
          auto outs = plan->Resolve((*model)->tensors(), rank, world);
          ASSERT_TRUE(outs.ok()) << outs.status().ToString();
          std::set<std::string> got_names;
          for (const ShardOutput& out : *outs) {
            got_names.insert(out.name);
            auto it = want.find(out.name);
            ASSERT_NE(it, want.end()) << "unexpected output " << out.name;
            auto layout = PlanOutput(out, (*model)->tensors());
            ASSERT_TRUE(layout.ok()) << layout.status().ToString();
            EXPECT_EQ(layout->dtype, it->second->dtype) << out.name;
            EXPECT_EQ(layout->shape, it->second->shape) << out.name;
            std::vector<const std::byte*> sources;
            for (const ShardPiece& p : out.pieces) sources.push_back(*(*model)->TensorData(p.source));
            std::vector<std::byte> buf(layout->nbytes);
            ASSERT_TRUE(GatherOutput(out, *layout, sources, buf.data(), buf.size()).ok());
            auto ref = (*expected)->TensorData(it->second->name);
            ASSERT_TRUE(ref.ok());
            ASSERT_EQ(buf.size(), it->second->nbytes) << out.name;
            EXPECT_EQ(std::memcmp(buf.data(), *ref, buf.size()), 0) << out.name << ": bytes differ";
            ++compared;
          }
          EXPECT_EQ(got_names.size(), want.size());
        }
      }
    }
  }
  EXPECT_GT(compared, 2000);
}

TEST_F(TpFamiliesTest, GatherOutputTransposesAndRefusesShortBuffers) {
  // GPT-2 Conv1D weights in Linear layout, gathered on the CPU.
  auto client = Client::Connect(daemon_->socket());
  ASSERT_TRUE(client.ok());
  ASSERT_TRUE((*client)->Load(FamilyDir("gpt2") + "/model.safetensors", "gpt2.t").ok());
  auto model = (*client)->Attach("gpt2.t");
  ASSERT_TRUE(model.ok());
  TpPlan::Options o;
  o.transpose_conv1d = true;
  o.config_json = ReadFile(FamilyDir("gpt2") + "/config.json");
  auto plan = TpPlan::BuiltIn("gpt2", o);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  auto outs = plan->Resolve((*model)->tensors(), 1, 2);
  ASSERT_TRUE(outs.ok()) << outs.status().ToString();
  for (const ShardOutput& out : *outs) {
    if (out.name != "transformer.h.0.mlp.c_fc.weight") continue;
    ASSERT_TRUE(out.transpose);
    auto layout = PlanOutput(out, (*model)->tensors());
    ASSERT_TRUE(layout.ok());
    ASSERT_EQ(layout->shape, (std::vector<int64_t>{12, 16}));  // [I / 2, H]: Linear layout
    std::vector<float> buf(12 * 16);
    const auto* src = reinterpret_cast<const float*>(*(*model)->TensorData(out.name));  // [16, 24]
    ASSERT_TRUE(GatherOutput(out, *layout, {reinterpret_cast<const std::byte*>(src)}, buf.data(), buf.size() * 4).ok());
    for (int o2 = 0; o2 < 12; ++o2)
      for (int i = 0; i < 16; ++i) ASSERT_EQ(buf[o2 * 16 + i], src[i * 24 + 12 + o2]) << o2 << "," << i;
    EXPECT_FALSE(GatherOutput(out, *layout, {reinterpret_cast<const std::byte*>(src)}, buf.data(), 10).ok());
    EXPECT_FALSE(GatherOutput(out, *layout, {}, buf.data(), buf.size() * 4).ok());
    return;
  }
  FAIL() << "no c_fc output";
}

}  // namespace
}  // namespace ckpt
