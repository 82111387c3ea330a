#include "common/byte_size.h"

#include <cctype>
#include <cstdio>

namespace ckpt {

namespace {

constexpr uint64_t kMaxByteSize = (uint64_t{1} << 63) - 1;

// The multiplier of `unit` (lower-case), or 0 if it is not a unit.
uint64_t UnitScale(const std::string& unit) {
  if (unit.empty() || unit == "b") return 1;
  static const char kPrefixes[] = "kmgtpe";
  for (int i = 0; kPrefixes[i] != '\0'; ++i) {
    const std::string p(1, kPrefixes[i]);
    uint64_t decimal = 1, binary = 1;
    for (int k = 0; k <= i; ++k) {
      decimal *= 1000;
      binary *= 1024;
    }
    if (unit == p + "b") return decimal;
    if (unit == p || unit == p + "ib") return binary;
  }
  return 0;
}

}  // namespace

Result<uint64_t> ParseByteSize(const std::string& text) {
  const auto refuse = [&](const std::string& why) {
    return InvalidArgument("'" + text + "' is not a size: " + why +
                           " (a number of bytes with an optional unit: 5GB = 5*10^9, 40GiB or 40G = 40*2^30)");
  };
  size_t i = 0;
  std::string whole, fraction;
  while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) whole += text[i++];
  if (i < text.size() && text[i] == '.') {
    ++i;
    while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) fraction += text[i++];
  }
  if (whole.empty() && fraction.empty()) return refuse("it does not begin with a number");
  while (i < text.size() && text[i] == ' ') ++i;
  std::string unit = text.substr(i);
  for (char& c : unit) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  const uint64_t scale = UnitScale(unit);
  if (scale == 0) {
    return refuse("unknown unit '" + text.substr(i) +
                  "'; units: B, KB MB GB TB PB EB (powers of 1000), KiB MiB GiB TiB PiB EiB or K M G T P E "
                  "(powers of 1024)");
  }
  // whole * scale + fraction * scale / 10^digits, exactly, rounded down.
  const auto too_large = [&] { return InvalidArgument("'" + text + "' is too large a size (at most 2^63 - 1 bytes)"); };
  unsigned __int128 value = 0;
  for (char c : whole) {
    value = value * 10 + static_cast<unsigned>(c - '0');
    if (value > kMaxByteSize) return too_large();
  }
  value *= scale;
  if (value > kMaxByteSize) return too_large();
  // The first 19 digits of the fraction (so num * scale stays far below 2^128; later ones
  // are below a tenth of a byte even at EiB and are ignored).
  unsigned __int128 num = 0, den = 1;
  for (size_t k = 0; k < fraction.size() && k < 19; ++k) {
    num = num * 10 + static_cast<unsigned>(fraction[k] - '0');
    den *= 10;
  }
  value += num * scale / den;
  if (value > kMaxByteSize) return too_large();
  return static_cast<uint64_t>(value);
}

std::string HumanBytes(uint64_t bytes) {
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (bytes < 1024) return std::to_string(bytes) + " B";
  double v = static_cast<double>(bytes);
  int unit = 0;
  while (v >= 1024 && unit < 6) {
    v /= 1024;
    ++unit;
  }
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2f %s", v, kUnits[unit]);
  return buf;
}

std::string BytesText(uint64_t bytes) {
  if (bytes < 1024) return std::to_string(bytes) + " bytes";
  return HumanBytes(bytes) + " (" + std::to_string(bytes) + " bytes)";
}

}  // namespace ckpt
