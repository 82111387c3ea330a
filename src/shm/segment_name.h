// Segment identity and file names: `<checkpoint>.<generation>.<32 lower-hex>` inside the
// daemon's segment directory. The hex part is the segment's random 16-byte id, also
// stored in its header, so a name cannot be guessed before the daemon creates it and a
// file's name, header and lease all name the same content.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>

#include "ckpt/status.h"

namespace ckpt::shm {

inline constexpr size_t kSegmentIdBytes = 16;
using SegmentId = std::array<uint8_t, kSegmentIdBytes>;

// 16 bytes from getrandom(2) (blocking only until the kernel's pool is initialised).
// IoError if the kernel cannot supply them.
Result<SegmentId> RandomSegmentId();
// The id as 32 lower-case hex characters.
std::string SegmentIdHex(const SegmentId& id);
// The id that 32 lower-case hex characters spell; nullopt for anything else.
std::optional<SegmentId> ParseSegmentIdHex(const std::string& hex);

struct SegmentName {
  std::string checkpoint;  // the checkpoint's name (may contain '.')
  uint64_t generation = 0;
  SegmentId id{};

  // "<checkpoint>.<generation>.<id hex>".
  std::string ToString() const;
  // The parts of a file name ToString() made; nullopt if `file_name` is not of that form
  // (an empty checkpoint, a generation that is not canonical decimal or is 0, an id that
  // is not 32 lower-case hex digits, a '/' anywhere).
  static std::optional<SegmentName> Parse(const std::string& file_name);
};

}  // namespace ckpt::shm
