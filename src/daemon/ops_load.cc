// The load and ensure ops: check the request, watch the connection for a cancel, and run
// OpenAndPlan (roots check, plan) and LoadAndPublish (segment spec, LoadIntoSegment,
// catalog publish). Ensure shares one load among its concurrent callers (EnsureTable).
#include <fcntl.h>
#include <xxhash.h>

#include <chrono>

#include <spdlog/spdlog.h>

#include "daemon/ops.h"
#include "daemon/policy.h"
#include "format/checkpoint_formats.h"
#include "loader/checkpoint_loader.h"
#include "protocol/messages.h"
#include "protocol/wire.h"
#include "remote/http_reader.h"
#include "remote/remote_plan.h"
#include "remote/remote_url.h"
#include "shm/segment_name.h"
#include "common/checked_math.h"
#include "common/hex.h"
#include "common/progress_throttle.h"
#include "common/thread_pool.h"

namespace ckpt::daemon {

namespace {

// The name a load or ensure of `path` publishes under (`name`, else the file's or the
// remote source's), once `path` is absolute or a URL ckptd fetches and the name valid;
// InvalidArgument (Unsupported for another scheme) otherwise.
Result<std::string> NameOfLoad(const std::string& path, const std::string& name) {
  if (remote::LooksRemote(path)) {
    CKPT_ASSIGN_OR_RETURN(const remote::RemoteUrl url, remote::ParseRemoteUrl(path));
    std::string chosen = name.empty() ? SanitizedCheckpointName(remote::DefaultRemoteName(url)) : name;
    CKPT_RETURN_IF_ERROR(ValidateCheckpointName(chosen));
    return chosen;
  }
  if (path.empty() || path[0] != '/') return InvalidArgument("path must be absolute: '" + path.substr(0, 4096) + "'");
  std::string chosen = name.empty() ? DefaultCheckpointName(path) : name;
  CKPT_RETURN_IF_ERROR(ValidateCheckpointName(chosen));
  return chosen;
}

// A load's plan and, for a remote source, its objects and the client that fetches them.
struct Planned {
  format::LoadPlan plan;
  std::vector<remote::RemoteFile> remote_files;         // parallel to plan.files
  std::shared_ptr<const remote::RemoteClient> client;  // null: local files
};

// Watches a load's connection from the loader's progress ticks: sends progress events
// (if asked) and reads what the client sends meanwhile. A cancel frame, a hang-up, a
// frame that is not a cancel, or a stopping daemon set `cancel`. With a SharedLoad (an
// ensure), the client's cancel or hang-up withdraws this caller from it instead: the
// load's own flag is set once nobody is left (or the daemon stops).
class ConnectionWatch {
 public:
  ConnectionWatch(const DaemonContext& ctx, const Caller& caller, bool send_progress, LoadWatch* out,
                  SharedLoad* shared = nullptr)
      : ctx_(ctx), caller_(caller), send_progress_(send_progress), out_(out), shared_(shared) {}

  // What the loader polls: this connection's flag, or the shared load's.
  const std::atomic<bool>* cancel_flag() const { return shared_ ? shared_->cancel_flag() : &cancel_; }
  bool cancelled_by_client() const { return out_->cancel_consumed || out_->drop_connection; }

  void Tick(uint64_t done, uint64_t total) {
    if (ctx_.stopping->load()) CancelLoad();
    if (caller_.fd < 0 || out_->drop_connection) return;
    if (send_progress_ && !out_->cancel_consumed) {
      // A client that stopped reading does not hold the load up for long.
      Status sent = protocol::WriteFrame(caller_.fd, protocol::Encode(protocol::ProgressEvent{done, total}),
                                         protocol::DeadlineIn(ctx_.options->frame_timeout_s));
      if (!sent.ok()) Hangup("cannot send progress: " + sent.message());
    }
    Poll();
  }

