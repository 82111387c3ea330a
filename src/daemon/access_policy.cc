#include "daemon/access_policy.h"

#include <grp.h>
#include <pwd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <vector>

namespace ckpt::daemon {

Result<PeerCredentials> PeerOf(int fd) {
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) return ErrnoError("SO_PEERCRED", errno);
  return PeerCredentials{static_cast<int32_t>(cred.pid), static_cast<uint32_t>(cred.uid),
                         static_cast<uint32_t>(cred.gid)};
}

Result<std::optional<gid_t>> ResolveGroup(const std::string& name) {
  if (name.empty()) return std::optional<gid_t>();
  std::vector<char> buf(16384);
  group gr{};
  group* found = nullptr;
  int rc = ::getgrnam_r(name.c_str(), &gr, buf.data(), buf.size(), &found);
  if (rc != 0 || found == nullptr) return NotFound("no group named '" + name + "'");
  return std::optional<gid_t>(gr.gr_gid);
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
