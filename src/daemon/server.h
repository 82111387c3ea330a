// Server: ckptd's control plane. Listens on a Unix socket, serves each connection on its
// own thread, loads checkpoints into shared memory and tracks attachments.
#pragma once

#include <atomic>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "ckpt/status.h"
#include "common/unique_fd.h"
#include <vector>

#include "daemon/access_policy.h"
#include "daemon/catalog.h"
#include "daemon/model_roots.h"
#include "daemon/rendezvous_table.h"

namespace ckpt::daemon {

struct ServerOptions {
  std::string socket_path = "/run/ckptd/ckptd.sock";
  std::string shm_prefix = "ckpt";  // [A-Za-z0-9_-]+; segments are <prefix>.<name>.<gen>
  uint32_t socket_mode = 0660;
  uint32_t shm_mode = 0640;       // segments are group-owned by the reader group, if any
  int load_threads = 8;
  int max_connections = 1024;
  bool cleanup_on_exit = false;  // unlink every segment on Stop (otherwise re-adopted later)
  uint64_t memory_budget_bytes = 0;      // 0: no budget (only /dev/shm's size limits loads)
  std::vector<std::string> model_roots;  // empty: loads from any absolute path
  // Most bytes in shared memory per byte of checkpoint file a load may take without an
  // admin's "allow_expansion" (see format::CheckExpansion); <= 0: no limit.
  double max_expansion = 16.0;
  std::string admin_group;               // may load and evict (besides root)
  std::string reader_group;              // may attach, list, ...; empty: anyone connecting
  std::string metrics_file;              // Prometheus text written here periodically (if set)
  int metrics_interval_s = 15;
};

// Counters for metrics, updated by request handlers.
struct DaemonCounters {
  std::atomic<uint64_t> requests{0};
  std::atomic<uint64_t> request_errors{0};
  std::atomic<uint64_t> denied{0};
  std::atomic<uint64_t> loads{0};
  std::atomic<uint64_t> load_failures{0};
  std::atomic<uint64_t> loaded_bytes{0};
  std::atomic<uint64_t> attaches{0};
  std::atomic<uint64_t> connections_total{0};
  std::atomic<uint64_t> connections_refused{0};
  std::atomic<uint64_t> bad_frames{0};
  std::atomic<uint64_t> rendezvous{0};
};

// Gives the segment open at `fd` the reader group (if configured) and mode `mode`;
// failures are logged, not fatal.
void SetSegmentOwnership(int fd, const AccessPolicy& access, uint32_t mode);

class Server {
 public:
  // Validates options, adopts complete segments left under the prefix (removing
  // incomplete or corrupt ones) and binds the socket. Errors: InvalidArgument for bad
  // options; AlreadyExists if another daemon serves the socket; IoError.
  static Result<std::unique_ptr<Server>> Create(const ServerOptions& options);
  ~Server();

  // Serves until Stop() is called; then closes every connection, cancels loads in
  // progress and joins all threads before returning.
  void Run();
  // Asks Run() to return. Thread-safe; may be called before Run().
  void Stop();

 private:
  struct Connection {
    UniqueFd fd;
    std::thread thread;
    std::atomic<bool> done{false};
  };

  explicit Server(ServerOptions options)
      : options_(std::move(options)), catalog_(options_.memory_budget_bytes) {}
  Status AdoptExistingSegments();
  void Serve(Connection* connection);
  void ReapFinishedConnections();
  // Writes the metrics to options_.metrics_file (a temporary file, then rename).
  void WriteMetricsFile();
  // Sends systemd a STATUS= line (checkpoints, memory, connections) when it changed.
  void NotifyStatus();
  std::string last_status_;

  ServerOptions options_;
  Catalog catalog_;
  RendezvousTable rendezvous_;  // blobs ranks of a job exchange (NCCL unique ids)
  std::unique_ptr<AccessPolicy> access_;
  std::unique_ptr<ModelRoots> roots_;
  DaemonCounters counters_;
  UniqueFd listen_fd_;
  UniqueFd wake_fd_;  // eventfd that wakes Run() for Stop()
  std::atomic<bool> stopping_{false};
  std::mutex connections_mu_;
  std::list<std::unique_ptr<Connection>> connections_;
  std::atomic<int> connection_count_{0};
  int64_t started_unix_s_ = 0;
};

}  // namespace ckpt::daemon
