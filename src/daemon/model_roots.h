// ModelRoots: the directories ckptd may load checkpoints from.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "ckpt/status.h"
#include "common/opened_file.h"

namespace ckpt::daemon {

class ModelRoots {
 public:
  // Opens each root (O_PATH | O_DIRECTORY, following links in the root's own spelling;
  // it is held open for the daemon's life); InvalidArgument if one is not an existing
  // directory. An empty list means "no restriction" (any absolute path).
  static Result<std::unique_ptr<ModelRoots>> Create(const std::vector<std::string>& roots);

  // Opens the checkpoint at `path` (absolute) and returns where it is: the opened file,
  // or the opened folder (see CheckpointLocation). With roots, `path` must lie lexically
  // beneath one (as configured or canonical), and the rest is opened from the root's
  // descriptor with openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS):
  // no component may be a symlink. Without roots the parent folder is opened and the last
  // component is opened beneath it without following a link. Only regular files and
  // directories are accepted; a FIFO, socket or device is refused at once (never opened
  // for I/O, never blocks). Errors: InvalidArgument (not absolute), PermissionDenied
  // (a ".." component, a symlink, outside every root), NotFound, FailedPrecondition
  // (not a regular file or directory).
  Result<CheckpointLocation> Open(const std::string& path) const;
  bool restricted() const { return !roots_.empty(); }
  // The roots as configured.
  std::vector<std::string> roots() const;

 private:
  struct Root {
    std::string given;      // as configured, without a trailing '/'
    std::string canonical;  // realpath of it
    std::shared_ptr<const UniqueFd> fd;
  };
  ModelRoots() = default;
  std::vector<Root> roots_;
};

}  // namespace ckpt::daemon
