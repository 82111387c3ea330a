// The one safetensors writer: what it writes is what the parser reads back.
#include "format/safetensors_writer.h"

#include <gtest/gtest.h>

#include "format/safetensors.h"
#include "support/test_env.h"

namespace ckpt::format {
namespace {

uint64_t LengthOf(const std::string& file) {
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = n << 8 | static_cast<unsigned char>(file[static_cast<size_t>(i)]);
  return n;
}

TEST(SafetensorsWriterTest, PrefixIsLengthThenPaddedHeaderMetadataFirst) {
  uint64_t data = 0;
  auto prefix = SafetensorsPrefix({{"b", DType::kF32, {2, 3}, 24, 0}, {"a", DType::kI64, {}, 8, 0}},
                                  {{"format", "pt"}}, &data);
  ASSERT_TRUE(prefix.ok()) << prefix.status().ToString();
  EXPECT_EQ(data, 32u);
  const uint64_t n = LengthOf(*prefix);
  EXPECT_EQ(prefix->size(), 8 + n);
  EXPECT_EQ(n % 8, 0u) << "the data starts 8-byte aligned";
  const std::string header = prefix->substr(8);
  EXPECT_EQ(header.rfind(R"({"__metadata__":{"format":"pt"},"b":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},)"
                         R"("a":{"dtype":"I64","shape":[],"data_offsets":[24,32]}})",
                         0),
            0u)
      << header;
  EXPECT_EQ(header.find_first_not_of(' ', header.find_last_of('}') + 1), std::string::npos) << "padded with spaces";
  // The parser takes it: names, offsets, metadata.
  LoadPlan plan;
  std::map<std::string, std::string> metadata;
  ASSERT_TRUE(ParseSafetensorsHeader(header, prefix->size(), 32, 0, &plan, &metadata).ok());
  ASSERT_EQ(plan.tensors.size(), 2u);
  EXPECT_EQ(metadata, (std::map<std::string, std::string>{{"format", "pt"}}));
}

TEST(SafetensorsWriterTest, NoMetadataNoBlockAndWholeFilesCarryTheirData) {
  auto file = SafetensorsFileBytes({{"w", DType::kU8, {4}, 4, 0}, {"z", DType::kU8, {0}, 0, 0}}, {"wxyz", ""});
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  EXPECT_EQ(file->find("__metadata__"), std::string::npos);
  EXPECT_EQ(file->substr(file->size() - 4), "wxyz");
  testing::ScratchDir dir;
  testing::WriteFile(dir.File("m.safetensors"), *file);
  LoadPlan plan;
  ASSERT_TRUE(PlanSafetensorsFile(dir.File("m.safetensors"), &plan).ok());
  ASSERT_EQ(plan.tensors.size(), 2u);
  EXPECT_EQ(plan.tensors[0].file_offset, file->size() - 4);
  EXPECT_EQ(testing::SafetensorsOf({{"w", DType::kU8, {4}, "wxyz"}, {"z", DType::kU8, {0}, ""}}), *file)
      << "the tests' helper is this writer";
}

TEST(SafetensorsWriterTest, RefusesWhatNoReaderCouldTake) {
  EXPECT_EQ(SafetensorsPrefix({{"", DType::kU8, {1}, 1, 0}}, {}, nullptr).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(SafetensorsPrefix({{"__metadata__", DType::kU8, {1}, 1, 0}}, {}, nullptr).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(SafetensorsPrefix({{"a", DType::kU8, {1}, 1, 0}, {"a", DType::kU8, {1}, 1, 0}}, {}, nullptr).status().code(),
            StatusCode::kInvalidArgument);
  auto wrap = SafetensorsPrefix({{"a", DType::kU8, {1}, ~0ull, 0}, {"b", DType::kU8, {1}, 2, 0}}, {}, nullptr);
  EXPECT_EQ(wrap.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(wrap.status().message().find("overflows 64 bits"), std::string::npos) << wrap.status().ToString();
  EXPECT_EQ(SafetensorsPrefix({{std::string("\xff", 1), DType::kU8, {1}, 1, 0}}, {}, nullptr).status().code(),
            StatusCode::kCorrupt)
      << "not UTF-8";
  EXPECT_EQ(SafetensorsFileBytes({{"a", DType::kU8, {4}, 4, 0}}, {"abc"}).status().code(), StatusCode::kInvalidArgument)
      << "data of another size than declared";
}

}  // namespace
}  // namespace ckpt::format
