#include "daemon/model_roots.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>

namespace ckpt::daemon {

namespace {

// `path` with "//" and "." components collapsed and no trailing '/'; false if it has a
// ".." component (refused: a lexical check must not be fooled by it).
bool Normalize(const std::string& path, std::string* out) {
  out->clear();
  size_t start = 0;
  while (start <= path.size()) {
    size_t end = path.find('/', start);
    if (end == std::string::npos) end = path.size();
    const std::string c = path.substr(start, end - start);
    if (c == "..") return false;
    if (!c.empty() && c != ".") *out += "/" + c;
    start = end + 1;
  }
  if (out->empty()) *out = "/";
  return true;
}

// `path` beneath `root` (both normalized): true with the rest ("." for the root itself).
bool Beneath(const std::string& path, const std::string& root, std::string* rest) {
  if (root == "/") {
    *rest = path == "/" ? "." : path.substr(1);
    return true;
  }
  if (path == root) {
    *rest = ".";
    return true;
  }
  if (path.size() > root.size() && path.compare(0, root.size(), root) == 0 && path[root.size()] == '/') {
    *rest = path.substr(root.size() + 1);
    return true;
  }
  return false;
}

}  // namespace

Result<std::unique_ptr<ModelRoots>> ModelRoots::Create(const std::vector<std::string>& roots) {
  std::unique_ptr<ModelRoots> out(new ModelRoots());
  for (const std::string& r : roots) {
    if (r.empty()) continue;
    Root root;
    if (r[0] != '/' || !Normalize(r, &root.given)) {
      return InvalidArgument("model root '" + r + "' must be an absolute path without '..'");
    }
    char* real = ::realpath(r.c_str(), nullptr);
    int fd = ::open(r.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (real == nullptr || fd < 0) {
      std::free(real);
      if (fd >= 0) ::close(fd);
      return InvalidArgument("model root '" + r + "' is not an existing directory");
    }
    root.canonical = real;
    std::free(real);
    root.fd = std::make_shared<const UniqueFd>(fd);
    out->roots_.push_back(std::move(root));
  }
  return out;
}

std::vector<std::string> ModelRoots::roots() const {
  std::vector<std::string> out;
  for (const Root& r : roots_) out.push_back(r.given);
  return out;
}

Result<CheckpointLocation> ModelRoots::Open(const std::string& path) const {
  if (path.empty() || path[0] != '/') return InvalidArgument("path must be absolute: '" + path + "'");
  std::string normal;
  if (!Normalize(path, &normal)) return PermissionDenied("path '" + path + "' has a '..' component; refused");
  if (roots_.empty()) return LocateUnrestricted(normal);
  for (const Root& root : roots_) {
    std::string rest;
    if (!Beneath(normal, root.given, &rest) && !Beneath(normal, root.canonical, &rest)) continue;
    auto loc = LocateBeneath(root.fd, rest, path);
    if (!loc.ok() && loc.status().code() == StatusCode::kPermissionDenied) {
      return PermissionDenied(loc.status().message() + " (nothing beneath the model roots is reached through a link)");
    }
    return loc;
  }
  std::string listed;
  for (const Root& root : roots_) listed += (listed.empty() ? "" : ", ") + root.given;
  return PermissionDenied("'" + path + "' is outside the model roots (" + listed +
                          "): ckptd loads only from beneath them; move or link the checkpoint's folder beneath "
                          "one, or add a root (ckptd --model-root, model-root in ckptd.conf)");
}

}  // namespace ckpt::daemon
