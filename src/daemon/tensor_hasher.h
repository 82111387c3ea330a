// TensorHasher: the write path's XXH3-64 per tensor, computed while a generation streams
// in (docs/write-path.md, "Checksums"), instead of a second pass over every byte at
// publish. Each tensor whose bytes arrive in order (one piece covering it, streamed by
// one part) has a streaming XXH3 state; after the daemon copied a chunk into the segment,
// Add() queues the ranges it wrote, and a small pool of threads hashes them, each tensor
// by one thread at a time and in the order added, while the next chunks are copied (the
// bytes are read back from the segment, which only the daemon writes, right after they
// landed). Finish() waits for the queues to drain and returns the digests.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "ckpt/status.h"
#include "common/thread_pool.h"

struct XXH3_state_s;

namespace ckpt::daemon {

class TensorHasher {
 public:
  // A hasher of `tensors` streams with `threads` threads (at least 1). `keep_alive` is
  // held until the threads ended: the memory Add() ranges point into (the segment).
  // ResourceExhausted if a state or a thread cannot be had.
  static Result<std::unique_ptr<TensorHasher>> Create(size_t tensors, int threads, std::shared_ptr<void> keep_alive);
  // Stops and joins the threads (ranges not yet hashed are dropped).
  ~TensorHasher();
  TensorHasher(const TensorHasher&) = delete;
  TensorHasher& operator=(const TensorHasher&) = delete;

  // Appends bytes [data, data + size) to tensor `tensor`'s stream (ranges of one tensor
  // must be added in byte order, by one thread at a time; different tensors from any
  // thread). The bytes must not change until Finish() returned. Thread-safe.
  void Add(size_t tensor, const std::byte* data, uint64_t size);
  // Waits until every range added was hashed and returns each tensor's XXH3-64 (of the
  // empty input for a tensor nothing was added to). Once; Add() after it is a bug.
  std::vector<uint64_t> Finish();
  // Bytes hashed so far (for logs and tests).
  uint64_t hashed_bytes() const;

 private:
  struct Stream {
    XXH3_state_s* state = nullptr;
    std::deque<std::pair<const std::byte*, uint64_t>> pending;
    bool queued = false;  // a Drain task for it is queued or running
  };
  TensorHasher() = default;
  // A pool task: hashes what `tensor` has pending until nothing is (or the hasher stops).
  void Drain(size_t tensor);

  std::shared_ptr<void> keep_alive_;
  mutable std::mutex mu_;
  std::vector<Stream> streams_;  // guarded by mu_ (a state: by its Drain task alone)
  uint64_t hashed_bytes_ = 0;    // guarded by mu_
  bool stop_ = false;            // guarded by mu_
  std::unique_ptr<ThreadPool> pool_;
};

}  // namespace ckpt::daemon
