// Sizes for people (ckptctl's tables, the daemon's budget and limit errors).
#include "common/byte_size.h"

#include <gtest/gtest.h>

namespace ckpt {
namespace {

TEST(ByteSizeTest, HumanBytesUsesBinaryUnits) {
  EXPECT_EQ(HumanBytes(0), "0 B");
  EXPECT_EQ(HumanBytes(1023), "1023 B");
  EXPECT_EQ(HumanBytes(1536), "1.50 KiB");
  EXPECT_EQ(HumanBytes(12884901888ull), "12.00 GiB");
  EXPECT_EQ(HumanBytes(~0ull), "16.00 EiB");
}

TEST(ByteSizeTest, BytesTextKeepsTheExactCount) {
  EXPECT_EQ(BytesText(512), "512 bytes");
  EXPECT_EQ(BytesText(12884901888ull), "12.00 GiB (12884901888 bytes)");
}

}  // namespace
}  // namespace ckpt
