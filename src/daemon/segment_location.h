// Where the daemon's segment directory lives, chosen so that no other user can create it
// first (a squatted directory would keep ckptd from starting) and so that a restart finds
// the same directory again (complete segments are re-adopted):
//
//  1. `segment_dir` (--segment-dir; the unit passes /run/ckptd-segments, a tmpfs it mounts
//     with huge=within_size): a path every parent of which only root or ckptd can write
//     (checked; anything else is a configuration error naming the parent). Created by the
//     daemon if missing and it may; if it may not (the unit's mount failed and ckptd has
//     no right to create it), the daemon falls back to 2 with a warning.
//  2. Otherwise /dev/shm/<prefix>.<32 random hex digits>: a name nobody can predict before
//     the daemon creates it (mkdir, which fails if anything has the name), recorded in the
//     state directory (file kSegmentDirectoryRecord, mode 0600 in a 0700 directory) so
//     the next start opens the same one. A recorded name is reused only while it is a
//     directory of the daemon's own (lstat: owner, type, never a link, never opened
//     otherwise); anything else at that name (the directory is gone after a reboot or a
//     --cleanup-on-exit stop, and another user who saw the name planted something there)
//     is left alone and a new name is made and recorded. The predictable
//     /dev/shm/<prefix> of older releases is never used.
#pragma once

#include <sys/types.h>

#include <memory>
#include <optional>
#include <string>

#include "ckpt/status.h"
#include "shm/segment_directory.h"

namespace ckpt::daemon {

// The state file that names the segment directory of scheme 2 (its file name in /dev/shm).
inline constexpr char kSegmentDirectoryRecord[] = "segment-directory";

struct SegmentLocationOptions {
  std::string segment_dir;           // --segment-dir; empty: scheme 2
  std::string shm_prefix;            // [A-Za-z0-9_-]+ (validated by the server)
  std::optional<gid_t> group;        // group of the directory (the reader group)
  int state_dir_fd = -1;             // the locked state directory (GenerationStore)
  std::string state_dir;             // its path, for messages
  std::string shm_root = shm::kShmRoot;  // where scheme 2 creates its directory
};

// Checks that `segment_dir` is an absolute path whose parent directories only root or
// this euid can write: each is owned by root or the euid, and none is writable by group
// or others -- except that a directory above the parent may be world-writable when it is
// sticky (like /tmp: others cannot rename what is in it). Returns the path with its
// parent canonicalised (symlinks resolved); FailedPrecondition naming the parent, its
// owner or mode, and the fix otherwise.
Result<std::string> CheckSegmentDirPlace(const std::string& segment_dir);

// Opens (or creates) the segment directory as described above. Logs (spdlog) what it
// chose and why whenever it did not use what it was given or recorded. Errors: those of
// CheckSegmentDirPlace; FailedPrecondition from SegmentDirectory::Open for an explicit
// directory that exists but is not the daemon's own (only root or ckptd could have made
// it), or one in use by another daemon; IoError (the record could not be written, ...).
Result<std::unique_ptr<shm::SegmentDirectory>> OpenSegmentLocation(const SegmentLocationOptions& options,
                                                                   std::string* fixed);

}  // namespace ckpt::daemon
