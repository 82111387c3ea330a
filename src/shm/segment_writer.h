// SegmentWriter: creates one checkpoint generation's shared-memory segment and publishes
// it. Until Publish() succeeds the segment's state is kLoading and the destructor removes
// the file, so a failed or abandoned load leaves nothing behind (a daemon crash leaves it
// in kLoading, and the next start removes it).
//
// The segment is the file `<checkpoint>.<generation>.<id hex>` in spec.directory, with a
// fresh random 16-byte id (also in the header's segment_id), created with O_EXCL.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <thread>
#include <memory>
#include <string>
#include <vector>

#include "ckpt/status.h"
#include "ckpt/tensor.h"
#include "common/unique_fd.h"
#include "shm/segment_directory.h"
#include "shm/segment_name.h"
#include "shm/shm_object.h"

namespace ckpt::shm {

struct SegmentLayout;  // segment_layout.h

// How a new segment's pages are allocated before anything is written into them (so that
// no write can fault on a full file system, and no client on a hole).
enum class PagePopulate {
  kFallocate,  // posix_fallocate of the whole file in Create() (one thread)
  kParallel,   // MADV_POPULATE_WRITE of the whole file in Create(), populate_threads threads
  kDeferred,   // Create() populates the header pages only; the caller writes the data with
               // its own populate (MADV_POPULATE_WRITE before each write) and calls
               // Populate() before Publish(), which refuses a segment not populated
  kBackground, // Create() populates the header pages only and starts one thread that
               // reserves the rest (posix_fallocate of successive ranges, in file order);
               // the caller writes [0, end) only after WaitReserved(end) returned OK, and
               // Populate() waits for the whole file (the write path, docs/write-path.md)
};

// What a segment for `tensor_count` tensors of `data_bytes` and side files of `side_bytes`
// may take in `directory` at most (header, aligned index, side files, rounding to the
// directory's page size): the budget a load or a write reserves before the segment
// exists. OutOfRange if it overflows.
Result<uint64_t> EstimateSegmentBytes(const SegmentDirectory& directory, uint64_t data_bytes, uint64_t tensor_count,
                                      uint64_t side_bytes);

struct SegmentSpec {
  const SegmentDirectory* directory = nullptr;  // where the segment is created; not owned
  std::string checkpoint_name;  // < 128 bytes, a plain file name component
  std::string source_path;      // truncated to 1023 bytes in the header
  uint64_t generation = 0;              // >= 1
  uint32_t owner_uid = 0;               // recorded in the header with kOwnerRecorded
  bool owner_admin = false;             // kOwnerAdmin
  uint32_t mode = 0640;                 // permission bits of the file
  std::vector<TensorInfo> tensors;      // checksums ignored here; nbytes must be right
  // Empty, or one per tensor: the index of an earlier tensor with the same nbytes whose
  // data this one shares (its index entry gets the same data offset; tied weights), or -1.
  std::vector<int64_t> alias_of;
  // Small files kept with the tensors (name, bytes), stored in the side-file section; at
  // most kMaxSideFiles, names 1..kMaxSideNameBytes bytes, unique, not kMetadataName.
  std::vector<std::pair<std::string, std::string>> side_files;
  // The checkpoint's metadata (safetensors __metadata__); stored as one JSON object in the
  // side-file section when not empty.
  std::map<std::string, std::string> metadata;
  PagePopulate populate = PagePopulate::kFallocate;
  int populate_threads = 1;  // kParallel / Populate(): threads on disjoint slices
};

class SegmentWriter {
 public:
  // Lays out, creates and reserves the segment (spec.populate), and writes its header,
  // index and side files. Every offset and total is computed with checked arithmetic; the
  // size is a multiple of the directory's page size (2 MiB on a huge tmpfs), the mapping
  // 2 MiB-aligned, and madvise(MADV_HUGEPAGE) is applied where the mount says huge=advise.
  // A kernel without MADV_POPULATE_WRITE gets posix_fallocate instead. Errors:
  // InvalidArgument for a bad spec or a layout that overflows 64 bits, AlreadyExists,
  // ResourceExhausted (file system full, no memory), IoError.
  static Result<std::unique_ptr<SegmentWriter>> Create(const SegmentSpec& spec);
  // Stops a background reservation; before Publish(): removes the file (a removal failure
  // is written to stderr).
  ~SegmentWriter();

