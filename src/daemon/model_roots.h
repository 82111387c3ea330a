// ModelRoots: the directories ckptd may load checkpoints from.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "ckpt/status.h"

namespace ckpt::daemon {

class ModelRoots {
 public:
  // Canonicalises each root (realpath); InvalidArgument if one is not an existing
  // directory. An empty list means "no restriction" (any absolute path).
  static Result<std::unique_ptr<ModelRoots>> Create(const std::vector<std::string>& roots);

  // Checks `path` (absolute) and returns its canonical form, to be opened instead of it.
  // PermissionDenied if it has a ".." component, or if it resolves (following
  // symlinks) to a place outside every root; NotFound if it does not exist. The check is
  // repeated with openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS) from the root's
  // directory descriptor, so a symlink swapped in after realpath is refused too.
  Result<std::string> Check(const std::string& path) const;
  bool restricted() const { return !roots_.empty(); }
  const std::vector<std::string>& roots() const { return roots_; }

 private:
  ModelRoots() = default;
  std::vector<std::string> roots_;  // canonical
};

}  // namespace ckpt::daemon