  // Reads a frame the client sent during the load, if any.
  void Poll() {
    if (caller_.fd < 0 || out_->drop_connection || out_->cancel_consumed) return;
    if (!protocol::PeerClosedOrReadable(caller_.fd)) return;
    auto frame = protocol::ReadFrame(caller_.fd, protocol::kMaxRequestBytes, nullptr,
                                     protocol::DeadlineIn(ctx_.options->frame_timeout_s));
    if (!frame.ok()) {
      Hangup(frame.status().message());
      return;
    }
    auto op = protocol::DecodeOp(*frame);
    if (op.ok() && *op == protocol::CancelRequest::kOp) {
      out_->cancel_consumed = true;
      Withdraw();
      return;
    }
    Hangup("a request arrived during a load (only 'cancel' may)");
  }

 private:
  void Hangup(const std::string& why) {
    spdlog::info("{}: {}", shared_ ? "a caller withdraws from an ensure load" : "cancelling a load", why);
    out_->drop_connection = true;
    Withdraw();
  }
  void Withdraw() {
    if (shared_ == nullptr) {
      cancel_.store(true);
    } else if (!withdrawn_) {
      withdrawn_ = true;
      shared_->Withdraw();
    }
  }
  void CancelLoad() {
    if (shared_) shared_->Cancel();
    cancel_.store(true);
  }

