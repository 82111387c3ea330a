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

// The structs below are what the daemon answers, as this API returns them. The wire has
// structs of its own (src/protocol/messages.h, whose JSON is also what `ckptctl --json`
// prints); the client maps between the two in one place, src/client/wire_mapping.h, so a
// field added here changes the wire only when it is added there too.

// One checkpoint generation as the daemon reports it.
struct CheckpointSummary {
  std::string name;
  uint64_t generation = 0;
  std::string shm_name;        // the segment's file name inside the daemon's segment directory
  std::string segment_id;      // the generation's random identity (32 hex characters); empty if not reported
  std::string source;          // path it was loaded from
  std::string format;          // "safetensors", ...
  uint64_t segment_bytes = 0;  // shared memory it occupies
  uint64_t data_bytes = 0;     // sum of tensor sizes
  uint64_t tensor_count = 0;
  double load_seconds = 0;
  int64_t loaded_unix_s = 0;
  uint32_t attached = 0;       // attachments at the time of the call
  std::vector<int64_t> attached_pids;
  // The page size the segment is sized for (4096, or 2 MiB on a huge tmpfs); 0 if not reported.
  uint64_t page_bytes = 0;
  // Bytes the daemon's loader found mapped with huge (PMD) entries once the segment was
  // loaded; -1 if not known (a segment adopted after a daemon restart).
  int64_t huge_bytes = -1;
  // The identity of the files this generation was loaded from (see Client::Ensure), 16 hex
  // characters; empty for a generation adopted after a daemon restart or not reported.
  std::string source_fingerprint;
  // Who owns the name now: the uid that loaded or published this generation, its user
  // name ("" if it has none or was not reported) and whether it had the admin role. Only
  // the owner or an admin may replace or evict it (docs/operations.md, *Ownership*).
  uint32_t owner_uid = 0;
  std::string owner_user;
  bool owner_admin = false;
};

// The published checkpoints and the names of loads in progress.
struct CheckpointList {
  std::vector<CheckpointSummary> checkpoints;
  std::vector<std::string> loading;
};

// A side file kept with a checkpoint (config.json, generation_config.json, ...).
struct SideFileInfo {
  std::string name;
  uint64_t bytes = 0;
};

// A checkpoint and its tensor index (with each tensor's XXH3-64 checksum).
struct CheckpointInfo {
  CheckpointSummary checkpoint;
  std::vector<TensorInfo> tensors;
  // The side files stored with it, in stored order (config.json, which plan "auto" and
  // ckpt.transformers.load_model read, among them when it was kept); empty if none.
  std::vector<SideFileInfo> side_files;
};

// What a load published, and the checkpoints it evicted to fit the memory budget.
struct LoadResult {
  CheckpointSummary checkpoint;
  std::vector<std::string> evicted;
};

// What Client::Ensure found or did. `action` is one of:
//   "loaded"   this call loaded the checkpoint (it was absent);
//   "reloaded" this call loaded a new generation because the source had changed;
//   "joined"   another caller's load of the same path was in progress: this call waited
//              for it and got its result;
//   "current"  the checkpoint was loaded from that path and its source is unchanged.
// `evicted` names what the budget evicted to make room (only for "loaded"/"reloaded"/"joined").
struct EnsureResult {
  CheckpointSummary checkpoint;
  std::vector<std::string> evicted;
  std::string action;
};

// A daemon-side re-hash of a checkpoint's tensors against its index checksums.
struct VerifyResult {
  std::string name;
  uint64_t generation = 0;
  bool passed = false;
  uint64_t tensors = 0;
  uint64_t bytes = 0;
  double seconds = 0;
  uint64_t mismatch_count = 0;
  std::vector<std::string> mismatched;  // the first mismatching tensors' names
};

struct EvictionCounters {
  uint64_t by_request = 0;
  uint64_t for_budget = 0;
  uint64_t replaced = 0;
};

