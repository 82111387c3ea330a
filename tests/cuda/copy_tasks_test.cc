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

// `rows` rows of `row_bytes` at `src_pitch` in the source, packed in the destination.
CopyRegion PackedRows(uint64_t rows, uint64_t row_bytes, uint64_t src_pitch) {
  CopyRegion c;
  c.rows = rows;
  c.row_bytes = row_bytes;
  c.src_pitch = src_pitch;
  c.dst_pitch = row_bytes;
  return c;
}

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

// Issue 14 (TP=4's copy phase): a row-parallel shard's strided rows are gathered by the
// CPU one row at a time, several times slower per byte than packed bytes; in address
// order every worker meets them at once (all of out_proj, then all of c_fc, ...). With
// TaskMix::kSpread, after the whole-job tasks, the gather tasks are spread among the
// others by bytes: at every point of the order, each kind has had the same share of its
// bytes taken, to within one task, and each kind stays in address order.
TEST(CopyTasksTest, GatherTasksAreSpreadAmongPackedOnesByBytes) {
  std::mt19937_64 rng(17);
  int mixed = 0;
  for (int trial = 0; trial < 300; ++trial) {
    RandomJobs r = MakeJobs(rng, 2 + static_cast<int>(rng() % 12));
    std::vector<Task> tasks = CutIntoTasks(r.jobs, 64 + rng() % 30000);
    for (const Task& t : tasks) {
      if (t.region < 0) continue;
      const CopyRegion& c = r.jobs[t.job].layout->regions[static_cast<size_t>(t.region)];
      ASSERT_EQ(t.bytes, (t.rect.r1 - t.rect.r0) * (t.rect.c1 - t.rect.c0));
      ASSERT_EQ(t.gather, t.rect.r1 - t.rect.r0 > 1 && c.row_bytes != c.src_pitch);
    }
    std::vector<size_t> order = TaskOrder(tasks, TaskMix::kSpread);
    std::vector<size_t> sorted = order;
    std::sort(sorted.begin(), sorted.end());
    for (size_t i = 0; i < sorted.size(); ++i) ASSERT_EQ(sorted[i], i) << "not a permutation";
    // The whole tasks exactly as in the address order.
    std::vector<size_t> plain = TaskOrder(tasks);
    size_t i = 0;
    for (; i < order.size() && tasks[order[i]].region < 0; ++i) ASSERT_EQ(order[i], plain[i]);
    for (size_t k = i; k < order.size(); ++k) ASSERT_GE(tasks[order[k]].region, 0);
    double gather_total = 0, other_total = 0, gather_max = 0, other_max = 0;
    for (size_t k = i; k < order.size(); ++k) {
      const Task& t = tasks[order[k]];
      (t.gather ? gather_total : other_total) += static_cast<double>(t.bytes);
      double& m = t.gather ? gather_max : other_max;
      m = std::max(m, static_cast<double>(t.bytes));
    }
    if (gather_total > 0 && other_total > 0) ++mixed;
    double gather_done = 0, other_done = 0;
    size_t last_gather = SIZE_MAX, last_other = SIZE_MAX;
    for (size_t k = i; k < order.size(); ++k) {
      const Task& t = tasks[order[k]];
      size_t& last = t.gather ? last_gather : last_other;
      if (last != SIZE_MAX) {
        ASSERT_LT(last, order[k]) << "a kind out of address order";
      }
      last = order[k];
      (t.gather ? gather_done : other_done) += static_cast<double>(t.bytes);
      if (gather_total > 0 && other_total > 0) {
        const double g = gather_done / gather_total, o = other_done / other_total;
        ASSERT_LE(g, o + gather_max / gather_total + 1e-9) << "gathers taken ahead of their share";
        ASSERT_LE(o, g + other_max / other_total + 1e-9) << "packed tasks taken ahead of their share";
      }
    }
  }
  EXPECT_GT(mixed, 100);

  // The TP=4 case in small: 8 MiB of packed rows, then 8 MiB of 2.5 KiB rows of a 10 KiB
  // pitch, 2 MiB tasks. Address order: four packed, then four gathers; spread: alternate.
  ShardLayout packed, strided;
  packed.regions.push_back(PackedRows(816, 10240, 10240));   // 4 tasks of 204 rows
  strided.regions.push_back(PackedRows(3276, 2560, 10240));  // 4 tasks of 819 rows
  std::vector<CopyJob> jobs(2);
  jobs[0].layout = &packed;
  jobs[0].src = reinterpret_cast<const std::byte*>(uint64_t{1} << 30);
  jobs[1].layout = &strided;
  jobs[1].src = reinterpret_cast<const std::byte*>(uint64_t{2} << 30);
  std::vector<Task> tasks = CutIntoTasks(jobs, 2 << 20);
  std::string address, spread;
  for (size_t k : TaskOrder(tasks)) address += tasks[k].gather ? 'G' : 'P';
  for (size_t k : TaskOrder(tasks, TaskMix::kSpread)) spread += tasks[k].gather ? 'G' : 'P';
  EXPECT_EQ(address, "PPPPGGGG");
  EXPECT_EQ(spread, "GPGPGPGP");
}

