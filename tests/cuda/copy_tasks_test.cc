// The copy engine's work split (pure host code, runs without a GPU): the tasks cover every
// byte of every region exactly once in pieces of at most one chunk, transposed jobs stay
// whole, and registration groups cover exactly the pages read, each task's bytes lying in
// the groups it waits for.
#include "cuda/copy_tasks.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>

namespace ckpt::cuda {
namespace {

struct RandomJobs {
  std::vector<ShardLayout> layouts;
  std::vector<CopyJob> jobs;
  std::vector<uint64_t> spans;  // bytes from each job's src to the end of its last region
};

// Jobs over disjoint source ranges starting at `base`, each with 1-3 strided regions.
RandomJobs MakeJobs(std::mt19937_64& rng, int njobs) {
  RandomJobs r;
  r.layouts.resize(static_cast<size_t>(njobs));
  uint64_t next = 1 << 20;
  for (int j = 0; j < njobs; ++j) {
    ShardLayout& L = r.layouts[static_cast<size_t>(j)];
    uint64_t end = 0;
    const int nregions = 1 + static_cast<int>(rng() % 3);
    for (int k = 0; k < nregions; ++k) {
      CopyRegion c;
      c.row_bytes = 1 + rng() % (rng() % 2 ? 300 : 20000);
      c.src_pitch = c.row_bytes + (rng() % 2 ? 0 : rng() % 5000);
      c.rows = rng() % 7 == 0 ? 0 : 1 + rng() % 40;
      c.src_offset = end + rng() % 3000;
      if (c.rows > 0) end = c.src_offset + (c.rows - 1) * c.src_pitch + c.row_bytes;
      L.regions.push_back(c);
    }
    CopyJob job;
    job.layout = &L;
    job.src = reinterpret_cast<const std::byte*>(next);
    job.transpose = rng() % 5 == 0;
    r.jobs.push_back(job);
    r.spans.push_back(end);
    next += end + rng() % 9000;
  }
  return r;
}

TEST(CopyTasksTest, TasksCoverEveryByteOnceInChunksAndTransposedJobsStayWhole) {
  std::mt19937_64 rng(11);
  for (int trial = 0; trial < 300; ++trial) {
    RandomJobs r = MakeJobs(rng, 1 + static_cast<int>(rng() % 12));
    const uint64_t chunk = 64 + rng() % 30000;
    std::vector<Task> tasks = CutIntoTasks(r.jobs, chunk);
    std::vector<std::vector<uint8_t>> seen;  // per job, per source byte: times covered
    for (uint64_t span : r.spans) seen.emplace_back(span, 0);
    std::set<size_t> whole;
    for (size_t i = 0; i < tasks.size(); ++i) {
      const Task& t = tasks[i];
      if (i > 0) {
        ASSERT_LE(tasks[i - 1].lo, t.lo) << "not sorted";
      }
      const CopyJob& job = r.jobs[t.job];
      const auto base = reinterpret_cast<uint64_t>(job.src);
      ASSERT_LT(t.lo, t.hi);
      if (job.transpose) {
        ASSERT_EQ(t.region, -1);
        ASSERT_TRUE(whole.insert(t.job).second) << "a transposed job cut in two";
        continue;
      }
      ASSERT_GE(t.region, 0);
      const CopyRegion& c = job.layout->regions[static_cast<size_t>(t.region)];
      const Rect& x = t.rect;
      ASSERT_LT(x.r0, x.r1);
      ASSERT_LE(x.r1, c.rows);
      ASSERT_LT(x.c0, x.c1);
      ASSERT_LE(x.c1, c.row_bytes);
      ASSERT_LE((x.r1 - x.r0) * (x.c1 - x.c0), chunk);
      ASSERT_EQ(t.lo, base + c.src_offset + x.r0 * c.src_pitch + x.c0);
      ASSERT_EQ(t.hi, base + c.src_offset + (x.r1 - 1) * c.src_pitch + x.c1);
      for (uint64_t row = x.r0; row < x.r1; ++row)
        for (uint64_t b = x.c0; b < x.c1; ++b) seen[t.job][c.src_offset + row * c.src_pitch + b]++;
    }
    for (size_t j = 0; j < r.jobs.size(); ++j) {
      const CopyJob& job = r.jobs[j];
      bool any = false;
      for (const CopyRegion& c : job.layout->regions) {
        any |= c.rows > 0;
        if (job.transpose) continue;
        for (uint64_t row = 0; row < c.rows; ++row)
          for (uint64_t b = 0; b < c.row_bytes; ++b) ASSERT_EQ(seen[j][c.src_offset + row * c.src_pitch + b], 1);
      }
      if (job.transpose) {
        EXPECT_EQ(whole.count(j), any ? 1u : 0u);
      }
    }
  }
}

TEST(CopyTasksTest, GroupsCoverExactlyThePagesReadAndEachTaskWaitsForItsOwn) {
  std::mt19937_64 rng(12);
  const uint64_t page = 4096;
  for (int trial = 0; trial < 300; ++trial) {
    RandomJobs r = MakeJobs(rng, 1 + static_cast<int>(rng() % 12));
    std::vector<Task> tasks = CutIntoTasks(r.jobs, 64 + rng() % 30000);
    const uint64_t cap = rng() % 4 == 0 ? 100 : page * (1 + rng() % 6);  // below a page: one page
    std::vector<Group> groups = PlanGroups(tasks, page, cap);
    std::set<uint64_t> read_pages;  // pages of [lo, hi) of every task
    for (const Task& t : tasks)
      for (uint64_t p = t.lo / page; p <= (t.hi - 1) / page; ++p) read_pages.insert(p);
    std::set<uint64_t> group_pages;
    for (size_t g = 0; g < groups.size(); ++g) {
      ASSERT_EQ(groups[g].begin % page, 0u);
      ASSERT_EQ(groups[g].end % page, 0u);
      ASSERT_LT(groups[g].begin, groups[g].end);
      ASSERT_LE(groups[g].end - groups[g].begin, std::max(page, cap / page * page));
      if (g > 0) {
        ASSERT_LE(groups[g - 1].end, groups[g].begin) << "groups overlap or are out of order";
      }
      for (uint64_t p = groups[g].begin / page; p < groups[g].end / page; ++p) group_pages.insert(p);
    }
    // The groups hold exactly the pages of the tasks' spans (a strided task's span is
    // registered whole: the driver wants one registration under each copy).
    ASSERT_EQ(group_pages, read_pages);
    for (const Task& t : tasks) {
      ASSERT_LE(t.reg_first, t.reg_last);
      ASSERT_LT(t.reg_last, groups.size());
      EXPECT_LE(groups[t.reg_first].begin, t.lo);
      EXPECT_GT(groups[t.reg_first].end, t.lo);
      EXPECT_LE(groups[t.reg_last].begin, t.hi - 1);
      EXPECT_GT(groups[t.reg_last].end, t.hi - 1);
      for (size_t g = t.reg_first; g + 1 <= t.reg_last; ++g)
        EXPECT_EQ(groups[g].end, groups[g + 1].begin) << "a task's bytes span a gap between groups";
    }
  }
}

// Issue 14 (the tail): a transposed piece is one task of the whole piece; taken last it
// would run on one worker while the others idle. TaskOrder puts every whole-job task
// first, largest first, and keeps the rest in address order; it is a permutation.
TEST(CopyTasksTest, WholeTransposedTasksAreTakenFirstLargestFirstAndTheRestInAddressOrder) {
  std::mt19937_64 rng(13);
  int with_whole_after_chunks = 0;
  for (int trial = 0; trial < 300; ++trial) {
    RandomJobs r = MakeJobs(rng, 2 + static_cast<int>(rng() % 12));
    std::vector<Task> tasks = CutIntoTasks(r.jobs, 64 + rng() % 30000);
    // In address order a whole task often comes after chunk tasks: the case that matters.
    bool chunk_seen = false;
    for (const Task& t : tasks) {
      if (t.region >= 0) chunk_seen = true;
      if (t.region < 0 && chunk_seen) {
        ++with_whole_after_chunks;
        break;
      }
    }
    std::vector<size_t> order = TaskOrder(tasks);
    ASSERT_EQ(order.size(), tasks.size());
    std::vector<size_t> sorted = order;
    std::sort(sorted.begin(), sorted.end());
    for (size_t i = 0; i < sorted.size(); ++i) ASSERT_EQ(sorted[i], i) << "not a permutation";
    size_t i = 0;
    for (; i < order.size() && tasks[order[i]].region < 0; ++i) {
      if (i > 0) {
        const Task &a = tasks[order[i - 1]], &b = tasks[order[i]];
        ASSERT_GE(a.hi - a.lo, b.hi - b.lo) << "whole tasks not largest first";
      }
    }
    for (size_t k = i; k < order.size(); ++k) {
      ASSERT_GE(tasks[order[k]].region, 0) << "a whole task after a chunk task";
      if (k > i) {
        ASSERT_LT(order[k - 1], order[k]) << "chunk tasks out of address order";
      }
    }
  }
  EXPECT_GT(with_whole_after_chunks, 50);  // the random jobs exercise the reordering
}

}  // namespace
}  // namespace ckpt::cuda
