// The unit of work of the loader's file readers: one contiguous byte range of one
// checkpoint file, and how it travels into the segment (page cache, O_DIRECT straight
// into the mapping, or O_DIRECT through an aligned bounce buffer).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ckpt/status.h"
#include "common/aligned_buffer.h"
#include "common/opened_file.h"
#include "common/unique_fd.h"

namespace ckpt::loader {

// Whether the loader reads with O_DIRECT.
enum class DirectIo {
  kAuto,    // O_DIRECT unless the file system refuses it or most of the file is cached
  kAlways,  // O_DIRECT unless the file system refuses it
  kNever,   // always through the page cache
};

// Largest O_DIRECT alignment the readers handle; larger requirements mean buffered reads.
inline constexpr uint32_t kMaxDirectAlignment = 4096;

// One open checkpoint file. Move-only (owns its O_DIRECT descriptor).
struct SourceFile {
  std::string path;                          // for messages
  std::shared_ptr<const OpenedFile> opened;  // the plan's descriptor: buffered reads
  UniqueFd direct;              // the same inode reopened with O_DIRECT; invalid when not used
  uint64_t size = 0;
  uint32_t mem_align = 0;       // O_DIRECT buffer alignment (valid with `direct`)
  uint32_t offset_align = 0;    // O_DIRECT file offset and length alignment
  std::string buffered_reason;  // why `direct` is not open ("" when it is)
  int buffered_fd() const { return opened->fd.get(); }
};

// Prepares the opened file for reading. With kAuto or kAlways it also reopens the same
// inode with O_DIRECT, never by the user's path: through /proc/self/fd/N of the plan's
// descriptor, checked to be the same device and inode (no /proc: buffered), and learns
// the alignment (statx STATX_DIOALIGN, else 4096); a file system that refuses O_DIRECT
// leaves `direct` closed and says so in buffered_reason. kAuto also leaves it closed when
// at least half of the file's pages are in the page cache (a buffered read then copies at
// memory speed). The file's size is the one taken at open.
Result<SourceFile> OpenSourceFile(const std::shared_ptr<const OpenedFile>& opened, DirectIo direct);
// OpenSourceFile(OpenFileNoFollow(path), direct), for tests and tools. Errors: NotFound,
// IoError, FailedPrecondition if `path` is not a regular file.
Result<SourceFile> OpenSourceFile(const std::string& path, DirectIo direct);

enum class ReadMode : uint8_t {
  kBuffered,  // pread through the page cache straight into dst
  kDirect,    // O_DIRECT straight into dst: offset, length and dst are aligned
  kBounce,    // O_DIRECT of the aligned cover of the range into a bounce buffer, then memcpy
};

struct ReadOp {
  uint32_t file = 0;    // index into the SourceFile list
  uint32_t tensor = 0;  // caller's tag (the loader counts a tensor's ops with it)
  uint64_t offset = 0;  // file offset of the first wanted byte
  uint64_t length = 0;  // wanted bytes (> 0)
  std::byte* dst = nullptr;
  ReadMode mode = ReadMode::kBuffered;
  // Allocate dst's pages (MADV_POPULATE_WRITE) before the read lands there: a segment
  // created with PagePopulate::kDeferred. A full file system is then ResourceExhausted.
  bool populate = false;
  // With populate: the segment's read-write descriptor (SegmentWriter::data_fd) and dst's
  // offset in it, or -1. A reader that copies from its own buffers may pwrite them there
  // instead of populating dst and storing through it (see data_fd for why and when not).
  int dst_fd = -1;
  uint64_t dst_offset = 0;
};

// The aligned file range an op actually reads: [cover_offset, cover_offset + cover_length).
// For kBuffered and kDirect it is the op's own range.
struct ReadCover {
  uint64_t offset;
  uint64_t length;
};
ReadCover CoverOf(const ReadOp& op, const SourceFile& file);

// Bytes of bounce buffer one kBounce op of at most `chunk_bytes` can need.
inline uint64_t BounceBytes(uint64_t chunk_bytes) { return chunk_bytes + 2 * kMaxDirectAlignment; }

// Appends the ops that read file bytes [offset, offset + length) of `file` (index
// `file_index`) into dst, each op at most `chunk_bytes` long (a multiple of 4096). Without
// O_DIRECT: kBuffered ops. With it: when dst and offset have the same phase modulo the
// buffer alignment, kDirect ops for the aligned middle and kBounce ops for the unaligned
// head and tail; otherwise kBounce ops for everything.
void PlanReads(const SourceFile& file, uint32_t file_index, uint32_t tensor, uint64_t offset,
               uint64_t length, std::byte* dst, uint64_t chunk_bytes, std::vector<ReadOp>* ops);

// Completes `op` after a reader has already placed its first `got` cover bytes (into dst
// for kBuffered/kDirect, into `bounce` for kBounce), with blocking preads; then copies a
// bounce op's bytes into dst. A kDirect/kBounce read that the kernel refuses (EINVAL) is
// redone through the page cache. Corrupt if the file ends before the op's last byte;
// IoError for other failures; ResourceExhausted if op.populate and dst's pages cannot be
// allocated (file system full, no memory). `bounce` must hold BounceBytes(op.length) aligned bytes for
// kBounce ops. Thread-safe for distinct ops.
Status FinishRead(const ReadOp& op, const SourceFile& file, std::byte* bounce, uint64_t got);

// Maps the pages under [p, p + n) writable in one system call (MADV_POPULATE_WRITE) before
// a copy fills them: on a fresh tmpfs mapping markedly cheaper than one page fault per
// 4 KiB inside memcpy. Returns 0 or the errno: EFAULT when the file system is full (the
// write would raise SIGBUS), ENOMEM, EINVAL on kernels before 5.14.
int PopulateForWrite(std::byte* p, uint64_t n);

}  // namespace ckpt::loader
