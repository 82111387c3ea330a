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
  // The state directory's descriptor (owned by this object; locked while it lives), for
  // other small state files (ReadStateFile, WriteStateFile).
  int dir_fd() const { return dir_.get(); }
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

// Reads the small regular file `name` (at most `max_bytes`) of the state directory open at
// `dir_fd` (named `dir_path` in messages), without following a link or blocking on a
// FIFO. NotFound if it does not exist; Corrupt if it is not a regular file or is larger;
// IoError otherwise.
Result<std::string> ReadStateFile(int dir_fd, const std::string& dir_path, const std::string& name,
                                  size_t max_bytes);

// Replaces file `name` of the state directory open at `dir_fd` with `text`, atomically
// and durably: "<name>.tmp" (mode 0600) written, fsync'd, renamed over `name`, then the
// directory fsync'd. IoError naming the file if any step fails (the old file then stays).
Status WriteStateFile(int dir_fd, const std::string& dir_path, const std::string& name, const std::string& text);

}  // namespace ckpt::daemon