struct DaemonStatus {
  std::string version;
  int protocol = 0;
  int64_t pid = 0;
  int64_t uptime_s = 0;
  std::string socket;
  std::string shm_prefix;
  std::string segment_dir;  // where the segments are (empty from an older daemon)
  uint64_t checkpoints = 0;
  uint64_t loading = 0;
  uint64_t shm_bytes = 0;
  uint64_t memory_budget_bytes = 0;  // 0: no budget
  uint64_t memory_used_bytes = 0;
  uint64_t attached = 0;
  int64_t connections = 0;
  int64_t max_connections = 0;
  int64_t max_connections_per_uid = 0;
  int64_t admin_reserved_connections = 0;
  std::vector<std::string> model_roots;
  EvictionCounters evictions;
  std::string your_role;  // "admin", "writer", "reader" (a caller with no role is refused at connect)
  // The caller's uid, what it holds, and its per-uid limits (0: none; admins are exempt).
  uint32_t your_uid = 0;
  uint64_t your_shm_bytes = 0;
  uint64_t your_segments = 0;
  uint64_t your_writes = 0;
  uint64_t max_shm_bytes_per_uid = 0;
  uint64_t max_segments_per_uid = 0;
  uint64_t max_writes_per_uid = 0;
  std::vector<CheckpointSummary> checkpoint_list;
  std::vector<CheckpointSummary> retired;  // replaced or force-evicted generations still attached
  // What the segment directory's file system gives new segments, e.g. "tmpfs
  // huge=within_size: 2 MiB pages" (detected at start), and that page size in bytes.
  std::string segment_pages;
  uint64_t segment_page_bytes = 0;
};

// (bytes loaded so far, bytes in total)
using ProgressCallback = std::function<void(uint64_t, uint64_t)>;
// Like ProgressCallback; returning false cancels the load (see Client::Load).
using CancellableProgress = std::function<bool(uint64_t done, uint64_t total)>;

struct LoadOptions {
  std::string name;              // default: derived from the path by the daemon
  bool replace = false;          // publish a new generation under an existing name
  bool allow_expansion = false;  // admit a checkpoint whose shared-memory size is far above its file size
  // Called about every 100 ms while the daemon loads (on the calling thread). Returning
  // false, or throwing, cancels the load. May be empty.
  CancellableProgress progress;
};

struct EnsureOptions {
  std::string name;              // default: derived from the path by the daemon
  bool allow_expansion = false;  // as LoadOptions::allow_expansion
  // Called about every 100 ms while a load this call runs or waits for is in progress.
  // Returning false, or throwing, withdraws this caller: it gets Cancelled, and the load
  // is cancelled only if no other caller is still waiting for it. May be empty.
  CancellableProgress progress;
};

struct EvictOptions {
  bool force = false;  // evict even while attached (attached processes keep their mapping)
  double wait_s = 0;   // wait up to this long (0 to 86400 s) for the last attachment to go
};

// A checkpoint generation mapped read-only into this process. While it lives, the daemon
// counts it as attached and its bytes stay valid, even if the checkpoint is evicted.
// If the daemon restarts meanwhile, a background thread re-registers the attachment with
// the new daemon as soon as it answers (if that same segment, by generation and segment
// id, is still current there; never onto other content under the same name); the mapping
// stays valid either way.
// Thread-safe: all methods are const and the mapping is immutable.
class Checkpoint {
 public:
  ~Checkpoint();
  Checkpoint(const Checkpoint&) = delete;
  Checkpoint& operator=(const Checkpoint&) = delete;

