#include "protocol/daemon_connection.h"

#include "protocol/wire.h"

namespace ckpt::protocol {

using nlohmann::json;

Result<std::unique_ptr<DaemonConnection>> DaemonConnection::Open(const std::string& socket_path) {
  CKPT_ASSIGN_OR_RETURN(UniqueFd fd, protocol::ConnectUnix(socket_path));
  return std::unique_ptr<DaemonConnection>(new DaemonConnection(std::move(fd)));
}

Result<json> DaemonConnection::Call(const std::string& op, json fields,
                                    const std::function<void(const json&)>& on_event) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!fd_.valid()) return Unavailable("connection to ckptd is closed");
  fields["v"] = protocol::kProtocolVersion;
  fields["op"] = op;
  Status st = protocol::WriteFrame(fd_.get(), fields);
  if (!st.ok()) {
    fd_.reset();
    return Unavailable("lost the connection to ckptd: " + st.message());
  }
  for (;;) {
    auto frame = protocol::ReadFrame(fd_.get(), protocol::kMaxResponseBytes);
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

}  // namespace ckpt::protocol
