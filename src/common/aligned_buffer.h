// AlignedBuffer: a move-only, page-aligned buffer (for O_DIRECT reads) mapped straight
// from the kernel, so that freeing it returns the memory at once (malloc would keep large
// freed blocks in per-thread arenas of a long-running daemon).
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <utility>

namespace ckpt {

class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  AlignedBuffer(AlignedBuffer&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  AlignedBuffer& operator=(AlignedBuffer&& o) noexcept {
    if (this != &o) {
      Release();
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
    }
    return *this;
  }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  ~AlignedBuffer() { Release(); }

  // Makes the buffer at least `size` bytes, `alignment`-aligned (a power of two no larger
  // than the page size). Keeps the current buffer when it is big enough. False if memory
  // is exhausted or the alignment is larger than a page.
  bool Reserve(size_t size, size_t alignment) {
    if (alignment > static_cast<size_t>(::sysconf(_SC_PAGESIZE))) return false;
    if (size <= size_) return true;
    void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return false;
    Release();
    data_ = static_cast<std::byte*>(p);
    size_ = size;
    return true;
  }
  std::byte* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  void Release() {
    if (data_ != nullptr) ::munmap(data_, size_);
    data_ = nullptr;
    size_ = 0;
  }
  std::byte* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace ckpt
