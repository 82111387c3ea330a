#include "common/opened_file.h"

#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

namespace ckpt {
namespace {

std::vector<std::string> Components(const std::string& relative) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= relative.size()) {
    size_t end = relative.find('/', start);
    if (end == std::string::npos) end = relative.size();
    std::string c = relative.substr(start, end - start);
    if (!c.empty() && c != ".") out.push_back(std::move(c));
    start = end + 1;
  }
  return out;
}

Status OpenError(int err, const std::string& path) {
  switch (err) {
    case ENOENT:
    case ENOTDIR:
      return NotFound("no such file: " + path);
    case ELOOP:
      return PermissionDenied("'" + path + "' is or passes through a symbolic link; refused");
    case EXDEV:
      return PermissionDenied("'" + path + "' leaves its directory; refused");
    default:
      return ErrnoError("cannot open " + path, err);
  }
}

// The same guarantees as openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS) for a path with
// no "..": every component opened with O_NOFOLLOW from the one before.
int WalkNoFollow(int dir_fd, const std::vector<std::string>& parts, int flags) {
  if (parts.empty()) return ::openat(dir_fd, ".", flags | O_NOFOLLOW);
  UniqueFd cur;
  int at = dir_fd;
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    int next = ::openat(at, parts[i].c_str(), O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (next < 0) return -1;
    cur.reset(next);
    at = next;
  }
  return ::openat(at, parts.back().c_str(), flags | O_NOFOLLOW);
}

}  // namespace

std::string FileTypeName(uint32_t mode) {
  if (S_ISREG(mode)) return "a regular file";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISLNK(mode)) return "a symbolic link";
  return "a special file";
}

Result<FileIdentity> IdentityOf(int fd, const std::string& label) {
  struct stat st;
  if (::fstat(fd, &st) != 0) return ErrnoError("cannot stat " + label, errno);
  FileIdentity id;
  id.dev = st.st_dev;
  id.ino = st.st_ino;
  id.size = st.st_size < 0 ? 0 : static_cast<uint64_t>(st.st_size);
  id.mtime_ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  id.ctime_ns = static_cast<int64_t>(st.st_ctim.tv_sec) * 1000000000 + st.st_ctim.tv_nsec;
  id.mode = st.st_mode;
  return id;
}

Result<UniqueFd> OpenBeneath(int dir_fd, const std::string& relative, int flags, const std::string& path) {
  const std::vector<std::string> parts = Components(relative);
  for (const std::string& c : parts) {
    if (c == "..") return PermissionDenied("path '" + path + "' has a '..' component; refused");
  }
  std::string joined;
  for (const std::string& c : parts) joined += (joined.empty() ? "" : "/") + c;
  if (joined.empty()) joined = ".";
  flags |= O_CLOEXEC;
  if ((flags & O_PATH) == 0) flags |= O_NOCTTY;  // openat2 refuses other flags with O_PATH
  open_how how{};
  how.flags = static_cast<uint64_t>(flags);
  how.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;
  int fd;
  do {
    fd = static_cast<int>(::syscall(SYS_openat2, dir_fd, joined.c_str(), &how, sizeof(how)));
  } while (fd < 0 && (errno == EINTR || errno == EAGAIN));
  if (fd < 0 && (errno == ENOSYS || errno == EPERM)) {
    // No openat2 (kernel before 5.6, or a seccomp filter): walk with O_NOFOLLOW.
    do {
      fd = WalkNoFollow(dir_fd, parts, flags);
    } while (fd < 0 && errno == EINTR);
  }
  if (fd < 0) return OpenError(errno, path);
  return UniqueFd(fd);
}

namespace {

// OpenRegularBeneath, opening `relative` beneath `dir` and recording (recheck_anchor,
// recheck_relative) as where CheckUnchanged resolves it again.
Result<std::shared_ptr<const OpenedFile>> OpenRegular(const UniqueFd& dir, const std::string& relative,
                                                      const std::string& path,
                                                      std::shared_ptr<const UniqueFd> recheck_anchor,
                                                      std::string recheck_relative) {
  auto file = std::make_shared<OpenedFile>();
  file->path = path;
  file->anchor = std::move(recheck_anchor);
  file->relative = std::move(recheck_relative);
  // O_PATH first: a FIFO, socket or device is described, never opened for I/O.
  CKPT_ASSIGN_OR_RETURN(UniqueFd probe, OpenBeneath(dir.get(), relative, O_PATH, path));
  CKPT_ASSIGN_OR_RETURN(FileIdentity seen, IdentityOf(probe.get(), path));
  if (!S_ISREG(seen.mode)) return FailedPrecondition(path + " is " + FileTypeName(seen.mode) + ", not a regular file");
  CKPT_ASSIGN_OR_RETURN(file->fd, OpenBeneath(dir.get(), relative, O_RDONLY | O_NONBLOCK, path));
  CKPT_ASSIGN_OR_RETURN(file->identity, IdentityOf(file->fd.get(), path));
  if (file->identity.dev != seen.dev || file->identity.ino != seen.ino || !S_ISREG(file->identity.mode)) {
    return FailedPrecondition("file " + path + " changed while it was being opened");
  }
  return std::shared_ptr<const OpenedFile>(std::move(file));
}

}  // namespace

Result<std::shared_ptr<const OpenedFile>> OpenRegularBeneath(const std::shared_ptr<const UniqueFd>& anchor,
                                                             const std::string& relative, const std::string& path) {
  return OpenRegular(*anchor, relative, path, anchor, relative);
}

