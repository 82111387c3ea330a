#include "loader/read_op.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/io.h"

namespace ckpt::loader {
namespace {

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14; older kernels answer EINVAL, which is harmless
#endif

uint64_t AlignDown(uint64_t v, uint64_t a) { return v / a * a; }

// PopulateForWrite for an op that must populate: EINVAL (old kernel) is no error (the
// read takes the faults and the segment's Populate() falls back); the rest are.
Status PopulateDestination(const ReadOp& op, const SourceFile& file) {
  const int err = PopulateForWrite(op.dst, op.length);
  if (err == 0 || err == EINVAL) return Status::Ok();
  if (err == EFAULT || err == ENOMEM || err == ENOSPC) {
    return ResourceExhausted("no room in shared memory for the bytes of " + file.path + " at offset " +
                             std::to_string(op.offset) + (err == ENOMEM ? " (out of memory)" : " (file system full)"));
  }
  return ErrnoError("populating the segment for " + file.path, err);
}
uint64_t AlignUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

// Fraction of the file's pages in the page cache, or 0 if it cannot be told.
double CachedFraction(int fd, uint64_t size) {
  if (size == 0) return 0;
  void* p = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return 0;
  const long page = ::sysconf(_SC_PAGESIZE);
  std::vector<unsigned char> resident((size + page - 1) / page);
  double fraction = 0;
  if (::mincore(p, size, resident.data()) == 0) {
    size_t in_cache = 0;
    for (unsigned char r : resident) in_cache += r & 1;
    fraction = static_cast<double>(in_cache) / resident.size();
  }
  ::munmap(p, size);
  return fraction;
}

}  // namespace

// See read_op.h.
int PopulateForWrite(std::byte* p, uint64_t n) {
  static const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  const uint64_t begin = AlignDown(reinterpret_cast<uintptr_t>(p), page);
  const uint64_t end = reinterpret_cast<uintptr_t>(p) + n;
  for (int tries = 0; tries < 100; ++tries) {
    if (::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_POPULATE_WRITE) == 0) return 0;
    if (errno != EINTR && errno != EAGAIN) break;
  }
  return errno;
}

Result<SourceFile> OpenSourceFile(const std::string& path, DirectIo direct) {
  CKPT_ASSIGN_OR_RETURN(auto opened, OpenFileNoFollow(path));
  return OpenSourceFile(opened, direct);
}

Result<SourceFile> OpenSourceFile(const std::shared_ptr<const OpenedFile>& opened, DirectIo direct) {
  SourceFile f;
  f.path = opened->path;
  f.opened = opened;
  f.size = opened->identity.size;
  if (direct == DirectIo::kNever) {
    f.buffered_reason = "O_DIRECT off";
    return f;
  }
  if (direct == DirectIo::kAuto && CachedFraction(f.buffered_fd(), f.size) >= 0.5) {
    f.buffered_reason = "file in page cache";
    return f;
  }
  // The same inode with O_DIRECT, reopened through the descriptor's magic link (never the
  // user's path), and checked to be the same file.
  const std::string self = "/proc/self/fd/" + std::to_string(f.buffered_fd());
  auto fd = OpenForRead(self, O_DIRECT | O_NONBLOCK);
  if (!fd.ok()) {
    f.buffered_reason = "file system refuses O_DIRECT (" + fd.status().message() + ")";
    return f;
  }
  auto same = IdentityOf(fd->get(), f.path);
  if (!same.ok() || same->dev != opened->identity.dev || same->ino != opened->identity.ino) {
    f.buffered_reason = "O_DIRECT reopen did not give the same file";
    return f;
  }
  uint32_t mem_align = 4096, offset_align = 4096;  // safe for every block device we know
  struct statx sx;
  if (::statx(fd->get(), "", AT_EMPTY_PATH, STATX_DIOALIGN, &sx) == 0 && (sx.stx_mask & STATX_DIOALIGN)) {
    if (sx.stx_dio_mem_align == 0 || sx.stx_dio_offset_align == 0) {
      f.buffered_reason = "file system does not support O_DIRECT for this file";
      return f;
    }
    mem_align = std::max<uint32_t>(sx.stx_dio_mem_align, 8);
    offset_align = sx.stx_dio_offset_align;
  }
  if (mem_align > kMaxDirectAlignment || offset_align > kMaxDirectAlignment ||
      kMaxDirectAlignment % mem_align != 0 || kMaxDirectAlignment % offset_align != 0) {
    f.buffered_reason = "O_DIRECT alignment " + std::to_string(offset_align) + " not supported";
    return f;
  }
  f.direct = std::move(fd).value();
  f.mem_align = mem_align;
  f.offset_align = offset_align;
  return f;
}

