#include "common/crc32.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

namespace ckpt {
namespace {

// The definition, one bit at a time.
uint32_t BitwiseCrc32(const unsigned char* p, size_t n) {
  uint32_t reg = 0xffffffffu;
  for (size_t i = 0; i < n; ++i) {
    reg ^= p[i];
    for (int b = 0; b < 8; ++b) reg = (reg & 1) ? (reg >> 1) ^ 0xEDB88320u : reg >> 1;
  }
  return ~reg;
}

TEST(Crc32Test, MatchesTheDefinitionAtEveryLengthAndAlignment) {
  EXPECT_EQ(Crc32("123456789", 9), 0xCBF43926u);  // the standard check value
  EXPECT_EQ(Crc32(nullptr, 0), 0u);
  std::mt19937_64 rng(7);
  std::vector<unsigned char> buf(4096 + 64);
  for (auto& b : buf) b = static_cast<unsigned char>(rng());
  for (size_t n = 0; n <= 1100; ++n) {
    for (size_t off : {0, 1, 3, 15}) {
      ASSERT_EQ(Crc32(buf.data() + off, n), BitwiseCrc32(buf.data() + off, n)) << n << " at " << off;
    }
  }
  EXPECT_EQ(Crc32(buf.data(), 4096), BitwiseCrc32(buf.data(), 4096));
  std::vector<unsigned char> zeros(1 << 16, 0), ones(1 << 16, 0xff);
  EXPECT_EQ(Crc32(zeros.data(), zeros.size()), BitwiseCrc32(zeros.data(), zeros.size()));
  EXPECT_EQ(Crc32(ones.data(), ones.size()), BitwiseCrc32(ones.data(), ones.size()));
}

TEST(Crc32Test, ChainsAndCombinesLikeZlib) {
  std::mt19937_64 rng(9);
  std::vector<unsigned char> buf(1 << 20);
  for (auto& b : buf) b = static_cast<unsigned char>(rng());
  const uint32_t whole = Crc32(buf.data(), buf.size());
  for (size_t cut : {size_t{0}, size_t{1}, size_t{63}, size_t{64}, size_t{4097}, buf.size() - 1, buf.size()}) {
    const uint32_t a = Crc32(buf.data(), cut), b = Crc32(buf.data() + cut, buf.size() - cut);
    EXPECT_EQ(Crc32(buf.data() + cut, buf.size() - cut, a), whole) << cut;
    EXPECT_EQ(Crc32Combine(a, b, buf.size() - cut), whole) << cut;
  }
  // Many parts joined in order, as the loader joins its reads.
  uint32_t joined = 0;
  for (size_t at = 0; at < buf.size(); at += 77777) {
    const size_t n = std::min<size_t>(77777, buf.size() - at);
    joined = Crc32Combine(joined, Crc32(buf.data() + at, n), n);
  }
  EXPECT_EQ(joined, whole);
}

}  // namespace
}  // namespace ckpt
