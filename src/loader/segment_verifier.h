// VerifySegment: re-checks a published segment's tensor bytes against the checksums
// recorded in its index, in parallel over tensors.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "ckpt/status.h"
#include "shm/segment_reader.h"

namespace ckpt::loader {

struct VerifyReport {
  uint64_t tensors = 0;                 // tensors checked
  uint64_t bytes = 0;                   // bytes hashed
  double seconds = 0;
  uint64_t mismatch_count = 0;          // tensors whose bytes differ from their checksum
  std::vector<std::string> mismatched;  // the first ones in index order, at most max_listed
  bool ok() const { return mismatch_count == 0; }
};

// Hashes every tensor of `segment` (XXH3-64, as the loader does) on `threads` threads
// and compares. A mismatch is reported in the VerifyReport, not as an error; errors are
// only InvalidArgument (threads < 1) and FailedPrecondition "verify cancelled".
// Thread-safe: `segment` is only read.
Result<VerifyReport> VerifySegment(const shm::SegmentReader& segment, int threads,
                                   const std::atomic<bool>* cancel = nullptr, size_t max_listed = 16);

}  // namespace ckpt::loader