ReadCover CoverOf(const ReadOp& op, const SourceFile& file) {
  if (op.mode != ReadMode::kBounce) return {op.offset, op.length};
  const uint64_t begin = AlignDown(op.offset, file.offset_align);
  return {begin, AlignUp(op.offset + op.length, file.offset_align) - begin};
}

void PlanReads(const SourceFile& file, uint32_t file_index, uint32_t tensor, uint64_t offset,
               uint64_t length, std::byte* dst, uint64_t chunk_bytes, std::vector<ReadOp>* ops) {
  auto add = [&](uint64_t off, uint64_t len, ReadMode mode) {
    ops->push_back(ReadOp{file_index, tensor, off, len, dst + (off - offset), mode});
  };
  const uint64_t end = offset + length;
  if (length == 0) return;
  if (!file.direct.valid()) {
    for (uint64_t off = offset; off < end; off += chunk_bytes) add(off, std::min(chunk_bytes, end - off), ReadMode::kBuffered);
    return;
  }
  // Bounce pieces end on aligned file offsets so that neighbouring covers do not overlap.
  auto add_bounced = [&](uint64_t from, uint64_t to) {
    for (uint64_t off = from; off < to;) {
      const uint64_t piece_end = std::min(to, AlignDown(off, file.offset_align) + chunk_bytes);
      add(off, piece_end - off, ReadMode::kBounce);
      off = piece_end;
    }
  };
  const uint64_t mid_begin = AlignUp(offset, file.offset_align);
  const uint64_t mid_end = AlignDown(end, file.offset_align);
  const bool same_phase = (reinterpret_cast<uintptr_t>(dst) + (mid_begin - offset)) % file.mem_align == 0;
  if (!same_phase || mid_end <= mid_begin) {
    add_bounced(offset, end);
    return;
  }
  if (offset < mid_begin) add_bounced(offset, mid_begin);
  for (uint64_t off = mid_begin; off < mid_end; off += chunk_bytes) {
    add(off, std::min(chunk_bytes, mid_end - off), ReadMode::kDirect);
  }
  if (mid_end < end) add_bounced(mid_end, end);
}

Status FinishRead(const ReadOp& op, const SourceFile& file, std::byte* bounce, uint64_t got) {
  const ReadCover cover = CoverOf(op, file);
  const uint64_t need = op.offset + op.length - cover.offset;
  if (op.populate && got == 0) CKPT_RETURN_IF_ERROR(PopulateDestination(op, file));
  if (op.mode == ReadMode::kBuffered) {
    if (got >= need) return Status::Ok();
    return PreadFull(file.buffered_fd(), op.dst + got, need - got, cover.offset + got, file.path);
  }
  std::byte* base = op.mode == ReadMode::kBounce ? bounce : op.dst;
  bool refused = false;
  while (got < need) {
    const uint64_t off = cover.offset + got;
    const uint64_t len = cover.length - got;
    if (off % file.offset_align != 0 || len % file.offset_align != 0 ||
        reinterpret_cast<uintptr_t>(base + got) % file.mem_align != 0) {
      refused = true;  // a short read left the rest unaligned
      break;
    }
    ssize_t n = ::pread(file.direct.get(), base + got, len, static_cast<off_t>(off));
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EINVAL) {
        refused = true;
        break;
      }
      return ErrnoError("read of " + file.path + " failed", errno);
    }
    if (n == 0) return Corrupt(file.path + " ends early at byte " + std::to_string(off));
    got += static_cast<uint64_t>(n);
  }
  if (refused) {
    // The kernel would not do this read with O_DIRECT: redo the op through the page cache.
    return PreadFull(file.buffered_fd(), op.dst, op.length, op.offset, file.path);
  }
  if (op.mode == ReadMode::kBounce) {
    if (!op.populate && op.length >= (64u << 10)) (void)PopulateForWrite(op.dst, op.length);
    std::memcpy(op.dst, bounce + (op.offset - cover.offset), op.length);
  }
  return Status::Ok();
}

}  // namespace ckpt::loader
