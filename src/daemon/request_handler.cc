#include "daemon/request_handler.h"

#include <spdlog/spdlog.h>

#include "daemon/metrics.h"
#include "daemon/policy.h"
#include "protocol/messages.h"
#include "protocol/wire.h"

namespace ckpt::daemon {

using nlohmann::json;

namespace {
// Decodes request fields into a T, or the InvalidArgument naming the bad field.
template <typename T>
Result<T> Fields(const json& request) {
  return protocol::DecodeAs<T>(request);
}
}  // namespace

RequestHandler::~RequestHandler() {
  for (const auto& [name, generation] : attachments_) {
    ctx_.catalog->Detach(name, generation, caller_.peer.pid);
    spdlog::debug("detached '{}' generation {}", name, generation);
  }
}

json RequestHandler::Handle(const json& request) {
  Result<json> response = InvalidArgument("unhandled");
  try {
    response = Dispatch(request);
  } catch (const std::exception& e) {
    response = Internal(std::string("request failed: ") + e.what());
  }
  request_fd_.reset();
  ++ctx_.counters->requests;
  if (!response.ok()) {
    ++ctx_.counters->request_errors;
    response_fd_.reset();
    return protocol::ErrorResponse(response.status());
  }
  return protocol::OkResponse(std::move(response).value());
}

Result<json> RequestHandler::Dispatch(const json& request) {
  using protocol::Encode;
  CKPT_ASSIGN_OR_RETURN(std::string op, protocol::DecodeOp(request));
  if (Status allowed = CheckRole(caller_.role, caller_.peer, op); !allowed.ok()) {
    ++ctx_.counters->denied;
    spdlog::warn("refused '{}' to uid {} gid {} pid {} (role {})", op.substr(0, 64), caller_.peer.uid,
                 caller_.peer.gid, caller_.peer.pid, RoleName(caller_.role));
    return allowed;
  }
  if (op == "status") return Encode(GetStatus(ctx_, caller_));
  if (op == "metrics") return Encode(protocol::MetricsResponse{RenderMetrics(ctx_)});
  if (op == "list") return Encode(List(ctx_));
  if (op == "info") {
    CKPT_ASSIGN_OR_RETURN(auto r, Fields<protocol::NameRequest>(request));
    CKPT_ASSIGN_OR_RETURN(auto info, Info(ctx_, r));
    return Encode(info);
  }
  if (op == protocol::LoadRequest::kOp) {
    CKPT_ASSIGN_OR_RETURN(auto r, Fields<protocol::LoadRequest>(request));
    LoadWatch watch;
    auto loaded = Load(ctx_, caller_, r, &watch);
    drop_connection_ = watch.drop_connection;
    CKPT_ASSIGN_OR_RETURN(auto result, std::move(loaded));
    return Encode(result);
  }
  if (op == protocol::EvictRequest::kOp) {
    CKPT_ASSIGN_OR_RETURN(auto r, Fields<protocol::EvictRequest>(request));
    CKPT_ASSIGN_OR_RETURN(auto evicted, Evict(ctx_, r));
    return Encode(evicted);
  }
  if (op == protocol::AttachRequest::kOp) {
    CKPT_ASSIGN_OR_RETURN(auto r, Fields<protocol::AttachRequest>(request));
    CKPT_ASSIGN_OR_RETURN(auto attached, Attach(ctx_, caller_, r, &response_fd_));
    attachments_.emplace_back(attached.checkpoint.name, attached.checkpoint.generation);
    return Encode(attached);
  }
  if (op == "verify") {
    CKPT_ASSIGN_OR_RETURN(auto r, Fields<protocol::NameRequest>(request));
    CKPT_ASSIGN_OR_RETURN(auto verified, Verify(ctx_, r));
    return Encode(verified);
  }
  if (op == protocol::RendezvousRequest::kOp) {
    CKPT_ASSIGN_OR_RETURN(auto r, Fields<protocol::RendezvousRequest>(request));
    CKPT_ASSIGN_OR_RETURN(auto value, Rendezvous(ctx_, caller_, r));
    return Encode(value);
  }
  if (op == protocol::WriteRequest::kOp) {
    CKPT_ASSIGN_OR_RETURN(auto r, Fields<protocol::WriteRequest>(request));
    LoadWatch watch;
    auto written = Write(ctx_, caller_, r, std::move(request_fd_), &watch);
    drop_connection_ = watch.drop_connection;
    CKPT_ASSIGN_OR_RETURN(auto result, std::move(written));
    return Encode(result);
  }
  if (op == protocol::WriteChunkRequest::kOp || op == protocol::WriteSealRequest::kOp) {
    return FailedPrecondition("'" + op + "' outside a write (the write it belonged to has ended)");
  }
  // A cancel that arrived after its load had already answered: nothing to cancel.
  if (op == protocol::CancelRequest::kOp) return Encode(protocol::CancelResponse{false});
  return InvalidArgument("unknown op '" + op.substr(0, 64) + "'");
}

}  // namespace ckpt::daemon
