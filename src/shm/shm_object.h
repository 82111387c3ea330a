// Mappings of shared-memory segments (regular files on the shm tmpfs, created and opened
// through a SegmentDirectory or received as descriptors over the daemon's socket).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "ckpt/status.h"

namespace ckpt::shm {

// A mapping of a whole segment. Move-only; unmaps on destruction.
class ShmMapping {
 public:
  // The alignment of mappings of at least this size (one x86-64 PMD entry).
  static constexpr uint64_t kHugeAlignment = 2ull << 20;

  // Maps the whole file open at `fd`, read-write (MAP_SHARED, PROT_READ|PROT_WRITE; the
  // descriptor must be open for writing) or read-only. `name` is for messages only. The
  // descriptor may be closed afterwards. A file of at least 2 MiB is mapped at a 2 MiB-
  // aligned address, so that the kernel can map a segment on huge pages with PMD entries
  // (hugetlbfs files: where the kernel puts them). Corrupt if the file is empty, IoError
  // if it cannot be sized or mapped.
  static Result<std::unique_ptr<ShmMapping>> MapFd(int fd, const std::string& name, bool writable);
  // MapFd(fd, name, /*writable=*/false): a descriptor the daemon passed over the socket.
  static Result<std::unique_ptr<ShmMapping>> FromFd(int fd, const std::string& name) {
    return MapFd(fd, name, /*writable=*/false);
  }

  ~ShmMapping();
  ShmMapping(const ShmMapping&) = delete;
  ShmMapping& operator=(const ShmMapping&) = delete;

  const std::string& name() const { return name_; }
  std::byte* data() const { return data_; }
  uint64_t size() const { return size_; }
  bool writable() const { return writable_; }

 private:
  ShmMapping(std::string name, std::byte* data, uint64_t size, bool writable)
      : name_(std::move(name)), data_(data), size_(size), writable_(writable) {}
  std::string name_;
  std::byte* data_;
  uint64_t size_;
  bool writable_;
};

}  // namespace ckpt::shm
