// The copy engine: moves pieces of tensors from host memory (the read-only shared-memory
// mapping) into device memory over one host path (ckpt::HostPath), with dtype conversion
// and transposes on the GPU. GpuLoaderImpl plans what goes where; this runs it.
//
// Work is cut into tasks of at most ChunkBytes(options) of one piece (a
// transposed piece stays one task: it is rearranged on the GPU as a whole, and runs
// first so that it never forms the tail), so a large tensor is spread over every worker.
// Each worker thread owns a stream; on the bounce path it also owns CurrentCopyKnobs().buffers
// pinned buffers of chunk_bytes from one slab, filled by memcpy while the others are in
// flight. Small chunks win there: on an H200 host 16 workers x 2 x 1-4 MiB move 41-47
// GiB/s against 32-35 GiB/s with 16 MiB (docs/benchmarks.md), because the staged bytes
// are still in the CPU cache when the DMA reads them.
//
// Fixed costs: the workers (their threads, streams, events, overflow flags and the pinned
// slab, allocated on 2 MiB-aligned transparent huge pages) are CopyResources. A loader
// starts them on a background thread when it is created; each worker thread then faults
// in its own part of the slab (every worker at once), makes its stream and events and
// page-locks the part, so that the preparation overlaps the caller's planning and a run
// starts with the workers ready so far (a run starts no thread); the loader keeps them (threads included) for
// every later Load. The outputs' device memory is allocated by the run once its workers
// have started (CopyDestination), so that the allocation overlaps their first gathers.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ckpt/gpu.h"
#include "ckpt/shard.h"

namespace ckpt::cuda {

enum class TaskMix;  // copy_tasks.h

// One piece of one output.
struct CopyJob {
  const ShardLayout* layout = nullptr;  // regions read from src, in source-dtype bytes
  const std::byte* src = nullptr;       // the source tensor's first byte (host)
  DType from = DType::kU8, to = DType::kU8;
  bool transpose = false;
  uint64_t out_offset = 0;              // the output tensor's offset in the run's CopyDestination
  uint64_t piece_first_elem = 0;        // first element of this piece in the untransposed output
  uint64_t out_rows = 0;                // untransposed output rows (for transposes: dst_ld)
  const std::string* name = nullptr;    // the output's name, for errors
  int tag = 0;                          // > 0; reported by CopyResult::overflow_tag
};

struct CopyResult {
  int overflow_tag = 0;  // tag of a job whose conversion produced inf from a finite value; 0: none
};

// The device memory a run's outputs go to: `base` where it is set; else the run calls
// `allocate` (of `bytes`) once on the calling thread: right after handing the run to its
// workers, so that the allocation overlaps their first gathers into the bounce buffers,
// where the device has `bytes` of memory at all (DeviceMemoryBytes), else before. No copy reaches the device
// before it returns; its error ends the run (returned as it is, nothing left in flight).
struct CopyDestination {
  std::byte* base = nullptr;
  std::function<Result<std::byte*>()> allocate;
  uint64_t bytes = 0;
};

// The bounce path's buffer size where options.chunk_bytes is 0.
inline constexpr uint64_t kDefaultBounceChunk = uint64_t{2} << 20;

// The largest single copy (and, on the bounce path, each buffer's size): options.chunk_bytes,
// or where that is 0, kDefaultBounceChunk on the bounce path and 16 MiB on the others
// (measured best).
uint64_t ChunkBytes(const GpuLoadOptions& options);

// The engine's experiment knobs (CKPT_COPY_BUFFERS, _ORDER, _SPANS, _EARLY, _TRACE) are
// declared and read in copy_knobs.h (CurrentCopyKnobs); each run reads them once.

// The device's total memory in bytes (cudaMemGetInfo, asked once per device and
// process); 0 where the driver does not say.
uint64_t DeviceMemoryBytes(int device);

// The reusable copy workers for one (device, options): per worker a thread, a stream,
// its events, its overflow flag on the device and, on the bounce path, its part of one
// pinned slab. Thread-compatible: one run at a time.
class CopyResources;

// Starts the workers for `options` on `device` from a background thread (the caller's
// thread and current device are left alone); never fails: a failed start or preparation
// is retried by the run that uses them, which reports the error. The returned object
// stops and joins its threads when destroyed, then frees everything (synchronising its
// streams).
std::shared_ptr<CopyResources> StartCopyResources(int device, const GpuLoadOptions& options);

// Runs every job on `device` into `dest` (the calling thread's device is left as it was);
// adds the time until its first copy was issued to stats->setup_seconds and fills the
// register/unregister times and the registered/copied bytes of `stats`. `resources`, if not null, must come from
// StartCopyResources with the same device and options; the run uses its workers as
// each becomes ready, and leaves them ready for the next (else resources are made for
// this run and freed before return). Errors: dest.allocate's, as it returned it; those of
// the driver (ResourceExhausted for device or pinned memory, Internal). On return, with
// or without error, nothing is in flight and every registration is undone.
Result<CopyResult> RunCopyJobs(const std::vector<CopyJob>& jobs, const CopyDestination& dest, int device,
                               const GpuLoadOptions& options, GpuLoadStats* stats,
                               CopyResources* resources = nullptr);

}  // namespace ckpt::cuda
