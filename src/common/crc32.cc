#include "common/crc32.h"

#include <array>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace ckpt {
namespace {

constexpr uint32_t kPoly = 0xEDB88320u;  // 0x04C11DB7 bit-reflected

// Tables for slicing by 8: table[k][b] is the CRC register after byte b followed by k zero bytes.
struct Tables {
  std::array<std::array<uint32_t, 256>, 8> t{};
  constexpr Tables() {
    for (uint32_t b = 0; b < 256; ++b) {
      uint32_t c = b;
      for (int i = 0; i < 8; ++i) c = (c & 1) ? (c >> 1) ^ kPoly : c >> 1;
      t[0][b] = c;
    }
    for (uint32_t b = 0; b < 256; ++b) {
      for (int k = 1; k < 8; ++k) t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xff];
    }
  }
};
constexpr Tables kTables;

// The raw register update (no pre/post inversion) over bytes, by table.
uint32_t UpdateByTable(uint32_t reg, const unsigned char* p, size_t n) {
  const auto& t = kTables.t;
  while (n >= 8) {
    uint32_t lo = reg ^ (static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 |
                         static_cast<uint32_t>(p[2]) << 16 | static_cast<uint32_t>(p[3]) << 24);
    reg = t[7][lo & 0xff] ^ t[6][(lo >> 8) & 0xff] ^ t[5][(lo >> 16) & 0xff] ^ t[4][lo >> 24] ^ t[3][p[4]] ^
          t[2][p[5]] ^ t[1][p[6]] ^ t[0][p[7]];
    p += 8;
    n -= 8;
  }
  while (n--) reg = (reg >> 8) ^ t[0][(reg ^ *p++) & 0xff];
  return reg;
}

#if defined(__x86_64__)
// Folding with carry-less multiplication (Gopal et al., "Fast CRC Computation for Generic
// Polynomials Using PCLMULQDQ Instruction", Intel 2009), bit-reflected: four 128-bit lanes
// take 64 bytes a step; each lane is moved forward 512 bits by multiplying its halves by
// x^(512+64-1) and x^(512-1) mod P (reflected; the -1 is the product's one-bit offset) and
// XORed into the next block. The lanes then fold into one 128-bit value (by 128 bits a
// step), which is congruent to the message so far: its 16 bytes finish by table.
#define CKPT_CLMUL __attribute__((target("pclmul,sse4.1")))

CKPT_CLMUL inline __m128i Load(const unsigned char* q) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(q)); }

// x's low half times k's low half, XOR x's high half times k's high half, XOR next.
CKPT_CLMUL inline __m128i Fold(__m128i x, __m128i k, __m128i next) {
  return _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x, k, 0x00), _mm_clmulepi64_si128(x, k, 0x11)), next);
}

CKPT_CLMUL uint32_t UpdateByClmul(uint32_t reg, const unsigned char* p, size_t n) {
  if (n < 64) return UpdateByTable(reg, p, n);
  const __m128i fold512 = _mm_set_epi64x(0x1c6e41596, 0x154442bd4);
  const __m128i fold128 = _mm_set_epi64x(0x0ccaa009e, 0x1751997d0);
  __m128i x0 = _mm_xor_si128(Load(p), _mm_cvtsi32_si128(static_cast<int>(reg)));
  __m128i x1 = Load(p + 16), x2 = Load(p + 32), x3 = Load(p + 48);
  p += 64;
  n -= 64;
  while (n >= 64) {
    x0 = Fold(x0, fold512, Load(p));
    x1 = Fold(x1, fold512, Load(p + 16));
    x2 = Fold(x2, fold512, Load(p + 32));
    x3 = Fold(x3, fold512, Load(p + 48));
    p += 64;
    n -= 64;
  }
  __m128i x = Fold(x0, fold128, x1);
  x = Fold(x, fold128, x2);
  x = Fold(x, fold128, x3);
  while (n >= 16) {
    x = Fold(x, fold128, Load(p));
    p += 16;
    n -= 16;
  }
  alignas(16) unsigned char last[16];
  _mm_store_si128(reinterpret_cast<__m128i*>(last), x);
  return UpdateByTable(UpdateByTable(0, last, 16), p, n);
}

bool HasClmul() {
  static const bool has = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
  return has;
}
#endif

// a * b modulo P, both bit-reflected polynomials (x^0 is the top bit).
uint32_t MultModP(uint32_t a, uint32_t b) {
  uint32_t product = 0;
  for (uint32_t m = 1u << 31; m != 0; m >>= 1) {
    if (a & m) product ^= b;
    b = (b & 1) ? (b >> 1) ^ kPoly : b >> 1;
  }
  return product;
}

// x^(8 * bytes) modulo P, by squaring.
uint32_t XPowBytes(uint64_t bytes) {
  uint32_t result = 1u << 31;  // x^0
  uint32_t square = 1u << 23;  // x^8
  while (bytes != 0) {
    if (bytes & 1) result = MultModP(result, square);
    square = MultModP(square, square);
    bytes >>= 1;
  }
  return result;
}

}  // namespace

uint32_t Crc32(const void* data, size_t size, uint32_t crc) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t reg = ~crc;
#if defined(__x86_64__)
  if (HasClmul()) return ~UpdateByClmul(reg, p, size);
#endif
  return ~UpdateByTable(reg, p, size);
}

uint32_t Crc32Combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b) {
  return MultModP(XPowBytes(len_b), crc_a) ^ crc_b;
}

bool Crc32IsAccelerated() {
#if defined(__x86_64__)
  return HasClmul();
#else
  return false;
#endif
}

}  // namespace ckpt
