#include "shm/segment_name.h"

#include <sys/random.h>

#include <cerrno>

#include "common/hex.h"

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

std::string SegmentIdHex(const SegmentId& id) { return HexEncode(id.data(), id.size()); }

std::optional<SegmentId> ParseSegmentIdHex(const std::string& hex) {
  SegmentId id{};
  if (!HexDecodeInto(hex, id.data(), id.size())) return std::nullopt;
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
