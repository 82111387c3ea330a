// SegmentDirectory: the one directory that holds the daemon's segments, a directory on a
// tmpfs owned by the daemon's euid, mode 0750, that nobody else can write. Where it lives
// (a tmpfs of the daemon's own, or /dev/shm/<prefix>.<random> named in the state
// directory) is the daemon's choice (daemon/segment_location.h); this class only opens or
// creates the path it is given. The daemon opens it once (O_DIRECTORY|O_NOFOLLOW, checked
// with lstat and fstat) and does every later operation relative to that descriptor, so
// nothing another user does under /dev/shm (symlinks, renames, squatted names) can make
// it create, open or remove a file elsewhere.
//
// Thread-safe: every method only uses the directory descriptor (openat/unlinkat).
#pragma once

#include <sys/stat.h>
#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ckpt/status.h"
#include "common/unique_fd.h"
#include "shm/huge_pages.h"

namespace ckpt::shm {

// The world-writable shared-memory file system (sticky, mode 1777).
inline constexpr char kShmRoot[] = "/dev/shm";

struct SegmentDirectoryOptions {
  // Group of the directory and of the segments created in it; nullopt: our egid.
  std::optional<gid_t> group;
  // Take an exclusive flock(2) on the directory: a second daemon using the same
  // directory is refused (FailedPrecondition) instead of removing the first's segments.
  bool lock = true;
  // Whether Open may, must or must not create the directory.
  enum class Create { kIfMissing, kMustCreate, kMustExist };
  Create create = Create::kIfMissing;
};

// What List() reports of one entry.
struct DirectoryEntry {
  std::string name;
  unsigned char type = 0;  // d_type (DT_REG, DT_FIFO, DT_LNK, DT_DIR, ..., DT_UNKNOWN)
};

class SegmentDirectory {
 public:
  // The permission bits of the directory.
  static constexpr uint32_t kMode = 0750;

  // Opens `path`, creating it (mode kMode) if it does not exist and options.create
  // allows. Refuses (FailedPrecondition, naming the path and what is wrong) a symlink,
  // something that is not a directory, or a directory owned by another uid -- each seen
  // with lstat before anything is opened, so a planted FIFO, file or link is never
  // opened; a directory of ours with other permission bits is fixed with fchmod (reported
  // in *fixed, if given). Its group is set to options.group when it differs (a failure
  // there is reported in *fixed too, not an error). kMustCreate: AlreadyExists if the name
  // exists (whatever it is); kMustExist: NotFound if it does not. PermissionDenied when
  // it cannot be created for lack of permission (EACCES, EPERM, EROFS); IoError for other
  // failures.
  static Result<std::unique_ptr<SegmentDirectory>> Open(const std::string& path,
                                                        const SegmentDirectoryOptions& options = {},
                                                        std::string* fixed = nullptr);
  ~SegmentDirectory() = default;
  SegmentDirectory(const SegmentDirectory&) = delete;
  SegmentDirectory& operator=(const SegmentDirectory&) = delete;

  const std::string& path() const { return path_; }
  // "<path>/<name>", for messages and tests.
  std::string PathOf(const std::string& name) const { return path_ + "/" + name; }
  // The directory's descriptor (owned by this object).
  int fd() const { return fd_.get(); }
  // Whether Open created the directory (it did not exist before).
  bool created() const { return created_; }

  // Removes the directory itself (rmdir of path()) if it is empty, is still the directory
  // this object opened (same device and inode) and is not a mount point (the root of a
  // tmpfs mounted for the daemon stays). OK when removed or already gone;
  // FailedPrecondition (naming why) when it is not empty, was replaced, or is a mount
  // point; IoError otherwise. The descriptor stays open (and useless for new files).
  Status RemoveIfEmpty() const;

  // How Create() reserves a new file's pages.
  enum class Reserve {
    kFallocate,  // posix_fallocate of the whole file (one thread)
    kSizeOnly,   // only sets the size: the caller populates the pages (PopulateWrite) itself
  };

  // Creates file `name` (O_CREAT|O_EXCL|O_RDWR|O_NOFOLLOW|O_CLOEXEC) of `size` bytes with
  // permission bits `mode` and this directory's group, sets its size, and with kFallocate
  // reserves its pages (posix_fallocate: ResourceExhausted if the tmpfs is too small, so
  // later writes cannot fault). Returns the read-write descriptor; on any error the file
  // is removed again. InvalidArgument for a bad name or size 0; AlreadyExists if the name
  // exists.
  Result<UniqueFd> Create(const std::string& name, uint64_t size, uint32_t mode,
                          Reserve reserve = Reserve::kFallocate) const;

  // Reserves bytes [offset, offset + size) of file `name` open read-write at `fd` (by
  // default the first `size` bytes; posix_fallocate): ResourceExhausted when the file
  // system is full or the memory cgroup refuses (the message names the directory),
  // IoError otherwise.
  Status ReservePages(int fd, uint64_t size, const std::string& name, uint64_t offset = 0) const;

  // What the directory's file system offers for page sizes, detected once by Open().
  const PageSupport& pages() const { return pages_; }

  // Opens `name` read-only (O_RDONLY|O_NOFOLLOW|O_NONBLOCK|O_CLOEXEC: never follows a
  // link, never blocks on a FIFO) and checks with fstat that it is a regular file owned by
  // our euid, with permission bits `mode`, one link, and at least `min_size` bytes.
  // NotFound if absent; FailedPrecondition naming the first check that failed; the stat
  // is returned in *st if given.
  Result<UniqueFd> OpenOwned(const std::string& name, uint32_t mode, uint64_t min_size = 1,
                             struct stat* st = nullptr) const;

  // Unlinks `name` (an empty directory of that name too). OK if it does not exist; the
  // error otherwise (IoError/PermissionDenied naming the file). Mappings stay valid.
  Status Remove(const std::string& name) const;

  // Every entry but "." and "..", in directory order. IoError if it cannot be read.
  Result<std::vector<DirectoryEntry>> List() const;

 private:
  SegmentDirectory(std::string path, UniqueFd fd, gid_t group, PageSupport pages, bool created)
      : path_(std::move(path)), fd_(std::move(fd)), group_(group), pages_(std::move(pages)), created_(created) {}
  std::string path_;
  UniqueFd fd_;
  gid_t group_;
  PageSupport pages_;
  bool created_;
};

// True if `name` is a plain file name: not empty, not "." or "..", no '/', no NUL.
bool IsPlainFileName(const std::string& name);

}  // namespace ckpt::shm
