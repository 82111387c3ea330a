// RunWorkers: a fixed group of threads working on one job, watched by the calling thread.
#pragma once

#include <atomic>
#include <functional>

#include "ckpt/status.h"

namespace ckpt::loader {

// Runs worker(id, stop) for id in [0, threads) on their own threads and waits for all of
// them, calling tick() (if set) on the calling thread about every 100 ms meanwhile.
// `stop` becomes true as soon as one worker returns an error, so the others can end early.
// Returns the first error, or OK. Exceptions never escape a worker (they become Internal).
// ResourceExhausted if a thread cannot be started: the ones started are stopped and joined.
Status RunWorkers(int threads, const std::function<Status(int id, const std::atomic<bool>& stop)>& worker,
                  const std::function<void()>& tick);

}  // namespace ckpt::loader
