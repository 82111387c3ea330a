#include "common/thread_pool.h"

#include <algorithm>
#include <exception>
#include <system_error>

#include "common/progress_throttle.h"

namespace ckpt {

Status ThreadGroup::Start(size_t n, const std::function<void(size_t)>& fn) {
  threads_.reserve(threads_.size() + n);
  for (size_t i = 0; i < n; ++i) {
    const size_t k = started_;
    try {
      threads_.emplace_back([fn, k] { fn(k); });
    } catch (const std::system_error& e) {
      return ResourceExhausted("cannot start thread " + std::to_string(i + 1) + " of " + std::to_string(n) + ": " +
                               e.what());
    }
    ++started_;
  }
  return Status::Ok();
}

void ThreadGroup::Join() {
  for (std::thread& t : threads_) t.join();
  threads_.clear();
}

Status RunWorkers(int threads, const std::function<Status(int, const std::atomic<bool>&)>& worker,
                  const std::function<void()>& tick) {
  std::atomic<bool> stop{false};
  std::mutex mu;
  std::condition_variable cv;
  Status first_error;  // guarded by mu
  const int wanted = std::max(1, threads);
  int running = wanted;  // guarded by mu
  ThreadGroup group;
  Status started = group.Start(static_cast<size_t>(wanted), [&](size_t k) {
    const int id = static_cast<int>(k);
    Status st;
    try {
      st = worker(id, stop);
    } catch (const std::exception& e) {
      st = Internal(std::string("worker thread failed: ") + e.what());
    }
    std::lock_guard<std::mutex> lock(mu);
    if (!st.ok() && first_error.ok()) first_error = st;
    if (!st.ok()) stop.store(true);
    --running;
    cv.notify_all();
  });
  if (!started.ok()) {
    // No thread (RLIMIT_NPROC, memory): stop the ones started and report it.
    std::lock_guard<std::mutex> lock(mu);
    if (first_error.ok()) first_error = started.WithContext("starting " + std::to_string(wanted) + " workers");
    stop.store(true);
    running -= wanted - static_cast<int>(group.size());  // those never started
  }
  {
    std::unique_lock<std::mutex> lock(mu);
    while (running > 0) {
      cv.wait_for(lock, kProgressInterval);
      if (tick && running > 0) {
        lock.unlock();
        tick();
        lock.lock();
      }
    }
  }
  group.Join();
  return first_error;
}

void ParallelFor(size_t count, const std::function<void(size_t)>& fn) {
  if (count == 0) return;
  ThreadGroup group;
  (void)group.Start(count - 1, [&fn](size_t k) { fn(k + 1); });  // those not started: below
  fn(0);
  for (size_t k = 1 + group.size(); k < count; ++k) fn(k);
  group.Join();
}

Result<std::unique_ptr<ThreadPool>> ThreadPool::Create(int threads) {
  std::unique_ptr<ThreadPool> pool(new ThreadPool());
  Status started = pool->threads_.Start(static_cast<size_t>(std::max(1, threads)), [p = pool.get()](size_t) { p->Run(); });
  if (!started.ok()) return started;  // ~ThreadPool stops and joins those started
  return pool;
}

ThreadPool::~ThreadPool() { Stop(); }

void ThreadPool::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    queue_.clear();
  }
  work_cv_.notify_all();
  threads_.Join();
}

void ThreadPool::Submit(std::function<void()> task) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) return;
    queue_.push_back(std::move(task));
  }
  work_cv_.notify_one();
}

void ThreadPool::WaitIdle() {
  std::unique_lock<std::mutex> lock(mu_);
  idle_cv_.wait(lock, [&] { return stop_ || (queue_.empty() && running_ == 0); });
}

void ThreadPool::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    work_cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (stop_) return;
    std::function<void()> task = std::move(queue_.front());
    queue_.pop_front();
    ++running_;
    lock.unlock();
    task();
    task = nullptr;  // what it holds goes before the pool may look idle
    lock.lock();
    --running_;
    if (queue_.empty() && running_ == 0) idle_cv_.notify_all();
  }
}

void ReleaseOwnedInBackground(std::vector<std::shared_ptr<void>> owned) {
  if (owned.empty()) return;
  try {
    std::thread([v = std::move(owned)]() mutable {
      for (auto& o : v) o.reset();
    }).detach();
  } catch (const std::system_error&) {
    // No thread: the closure, destroyed with the exception, dropped them here (in some order).
  }
}

}  // namespace ckpt
