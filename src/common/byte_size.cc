#include "common/byte_size.h"

#include <cstdio>

namespace ckpt {

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
