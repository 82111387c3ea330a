#include "format/safetensors.h"

#include <gtest/gtest.h>

#include <cstring>

#include "format/checkpoint_formats.h"
#include "support/test_env.h"

namespace ckpt::format {
namespace {

using ckpt::testing::ScratchDir;
using ckpt::testing::WriteFile;

// A safetensors file image: length prefix, `header`, then `data_bytes` zero bytes.
std::string Image(const std::string& header, size_t data_bytes) {
  return ckpt::testing::SafetensorsBytes(header, std::string(data_bytes, '\0'));
}

Status Parse(const std::string& header, uint64_t data_bytes, LoadPlan* plan) {
  return ParseSafetensorsHeader(header, 100, data_bytes, 0, plan);
}

TEST(SafetensorsTest, ParsesTensorsAndOffsets) {
  LoadPlan plan;
  ASSERT_TRUE(Parse(R"({"__metadata__":{"format":"pt"},
      "a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},
      "b":{"dtype":"BF16","shape":[],"data_offsets":[24,26]},
      "c":{"dtype":"I64","shape":[0,5],"data_offsets":[26,26]}})", 26, &plan).ok());
  ASSERT_EQ(plan.tensors.size(), 3u);
  const PlannedTensor* a = nullptr;
  for (const auto& t : plan.tensors) {
    if (t.name == "a") a = &t;
  }
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->dtype, DType::kF32);
  EXPECT_EQ(a->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(a->file_offset, 100u);  // data_start added
  EXPECT_EQ(a->nbytes, 24u);
}

TEST(SafetensorsTest, SubByteDtypesTakeTheirBitsInBytes) {
  LoadPlan plan;
  ASSERT_TRUE(Parse(R"({"f4":{"dtype":"F4","shape":[3,4],"data_offsets":[0,6]},
      "f6":{"dtype":"F6_E2M3","shape":[2,2],"data_offsets":[6,9]},
      "g6":{"dtype":"F6_E3M2","shape":[8],"data_offsets":[9,15]}})", 15, &plan).ok());
  ASSERT_EQ(plan.tensors.size(), 3u);
  for (const auto& t : plan.tensors) {
    if (t.name == "f4") EXPECT_EQ(t.nbytes, 6u);
    if (t.name == "f6") EXPECT_EQ(t.nbytes, 3u);
    if (t.name == "g6") EXPECT_EQ(t.nbytes, 6u);
  }
  LoadPlan bad;
  Status st = Parse(R"({"x":{"dtype":"F6_E2M3","shape":[3],"data_offsets":[0,3]}})", 3, &bad);
  EXPECT_EQ(st.code(), StatusCode::kCorrupt) << st.ToString();
  EXPECT_NE(st.message().find("not a whole number of bytes"), std::string::npos) << st.ToString();
}

struct BadHeader {
  const char* what;
  const char* header;
  uint64_t data_bytes;
  StatusCode code;
};

class SafetensorsBadHeaderTest : public ::testing::TestWithParam<BadHeader> {};

TEST_P(SafetensorsBadHeaderTest, RefusedAndPlanUntouched) {
  LoadPlan plan;
  plan.tensors.push_back({"existing", DType::kU8, {1}, 0, 0, 1, {}, 0, -1});
  Status st = Parse(GetParam().header, GetParam().data_bytes, &plan);
  EXPECT_EQ(st.code(), GetParam().code) << st.ToString();
  EXPECT_FALSE(st.message().empty());
  EXPECT_EQ(plan.tensors.size(), 1u) << "a failed parse must not add tensors";
}

INSTANTIATE_TEST_SUITE_P(
    Cases, SafetensorsBadHeaderTest,
    ::testing::Values(
        BadHeader{"invalid json", R"({"a":{"dtype":"F32",)", 8, StatusCode::kCorrupt},
        BadHeader{"not an object", R"([1,2,3])", 8, StatusCode::kCorrupt},
        BadHeader{"unknown dtype", R"({"a":{"dtype":"F33","shape":[1],"data_offsets":[0,4]}})", 4,
                  StatusCode::kUnsupported},
        BadHeader{"offset beyond data", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 4,
                  StatusCode::kCorrupt},
        BadHeader{"begin after end", R"({"a":{"dtype":"U8","shape":[0],"data_offsets":[4,0]}})", 8,
                  StatusCode::kCorrupt},
        BadHeader{"shape disagrees with bytes", R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8,
                  StatusCode::kCorrupt},
        BadHeader{"overlap", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},
                                  "b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 16,
                  StatusCode::kCorrupt},
        BadHeader{"negative dim", R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4,
                  StatusCode::kCorrupt},
        BadHeader{"huge shape", R"({"a":{"dtype":"F64","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", 8,
                  StatusCode::kCorrupt},
        BadHeader{"too many dims", R"({"a":{"dtype":"U8","shape":[1,1,1,1,1,1,1,1,1],"data_offsets":[0,1]}})", 1,
                  StatusCode::kUnsupported},
        BadHeader{"missing offsets", R"({"a":{"dtype":"U8","shape":[1]}})", 1, StatusCode::kCorrupt},
        BadHeader{"float offsets", R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0.0,1.5]}})", 2,
                  StatusCode::kCorrupt},
        BadHeader{"empty name", R"({"":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})", 1, StatusCode::kCorrupt},
        BadHeader{"bad metadata", R"({"__metadata__":{"k":1}})", 0, StatusCode::kCorrupt}),
    [](const auto& info) {
      std::string n = info.param.what;
      for (char& c : n) {
        if (!isalnum(static_cast<unsigned char>(c))) c = '_';
      }
      return n;
    });

