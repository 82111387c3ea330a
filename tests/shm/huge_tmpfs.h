// A private tmpfs mounted for one test (root only): `options` such as
// "huge=within_size,size=64m". Tests skip when it cannot be mounted (not root, no tmpfs)
// or when the kernel gives a file on it no huge page (no shmem THP).
#pragma once

#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "shm/huge_pages.h"

namespace ckpt::testing {

class TmpfsMount {
 public:
  // Creates `dir` (mode 0750) if needed and mounts a tmpfs with `options` there.
  TmpfsMount(const std::string& dir, const std::string& options) : dir_(dir) {
    created_ = ::mkdir(dir.c_str(), 0750) == 0;
    const std::string opts = options + ",mode=0750";
    if (::mount("tmpfs", dir.c_str(), "tmpfs", MS_NOSUID | MS_NODEV, opts.c_str()) == 0) {
      mounted_ = true;
    } else {
      error_ = std::strerror(errno);
    }
  }
  ~TmpfsMount() {
    if (mounted_) ::umount2(dir_.c_str(), MNT_DETACH);  // a daemon may still hold segments
    if (created_) ::rmdir(dir_.c_str());
  }
  TmpfsMount(const TmpfsMount&) = delete;
  TmpfsMount& operator=(const TmpfsMount&) = delete;

  bool mounted() const { return mounted_; }
  const std::string& error() const { return error_; }
  const std::string& dir() const { return dir_; }

  // Whether the kernel maps a 4 MiB file here with PMD entries (shmem THP works).
  bool KernelGivesHugePages() const {
    const std::string probe = dir_ + "/.thp-probe";
    const size_t size = 4u << 20;
    int fd = ::open(probe.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0) return false;
    bool huge = false;
    if (::ftruncate(fd, size) == 0) {
      void* p = ::mmap(nullptr, size + (2u << 20), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      if (p != MAP_FAILED) {
        ::munmap(p, size + (2u << 20));
      }
      // A 2 MiB-aligned mapping, the way ShmMapping maps segments.
      void* r = ::mmap(nullptr, size + (2u << 20), PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (r != MAP_FAILED) {
        const uintptr_t a = (reinterpret_cast<uintptr_t>(r) + (2u << 20) - 1) / (2u << 20) * (2u << 20);
        void* m = ::mmap(reinterpret_cast<void*>(a), size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0);
        if (m != MAP_FAILED) {
          std::memset(m, 1, size);
          auto bytes = shm::PmdMappedBytes(m);
          huge = bytes.ok() && *bytes > 0;
        }
        ::munmap(r, size + (2u << 20));
      }
    }
    ::close(fd);
    ::unlink(probe.c_str());
    return huge;
  }

 private:
  std::string dir_;
  bool created_ = false;
  bool mounted_ = false;
  std::string error_;
};

}  // namespace ckpt::testing
