// Threads, the one home of them for work spread over several threads:
//  - ThreadGroup: threads started together and joined together (the building block);
//  - RunWorkers: a fixed group working on one job, watched by the calling thread (the
//    loader's readers, the segment verifier, the write path's checksums and copies);
//  - ParallelFor: count independent items, one thread each, the caller taking part
//    (populating a mapping's pages);
//  - ThreadPool: long-lived threads taking queued tasks (the write path's streaming
//    checksums);
//  - ReleaseInBackground: a detached thread dropping objects whose destructors are slow
//    (a published segment's writable mapping: munmap costs tens of ms per GiB).
// Single threads with a role of their own (a connection's thread, the segment's space
// reservation, the copy engine's per-GPU workers with their streams and pinned buffers)
// are plain std::threads or ThreadGroups where they live; see each for why.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "ckpt/status.h"

namespace ckpt {

// Threads started by Start() and joined by Join() (or the destructor). Thread k of the group
// (k counting from 0 over every Start) runs fn(k). Neither copyable nor movable; Start and
// Join are called by the owner's thread only (not thread-safe among themselves).
class ThreadGroup {
 public:
  ThreadGroup() = default;
  ~ThreadGroup() { Join(); }
  ThreadGroup(const ThreadGroup&) = delete;
  ThreadGroup& operator=(const ThreadGroup&) = delete;

  // Starts `n` more threads, thread k running fn(k) (fn is copied into each; it must not
  // throw). ResourceExhausted "cannot start thread <i> of <n>: ..." if one cannot be started
  // (RLIMIT_NPROC, memory): the ones started before it keep running, size() counts them.
  Status Start(size_t n, const std::function<void(size_t)>& fn);
  // Waits for every thread started; afterwards size() is 0. Idempotent.
  void Join();
  // Threads started and not yet joined.
  size_t size() const { return threads_.size(); }

 private:
  std::vector<std::thread> threads_;
  size_t started_ = 0;  // every thread ever started (the next k)
};

// Runs worker(id, stop) for id in [0, max(1, threads)) on their own threads and waits for
// all of them, calling tick() (if set) on the calling thread about every kProgressInterval
// meanwhile. `stop` becomes true as soon as one worker returns an error, so the others can
// end early. Returns the first error, or OK. Exceptions never escape a worker (they become
// Internal). ResourceExhausted if a thread cannot be started: the ones started are stopped
// and joined.
Status RunWorkers(int threads, const std::function<Status(int id, const std::atomic<bool>& stop)>& worker,
                  const std::function<void()>& tick);

// Runs fn(k) for every k in [0, count): k >= 1 each on a thread of its own, k = 0 on the
// calling thread, and any item no thread could be started for on the calling thread too;
// returns when all are done. fn must not throw.
void ParallelFor(size_t count, const std::function<void(size_t k)>& fn);

// Drops `owned` (the caller's references, moved in), first to last, on a detached thread,
// off the caller's path; inline when no thread can be had. What they own must not need
// anything the caller frees after the call.
void ReleaseOwnedInBackground(std::vector<std::shared_ptr<void>> owned);
// ReleaseOwnedInBackground of the arguments, in order: each reference is moved into the
// thread's list (a braced list would copy them and leave the caller a reference to drop).
template <class... T>
void ReleaseInBackground(std::shared_ptr<T>... owned) {
  std::vector<std::shared_ptr<void>> v;
  v.reserve(sizeof...(T));
  (v.push_back(std::move(owned)), ...);
  ReleaseOwnedInBackground(std::move(v));
}

// Long-lived threads that run queued tasks in the order queued (FIFO; several at once, one
// per thread). Thread-safe: Submit and WaitIdle from any thread.
class ThreadPool {
 public:
  // A pool of max(1, threads) threads. ResourceExhausted if a thread cannot be started (the
  // ones started are stopped and joined).
  static Result<std::unique_ptr<ThreadPool>> Create(int threads);
  // Drops the tasks not yet started, waits for the running ones and joins the threads.
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // Queues `task` (which must not throw) to run on one of the threads.
  void Submit(std::function<void()> task);
  // Returns once no task is queued or running (tasks may queue more; they are waited for).
  void WaitIdle();

 private:
  ThreadPool() = default;
  void Run();
  void Stop();

  std::mutex mu_;
  std::condition_variable work_cv_;
  std::condition_variable idle_cv_;
  std::deque<std::function<void()>> queue_;  // guarded by mu_
  size_t running_ = 0;                       // guarded by mu_: tasks being run
  bool stop_ = false;                        // guarded by mu_
  ThreadGroup threads_;
};

}  // namespace ckpt
