// Sizes people write (the one parser: flags, the configuration file, persist) and sizes for
// people (ckptctl's tables, the daemon's budget and limit errors).
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

TEST(ByteSizeTest, DecimalUnitsArePowersOf1000AsTransformersReadThem) {
  EXPECT_EQ(*ParseByteSize("5GB"), 5'000'000'000u);
  EXPECT_EQ(*ParseByteSize("40GB"), 40'000'000'000u) << "--memory-budget 40GB: 40 * 10^9 since issue 24";
  EXPECT_EQ(*ParseByteSize("1.5gb"), 1'500'000'000u);
  EXPECT_EQ(*ParseByteSize("10 KB"), 10'000u);
  EXPECT_EQ(*ParseByteSize("250kB"), 250'000u);
  EXPECT_EQ(*ParseByteSize("2MB"), 2'000'000u);
  EXPECT_EQ(*ParseByteSize("3TB"), 3'000'000'000'000u);
  EXPECT_EQ(*ParseByteSize("1PB"), 1'000'000'000'000'000u);
  EXPECT_EQ(*ParseByteSize("9EB"), 9'000'000'000'000'000'000u);
}

TEST(ByteSizeTest, BinaryUnitsAndSystemdLettersArePowersOf1024) {
  EXPECT_EQ(*ParseByteSize("500MiB"), 500ull << 20);
  EXPECT_EQ(*ParseByteSize("40GiB"), 40ull << 30);
  EXPECT_EQ(*ParseByteSize("40gib"), 40ull << 30);
  EXPECT_EQ(*ParseByteSize("40G"), 40ull << 30) << "as systemd reads MemoryMax=40G";
  EXPECT_EQ(*ParseByteSize("1950K"), 1950ull << 10);
  EXPECT_EQ(*ParseByteSize("10M"), 10ull << 20);
  EXPECT_EQ(*ParseByteSize("64T"), 64ull << 40);
  EXPECT_EQ(*ParseByteSize("2P"), 2ull << 50);
  EXPECT_EQ(*ParseByteSize("7E"), 7ull << 60);
  EXPECT_EQ(*ParseByteSize("4 KiB"), 4096u);
  EXPECT_EQ(*ParseByteSize("1.5KiB"), 1536u);
  EXPECT_EQ(*ParseByteSize("0.5G"), 1ull << 29);
}

TEST(ByteSizeTest, PlainNumbersAreBytesAndFractionsRoundDown) {
  EXPECT_EQ(*ParseByteSize("0"), 0u) << "zero parses; callers that need a byte refuse it";
  EXPECT_EQ(*ParseByteSize("123"), 123u);
  EXPECT_EQ(*ParseByteSize("123B"), 123u);
  EXPECT_EQ(*ParseByteSize("123 b"), 123u);
  EXPECT_EQ(*ParseByteSize("0.9"), 0u);
  EXPECT_EQ(*ParseByteSize("1.999"), 1u);
  EXPECT_EQ(*ParseByteSize(".5K"), 512u);
  EXPECT_EQ(*ParseByteSize("2."), 2u);
  EXPECT_EQ(*ParseByteSize("1.1KB"), 1100u) << "exact, no binary floating point";
  EXPECT_EQ(*ParseByteSize("0.000001TB"), 1'000'000u);
  EXPECT_EQ(*ParseByteSize("9223372036854775807"), (1ull << 63) - 1);
}

TEST(ByteSizeTest, AnythingElseIsRefusedNamingTheText) {
  for (const char* bad : {"", " ", "GB", "5XB", "-5", "+5", "1.2.3", "1e30", "5 G B", " 5G", "5G ", "5GiBs", "0x10",
                          "5Gi", "5iB", "lots", "."}) {
    auto r = ParseByteSize(bad);
    ASSERT_FALSE(r.ok()) << "'" << bad << "' parsed as " << *r;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find(std::string("'") + bad + "'"), std::string::npos) << r.status().message();
  }
  EXPECT_NE(ParseByteSize("5XB").status().message().find("unknown unit 'XB'"), std::string::npos)
      << ParseByteSize("5XB").status().message();
}

TEST(ByteSizeTest, SizesAbove2To63AreRefused) {
  for (const char* big : {"9223372036854775808", "99999999999TB", "8E", "8EiB", "9.3EB", "18446744073709551616",
                          "100000000000000000000000000000000000000000"}) {
    auto r = ParseByteSize(big);
    ASSERT_FALSE(r.ok()) << big << " parsed as " << *r;
    EXPECT_NE(r.status().message().find("too large"), std::string::npos) << r.status().message();
  }
  EXPECT_EQ(*ParseByteSize("7.5E"), 15ull << 59) << "just below the limit";
}

}  // namespace
}  // namespace ckpt
