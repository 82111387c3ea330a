// EnsureTable: the ensure loads in progress, one per checkpoint name, each shared by every
// caller that asked for it (N ranks calling ensure at once run one load). Thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <functional>
#include <mutex>
#include <thread>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "ckpt/status.h"
#include "protocol/messages.h"

namespace ckpt::daemon {

// One load, run on a thread of its own (EnsureTable::Run), and the callers waiting for
// it. The caller that starts it counts as its first participant; others Join. The load is
// to be cancelled (cancel_flag) only when every participant has withdrawn. Thread-safe.
class SharedLoad {
 public:
  explicit SharedLoad(std::string path) : path_(std::move(path)) {}
  SharedLoad(const SharedLoad&) = delete;
  SharedLoad& operator=(const SharedLoad&) = delete;

  // The absolute path being loaded.
  const std::string& path() const { return path_; }
  // Adds a participant. False if the load is finished or already cancelled for lack of
  // participants (the caller must not wait for it).
  bool Join();
  // A participant leaves (hung up, cancelled). The last one to leave sets cancel_flag.
  void Withdraw();
  // Set when no participant is left, or by Cancel (a stopping daemon); read by the loader.
  const std::atomic<bool>* cancel_flag() const { return &cancel_; }
  void Cancel() { cancel_.store(true); }
  // Participants still waiting (the runner included, until it withdraws).
  int participants() const;

  // Progress of the load, for waiters' progress events.
  void SetProgress(uint64_t done, uint64_t total);
  std::pair<uint64_t, uint64_t> progress() const;

  // Records the outcome and wakes every waiter. Called once, by the runner.
  void Finish(Result<protocol::LoadResponse> result);
  // The outcome once Finish was called, waiting up to `timeout`; nullopt if not yet.
  std::optional<Result<protocol::LoadResponse>> WaitFor(std::chrono::milliseconds timeout) const;
  bool finished() const;

 private:
  const std::string path_;
  mutable std::mutex mu_;
  mutable std::condition_variable done_cv_;
  int participants_ = 1;  // the runner
  bool finished_ = false;
  std::optional<Result<protocol::LoadResponse>> result_;
  std::atomic<bool> cancel_{false};
  std::atomic<uint64_t> done_{0}, total_{0};
};

class EnsureTable {
 public:
  // Runs `decide` under the table's lock when no ensure load of `name` is in progress:
  // it returns true to start one (then the new SharedLoad is registered and returned
  // with started = true; the caller must Run it, whose body ends with Remove, Finish),
  // or false (then nothing is registered and load is null). When one is in progress,
  // `decide` is not called and that load is returned with started = false (the caller
  // must Join it before waiting). `decide` must not call back into the table.
  struct Entry {
    std::shared_ptr<SharedLoad> load;
    bool started = false;
  };
  template <typename Decide>
  Entry FindOrStart(const std::string& name, const std::string& path, Decide decide) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = loads_.find(name);
    if (it != loads_.end()) return Entry{it->second, false};
    if (!decide()) return Entry{};
    auto load = std::make_shared<SharedLoad>(path);
    loads_.emplace(name, load);
    return Entry{std::move(load), true};
  }
  // Ends the registration of `load` under `name` (no-op if another load holds the name).
  void Remove(const std::string& name, const SharedLoad* load);
  // Runs `body` (the load; it must end by calling Remove, then load->Finish) on a thread
  // of its own, so that no caller's connection is tied to it. Threads of finished loads
  // are joined here as new ones start. ResourceExhausted if no thread can be started
  // (then `body` never runs; the caller must Remove and Finish).
  Status Run(const std::shared_ptr<SharedLoad>& load, std::function<void()> body);
  // Joins every load's thread (they end once their load does: stop the daemon first, so
  // that its loads are cancelled). Call before anything the bodies use is destroyed.
  void JoinAll();

 private:
  std::mutex mu_;
  std::unordered_map<std::string, std::shared_ptr<SharedLoad>> loads_;
  std::mutex threads_mu_;
  std::vector<std::pair<std::shared_ptr<SharedLoad>, std::thread>> threads_;
};

}  // namespace ckpt::daemon
