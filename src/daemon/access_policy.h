// AccessPolicy: who may do what over ckptd's socket, from the peer's credentials.
//
//   admin  (load, evict, and everything a reader may do): root, the daemon's own user,
//          and members of the admin group;
//   writer (write: publish generations from processes, and everything a reader may do):
//          admins and members of the writer group (none when it is not configured);
//   reader (attach, list, info, status, metrics): admins and members of the reader
//          group; when no reader group is configured, every user who can connect to the
//          socket (its permission bits are then the only gate).
// Membership counts the peer's primary gid (SO_PEERCRED) and the supplementary groups
// of its uid in the group database (getgrouplist).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ckpt/status.h"

namespace ckpt::daemon {

// The process at the other end of a Unix socket, as the kernel reports it.
struct PeerCredentials {
  int32_t pid = 0;  // 0 if unknown (another pid namespace)
  uint32_t uid = 0;
  uint32_t gid = 0;
  // The peer's supplementary groups as the kernel reports them (SO_PEERGROUPS, taken when
  // it connected, in the daemon's user namespace); empty if the kernel cannot say. A
  // container's groups (a pod's supplementalGroups) that the daemon's group database does
  // not list count through these.
  std::vector<uint32_t> groups;
};

// Ordered: each role may do what the ones below it may.
enum class Role { kNone = 0, kReader = 1, kWriter = 2, kAdmin = 3 };

// The peer of connected socket `fd` (SO_PEERCRED, and SO_PEERGROUPS where the kernel has
// it: Linux 4.13+). IoError if the kernel refuses SO_PEERCRED or fails SO_PEERGROUPS for a
// reason other than not knowing it.
Result<PeerCredentials> PeerOf(int fd);

// The gid of group `name`; nullopt for an empty name. A name that no group has and that is
// all digits is taken as that numeric gid (as chown does; a name wins over digits);
// InvalidArgument for digits at or above (gid_t)-1; NotFound for any other group that does
// not exist. Thread-safe (getgrnam_r).
Result<std::optional<gid_t>> ResolveGroup(const std::string& name);

class AccessPolicy {
 public:
  // Resolves group names (empty: not configured). NotFound for a group that does not exist.
  static Result<std::unique_ptr<AccessPolicy>> Create(const std::string& admin_group,
                                                      const std::string& reader_group,
                                                      const std::string& writer_group = "");
  // The role of `peer`. Thread-safe (reads the group database).
  Role RoleOf(const PeerCredentials& peer) const;
  std::optional<gid_t> reader_gid() const { return reader_gid_; }
  std::optional<gid_t> admin_gid() const { return admin_gid_; }
  std::optional<gid_t> writer_gid() const { return writer_gid_; }

 private:
  AccessPolicy() = default;
  bool InGroup(const PeerCredentials& peer, gid_t group) const;
  std::optional<gid_t> admin_gid_, reader_gid_;
  std::optional<gid_t> writer_gid_;
};

// "admin", "writer", "reader" or "none".
const char* RoleName(Role role);

}  // namespace ckpt::daemon
