#include "cuda/copy_tasks.h"

namespace ckpt::cuda {

std::vector<Task> CutIntoTasks(const std::vector<CopyJob>& jobs, uint64_t chunk) {
  std::vector<Task> tasks;
  for (size_t j = 0; j < jobs.size(); ++j) {
    const CopyJob& job = jobs[j];
    const auto base = reinterpret_cast<uint64_t>(job.src);
    const auto& regions = job.layout->regions;
    if (job.transpose) {
      Task t;
      t.job = j;
      t.lo = UINT64_MAX;
      for (const CopyRegion& r : regions) {
        if (r.rows == 0 || r.row_bytes == 0) continue;
        t.lo = std::min(t.lo, base + r.src_offset);
        t.hi = std::max(t.hi, base + r.src_offset + (r.rows - 1) * r.src_pitch + r.row_bytes);
      }
      for (const CopyRegion& r : regions) t.bytes += r.rows * r.row_bytes;
      if (t.hi > 0) tasks.push_back(t);
      continue;
    }
    for (size_t ri = 0; ri < regions.size(); ++ri) {
      const CopyRegion& r = regions[ri];
      if (r.rows == 0 || r.row_bytes == 0) continue;
      ForEachRect(r, chunk, [&](const Rect& x) {
        Task t;
        t.job = j;
        t.region = static_cast<int>(ri);
        t.rect = x;
        t.lo = base + r.src_offset + x.r0 * r.src_pitch + x.c0;
        t.hi = base + r.src_offset + (x.r1 - 1) * r.src_pitch + x.c1;
        t.bytes = (x.r1 - x.r0) * (x.c1 - x.c0);
        t.gather = x.r1 - x.r0 > 1 && x.c1 - x.c0 != r.src_pitch;
        tasks.push_back(t);
      });
    }
  }
  std::sort(tasks.begin(), tasks.end(), [](const Task& a, const Task& b) { return a.lo < b.lo; });
  return tasks;
}

std::vector<size_t> TaskOrder(const std::vector<Task>& tasks, TaskMix mix) {
  std::vector<size_t> order, gathers, others;
  order.reserve(tasks.size());
  for (size_t i = 0; i < tasks.size(); ++i) order.push_back(i);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const bool wa = tasks[a].region < 0, wb = tasks[b].region < 0;
    if (wa != wb) return wa;
    return wa && tasks[a].hi - tasks[a].lo > tasks[b].hi - tasks[b].lo;
  });
  if (mix == TaskMix::kAddress) return order;
  size_t whole = 0;
  while (whole < order.size() && tasks[order[whole]].region < 0) ++whole;
  double gather_total = 0, other_total = 0;
  for (size_t k = whole; k < order.size(); ++k) {
    const Task& t = tasks[order[k]];
    (t.gather ? gathers : others).push_back(order[k]);
    (t.gather ? gather_total : other_total) += static_cast<double>(t.bytes);
  }
  // Merge: next from the kind that has had the smaller share of its bytes taken so far.
  size_t g = 0, o = 0, k = whole;
  double gather_done = 0, other_done = 0;
  while (g < gathers.size() || o < others.size()) {
    const bool take_gather =
        o == others.size() || (g < gathers.size() && gather_done * other_total <= other_done * gather_total);
    const size_t i = take_gather ? gathers[g++] : others[o++];
    (take_gather ? gather_done : other_done) += static_cast<double>(tasks[i].bytes);
    order[k++] = i;
  }
  return order;
}

std::vector<Group> PlanGroups(std::vector<Task>& tasks, uint64_t page, uint64_t cap) {
  cap = std::max<uint64_t>(page, cap & ~(page - 1));
  std::vector<Group> runs, groups;
  for (const Task& t : tasks) {
    uint64_t b = t.lo & ~(page - 1), e = (t.hi + page - 1) & ~(page - 1);
    if (!runs.empty() && b <= runs.back().end) runs.back().end = std::max(runs.back().end, e);
    else runs.push_back({b, e});
  }
  for (const Group& r : runs)
    for (uint64_t b = r.begin; b < r.end; b += cap) groups.push_back({b, std::min(r.end, b + cap)});
  std::vector<uint64_t> begins;
  for (const Group& g : groups) begins.push_back(g.begin);
  for (Task& t : tasks) {
    t.reg_first = static_cast<size_t>(std::upper_bound(begins.begin(), begins.end(), t.lo) - begins.begin() - 1);
    t.reg_last = static_cast<size_t>(std::upper_bound(begins.begin(), begins.end(), t.hi - 1) - begins.begin() - 1);
  }
  return groups;
}

}  // namespace ckpt::cuda
