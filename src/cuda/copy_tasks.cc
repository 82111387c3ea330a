#include "cuda/copy_tasks.h"

#include <cstring>

namespace ckpt::cuda {

namespace {

// A region whose destination is one run of bytes: [dst, dst + bytes) of the CopyDestination.
struct DenseRegion {
  uint64_t dst, bytes;
  size_t job, region;
};

bool DenseDestination(const CopyRegion& r) { return r.rows == 1 || r.dst_pitch == r.row_bytes; }

// Cuts the dense regions into span tasks (CutIntoTasks).
void CutIntoSpans(const std::vector<CopyJob>& jobs, std::vector<DenseRegion> dense, uint64_t chunk,
                  std::vector<SpanPiece>* spans, std::vector<Task>* tasks) {
  std::sort(dense.begin(), dense.end(), [](const DenseRegion& a, const DenseRegion& b) { return a.dst < b.dst; });
  Task open;
  bool is_open = false;
  auto close = [&] {
    if (is_open) tasks->push_back(open);
    is_open = false;
  };
  for (const DenseRegion& d : dense) {
    if (is_open && d.dst != open.dst + open.bytes) close();  // a gap (or an overlap): a new span
    for (uint64_t b = 0; b < d.bytes;) {
      if (!is_open) {
        open = Task();
        open.job = d.job;  // the first piece's, for errors
        open.dst = d.dst + b;
        open.first_piece = spans->size();
        open.lo = UINT64_MAX;
        is_open = true;
      }
      const uint64_t take = std::min(d.bytes - b, chunk - open.bytes);
      SpanPiece p{d.job, d.region, b, b + take};
      const PieceSource s = SourceOf(jobs[d.job], p);
      p.gather = s.gather;
      spans->push_back(p);
      ++open.pieces;
      open.bytes += take;
      open.lo = std::min(open.lo, s.lo);
      open.hi = std::max(open.hi, s.hi);
      open.gather = open.gather || s.gather;
      b += take;
      if (open.bytes == chunk) close();
    }
  }
  close();
}

// How many tasks ForEachRect cuts region r into.
uint64_t RectCount(const CopyRegion& r, uint64_t chunk) {
  if (r.row_bytes <= chunk) {
    const uint64_t per = std::max<uint64_t>(1, chunk / r.row_bytes);
    return (r.rows + per - 1) / per;
  }
  return r.rows * ((r.row_bytes + chunk - 1) / chunk);
}

}  // namespace

PieceSource SourceOf(const CopyJob& job, const SpanPiece& p) {
  const CopyRegion& r = job.layout->regions[p.region];
  const auto base = reinterpret_cast<uint64_t>(job.src) + r.src_offset;
  auto at = [&](uint64_t k) { return base + k / r.row_bytes * r.src_pitch + k % r.row_bytes; };
  const bool rows = p.begin / r.row_bytes != (p.end - 1) / r.row_bytes;
  return {at(p.begin), at(p.end - 1) + 1, rows && r.src_pitch != r.row_bytes};
}

void GatherPiece(const CopyJob& job, const SpanPiece& p, std::byte* out) {
  const CopyRegion& r = job.layout->regions[p.region];
  const std::byte* src = job.src + r.src_offset;
  if (r.src_pitch == r.row_bytes || r.rows == 1) {
    std::memcpy(out, src + p.begin, p.end - p.begin);
    return;
  }
  for (uint64_t k = p.begin; k < p.end;) {
    const uint64_t row = k / r.row_bytes, col = k % r.row_bytes;
    const uint64_t n = std::min(r.row_bytes - col, p.end - k);
    std::memcpy(out, src + row * r.src_pitch + col, n);
    out += n;
    k += n;
  }
}

std::vector<Task> CutIntoTasks(const std::vector<CopyJob>& jobs, uint64_t chunk, std::vector<SpanPiece>* spans) {
  auto as_span = [&](const CopyJob& job, const CopyRegion& r) { return spans && CopiedAsItIs(job) && DenseDestination(r); };
  // Sized first: the loader plans while its workers fault their buffers in, and every
  // reallocation of a large vector is an mmap waiting for them (the process's mapping lock).
  uint64_t rects = 0, dense_regions = 0, dense_bytes = 0;
  for (const CopyJob& job : jobs) {
    if (job.transpose) {
      ++rects;
      continue;
    }
    for (const CopyRegion& r : job.layout->regions) {
      if (r.rows == 0 || r.row_bytes == 0) continue;
      if (as_span(job, r)) {
        ++dense_regions;
        dense_bytes += r.rows * r.row_bytes;
      } else {
        rects += RectCount(r, chunk);
      }
    }
  }
  std::vector<Task> tasks;
  std::vector<DenseRegion> dense;
  tasks.reserve(rects + dense_regions + dense_bytes / chunk + 1);
  dense.reserve(dense_regions);
  if (spans) spans->reserve(spans->size() + 2 * dense_regions + dense_bytes / chunk + 1);
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
      if (as_span(job, r)) {
        dense.push_back({RegionDestination(job, r), r.rows * r.row_bytes, j, ri});
        continue;
      }
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
  if (spans) CutIntoSpans(jobs, std::move(dense), chunk, spans, &tasks);
  std::sort(tasks.begin(), tasks.end(), [](const Task& a, const Task& b) { return a.lo < b.lo; });
  return tasks;
}

std::vector<size_t> TaskOrder(const std::vector<Task>& tasks, TaskMix mix) {
  std::vector<size_t> order, gathers, others;
  order.reserve(tasks.size());
  for (size_t i = 0; i < tasks.size(); ++i) order.push_back(i);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const bool wa = tasks[a].whole_job(), wb = tasks[b].whole_job();
    if (wa != wb) return wa;
    return wa && tasks[a].hi - tasks[a].lo > tasks[b].hi - tasks[b].lo;
  });
  if (mix == TaskMix::kAddress) return order;
  size_t whole = 0;
  while (whole < order.size() && tasks[order[whole]].whole_job()) ++whole;
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
