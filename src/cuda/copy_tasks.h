// How the copy engine cuts its jobs into tasks and, on the register path, the pages read
// into registration groups. Pure host code (tested without a GPU).
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "ckpt/dtype.h"
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

// True for a job whose bytes land in its output as they are (no transpose, no conversion).
inline bool CopiedAsItIs(const CopyJob& job) { return !job.transpose && job.from == job.to; }

// Where region r of a job copied as it is lands: its first byte's offset in the run's
// CopyDestination (row k, byte c of the region at + k * r.dst_pitch + c).
inline uint64_t RegionDestination(const CopyJob& job, const CopyRegion& r) {
  return job.out_offset + job.piece_first_elem * DTypeSize(job.from) + r.dst_offset;
}

// Bytes [begin, end) of one region of one job, counted in the region's row-major order
// (row k, byte c is k * row_bytes + c), where the region's destination is dense: they land
// at RegionDestination + begin onward.
struct SpanPiece {
  size_t job = 0;
  size_t region = 0;
  uint64_t begin = 0, end = 0;
  bool gather = false;  // SourceOf(...).gather, kept for the copy's trace
};

// One unit of work: one rectangle of one region of a job; for a transposed job, the whole
// job (every region, then the transpose kernel); or a span (pieces > 0): consecutive bytes
// of the run's destination, filled in order by pieces of any number of regions and jobs,
// one copy to the device.
struct Task {
  size_t job = 0;
  int region = -1;  // -1: the whole job (where pieces is 0)
  Rect rect{};
  uint64_t lo = 0, hi = 0;             // source bytes read: [lo, hi), absolute addresses
  size_t reg_first = 0, reg_last = 0;  // registration groups those bytes lie in (PlanGroups)
  uint64_t bytes = 0;                  // bytes copied (a whole-job task: every region's)
  bool gather = false;                 // several rows that are not packed in the source: on the
                                       // bounce path the CPU copies them one row at a time
  size_t first_piece = 0, pieces = 0;  // a span: SpanPieces [first_piece, first_piece + pieces)
  uint64_t dst = 0;                    // a span: its first byte's offset in the CopyDestination
  bool whole_job() const { return region < 0 && pieces == 0; }
};

// The tasks of `jobs`: a rectangle of at most `chunk` bytes (ForEachRect) for each piece
// of each region of a job that is not transposed, one whole-job task for each transposed
// job with any region; empty regions give none. Sorted by lo.
// With `spans` (the bounce path), the regions of jobs copied as they are (no transpose, no
// conversion) whose destination is dense (one row, or dst_pitch == row_bytes) become span
// tasks instead: their destination bytes in address order, cut into spans of `chunk` bytes
// where they follow each other without a gap (a span ends early only before a gap or at
// the last byte), so that small tensors and the tails of large ones share full-size
// copies (the DMA engine pays a few microseconds per copy: 1 MiB copies reach 86 % of the
// link, 2 MiB 93 %, docs/benchmarks.md). Their pieces are appended to *spans.
std::vector<Task> CutIntoTasks(const std::vector<CopyJob>& jobs, uint64_t chunk,
                               std::vector<SpanPiece>* spans = nullptr);

// The source bytes of piece p: [lo, hi) as absolute addresses, and whether it gathers
// (more than one row, not packed in the source).
struct PieceSource {
  uint64_t lo, hi;
  bool gather;
};
PieceSource SourceOf(const CopyJob& job, const SpanPiece& p);

// Copies piece p's source bytes to `out` (end - begin bytes), row by row where they are
// strided.
void GatherPiece(const CopyJob& job, const SpanPiece& p, std::byte* out);

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
