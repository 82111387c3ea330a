#include "daemon/tensor_hasher.h"

#include <xxhash.h>

#include <algorithm>
#include <system_error>

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
  try {
    for (int i = 0; i < std::max(1, threads); ++i) h->threads_.emplace_back([p = h.get()] { p->Run(); });
  } catch (const std::system_error& e) {
    return ResourceExhausted(std::string("cannot start a checksum thread: ") + e.what());  // ~ joins those started
  }
  return h;
}

TensorHasher::~TensorHasher() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (std::thread& t : threads_) t.join();
  for (Stream& s : streams_) XXH3_freeState(s.state);
}

void TensorHasher::Add(size_t tensor, const std::byte* data, uint64_t size) {
  if (size == 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  Stream& s = streams_[tensor];
  s.pending.emplace_back(data, size);
  if (!s.queued) {
    s.queued = true;
    runnable_.push_back(tensor);
    work_cv_.notify_one();
  }
}

void TensorHasher::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    work_cv_.wait(lock, [&] { return stop_ || !runnable_.empty(); });
    if (stop_) return;
    const size_t tensor = runnable_.front();
    runnable_.pop_front();
    ++busy_;
    Stream& s = streams_[tensor];
    // Only this thread touches s.state until s.queued is cleared.
    while (!s.pending.empty() && !stop_) {
      auto [data, size] = s.pending.front();
      s.pending.pop_front();
      lock.unlock();
      XXH3_64bits_update(s.state, data, size);
      lock.lock();
      hashed_bytes_ += size;
    }
    s.queued = false;
    --busy_;
    if (!s.pending.empty() && !stop_) {  // (only when stopping) keep the invariant
      s.queued = true;
      runnable_.push_back(tensor);
    }
    if (busy_ == 0 && runnable_.empty()) idle_cv_.notify_all();
  }
}

std::vector<uint64_t> TensorHasher::Finish() {
  std::unique_lock<std::mutex> lock(mu_);
  idle_cv_.wait(lock, [&] { return stop_ || (busy_ == 0 && runnable_.empty()); });
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