  // Where tensor i's bytes go (kDataAlignment-aligned, nbytes long).
  std::byte* tensor_data(size_t i) const;
  uint64_t segment_bytes() const { return mapping_->size(); }
  // The file name in spec.directory.
  const std::string& file_name() const { return mapping_->name(); }
  const SegmentId& segment_id() const { return id_; }
  // A read-only descriptor of the same file (opened beside the read-write one, checked to
  // be the same inode): what the daemon keeps and passes to clients. Invalid once taken.
  UniqueFd TakeReadOnlyFd() { return std::move(read_only_fd_); }
  // kDeferred on tmpfs: a read-write descriptor of the segment, open until Publish(); -1
  // otherwise (hugetlbfs has no write()). A caller may pwrite data through it instead of
  // populating and storing through the mapping: tmpfs then allocates each page as its
  // bytes are written, without zero-filling it first or a fault per page; ENOSPC when full.
  int data_fd() const { return deferred_fd_.get(); }

  // Allocates and maps every page of the segment not yet allocated (holes between the
  // tensors of a kDeferred segment), with `threads` threads; a no-op after kFallocate or
  // kParallel; for kBackground, waits for the reserving thread to finish the file.
  // ResourceExhausted when the file system is full; the segment stays unpublished.
  Status Populate(int threads);
  // kDeferred, once every tensor's bytes have been written (each write allocated the pages
  // it touched, as pwrite to data_fd() and stores after MADV_POPULATE_WRITE do): allocates
  // only the pages no tensor's bytes fall in (the padding between tensors, the tail), which
  // Populate() would find among millions of present pages. Other modes: Populate(threads).
  Status PopulateAroundTensors(int threads);

  // kBackground: blocks until bytes [0, end) of the segment are reserved (OK) or the
  // reservation failed (its error: ResourceExhausted when the file system is full, each
  // later call returns it too). Other modes: OK at once. Thread-safe.
  Status WaitReserved(uint64_t end);
  // Bytes reserved so far from the segment's start (the whole segment once done).
  uint64_t reserved_bytes() const { return reserved_.load(std::memory_order_acquire); }
  // The byte offset of tensor i's data in the segment.
  uint64_t tensor_offset(size_t i) const;

  // Bytes of this writer's mapping that the kernel maps with huge (PMD) entries, from
  // /proc/self/smaps; 0 if it cannot be read or the directory offers no huge pages.
  uint64_t HugeMappedBytes() const;
  // How the pages were reserved, for logs: "posix_fallocate", "MADV_POPULATE_WRITE x8", ...
  const std::string& populate_summary() const { return populate_summary_; }

  // Records the checksums (one per tensor, in spec order) and the load time, then marks
  // the segment complete. Afterwards the object outlives this writer. Internal if the
  // segment's pages were not all populated (kDeferred without Populate()).
  Status Publish(const std::vector<uint64_t>& checksums, uint64_t load_nanos);

 private:
  SegmentWriter(const SegmentDirectory* directory, std::unique_ptr<ShmMapping> mapping, UniqueFd read_only_fd,
                SegmentId id)
      : directory_(directory), mapping_(std::move(mapping)), read_only_fd_(std::move(read_only_fd)), id_(id) {}
  // Create's steps after the file exists: reserves the pages as spec.populate says
  // (kBackground: the header pages, then starts the reserving thread, which takes rw_fd),
  // then writes the header, index and side files where `layout` says.
  Status ReservePages(const SegmentSpec& spec, UniqueFd rw_fd, uint64_t data_offset);
  void WriteHeaderAndIndex(const SegmentSpec& spec, const SegmentLayout& layout);
  // kBackground: the reserving thread's body (ranges of `step` bytes from `from`).
  void ReserveInBackground(uint64_t from, uint64_t step);
  const SegmentDirectory* directory_;
  std::unique_ptr<ShmMapping> mapping_;
  UniqueFd rw_fd_;  // kBackground only, until the reservation ends
  UniqueFd deferred_fd_;  // kDeferred only, until Publish (data_fd())
  bool deferred_ = false;  // kDeferred with MADV_POPULATE_WRITE (PopulateAroundTensors)
  std::thread reserver_;
  std::atomic<uint64_t> reserved_{0};
  std::atomic<bool> stop_reserving_{false};
  std::mutex reserve_mu_;
  std::condition_variable reserve_cv_;
  bool reserve_done_ = true;  // guarded by reserve_mu_
  Status reserve_status_;     // guarded by reserve_mu_
  UniqueFd read_only_fd_;
  SegmentId id_;
  bool published_ = false;
  bool populated_ = false;
  std::string populate_summary_;
};

}  // namespace ckpt::shm
