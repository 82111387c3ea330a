// The one progress pacing.
#include "common/progress_throttle.h"

#include <gtest/gtest.h>

namespace ckpt {
namespace {

ProgressThrottle::Clock::time_point fake_now;
ProgressThrottle::Clock::time_point FakeNow() { return fake_now; }

TEST(ProgressThrottleTest, AtMostOncePerIntervalTheFirstAtOnce) {
  using std::chrono::milliseconds;
  fake_now = ProgressThrottle::Clock::time_point(std::chrono::hours(1));
  ProgressThrottle t(milliseconds(100), ProgressThrottle::First::kAtOnce, &FakeNow);
  EXPECT_TRUE(t.Due());
  EXPECT_FALSE(t.Due());
  fake_now += milliseconds(99);
  EXPECT_FALSE(t.Due());
  EXPECT_TRUE(t.Due(true)) << "forced (the end of an operation)";
  fake_now += milliseconds(99);
  EXPECT_FALSE(t.Due()) << "a forced report starts the interval too";
  fake_now += milliseconds(1);
  EXPECT_TRUE(t.Due());
  fake_now += milliseconds(250);
  EXPECT_TRUE(t.Due());
  EXPECT_FALSE(t.Due());
}

TEST(ProgressThrottleTest, AfterIntervalWaitsFromConstruction) {
  using std::chrono::seconds;
  fake_now = ProgressThrottle::Clock::time_point(std::chrono::hours(2));
  ProgressThrottle t(seconds(2), ProgressThrottle::First::kAfterInterval, &FakeNow);
  EXPECT_FALSE(t.Due());
  fake_now += seconds(2);
  EXPECT_TRUE(t.Due());
  EXPECT_FALSE(t.Due());
}

TEST(ProgressThrottleTest, TheProgressPeriodIs100Ms) {
  EXPECT_EQ(kProgressInterval, std::chrono::milliseconds(100));
}

}  // namespace
}  // namespace ckpt
