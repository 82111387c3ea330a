// RequestHandler: decodes the requests of one client connection, checks the caller's
// role (daemon/policy.h), runs the op (daemon/ops.h) and encodes its response. One
// handler per connection; it remembers that connection's attachments and releases them
// when destroyed (the client closed the connection or died).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "ckpt/status.h"
#include "common/unique_fd.h"
#include "daemon/ops.h"

namespace ckpt::daemon {

class RequestHandler {
 public:
  // `peer` and `role` are those of the connection's client (see AccessPolicy); `fd` is
  // the connection (-1 for the daemon's own use).
  RequestHandler(DaemonContext context, int fd, PeerCredentials peer, Role role)
      : ctx_(context), caller_{fd, peer, role} {}
  ~RequestHandler();
  RequestHandler(const RequestHandler&) = delete;
  RequestHandler& operator=(const RequestHandler&) = delete;

  // Executes one request and returns its response (never throws). May write progress
  // event frames to the connection, and read a cancel frame from it, before returning.
  nlohmann::json Handle(const nlohmann::json& request);
  // The descriptor to pass with the response Handle() just returned (an attach's
  // read-only segment), or an invalid one.
  UniqueFd TakeResponseFd() { return std::move(response_fd_); }
  // A descriptor that came with the next request (a write's ring); Handle() consumes it
  // (closed if that request takes none).
  void SetRequestFd(UniqueFd fd) { request_fd_ = std::move(fd); }
  // True when the last request found the connection unusable (the client hung up, or
  // sent a request during a load): send nothing more, close it.
  bool drop_connection() const { return drop_connection_; }
  // True while this connection holds an attachment (its lease must not time out).
  bool holds_attachments() const { return !attachments_.empty(); }

 private:
  Result<nlohmann::json> Dispatch(const nlohmann::json& request);

  DaemonContext ctx_;
  Caller caller_;
  UniqueFd response_fd_;
  UniqueFd request_fd_;
  bool drop_connection_ = false;
  std::vector<std::pair<std::string, uint64_t>> attachments_;  // (name, generation)
};

}  // namespace ckpt::daemon
