#include "protocol/daemon_connection.h"

#include "protocol/wire.h"

namespace ckpt::protocol {

using nlohmann::json;

Result<std::unique_ptr<DaemonConnection>> DaemonConnection::Open(const std::string& socket_path) {
  CKPT_ASSIGN_OR_RETURN(UniqueFd fd, protocol::ConnectUnix(socket_path));
  return std::unique_ptr<DaemonConnection>(new DaemonConnection(socket_path, std::move(fd)));
}

Result<json> DaemonConnection::Call(const std::string& op, json fields,
                                    const std::function<void(const json&)>& on_event,
                                    UniqueFd* received_fd) {
  std::lock_guard<std::mutex> lock(mu_);
  return CallLocked(op, std::move(fields), on_event, received_fd);
}

Result<json> DaemonConnection::CallRetrying(const std::string& op, json fields, UniqueFd* received_fd) {
  std::lock_guard<std::mutex> lock(mu_);
  if (fd_.valid()) {
    auto r = CallLocked(op, fields, nullptr, received_fd);
    if (r.ok() || r.status().code() != StatusCode::kUnavailable || fd_.valid()) return r;
  }
  auto fd = protocol::ConnectUnix(socket_path_);
  if (!fd.ok()) return fd.status();
  fd_ = std::move(fd).value();
  return CallLocked(op, std::move(fields), nullptr, received_fd);
}

Result<json> DaemonConnection::CallLocked(const std::string& op, json fields,
                                          const std::function<void(const json&)>& on_event,
                                          UniqueFd* received_fd) {
  if (!fd_.valid()) return Unavailable("connection to ckptd is closed");
  fields["v"] = protocol::kProtocolVersion;
  fields["op"] = op;
  Status st = protocol::WriteFrame(fd_.get(), fields);
  if (!st.ok()) {
    fd_.reset();
    return Unavailable("lost the connection to ckptd: " + st.message());
  }
  for (;;) {
    auto frame = protocol::ReadFrame(fd_.get(), protocol::kMaxResponseBytes, received_fd);
    if (!frame.ok()) {
      fd_.reset();
      return Unavailable("lost the connection to ckptd: " + frame.status().message());
    }
    if (frame->contains("event")) {
      if (on_event) on_event(*frame);
      continue;
    }
    CKPT_RETURN_IF_ERROR(protocol::StatusOf(*frame));
    return std::move(frame).value();
  }
}

bool DaemonConnection::broken() {
  std::lock_guard<std::mutex> lock(mu_);
  return !fd_.valid();
}

}  // namespace ckpt::protocol
