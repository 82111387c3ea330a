#include "shm/shm_object.h"

#include <sys/mman.h>
#include <sys/stat.h>

#include <cerrno>

namespace ckpt::shm {

Result<std::unique_ptr<ShmMapping>> ShmMapping::MapFd(int fd, const std::string& name, bool writable) {
  struct stat st;
  if (::fstat(fd, &st) != 0) return ErrnoError("fstat of segment " + name, errno);
  if (st.st_size <= 0) return Corrupt("segment " + name + " is empty");
  const int prot = writable ? PROT_READ | PROT_WRITE : PROT_READ;
  void* p = ::mmap(nullptr, static_cast<size_t>(st.st_size), prot, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return ErrnoError("mmap of segment " + name, errno);
  return std::unique_ptr<ShmMapping>(
      new ShmMapping(name, static_cast<std::byte*>(p), static_cast<uint64_t>(st.st_size), writable));
}

ShmMapping::~ShmMapping() {
  if (data_ != nullptr) ::munmap(data_, size_);
}

}  // namespace ckpt::shm
