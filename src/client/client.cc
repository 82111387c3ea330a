#include "ckpt/client.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>

#include "common/hex.h"
#include "common/suggest.h"
#include "client/wire_mapping.h"
#include "protocol/daemon_connection.h"
#include "protocol/messages.h"
#include "protocol/wire.h"
#include "shm/segment_name.h"
#include "shm/segment_reader.h"

namespace ckpt {

using nlohmann::json;
using protocol::DaemonConnection;

namespace {

// A relative path made absolute against the working directory; a URL ("scheme://...", a
// remote source the daemon fetches, docs/remote-sources.md) is passed on as it is.
Result<std::string> Absolute(const std::string& path) {
  if (path.empty() || path[0] == '/') return path;
  if (const size_t sep = path.find("://"); sep != std::string::npos && sep > 0 && path.find('/') == sep + 1) return path;
  char cwd[4096];
  if (::getcwd(cwd, sizeof(cwd)) == nullptr) return ErrnoError("getcwd", errno);
  return std::string(cwd) + "/" + path;
}

}  // namespace

std::string Client::DefaultSocketPath() { return protocol::DefaultSocketPath(); }

Client::Client(std::string socket_path, std::unique_ptr<DaemonConnection> connection)
    : socket_path_(std::move(socket_path)), connection_(std::move(connection)) {}
Client::~Client() = default;

Result<std::unique_ptr<Client>> Client::Connect(const std::string& socket_path) {
  CKPT_ASSIGN_OR_RETURN(auto connection, DaemonConnection::Open(socket_path));
  return std::unique_ptr<Client>(new Client(socket_path, std::move(connection)));
}

namespace {

// The event handler of a call that reports progress: each progress event goes to
// `progress` (whose false cancels); other events and malformed ones (not worth a cancel)
// are passed over. Empty when `progress` is.
DaemonConnection::EventHandler ProgressEvents(const CancellableProgress& progress) {
  if (!progress) return {};
  return [&progress](const json& frame) {
    if (protocol::EventName(frame) != protocol::kProgressEvent) return true;
    protocol::ProgressEvent event;
    if (!protocol::Decode(frame, &event).ok()) return true;
    return progress(event.done, event.total);
  };
}

}  // namespace

Result<LoadResult> Client::Load(const std::string& path, const LoadOptions& options) {
  protocol::LoadRequest request;
  CKPT_ASSIGN_OR_RETURN(request.path, Absolute(path));
  request.name = options.name;
  request.replace = options.replace;
  request.allow_expansion = options.allow_expansion;
  request.progress = static_cast<bool>(options.progress);
  CKPT_ASSIGN_OR_RETURN(json response, connection_->Call(protocol::LoadRequest::kOp, protocol::Encode(request),
                                                         ProgressEvents(options.progress)));
  return client::DecodePublic<LoadResult>(response);
}

Result<EnsureResult> Client::Ensure(const std::string& path, const EnsureOptions& options) {
  protocol::EnsureRequest request;
  CKPT_ASSIGN_OR_RETURN(request.path, Absolute(path));
  request.name = options.name;
  request.allow_expansion = options.allow_expansion;
  request.progress = static_cast<bool>(options.progress);
  // Not retried on a broken connection: the caller decides (a repeat is safe: it finds
  // the generation published, or joins the load still in progress).
  CKPT_ASSIGN_OR_RETURN(json response, connection_->Call(protocol::EnsureRequest::kOp, protocol::Encode(request),
                                                         ProgressEvents(options.progress)));
  return client::DecodePublic<EnsureResult>(response);
}

Result<CheckpointSummary> Client::Load(const std::string& path, const std::string& name,
                                       const ProgressCallback& progress) {
  LoadOptions options;
  options.name = name;
  if (progress) {
    options.progress = [&progress](uint64_t done, uint64_t total) {
      progress(done, total);
      return true;
    };
  }
  CKPT_ASSIGN_OR_RETURN(LoadResult result, Load(path, options));
  return std::move(result.checkpoint);
}

Result<CheckpointSummary> Client::Evict(const std::string& name, const EvictOptions& options) {
  // Checked here: the request leaves out a wait of 0 or less, so the daemon never sees it.
  if (!(options.wait_s >= 0 && options.wait_s <= 86400)) {
    return InvalidArgument("evict wait must be 0 to 86400 seconds, not " + std::to_string(options.wait_s));
  }
  protocol::EvictRequest request;
  request.name = name;
  request.force = options.force;
  request.wait_s = options.wait_s;
  auto response = connection_->CallRetrying(protocol::EvictRequest::kOp, protocol::Encode(request));
  if (!response.ok()) return WithSimilarNames(response.status(), name);
  CKPT_ASSIGN_OR_RETURN(auto decoded, protocol::DecodeAs<protocol::CheckpointResponse>(*response));
  return client::FromWire<CheckpointSummary>(decoded.checkpoint);
}

Status Client::Evict(const std::string& name, bool force) {
  EvictOptions options;
  options.force = force;
  return Evict(name, options).status();
}

Result<CheckpointList> Client::ListAll() {
  CKPT_ASSIGN_OR_RETURN(json response, connection_->CallRetrying(protocol::ListRequest::kOp));
  return client::DecodePublic<CheckpointList>(response);
}

std::vector<std::string> Client::SimilarNames(const std::string& name) {
  auto list = ListAll();
  if (!list.ok()) return {};
  std::vector<std::string> names;
  for (const CheckpointSummary& c : list->checkpoints) names.push_back(c.name);
  for (const std::string& n : list->loading) names.push_back(n);
  // A name that exists was not found for another reason (a generation that moved on).
  if (std::find(names.begin(), names.end(), name) != names.end()) return {};
  return Suggest(name, names);
}

Status Client::WithSimilarNames(Status status, const std::string& name) {
  if (status.code() != StatusCode::kNotFound) return status;
  const std::string hint = DidYouMean(SimilarNames(name));
  if (hint.empty()) return status;
  return Status(status.code(), status.message() + hint);
}

Result<std::vector<CheckpointSummary>> Client::List() {
  CKPT_ASSIGN_OR_RETURN(CheckpointList list, ListAll());
  return std::move(list.checkpoints);
}

Result<CheckpointInfo> Client::GetInfo(const std::string& name) {
  auto response = connection_->CallRetrying(protocol::InfoRequest::kOp, protocol::Encode(protocol::InfoRequest{name}));
  if (!response.ok()) return WithSimilarNames(response.status(), name);
  return client::DecodePublic<CheckpointInfo>(*response);
}

Result<std::vector<TensorInfo>> Client::Info(const std::string& name) {
  CKPT_ASSIGN_OR_RETURN(CheckpointInfo info, GetInfo(name));
  return std::move(info.tensors);
}

Result<DaemonStatus> Client::GetStatus() {
  CKPT_ASSIGN_OR_RETURN(json response, connection_->CallRetrying(protocol::StatusRequest::kOp));
  return client::DecodePublic<DaemonStatus>(response);
}

Result<VerifyResult> Client::Verify(const std::string& name) {
  auto response = connection_->CallRetrying(protocol::VerifyRequest::kOp, protocol::Encode(protocol::VerifyRequest{name}));
  if (!response.ok()) return WithSimilarNames(response.status(), name);
  return client::DecodePublic<VerifyResult>(*response);
}

Result<std::string> Client::Metrics() {
  CKPT_ASSIGN_OR_RETURN(json response, connection_->CallRetrying(protocol::MetricsRequest::kOp));
  CKPT_ASSIGN_OR_RETURN(auto decoded, protocol::DecodeAs<protocol::MetricsResponse>(response));
  return std::move(decoded.text);
}

Result<std::unique_ptr<Checkpoint>> Client::Attach(const std::string& name) {
  CKPT_ASSIGN_OR_RETURN(auto lease, DaemonConnection::Open(socket_path_));
  UniqueFd segment_fd;
  protocol::AttachRequest request;
  request.name = name;
  auto response = lease->Call(protocol::AttachRequest::kOp, protocol::Encode(request), nullptr, &segment_fd);
  if (!response.ok()) return WithSimilarNames(response.status(), name);
  CKPT_ASSIGN_OR_RETURN(auto attached, protocol::DecodeAs<protocol::CheckpointResponse>(*response));
  const std::string& shm_name = attached.checkpoint.shm_name;
  const std::string& segment_id = attached.checkpoint.segment_id;
  // The daemon's read-only descriptor is the only way in: segments are never opened by name.
  if (!segment_fd.valid()) return Corrupt("ckptd passed no segment descriptor with its attach response");
  CKPT_ASSIGN_OR_RETURN(auto segment, shm::SegmentReader::FromFd(segment_fd.get(), shm_name));
  if (segment->checkpoint_name() != name) {
    return Corrupt("segment " + shm_name + " holds '" + segment->checkpoint_name() + "', not '" + name + "'");
  }
  if (segment_id != shm::SegmentIdHex(segment->segment_id())) {
    return Corrupt("segment " + shm_name + " has id " + shm::SegmentIdHex(segment->segment_id()) +
                   ", the daemon announced '" + segment_id + "'");
  }
  // The descriptor stays with the Checkpoint for its copy-on-write view (PrivateTensorData).
  std::unique_ptr<Checkpoint> checkpoint(
      new Checkpoint(name, socket_path_, std::move(lease), std::move(segment), segment_fd.release()));
  CKPT_RETURN_IF_ERROR(checkpoint->StartLeaseKeeper());
  return checkpoint;
}

Result<std::string> Client::Rendezvous(const std::string& job, int rank, int world, const std::string& value,
                                       double timeout_s) {
  // A connection of its own: a wait must not hold the shared connection's mutex (rank 0
  // may be another thread of this process, calling through this same Client). There is
  // no client-side read timeout; the daemon bounds the wait by timeout_s.
  CKPT_ASSIGN_OR_RETURN(auto connection, DaemonConnection::Open(socket_path_));
  protocol::RendezvousRequest request;
  request.job = job;
  request.rank = rank;
  request.world = world;
  request.timeout_s = timeout_s;
  request.has_value = rank == 0 || !value.empty();
  if (request.has_value) request.value_hex = HexEncode(value);
  CKPT_ASSIGN_OR_RETURN(json response,
                        connection->Call(protocol::RendezvousRequest::kOp, protocol::Encode(request)));
  CKPT_ASSIGN_OR_RETURN(auto decoded, protocol::DecodeAs<protocol::RendezvousResponse>(response));
  auto bytes = HexDecode(decoded.value_hex);
  if (!bytes.ok()) return Corrupt("malformed rendezvous response from ckptd: " + bytes.status().message());
  return bytes;
}

}  // namespace ckpt
