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
#include "daemon/catalog.h"
#include "daemon/server.h"

namespace ckpt::daemon {

struct DaemonContext {
  const ServerOptions* options;
  Catalog* catalog;
  const std::atomic<bool>* stopping;  // cancels loads in progress
  int64_t started_unix_s;
  std::atomic<int>* connection_count;
};

class RequestHandler {
 public:
  RequestHandler(DaemonContext context, int fd) : ctx_(context), fd_(fd) {}
  ~RequestHandler();
  RequestHandler(const RequestHandler&) = delete;
  RequestHandler& operator=(const RequestHandler&) = delete;

  // Executes one request and returns its response (never throws). May write progress
  // event frames to the connection before returning.
  nlohmann::json Handle(const nlohmann::json& request);

 private:
  Result<nlohmann::json> Dispatch(const nlohmann::json& request);
  Result<nlohmann::json> Load(const nlohmann::json& request);
  Result<nlohmann::json> Evict(const nlohmann::json& request);
  Result<nlohmann::json> Attach(const nlohmann::json& request);
  Result<nlohmann::json> Info(const nlohmann::json& request);
  // Re-hashes a published checkpoint's tensors against its index checksums. OK with
  // "passed": false and the first mismatching tensors when bytes differ; NotFound if unknown.
  Result<nlohmann::json> Verify(const nlohmann::json& request);
  nlohmann::json List() const;
  nlohmann::json DaemonStatus() const;

  DaemonContext ctx_;
  int fd_;
  std::vector<std::pair<std::string, uint64_t>> attachments_;  // (name, generation)
};

// Checks a checkpoint name: 1 to 100 bytes of [A-Za-z0-9_.-], not starting with '.'.
Status ValidateCheckpointName(const std::string& name);
// The default name for a checkpoint at `path`: its file name without the extension, or
// the folder's name for a model folder or a file that names one (*.index.json,
// model.safetensors, pytorch_model.bin), with characters outside the allowed set
// replaced by '_'.
std::string DefaultCheckpointName(const std::string& path);
// The JSON summary of a catalog entry, as list, load and status report it.
nlohmann::json EntryToJson(const CatalogEntry& entry);

}  // namespace ckpt::daemon
