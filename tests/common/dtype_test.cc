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
