#include "daemon/model_roots.h"

#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>

#include "common/unique_fd.h"

namespace ckpt::daemon {

namespace {
Result<std::string> RealPath(const std::string& path) {
  char* resolved = ::realpath(path.c_str(), nullptr);
  if (resolved == nullptr) {
    if (errno == ENOENT || errno == ENOTDIR) return NotFound("no such file: " + path);
    return ErrnoError("cannot resolve " + path, errno);
  }
  std::string out(resolved);
  std::free(resolved);
  return out;
}

bool HasDotDot(const std::string& path) {
  size_t start = 0;
  while (start <= path.size()) {
    size_t end = path.find('/', start);
    if (end == std::string::npos) end = path.size();
    if (path.compare(start, end - start, "..") == 0 && end - start == 2) return true;
    start = end + 1;
  }
  return false;
}
}  // namespace

Result<std::unique_ptr<ModelRoots>> ModelRoots::Create(const std::vector<std::string>& roots) {
  std::unique_ptr<ModelRoots> out(new ModelRoots());
  for (const std::string& r : roots) {
    if (r.empty()) continue;
    auto real = RealPath(r);
    struct stat st;
    if (!real.ok() || ::stat(real->c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
      return InvalidArgument("model root '" + r + "' is not an existing directory");
    }
    out->roots_.push_back(*real == "/" ? "" : *real);
  }
  return out;
}

Result<std::string> ModelRoots::Check(const std::string& path) const {
  if (path.empty() || path[0] != '/') return InvalidArgument("path must be absolute: '" + path + "'");
  if (HasDotDot(path)) return PermissionDenied("path '" + path + "' has a '..' component; refused");
  CKPT_ASSIGN_OR_RETURN(std::string real, RealPath(path));
  if (roots_.empty()) return real;
  for (const std::string& root : roots_) {
    if (real.compare(0, root.size() + 1, root + "/") != 0) continue;
    // Open again beneath the root without following any symlink: the file realpath named
    // must still be reachable that way (no component swapped for a link meanwhile).
    UniqueFd dir(::open(root.empty() ? "/" : root.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
    if (!dir.valid()) return ErrnoError("cannot open model root " + root, errno);
    open_how how{};
    how.flags = O_RDONLY | O_CLOEXEC;
    how.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;
    const std::string relative = real.substr(root.size() + 1);
    UniqueFd file(static_cast<int>(::syscall(SYS_openat2, dir.get(), relative.c_str(), &how, sizeof(how))));
    if (!file.valid()) {
      // Kernel before 5.6, or a seccomp filter that refuses openat2: realpath's answer stands.
      if (errno == ENOSYS || errno == EPERM) return real;
      return PermissionDenied("'" + path + "' cannot be opened beneath model root " + root + ": " +
                              std::string(std::strerror(errno)));
    }
    return real;
  }
  return PermissionDenied("'" + path + "' (resolved to '" + real + "') is outside the model roots");
}

}  // namespace ckpt::daemon
