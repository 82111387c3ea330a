#include "common/hex.h"

namespace ckpt {

namespace {

constexpr char kDigits[] = "0123456789abcdef";

// The value of lower-case hex digit `c`, or -1.
int Nibble(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

void AppendByte(std::string* out, unsigned char b) {
  *out += kDigits[b >> 4];
  *out += kDigits[b & 0xf];
}

}  // namespace

std::string HexEncode(const void* data, size_t size) {
  const auto* p = static_cast<const unsigned char*>(data);
  std::string out;
  out.reserve(2 * size);
  for (size_t i = 0; i < size; ++i) AppendByte(&out, p[i]);
  return out;
}

std::string HexEncode(std::string_view bytes) { return HexEncode(bytes.data(), bytes.size()); }

Result<std::string> HexDecode(std::string_view hex) {
  if (hex.size() % 2 != 0) return InvalidArgument("hex value has an odd length (" + std::to_string(hex.size()) + ")");
  std::string out(hex.size() / 2, '\0');
  for (size_t i = 0; i < out.size(); ++i) {
    const int hi = Nibble(hex[2 * i]), lo = Nibble(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) {
      return InvalidArgument("value is not lower-case hex (bad character at offset " +
                             std::to_string(hi < 0 ? 2 * i : 2 * i + 1) + ")");
    }
    out[i] = static_cast<char>((hi << 4) | lo);
  }
  return out;
}

bool HexDecodeInto(std::string_view hex, void* out, size_t size) {
  if (hex.size() != 2 * size) return false;
  auto* p = static_cast<unsigned char*>(out);
  for (size_t i = 0; i < size; ++i) {
    const int hi = Nibble(hex[2 * i]), lo = Nibble(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    p[i] = static_cast<unsigned char>((hi << 4) | lo);
  }
  return true;
}

std::string Hex64(uint64_t v) {
  std::string out(16, '0');
  for (int i = 15; i >= 0; --i, v >>= 4) out[static_cast<size_t>(i)] = kDigits[v & 0xf];
  return out;
}

std::optional<uint64_t> ParseHex64(std::string_view hex) {
  if (hex.empty() || hex.size() > 16) return std::nullopt;
  uint64_t v = 0;
  for (char c : hex) {
    const int d = Nibble(c);
    if (d < 0) return std::nullopt;
    v = (v << 4) | static_cast<uint64_t>(d);
  }
  return v;
}

std::string EscapedForMessage(std::string_view text, size_t max_bytes) {
  std::string out;
  for (size_t i = 0; i < text.size() && i < max_bytes; ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out += static_cast<char>(c);
    } else {
      out += "\\x";
      AppendByte(&out, c);
    }
  }
  if (text.size() > max_bytes) out += "...";
  return out;
}

}  // namespace ckpt
