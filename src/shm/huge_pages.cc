#include "shm/huge_pages.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <vector>

#include "common/thread_pool.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14
#endif

namespace ckpt::shm {
namespace {

std::string ReadFirstLine(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

// The bracketed choice of a sysfs selector: "always [never] deny" -> "never".
std::string Selected(const std::string& line) {
  const size_t open = line.find('[');
  const size_t close = line.find(']', open);
  if (open == std::string::npos || close == std::string::npos) return "";
  return line.substr(open + 1, close - open - 1);
}

struct MountLine {
  bool found = false;
  std::string fs_type;
  std::string super_options;
};

// The mountinfo line of the mount `mnt_id` (if >= 0), else the first with device `dev`
// (the last one wins: a later mount over the same point hides the earlier).
MountLine FindMount(const std::string& mountinfo, int64_t mnt_id, dev_t dev) {
  std::ifstream in(mountinfo);
  MountLine out;
  for (std::string line; std::getline(in, line);) {
    std::istringstream ss(line);
    int64_t id = -1, parent = -1;
    std::string majmin;
    if (!(ss >> id >> parent >> majmin)) continue;
    bool match = false;
    if (mnt_id >= 0) {
      match = id == mnt_id;
    } else {
      unsigned maj = 0, min = 0;
      match = std::sscanf(majmin.c_str(), "%u:%u", &maj, &min) == 2 && makedev(maj, min) == dev;
    }
    if (!match) continue;
    const size_t dash = line.find(" - ");
    if (dash == std::string::npos) continue;
    std::istringstream rest(line.substr(dash + 3));
    MountLine m;
    std::string source;
    rest >> m.fs_type >> source >> m.super_options;
    m.found = true;
    out = m;
    if (mnt_id >= 0) break;
  }
  return out;
}

std::string OptionValue(const std::string& options, const std::string& key) {
  std::stringstream ss(options);
  for (std::string item; std::getline(ss, item, ',');) {
    if (item.rfind(key + "=", 0) == 0) return item.substr(key.size() + 1);
  }
  return "";
}

}  // namespace

std::string PageSizeName(uint64_t bytes) {
  if (bytes >= (1ull << 30) && bytes % (1ull << 30) == 0) return std::to_string(bytes >> 30) + " GiB";
  if (bytes >= (1ull << 20) && bytes % (1ull << 20) == 0) return std::to_string(bytes >> 20) + " MiB";
  if (bytes >= (1ull << 10) && bytes % (1ull << 10) == 0) return std::to_string(bytes >> 10) + " KiB";
  return std::to_string(bytes) + " bytes";
}

std::string PageSupport::Describe() const {
  std::string out = fs_type.empty() ? std::string("unknown file system") : fs_type;
  if (fs_type == "tmpfs") out += " huge=" + mount_huge;
  if (!shmem_enabled.empty() && shmem_enabled != "never" && shmem_enabled != "always" &&
      shmem_enabled != "within_size" && shmem_enabled != "advise") {
    out += " (shmem_enabled=" + shmem_enabled + ")";  // deny/force override every tmpfs
  }
  out += ": " + PageSizeName(segment_alignment()) + " pages";
  if (advise && huge) out += " (madvise)";
  if (!note.empty()) out += " (" + note + ")";
  return out;
}

PageSupport DetectPageSupport(int dir_fd, const std::string& path, const std::string& mountinfo_path,
                              const std::string& thp_dir, bool by_mount_id) {
  PageSupport s;
  struct statfs sfs;
  if (::fstatfs(dir_fd, &sfs) != 0) {
    s.note = "cannot statfs " + path + ": " + std::strerror(errno);
    return s;
  }
  s.fs_bytes = static_cast<uint64_t>(sfs.f_blocks) * static_cast<uint64_t>(sfs.f_bsize);
  int64_t mnt_id = -1;
  dev_t dev = 0;
#ifdef STATX_MNT_ID
  struct statx sx;
  if (by_mount_id && ::statx(dir_fd, "", AT_EMPTY_PATH, STATX_MNT_ID, &sx) == 0 && (sx.stx_mask & STATX_MNT_ID)) {
    mnt_id = static_cast<int64_t>(sx.stx_mnt_id);
  }
#endif
  struct stat st;
  if (::fstat(dir_fd, &st) == 0) dev = st.st_dev;
  const MountLine mount = FindMount(mountinfo_path, mnt_id, dev);
  s.fs_type = mount.found ? mount.fs_type : "";
  if (static_cast<long>(sfs.f_type) == kHugetlbfsMagic) {
    s.fs_type = "hugetlbfs";
    s.huge = s.hugetlb = true;
    s.huge_bytes = static_cast<uint64_t>(sfs.f_bsize);
    return s;
  }
  if (static_cast<long>(sfs.f_type) != kTmpfsMagic) {
    s.note = path + " is not on a tmpfs";
    return s;
  }
  s.fs_type = "tmpfs";
  s.mount_huge = OptionValue(mount.super_options, "huge");
  if (s.mount_huge.empty()) s.mount_huge = "never";
  s.shmem_enabled = Selected(ReadFirstLine(thp_dir + "/shmem_enabled"));
  const std::string pmd = ReadFirstLine(thp_dir + "/hpage_pmd_size");
  s.huge_bytes = pmd.empty() ? 0 : std::strtoull(pmd.c_str(), nullptr, 10);
  if (s.huge_bytes == 0 || s.huge_bytes % kSmallPageBytes != 0) {
    s.huge_bytes = 0;
    s.note = "the kernel offers no transparent huge pages";
    return s;
  }
  if (s.shmem_enabled == "deny") {
    s.note = "shmem_enabled=deny turns huge pages off for every tmpfs";
    return s;
  }
  if (s.shmem_enabled == "force" || s.mount_huge == "always" || s.mount_huge == "within_size") {
    s.huge = true;
    return s;
  }
  if (s.mount_huge == "advise") {
    s.huge = s.advise = true;
    return s;
  }
  s.note = "mount a tmpfs with huge=within_size for 2 MiB pages: docs/operations.md";
  return s;
}

Result<uint64_t> PmdMappedBytes(const void* addr) {
  std::ifstream in("/proc/self/smaps");
  if (!in) return IoError("cannot read /proc/self/smaps");
  const uintptr_t a = reinterpret_cast<uintptr_t>(addr);
  bool inside = false, found = false;
  uint64_t kib = 0;
  for (std::string line; std::getline(in, line);) {
    // A block starts with "start-end perms ..."; field lines start with "Name:".
    const size_t colon = line.find(':');
    const size_t space = line.find(' ');
    const bool header = space != std::string::npos && (colon == std::string::npos || space < colon);
    if (header) {
      if (inside) break;
      unsigned long start = 0, end = 0;
      inside = std::sscanf(line.c_str(), "%lx-%lx", &start, &end) == 2 && start <= a && a < end;
      found = found || inside;
      continue;
    }
    if (!inside) continue;
    unsigned long long v = 0;
    if (std::sscanf(line.c_str(), "ShmemPmdMapped: %llu kB", &v) == 1 ||
        std::sscanf(line.c_str(), "FilePmdMapped: %llu kB", &v) == 1 ||
        std::sscanf(line.c_str(), "Shared_Hugetlb: %llu kB", &v) == 1 ||
        std::sscanf(line.c_str(), "Private_Hugetlb: %llu kB", &v) == 1) {
      kib += v;
    }
  }
  if (!found) return NotFound("no mapping holds the given address in /proc/self/smaps");
  return kib * 1024;
}

Status PopulateWrite(std::byte* p, uint64_t n, int threads, uint64_t align, const std::string& what) {
  if (n == 0) return Status::Ok();
  align = std::max<uint64_t>(align, kSmallPageBytes);
  threads = std::max(1, threads);
  // Slices of whole `align` units, at least 64 MiB each (fewer threads for small files).
  const uint64_t min_slice = std::max<uint64_t>(64ull << 20, align);
  uint64_t slice = (n + threads - 1) / threads;
  slice = std::max(min_slice, (slice + align - 1) / align * align);
  const uint64_t count = (n + slice - 1) / slice;
  std::vector<int> errors(count, 0);
  auto work = [&](uint64_t k) {
    const uint64_t off = k * slice;
    const uint64_t len = std::min(slice, n - off);
    for (int tries = 0; tries < 100; ++tries) {
      if (::madvise(p + off, len, MADV_POPULATE_WRITE) == 0) return;
      if (errno != EINTR && errno != EAGAIN) break;
    }
    errors[k] = errno;
  };
  ParallelFor(count, work);  // an item no thread can be had for: this thread does it
  for (int err : errors) {
    if (err == 0) continue;
    if (err == EINVAL) return Unsupported("the kernel has no MADV_POPULATE_WRITE (Linux 5.14)");
    if (err == EFAULT || err == ENOSPC) {
      return ResourceExhausted("not enough room for " + std::to_string(n) + " bytes of " + what +
                               " (the file system is full)");
    }
    if (err == ENOMEM) return ResourceExhausted("out of memory populating " + what);
    return ErrnoError("populating " + what, err);
  }
  return Status::Ok();
}

}  // namespace ckpt::shm
