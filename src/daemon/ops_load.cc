// The load op: checks the request, watches the connection for a cancel, and runs
// LoadAndPublish (roots check, plan, segment spec, LoadIntoSegment, catalog publish).
#include <fcntl.h>

#include <spdlog/spdlog.h>

#include "daemon/ops.h"
#include "daemon/policy.h"
#include "format/checkpoint_formats.h"
#include "loader/checkpoint_loader.h"
#include "protocol/messages.h"
#include "protocol/wire.h"
#include "shm/segment_name.h"
#include "common/checked_math.h"

namespace ckpt::daemon {

namespace {

// Watches a load's connection from the loader's progress ticks: sends progress events
// (if asked) and reads what the client sends meanwhile. A cancel frame, a hang-up, a
// frame that is not a cancel, or a stopping daemon set `cancel`.
class ConnectionWatch {
 public:
  ConnectionWatch(const DaemonContext& ctx, const Caller& caller, bool send_progress, LoadWatch* out)
      : ctx_(ctx), caller_(caller), send_progress_(send_progress), out_(out) {}

  const std::atomic<bool>* cancel_flag() const { return &cancel_; }
  bool cancelled_by_client() const { return out_->cancel_consumed || out_->drop_connection; }

  void Tick(uint64_t done, uint64_t total) {
    if (ctx_.stopping->load()) cancel_.store(true);
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
      cancel_.store(true);
      return;
    }
    Hangup("a request arrived during a load (only 'cancel' may)");
  }

 private:
  void Hangup(const std::string& why) {
    spdlog::info("cancelling a load: {}", why);
    out_->drop_connection = true;
    cancel_.store(true);
  }

  const DaemonContext& ctx_;
  const Caller& caller_;
  const bool send_progress_;
  LoadWatch* out_;
  std::atomic<bool> cancel_{false};
};

// Everything of a load that reads files and publishes: the roots check, the plan, the
// segment spec, LoadIntoSegment and the catalog publish. Nothing is visible unless it
// returns OK.
Result<LoadResult> LoadAndPublish(const DaemonContext& ctx, const protocol::LoadRequest& request,
                                  const std::string& name, ConnectionWatch* watch) {
  // The file (or folder) is opened once here, beneath a model root without following any
  // link; the plan and the loader read only through these descriptors.
  const std::string& path = request.path;
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
  for (const std::string& note : plan->notes) spdlog::warn("load of '{}': {}", name, note);
  if (!request.allow_expansion) {
    Status expansion = format::CheckExpansion(*plan, ctx.options->max_expansion);
    if (!expansion.ok()) {
      spdlog::warn("load of '{}' refused: {}", name, expansion.ToString());
      return expansion;
    }
  }
  // The segment adds a header, an aligned index and the side files to the tensor bytes.
  CKPT_ASSIGN_OR_RETURN(const uint64_t stored, plan->StoredBytes());
  CheckedSum estimate_sum(stored);
  estimate_sum.AddProduct(plan->tensors.size() + 2, 4096).Add(1u << 20);
  estimate_sum.Add(ctx.segments->pages().segment_alignment());  // the size is rounded up to a (huge) page
  for (const auto& side : plan->side_files) estimate_sum.Add(side.bytes.size());
  CKPT_ASSIGN_OR_RETURN(const uint64_t estimate, estimate_sum.Get("the checkpoint's size"));
  std::vector<std::string> evicted;
  CKPT_ASSIGN_OR_RETURN(uint64_t generation, ctx.catalog->BeginLoad(name, request.replace, estimate, &evicted));
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

  loader::LoadOptions load_options;
  load_options.threads = ctx.options->load_threads;
  load_options.cancel = watch->cancel_flag();
  load_options.progress = [watch](uint64_t done, uint64_t total) { watch->Tick(done, total); };
  auto loaded = loader::LoadIntoSegment(*plan, spec, load_options);
  if (!loaded.ok()) {
    ++ctx.counters->load_failures;
    spdlog::warn("load of '{}' failed: {}", name, loaded.status().ToString());
    return loaded.status();
  }
  watch->Poll();  // a cancel that came with the last bytes still wins
  if (watch->cancelled_by_client() || ctx.stopping->load()) {
    if (Status removed = ctx.segments->Remove(loaded->file_name); !removed.ok()) {
      spdlog::error("cannot remove the cancelled segment {}: {}", ctx.segments->PathOf(loaded->file_name),
                    removed.ToString());
    }
    return Cancelled("load of '" + name + "' cancelled before it was published");
  }

  CatalogEntry entry;
  entry.name = name;
  entry.generation = generation;
  entry.shm_name = loaded->file_name;
  entry.segment_id = shm::SegmentIdHex(loaded->segment_id);
  entry.source_path = path;
  entry.format = plan->format;
  entry.segment_bytes = loaded->segment_bytes;
  entry.data_bytes = loaded->data_bytes;
  entry.load_seconds = loaded->seconds;
  entry.page_bytes = loaded->page_bytes;
  entry.huge_bytes = static_cast<int64_t>(loaded->huge_bytes);
  entry.loaded_unix_s = NowUnixSeconds();
  entry.tensors = std::make_shared<const std::vector<TensorInfo>>(std::move(loaded->tensors));
  entry.fd = std::make_shared<const UniqueFd>(std::move(loaded->fd));
  LoadResult result{SummaryOf(entry), std::move(evicted)};
  ++ctx.counters->loads;
  ctx.counters->loaded_bytes += loaded->data_bytes;
  ctx.catalog->Publish(std::move(entry));
  reservation.held = false;
  spdlog::info("loaded '{}' generation {}: {} tensors, {} bytes in {:.3f} s ({:.2f} GiB/s), read with {}", name,
               generation, result.checkpoint.tensor_count, loaded->data_bytes, loaded->seconds,
               loaded->data_bytes / std::max(loaded->seconds, 1e-9) / (1 << 30), loaded->io_summary);
  spdlog::info("segment of '{}' generation {}: {} pages, {} of {} bytes on huge pages, reserved with {}", name,
               generation, shm::PageSizeName(loaded->page_bytes), loaded->huge_bytes, loaded->segment_bytes,
               loaded->populate_summary);
  if (loaded->page_bytes > shm::kSmallPageBytes && loaded->huge_bytes == 0) {
    spdlog::warn("segment of '{}' generation {}: huge pages were expected ({}) but the kernel gave none "
                 "(no free huge pages, or fragmented memory); it works on 4 KiB pages", name, generation,
                 ctx.segments->pages().Describe());
  }
  return result;
}

}  // namespace

Result<LoadResult> Load(const DaemonContext& ctx, const Caller& caller, const protocol::LoadRequest& request,
                        LoadWatch* watch) {
  if (request.path.empty() || request.path[0] != '/') {
    return InvalidArgument("path must be absolute: '" + request.path.substr(0, 4096) + "'");
  }
  const std::string name = request.name.empty() ? DefaultCheckpointName(request.path) : request.name;
  CKPT_RETURN_IF_ERROR(ValidateCheckpointName(name));
  ConnectionWatch connection(ctx, caller, request.progress, watch);
  auto result = LoadAndPublish(ctx, request, name, &connection);
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

}  // namespace ckpt::daemon
