#include "shm/segment_directory.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace ckpt::shm {

namespace {
std::string Octal(uint32_t mode) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "%04o", mode & 07777);
  return buf;
}

using Create = SegmentDirectoryOptions::Create;

// Makes the directory unless options say it must exist, with no permissions for others
// and no group write whatever the umask; returns whether it was made here. An existing
// one is fine unless options say it must be created.
Result<bool> MakeDirectory(const std::string& path, const std::string& what, const SegmentDirectoryOptions& options) {
  if (options.create == Create::kMustExist) return false;
  if (::mkdir(path.c_str(), 0700) == 0) return true;
  int err = errno;
  // A read-only parent (a sandbox) may answer EROFS for a name that exists.
  struct stat probe;
  if (err != EEXIST && ::lstat(path.c_str(), &probe) == 0) err = EEXIST;
  if (err == EEXIST && options.create == Create::kMustCreate) return AlreadyExists(what + " already exists");
  if (err != EEXIST) return ErrnoError("cannot create " + what, err);  // EACCES, EROFS: PermissionDenied
  return false;
}

Status NotOurs(const std::string& what, uid_t owner, uid_t euid) {
  return FailedPrecondition(what + " is owned by uid " + std::to_string(owner) + ", not by ckptd's uid " +
                            std::to_string(euid) + "; refusing to use it (another user may have created it)");
}

// Opens the directory at `path` after checking (by lstat, before opening) that it is a
// real directory owned by `euid`, then checks the opened one is that same directory
// and still ours; *st is its fstat. A directory made here is checked like one found.
Result<UniqueFd> OpenOwnDirectory(const std::string& path, const std::string& what,
                                  const SegmentDirectoryOptions& options, uid_t euid, struct stat* st) {
  struct stat lst;
  if (::lstat(path.c_str(), &lst) != 0) {
    if (errno == ENOENT && options.create == Create::kMustExist) return NotFound("no " + what);
    return ErrnoError("lstat of " + what, errno);
  }
  if (S_ISLNK(lst.st_mode)) {
    return FailedPrecondition(what + " is a symbolic link; refusing to use it (remove it; ckptd creates the directory itself)");
  }
  if (!S_ISDIR(lst.st_mode)) {
    return FailedPrecondition(what + " exists and is not a directory; refusing to use it");
  }
  if (lst.st_uid != euid) return NotOurs(what, lst.st_uid, euid);  // refused before it is opened
  // O_DIRECTORY refuses a FIFO swapped in meanwhile before it could block (O_NONBLOCK too).
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  if (!fd.valid()) {
    if (errno == ELOOP || errno == ENOTDIR) return FailedPrecondition(what + " was replaced while it was opened");
    return ErrnoError("opening " + what, errno);
  }
  if (::fstat(fd.get(), st) != 0) return ErrnoError("fstat of " + what, errno);
  if (!S_ISDIR(st->st_mode) || st->st_dev != lst.st_dev || st->st_ino != lst.st_ino) {
    return FailedPrecondition(what + " was replaced while it was opened");
  }
  if (st->st_uid != euid) return NotOurs(what, st->st_uid, euid);
  return fd;
}

// Gives the directory to `group` when it can (segments get the directory's group, which
// *actual_group returns) and sets its mode to kMode; what was changed goes to *notes.
Status FixGroupAndMode(int fd, const struct stat& st, gid_t group, bool created, const std::string& what,
                       gid_t* actual_group, std::string* notes) {
  *actual_group = st.st_gid;
  if (st.st_gid != group) {
    if (::fchown(fd, static_cast<uid_t>(-1), group) != 0) {  // not a member of the group
      *notes += "cannot give " + what + " to gid " + std::to_string(group) + " (" + std::strerror(errno) +
                "), it keeps gid " + std::to_string(st.st_gid) + "; ";
    } else {
      *actual_group = group;
      *notes += "gave " + what + " to gid " + std::to_string(group) + "; ";
    }
  }
  constexpr uint32_t kMode = SegmentDirectory::kMode;
  if ((st.st_mode & 07777) != kMode) {
    // Ours, so nobody else could have created entries through a bad mode unless we let
    // them: group or other write bits found here are removed, and every entry is
    // checked for owner and mode at adoption anyway.
    if (::fchmod(fd, kMode) != 0) return ErrnoError("chmod of " + what, errno);
    if (!created) *notes += "changed the mode of " + what + " from " + Octal(st.st_mode) + " to " + Octal(kMode) + "; ";
  }
  return Status::Ok();
}

