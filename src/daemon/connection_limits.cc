#include "daemon/connection_limits.h"

#include "daemon/policy.h"

namespace ckpt::daemon {

Status ConnectionLimits::Admit(const PeerCredentials& peer, Role role) {
  if (role == Role::kNone) return NoRoleRefusal(peer);
  std::lock_guard<std::mutex> lock(mu_);
  int& mine = per_uid_[peer.uid];
  auto refuse = [&](Status st) {
    if (mine == 0) per_uid_.erase(peer.uid);
    return st;
  };
  if (mine >= options_.max_per_uid) {
    return refuse(ResourceExhausted("uid " + std::to_string(peer.uid) + " already holds " + std::to_string(mine) +
                                    " connections to ckptd (the per-user limit)"));
  }
  const bool regular = total_ < options_.max_connections;
  const bool reserved = role == Role::kAdmin && mine < options_.admin_reserved &&
                        total_ < options_.max_connections + options_.admin_reserved;
  if (!regular && !reserved) return refuse(ResourceExhausted("too many connections to ckptd"));
  ++mine;
  ++total_;
  return Status::Ok();
}

void ConnectionLimits::Release(uint32_t uid) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = per_uid_.find(uid);
  if (it == per_uid_.end()) return;
  if (--it->second <= 0) per_uid_.erase(it);
  --total_;
}

int ConnectionLimits::total() const {
  std::lock_guard<std::mutex> lock(mu_);
  return total_;
}

}  // namespace ckpt::daemon
