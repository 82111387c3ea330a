// RequestHandler: executes the requests of one client connection against the catalog.
// One handler per connection; it remembers that connection's attachments and releases
// them when destroyed (the client closed the connection or died).
#pragma once

#include <atomic>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "ckpt/status.h"
#include "common/unique_fd.h"
#include "daemon/access_policy.h"
#include "daemon/catalog.h"
#include "daemon/model_roots.h"
#include "daemon/rendezvous_table.h"
#include "daemon/server.h"
#include "shm/segment_directory.h"

namespace ckpt::daemon {

struct DaemonContext {
  const ServerOptions* options;
  Catalog* catalog;
  const std::atomic<bool>* stopping;  // cancels loads in progress
  int64_t started_unix_s;
  std::atomic<int>* connection_count;
  const AccessPolicy* access;
  const ModelRoots* roots;
  DaemonCounters* counters;
  RendezvousTable* rendezvous;
  const shm::SegmentDirectory* segments;  // where loads create their segments
};

class RequestHandler {
 public:
  // `peer` and `role` are those of the connection's client (see AccessPolicy).
  RequestHandler(DaemonContext context, int fd, PeerCredentials peer, Role role)
      : ctx_(context), fd_(fd), peer_(peer), role_(role) {}
  ~RequestHandler();
  RequestHandler(const RequestHandler&) = delete;
  RequestHandler& operator=(const RequestHandler&) = delete;

  // Executes one request and returns its response (never throws). May write progress
  // event frames to the connection before returning.
  nlohmann::json Handle(const nlohmann::json& request);
  // The descriptor to pass with the response Handle() just returned (an attach's
  // read-only segment), or an invalid one.
  UniqueFd TakeResponseFd() { return std::move(response_fd_); }
  // {"text": metrics in the Prometheus text format}, as the "metrics" op answers.
  nlohmann::json Metrics() const;
  // True while this connection holds an attachment (its lease must not time out).
  bool holds_attachments() const { return !attachments_.empty(); }

 private:
  Result<nlohmann::json> Dispatch(const nlohmann::json& request);
  Result<nlohmann::json> Load(const nlohmann::json& request);
  Result<nlohmann::json> Evict(const nlohmann::json& request);
  Result<nlohmann::json> Attach(const nlohmann::json& request);
  Result<nlohmann::json> Info(const nlohmann::json& request);
  // Re-hashes a published checkpoint's tensors against its index checksums. OK with
  // "passed": false and the first mismatching tensors when bytes differ; NotFound if unknown.
  Result<nlohmann::json> Verify(const nlohmann::json& request);
  // Rank 0 publishes a job's hex "value" (answered at once with it); the other ranks wait
  // up to "timeout_s" for it. See RendezvousTable and docs/architecture.md.
  Result<nlohmann::json> Rendezvous(const nlohmann::json& request);
  nlohmann::json List() const;
  nlohmann::json DaemonStatus() const;
  Status Require(Role needed, const std::string& op) const;

  DaemonContext ctx_;
  int fd_;
  PeerCredentials peer_;
  Role role_;
  UniqueFd response_fd_;
  std::vector<std::pair<std::string, uint64_t>> attachments_;  // (name, generation)
};

// Checks a checkpoint name: 1 to 100 bytes of [A-Za-z0-9_.-], not starting with '.'.
Status ValidateCheckpointName(const std::string& name);
// Checks a rendezvous job name: 1 to 200 bytes of [A-Za-z0-9_.:-].
Status ValidateJobName(const std::string& job);
// The longest rendezvous value, in hex characters (4096 bytes).
inline constexpr size_t kMaxRendezvousHexChars = 8192;
// The default name for a checkpoint at `path`: its file name without the extension, or
// the folder's name for a model folder or a file that names one (*.index.json,
// model.safetensors, pytorch_model.bin), with characters outside the allowed set
// replaced by '_'.
std::string DefaultCheckpointName(const std::string& path);
// The JSON summary of a catalog entry, as list, load and status report it.
nlohmann::json EntryToJson(const CatalogEntry& entry);

}  // namespace ckpt::daemon