// Takes the directory's lock (one ckptd per directory) when options ask for it.
Status LockDirectory(int fd, const std::string& what, const SegmentDirectoryOptions& options) {
  if (options.lock && ::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    if (errno == EWOULDBLOCK) {
      return FailedPrecondition(what + " is in use by another ckptd (it holds the directory's lock)");
    }
    return ErrnoError("locking " + what, errno);
  }
  return Status::Ok();
}

}  // namespace

bool IsPlainFileName(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
         name.find('\0') == std::string::npos;
}

Result<std::unique_ptr<SegmentDirectory>> SegmentDirectory::Open(const std::string& path,
                                                                const SegmentDirectoryOptions& options,
                                                                std::string* fixed) {
  const std::string what = "segment directory " + path;
  const uid_t euid = ::geteuid();
  const gid_t group = options.group.value_or(::getegid());
  CKPT_ASSIGN_OR_RETURN(const bool created, MakeDirectory(path, what, options));
  // A directory made here and then refused (a lock held, ...) is removed again.
  struct RemoveIfRefused {
    const std::string& path;
    bool armed;
    ~RemoveIfRefused() {
      if (armed) (void)::rmdir(path.c_str());
    }
  } remove_if_refused{path, created};
  struct stat st;
  CKPT_ASSIGN_OR_RETURN(UniqueFd fd, OpenOwnDirectory(path, what, options, euid, &st));
  std::string notes;
  gid_t actual_group = st.st_gid;
  CKPT_RETURN_IF_ERROR(FixGroupAndMode(fd.get(), st, group, created, what, &actual_group, &notes));
  CKPT_RETURN_IF_ERROR(LockDirectory(fd.get(), what, options));
  if (fixed != nullptr) {
    if (notes.size() >= 2) notes.resize(notes.size() - 2);
    *fixed = notes;
  }
  PageSupport pages = DetectPageSupport(fd.get(), path);
  remove_if_refused.armed = false;
  return std::unique_ptr<SegmentDirectory>(
      new SegmentDirectory(path, std::move(fd), actual_group, std::move(pages), created));
}

Status SegmentDirectory::RemoveIfEmpty() const {
  const std::string what = "segment directory " + path_;
  struct stat mine, now, parent;
  if (::fstat(fd_.get(), &mine) != 0) return ErrnoError("fstat of " + what, errno);
  if (::lstat(path_.c_str(), &now) != 0) {
    if (errno == ENOENT) return Status::Ok();
    return ErrnoError("lstat of " + what, errno);
  }
  if (now.st_dev != mine.st_dev || now.st_ino != mine.st_ino) {
    return FailedPrecondition(what + " is no longer the directory ckptd opened; left alone");
  }
  // The root of a file system mounted for the daemon (a device of its own) stays.
  if (::fstatat(fd_.get(), "..", &parent, 0) != 0) return ErrnoError("stat of the parent of " + what, errno);
  if (parent.st_dev != mine.st_dev) return FailedPrecondition(what + " is a mount point; left in place");
  if (::rmdir(path_.c_str()) == 0 || errno == ENOENT) return Status::Ok();
  if (errno == ENOTEMPTY || errno == EEXIST) return FailedPrecondition(what + " is not empty; left in place");
  return ErrnoError("removing " + what, errno);
}