TEST(SafetensorsFileTest, TruncatedAndOversizedHeaders) {
  ScratchDir dir;
  LoadPlan plan;
  WriteFile(dir.File("short"), "abc");
  EXPECT_EQ(PlanSafetensorsFile(dir.File("short"), &plan).code(), StatusCode::kCorrupt);

  std::string header = R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})";
  std::string image = Image(header, 16);
  WriteFile(dir.File("ok.safetensors"), image);
  ASSERT_TRUE(PlanSafetensorsFile(dir.File("ok.safetensors"), &plan).ok());
  EXPECT_EQ(plan.tensors.at(0).file_offset, 8 + header.size());

  // Truncated: the data section is shorter than the header claims.
  LoadPlan p2;
  WriteFile(dir.File("trunc.safetensors"), image.substr(0, image.size() - 5));
  Status st = PlanSafetensorsFile(dir.File("trunc.safetensors"), &p2);
  EXPECT_EQ(st.code(), StatusCode::kCorrupt) << st.ToString();

  // Header length larger than the file.
  std::string lie = image;
  lie[0] = static_cast<char>(0xff);
  lie[1] = static_cast<char>(0xff);
  WriteFile(dir.File("lie.safetensors"), lie);
  st = PlanSafetensorsFile(dir.File("lie.safetensors"), &p2);
  EXPECT_EQ(st.code(), StatusCode::kCorrupt);
  EXPECT_NE(st.message().find("longer than the file"), std::string::npos) << st.message();

  EXPECT_EQ(PlanSafetensorsFile(dir.File("missing"), &p2).code(), StatusCode::kNotFound);
}

TEST(CheckpointFormatsTest, DetectsFormatsByContent) {
  ScratchDir dir;
  // A header length whose first byte is 0x80 must not look like a pickle.
  std::string header = R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})";
  header += std::string(0x280 - header.size(), ' ');
  WriteFile(dir.File("padded"), Image(header, 1));
  EXPECT_TRUE(PlanCheckpoint(dir.File("padded")).ok()) << PlanCheckpoint(dir.File("padded")).status().ToString();
  WriteFile(dir.File("model.bin"), Image(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})", 1));
  auto plan = PlanCheckpoint(dir.File("model.bin"));
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_EQ(plan->format, "safetensors");

  WriteFile(dir.File("zip.pt"), std::string("PK\x03\x04", 4) + std::string(60, '\0'));
  EXPECT_EQ(PlanCheckpoint(dir.File("zip.pt")).status().code(), StatusCode::kCorrupt);  // a zip without its directory
  WriteFile(dir.File("legacy.pt"), std::string("\x80\x02\x8a\x0a", 4) + std::string(60, 'x'));
  auto legacy = PlanCheckpoint(dir.File("legacy.pt"));
  EXPECT_EQ(legacy.status().code(), StatusCode::kUnsupported);
  EXPECT_NE(legacy.status().message().find("legacy"), std::string::npos);
  WriteFile(dir.File("junk"), std::string(64, 'j'));
  EXPECT_EQ(PlanCheckpoint(dir.File("junk")).status().code(), StatusCode::kUnsupported);
  EXPECT_EQ(PlanCheckpoint(dir.File("none")).status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace ckpt::format
