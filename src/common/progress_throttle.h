// Progress pacing, the one home of "about every 100 ms": how often a long operation
// reports progress (loads, persist, writes), and how often a loop that waits for one
// wakes to report it or to look at its connection.
#pragma once

#include <chrono>

namespace ckpt {

// The progress period: callbacks and progress events come about this often, and waiting
// loops (the loader's workers, an ensure's callers, a write's parts) wake this often.
inline constexpr std::chrono::milliseconds kProgressInterval{100};

// Says when a report is due: at most once per `interval`. Not thread-safe (one reporter).
class ProgressThrottle {
 public:
  using Clock = std::chrono::steady_clock;
  enum class First { kAtOnce, kAfterInterval };
  // `first`: whether the first Due() is due at once or only an interval after construction.
  // `now` is the clock (tests pass their own).
  explicit ProgressThrottle(Clock::duration interval = kProgressInterval, First first = First::kAtOnce,
                            Clock::time_point (*now)() = &Clock::now)
      : interval_(interval), now_(now), last_(now()), fresh_(first == First::kAtOnce) {}

  // True when `force`, on the first call with First::kAtOnce, or when at least `interval`
  // passed since the last true (or construction); a true starts the next interval.
  bool Due(bool force = false) {
    const Clock::time_point t = now_();
    if (!force && !fresh_ && t - last_ < interval_) return false;
    fresh_ = false;
    last_ = t;
    return true;
  }

 private:
  Clock::duration interval_;
  Clock::time_point (*now_)();
  Clock::time_point last_;
  bool fresh_;
};

}  // namespace ckpt
