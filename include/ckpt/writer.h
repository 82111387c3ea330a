// ckpt::Writer: publish a checkpoint generation from this process (issue 15; see
// docs/write-path.md). One Writer per part (rank) of a generation; a generation written
// by one process has one part.
//
//   ckpt::WriterOptions o;                                  // one part, no job
//   auto w = ckpt::Writer::Create(ckpt::Client::DefaultSocketPath(), "step-100", o);
//   (*w)->Add("wte.weight", ckpt::DType::kF32, {50257, 2560}, data);   // whole tensor
//   auto published = (*w)->Commit();                         // a LoadResult, or the error
//
// The writer never maps the generation's segment: it fills a small staging ring (a memfd
// sealed against shrinking, passed to the daemon), from which the daemon copies into the
// segment that only it maps writable, checksums and publishes. After Commit returns,
// nothing this process holds can change a byte of the generation.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ckpt/client.h"
#include "ckpt/dtype.h"
#include "ckpt/status.h"

namespace ckpt {

struct WriterOptions {
  std::string job;          // shared by every part of a multi-part write (e.g. name + launch id)
  int64_t part = 0;         // this part, in [0, parts)
  int64_t parts = 1;        // parts of the generation; each must Commit, or none is published
  bool replace = false;     // publish a new generation under an existing name
  double timeout_s = 600;   // the whole write, from the first part's Commit (0 to 86400)
  uint64_t ring_slots = 4;  // staging ring: slots x slot_bytes (less when the data is smaller)
  uint64_t slot_bytes = 64ull << 20;
  // Called once with the ring's mapping before any byte is staged, and once after the
  // last (e.g. to cudaHostRegister it for fast device-to-host copies, and to unregister).
  std::function<void(void* data, uint64_t bytes)> on_ring_mapped;
  std::function<void(void* data, uint64_t bytes)> on_ring_unmapping;
};

// Fills `size` bytes of a piece, starting at byte `offset` of its row-major bytes (or of
// its flat range), into `dst` (in the ring). An error fails the whole write.
using PieceSource = std::function<Status(uint64_t offset, void* dst, uint64_t size)>;

// One part of a write. Not thread-safe; Commit blocks until the generation is published or failed.
class Writer {
 public:
  // Checks the options; connects nothing yet. InvalidArgument for a bad part/parts, a
  // multi-part write without a job, or a bad ring size.
  static Result<std::unique_ptr<Writer>> Create(const std::string& socket_path, const std::string& name,
                                                const WriterOptions& options);
  // Aborts a write not committed (the daemon fails the whole generation: nothing published).
  ~Writer();
  Writer(const Writer&) = delete;
  Writer& operator=(const Writer&) = delete;

  // Declares a box piece of global tensor `key`: `shape` elements from `offsets` (empty:
  // the whole tensor, offsets 0), filled by `source` at Commit. InvalidArgument for a box
  // outside the global shape or mismatched ranks. Other parts' pieces are checked by the
  // daemon at Commit (dtype/shape agreement, no overlap, no hole).
  Status AddBox(const std::string& key, DType dtype, const std::vector<int64_t>& global_shape,
                const std::vector<int64_t>& offsets, const std::vector<int64_t>& shape, PieceSource source);
  // AddBox of the whole tensor from `data` (contiguous row-major host bytes, kept valid
  // until Commit returns).
  Status Add(const std::string& key, DType dtype, const std::vector<int64_t>& shape, const void* data);
  // Declares the flat piece [start, start + numel) of the flattened global tensor (a ZeRO
  // partition), filled by `source`.
  Status AddFlat(const std::string& key, DType dtype, const std::vector<int64_t>& global_shape, uint64_t start,
                 uint64_t numel, PieceSource source);
  // A file stored with the generation (Checkpoint::SideFile). AlreadyExists if repeated.
  Status AddSideFile(const std::string& name, std::string bytes);

  // Declares this part, waits for every part, streams the bytes and seals; returns once
  // the generation is published (the same result as a load) or with the error that
  // failed the whole generation (nothing published). Only once per Writer.
  Result<LoadResult> Commit();
  // Abandons the write before Commit (or from another thread while it runs: the
  // connection is shut down and Commit returns an error). Nothing is published.
  void Abort();

  uint64_t piece_count() const;
  uint64_t declared_bytes() const;

 private:
  struct Impl;
  explicit Writer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ckpt
