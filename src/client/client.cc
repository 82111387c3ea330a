#include "ckpt/client.h"

#include <unistd.h>

#include <cstdlib>

#include "common/hex.h"
#include "protocol/daemon_connection.h"
#include "protocol/wire.h"
#include "shm/segment_name.h"
#include "shm/segment_reader.h"

namespace ckpt {

using protocol::DaemonConnection;
using nlohmann::json;

namespace {

// Reads the fields of a daemon response; wrong types raise json exceptions, which the
// callers below turn into Corrupt.
CheckpointSummary SummaryFromJson(const json& j) {
  CheckpointSummary s;
  s.name = j.at("name").get<std::string>();
  s.generation = j.at("generation").get<uint64_t>();
  s.segment_id = j.value("segment_id", "");
  s.source = j.value("source", "");
  s.format = j.value("format", "");
  s.segment_bytes = j.value("segment_bytes", uint64_t{0});
  s.data_bytes = j.value("data_bytes", uint64_t{0});
  s.tensor_count = j.value("tensor_count", uint64_t{0});
  s.load_seconds = j.value("load_seconds", 0.0);
  s.loaded_unix_s = j.value("loaded_unix_s", int64_t{0});
  s.attached = j.value("attached", uint32_t{0});
  return s;
}

template <typename F>
auto Decode(const char* what, F&& f) -> Result<decltype(f())> {
  try {
    return f();
  } catch (const json::exception& e) {
    return Corrupt(std::string("malformed ") + what + " response from ckptd: " + e.what());
  }
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

Result<CheckpointSummary> Client::Load(const std::string& path, const std::string& name,
                                       const ProgressCallback& progress) {
  std::string absolute = path;
  if (!absolute.empty() && absolute[0] != '/') {
    char cwd[4096];
    if (::getcwd(cwd, sizeof(cwd)) == nullptr) return ErrnoError("getcwd", errno);
    absolute = std::string(cwd) + "/" + path;
  }
  json fields{{"path", absolute}, {"progress", static_cast<bool>(progress)}};
  if (!name.empty()) fields["name"] = name;
  auto on_event = [&](const json& event) {
    if (progress && event.value("event", "") == "progress") {
      progress(event.value("done", uint64_t{0}), event.value("total", uint64_t{0}));
    }
  };
  CKPT_ASSIGN_OR_RETURN(json response, connection_->Call("load", fields, on_event));
  return Decode("load", [&] { return SummaryFromJson(response.at("checkpoint")); });
}

Status Client::Evict(const std::string& name, bool force) {
  return connection_->CallRetrying("evict", json{{"name", name}, {"force", force}}).status();
}

Result<std::vector<CheckpointSummary>> Client::List() {
  CKPT_ASSIGN_OR_RETURN(json response, connection_->CallRetrying("list"));
  return Decode("list", [&] {
    std::vector<CheckpointSummary> out;
    for (const json& j : response.at("checkpoints")) out.push_back(SummaryFromJson(j));
    return out;
  });
}

Result<std::vector<TensorInfo>> Client::Info(const std::string& name) {
  CKPT_ASSIGN_OR_RETURN(json response, connection_->CallRetrying("info", json{{"name", name}}));
  return Decode("info", [&] {
    std::vector<TensorInfo> out;
    for (const json& j : response.at("tensors")) {
      TensorInfo t;
      t.name = j.at("name").get<std::string>();
      auto dtype = DTypeFromName(j.at("dtype").get<std::string>());
      if (dtype) t.dtype = *dtype;
      t.shape = j.at("shape").get<std::vector<int64_t>>();
      t.nbytes = j.at("nbytes").get<uint64_t>();
      t.checksum = std::stoull(j.at("checksum").get<std::string>(), nullptr, 16);
      out.push_back(std::move(t));
    }
    return out;
  });
}

Result<DaemonStatus> Client::GetStatus() {
  CKPT_ASSIGN_OR_RETURN(json r, connection_->CallRetrying("status"));
  return Decode("status", [&] {
    DaemonStatus s;
    s.version = r.at("version").get<std::string>();
    s.protocol = r.at("protocol").get<int>();
    s.pid = r.at("pid").get<int64_t>();
    s.uptime_s = r.at("uptime_s").get<int64_t>();
    s.shm_prefix = r.at("shm_prefix").get<std::string>();
    s.checkpoints = r.at("checkpoints").get<uint64_t>();
    s.loading = r.at("loading").get<uint64_t>();
    s.shm_bytes = r.at("shm_bytes").get<uint64_t>();
    s.attached = r.at("attached").get<uint64_t>();
    s.connections = r.at("connections").get<int64_t>();
    return s;
  });
}

Result<std::unique_ptr<Checkpoint>> Client::Attach(const std::string& name) {
  CKPT_ASSIGN_OR_RETURN(auto lease, DaemonConnection::Open(socket_path_));
  UniqueFd segment_fd;
  CKPT_ASSIGN_OR_RETURN(json response, lease->Call("attach", json{{"name", name}}, nullptr, &segment_fd));
  auto ids = Decode("attach", [&] {
    const json& c = response.at("checkpoint");
    return std::make_pair(c.at("shm_name").get<std::string>(), c.value("segment_id", std::string()));
  });
  if (!ids.ok()) return ids.status();
  const auto& [shm_name, segment_id] = *ids;
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
  return std::unique_ptr<Checkpoint>(new Checkpoint(name, socket_path_, std::move(lease), std::move(segment)));
}

Result<std::string> Client::Rendezvous(const std::string& job, int rank, int world, const std::string& value,
                                       double timeout_s) {
  // A connection of its own: a wait must not hold the shared connection's mutex (rank 0
  // may be another thread of this process, calling through this same Client). There is
  // no client-side read timeout; the daemon bounds the wait by timeout_s.
  CKPT_ASSIGN_OR_RETURN(auto connection, DaemonConnection::Open(socket_path_));
  json fields{{"job", job}, {"rank", rank}, {"world", world}, {"timeout_s", timeout_s}};
  if (rank == 0 || !value.empty()) fields["value"] = HexEncode(value);
  CKPT_ASSIGN_OR_RETURN(json response, connection->Call("rendezvous", std::move(fields)));
  auto hex = Decode("rendezvous", [&] { return response.at("value").get<std::string>(); });
  if (!hex.ok()) return hex.status();
  auto bytes = HexDecode(*hex);
  if (!bytes.ok()) return Corrupt("malformed rendezvous response from ckptd: " + bytes.status().message());
  return bytes;
}

}  // namespace ckpt
