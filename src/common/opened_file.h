// OpenedFile: a checkpoint file opened once, beneath a directory descriptor, without
// following any symbolic link, and read only through that descriptor. Its identity
// (device, inode, size, mtime, ctime) is taken at open and checked again after reading,
// so a file that was truncated, rewritten, renamed away or swapped for a link while the
// daemon read it is an error instead of wrong bytes.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "ckpt/status.h"
#include "common/unique_fd.h"

namespace ckpt {

// What fstat says about an open file, the part that changes when its content can.
struct FileIdentity {
  uint64_t dev = 0;
  uint64_t ino = 0;
  uint64_t size = 0;
  int64_t mtime_ns = 0;
  int64_t ctime_ns = 0;
  uint32_t mode = 0;  // st_mode (type and permission bits)
  bool SameContent(const FileIdentity& o) const {
    return dev == o.dev && ino == o.ino && size == o.size && mtime_ns == o.mtime_ns && ctime_ns == o.ctime_ns;
  }
};

// fstat(fd) as a FileIdentity; IoError naming `label` on failure.
Result<FileIdentity> IdentityOf(int fd, const std::string& label);
// "a FIFO", "a socket", "a character device", "a block device", "a directory",
// "a symbolic link", "a regular file" or "a special file" for an st_mode.
std::string FileTypeName(uint32_t mode);

// A regular file open for reading. Immutable once made; shared (shared_ptr<const>) by a
// LoadPlan and the loader, which only pread through `fd`. Thread-safe for reads.
struct OpenedFile {
  std::string path;       // for messages and logs; never opened again
  UniqueFd fd;            // O_RDONLY | O_CLOEXEC | O_NONBLOCK (no effect on regular files)
  FileIdentity identity;  // at open
  // Where the file's name is resolved again by CheckUnchanged: `relative` beneath the
  // directory `anchor` (a model root, or the parent folder when no roots are configured).
  // A null anchor (a file made from a bare descriptor) skips that part of the check.
  std::shared_ptr<const UniqueFd> anchor;
  std::string relative;

  // OK if the file still has the identity it had at open and its name beneath `anchor`
  // still leads, without symlinks, to the same inode. Otherwise FailedPrecondition
  // "file <path> changed while it was being loaded (<what>)". Thread-safe.
  Status CheckUnchanged() const;
};

// openat2(dir_fd, relative, flags | O_CLOEXEC | O_NOCTTY) with RESOLVE_BENEATH |
// RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS: `relative` (no leading '/', no "..") may not
// leave dir_fd nor pass through any symlink. On a kernel without openat2 the path is
// walked one component at a time with O_NOFOLLOW, which gives the same guarantees.
// Errors: NotFound; PermissionDenied naming `path_for_errors` for a symlink or an escape;
// IoError (ErrnoError) otherwise.
Result<UniqueFd> OpenBeneath(int dir_fd, const std::string& relative, int flags, const std::string& path_for_errors);

// Opens `relative` beneath `anchor` as a regular file: first with O_PATH (a device or
// FIFO is never opened for I/O), its type checked (FailedPrecondition "<path> is a FIFO,
// not a regular file"), then for reading with O_NONBLOCK, the two checked to be one inode.
// `path` names it in messages. Errors: those of OpenBeneath, FailedPrecondition.
Result<std::shared_ptr<const OpenedFile>> OpenRegularBeneath(const std::shared_ptr<const UniqueFd>& anchor,
                                                             const std::string& relative,
                                                             const std::string& path);

// Wraps an already open descriptor (tests, fuzzing: a memfd). FailedPrecondition if it is
// not a regular file. CheckUnchanged then checks only the descriptor's identity.
Result<std::shared_ptr<const OpenedFile>> OpenedFileFromFd(UniqueFd fd, const std::string& label);

// Where a checkpoint lives once its path has been checked: the folder holding its files
// (the model folder itself, or the folder of the file that was named), open, and the
// named file, open, if a file was named. Members of the folder (a folder's model file,
// shards, side files) are opened beneath `anchor` at dir_relative + "/" + name, never by
// path. Move-only parts are shared so plans can be copied.
struct CheckpointLocation {
  std::string path;                          // as given and checked, for messages
  std::shared_ptr<const UniqueFd> anchor;    // a model root, or the folder's parent
  std::string dir_relative;                  // the folder beneath `anchor` ("." for anchor itself)
  std::shared_ptr<const UniqueFd> dir;       // the folder, O_PATH | O_DIRECTORY
  std::string dir_path;                      // the folder's path, for messages (ends without '/')
  std::shared_ptr<const OpenedFile> file;    // the named file; null when a folder was named

  // Opens `name` (one component, no '/') beneath `dir` as a regular file (see
  // OpenRegularBeneath); its CheckUnchanged resolves it again from `anchor`.
  Result<std::shared_ptr<const OpenedFile>> OpenMember(const std::string& name) const;
};

// Opens `relative` beneath `anchor` (see OpenBeneath) and returns its location: a regular
// file, or a directory. Errors: those of OpenBeneath; FailedPrecondition for a FIFO,
// socket, device (never opened for I/O, never blocks). `path` names it in messages.
Result<CheckpointLocation> LocateBeneath(const std::shared_ptr<const UniqueFd>& anchor, const std::string& relative,
                                         const std::string& path);

// For an absolute `path` when no model roots restrict loads: its parent folder is opened
// (following links there), its last component beneath it without following a link.
// Errors: InvalidArgument if not absolute or ending in "..", then those of LocateBeneath.
Result<CheckpointLocation> LocateUnrestricted(const std::string& path);

// LocateUnrestricted(path), which must name a regular file (FailedPrecondition for a
// directory). For tools and tests that plan a single file by path.
Result<std::shared_ptr<const OpenedFile>> OpenFileNoFollow(const std::string& path);

}  // namespace ckpt
