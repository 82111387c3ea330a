// Huge pages for segments: what the segment directory's file system gives (a tmpfs
// mounted with huge=, the kernel's shmem_enabled override, hugetlbfs), how large a
// segment's pages are, what the kernel actually mapped (PMD entries in /proc/self/smaps),
// and a parallel, fallible populate of a fresh shared mapping.
//
// Detection only reads /proc/self/mountinfo, statfs and /sys/kernel/mm/transparent_hugepage;
// it never fails: what cannot be read counts as "4 KiB pages" with the reason in note.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "ckpt/status.h"

namespace ckpt::shm {

inline constexpr uint64_t kSmallPageBytes = 4096;
// statfs f_type of tmpfs and of hugetlbfs.
inline constexpr long kTmpfsMagic = 0x01021994;
inline constexpr long kHugetlbfsMagic = 0x958458f6;

// How a directory's file system backs the pages of files created in it.
struct PageSupport {
  std::string fs_type;        // "tmpfs", "hugetlbfs", or the mountinfo type ("" if unknown)
  std::string mount_huge;     // the tmpfs huge= option ("never" when not given)
  std::string shmem_enabled;  // the selected value of .../transparent_hugepage/shmem_enabled ("" if absent)
  uint64_t huge_bytes = 0;    // the PMD (transparent) or hugetlbfs page size, 0 if none
  uint64_t fs_bytes = 0;      // the file system's size (statfs f_blocks * f_bsize)
  // Whether files here are expected on huge pages (tmpfs huge=always|within_size, or
  // advise with madvise(MADV_HUGEPAGE), or shmem_enabled=force; hugetlbfs) -- what the
  // kernel then gives is measured with PmdMappedBytes.
  bool huge = false;
  bool advise = false;   // huge only after madvise(MADV_HUGEPAGE) on the mapping
  bool hugetlb = false;  // hugetlbfs: every page is huge_bytes, sizes must be multiples
  std::string note;      // why not huge, or what was odd ("" if nothing)

  // The page size segments should be rounded to: huge_bytes when huge, else 4096.
  uint64_t segment_alignment() const { return huge && huge_bytes > 0 ? huge_bytes : kSmallPageBytes; }
  // One line for logs and `ckptctl status`: "tmpfs huge=within_size: 2 MiB pages" or
  // "tmpfs huge=never: 4 KiB pages (mount a tmpfs with huge=within_size ...)".
  std::string Describe() const;
};

// What the file system under the open directory `dir_fd` (named `path` in the note)
// offers. Finds the mount of dir_fd in `mountinfo_path` by its statx mount id (or, when
// !by_mount_id or statx has none, by st_dev: tests with a fake mountinfo).
PageSupport DetectPageSupport(int dir_fd, const std::string& path,
                              const std::string& mountinfo_path = "/proc/self/mountinfo",
                              const std::string& thp_dir = "/sys/kernel/mm/transparent_hugepage",
                              bool by_mount_id = true);

// Bytes of the mapping (VMA) that holds `addr` that are mapped with PMD (huge) entries:
// ShmemPmdMapped + FilePmdMapped of its /proc/self/smaps block (hugetlbfs mappings:
// Shared_Hugetlb + Private_Hugetlb). NotFound if no mapping holds it; IoError if smaps
// cannot be read.
Result<uint64_t> PmdMappedBytes(const void* addr);

// Allocates every page under [p, p + n) of a writable MAP_SHARED mapping and maps it
// (MADV_POPULATE_WRITE), with `threads` threads on disjoint slices aligned to `align`, so
// that later writes cannot fault on a full file system. ResourceExhausted when the file
// system has no room left (the kernel answers EFAULT: a write would raise SIGBUS) or the
// host no memory (ENOMEM), naming `what`; Unsupported when the kernel has no
// MADV_POPULATE_WRITE (EINVAL: before Linux 5.14). p must be page-aligned.
Status PopulateWrite(std::byte* p, uint64_t n, int threads, uint64_t align, const std::string& what);

// "4 KiB", "2 MiB", "1 GiB", or "<n> bytes".
std::string PageSizeName(uint64_t bytes);

}  // namespace ckpt::shm
