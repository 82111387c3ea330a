// RequestHandler: decodes the requests of one client connection, checks the caller's
// role, runs the op (daemon/ops.h) and encodes its response. One handler per connection;
// it remembers that connection's attachments and releases them when destroyed (the
// client closed the connection or died).
//
// The table of operations (request_handler.cc) is the one place that says, for every op,
// the role it needs, its request type and its handler. It fails closed: an op it does not
// list is refused (InvalidArgument "unknown op"), whatever the caller's role.
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

// One row of the table of operations, as tests and docs see it.
struct OpPolicy {
  std::string op;
  Role role = Role::kAdmin;  // the least role that may run it
  std::string request;       // the request's type in protocol/messages.h
};

class RequestHandler {
 public:
  // Every row of the table of operations, in table order.
  static std::vector<OpPolicy> Operations();

  // `peer` and `role` are those of the connection's client (see AccessPolicy); `fd` is
  // the connection (-1 for the daemon's own use).
  RequestHandler(DaemonContext context, int fd, PeerCredentials peer, Role role)
      : ctx_(context), caller_{fd, peer, role, OwnerOf(peer.uid, role == Role::kAdmin)} {}
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
  struct Operation;
  static const std::vector<Operation>& Table();
  static const Operation* Find(const std::string& op);
  Result<nlohmann::json> Dispatch(const nlohmann::json& request);
  // The ops that run on the connection (load, ensure, write): decodes a Request, runs
  // op(request, &watch), keeps whether the connection is still usable, encodes the result.
  template <typename Request, typename Op>
  Result<nlohmann::json> RunWatched(const nlohmann::json& request, Op op);
  // The handlers of the table's rows.
  Result<nlohmann::json> RunStatus(const nlohmann::json& request);
  Result<nlohmann::json> RunMetrics(const nlohmann::json& request);
  Result<nlohmann::json> RunList(const nlohmann::json& request);
  Result<nlohmann::json> RunInfo(const nlohmann::json& request);
  Result<nlohmann::json> RunLoad(const nlohmann::json& request);
  Result<nlohmann::json> RunEnsure(const nlohmann::json& request);
  Result<nlohmann::json> RunEvict(const nlohmann::json& request);
  Result<nlohmann::json> RunAttach(const nlohmann::json& request);
  Result<nlohmann::json> RunVerify(const nlohmann::json& request);
  Result<nlohmann::json> RunRendezvous(const nlohmann::json& request);
  Result<nlohmann::json> RunWrite(const nlohmann::json& request);
  Result<nlohmann::json> RunOutsideWrite(const nlohmann::json& request);
  Result<nlohmann::json> RunCancel(const nlohmann::json& request);

  DaemonContext ctx_;
  Caller caller_;
  UniqueFd response_fd_;
  UniqueFd request_fd_;
  bool drop_connection_ = false;
  std::vector<std::pair<std::string, uint64_t>> attachments_;  // (name, generation)
};

}  // namespace ckpt::daemon
