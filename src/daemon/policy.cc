#include "daemon/policy.h"

#include <sys/stat.h>

#include <cstring>

namespace ckpt::daemon {

namespace {
bool LetterOrDigit(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'); }

bool NameChar(char c) { return LetterOrDigit(c) || c == '_' || c == '-' || c == '.'; }
}  // namespace

Status ValidateCheckpointName(const std::string& name) {
  // The first character is a letter or digit: a name is never taken for an option ('-rf')
  // or a hidden file ('.x') by a shell, ckptctl or a script that passes it on.
  if (name.empty() || name.size() > 100 || !LetterOrDigit(name[0])) {
    return InvalidArgument("checkpoint name must be 1 to 100 characters and begin with a letter or digit: '" +
                           name.substr(0, 120) + "'");
  }
  for (char c : name) {
    if (!NameChar(c)) {
      return InvalidArgument("checkpoint name '" + name + "' may hold only letters, digits, '_', '-' and '.'");
    }
  }
  return Status::Ok();
}

Status ValidateAdoptedName(const std::string& name) {
  // Before issue 23 a name could begin with '_' or '-': a segment published then is kept.
  if (!name.empty() && (name[0] == '_' || name[0] == '-')) return ValidateCheckpointName("x" + name.substr(1));
  return ValidateCheckpointName(name);
}

Status ValidateJobName(const std::string& job) {
  bool ok = !job.empty() && job.size() <= 200;
  for (char c : job) ok = ok && (NameChar(c) || c == ':');
  if (!ok) {
    return InvalidArgument("job name must be 1 to 200 characters of letters, digits, '_', '-', '.' and ':': '" +
                           job.substr(0, 220) + "'");
  }
  return Status::Ok();
}

std::string DefaultCheckpointName(const std::string& path) {
  std::string base = path;
  while (!base.empty() && base.back() == '/') base.pop_back();
  struct stat st;
  bool folder = ::stat(base.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
  auto ends_with = [&](const char* suffix) {
    const size_t n = std::strlen(suffix);
    return base.size() >= n && base.compare(base.size() - n, n, suffix) == 0;
  };
  // A model folder's own files (an index, model.safetensors, ...) name the folder.
  if (ends_with(".index.json") || ends_with("/model.safetensors") || ends_with("/pytorch_model.bin")) {
    if (auto slash = base.rfind('/'); slash != std::string::npos && slash > 0) {
      base.resize(slash);
      folder = true;
    }
  }
  if (auto slash = base.rfind('/'); slash != std::string::npos) base = base.substr(slash + 1);
  if (auto dot = base.rfind('.'); !folder && dot != std::string::npos && dot > 0) base = base.substr(0, dot);
  return SanitizedCheckpointName(base);
}

std::string SanitizedCheckpointName(std::string base) {
  for (char& c : base) {
    if (!NameChar(c)) c = '_';
  }
  while (!base.empty() && !LetterOrDigit(base[0])) base.erase(0, 1);
  if (base.size() > 100) base.resize(100);
  return base.empty() ? "checkpoint" : base;
}

Status CheckRole(Role role, Role needed, const PeerCredentials& peer, const std::string& op) {
  if (static_cast<int>(role) >= static_cast<int>(needed)) return Status::Ok();
  return PermissionDenied("'" + op.substr(0, 64) + "' needs the " + RoleName(needed) + " role; uid " +
                          std::to_string(peer.uid) + " is " +
                          (role == Role::kNone     ? "in neither the reader nor the admin group"
                           : role == Role::kWriter ? "only a writer (not root, not in the admin group)"
                           : needed == Role::kWriter
                               ? "only a reader (not root, not in the writer group or the admin group)"
                               : "only a reader (not root, not in the admin group)"));
}

Status NoRoleRefusal(const PeerCredentials& peer) {
  return PermissionDenied("uid " + std::to_string(peer.uid) +
                          " may not use ckptd: it is in neither the reader nor the admin group");
}

}  // namespace ckpt::daemon
