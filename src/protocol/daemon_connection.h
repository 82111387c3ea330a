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
  // Unavailable if the daemon went away.
  Result<nlohmann::json> Call(const std::string& op, nlohmann::json fields = nlohmann::json::object(),
                              const std::function<void(const nlohmann::json&)>& on_event = nullptr);

 private:
  explicit DaemonConnection(UniqueFd fd) : fd_(std::move(fd)) {}
  std::mutex mu_;
  UniqueFd fd_;
};

}  // namespace ckpt::protocol
