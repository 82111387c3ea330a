// The copy engine: moves pieces of tensors from host memory (the read-only shared-memory
// mapping) into device memory over one host path (ckpt::HostPath), with dtype conversion
// and transposes on the GPU. GpuLoaderImpl plans what goes where; this runs it.
//
// Work is cut into tasks of at most ChunkBytes(options) of one piece (a
// transposed piece stays one task: it is rearranged on the GPU as a whole), so a large
// tensor is spread over every worker. Each worker thread owns a stream; on the bounce
// path it also owns two pinned buffers of chunk_bytes from one slab, filled by memcpy
// while the other is in flight. Small chunks win there: on an H200 host 16 workers x 2 x
// 1-4 MiB move 41-47 GiB/s against 32-35 GiB/s with 16 MiB (docs/benchmarks.md), because
// the staged bytes are still in the CPU cache when the DMA reads them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ckpt/gpu.h"
#include "ckpt/shard.h"

namespace ckpt::cuda {

// One piece of one output.
struct CopyJob {
  const ShardLayout* layout = nullptr;  // regions read from src, in source-dtype bytes
  const std::byte* src = nullptr;       // the source tensor's first byte (host)
  DType from = DType::kU8, to = DType::kU8;
  bool transpose = false;
  std::byte* out = nullptr;             // the output tensor on the device
  uint64_t piece_first_elem = 0;        // first element of this piece in the untransposed output
  uint64_t out_rows = 0;                // untransposed output rows (for transposes: dst_ld)
  const std::string* name = nullptr;    // the output's name, for errors
  int tag = 0;                          // > 0; reported by CopyResult::overflow_tag
};

struct CopyResult {
  int overflow_tag = 0;  // tag of a job whose conversion produced inf from a finite value; 0: none
};

// The largest single copy (and, on the bounce path, each buffer's size): options.chunk_bytes,
// or where that is 0, 1 MiB on the bounce path and 16 MiB on the others (measured best).
uint64_t ChunkBytes(const GpuLoadOptions& options);

// Runs every job on `device` (the calling thread's device is left as it was); adds its
// setup time to stats->setup_seconds and fills the register/unregister times and the
// registered/copied bytes of `stats`. Errors: those of
// the driver (ResourceExhausted for device or pinned memory, Internal). On return, with
// or without error, nothing is in flight and every registration is undone.
Result<CopyResult> RunCopyJobs(const std::vector<CopyJob>& jobs, int device, const GpuLoadOptions& options,
                               GpuLoadStats* stats);

}  // namespace ckpt::cuda
