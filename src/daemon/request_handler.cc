#include "daemon/request_handler.h"

#include <spdlog/spdlog.h>

#include "daemon/metrics.h"
#include "daemon/policy.h"
#include "protocol/messages.h"
#include "protocol/wire.h"

namespace ckpt::daemon {

using nlohmann::json;

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

// The table of operations: every op the daemon serves, the least role that may run it,
// its request type and its handler. Nothing else is served.
struct RequestHandler::Operation {
  const char* op;
  Role role;
  const char* request;
  Result<json> (RequestHandler::*run)(const json&);
};

namespace {
using H = RequestHandler;
}  // namespace

const std::vector<RequestHandler::Operation>& RequestHandler::Table() {
  static const std::vector<Operation> kOperations = {
      {protocol::StatusRequest::kOp, Role::kReader, "StatusRequest", &H::RunStatus},
      {protocol::MetricsRequest::kOp, Role::kReader, "MetricsRequest", &H::RunMetrics},
      {protocol::ListRequest::kOp, Role::kReader, "ListRequest", &H::RunList},
      {protocol::InfoRequest::kOp, Role::kReader, "InfoRequest", &H::RunInfo},
      {protocol::AttachRequest::kOp, Role::kReader, "AttachRequest", &H::RunAttach},
      {protocol::RendezvousRequest::kOp, Role::kReader, "RendezvousRequest", &H::RunRendezvous},
      {protocol::CancelRequest::kOp, Role::kReader, "CancelRequest", &H::RunCancel},
      // Writers publish and evict; the Catalog lets them alter only names they own.
      {protocol::WriteRequest::kOp, Role::kWriter, "WriteRequest", &H::RunWrite},
      {protocol::WriteChunkRequest::kOp, Role::kWriter, "WriteChunkRequest", &H::RunOutsideWrite},
      {protocol::WriteSealRequest::kOp, Role::kWriter, "WriteSealRequest", &H::RunOutsideWrite},
      {protocol::EvictRequest::kOp, Role::kWriter, "EvictRequest", &H::RunEvict},
      // Admins only: the daemon reads files (load, ensure) or a whole checkpoint (verify).
      {protocol::LoadRequest::kOp, Role::kAdmin, "LoadRequest", &H::RunLoad},
      {protocol::EnsureRequest::kOp, Role::kAdmin, "EnsureRequest", &H::RunEnsure},
      {protocol::VerifyRequest::kOp, Role::kAdmin, "VerifyRequest", &H::RunVerify},
  };
  return kOperations;
}

const RequestHandler::Operation* RequestHandler::Find(const std::string& op) {
  for (const Operation& o : Table()) {
    if (op == o.op) return &o;
  }
  return nullptr;
}

std::vector<OpPolicy> RequestHandler::Operations() {
  std::vector<OpPolicy> rows;
  for (const Operation& o : Table()) rows.push_back({o.op, o.role, o.request});
  return rows;
}

Result<json> RequestHandler::Dispatch(const json& request) {
  CKPT_ASSIGN_OR_RETURN(std::string op, protocol::DecodeOp(request));
  const Operation* operation = Find(op);
  if (operation == nullptr) {
    ++ctx_.counters->denied;
    spdlog::warn("refused unknown op '{}' of uid {} pid {}", op.substr(0, 64), caller_.peer.uid, caller_.peer.pid);
    return InvalidArgument("unknown op '" + op.substr(0, 64) + "' (refused: ckptd serves only the ops it lists)");
  }
  if (Status allowed = CheckRole(caller_.role, operation->role, caller_.peer, op); !allowed.ok()) {
    ++ctx_.counters->denied;
    spdlog::warn("refused '{}' to uid {} gid {} pid {} (role {})", op.substr(0, 64), caller_.peer.uid,
                 caller_.peer.gid, caller_.peer.pid, RoleName(caller_.role));
    return allowed;
  }
  return (this->*(operation->run))(request);
}

Result<json> RequestHandler::RunStatus(const json&) { return protocol::Encode(GetStatus(ctx_, caller_)); }

Result<json> RequestHandler::RunMetrics(const json&) {
  return protocol::Encode(protocol::MetricsResponse{RenderMetrics(ctx_)});
}

Result<json> RequestHandler::RunList(const json&) { return protocol::Encode(List(ctx_)); }

Result<json> RequestHandler::RunInfo(const json& request) {
  CKPT_ASSIGN_OR_RETURN(auto r, protocol::DecodeAs<protocol::InfoRequest>(request));
  CKPT_ASSIGN_OR_RETURN(auto info, Info(ctx_, r));
  return protocol::Encode(info);
}

template <typename Request, typename Op>
Result<json> RequestHandler::RunWatched(const json& request, Op op) {
  CKPT_ASSIGN_OR_RETURN(auto r, protocol::DecodeAs<Request>(request));
  LoadWatch watch;
  auto result = op(r, &watch);
  drop_connection_ = watch.drop_connection;
  if (!result.ok()) return result.status();
  return protocol::Encode(*result);
}

Result<json> RequestHandler::RunLoad(const json& request) {
  return RunWatched<protocol::LoadRequest>(
      request, [&](const protocol::LoadRequest& r, LoadWatch* watch) { return Load(ctx_, caller_, r, watch); });
}

Result<json> RequestHandler::RunEnsure(const json& request) {
  return RunWatched<protocol::EnsureRequest>(
      request, [&](const protocol::EnsureRequest& r, LoadWatch* watch) { return Ensure(ctx_, caller_, r, watch); });
}

Result<json> RequestHandler::RunEvict(const json& request) {
  CKPT_ASSIGN_OR_RETURN(auto r, protocol::DecodeAs<protocol::EvictRequest>(request));
  CKPT_ASSIGN_OR_RETURN(auto evicted, Evict(ctx_, caller_, r));
  return protocol::Encode(evicted);
}

Result<json> RequestHandler::RunAttach(const json& request) {
  CKPT_ASSIGN_OR_RETURN(auto r, protocol::DecodeAs<protocol::AttachRequest>(request));
  CKPT_ASSIGN_OR_RETURN(auto attached, Attach(ctx_, caller_, r, &response_fd_));
  attachments_.emplace_back(attached.checkpoint.name, attached.checkpoint.generation);
  return protocol::Encode(attached);
}

Result<json> RequestHandler::RunVerify(const json& request) {
  CKPT_ASSIGN_OR_RETURN(auto r, protocol::DecodeAs<protocol::VerifyRequest>(request));
  CKPT_ASSIGN_OR_RETURN(auto verified, Verify(ctx_, r));
  return protocol::Encode(verified);
}

Result<json> RequestHandler::RunRendezvous(const json& request) {
  CKPT_ASSIGN_OR_RETURN(auto r, protocol::DecodeAs<protocol::RendezvousRequest>(request));
  CKPT_ASSIGN_OR_RETURN(auto value, Rendezvous(ctx_, caller_, r));
  return protocol::Encode(value);
}

Result<json> RequestHandler::RunWrite(const json& request) {
  return RunWatched<protocol::WriteRequest>(request, [&](const protocol::WriteRequest& r, LoadWatch* watch) {
    return Write(ctx_, caller_, r, std::move(request_fd_), watch);
  });
}

Result<json> RequestHandler::RunOutsideWrite(const json& request) {
  CKPT_ASSIGN_OR_RETURN(std::string op, protocol::DecodeOp(request));
  return FailedPrecondition("'" + op + "' outside a write (the write it belonged to has ended)");
}

// A cancel that arrived after its load had already answered: nothing to cancel.
Result<json> RequestHandler::RunCancel(const json&) { return protocol::Encode(protocol::CancelResponse{false}); }

}  // namespace ckpt::daemon
