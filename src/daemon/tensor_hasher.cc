#include "daemon/tensor_hasher.h"

#include <xxhash.h>

namespace ckpt::daemon {

Result<std::unique_ptr<TensorHasher>> TensorHasher::Create(size_t tensors, int threads,
                                                          std::shared_ptr<void> keep_alive) {
  std::unique_ptr<TensorHasher> h(new TensorHasher());
  h->keep_alive_ = std::move(keep_alive);
  h->streams_.resize(tensors);
  for (Stream& s : h->streams_) {
    s.state = XXH3_createState();
    if (s.state == nullptr) return ResourceExhausted("no memory for a checksum state");
    XXH3_64bits_reset(s.state);
  }
  auto pool = ThreadPool::Create(threads);
  if (!pool.ok()) return pool.status().WithContext("checksum threads");
  h->pool_ = std::move(*pool);
  return h;
}

TensorHasher::~TensorHasher() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  pool_.reset();  // drops the Drain tasks not started, waits for the running ones
  for (Stream& s : streams_) XXH3_freeState(s.state);
}

void TensorHasher::Add(size_t tensor, const std::byte* data, uint64_t size) {
  if (size == 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  Stream& s = streams_[tensor];
  s.pending.emplace_back(data, size);
  if (!s.queued) {
    s.queued = true;
    pool_->Submit([this, tensor] { Drain(tensor); });
  }
}

void TensorHasher::Drain(size_t tensor) {
  std::unique_lock<std::mutex> lock(mu_);
  Stream& s = streams_[tensor];
  // Only this task touches s.state until s.queued is cleared.
  while (!s.pending.empty() && !stop_) {
    auto [data, size] = s.pending.front();
    s.pending.pop_front();
    lock.unlock();
    XXH3_64bits_update(s.state, data, size);
    lock.lock();
    hashed_bytes_ += size;
  }
  s.queued = false;
}

std::vector<uint64_t> TensorHasher::Finish() {
  pool_->WaitIdle();
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<uint64_t> out;
  out.reserve(streams_.size());
  for (const Stream& s : streams_) out.push_back(XXH3_64bits_digest(s.state));
  return out;
}

uint64_t TensorHasher::hashed_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return hashed_bytes_;
}

}  // namespace ckpt::daemon