  const DaemonContext& ctx_;
  const Caller& caller_;
  const bool send_progress_;
  LoadWatch* out_;
  SharedLoad* const shared_;
  bool withdrawn_ = false;
  std::atomic<bool> cancel_{false};
};

// The identity of every file a plan reads (device, inode, size, mtime and ctime, in plan
// order; for a remote source each object's URL, size and ETag, or Last-Modified without
// one) and the name and bytes of every side file it keeps, hashed with XXH3-64: 16 hex
// characters. A write to a file changes its mtime and ctime (ctime cannot be set back from
// user space), a replace by rename changes its inode, a replaced object its ETag: each
// gives another fingerprint.
std::string SourceFingerprint(const Planned& planned) {
  const format::LoadPlan& plan = planned.plan;
  std::string text;
  if (planned.client) {
    for (const auto& f : planned.remote_files) text += "r " + f.ref.display + " " + f.identity.Fingerprint() + "\n";
  } else {
    for (const auto& file : plan.files) {
      const FileIdentity& id = file->identity;
      text += "f " + std::to_string(id.dev) + " " + std::to_string(id.ino) + " " + std::to_string(id.size) + " " +
              std::to_string(id.mtime_ns) + " " + std::to_string(id.ctime_ns) + "\n";
    }
  }
  for (const auto& side : plan.side_files) {
    text += "s " + std::to_string(side.name.size()) + " " + side.name + " " + std::to_string(side.bytes.size()) +
            " " + Hex64(XXH3_64bits(side.bytes.data(), side.bytes.size())) + "\n";
  }
  return Hex64(XXH3_64bits(text.data(), text.size()));
}

// Plans the remote source `path` (a URL; NameOfLoad parsed it): refused unless it is
// beneath a --remote-allow prefix; the daemon's own credentials (RemoteClient::Create).
// Fetches headers, an index and side files only.
Result<Planned> PlanRemote(const DaemonContext& ctx, const std::string& path) {
  const remote::RemoteOptions& ro = ctx.options->remote;
  CKPT_ASSIGN_OR_RETURN(const remote::RemoteUrl url, remote::ParseRemoteUrl(path));
  if (ro.allow.empty()) {
    return PermissionDenied("remote sources are disabled on this daemon: it allows none (ckptd --remote-allow "
                            "PREFIX; docs/remote-sources.md), so " + path + " is not fetched");
  }
  if (!remote::RemoteAllowed(path, ro.allow)) {
    return PermissionDenied(path + " is not beneath any --remote-allow prefix of this daemon");
  }
  CKPT_ASSIGN_OR_RETURN(auto client, remote::RemoteClient::Create(ro));
  spdlog::debug("planning {} ({})", path, client->Describe());
  auto allowed = [&ro](const std::string& member) { return remote::RemoteAllowed(member, ro.allow); };
  CKPT_ASSIGN_OR_RETURN(remote::RemotePlan rp, remote::PlanRemoteCheckpoint(url, client, allowed));
  Planned out;
  out.plan = std::move(rp.plan);
  out.remote_files = std::move(rp.files);
  out.client = std::move(rp.client);
  return out;
}

// Opens the checkpoint at `path` (beneath a model root, no links followed; or a remote
// source, see PlanRemote) and plans its load; checks the expansion unless allowed. Reads
// headers only.
Result<Planned> OpenAndPlan(const DaemonContext& ctx, const std::string& path, const std::string& name,
                            bool allow_expansion) {
  Planned planned;
  if (remote::LooksRemote(path)) {
    auto remote_plan = PlanRemote(ctx, path);
    if (!remote_plan.ok()) {
      spdlog::warn("load of '{}' from {} refused: {}", name, path, remote_plan.status().ToString());
      return remote_plan.status();
    }
    planned = std::move(*remote_plan);
  } else {
    // The file (or folder) is opened once here, beneath a model root without following any
    // link; the plan and the loader read only through these descriptors.
    auto location = ctx.roots->Open(path);
    if (!location.ok()) {
      spdlog::warn("load of '{}' from {} refused: {}", name, path, location.status().ToString());
      return location.status();
    }
    auto plan = format::PlanCheckpoint(*location);
    if (!plan.ok()) {
      spdlog::warn("load of '{}' refused: {}", name, plan.status().ToString());
      return plan.status();
    }
    planned.plan = std::move(*plan);
  }
  for (const std::string& note : planned.plan.notes) spdlog::warn("load of '{}': {}", name, note);
  if (!allow_expansion) {
    Status expansion = format::CheckExpansion(planned.plan, ctx.options->max_expansion);
    if (!expansion.ok()) {
      spdlog::warn("load of '{}' refused: {}", name, expansion.ToString());
      return expansion;
    }
  }
  return planned;
}

// What the segment for `plan` may take at most: the tensor bytes plus a header, an aligned
// index and the side files (the budget a load reserves).
Result<uint64_t> SegmentEstimate(const DaemonContext& ctx, const format::LoadPlan& plan) {
  CKPT_ASSIGN_OR_RETURN(const uint64_t stored, plan.StoredBytes());
  CheckedSum side_sum;
  for (const auto& side : plan.side_files) side_sum.Add(side.bytes.size());
  CKPT_ASSIGN_OR_RETURN(const uint64_t side_bytes, side_sum.Get("the side files' size"));
  return shm::EstimateSegmentBytes(*ctx.segments, stored, plan.tensors.size(), side_bytes);
}

// The catalog entry of a loaded segment (its tensors moved out of `loaded`; the segment's
// identity not yet recorded).
CatalogEntry LoadedEntry(const std::string& name, uint64_t generation, const std::string& path,
                         const Planned& planned, loader::LoadedSegment& loaded) {
  const format::LoadPlan& plan = planned.plan;
  CatalogEntry entry;
  entry.name = name;
  entry.generation = generation;
  entry.shm_name = loaded.file_name;
  entry.segment_id = shm::SegmentIdHex(loaded.segment_id);
  entry.source_path = path;
  entry.source_fingerprint = SourceFingerprint(planned);
  entry.format = plan.format;
  entry.segment_bytes = loaded.segment_bytes;
  entry.data_bytes = loaded.data_bytes;
  entry.load_seconds = loaded.seconds;
  entry.page_bytes = loaded.page_bytes;
  entry.huge_bytes = static_cast<int64_t>(loaded.huge_bytes);
  entry.loaded_unix_s = NowUnixSeconds();
  entry.tensors = std::make_shared<const std::vector<TensorInfo>>(std::move(loaded.tensors));
  return entry;
}

// The log lines of a published load: its speed and reader, its pages, and a warning where
// huge pages were expected and none came.
void LogLoaded(const DaemonContext& ctx, const std::string& name, uint64_t generation,
               const loader::LoadedSegment& loaded, uint64_t tensor_count) {
  spdlog::info("loaded '{}' generation {}: {} tensors, {} bytes in {:.3f} s ({:.2f} GiB/s), read with {}", name,
               generation, tensor_count, loaded.data_bytes, loaded.seconds,
               loaded.data_bytes / std::max(loaded.seconds, 1e-9) / (1 << 30), loaded.io_summary);
  spdlog::info("segment of '{}' generation {}: {} pages, {} of {} bytes on huge pages, reserved with {}", name,
               generation, shm::PageSizeName(loaded.page_bytes), loaded.huge_bytes, loaded.segment_bytes,
               loaded.populate_summary);
  if (loaded.page_bytes > shm::kSmallPageBytes && loaded.huge_bytes == 0) {
    spdlog::warn("segment of '{}' generation {}: huge pages were expected ({}) but the kernel gave none "
                 "(no free huge pages, or fragmented memory); it works on 4 KiB pages", name, generation,
                 ctx.segments->pages().Describe());
  }
}

// Everything of a load that reads files and publishes, from its plan (OpenAndPlan): the
// segment spec, LoadIntoSegment and the catalog publish. Nothing is visible unless it
// returns OK. With `shared` (an ensure's runner), each tick's progress is posted there for
// the callers waiting on it.
Result<protocol::LoadResponse> LoadAndPublish(const DaemonContext& ctx, const Owner& actor, const std::string& path,
                                              const std::string& name, bool replace, const Planned& planned,
                                              ConnectionWatch* watch, SharedLoad* shared = nullptr) {
  const format::LoadPlan& plan = planned.plan;
  CKPT_ASSIGN_OR_RETURN(const uint64_t estimate, SegmentEstimate(ctx, plan));
  std::vector<std::string> evicted;
  CKPT_ASSIGN_OR_RETURN(uint64_t generation, ctx.catalog->BeginLoad(name, replace, estimate, actor, &evicted));
  struct Reservation {
    Catalog* catalog;
    const std::string& name;
    bool held = true;
    ~Reservation() {
      if (held) catalog->AbortLoad(name);
    }
  } reservation{ctx.catalog, name};

  spdlog::info("loading '{}' generation {} from {}", name, generation, path);

  shm::SegmentSpec spec;
  spec.directory = ctx.segments;
  spec.checkpoint_name = name;
  spec.source_path = path;
  spec.generation = generation;
  spec.mode = ctx.options->shm_mode;
  spec.owner_uid = actor.uid;
  spec.owner_admin = actor.admin;

  loader::LoadOptions load_options;
  load_options.threads = ctx.options->load_threads;
  load_options.cancel = watch->cancel_flag();
  load_options.progress = [watch, shared](uint64_t done, uint64_t total) {
    if (shared) shared->SetProgress(done, total);
    watch->Tick(done, total);
  };
  if (planned.client) {
    // The same load, its reads made by ranged GETs straight into the segment.
    const remote::RemoteOptions& ro = ctx.options->remote;
    load_options.threads = ro.threads;
    load_options.queue_depth = std::max(1, (ro.connections + ro.threads - 1) / ro.threads);
    load_options.chunk_bytes = ro.chunk_bytes;
    load_options.direct_io = loader::DirectIo::kNever;
    // Each range's pages are allocated as its bytes arrive (HttpReader pwrites them to the
    // segment's descriptor), not the whole segment before the first GET: the allocation
    // overlaps the transfer instead of preceding it, and no page is zero-filled first.
    load_options.populate = shm::PagePopulate::kDeferred;
    load_options.make_reader = [&planned](const loader::ReaderOptions& options)
        -> Result<std::unique_ptr<loader::FileReader>> {
      CKPT_ASSIGN_OR_RETURN(auto reader, remote::HttpReader::Create(planned.client, planned.remote_files, options));
      return std::unique_ptr<loader::FileReader>(std::move(reader));
    };
    spdlog::info("fetching '{}' from {}: {} objects, {} bytes ({})", name, path, planned.remote_files.size(),
                 plan.TotalBytes(), planned.client->Describe());
  }
  auto loaded = loader::LoadIntoSegment(plan, spec, load_options);
  if (!loaded.ok()) {
    ++ctx.counters->load_failures;
    spdlog::warn("load of '{}' failed: {}", name, loaded.status().ToString());
    return loaded.status();
  }
  // The loader's mapping is unmapped on a thread of its own, beside the reply.
  ReleaseInBackground(std::move(loaded->mapping));
  watch->Poll();  // a cancel that came with the last bytes still wins
  if (watch->cancel_flag()->load() || ctx.stopping->load()) {
    if (Status removed = ctx.segments->Remove(loaded->file_name); !removed.ok()) {
      spdlog::error("cannot remove the cancelled segment {}: {}", ctx.segments->PathOf(loaded->file_name),
                    removed.ToString());
    }
    return Cancelled("load of '" + name + "' cancelled before it was published");
  }

  CatalogEntry entry = LoadedEntry(name, generation, path, planned, *loaded);
  if (Status identified = RecordSegmentIdentity(loaded->fd.get(), &entry); !identified.ok()) {
    (void)ctx.segments->Remove(loaded->file_name);
    return identified;
  }
  loaded->fd.reset();  // attach and verify open the segment again when they need it
  protocol::LoadResponse result{SummaryOf(entry), std::move(evicted)};
  ++ctx.counters->loads;
  ctx.counters->loaded_bytes += loaded->data_bytes;
  ctx.catalog->Publish(std::move(entry));
  reservation.held = false;
  LogLoaded(ctx, name, generation, *loaded, result.checkpoint.tensor_count);
  return result;
}

}  // namespace

Result<protocol::LoadResponse> Load(const DaemonContext& ctx, const Caller& caller,
                                    const protocol::LoadRequest& request, LoadWatch* watch) {
  CKPT_ASSIGN_OR_RETURN(const std::string name, NameOfLoad(request.path, request.name));
  ConnectionWatch connection(ctx, caller, request.progress, watch);
  auto plan = OpenAndPlan(ctx, request.path, name, request.allow_expansion);
  if (!plan.ok()) return plan.status();
  auto result = LoadAndPublish(ctx, caller.actor, request.path, name, request.replace, *plan, &connection);
  if (connection.cancelled_by_client()) {
    // Whatever else happened, a load whose cancel was read answers Cancelled (the client
    // counts on it to stay in step), and a published one cannot be: see LoadAndPublish.
    if (result.ok()) return result;  // published before the cancel arrived: unreachable by the checks above
    ++ctx.counters->loads_cancelled;
    spdlog::info("load of '{}' cancelled by the client; nothing published", name);
    return Cancelled("load of '" + name + "' cancelled by the client; nothing was published");
  }
  return result;
}

namespace {

// Starts the ensure load of `shared` on a thread of its own (EnsureTable::Run): no
// connection is tied to it, every caller (the first one too) waits for it with
// WaitForSharedLoad and may withdraw at any time; it is cancelled once none is left.
Status StartSharedLoad(const DaemonContext& ctx, const Owner& actor, const std::string& path, const std::string& name,
                       bool replace, Planned plan, const std::shared_ptr<SharedLoad>& shared) {
  auto body = [ctx, actor, path, name, replace, plan = std::move(plan), shared] {
    const Caller no_connection;  // fd -1: only the stopping flag and the shared flag count
    LoadWatch unused;
    ConnectionWatch watch(ctx, no_connection, false, &unused, shared.get());
    auto result = LoadAndPublish(ctx, actor, path, name, replace, plan, &watch, shared.get());
    if (!result.ok() && shared->cancel_flag()->load()) {  // the loader says FailedPrecondition "load cancelled"
      ++ctx.counters->loads_cancelled;
      const char* why = ctx.stopping->load() ? "ckptd is stopping" : "every caller withdrew";
      spdlog::info("ensure load of '{}' cancelled ({}); nothing was published", name, why);
      result = Cancelled("load of '" + name + "' cancelled (" + why + "); nothing was published");
    }
    // Off the table first: a caller that comes now finds the published generation (or,
    // after a failure, starts a load of its own), never a finished load to wait for.
    ctx.ensures->Remove(name, shared.get());
    shared->Finish(std::move(result));
  };
  return ctx.ensures->Run(shared, std::move(body));
}

// A caller waiting for the ensure load it started or joined; `action` is what it answers
// on success. Polls its own connection every 100 ms (progress events if asked; a cancel
// or hang-up withdraws it alone, answered at once).
Result<protocol::EnsureResponse> WaitForSharedLoad(const DaemonContext& ctx, const Caller& caller,
                                                  const protocol::EnsureRequest& request, const std::string& name,
                                                  const std::shared_ptr<SharedLoad>& shared, LoadWatch* watch,
                                                  const char* action) {
  ConnectionWatch connection(ctx, caller, request.progress, watch, shared.get());
  if (std::string(action) == "joined") {
    spdlog::info("ensure of '{}': waiting for the load in progress ({} callers)", name, shared->participants());
  }
  for (;;) {
    if (auto result = shared->WaitFor(kProgressInterval)) {
      if (connection.cancelled_by_client()) break;
      if (!result->ok()) {
        if (result->status().code() == StatusCode::kCancelled) {
          return Unavailable("the load of '" + name + "' this call waited for was cancelled (ckptd is stopping)");
        }
        return result->status();
      }
      return protocol::EnsureResponse{(*result)->checkpoint, (*result)->evicted, action};
    }
    const auto [done, total] = shared->progress();
    connection.Tick(done, total);
    if (connection.cancelled_by_client()) break;
  }
  spdlog::info("ensure of '{}': a caller withdrew ({} still waiting)", name, shared->participants());
  return Cancelled("ensure of '" + name + "' cancelled by the client; the load goes on for the other callers");
}

}  // namespace

Result<protocol::EnsureResponse> Ensure(const DaemonContext& ctx, const Caller& caller,
                                        const protocol::EnsureRequest& request, LoadWatch* watch) {
  CKPT_ASSIGN_OR_RETURN(const std::string name, NameOfLoad(request.path, request.name));
  // A load this call could not join (it was ending) is over within moments; then the
  // decision is taken again. The bound only guards against a livelock.
  for (int attempt = 0; attempt < 100; ++attempt) {
    // The files as they are now: opened and planned (headers only), for the fingerprint
    // and, if this call runs the load, for the load itself.
    CKPT_ASSIGN_OR_RETURN(Planned plan, OpenAndPlan(ctx, request.path, name, request.allow_expansion));
    const std::string fingerprint = SourceFingerprint(plan);
    bool replace = false;
    Status refused;
    std::optional<protocol::EnsureResponse> current;
    auto entry = ctx.ensures->FindOrStart(name, request.path, [&] {
      auto existing = ctx.catalog->Get(name);
      if (!existing.ok()) return true;  // absent (a plain load in progress is refused by BeginLoad)
      if (existing->source_path != request.path) {
        refused = FailedPrecondition("'" + name + "' is loaded from " + existing->source_path + ", not " +
                                     request.path + "; evict it or load --replace to move the name");
        return false;
      }
      if (!existing->source_fingerprint.empty() && existing->source_fingerprint == fingerprint) {
        current = protocol::EnsureResponse{SummaryOf(*existing), {}, "current"};
        return false;
      }
      replace = true;  // changed since it was loaded, or adopted (fingerprint unknown)
      return true;
    });
    if (!refused.ok()) return refused;
    if (current) return std::move(*current);
    if (entry.started) {
      spdlog::info("ensure of '{}': {} from {}", name,
                   replace ? "the source changed since its generation was loaded; loading a new one" : "not loaded; loading",
                   request.path);
      if (Status started = StartSharedLoad(ctx, caller.actor, request.path, name, replace, std::move(plan), entry.load);
          !started.ok()) {
        ctx.ensures->Remove(name, entry.load.get());
        entry.load->Finish(started);
        return started;
      }
      return WaitForSharedLoad(ctx, caller, request, name, entry.load, watch, replace ? "reloaded" : "loaded");
    }
    if (entry.load->path() != request.path) {
      return FailedPrecondition("'" + name + "' is being loaded from " + entry.load->path() + ", not " + request.path);
    }
    if (entry.load->Join()) return WaitForSharedLoad(ctx, caller, request, name, entry.load, watch, "joined");
    while (!entry.load->WaitFor(kProgressInterval)) {
    }
  }
  return Unavailable("ensure of '" + name + "' could not settle on a load; try again");
}

}  // namespace ckpt::daemon
