// RendezvousTable: small blobs (an NCCL unique id) that rank 0 of a job publishes and the
// job's other ranks on this node wait for. Thread-safe.
//
// An entry lives until all world-1 other ranks fetched it (each rank counts once), until
// `ttl` after it was published (expired lazily, by the next call that looks at the
// table), or until rank 0 publishes the job again (a new run after a crash), which
// replaces it and hands the new value to whoever is still waiting.
//
// Entries belong to the uid that published them: a job is looked up by (uid, name), so
// one user can neither replace nor read another user's entry (nor squat its name); a
// waiter that times out while only other users published that name gets
// PermissionDenied. Each uid may hold at most `max_entries_per_uid` live entries, so no
// single user fills the table.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <map>
#include <utility>
#include <unordered_set>

#include "ckpt/status.h"

namespace ckpt::daemon {

class RendezvousTable {
 public:
  using Clock = std::function<std::chrono::steady_clock::time_point()>;
  struct Options {
    size_t max_entries = 1024;
    size_t max_entries_per_uid = 64;
    std::chrono::steady_clock::duration ttl = std::chrono::minutes(10);
    // The clock entries age by (steady_clock::now if empty); tests inject their own.
    // Waits are always bounded in real time.
    Clock clock;
    // How often a waiter calls its `interrupted` check.
    std::chrono::milliseconds poll_interval{100};
  };

  RendezvousTable() : RendezvousTable(Options()) {}
  explicit RendezvousTable(Options options);
  RendezvousTable(const RendezvousTable&) = delete;
  RendezvousTable& operator=(const RendezvousTable&) = delete;

  // Stores `value` as `owner`'s job `job` of `world` ranks (replacing owner's entry of
  // that job, whose fetch count starts over) and wakes the job's waiters. Returns the
  // entry's generation (increasing across the table). With world 1 nobody can fetch it:
  // nothing is stored. InvalidArgument if world < 1; ResourceExhausted if `max_entries`
  // live entries exist, or `owner` holds `max_entries_per_uid`, and `job` is not one of
  // owner's.
  Result<uint64_t> Publish(uint32_t owner, const std::string& job, int world, std::string value);

  // Waits up to `timeout` (real time) for `owner`'s entry of `job`, then returns its value
  // and counts `rank` (1..world-1) as having fetched it; the entry is removed once every
  // other rank has. Errors: InvalidArgument if the entry was published for another world
  // (or rank is out of range); DeadlineExceeded when the timeout passes first
  // (PermissionDenied if meanwhile only other uids hold an entry of that name);
  // Unavailable after Shutdown(). While waiting, `interrupted` (if set) is called every
  // poll interval without the table's lock held; a non-OK Status it returns ends the
  // wait with that Status.
  Result<std::string> Await(uint32_t owner, const std::string& job, int rank, int world,
                            std::chrono::duration<double> timeout,
                            const std::function<Status()>& interrupted = nullptr);

  // Ends every wait in progress, and every later one, with Unavailable. Publish still works.
  void Shutdown();

  // Live entries (after expiring the old ones).
  size_t size();

 private:
  struct Entry {
    std::string value;
    int world = 0;
    uint64_t generation = 0;
    std::chrono::steady_clock::time_point published;
    std::unordered_set<int> fetched;
  };
  std::chrono::steady_clock::time_point Now() const;
  void ExpireLocked(std::chrono::steady_clock::time_point now);

  const Options options_;
  std::mutex mu_;
  std::condition_variable changed_;
  using Key = std::pair<uint32_t, std::string>;  // (owner uid, job)
  size_t CountOwnedLocked(uint32_t owner) const;
  bool OtherOwnerHasLocked(uint32_t owner, const std::string& job) const;
  std::map<Key, Entry> entries_;
  uint64_t next_generation_ = 1;
  bool shut_down_ = false;
};

}  // namespace ckpt::daemon
