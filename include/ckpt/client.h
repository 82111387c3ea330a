// libckptclient: talk to the node's ckptd and attach to its checkpoints read-only.
//
//   auto client = ckpt::Client::Connect();                 // $CKPTD_SOCKET or the default
//   auto ckpt = (*client)->Attach("gpt-neo-2.7B");          // maps the segment read-only
//   auto shard = (*ckpt)->PlanShard("h.0.attn.q_proj.weight", ShardSpec::Split(0, rank, world));
//   (*ckpt)->CopyShard("h.0.attn.q_proj.weight", spec, dst, dst_size);
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt/shard.h"
#include "ckpt/status.h"
#include "ckpt/tensor.h"

namespace ckpt {

namespace protocol {
class DaemonConnection;
}
namespace shm {
class SegmentReader;
}

// One checkpoint as the daemon reports it.
struct CheckpointSummary {
  std::string name;
  uint64_t generation = 0;
  std::string source;          // path it was loaded from
  std::string format;          // "safetensors", ...
  uint64_t segment_bytes = 0;  // shared memory it occupies
  uint64_t data_bytes = 0;     // sum of tensor sizes
  uint64_t tensor_count = 0;
  double load_seconds = 0;
  int64_t loaded_unix_s = 0;
  uint32_t attached = 0;       // attachments at the time of the call
};

struct DaemonStatus {
  std::string version;
  int protocol = 0;
  int64_t pid = 0;
  int64_t uptime_s = 0;
  std::string shm_prefix;
  uint64_t checkpoints = 0;
  uint64_t loading = 0;
  uint64_t shm_bytes = 0;
  uint64_t attached = 0;
  int64_t connections = 0;
};

// (bytes loaded so far, bytes in total)
using ProgressCallback = std::function<void(uint64_t, uint64_t)>;

// A checkpoint generation mapped read-only into this process. While it lives, the daemon
// counts it as attached and its bytes stay valid, even if the checkpoint is evicted.
// If the daemon restarts meanwhile, a background thread re-registers the attachment with
// the new daemon as soon as it answers (if that generation is still current there); the
// mapping stays valid either way.
// Thread-safe: all methods are const and the mapping is immutable.
class Checkpoint {
 public:
  ~Checkpoint();
  Checkpoint(const Checkpoint&) = delete;
  Checkpoint& operator=(const Checkpoint&) = delete;

  const std::string& name() const;
  uint64_t generation() const;
  uint64_t mapped_bytes() const;
  const std::vector<TensorInfo>& tensors() const;

  // Zero-copy view of tensor `name`. NotFound if absent.
  Result<TensorView> Tensor(const std::string& name) const;
  // The shard of tensor `name` that `spec` selects (see ckpt::PlanShard).
  Result<ShardLayout> PlanShard(const std::string& name, const ShardSpec& spec) const;
  // Copies that shard into dst (at least PlanShard(...).nbytes bytes).
  Status CopyShard(const std::string& name, const ShardSpec& spec, void* dst, size_t dst_size) const;
  // Start of tensor `name`'s bytes in the mapping, for use with a ShardLayout's regions.
  Result<const std::byte*> TensorData(const std::string& name) const;
  // Recomputes every tensor's checksum against the index. Corrupt names the first
  // mismatch. Reads the whole checkpoint.
  Status Verify() const;

  // Side files the daemon kept from the checkpoint's folder (config.json,
  // generation_config.json, ...; see docs/formats.md), validated at attach. The bytes of
  // `name`, byte for byte as they were in the file, valid while this Checkpoint lives;
  // NotFound if it was not kept. Thread-safe.
  Result<std::string_view> SideFile(const std::string& name) const;
  // Names of the side files kept, in stored order (empty if none). Thread-safe.
  std::vector<std::string> side_files() const;
  // The checkpoint's metadata: a single safetensors file's "__metadata__" or a sharded
  // index's "metadata" (non-string values as JSON text); empty if none. Thread-safe.
  const std::map<std::string, std::string>& metadata() const;

 private:
  friend class Client;
  class LeaseKeeper;
  Checkpoint(std::string name, std::string socket_path, std::unique_ptr<protocol::DaemonConnection> lease,
             std::unique_ptr<shm::SegmentReader> segment);
  std::string name_;
  std::unique_ptr<shm::SegmentReader> segment_;
  std::unique_ptr<LeaseKeeper> keeper_;  // holds the lease (connection) open while attached
};

// A connection to ckptd. Thread-safe: calls are serialised on the connection.
// If the daemon restarted since the last call (the connection broke), a call reconnects
// once and is retried, except Load, which reports Unavailable (it may have run).
class Client {
 public:
  // $CKPTD_SOCKET if set, else "/run/ckptd/ckptd.sock".
  static std::string DefaultSocketPath();
  // Unavailable if no daemon listens at `socket_path`.
  static Result<std::unique_ptr<Client>> Connect(const std::string& socket_path = DefaultSocketPath());
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // Asks the daemon to load the checkpoint file at `path` (relative paths are taken from
  // this process's working directory) under `name` (default: the file name without its
  // extension). Blocks until it is published or failed; `progress` is called meanwhile.
  Result<CheckpointSummary> Load(const std::string& path, const std::string& name = "",
                                 const ProgressCallback& progress = nullptr);
  // Removes `name` from the daemon. FailedPrecondition if attached and !force; with
  // force, attached processes keep their mapping until they detach.
  Status Evict(const std::string& name, bool force = false);
  Result<std::vector<CheckpointSummary>> List();
  Result<std::vector<TensorInfo>> Info(const std::string& name);
  Result<DaemonStatus> GetStatus();
  // Attaches to the current generation of `name` over a connection of its own, which
  // stays open as the attachment's lease. The daemon passes a read-only descriptor of the
  // segment over the socket (SCM_RIGHTS), which is mapped PROT_READ: the process needs no
  // access to /dev/shm and cannot write into the checkpoint. NotFound if it is not loaded,
  // PermissionDenied if this user may not read checkpoints.
  Result<std::unique_ptr<Checkpoint>> Attach(const std::string& name);
  // Exchanges a small blob (an NCCL unique id) among the `world` ranks of job `job` on
  // this node. Rank 0 passes `value` (1 to 4096 bytes, any bytes) and gets it back at
  // once; if the job was published before (a crashed run), it is replaced and ranks still
  // waiting get the new value. Ranks 1..world-1 pass an empty `value` and wait up to
  // `timeout_s` (0 to 3600) for rank 0's. Uses a connection of its own, so other calls
  // on this Client (and other ranks' calls from this process) are not held up meanwhile.
  // Errors: InvalidArgument (bad job name, rank, world or value; the job was published
  // for another world), DeadlineExceeded (no rank 0 within timeout_s), Unavailable (no
  // daemon, or it stopped meanwhile), ResourceExhausted (1024 jobs in progress).
  // `job` must be unique to the run (e.g. include a launch id): a rank that comes after
  // its job's entry was fully fetched waits for a new publish, and one that comes before
  // rank 0 of a new run may get an earlier run's value still unfetched.
  Result<std::string> Rendezvous(const std::string& job, int rank, int world, const std::string& value,
                                 double timeout_s = 60.0);

 private:
  Client(std::string socket_path, std::unique_ptr<protocol::DaemonConnection> connection);
  std::string socket_path_;
  std::unique_ptr<protocol::DaemonConnection> connection_;
};

}  // namespace ckpt
