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
  // Unavailable if nobody listens at `socket_path`.
  static Result<std::unique_ptr<DaemonConnection>> Open(const std::string& socket_path);

  // Sends {"v", "op": op, ...fields} and returns the response's fields when it is OK, its
  // Status otherwise. Event frames before the response go to `on_event` (if set).
  // Unavailable if the daemon went away (the connection is then closed for good).
  // A descriptor the daemon passes with the response goes to `received_fd` (if set).
  Result<nlohmann::json> Call(const std::string& op, nlohmann::json fields = nlohmann::json::object(),
                              const std::function<void(const nlohmann::json&)>& on_event = nullptr,
                              UniqueFd* received_fd = nullptr);
  // Like Call, but if the connection is or turns out broken before a response arrived
  // (the daemon restarted), connects again to the same socket once and retries. Only for
  // requests that are safe to repeat.
  Result<nlohmann::json> CallRetrying(const std::string& op, nlohmann::json fields = nlohmann::json::object(),
                                      UniqueFd* received_fd = nullptr);
  // The socket, for poll() only; -1 once closed. Owned by this connection.
  int native_handle() {
    std::lock_guard<std::mutex> lock(mu_);
    return fd_.get();
  }
  // True once the connection broke (a later Call returns Unavailable at once).
  bool broken();

 private:
  DaemonConnection(std::string socket_path, UniqueFd fd)
      : socket_path_(std::move(socket_path)), fd_(std::move(fd)) {}
  Result<nlohmann::json> CallLocked(const std::string& op, nlohmann::json fields,
                                    const std::function<void(const nlohmann::json&)>& on_event,
                                    UniqueFd* received_fd);
  std::string socket_path_;
  std::mutex mu_;
  UniqueFd fd_;
};

}  // namespace ckpt::protocol
