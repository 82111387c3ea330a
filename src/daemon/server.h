// Server: ckptd's control plane. Listens on a Unix socket, admits each connection by its
// peer's credentials (ConnectionLimits: no role, no slot), serves it on its own thread,
// loads checkpoints into shared memory and tracks attachments.
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
#include "daemon/generation_store.h"
#include "daemon/model_roots.h"
#include "daemon/rendezvous_table.h"
#include "daemon/ensure_table.h"
#include "daemon/write_sessions.h"
#include "remote/remote_options.h"
#include "shm/segment_directory.h"

namespace ckpt::daemon {

struct ServerOptions {
  std::string socket_path = "/run/ckptd/ckptd.sock";
  std::string shm_prefix = "ckpt";  // [A-Za-z0-9_-]+; see segment_location.h
  std::string segment_dir;          // a directory only root or ckptd can create; empty: /dev/shm/<prefix>.<random>
  std::string state_dir = "/var/lib/ckptd";  // the generation high-water mark (GenerationStore)
  uint32_t socket_mode = 0660;
  uint32_t shm_mode = 0640;       // rw for the owner, at most r for group/others; group: reader group
  int load_threads = 8;
  int max_connections = 1024;            // slots for all callers together
  int max_connections_per_uid = 256;     // slots one uid may hold
  int admin_reserved_connections = 8;    // more slots for admins when the others are taken
  double frame_timeout_s = 30;           // a request must arrive whole, a response be taken, within this
  double idle_timeout_s = 60;            // a connection without an attachment idle this long is closed
  int rendezvous_per_uid = 64;           // live rendezvous entries one uid may hold
  bool cleanup_on_exit = false;  // unlink every segment (and the directory, if ckptd made it) on Stop
  uint64_t memory_budget_bytes = 0;      // 0: no budget (only /dev/shm's size limits loads)
  // Per-uid quotas for callers without the admin role (daemon/ownership.h); 0: no limit.
  uint64_t max_shm_bytes_per_uid = 0;    // main.cc's default: half the memory budget
  uint64_t max_segments_per_uid = 256;   // published, retired and reserved generations
  uint64_t max_writes_per_uid = 32;      // concurrent writes (sessions)
  double write_idle_timeout_s = 120;     // a write no part feeds for this long fails and frees its memory
  std::vector<std::string> model_roots;  // empty: loads from any absolute path
  // Most bytes in shared memory per byte of checkpoint file a load may take without an
  // admin's "allow_expansion" (see format::CheckExpansion); <= 0: no limit.
  double max_expansion = 16.0;
  std::string admin_group;               // may load and evict (besides root)
  std::string reader_group;              // may attach, list, ...; empty: anyone connecting
  std::string writer_group;              // may write (publish) generations, and read; empty: admins only
  std::string metrics_file;              // Prometheus text written here periodically (if set)
  int metrics_interval_s = 15;
  uint32_t metrics_file_mode = 0644;     // readable by a node-exporter textfile collector
  std::string metrics_file_group;        // group of the metrics file; empty: the daemon's
  // Remote sources (s3://, https://): disabled unless remote.allow names prefixes
  // (docs/remote-sources.md). Credentials are not here: the daemon's environment and files.
  remote::RemoteOptions remote;
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
  std::atomic<uint64_t> loads_cancelled{0};
  std::atomic<uint64_t> connections_no_role{0};
  std::atomic<uint64_t> thread_start_failures{0};
  std::atomic<uint64_t> idle_closed{0};
  std::atomic<uint64_t> frame_timeouts{0};
};

struct DaemonContext;
class ConnectionLimits;

class Server {
 public:
  // Validates options, opens the state directory and the segment directory (see
  // segment_location.h), binds the socket and adopts the segments an earlier daemon left
  // (see segment_adoption.h). A segment directory it created is removed again (if empty)
  // when a later step fails. Errors: InvalidArgument for bad options; FailedPrecondition
  // for a segment or state directory that is not safe to use (another owner, a symlink, a
  // segment-dir others could create first, ...) or in use by another daemon;
  // AlreadyExists if another daemon serves the socket; IoError.
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
    PeerCredentials peer;
    Role role = Role::kNone;
    std::thread thread;
    std::atomic<bool> done{false};
  };

  Server(ServerOptions options, std::unique_ptr<shm::SegmentDirectory> segments,
         std::unique_ptr<GenerationStore> generations);
  // Admits or refuses a connection just accepted (in the accept loop; never blocks).
  void Admit(UniqueFd client);
  DaemonContext Context();
  // The steps of Create after the directories are open.
  Status Start();
  Status AdoptExistingSegments();
  void Serve(Connection* connection);
  void ReapFinishedConnections();
  // Writes the metrics to options_.metrics_file (a temporary file with metrics_file_mode
  // and metrics_gid_, then rename).
  void WriteMetricsFile();
  // Sends systemd a STATUS= line (checkpoints, memory, connections) when it changed.
  void NotifyStatus();
  std::string last_status_;

  ServerOptions options_;
  std::unique_ptr<shm::SegmentDirectory> segments_;  // before catalog_, which uses them
  std::unique_ptr<GenerationStore> generations_;
  Catalog catalog_;
  RendezvousTable rendezvous_;  // blobs ranks of a job exchange (NCCL unique ids)
  EnsureTable ensures_;         // ensure loads in progress
  std::unique_ptr<WriteSessions> writes_;  // generations being written by processes
  std::unique_ptr<ConnectionLimits> limits_;
  std::unique_ptr<AccessPolicy> access_;
  std::unique_ptr<ModelRoots> roots_;
  std::optional<gid_t> metrics_gid_;  // metrics_file_group resolved; nullopt: the daemon's group
  DaemonCounters counters_;
  UniqueFd listen_fd_;
  UniqueFd wake_fd_;  // eventfd that wakes Run() for Stop()
  UniqueFd spare_fd_;  // /dev/null, given up to refuse a connection when out of descriptors
  // accept() failed with EMFILE/ENFILE: answers one waiting connection resource_exhausted.
  void RefuseForDescriptors();
  std::atomic<bool> stopping_{false};
  std::mutex connections_mu_;
  std::list<std::unique_ptr<Connection>> connections_;
  int64_t started_unix_s_ = 0;
};

}  // namespace ckpt::daemon
