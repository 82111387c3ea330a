#include "daemon/access_policy.h"

#include <grp.h>
#include <pwd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <string>
#include <vector>

namespace ckpt::daemon {

Result<PeerCredentials> PeerOf(int fd) {
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) return ErrnoError("SO_PEERCRED", errno);
  PeerCredentials peer{static_cast<int32_t>(cred.pid), static_cast<uint32_t>(cred.uid),
                       static_cast<uint32_t>(cred.gid), {}};
  // SO_PEERGROUPS: ERANGE says how many bytes it needs (len); the groups can not change
  // (they are the connecting process's at connect time), so the second call fits.
  std::vector<gid_t> groups(64);
  for (int attempt = 0; attempt < 2; ++attempt) {
    socklen_t glen = static_cast<socklen_t>(groups.size() * sizeof(gid_t));
    if (::getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups.data(), &glen) == 0) {
      groups.resize(glen / sizeof(gid_t));
      peer.groups.assign(groups.begin(), groups.end());
      return peer;
    }
    if (errno == ENOPROTOOPT) return peer;  // a kernel before 4.13: primary gid and group db only
    if (errno != ERANGE) return ErrnoError("SO_PEERGROUPS", errno);
    groups.resize(glen / sizeof(gid_t) + 1);
  }
  return IoError("SO_PEERGROUPS: the group list did not fit twice");
}

Result<std::optional<gid_t>> ResolveGroup(const std::string& name) {
  if (name.empty()) return std::optional<gid_t>();
  std::vector<char> buf(16384);
  group gr{};
  group* found = nullptr;
  int rc = ::getgrnam_r(name.c_str(), &gr, buf.data(), buf.size(), &found);
  if (rc == 0 && found != nullptr) return std::optional<gid_t>(gr.gr_gid);
  // No group of that name: all-digit text is a numeric gid (chown's rule), so a daemon
  // whose group database lacks the pods' group (a container image) can still name it.
  if (name.size() <= 10 && name.find_first_not_of("0123456789") == std::string::npos) {
    const unsigned long long gid = std::stoull(name);
    // (gid_t)-1 means "no change" to chown and setgid: never a group.
    if (gid < static_cast<unsigned long long>(static_cast<gid_t>(-1))) return std::optional<gid_t>(static_cast<gid_t>(gid));
    return InvalidArgument("group id '" + name + "' is out of range");
  }
  return NotFound("no group named '" + name + "'");
}

Result<std::unique_ptr<AccessPolicy>> AccessPolicy::Create(const std::string& admin_group,
                                                           const std::string& reader_group,
                                                           const std::string& writer_group) {
  std::unique_ptr<AccessPolicy> policy(new AccessPolicy());
  CKPT_ASSIGN_OR_RETURN(policy->admin_gid_, ResolveGroup(admin_group));
  CKPT_ASSIGN_OR_RETURN(policy->reader_gid_, ResolveGroup(reader_group));
  CKPT_ASSIGN_OR_RETURN(policy->writer_gid_, ResolveGroup(writer_group));
  return policy;
}

bool AccessPolicy::InGroup(const PeerCredentials& peer, gid_t group) const {
  if (peer.gid == group) return true;
  for (uint32_t g : peer.groups) {
    if (g == group) return true;
  }
  std::vector<char> buf(16384);
  passwd pw{};
  passwd* found = nullptr;
  if (::getpwuid_r(peer.uid, &pw, buf.data(), buf.size(), &found) != 0 || found == nullptr) return false;
  int n = 64;
  std::vector<gid_t> groups(static_cast<size_t>(n));
  while (::getgrouplist(pw.pw_name, pw.pw_gid, groups.data(), &n) < 0) {
    if (n <= static_cast<int>(groups.size())) return false;
    groups.resize(static_cast<size_t>(n));
  }
  for (int i = 0; i < n; ++i) {
    if (groups[static_cast<size_t>(i)] == group) return true;
  }
  return false;
}

Role AccessPolicy::RoleOf(const PeerCredentials& peer) const {
  if (peer.uid == 0 || peer.uid == ::geteuid()) return Role::kAdmin;
  if (admin_gid_ && InGroup(peer, *admin_gid_)) return Role::kAdmin;
  if (writer_gid_ && InGroup(peer, *writer_gid_)) return Role::kWriter;
  if (!reader_gid_ || InGroup(peer, *reader_gid_)) return Role::kReader;
  return Role::kNone;
}

const char* RoleName(Role role) {
  switch (role) {
    case Role::kAdmin:
      return "admin";
    case Role::kWriter:
      return "writer";
    case Role::kReader:
      return "reader";
    default:
      return "none";
  }
}

}  // namespace ckpt::daemon
