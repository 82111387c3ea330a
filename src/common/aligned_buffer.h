// AlignedBuffer: a move-only heap buffer whose start is aligned (for O_DIRECT reads).
#pragma once

#include <cstddef>
#include <cstdlib>
#include <utility>

namespace ckpt {

class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  AlignedBuffer(AlignedBuffer&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  AlignedBuffer& operator=(AlignedBuffer&& o) noexcept {
    if (this != &o) {
      std::free(data_);
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
    }
    return *this;
  }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  ~AlignedBuffer() { std::free(data_); }

  // Makes the buffer at least `size` bytes, `alignment`-aligned (a power of two >= 8).
  // Keeps the current buffer when it is big enough. False if memory is exhausted.
  bool Reserve(size_t size, size_t alignment) {
    if (size <= size_) return true;
    void* p = nullptr;
    if (::posix_memalign(&p, alignment, size) != 0) return false;
    std::free(data_);
    data_ = static_cast<std::byte*>(p);
    size_ = size;
    return true;
  }
  std::byte* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  std::byte* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace ckpt
