#include "loader/worker_group.h"

#include <chrono>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <system_error>
#include <thread>
#include <vector>

namespace ckpt::loader {

Status RunWorkers(int threads, const std::function<Status(int, const std::atomic<bool>&)>& worker,
                  const std::function<void()>& tick) {
  std::atomic<bool> stop{false};
  std::mutex mu;
  std::condition_variable cv;
  Status first_error;  // guarded by mu
  int running = std::max(1, threads);
  std::vector<std::thread> pool;
  const int wanted = running;
  for (int id = 0; id < wanted; ++id) {
    auto body = [&, id] {
      Status st;
      try {
        st = worker(id, stop);
      } catch (const std::exception& e) {
        st = Internal(std::string("reader thread failed: ") + e.what());
      }
      std::lock_guard<std::mutex> lock(mu);
      if (!st.ok() && first_error.ok()) first_error = st;
      if (!st.ok()) stop.store(true);
      --running;
      cv.notify_all();
    };
    try {
      pool.emplace_back(body);
    } catch (const std::system_error& e) {
      // No thread (RLIMIT_NPROC, memory): stop the ones started and report it.
      std::lock_guard<std::mutex> lock(mu);
      if (first_error.ok()) {
        first_error = ResourceExhausted("cannot start worker thread " + std::to_string(id + 1) + " of " +
                                        std::to_string(wanted) + ": " + e.what());
      }
      stop.store(true);
      running -= wanted - id;  // those never started
      break;
    }
  }
  {
    std::unique_lock<std::mutex> lock(mu);
    while (running > 0) {
      cv.wait_for(lock, std::chrono::milliseconds(100));
      if (tick && running > 0) {
        lock.unlock();
        tick();
        lock.lock();
      }
    }
  }
  for (auto& t : pool) t.join();
  return first_error;
}

}  // namespace ckpt::loader
