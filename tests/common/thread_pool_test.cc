// The one home of worker threads: ThreadGroup, RunWorkers, ParallelFor, ThreadPool, ReleaseInBackground.
#include "common/thread_pool.h"

#include <gtest/gtest.h>

#include <future>
#include <mutex>

#include <atomic>
#include <chrono>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

namespace ckpt {
namespace {

TEST(ThreadGroupTest, ThreadKRunsFnKAcrossStartsAndJoinWaits) {
  ThreadGroup group;
  std::mutex mu;
  std::multiset<size_t> seen;
  auto fn = [&](size_t k) {
    std::lock_guard<std::mutex> lock(mu);
    seen.insert(k);
  };
  ASSERT_TRUE(group.Start(3, fn).ok());
  ASSERT_TRUE(group.Start(2, fn).ok());
  EXPECT_EQ(group.size(), 5u);
  group.Join();
  EXPECT_EQ(group.size(), 0u);
  EXPECT_EQ(seen, (std::multiset<size_t>{0, 1, 2, 3, 4}));
  group.Join();  // idempotent
}

TEST(RunWorkersTest, EveryWorkerRunsAndTheFirstErrorStopsTheOthers) {
  std::atomic<int> ran{0};
  EXPECT_TRUE(RunWorkers(4, [&](int, const std::atomic<bool>&) { ++ran; return Status::Ok(); }, nullptr).ok());
  EXPECT_EQ(ran.load(), 4);
  EXPECT_TRUE(RunWorkers(0, [&](int id, const std::atomic<bool>&) { return id == 0 ? Status::Ok() : Internal("x"); },
                         nullptr).ok())
      << "at least one worker";
  // Worker 0 fails; the others wait for `stop` and end.
  Status st = RunWorkers(
      3,
      [](int id, const std::atomic<bool>& stop) {
        if (id == 0) return NotFound("worker 0");
        while (!stop.load()) std::this_thread::yield();
        return Status::Ok();
      },
      nullptr);
  EXPECT_EQ(st.code(), StatusCode::kNotFound);
  EXPECT_EQ(st.message(), "worker 0");
}

TEST(RunWorkersTest, ExceptionsBecomeInternalAndTicksRunOnTheCaller) {
  Status st = RunWorkers(2, [](int id, const std::atomic<bool>&) -> Status {
    if (id == 1) throw std::runtime_error("boom");
    return Status::Ok();
  }, nullptr);
  EXPECT_EQ(st.code(), StatusCode::kInternal);
  EXPECT_NE(st.message().find("boom"), std::string::npos) << st.message();
  const std::thread::id caller = std::this_thread::get_id();
  std::atomic<bool> ticked{false}, tick_on_caller{true};
  st = RunWorkers(
      1,
      [&](int, const std::atomic<bool>&) {
        while (!ticked.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        return Status::Ok();
      },
      [&] {
        if (std::this_thread::get_id() != caller) tick_on_caller = false;
        ticked = true;
      });
  EXPECT_TRUE(st.ok());
  EXPECT_TRUE(tick_on_caller.load());
}

TEST(ParallelForTest, EveryItemOnceItemZeroOnTheCaller) {
  for (size_t count : {0u, 1u, 7u}) {
    std::vector<std::atomic<int>> done(count);
    std::thread::id zero_on;
    ParallelFor(count, [&](size_t k) {
      ++done[k];
      if (k == 0) zero_on = std::this_thread::get_id();
    });
    for (size_t k = 0; k < count; ++k) EXPECT_EQ(done[k].load(), 1) << k;
    if (count > 0) {
      EXPECT_EQ(zero_on, std::this_thread::get_id());
    }
  }
}

TEST(ThreadPoolTest, RunsEveryTaskAndWaitIdleWaitsForTasksTheyQueue) {
  auto pool = ThreadPool::Create(3);
  ASSERT_TRUE(pool.ok()) << pool.status().ToString();
  std::atomic<int> ran{0};
  ThreadPool* p = pool->get();
  for (int i = 0; i < 50; ++i) {
    p->Submit([&ran, p] {
      ++ran;
      p->Submit([&ran] { ++ran; });  // a follow-up queued by the task
    });
  }
  p->WaitIdle();
  EXPECT_EQ(ran.load(), 100);
  p->WaitIdle();  // idle: at once
}

TEST(ThreadPoolTest, OneThreadRunsTasksInOrderAndDestructionDropsTheRest) {
  auto pool = ThreadPool::Create(0);  // at least one thread
  ASSERT_TRUE(pool.ok());
  std::vector<int> order;
  std::atomic<bool> release{false};
  std::atomic<int> after{0};
  (*pool)->Submit([&] {
    while (!release.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  });
  for (int i = 0; i < 5; ++i) (*pool)->Submit([&order, i] { order.push_back(i); });
  release = true;
  (*pool)->WaitIdle();
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3, 4}));
  // Destruction waits for the task that runs.
  std::atomic<bool> started{false};
  (*pool)->Submit([&] {
    started = true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    ++after;
  });
  while (!started.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  pool->reset();
  EXPECT_EQ(after.load(), 1);
}

// Dropped first to last on another thread, the caller not waiting for them.
TEST(ReleaseInBackgroundTest, DropsEveryObjectInOrderOnAnotherThread) {
  struct Recorder {
    Recorder(std::mutex* m, std::vector<std::pair<int, std::thread::id>>* l, std::promise<void>* p, int i)
        : mu(m), log(l), last(p), id(i) {}
    Recorder(const Recorder&) = delete;
    std::mutex* mu;
    std::vector<std::pair<int, std::thread::id>>* log;
    std::promise<void>* last;
    int id;
    ~Recorder() {
      std::lock_guard<std::mutex> lock(*mu);
      log->emplace_back(id, std::this_thread::get_id());
      if (id == 2) last->set_value();
    }
  };
  std::mutex mu;
  std::vector<std::pair<int, std::thread::id>> log;
  std::promise<void> last;
  std::future<void> done = last.get_future();
  auto first = std::make_shared<Recorder>(&mu, &log, &last, 1);
  auto second = std::make_shared<Recorder>(&mu, &log, &last, 2);
  ReleaseInBackground(std::move(first), std::move(second));
  EXPECT_FALSE(first || second) << "the caller keeps no reference to drop";
  done.wait();
  std::lock_guard<std::mutex> lock(mu);
  ASSERT_EQ(log.size(), 2u);
  EXPECT_EQ(log[0].first, 1);
  EXPECT_EQ(log[1].first, 2);
  EXPECT_NE(log[0].second, std::this_thread::get_id());
  EXPECT_EQ(log[0].second, log[1].second);
  ReleaseInBackground();  // nothing: no thread
}

}  // namespace
}  // namespace ckpt
