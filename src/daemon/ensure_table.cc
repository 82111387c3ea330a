#include "daemon/ensure_table.h"

namespace ckpt::daemon {

bool SharedLoad::Join() {
  std::lock_guard<std::mutex> lock(mu_);
  if (finished_ || participants_ == 0) return false;
  ++participants_;
  return true;
}

void SharedLoad::Withdraw() {
  std::lock_guard<std::mutex> lock(mu_);
  if (participants_ > 0 && --participants_ == 0) cancel_.store(true);
}

int SharedLoad::participants() const {
  std::lock_guard<std::mutex> lock(mu_);
  return participants_;
}

void SharedLoad::SetProgress(uint64_t done, uint64_t total) {
  total_.store(total);
  done_.store(done);
}

std::pair<uint64_t, uint64_t> SharedLoad::progress() const { return {done_.load(), total_.load()}; }

void SharedLoad::Finish(Result<protocol::LoadResponse> result) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (finished_) return;
    result_ = std::move(result);
    finished_ = true;
  }
  done_cv_.notify_all();
}

std::optional<Result<protocol::LoadResponse>> SharedLoad::WaitFor(std::chrono::milliseconds timeout) const {
  std::unique_lock<std::mutex> lock(mu_);
  if (!done_cv_.wait_for(lock, timeout, [&] { return finished_; })) return std::nullopt;
  return result_;
}

bool SharedLoad::finished() const {
  std::lock_guard<std::mutex> lock(mu_);
  return finished_;
}

void EnsureTable::Remove(const std::string& name, const SharedLoad* load) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = loads_.find(name);
  if (it != loads_.end() && it->second.get() == load) loads_.erase(it);
}

Status EnsureTable::Run(const std::shared_ptr<SharedLoad>& load, std::function<void()> body) {
  std::lock_guard<std::mutex> lock(threads_mu_);
  for (auto it = threads_.begin(); it != threads_.end();) {
    if (it->first->finished()) {
      it->second.join();  // its body has returned from Finish, or is about to
      it = threads_.erase(it);
    } else {
      ++it;
    }
  }
  try {
    threads_.emplace_back(load, std::thread(std::move(body)));
  } catch (const std::exception& e) {
    return ResourceExhausted(std::string("cannot start a load thread: ") + e.what());
  }
  return Status::Ok();
}

void EnsureTable::JoinAll() {
  std::lock_guard<std::mutex> lock(threads_mu_);
  for (auto& [load, thread] : threads_) {
    if (thread.joinable()) thread.join();
  }
  threads_.clear();
}

}  // namespace ckpt::daemon
