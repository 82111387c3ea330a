#include "shm/segment_name.h"

#include <sys/random.h>

#include <cerrno>

namespace ckpt::shm {

Result<SegmentId> RandomSegmentId() {
  SegmentId id{};
  size_t got = 0;
  while (got < id.size()) {
    const ssize_t n = ::getrandom(id.data() + got, id.size() - got, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError("getrandom for a segment id", errno);
    }
    got += static_cast<size_t>(n);
  }
  return id;
}

std::string SegmentIdHex(const SegmentId& id) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * id.size());
  for (uint8_t b : id) {
    out += kDigits[b >> 4];
    out += kDigits[b & 15];
  }
  return out;
}

std::optional<SegmentId> ParseSegmentIdHex(const std::string& hex) {
  if (hex.size() != 2 * kSegmentIdBytes) return std::nullopt;
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  SegmentId id{};
  for (size_t i = 0; i < id.size(); ++i) {
    const int hi = nibble(hex[2 * i]), lo = nibble(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return std::nullopt;
    id[i] = static_cast<uint8_t>(hi << 4 | lo);
  }
  return id;
}

std::string SegmentName::ToString() const {
  return checkpoint + "." + std::to_string(generation) + "." + SegmentIdHex(id);
}

std::optional<SegmentName> SegmentName::Parse(const std::string& file_name) {
  if (file_name.find('/') != std::string::npos) return std::nullopt;
  const size_t id_dot = file_name.rfind('.');
  if (id_dot == std::string::npos || id_dot == 0) return std::nullopt;
  const size_t gen_dot = file_name.rfind('.', id_dot - 1);
  if (gen_dot == std::string::npos || gen_dot == 0) return std::nullopt;
  SegmentName out;
  out.checkpoint = file_name.substr(0, gen_dot);
  const std::string gen = file_name.substr(gen_dot + 1, id_dot - gen_dot - 1);
  if (gen.empty() || gen.size() > 20 || gen[0] == '0') return std::nullopt;  // canonical, >= 1
  uint64_t g = 0;
  for (char c : gen) {
    if (c < '0' || c > '9') return std::nullopt;
    if (__builtin_mul_overflow(g, 10, &g) || __builtin_add_overflow(g, static_cast<uint64_t>(c - '0'), &g)) {
      return std::nullopt;
    }
  }
  out.generation = g;
  auto id = ParseSegmentIdHex(file_name.substr(id_dot + 1));
  if (!id) return std::nullopt;
  out.id = *id;
  return out;
}

}  // namespace ckpt::shm
