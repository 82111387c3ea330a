#include "daemon/rendezvous_table.h"

#include <algorithm>
#include <cstdio>

namespace ckpt::daemon {

namespace {
std::string Seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", s);
  return buf;
}
}  // namespace

RendezvousTable::RendezvousTable(Options options) : options_(std::move(options)) {}

std::chrono::steady_clock::time_point RendezvousTable::Now() const {
  return options_.clock ? options_.clock() : std::chrono::steady_clock::now();
}

void RendezvousTable::ExpireLocked(std::chrono::steady_clock::time_point now) {
  for (auto it = entries_.begin(); it != entries_.end();) {
    if (now - it->second.published >= options_.ttl) {
      it = entries_.erase(it);
    } else {
      ++it;
    }
  }
}

size_t RendezvousTable::CountOwnedLocked(uint32_t owner) const {
  size_t n = 0;
  for (auto it = entries_.lower_bound(Key(owner, std::string())); it != entries_.end() && it->first.first == owner;
       ++it) {
    ++n;
  }
  return n;
}

bool RendezvousTable::OtherOwnerHasLocked(uint32_t owner, const std::string& job) const {
  for (const auto& [key, entry] : entries_) {
    if (key.first != owner && key.second == job) return true;
  }
  return false;
}

Result<uint64_t> RendezvousTable::Publish(uint32_t owner, const std::string& job, int world, std::string value) {
  if (world < 1) return InvalidArgument("world must be at least 1, not " + std::to_string(world));
  std::lock_guard<std::mutex> lock(mu_);
  const auto now = Now();
  ExpireLocked(now);
  const uint64_t generation = next_generation_++;
  const Key key(owner, job);
  if (world == 1) {  // no other rank will ever fetch it
    entries_.erase(key);
    return generation;
  }
  auto it = entries_.find(key);
  if (it == entries_.end() && entries_.size() >= options_.max_entries) {
    return ResourceExhausted("too many rendezvous in progress (" + std::to_string(entries_.size()) +
                             "); job '" + job + "' refused");
  }
  if (it == entries_.end() && CountOwnedLocked(owner) >= options_.max_entries_per_uid) {
    return ResourceExhausted("uid " + std::to_string(owner) + " already has " +
                             std::to_string(options_.max_entries_per_uid) +
                             " rendezvous in progress (the per-user limit); job '" + job + "' refused");
  }
  Entry& e = entries_[key];
  e.value = std::move(value);
  e.world = world;
  e.generation = generation;
  e.published = now;
  e.fetched.clear();
  changed_.notify_all();
  return generation;
}

Result<std::string> RendezvousTable::Await(uint32_t owner, const std::string& job, int rank, int world,
                                           std::chrono::duration<double> timeout,
                                           const std::function<Status()>& interrupted) {
  if (world < 2 || rank < 1 || rank >= world) {
    return InvalidArgument("a waiting rank must be in [1, world): rank " + std::to_string(rank) + ", world " +
                           std::to_string(world));
  }
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                    std::max(timeout, std::chrono::duration<double>(0)));
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    if (shut_down_) return Unavailable("ckptd is stopping");
    ExpireLocked(Now());
    auto it = entries_.find(Key(owner, job));
    if (it != entries_.end()) {
      Entry& e = it->second;
      if (e.world != world) {
        return InvalidArgument("job '" + job + "' was published for world " + std::to_string(e.world) + ", not " +
                               std::to_string(world));
      }
      std::string value = e.value;
      e.fetched.insert(rank);
      if (e.fetched.size() >= static_cast<size_t>(e.world - 1)) entries_.erase(it);
      return value;
    }
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) {
      if (OtherOwnerHasLocked(owner, job)) {
        return PermissionDenied("job '" + job + "' was published by another user; rendezvous entries are visible "
                                "only to the uid that published them (uid " + std::to_string(owner) + " waited " +
                                Seconds(timeout.count()) + " s)");
      }
      return DeadlineExceeded("no rank 0 published job '" + job + "' within " + Seconds(timeout.count()) + " s");
    }
    changed_.wait_until(lock, std::min(deadline, now + options_.poll_interval));
    if (interrupted) {
      lock.unlock();
      Status st = interrupted();
      if (!st.ok()) return st;
      lock.lock();
    }
  }
}

void RendezvousTable::Shutdown() {
  std::lock_guard<std::mutex> lock(mu_);
  shut_down_ = true;
  changed_.notify_all();
}

size_t RendezvousTable::size() {
  std::lock_guard<std::mutex> lock(mu_);
  ExpireLocked(Now());
  return entries_.size();
}

}  // namespace ckpt::daemon
