// RendezvousTable: publish/await in either order, timeouts, world mismatch, republish,
// removal after every rank fetched or after the TTL (injected clock), the entry limit,
// shutdown and interrupted waits.
#include "daemon/rendezvous_table.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

namespace ckpt::daemon {
namespace {

using std::chrono::duration;
using std::chrono::steady_clock;

constexpr uint32_t kUid = 1000;

double SecondsSince(steady_clock::time_point t) { return duration<double>(steady_clock::now() - t).count(); }

TEST(RendezvousTableTest, PublishThenAwait) {
  RendezvousTable t;
  const std::string blob("\x00\x01\xff id", 6);
  auto gen = t.Publish(kUid, "job-1", 2, blob);
  ASSERT_TRUE(gen.ok()) << gen.status().ToString();
  auto v = t.Await(kUid, "job-1", 1, 2, duration<double>(1));
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(*v, blob);
}

TEST(RendezvousTableTest, AwaitBeforePublishGetsTheValueWhenItComes) {
  RendezvousTable t;
  const auto start = steady_clock::now();
  std::thread publisher([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    EXPECT_TRUE(t.Publish(kUid, "late", 3, "value").ok());
  });
  Result<std::string> a = Internal("unset"), b = Internal("unset");
  std::thread waiter([&] { b = t.Await(kUid, "late", 2, 3, duration<double>(10)); });
  a = t.Await(kUid, "late", 1, 3, duration<double>(10));
  waiter.join();
  publisher.join();
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(*a, "value");
  EXPECT_EQ(*b, "value");
  EXPECT_GE(SecondsSince(start), 0.19);
  EXPECT_LT(SecondsSince(start), 5);  // woken by the publish, not by the timeout
}

TEST(RendezvousTableTest, TimeoutIsDeadlineExceeded) {
  RendezvousTable t;
  const auto start = steady_clock::now();
  auto v = t.Await(kUid, "nobody", 1, 2, duration<double>(0.3));
  const double elapsed = SecondsSince(start);
  ASSERT_EQ(v.status().code(), StatusCode::kDeadlineExceeded) << v.status().ToString();
  EXPECT_NE(v.status().message().find("no rank 0 published job 'nobody' within 0.3 s"), std::string::npos)
      << v.status().message();
  EXPECT_GE(elapsed, 0.3);
  EXPECT_LT(elapsed, 2.0);
  // A zero timeout only looks.
  EXPECT_EQ(t.Await(kUid, "nobody", 1, 2, duration<double>(0)).status().code(), StatusCode::kDeadlineExceeded);
}

TEST(RendezvousTableTest, WorldMismatchIsInvalidArgument) {
  RendezvousTable t;
  ASSERT_TRUE(t.Publish(kUid, "j", 4, "x").ok());
  auto v = t.Await(kUid, "j", 1, 2, duration<double>(1));
  ASSERT_EQ(v.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(v.status().message(), "job 'j' was published for world 4, not 2");
  EXPECT_EQ(t.size(), 1u);  // a mismatched rank fetched nothing
  EXPECT_EQ(t.Await(kUid, "j", 0, 4, duration<double>(0)).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(t.Await(kUid, "j", 4, 4, duration<double>(0)).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(t.Publish(kUid, "j", 0, "x").status().code(), StatusCode::kInvalidArgument);
}

TEST(RendezvousTableTest, RepublishReplacesTheValueAndRestartsTheCount) {
  RendezvousTable t;
  auto g1 = t.Publish(kUid, "crashy", 3, "old");
  ASSERT_TRUE(g1.ok());
  EXPECT_EQ(*t.Await(kUid, "crashy", 1, 3, duration<double>(0)), "old");
  auto g2 = t.Publish(kUid, "crashy", 3, "new");  // a new run's rank 0
  ASSERT_TRUE(g2.ok());
  EXPECT_GT(*g2, *g1);
  EXPECT_EQ(*t.Await(kUid, "crashy", 1, 3, duration<double>(0)), "new");
  EXPECT_EQ(t.size(), 1u);  // rank 1's fetch of "old" no longer counts
  EXPECT_EQ(*t.Await(kUid, "crashy", 2, 3, duration<double>(0)), "new");
  EXPECT_EQ(t.size(), 0u);
}

TEST(RendezvousTableTest, RemovedOnceEveryOtherRankFetchedItCountingEachRankOnce) {
  RendezvousTable t;
  ASSERT_TRUE(t.Publish(kUid, "j", 3, "v").ok());
  EXPECT_EQ(*t.Await(kUid, "j", 1, 3, duration<double>(0)), "v");
  EXPECT_EQ(*t.Await(kUid, "j", 1, 3, duration<double>(0)), "v");  // again: counts once
  EXPECT_EQ(t.size(), 1u);
  EXPECT_EQ(*t.Await(kUid, "j", 2, 3, duration<double>(0)), "v");
  EXPECT_EQ(t.size(), 0u);
  EXPECT_EQ(t.Await(kUid, "j", 1, 3, duration<double>(0.05)).status().code(), StatusCode::kDeadlineExceeded);
  // World 1: nobody else will come, so nothing is kept.
  ASSERT_TRUE(t.Publish(kUid, "solo", 1, "v").ok());
  EXPECT_EQ(t.size(), 0u);
}

TEST(RendezvousTableTest, EntriesExpireAfterTheTtl) {
  auto now = std::make_shared<std::atomic<int64_t>>(0);  // seconds on the fake clock
  RendezvousTable::Options o;
  o.clock = [now] { return steady_clock::time_point(std::chrono::seconds(now->load())); };
  RendezvousTable t(o);
  ASSERT_TRUE(t.Publish(kUid, "j", 2, "v").ok());
  now->store(599);
  EXPECT_EQ(t.size(), 1u);
  now->store(600);
  EXPECT_EQ(t.size(), 0u);
  EXPECT_EQ(t.Await(kUid, "j", 1, 2, duration<double>(0)).status().code(), StatusCode::kDeadlineExceeded);
}

TEST(RendezvousTableTest, LimitOfLiveEntries) {
  auto now = std::make_shared<std::atomic<int64_t>>(0);
  RendezvousTable::Options o;
  o.max_entries = 3;
  o.clock = [now] { return steady_clock::time_point(std::chrono::seconds(now->load())); };
  RendezvousTable t(o);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(t.Publish(kUid, "j" + std::to_string(i), 2, "v").ok());
  EXPECT_EQ(t.Publish(kUid, "j3", 2, "v").status().code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(t.Publish(kUid, "j1", 2, "w").ok());  // replacing one is not a new entry
  EXPECT_TRUE(t.Await(kUid, "j0", 1, 2, duration<double>(0)).ok());  // fetched: removed
  EXPECT_TRUE(t.Publish(kUid, "j3", 2, "v").ok());
  EXPECT_EQ(t.Publish(kUid, "j4", 2, "v").status().code(), StatusCode::kResourceExhausted);
  now->store(601);  // all expire
  EXPECT_TRUE(t.Publish(kUid, "j4", 2, "v").ok());
  EXPECT_EQ(t.size(), 1u);
  // The default limit is 1024 (spread over uids: each may hold 64).
  RendezvousTable d;
  for (int i = 0; i < 1024; ++i) {
    ASSERT_TRUE(d.Publish(static_cast<uint32_t>(i / 64), "k" + std::to_string(i), 2, "v").ok()) << i;
  }
  EXPECT_EQ(d.Publish(99, "k1024", 2, "v").status().code(), StatusCode::kResourceExhausted);
}

TEST(RendezvousTableTest, EntriesBelongToTheirUidAndEachUidHasALimit) {
  RendezvousTable::Options o;
  o.max_entries_per_uid = 2;
  RendezvousTable t(o);
  ASSERT_TRUE(t.Publish(1000, "job", 2, "mine").ok());
  // Another uid publishing the same name cannot replace 1000's value...
  ASSERT_TRUE(t.Publish(2000, "job", 2, "forged").ok());
  // ...nor read it: its waiter sees only its own entry, and without one it is refused.
  EXPECT_EQ(*t.Await(2000, "job", 1, 2, duration<double>(0)), "forged");
  EXPECT_EQ(t.Await(3000, "job", 1, 2, duration<double>(0.05)).status().code(), StatusCode::kPermissionDenied);
  EXPECT_EQ(*t.Await(1000, "job", 1, 2, duration<double>(0)), "mine");
  // Per-uid limit: a third live entry of uid 3000 is refused, other uids are not held up.
  ASSERT_TRUE(t.Publish(3000, "a", 2, "v").ok());
  ASSERT_TRUE(t.Publish(3000, "b", 2, "v").ok());
  EXPECT_EQ(t.Publish(3000, "c", 2, "v").status().code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(t.Publish(3000, "a", 2, "again").ok());  // replacing its own is fine
  EXPECT_TRUE(t.Publish(4000, "c", 2, "v").ok());
}

TEST(RendezvousTableTest, ShutdownAndInterruptionEndWaitsPromptly) {
  RendezvousTable t;
  const auto start = steady_clock::now();
  Result<std::string> r = Internal("unset");
  std::thread waiter([&] { r = t.Await(kUid, "j", 1, 2, duration<double>(60)); });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  t.Shutdown();
  waiter.join();
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable);
  EXPECT_LT(SecondsSince(start), 5);
  EXPECT_EQ(t.Await(kUid, "j", 1, 2, duration<double>(60)).status().code(), StatusCode::kUnavailable);

  RendezvousTable u;
  std::atomic<int> checks{0};
  const auto start2 = steady_clock::now();
  auto v = u.Await(kUid, "j", 1, 2, duration<double>(60), [&]() -> Status {
    return ++checks >= 3 ? Unavailable("client went away") : Status::Ok();
  });
  EXPECT_EQ(v.status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(v.status().message(), "client went away");
  EXPECT_LT(SecondsSince(start2), 5);
}

}  // namespace
}  // namespace ckpt::daemon
