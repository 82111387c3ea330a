// Start-up adoption of the segments an earlier ckptd left in its segment directory.
//
// Only entries of the directory are considered, and only regular files that the
// daemon's own euid owns, with exactly the segment mode and one link, whose file name
// parses as <checkpoint>.<generation>.<id> and agrees with the header's name, generation
// and segment id, whose header and index validate (SegmentReader), and whose tensor
// bytes still match their checksums (re-hashed before anything is served). Every file is
// opened O_RDONLY|O_NOFOLLOW|O_NONBLOCK, so a FIFO or a link never blocks or redirects
// start-up. Everything else is logged and removed (without being read when it cannot be
// opened safely). Per checkpoint name the newest generation that passes wins; older ones
// are removed. Objects directly under /dev/shm with the pre-directory naming are never
// opened; they are counted and logged once.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>

#include "ckpt/status.h"
#include "daemon/catalog.h"
#include "shm/segment_directory.h"

namespace ckpt::daemon {

struct AdoptionOptions {
  uint32_t segment_mode = 0640;  // the mode every segment must have (--shm-mode)
  int verify_threads = 8;        // threads that re-hash tensor data
  std::string legacy_prefix;     // "<prefix>." objects in /dev/shm to report as ignored; empty: none
  // Checks a checkpoint name from a file name (the daemon's naming rules).
  std::function<Status(const std::string&)> validate_name;
  const std::atomic<bool>* cancel = nullptr;  // set to stop (then the rest is left as it is)
};

struct AdoptionReport {
  uint64_t adopted = 0;           // segments now in the catalog
  uint64_t removed = 0;           // entries removed (invalid, foreign, corrupt, superseded)
  uint64_t remove_failures = 0;   // entries that could not be removed (logged)
  uint64_t legacy_ignored = 0;    // old-style /dev/shm objects left alone
  uint64_t verified_bytes = 0;    // tensor bytes re-hashed
  double verify_seconds = 0;      // time spent re-hashing
};

// Scans `directory` and adopts what passes into `catalog` (format "adopted"). Errors only
// if the directory cannot be listed (IoError) or the scan was cancelled; a bad entry is
// never an error. Not thread-safe with other users of `directory` (run it before serving).
Result<AdoptionReport> AdoptSegments(const shm::SegmentDirectory& directory, const AdoptionOptions& options,
                                     Catalog* catalog);

}  // namespace ckpt::daemon
