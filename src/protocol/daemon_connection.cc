#include "protocol/daemon_connection.h"

#include <exception>

#include "protocol/messages.h"
#include "protocol/wire.h"

namespace ckpt::protocol {

using nlohmann::json;

namespace {
// How long a client waits for a frame the daemon already began to send, or for the
// frames of a cancelled exchange.
constexpr double kDrainSeconds = 5;
}  // namespace

Result<std::unique_ptr<DaemonConnection>> DaemonConnection::Open(const std::string& socket_path) {
  CKPT_ASSIGN_OR_RETURN(UniqueFd fd, protocol::ConnectUnix(socket_path));
  return std::unique_ptr<DaemonConnection>(new DaemonConnection(socket_path, std::move(fd)));
}

Status DaemonConnection::PrepareLocked() {
  if (fd_.valid() && PeerClosedOrReadable(fd_.get())) {
    // Nothing is in flight, so whatever is there was sent unasked: a "closing" event and
    // the hang-up (idle, daemon stopping), or a refusal at accept.
    auto frame = ReadFrame(fd_.get(), kMaxResponseBytes, nullptr, DeadlineIn(kDrainSeconds));
    fd_.reset();
    if (frame.ok() && EventName(*frame).empty()) {
      Status refused = StatusOf(*frame);
      if (!refused.ok()) return refused;
    }
  }
  if (!fd_.valid()) {
    CKPT_ASSIGN_OR_RETURN(fd_, ConnectUnix(socket_path_));
  }
  return Status::Ok();
}

Result<json> DaemonConnection::Call(const std::string& op, json fields, const EventHandler& on_event,
                                    UniqueFd* received_fd) {
  std::lock_guard<std::mutex> lock(mu_);
  fields["v"] = kProtocolVersion;
  fields["op"] = op;
  return CallLocked(op, fields, on_event, received_fd);
}

Result<json> DaemonConnection::CallRetrying(const std::string& op, json fields, UniqueFd* received_fd) {
  std::lock_guard<std::mutex> lock(mu_);
  fields["v"] = kProtocolVersion;
  fields["op"] = op;
  auto r = CallLocked(op, fields, nullptr, received_fd);
  if (r.ok() || r.status().code() != StatusCode::kUnavailable || fd_.valid()) return r;
  return CallLocked(op, fields, nullptr, received_fd);  // the daemon restarted mid-call
}

Result<json> DaemonConnection::CallLocked(const std::string& op, const json& request, const EventHandler& on_event,
                                          UniqueFd* received_fd) {
  (void)op;
  for (int attempt = 0;; ++attempt) {
    CKPT_RETURN_IF_ERROR(PrepareLocked());
    bool unread = false;
    auto r = ExchangeLocked(request, on_event, received_fd, &unread);
    if (!unread || attempt > 0) return r;
    // The daemon closed this connection without reading the request: send it again.
  }
}

Result<json> DaemonConnection::ExchangeLocked(const json& request, const EventHandler& on_event,
                                              UniqueFd* received_fd, bool* unread) {
  Status st = WriteFrame(fd_.get(), request);
  if (!st.ok()) {
    fd_.reset();
    return Unavailable("lost the connection to ckptd: " + st.message());
  }
  bool cancel_sent = false;
  std::exception_ptr thrown;
  bool first = true;
  for (;;) {
    auto frame = ReadFrame(fd_.get(), kMaxResponseBytes, received_fd,
                           cancel_sent ? DeadlineIn(kDrainSeconds) : kNoDeadline);
    if (!frame.ok()) {
      fd_.reset();
      if (thrown) std::rethrow_exception(thrown);
      // Out of descriptors is this process's limit, not a lost daemon (the connection is
      // closed all the same: the response it carried is lost).
      if (frame.status().code() == StatusCode::kResourceExhausted) return frame.status();
      return Unavailable("lost the connection to ckptd: " + frame.status().message());
    }
    const std::string event = EventName(*frame);
    if (event == kClosingEvent) {
      fd_.reset();
      if (thrown) std::rethrow_exception(thrown);
      if (first) {
        *unread = true;
        return Unavailable("ckptd closed the connection before reading the request");
      }
      return Unavailable("ckptd closed the connection: " + frame->value("reason", std::string("closing")));
    }
    first = false;
    if (!event.empty()) {
      if (on_event && !cancel_sent) {
        bool keep_going = true;
        try {
          keep_going = on_event(*frame);
        } catch (...) {
          thrown = std::current_exception();
          keep_going = false;
        }
        if (!keep_going) {
          cancel_sent = true;
          if (!WriteFrame(fd_.get(), json{{"v", kProtocolVersion}, {"op", CancelRequest::kOp}},
                          DeadlineIn(kDrainSeconds)).ok()) {
            fd_.reset();  // the next call connects again
            if (thrown) std::rethrow_exception(thrown);
            return Cancelled("load cancelled (the connection to ckptd was lost while cancelling)");
          }
        }
      }
      continue;
    }
    Status response = StatusOf(*frame);
    if (cancel_sent && response.code() != StatusCode::kCancelled) {
      // The request ended before the daemon read the cancel: it answers the cancel on
      // its own. Read that answer so the next call gets its own.
      for (;;) {
        auto extra = ReadFrame(fd_.get(), kMaxResponseBytes, nullptr, DeadlineIn(kDrainSeconds));
        if (!extra.ok()) {
          fd_.reset();
          break;
        }
        if (EventName(*extra).empty()) break;
        if (EventName(*extra) == kClosingEvent) {
          fd_.reset();
          break;
        }
      }
    }
    if (thrown) std::rethrow_exception(thrown);
    if (!response.ok()) return response;
    return std::move(frame).value();
  }
}

bool DaemonConnection::broken() {
  std::lock_guard<std::mutex> lock(mu_);
  return !fd_.valid();
}

}  // namespace ckpt::protocol
