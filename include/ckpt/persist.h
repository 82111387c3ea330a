// Persistence: write an attached checkpoint generation to a folder as safetensors.
//
//   auto client = ckpt::Client::Connect();
//   ckpt::PersistOptions options;                       // 5 GB shards, like transformers
//   auto written = ckpt::Persist(**client, "llama", "/models/llama-step-1000", options);
//
// The work is done in the calling process with its own file permissions (the daemon never
// writes where a client points it): the generation is attached read-only and its bytes are
// written straight from the shared-memory mapping with write(2) (no second host copy; the
// page cache behind each file is written back and dropped as the write goes on, so it
// stays a few tens of MiB). The folder appears whole or not at all: everything is written
// into a temporary folder beside DIR (".DIR.persist-XXXXXX"), each file and the folder are
// fsync'ed, then the temporary folder is renamed onto DIR (atomically exchanged with an
// existing DIR, whose old files are then removed) and the parent folder is fsync'ed. Any
// error (a full disk, a cancel, no permission) removes the temporary folder and leaves an
// existing DIR as it was.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ckpt/byte_size.h"  // ParseByteSize, for max_shard_size as people write it
#include "ckpt/client.h"
#include "ckpt/status.h"

namespace ckpt {

// transformers' default `max_shard_size` ("5GB", decimal).
inline constexpr uint64_t kDefaultMaxShardBytes = 5'000'000'000ull;

struct PersistOptions {
  // Above this many bytes of tensor data, the tensors are split over several files
  // model-00001-of-0000N.safetensors with a model.safetensors.index.json (transformers'
  // rule: a file is closed before the tensor that would take it past the limit; a tensor
  // larger than the limit gets a file of its own). At or below it: one model.safetensors.
  // Must be > 0.
  uint64_t max_shard_bytes = kDefaultMaxShardBytes;
  // Replace DIR when it exists and is not empty. It must then hold only regular files
  // (a folder with subfolders is refused, so a mistyped DIR never removes a tree).
  // Without it, a non-empty DIR is AlreadyExists. An empty DIR is always replaced.
  bool replace = false;
  // Persist only this generation (0: whatever is current when attached).
  // FailedPrecondition if the attached generation differs.
  uint64_t expected_generation = 0;
  // Called about every 100 ms, after each tensor file is written and at the end with
  // (bytes written, bytes to write), on the calling thread. Returning false (or throwing, rethrown after the clean-up) cancels:
  // Persist returns Cancelled, nothing is left behind, DIR is untouched. May be empty.
  CancellableProgress progress;
};

struct PersistResult {
  std::string name;
  uint64_t generation = 0;
  std::string dir;                      // DIR as given
  std::vector<std::string> files;       // names written in DIR: tensor files, then the index if any
  std::vector<std::string> side_files;  // the generation's side files, written beside them
  uint64_t tensor_count = 0;
  uint64_t data_bytes = 0;     // tensor bytes (a tied tensor stored once in memory is written once per name)
  uint64_t bytes_written = 0;  // every byte of every file
  double seconds = 0;
};

// Writes `checkpoint` into folder `dir` as described at the top of this file. The
// safetensors `__metadata__` of each file is the checkpoint's metadata (string values;
// an index's "total_size" is recomputed, not copied); side files keep their names and
// bytes (a side-file name that is not a plain file name, or that collides with a tensor
// file's, is Corrupt: nothing is written). Errors: InvalidArgument (max_shard_bytes 0,
// empty dir), AlreadyExists (DIR not empty and !replace), FailedPrecondition (DIR is not a
// folder, holds subfolders, or the generation differs from expected_generation),
// PermissionDenied (the folder beside DIR cannot be created or written), ResourceExhausted
// (no space or quota), IoError (any other system call), Cancelled.
// Thread-safe as far as `checkpoint` is (it is only read).
Result<PersistResult> Persist(const Checkpoint& checkpoint, const std::string& dir, const PersistOptions& options);

// Attaches `name` through `client` (its own connection; the attachment keeps the bytes
// valid even if the generation is evicted or replaced meanwhile) and persists it.
// NotFound if `name` is not loaded; otherwise as above.
Result<PersistResult> Persist(Client& client, const std::string& name, const std::string& dir,
                              const PersistOptions& options);

}  // namespace ckpt
