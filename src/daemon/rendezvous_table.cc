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

Result<uint64_t> RendezvousTable::Publish(const std::string& job, int world, std::string value) {
  if (world < 1) return InvalidArgument("world must be at least 1, not " + std::to_string(world));
  std::lock_guard<std::mutex> lock(mu_);
  const auto now = Now();
  ExpireLocked(now);
  const uint64_t generation = next_generation_++;
  if (world == 1) {  // no other rank will ever fetch it
    entries_.erase(job);
    return generation;
  }
  auto it = entries_.find(job);
  if (it == entries_.end() && entries_.size() >= options_.max_entries) {
    return ResourceExhausted("too many rendezvous in progress (" + std::to_string(entries_.size()) +
                             "); job '" + job + "' refused");
  }
  Entry& e = entries_[job];
  e.value = std::move(value);
  e.world = world;
  e.generation = generation;
  e.published = now;
  e.fetched.clear();
  changed_.notify_all();
  return generation;
}

Result<std::string> RendezvousTable::Await(const std::string& job, int rank, int world,
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
    auto it = entries_.find(job);
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
