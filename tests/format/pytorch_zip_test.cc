// PlanCheckpoint on checkpoints written by real PyTorch (tests/format/torch_cases.py).
#include "format/pytorch_zip.h"

#include <gtest/gtest.h>

#include <cctype>
#include <cstring>
#include <filesystem>
#include <map>

#include "format/checkpoint_formats.h"
#include "format/torch_cases.h"
#include "support/test_env.h"

namespace ckpt::format {
namespace {

using testing::TorchCasesDir;

const PlannedTensor* Find(const LoadPlan& plan, const std::string& name) {
  for (const auto& t : plan.tensors) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

TEST(PyTorchZipTest, EveryDtypeTorchSaves) {
  auto plan = PlanCheckpoint(TorchCasesDir() + "/all_dtypes.pt");
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_EQ(plan->format, "pytorch");
  ASSERT_EQ(plan->files.size(), 1u);
  const std::map<std::string, DType> want = {
      {"t_float64", DType::kF64}, {"t_float32", DType::kF32}, {"t_float16", DType::kF16},
      {"t_bfloat16", DType::kBF16}, {"t_int64", DType::kI64}, {"t_int32", DType::kI32},
      {"t_int16", DType::kI16}, {"t_int8", DType::kI8}, {"t_uint8", DType::kU8},
      {"t_bool", DType::kBool}, {"t_complex64", DType::kC64}, {"t_complex128", DType::kC128}};
  for (const auto& [name, dtype] : want) {
    const PlannedTensor* t = Find(*plan, name);
    ASSERT_NE(t, nullptr) << name;
    EXPECT_EQ(t->dtype, dtype) << name;
    EXPECT_EQ(t->shape, (std::vector<int64_t>{5, 7}));
    EXPECT_EQ(t->nbytes, 35u * DTypeSize(dtype));
    EXPECT_TRUE(t->strides.empty());
    EXPECT_EQ(t->file_offset % 64, 0u) << "torch aligns storages";
  }
  EXPECT_EQ(Find(*plan, "scalar")->shape, std::vector<int64_t>{});
  EXPECT_EQ(Find(*plan, "empty")->nbytes, 0u);
}

TEST(PyTorchZipTest, ViewsGetStridesAndTiedWeightsAlias) {
  auto plan = PlanCheckpoint(TorchCasesDir() + "/views.bin");
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  const PlannedTensor* whole = Find(*plan, "whole");
  const PlannedTensor* tr = Find(*plan, "transposed");
  const PlannedTensor* rows = Find(*plan, "row_slice");
  const PlannedTensor* cols = Find(*plan, "column_slice");
  const PlannedTensor* expanded = Find(*plan, "expanded");
  ASSERT_TRUE(whole && tr && rows && cols && expanded);
  EXPECT_TRUE(whole->strides.empty());
  EXPECT_EQ(tr->strides, (std::vector<int64_t>{1, 6}));
  EXPECT_EQ(tr->source_bytes, 48u * 4);
  EXPECT_TRUE(rows->strides.empty()) << "a contiguous slice is a plain byte range";
  EXPECT_EQ(rows->file_offset, whole->file_offset + 2 * 6 * 4);
  EXPECT_EQ(cols->strides, (std::vector<int64_t>{6, 1}));
  EXPECT_EQ(cols->file_offset, whole->file_offset + 4);
  EXPECT_EQ(expanded->strides, (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(expanded->source_bytes, 12u);
  // Tied weights: the second name aliases the first.
  const PlannedTensor* embed = Find(*plan, "embed.weight");
  const PlannedTensor* head = Find(*plan, "lm_head.weight");
  ASSERT_TRUE(embed && head);
  EXPECT_NE(embed->alias_of >= 0, head->alias_of >= 0) << "exactly one of the two is an alias";
  const PlannedTensor* alias = embed->alias_of >= 0 ? embed : head;
  EXPECT_EQ(plan->tensors[alias->alias_of].name, alias == embed ? "lm_head.weight" : "embed.weight");
  EXPECT_LT(plan->TotalBytes(), [&] {
    uint64_t all = 0;
    for (const auto& t : plan->tensors) all += t.nbytes;
    return all;
  }());
}

TEST(PyTorchZipTest, ModuleStateDictAndParameters) {
  for (const char* name : {"module.pt", "params.pt"}) {
    auto plan = PlanCheckpoint(TorchCasesDir() + "/" + name);
    ASSERT_TRUE(plan.ok()) << name << ": " << plan.status().ToString();
    EXPECT_NE(Find(*plan, "0.weight"), nullptr) << name;
    EXPECT_EQ(Find(*plan, "2.bias")->shape, std::vector<int64_t>{3});
  }
}

TEST(PyTorchZipTest, FoldersAndShards) {
  const std::string dir = TorchCasesDir();
  struct Case {
    std::string path, format;
    size_t files;
  };
  for (const Case& c : {Case{dir + "/sharded_st", "safetensors-sharded", 2},
                        Case{dir + "/sharded_bin/", "pytorch-sharded", 2},
                        Case{dir + "/sharded_bin/pytorch_model.bin.index.json", "pytorch-sharded", 2},
                        Case{dir + "/bin_folder", "pytorch", 1}}) {
    auto plan = PlanCheckpoint(c.path);
    ASSERT_TRUE(plan.ok()) << c.path << ": " << plan.status().ToString();
    EXPECT_EQ(plan->format, c.format) << c.path;
    EXPECT_EQ(plan->files.size(), c.files) << c.path;
    EXPECT_EQ(plan->tensors.size(), 6u) << c.path;
    EXPECT_EQ(Find(*plan, "norm.bias")->dtype, DType::kBF16);
  }
  testing::ScratchDir empty;
  auto none = PlanCheckpoint(empty.path());
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), StatusCode::kNotFound);
  EXPECT_NE(none.status().message().find("model.safetensors, model.safetensors.index.json, pytorch_model.bin, "
                                         "pytorch_model.bin.index.json"),
            std::string::npos)
      << none.status().message();
}

TEST(PyTorchZipTest, Zip64ArchiveWithManyEntries) {
  const std::string path = TorchCasesDir() + "/many.pt";
  auto plan = PlanCheckpoint(path);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  ASSERT_EQ(plan->tensors.size(), 65600u);
  const PlannedTensor* last = Find(*plan, "t65599");
  ASSERT_NE(last, nullptr);
  ASSERT_EQ(last->nbytes, 4u);
  const std::string file = testing::ReadFile(path);
  float v = 0;
  std::memcpy(&v, file.data() + last->file_offset, 4);
  EXPECT_EQ(v, 65599.0f);
}

struct Refusal {
  const char* file;
  StatusCode code;
  const char* needle;
};

class PyTorchZipRefusalTest : public ::testing::TestWithParam<Refusal> {};

TEST_P(PyTorchZipRefusalTest, RefusedClearly) {
  const std::string dir = TorchCasesDir();
  auto plan = PlanCheckpoint(dir + "/" + GetParam().file);
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), GetParam().code) << plan.status().ToString();
  EXPECT_NE(plan.status().message().find(GetParam().needle), std::string::npos) << plan.status().message();
  EXPECT_FALSE(std::filesystem::exists(dir + "/PWNED")) << "the pickle ran something";
}

std::string RefusalName(const ::testing::TestParamInfo<Refusal>& info) {
  std::string n = info.param.file;
  for (char& c : n) c = std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
  return n;
}

INSTANTIATE_TEST_SUITE_P(
    Files, PyTorchZipRefusalTest,
    ::testing::Values(Refusal{"legacy.pt", StatusCode::kUnsupported, "legacy (non-zip) torch.save"},
                      Refusal{"evil.pt", StatusCode::kUnsupported, "'posix.system'"},
                      Refusal{"eval.pt", StatusCode::kUnsupported, "'builtins.eval'"},
                      Refusal{"nested.pt", StatusCode::kUnsupported, "nested dicts"},
                      Refusal{"list.pt", StatusCode::kUnsupported, "holds a list"},
                      Refusal{"compressed.pt", StatusCode::kUnsupported, "compressed"},
                      Refusal{"bigendian.pt", StatusCode::kUnsupported, "byte order 'big'"},
                      Refusal{"scripted.pt", StatusCode::kUnsupported, "TorchScript archive"}),
    RefusalName);

}  // namespace
}  // namespace ckpt::format
