#include "shm/shm_object.h"

#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <cstdint>

#include <cerrno>

#include "shm/huge_pages.h"

namespace ckpt::shm {

Result<std::unique_ptr<ShmMapping>> ShmMapping::MapFd(int fd, const std::string& name, bool writable) {
  struct stat st;
  if (::fstat(fd, &st) != 0) return ErrnoError("fstat of segment " + name, errno);
  if (st.st_size <= 0) return Corrupt("segment " + name + " is empty");
  const int prot = writable ? PROT_READ | PROT_WRITE : PROT_READ;
  const size_t size = static_cast<size_t>(st.st_size);
  void* p = MAP_FAILED;
  struct statfs sfs;
  const bool hugetlbfs = ::fstatfs(fd, &sfs) == 0 && static_cast<long>(sfs.f_type) == kHugetlbfsMagic;
  if (size >= kHugeAlignment && !hugetlbfs) {
    // Reserve enough address space for an aligned start, map the file over it there,
    // give back the rest.
    const size_t span = size + kHugeAlignment;
    void* r = ::mmap(nullptr, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (r != MAP_FAILED) {
      const uintptr_t base = reinterpret_cast<uintptr_t>(r);
      const uintptr_t aligned = (base + kHugeAlignment - 1) / kHugeAlignment * kHugeAlignment;
      p = ::mmap(reinterpret_cast<void*>(aligned), size, prot, MAP_SHARED | MAP_FIXED, fd, 0);
      if (p == MAP_FAILED) {
        const int err = errno;
        ::munmap(r, span);
        return ErrnoError("mmap of segment " + name, err);
      }
      if (aligned > base) ::munmap(r, aligned - base);
      const uintptr_t end = aligned + (size + kSmallPageBytes - 1) / kSmallPageBytes * kSmallPageBytes;
      if (base + span > end) ::munmap(reinterpret_cast<void*>(end), base + span - end);
    }
  }
  if (p == MAP_FAILED) p = ::mmap(nullptr, size, prot, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return ErrnoError("mmap of segment " + name, errno);
  return std::unique_ptr<ShmMapping>(
      new ShmMapping(name, static_cast<std::byte*>(p), static_cast<uint64_t>(st.st_size), writable));
}

ShmMapping::~ShmMapping() {
  if (data_ != nullptr) ::munmap(data_, size_);
}

}  // namespace ckpt::shm