Result<UniqueFd> SegmentDirectory::Create(const std::string& name, uint64_t size, uint32_t mode,
                                          Reserve reserve) const {
  if (!IsPlainFileName(name)) return InvalidArgument("not a plain segment file name: '" + name + "'");
  if (size == 0) return InvalidArgument("a segment needs at least one byte");
  if (size > static_cast<uint64_t>(INT64_MAX)) return InvalidArgument("segment size too large");
  const std::string what = PathOf(name);
  UniqueFd fd(::openat(fd_.get(), name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (!fd.valid()) {
    if (errno == EEXIST) return AlreadyExists("creating segment " + what + ": already exists");
    return ErrnoError("creating segment " + what, errno);
  }
  // Remove the file again unless everything below succeeds.
  struct Remover {
    const SegmentDirectory* dir;
    const std::string& name;
    bool armed = true;
    ~Remover() {
      if (armed) (void)dir->Remove(name);
    }
  } remover{this, name};
  if (::fchown(fd.get(), static_cast<uid_t>(-1), group_) != 0) {
    return ErrnoError("giving segment " + what + " to gid " + std::to_string(group_), errno);
  }
  if (::fchmod(fd.get(), mode & 07777) != 0) return ErrnoError("chmod of segment " + what, errno);
  // The size first: a tmpfs with huge=within_size gives huge pages only inside i_size.
  if (::ftruncate(fd.get(), static_cast<off_t>(size)) != 0) {
    if (errno == EFBIG || errno == ENOSPC) {
      return ResourceExhausted("not enough room in " + path_ + " for " + std::to_string(size) + " bytes");
    }
    return ErrnoError("sizing segment " + what + " to " + std::to_string(size) + " bytes", errno);
  }
  if (reserve == Reserve::kSizeOnly) {
    remover.armed = false;
    return fd;
  }
  CKPT_RETURN_IF_ERROR(ReservePages(fd.get(), size, name));
  remover.armed = false;
  return fd;
}

Status SegmentDirectory::ReservePages(int fd, uint64_t size, const std::string& name, uint64_t offset) const {
  if (size > static_cast<uint64_t>(INT64_MAX) || offset > static_cast<uint64_t>(INT64_MAX) - size) {
    return InvalidArgument("segment size too large");
  }
  if (int err = ::posix_fallocate(fd, static_cast<off_t>(offset), static_cast<off_t>(size)); err != 0) {
    if (err == ENOSPC) {
      return ResourceExhausted("not enough room in " + path_ + " for " + std::to_string(size) + " bytes");
    }
    if (err == ENOMEM) {  // a memory cgroup limit, or the host is out of memory
      return ResourceExhausted("out of memory reserving " + std::to_string(size) + " bytes for segment " +
                               PathOf(name));
    }
    return ErrnoError("reserving " + std::to_string(size) + " bytes for segment " + PathOf(name), err);
  }
  return Status::Ok();
}

Result<UniqueFd> SegmentDirectory::OpenOwned(const std::string& name, uint32_t mode, uint64_t min_size,
                                             struct stat* st_out) const {
  if (!IsPlainFileName(name)) return InvalidArgument("not a plain segment file name: '" + name + "'");
  const std::string what = PathOf(name);
  UniqueFd fd(::openat(fd_.get(), name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  if (!fd.valid()) {
    if (errno == ENOENT) return NotFound("no segment " + what);
    if (errno == ELOOP) return FailedPrecondition(what + " is a symbolic link");
    return ErrnoError("opening segment " + what, errno);
  }
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return ErrnoError("fstat of segment " + what, errno);
  if (st_out != nullptr) *st_out = st;
  if (!S_ISREG(st.st_mode)) return FailedPrecondition(what + " is not a regular file");
  if (st.st_uid != ::geteuid()) {
    return FailedPrecondition(what + " is owned by uid " + std::to_string(st.st_uid) + ", not ckptd's uid " +
                              std::to_string(::geteuid()));
  }
  if ((st.st_mode & 07777) != (mode & 07777)) {
    return FailedPrecondition(what + " has mode " + Octal(st.st_mode) + ", not the segment mode " + Octal(mode));
  }
  if (st.st_nlink != 1) {
    return FailedPrecondition(what + " has " + std::to_string(st.st_nlink) + " links, not 1");
  }
  if (st.st_size < 0 || static_cast<uint64_t>(st.st_size) < min_size) {
    return FailedPrecondition(what + " is " + std::to_string(st.st_size) + " bytes, smaller than " +
                              std::to_string(min_size));
  }
  return fd;
}

Status SegmentDirectory::Remove(const std::string& name) const {
  if (!IsPlainFileName(name)) return InvalidArgument("not a plain segment file name: '" + name + "'");
  if (::unlinkat(fd_.get(), name.c_str(), 0) == 0 || errno == ENOENT) return Status::Ok();
  if (errno == EISDIR || errno == EPERM) {
    // A directory (Linux says EISDIR; POSIX allows EPERM): only an empty one goes.
    if (::unlinkat(fd_.get(), name.c_str(), AT_REMOVEDIR) == 0 || errno == ENOENT) return Status::Ok();
  }
  return ErrnoError("removing segment " + PathOf(name), errno);
}

Result<std::vector<DirectoryEntry>> SegmentDirectory::List() const {
  // A description of its own: a dup would share (and move) the offset of fd_.
  int dfd = ::openat(fd_.get(), ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) return ErrnoError("listing " + path_, errno);
  DIR* dir = ::fdopendir(dfd);
  if (dir == nullptr) {
    const int err = errno;
    ::close(dfd);
    return ErrnoError("listing " + path_, err);
  }
  std::vector<DirectoryEntry> out;
  errno = 0;
  while (struct dirent* e = ::readdir(dir)) {
    const std::string name = e->d_name;
    if (name != "." && name != "..") out.push_back(DirectoryEntry{name, e->d_type});
    errno = 0;
  }
  const int err = errno;
  ::closedir(dir);
  if (err != 0) return ErrnoError("listing " + path_, err);
  return out;
}

}  // namespace ckpt::shm
