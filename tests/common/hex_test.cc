// The one hex: blobs, 64-bit values, fixed-size ids and escaped bytes.
#include "common/hex.h"

#include <gtest/gtest.h>

#include <array>
#include <cstdint>

namespace ckpt {
namespace {

TEST(HexTest, EncodesAnyBytesLowerCaseAndDecodesThemBack) {
  const std::string bytes("\x00\x01\x7f\x80\xab\xff", 6);
  EXPECT_EQ(HexEncode(bytes), "00017f80abff");
  EXPECT_EQ(*HexDecode("00017f80abff"), bytes);
  EXPECT_EQ(HexEncode(std::string()), "");
  EXPECT_EQ(*HexDecode(""), "");
  const std::array<uint8_t, 3> id{0xde, 0xad, 0x01};
  EXPECT_EQ(HexEncode(id.data(), id.size()), "dead01");
}

TEST(HexTest, DecodeRefusesOddLengthsUpperCaseAndOtherCharacters) {
  EXPECT_EQ(HexDecode("abc").status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(HexDecode("abc").status().message().find("odd length"), std::string::npos);
  EXPECT_FALSE(HexDecode("AB").ok()) << "the wire form is lower-case";
  auto bad = HexDecode("00zz");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("offset 2"), std::string::npos) << bad.status().message();
}

TEST(HexTest, DecodeIntoWantsExactlyTheSize) {
  std::array<uint8_t, 2> out{};
  EXPECT_TRUE(HexDecodeInto("beef", out.data(), out.size()));
  EXPECT_EQ(out[0], 0xbe);
  EXPECT_EQ(out[1], 0xef);
  EXPECT_FALSE(HexDecodeInto("bee", out.data(), out.size()));
  EXPECT_FALSE(HexDecodeInto("beef00", out.data(), out.size()));
  EXPECT_FALSE(HexDecodeInto("BEEF", out.data(), out.size()));
  EXPECT_FALSE(HexDecodeInto("be-f", out.data(), out.size()));
}

TEST(HexTest, Hex64IsSixteenPaddedDigitsAndParsesBack) {
  EXPECT_EQ(Hex64(0), "0000000000000000");
  EXPECT_EQ(Hex64(0xff), "00000000000000ff");
  EXPECT_EQ(Hex64(0x0123456789abcdefull), "0123456789abcdef");
  EXPECT_EQ(Hex64(~0ull), "ffffffffffffffff");
  for (uint64_t v : {0ull, 1ull, 0xabcull, 0x8000000000000000ull, ~0ull}) EXPECT_EQ(ParseHex64(Hex64(v)), v);
  EXPECT_EQ(ParseHex64("ff"), 0xffu) << "unpadded forms too";
  for (const char* bad : {"", "0123456789abcdef0", "FF", "0x1", "g", " 1"}) {
    EXPECT_FALSE(ParseHex64(bad).has_value()) << bad;
  }
}

TEST(HexTest, EscapedForMessageShowsPrintableAsciiAndCuts) {
  EXPECT_EQ(EscapedForMessage("w.0", 80), "w.0");
  EXPECT_EQ(EscapedForMessage(std::string("a\nb\\\x00\xff", 6), 80), "a\\x0ab\\x5c\\x00\\xff");
  EXPECT_EQ(EscapedForMessage("abcdef", 4), "abcd...");
  EXPECT_EQ(EscapedForMessage("abcd", 4), "abcd");
}

}  // namespace
}  // namespace ckpt