Result<std::shared_ptr<const OpenedFile>> OpenedFileFromFd(UniqueFd fd, const std::string& label) {
  auto file = std::make_shared<OpenedFile>();
  file->path = label;
  CKPT_ASSIGN_OR_RETURN(file->identity, IdentityOf(fd.get(), label));
  if (!S_ISREG(file->identity.mode)) {
    return FailedPrecondition(label + " is " + FileTypeName(file->identity.mode) + ", not a regular file");
  }
  file->fd = std::move(fd);
  return std::shared_ptr<const OpenedFile>(std::move(file));
}

Status OpenedFile::CheckUnchanged() const {
  auto changed = [this](const std::string& what) {
    return FailedPrecondition("file " + path + " changed while it was being loaded (" + what + ")");
  };
  auto now = IdentityOf(fd.get(), path);
  if (!now.ok()) return now.status();
  if (now->size != identity.size) {
    return changed("size " + std::to_string(identity.size) + " became " + std::to_string(now->size));
  }
  if (!now->SameContent(identity)) return changed("modified");
  if (!anchor) return Status::Ok();
  auto again = OpenBeneath(anchor->get(), relative, O_PATH, path);
  if (!again.ok()) return changed("its name no longer leads to it: " + again.status().message());
  auto there = IdentityOf(again->get(), path);
  if (!there.ok()) return there.status();
  if (there->dev != identity.dev || there->ino != identity.ino) return changed("replaced by another file");
  return Status::Ok();
}

Result<std::shared_ptr<const OpenedFile>> CheckpointLocation::OpenMember(const std::string& name) const {
  if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..") {
    return InvalidArgument("'" + name + "' is not a file name in " + dir_path);
  }
  const std::string member_path = (dir_path == "/" ? "" : dir_path) + "/" + name;
  // Opened beneath the folder's descriptor; resolved again later from the anchor, so a
  // folder swapped meanwhile is noticed too.
  return OpenRegular(*dir, name, member_path, anchor, dir_relative == "." ? name : dir_relative + "/" + name);
}

Result<CheckpointLocation> LocateBeneath(const std::shared_ptr<const UniqueFd>& anchor, const std::string& relative,
                                         const std::string& path) {
  CKPT_ASSIGN_OR_RETURN(UniqueFd probe, OpenBeneath(anchor->get(), relative, O_PATH, path));
  CKPT_ASSIGN_OR_RETURN(FileIdentity seen, IdentityOf(probe.get(), path));
  CheckpointLocation loc;
  loc.path = path;
  loc.anchor = anchor;
  std::string rel;
  for (const std::string& c : Components(relative)) rel += (rel.empty() ? "" : "/") + c;
  if (rel.empty()) rel = ".";
  std::string trimmed = path;
  while (trimmed.size() > 1 && trimmed.back() == '/') trimmed.pop_back();
  if (S_ISDIR(seen.mode)) {
    loc.dir_relative = rel;
    loc.dir_path = trimmed;
    CKPT_ASSIGN_OR_RETURN(UniqueFd dir, OpenBeneath(anchor->get(), rel, O_PATH | O_DIRECTORY, path));
    loc.dir = std::make_shared<const UniqueFd>(std::move(dir));
    return loc;
  }
  if (!S_ISREG(seen.mode)) return FailedPrecondition(path + " is " + FileTypeName(seen.mode) + ", not a regular file");
  const size_t slash = rel.rfind('/');
  loc.dir_relative = slash == std::string::npos ? "." : rel.substr(0, slash);
  const size_t pslash = trimmed.rfind('/');
  loc.dir_path = pslash == std::string::npos ? "." : (pslash == 0 ? "/" : trimmed.substr(0, pslash));
  CKPT_ASSIGN_OR_RETURN(UniqueFd dir, OpenBeneath(anchor->get(), loc.dir_relative, O_PATH | O_DIRECTORY, path));
  loc.dir = std::make_shared<const UniqueFd>(std::move(dir));
  CKPT_ASSIGN_OR_RETURN(loc.file, OpenRegularBeneath(anchor, rel, path));
  return loc;
}

Result<CheckpointLocation> LocateUnrestricted(const std::string& path) {
  if (path.empty() || path[0] != '/') return InvalidArgument("path must be absolute: '" + path + "'");
  std::string trimmed = path;
  while (trimmed.size() > 1 && trimmed.back() == '/') trimmed.pop_back();
  const size_t slash = trimmed.rfind('/');
  std::string parent = slash == 0 ? "/" : trimmed.substr(0, slash);
  std::string last = trimmed.substr(slash + 1);
  if (last == "..") return InvalidArgument("path '" + path + "' ends in '..'");
  if (last.empty() || last == ".") {  // "/" itself, or ".../."
    last = ".";
  }
  int fd;
  do {
    fd = ::open(parent.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) return OpenError(errno, path);
  auto anchor = std::make_shared<const UniqueFd>(fd);
  return LocateBeneath(anchor, last, path);
}

Result<std::shared_ptr<const OpenedFile>> OpenFileNoFollow(const std::string& path) {
  CKPT_ASSIGN_OR_RETURN(CheckpointLocation loc, LocateUnrestricted(path));
  if (!loc.file) return FailedPrecondition(path + " is a directory, not a regular file");
  return loc.file;
}

}  // namespace ckpt
