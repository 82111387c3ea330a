#include "ckpt/dtype.h"

#include <gtest/gtest.h>

namespace ckpt {
namespace {

TEST(DTypeTest, NamesAndSizesOfSafetensorsTypes) {
  struct Row {
    const char* name;
    uint32_t size;
  } rows[] = {{"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"I16", 2},     {"U16", 2},     {"F16", 2},      {"BF16", 2},
              {"I32", 4},  {"U32", 4}, {"F32", 4}, {"F64", 8},     {"I64", 8},     {"U64", 8},      {"F8_E4M3", 1},
              {"F8_E5M2", 1}, {"F8_E8M0", 1}, {"C64", 8}};
  for (const Row& row : rows) {
    auto dtype = DTypeFromName(row.name);
    ASSERT_TRUE(dtype.has_value()) << row.name;
    EXPECT_EQ(DTypeSize(*dtype), row.size) << row.name;
    EXPECT_STREQ(DTypeName(*dtype), row.name);
    EXPECT_TRUE(IsValidDType(static_cast<uint32_t>(*dtype)));
  }
}

TEST(DTypeTest, SubByteTypesHaveBitsNotBytes) {
  for (const char* name : {"F4", "F6_E2M3", "F6_E3M2"}) {
    auto dtype = DTypeFromName(name);
    ASSERT_TRUE(dtype.has_value()) << name;
    EXPECT_EQ(DTypeSize(*dtype), 0u) << name;
    EXPECT_STREQ(DTypeName(*dtype), name);
  }
  EXPECT_EQ(DTypeBits(DType::kF4), 4u);
  EXPECT_EQ(DTypeBits(DType::kF6E3M2), 6u);
  EXPECT_EQ(DTypeBits(DType::kF32), 32u);
  EXPECT_EQ(TensorBytes(DType::kF4, 6), 3u);
  EXPECT_EQ(TensorBytes(DType::kF4, 5), std::nullopt);       // 20 bits
  EXPECT_EQ(TensorBytes(DType::kF6E2M3, 4), 3u);             // 24 bits
  EXPECT_EQ(TensorBytes(DType::kF6E2M3, 3), std::nullopt);   // 18 bits
  EXPECT_EQ(TensorBytes(DType::kC128, 3), 48u);
  EXPECT_EQ(TensorBytes(DType::kF64, UINT64_MAX / 4), std::nullopt);
}

TEST(DTypeTest, UnknownNamesAndValues) {
  EXPECT_FALSE(DTypeFromName("F32 ").has_value());
  EXPECT_FALSE(DTypeFromName("f32").has_value());
  EXPECT_FALSE(DTypeFromName("").has_value());
  EXPECT_FALSE(IsValidDType(0));
  EXPECT_FALSE(IsValidDType(9999));
  EXPECT_STREQ(DTypeName(static_cast<DType>(9999)), "INVALID");
  EXPECT_EQ(DTypeSize(static_cast<DType>(9999)), 0u);
}

}  // namespace
}  // namespace ckpt
