// ConnectionLimits: who gets a connection slot, decided at accept from the peer's
// credentials before any thread is started. Thread-safe.
//
//   - a caller with no role gets none (PermissionDenied);
//   - each uid holds at most `max_per_uid` connections (ResourceExhausted);
//   - all callers share `max_connections` slots; when they are taken, an admin (root,
//     the daemon's user, the admin group) still gets one of `admin_reserved` more slots,
//     as long as that admin's uid holds fewer than `admin_reserved` connections itself,
//     so no reader (nor a runaway admin script) can lock the operators out.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>

#include "ckpt/status.h"
#include "daemon/access_policy.h"

namespace ckpt::daemon {

class ConnectionLimits {
 public:
  struct Options {
    int max_connections = 1024;
    int max_per_uid = 256;
    int admin_reserved = 8;
  };
  explicit ConnectionLimits(Options options) : options_(options) {}
  ConnectionLimits(const ConnectionLimits&) = delete;
  ConnectionLimits& operator=(const ConnectionLimits&) = delete;

  // Takes a slot for a connection of `peer` with `role`, or says why not (the caller
  // answers that Status in one frame and closes). Each OK must be paired with Release.
  Status Admit(const PeerCredentials& peer, Role role);
  void Release(uint32_t uid);
  // Connections holding a slot.
  int total() const;

 private:
  const Options options_;
  mutable std::mutex mu_;
  int total_ = 0;
  std::map<uint32_t, int> per_uid_;
};

}  // namespace ckpt::daemon