// Issue 14 (full-size copies): on the bounce path the regions copied as they are whose
// destination is packed become span tasks: the destination's bytes in address order cut
// into spans of one chunk, each filled by pieces of any number of regions and jobs.
// Executed as the engine does (pieces gathered one after another into one buffer, the
// buffer copied to the span's place), the spans write exactly those regions' bytes, each
// once, with the right source bytes, and nothing else; a span is shorter than a chunk only
// before a gap; every other region (converted, transposed, strided destination) keeps its
// rectangle or whole-job tasks.
TEST(CopyTasksTest, SpansFillEveryPackedDestinationByteOnceInFullSizeCopies) {
  std::mt19937_64 rng(19);
  int merged = 0, short_spans = 0;
  for (int trial = 0; trial < 200; ++trial) {
    const int njobs = 1 + static_cast<int>(rng() % 10);
    std::vector<ShardLayout> layouts(static_cast<size_t>(njobs));
    std::vector<CopyJob> jobs;
    std::vector<std::byte> src(4 << 20);  // a job reads less than 1 MiB from its src
    for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<std::byte>(rng());
    uint64_t dst = 0, src_at = 0;
    struct Expect {  // a dense region of a job copied as it is: where it lands
      size_t job, region;
      uint64_t dst;
    };
    std::vector<Expect> dense;
    for (size_t j = 0; j < static_cast<size_t>(njobs); ++j) {
      ShardLayout& L = layouts[j];
      CopyJob job;
      job.layout = &L;
      job.src = src.data() + src_at;
      const int kind = static_cast<int>(rng() % 6);  // 0: converted, 1: transposed, else as it is
      job.from = DType::kF32;
      job.to = kind == 0 ? DType::kF16 : DType::kF32;
      job.transpose = kind == 1;
      job.out_offset = dst;
      job.piece_first_elem = rng() % 3 == 0 ? rng() % 50 : 0;
      uint64_t at = 0, src_end = 0;  // bytes of this piece's destination; of its source
      const int nregions = 1 + static_cast<int>(rng() % 3);
      for (int k = 0; k < nregions; ++k) {
        CopyRegion c;
        c.row_bytes = 4 * (1 + rng() % (rng() % 2 ? 60 : 1500));
        c.src_pitch = c.row_bytes + (rng() % 2 ? 0 : 4 * (rng() % 400));
        c.dst_pitch = rng() % 4 == 0 ? c.row_bytes + 4 * (1 + rng() % 100) : c.row_bytes;
        c.rows = rng() % 7 == 0 ? 0 : 1 + rng() % 30;
        c.src_offset = src_end + 4 * (rng() % 100);
        c.dst_offset = at;
        if (c.rows > 0) {
          src_end = c.src_offset + (c.rows - 1) * c.src_pitch + c.row_bytes;
          at += (c.rows - 1) * c.dst_pitch + c.row_bytes;
        }
        const bool is_dense = c.rows == 1 || c.dst_pitch == c.row_bytes;
        if (kind >= 2 && is_dense && c.rows > 0) dense.push_back({j, L.regions.size(), dst + job.piece_first_elem * 4 + c.dst_offset});
        L.regions.push_back(c);
      }
      src_at += src_end + 4 * (rng() % 50);
      if (src_at + (1 << 20) > src.size()) src_at = 0;  // sources may overlap: only read
      jobs.push_back(job);
      dst += job.piece_first_elem * 4 + at;  // (a converted output's bytes: at most these)
      if (rng() % 2) dst += 4 * (1 + rng() % 64);  // a gap between outputs
    }
    const uint64_t total = dst + (1 << 16);
    const uint64_t chunk = 256 + rng() % 20000;
    std::vector<SpanPiece> pieces;
    std::vector<Task> tasks = CutIntoTasks(jobs, chunk, &pieces);
    std::vector<std::byte> out(total, std::byte{0xEE}), want(total, std::byte{0xEE});
    std::vector<int> written(total, 0);
    for (const Expect& e : dense) {
      const CopyRegion& c = layouts[e.job].regions[e.region];
      for (uint64_t row = 0; row < c.rows; ++row)
        for (uint64_t b = 0; b < c.row_bytes; ++b)
          want[e.dst + row * c.row_bytes + b] = jobs[e.job].src[c.src_offset + row * c.src_pitch + b];
    }
    size_t pieces_seen = 0;
    for (const Task& t : tasks) {
      if (t.pieces == 0) {
        // Not a span: never a region the spans take.
        if (t.region >= 0) {
          for (const Expect& e : dense) ASSERT_FALSE(e.job == t.job && e.region == static_cast<size_t>(t.region));
        }
        continue;
      }
      ASSERT_GT(t.bytes, 0u);
      ASSERT_LE(t.bytes, chunk);
      ASSERT_FALSE(t.whole_job());
      ASSERT_LE(t.first_piece + t.pieces, pieces.size());
      pieces_seen += t.pieces;
      if (t.pieces > 1) ++merged;
      std::vector<std::byte> buf(t.bytes);
      uint64_t off = 0, lo = UINT64_MAX, hi = 0;
      bool gather = false;
      for (size_t k = 0; k < t.pieces; ++k) {
        const SpanPiece& p = pieces[t.first_piece + k];
        ASSERT_LT(p.begin, p.end);
        ASSERT_LE(off + (p.end - p.begin), t.bytes);
        GatherPiece(jobs[p.job], p, buf.data() + off);
        const PieceSource ps = SourceOf(jobs[p.job], p);
        EXPECT_EQ(p.gather, ps.gather);
        lo = std::min(lo, ps.lo), hi = std::max(hi, ps.hi), gather = gather || ps.gather;
        off += p.end - p.begin;
      }
      ASSERT_EQ(off, t.bytes) << "the pieces do not fill the span";
      EXPECT_EQ(t.lo, lo);
      EXPECT_EQ(t.hi, hi);
      EXPECT_EQ(t.gather, gather);
      for (uint64_t b = 0; b < t.bytes; ++b) {
        out[t.dst + b] = buf[b];
        written[t.dst + b]++;
      }
    }
    ASSERT_EQ(pieces_seen, pieces.size());
    for (uint64_t b = 0; b < total; ++b) {
      ASSERT_LE(written[b], 1) << "byte " << b << " written twice";
      ASSERT_EQ(out[b], want[b]) << "trial " << trial << ", destination byte " << b;
    }
    // Full size: a span shorter than a chunk ends before a byte no span writes.
    for (const Task& t : tasks) {
      if (t.pieces == 0 || t.bytes == chunk) continue;
      ++short_spans;
      EXPECT_EQ(written[t.dst + t.bytes], 0) << "a short span not ended by a gap";
    }
  }
  EXPECT_GT(merged, 100);  // spans that join several regions or jobs
  EXPECT_GT(short_spans, 50);

  // Without `spans`, no span task.
  std::vector<CopyJob> none;
  EXPECT_TRUE(CutIntoTasks(none, 1024, nullptr).empty());
}

