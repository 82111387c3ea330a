// Byte sizes as people write them: the one parser of every size ckpt reads (ckptd's
// --memory-budget and --max-shm-bytes-per-uid, in flags and its configuration file;
// persist's max_shard_size in ckptctl, the C++ API and Python).
#pragma once

#include <cstdint>
#include <string>

#include "ckpt/status.h"

namespace ckpt {

// Parses `text` as a byte count: a decimal number (digits, optionally a fraction: "1.5"),
// optionally spaces, then optionally a unit, case-insensitive:
//   none or B                  bytes
//   KB MB GB TB PB EB          powers of 1000 (as transformers' max_shard_size: "5GB" is 5 * 10^9)
//   KiB MiB GiB TiB PiB EiB    powers of 1024 ("40GiB" is 40 * 2^30)
//   K M G T P E                powers of 1024 (as systemd reads MemoryMax=: "64G" is 64 GiB)
// A fraction is rounded down to whole bytes ("1.5KiB" is 1536, "0.1" is 0). Zero parses;
// callers that need at least a byte say so. InvalidArgument, naming `text`, for anything
// else (empty, a sign, an exponent, an unknown unit) and for a size above 2^63 - 1 bytes.
// Thread-safe.
Result<uint64_t> ParseByteSize(const std::string& text);

}  // namespace ckpt