  const std::string& name() const;
  uint64_t generation() const;
  // The owner the daemon recorded in the segment's header for this generation (only the
  // daemon writes it): the uid that loaded or published it, and whether it had the admin
  // role. For a segment of an older ckptd, which recorded none: kUnknownOwnerUid and true.
  // What the serving cache checks before it trusts an entry (python/ckpt/serving_cache.py).
  static constexpr uint32_t kUnknownOwnerUid = 0xffffffffu;
  uint32_t owner_uid() const;
  bool owner_admin() const;
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
  // Start of tensor `name`'s bytes in this process's copy-on-write view of the checkpoint
  // (what zero-copy CPU tensors point into; like torch.load(mmap=True)): a second,
  // private mapping (MAP_PRIVATE, PROT_READ|PROT_WRITE) of the same read-only descriptor,
  // made on the first call. Reads share the checkpoint's one copy; the first write to a
  // page gives this process a private copy of that page (4 KiB, or the huge page), charged
  // to it as anonymous memory (a process that writes its whole view pays the whole
  // checkpoint again), and never reaches the shared object, which stays read-only for
  // every process. Everything else (Tensor, TensorData, CopyShard, Verify, the CUDA copy
  // engine) reads the shared mapping, so it always sees the checkpoint's own bytes, never
  // this process's writes. Valid while this Checkpoint lives. NotFound for an unknown
  // tensor; IoError if the private mapping cannot be made (the error says why, e.g. no
  // huge pages left to reserve on hugetlbfs). Thread-safe.
  Result<std::byte*> PrivateTensorData(const std::string& name) const;
  // Bytes of this process's own memory that writes into the copy-on-write view cost so
  // far (the "Anonymous" pages of that mapping in /proc/self/smaps): 0 before the view is
  // made or while it is only read. IoError if smaps cannot be read. Thread-safe.
  Result<uint64_t> PrivateBytes() const;
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
  class PrivateView;
  // Takes ownership of `segment_fd` (the daemon's read-only descriptor of the segment,
  // kept for the copy-on-write view; -1 if none).
  Checkpoint(std::string name, std::string socket_path, std::unique_ptr<protocol::DaemonConnection> lease,
             std::unique_ptr<shm::SegmentReader> segment, int segment_fd);
  Status StartLeaseKeeper();
  std::string name_;
  std::unique_ptr<shm::SegmentReader> segment_;
  std::unique_ptr<PrivateView> private_;  // the copy-on-write mapping, made on first use
  std::unique_ptr<LeaseKeeper> keeper_;  // holds the lease (connection) open while attached
};

// A connection to ckptd. Thread-safe: calls are serialised on the connection.
// The daemon closes connections that stay idle without an attachment (60 s by default)
// and may restart: before sending, a call notices a connection the daemon closed and
// connects again, so no request is lost to either. If the connection breaks after a
// request was sent, a call that is safe to repeat reconnects once and is retried; Load
// then reports Unavailable (it may have run).
class Client {
 public:
  // $CKPTD_SOCKET if set, else "/run/ckptd/ckptd.sock".
  static std::string DefaultSocketPath();
  // Unavailable if no daemon listens at `socket_path`; PermissionDenied if the daemon
  // refused this user at connect (no role); ResourceExhausted if it has no slot free.
  static Result<std::unique_ptr<Client>> Connect(const std::string& socket_path = DefaultSocketPath());
  // The socket this client connects to (e.g. for a Writer, include/ckpt/writer.h).
  const std::string& socket_path() const { return socket_path_; }
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // Asks the daemon to load the checkpoint file at `path` (relative paths are taken from
  // this process's working directory). Blocks until it is published or failed.
  // Cancellation: when `options.progress` returns false, the daemon is told to cancel
  // and Load returns Cancelled with nothing published (unless the daemon had already
  // published it: then the summary is returned). When `options.progress` throws, the
  // load is cancelled the same way and the exception is rethrown once the connection is
  // back in step. Either way the next call on this Client gets its own answer.
  Result<LoadResult> Load(const std::string& path, const LoadOptions& options);
  // Load with a name and a progress callback that cannot cancel.
  Result<CheckpointSummary> Load(const std::string& path, const std::string& name = "",
                                 const ProgressCallback& progress = nullptr);
  // Makes sure checkpoint `name` (default: derived from the path) holds the current
  // content of `path`, loading it only when needed (admin role, like Load):
  //  - absent: loads it ("loaded");
  //  - loaded from `path` and its source fingerprint (device, inode, size, mtime and
  //    ctime of every file the load read, and the side files' bytes) still matches:
  //    returns its summary ("current"), reading no tensor bytes;
  //  - loaded from `path` but the files changed (or the generation was adopted after a
  //    daemon restart, so its fingerprint is unknown): loads a new generation that
  //    replaces it ("reloaded"; processes attached to the old one keep it);
  //  - loaded, or being ensured, from another path: FailedPrecondition, nothing changes
  //    (evict it, or `load --replace`, to move a name to another file).
  // Concurrent calls for one name (N ranks at once) share one load: the first caller runs
  // it, the others wait for it ("joined") and get the same generation, or the same error
  // if it fails. A caller that disconnects or cancels withdraws alone; the load goes on
  // while any caller still waits for it. Errors: those of Load; Cancelled for a caller
  // that withdrew; AlreadyExists if a plain Load of that name is in progress.
  Result<EnsureResult> Ensure(const std::string& path, const EnsureOptions& options = {});
  // Every call below that names a checkpoint (Evict, Info, GetInfo, Verify, Attach)
  // answers NotFound for a name that is neither published nor loading with the closest
  // names that are in its message: "no checkpoint named 'gpt-neox' (did you mean
  // 'gpt-neo'?)" (SimilarNames).