// GPT-Neo at TP=4 in small: a layer norm (10 KiB), a column-parallel shard of whole rows
// (6.25 MiB) and a row-parallel shard of strided rows (6.25 MiB), one after another in
// the destination: 2 MiB tasks cut per region leave their tails (and the layer norm)
// as copies of their own; spans cut the 12.51 MiB into 2 MiB copies and one tail.
TEST(CopyTasksTest, SpansCutAGptNeoLayerIntoFullSizeCopies) {
  ShardLayout norm, column, row;
  norm.regions.push_back(PackedRows(1, 10240, 10240));
  column.regions.push_back(PackedRows(640, 10240, 10240));
  row.regions.push_back(PackedRows(2560, 2560, 10240));
  std::vector<CopyJob> jobs(3);
  const ShardLayout* layouts[] = {&norm, &column, &row};
  uint64_t dst = 0;
  for (size_t j = 0; j < 3; ++j) {
    jobs[j].layout = layouts[j];
    jobs[j].src = reinterpret_cast<const std::byte*>((j + 1) << 30);
    jobs[j].from = jobs[j].to = DType::kF32;
    jobs[j].out_offset = dst;
    dst += layouts[j]->regions[0].rows * layouts[j]->regions[0].row_bytes;
  }
  const uint64_t chunk = 2 << 20;
  EXPECT_EQ(CutIntoTasks(jobs, chunk).size(), 1u + 4u + 4u);
  std::vector<SpanPiece> pieces;
  std::vector<Task> tasks = CutIntoTasks(jobs, chunk, &pieces);
  ASSERT_EQ(tasks.size(), (dst + chunk - 1) / chunk);
  for (size_t k = 0; k + 1 < tasks.size(); ++k) EXPECT_EQ(tasks[k].bytes, chunk);
}

}  // namespace
}  // namespace ckpt::cuda
