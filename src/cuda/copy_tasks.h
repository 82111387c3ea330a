// How the copy engine cuts its jobs into tasks and, on the register path, the pages read
// into registration groups. Pure host code (tested without a GPU).
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "cuda/copy_engine.h"

namespace ckpt::cuda {

// A strided rectangle of one region: rows [r0, r1), bytes [c0, c1) of each row.
struct Rect {
  uint64_t r0, r1, c0, c1;
};

// Calls f(rect) for rectangles of at most `chunk` bytes (whole rows where a row fits,
// else pieces of one row) that together cover every byte of the region once, in order.
template <typename F>
void ForEachRect(const CopyRegion& r, uint64_t chunk, F&& f) {
  if (r.row_bytes <= chunk) {
    uint64_t per = std::max<uint64_t>(1, chunk / r.row_bytes);
    for (uint64_t row = 0; row < r.rows; row += per) f(Rect{row, std::min(r.rows, row + per), 0, r.row_bytes});
  } else {
    for (uint64_t row = 0; row < r.rows; ++row)
      for (uint64_t c = 0; c < r.row_bytes; c += chunk) f(Rect{row, row + 1, c, std::min(r.row_bytes, c + chunk)});
  }
}

// One unit of work: one rectangle of one region of a job, or, for a transposed job, the
// whole job (every region, then the transpose kernel).
struct Task {
  size_t job = 0;
  int region = -1;  // -1: the whole job
  Rect rect{};
  uint64_t lo = 0, hi = 0;             // source bytes read: [lo, hi), absolute addresses
  size_t reg_first = 0, reg_last = 0;  // registration groups those bytes lie in (PlanGroups)
  uint64_t bytes = 0;                  // bytes copied (a whole-job task: every region's)
  bool gather = false;                 // several rows that are not packed in the source: on the
                                       // bounce path the CPU copies them one row at a time
};

// The tasks of `jobs`: a rectangle of at most `chunk` bytes (ForEachRect) for each piece
// of each region of a job that is not transposed, one whole-job task for each transposed
// job with any region; empty regions give none. Sorted by lo.
std::vector<Task> CutIntoTasks(const std::vector<CopyJob>& jobs, uint64_t chunk);

// How the tasks that are not whole-job tasks are ordered (TaskOrder).
enum class TaskMix {
  kAddress,  // in their order in `tasks` (by address, as CutIntoTasks returns them)
  kSpread,   // gather tasks spread evenly among the others by bytes (each kind in address
             // order): a row-parallel shard's strided rows cost the CPU several times
             // what packed bytes do, and in address order every worker meets them at once
};

// The order in which workers take `tasks` (indices into it): every whole-job
// (transposed) task first, largest span first, so that none is left for the end while
// the other workers idle; then the others as `mix` says. A permutation of the indices.
std::vector<size_t> TaskOrder(const std::vector<Task>& tasks, TaskMix mix = TaskMix::kAddress);

// A registration group: [begin, end), page-aligned.
struct Group {
  uint64_t begin, end;
};

// The union of the pages the tasks read, as groups of at most `cap` bytes (rounded down
// to pages, at least one page) in address order, so that copies can start while later
// groups are still being registered. Sets each task's reg_first/reg_last: the groups
// holding its first and last byte (every group between them is read by it too).
// Preconditions: `page` is a power of two; every task has lo < hi; tasks are sorted by lo
// (as CutIntoTasks returns them).
std::vector<Group> PlanGroups(std::vector<Task>& tasks, uint64_t page, uint64_t cap);

}  // namespace ckpt::cuda