  // Removes `name` from the daemon and returns what was evicted. NotFound if unknown;
  // FailedPrecondition if attached and !force (after waiting wait_s, if set).
  Result<CheckpointSummary> Evict(const std::string& name, const EvictOptions& options);
  // Evict with no wait. With force, attached processes keep their mapping until they detach.
  Status Evict(const std::string& name, bool force = false);
  Result<std::vector<CheckpointSummary>> List();
  // List with the names of loads in progress.
  Result<CheckpointList> ListAll();
  // The published or loading checkpoint names closest to `name` (common/suggest.h: a few
  // edits away, or a prefix), nearest first, at most 3: what "did you mean" offers. Empty
  // when `name` itself is published or loading, none is close, or the list fails.
  std::vector<std::string> SimilarNames(const std::string& name);
  // The tensor index of `name`. NotFound if it is not loaded.
  Result<std::vector<TensorInfo>> Info(const std::string& name);
  // The summary and tensor index of `name`. NotFound if it is not loaded.
  Result<CheckpointInfo> GetInfo(const std::string& name);
  Result<DaemonStatus> GetStatus();
  // Re-hashes `name`'s shared memory in the daemon (admin only; reads it all). OK with
  // passed == false on a mismatch; NotFound if unknown.
  Result<VerifyResult> Verify(const std::string& name);
  // The daemon's metrics in the Prometheus text format.
  Result<std::string> Metrics();
  // Attaches to the current generation of `name` over a connection of its own, which
  // stays open as the attachment's lease. The daemon passes a read-only descriptor of the
  // segment over the socket (SCM_RIGHTS), which is mapped PROT_READ: the process needs no
  // access to /dev/shm and cannot write into the checkpoint. NotFound if it is not loaded,
  // PermissionDenied if this user may not read checkpoints, Corrupt if the daemon passes
  // no descriptor or one whose header does not match its answer (name, segment id).
  Result<std::unique_ptr<Checkpoint>> Attach(const std::string& name);
  // Exchanges a small blob (an NCCL unique id) among the `world` ranks of job `job` on
  // this node. Rank 0 passes `value` (1 to 4096 bytes, any bytes) and gets it back at
  // once; if the job was published before (a crashed run), it is replaced and ranks still
  // waiting get the new value. Ranks 1..world-1 pass an empty `value` and wait up to
  // `timeout_s` (0 to 3600) for rank 0's. Uses a connection of its own, so other calls
  // on this Client (and other ranks' calls from this process) are not held up meanwhile.
  // Entries belong to the uid that published them: only that uid's ranks see or replace
  // them (jobs of other users with the same name are separate).
  // Errors: InvalidArgument (bad job name, rank, world or value; the job was published
  // for another world), DeadlineExceeded (no rank 0 within timeout_s), PermissionDenied
  // (the timeout passed and only another user published a job of that name),
  // Unavailable (no daemon, or it stopped meanwhile), ResourceExhausted (too many jobs in
  // progress, for this uid or in all).
  // `job` must be unique to the run (e.g. include a launch id): a rank that comes after
  // its job's entry was fully fetched waits for a new publish, and one that comes before
  // rank 0 of a new run may get an earlier run's value still unfetched.
  Result<std::string> Rendezvous(const std::string& job, int rank, int world, const std::string& value,
                                 double timeout_s = 60.0);

 private:
  Client(std::string socket_path, std::unique_ptr<protocol::DaemonConnection> connection);
  // `status` with " (did you mean ...?)" appended when it is NotFound and SimilarNames(name)
  // has any; otherwise `status` as it is.
  Status WithSimilarNames(Status status, const std::string& name);
  std::string socket_path_;
  std::unique_ptr<protocol::DaemonConnection> connection_;
};

}  // namespace ckpt
