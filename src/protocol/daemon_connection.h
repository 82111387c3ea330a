// DaemonConnection: one request/response channel to ckptd (see protocol/wire.h).
// Thread-safe: Call() holds a mutex for the whole exchange.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>

#include "ckpt/status.h"
#include "common/unique_fd.h"

namespace ckpt::protocol {

class DaemonConnection {
 public:
  // Called with each event frame before the response; returning false asks the daemon
  // to cancel the request in progress (a load). It may throw: see Call.
  using EventHandler = std::function<bool(const nlohmann::json& event)>;

  // Unavailable if nobody listens at `socket_path`.
  static Result<std::unique_ptr<DaemonConnection>> Open(const std::string& socket_path);

  // Sends {"v", "op": op, ...fields} and returns the response's fields when it is OK, its
  // Status otherwise.
  // Before sending, a connection the daemon closed (idle, restarted) is noticed and
  // replaced by a new one, and an error the daemon sent unasked (refused at connect: no
  // role, no free slot) is returned; if the daemon answers the request with a "closing"
  // event (it closed without reading it), the request is sent once more on a new
  // connection. So a request is never lost to an idle close, whatever its op.
  // Event frames go to `on_event` (if set). When it returns false or throws, a cancel
  // frame is sent and the exchange is read to its end (the request's response and, if
  // the cancel came too late to be consumed, the cancel's own response), so the
  // connection stays in step; then the response is returned, or the exception rethrown.
  // Unavailable if the daemon went away after the request was sent (the connection is
  // then closed; the next call connects again). A descriptor the daemon passes with the
  // response goes to `received_fd` (if set).
  Result<nlohmann::json> Call(const std::string& op, nlohmann::json fields = nlohmann::json::object(),
                              const EventHandler& on_event = nullptr, UniqueFd* received_fd = nullptr);
  // Like Call, but if the connection turns out broken before a response arrived (the
  // daemon restarted), connects again to the same socket once and retries. Only for
  // requests that are safe to repeat.
  Result<nlohmann::json> CallRetrying(const std::string& op, nlohmann::json fields = nlohmann::json::object(),
                                      UniqueFd* received_fd = nullptr);
  // The socket, for poll() only; -1 once closed. Owned by this connection.
  int native_handle() {
    std::lock_guard<std::mutex> lock(mu_);
    return fd_.get();
  }
  // True once the connection broke (a later Call connects again first).
  bool broken();

 private:
  DaemonConnection(std::string socket_path, UniqueFd fd)
      : socket_path_(std::move(socket_path)), fd_(std::move(fd)) {}
  // Makes fd_ a live connection with nothing unread: reconnects if it is closed or the
  // daemon closed it; returns an unasked error the daemon sent (the connection is then
  // dropped).
  Status PrepareLocked();
  Result<nlohmann::json> CallLocked(const std::string& op, const nlohmann::json& fields,
                                    const EventHandler& on_event, UniqueFd* received_fd);
  // One exchange on fd_; sets *unread when the daemon closed without reading the request.
  Result<nlohmann::json> ExchangeLocked(const nlohmann::json& request, const EventHandler& on_event,
                                        UniqueFd* received_fd, bool* unread);
  std::string socket_path_;
  std::mutex mu_;
  UniqueFd fd_;
};

}  // namespace ckpt::protocol
