// Loads the tensors a LoadPlan describes into a new shared-memory segment and publishes
// it: parallel reads into the mapping (O_DIRECT where the file system allows it, see
// read_op.h; pread threads or io_uring, see file_reader.h), a checksum per tensor computed
// by the thread that completes the tensor's last read, the plan's CRC-32 checks (zip
// members) computed by the thread that completes each read, then the complete flag. On any
// error or cancellation the segment is removed and nothing is visible.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ckpt/status.h"
#include "ckpt/tensor.h"
#include "format/load_plan.h"
#include "loader/file_reader.h"
#include "loader/read_op.h"
#include "shm/segment_writer.h"

namespace ckpt::loader {

struct LoadOptions {
  int threads = 8;                        // reader threads
  uint64_t chunk_bytes = 16ull << 20;     // largest single read (rounded up to 4096)
  ReadEngine engine = ReadEngine::kPread; // measured faster on our machines: docs/benchmarks.md
  int queue_depth = 4;                    // io_uring: reads in flight per thread
  DirectIo direct_io = DirectIo::kAuto;
  // How the segment's pages are allocated (see shm::PagePopulate). The default, one
  // posix_fallocate before the reads (the reads then fault the reserved pages in, in
  // parallel), measured fastest with 4 KiB and with 2 MiB pages (docs/benchmarks.md,
  // "warmhuge"); kParallel populates all pages up front with `threads` threads; kDeferred
  // populates each read's destination just before the read (pread engine only; io_uring
  // uses kParallel instead) and the holes after the last read.
  shm::PagePopulate populate = shm::PagePopulate::kFallocate;
  // Called from the calling thread about every 100 ms and once at the end with
  // (bytes read, bytes in total). May be empty.
  std::function<void(uint64_t, uint64_t)> progress;
  // Set by another thread to abandon the load (returns kFailedPrecondition "cancelled").
  const std::atomic<bool>* cancel = nullptr;
  // Another engine for the reads (remote sources: remote/http_reader.h), made with the
  // reader options the loader derived (threads, queue_depth, chunk_bytes, cancel); empty:
  // FileReader::Create(engine). Its engine executes the same ops into the same segment.
  std::function<Result<std::unique_ptr<FileReader>>(const ReaderOptions&)> make_reader;
};

struct LoadedSegment {
  std::string file_name;        // in spec.directory
  shm::SegmentId segment_id{};
  UniqueFd fd;                  // read-only descriptor of the segment (see SegmentWriter)
  uint64_t segment_bytes = 0;
  uint64_t data_bytes = 0;  // sum of tensor sizes
  double seconds = 0;
  std::vector<TensorInfo> tensors;  // with checksums
  // How the files were read, for logs: "O_DIRECT, pread x8" or
  // "buffered (file in page cache), pread x8"; several clauses for mixed files.
  std::string io_summary;
  // The segment directory's page size the segment was sized for (4096 or 2 MiB), and the
  // bytes the kernel actually mapped with huge (PMD) entries in the loader's mapping.
  uint64_t page_bytes = 4096;
  uint64_t huge_bytes = 0;
  // How its pages were allocated: "MADV_POPULATE_WRITE x16", "posix_fallocate", ...
  std::string populate_summary;
  // The loader's writable mapping of the (published) segment; dropping the last owner
  // unmaps it, which takes tens of ms per GiB: a caller on a latency path drops it with
  // ReleaseInBackground (common/thread_pool.h).
  std::shared_ptr<void> mapping;
};

// `spec` gives the segment's directory, names, generation and mode; its tensor list, side
// files and metadata are filled from `plan`, which must pass format::ValidatePlan. Bytes
// are read only through the plan's open descriptors (O_DIRECT through the same inode
// reopened), and after the last read every file's identity is checked again (OpenedFile::
// CheckUnchanged): a file that changed meanwhile fails the load with FailedPrecondition
// "file X changed while it was being loaded" and nothing is published. Errors: those of
// the files (IoError, Corrupt if a file is shorter than the plan says or a zip member's
// bytes disagree with its CRC-32, naming the member), of the segment
// (AlreadyExists, ResourceExhausted), InvalidArgument from ValidatePlan, FailedPrecondition
// if cancelled or a file changed.
Result<LoadedSegment> LoadIntoSegment(const format::LoadPlan& plan, shm::SegmentSpec spec,
                                      const LoadOptions& options);

}  // namespace ckpt::loader
