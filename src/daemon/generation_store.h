// GenerationStore: the persisted high-water mark of generation numbers, so that a
// generation is never handed out twice, even after a restart with no surviving segments.
//
// The mark is the file `generation` (decimal, newline) in the daemon's state directory
// (--state-dir, systemd's StateDirectory=). Persist() writes it atomically (a temporary
// file, fsync, rename, fsync of the directory) before the caller uses the number.
// Thread-compatible: the caller (Catalog) serialises calls.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "ckpt/status.h"
#include "common/unique_fd.h"

namespace ckpt::daemon {

class GenerationStore {
 public:
  // Opens `state_dir` (creating it with mode 0700 if missing; its parent must exist),
  // takes an exclusive lock on it (a second daemon on the same state directory gets
  // FailedPrecondition) and reads the mark (0 if there is no file yet).
  // FailedPrecondition, naming the directory, if it is not a directory, is owned by
  // another uid, or is writable by group or others; Corrupt if the file does not hold a
  // number; IoError (with the errno text) otherwise.
  static Result<std::unique_ptr<GenerationStore>> Open(const std::string& state_dir);

  const std::string& path() const { return path_; }
  // The highest generation persisted so far (0: none).
  uint64_t last() const { return last_; }
  // Makes `generation` the persisted mark if it is higher than last(); durable when it
  // returns OK. IoError if it could not be written (then last() is unchanged).
  Status Persist(uint64_t generation);

 private:
  GenerationStore(std::string path, UniqueFd dir, uint64_t last)
      : path_(std::move(path)), dir_(std::move(dir)), last_(last) {}
  std::string path_;
  UniqueFd dir_;
  uint64_t last_;
};

}  // namespace ckpt::daemon
