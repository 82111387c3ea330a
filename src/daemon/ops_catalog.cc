// The catalog ops: evict, attach, info, list, status.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <thread>
#include <spdlog/spdlog.h>

#include "daemon/connection_limits.h"
#include "daemon/ops.h"
#include "daemon/write_sessions.h"
#include "shm/segment_format.h"
#include "shm/segment_name.h"
#include "shm/segment_reader.h"
#include "protocol/wire.h"

namespace ckpt::daemon {

int64_t NowUnixSeconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

protocol::WireSummary SummaryOf(const CatalogEntry& e) {
  protocol::WireSummary s;
  s.name = e.name;
  s.generation = e.generation;
  s.shm_name = e.shm_name;
  s.segment_id = e.segment_id;
  s.source = e.source_path;
  s.source_fingerprint = e.source_fingerprint;
  s.format = e.format;
  s.segment_bytes = e.segment_bytes;
  s.data_bytes = e.data_bytes;
  s.tensor_count = e.tensors ? e.tensors->size() : 0;
  s.load_seconds = e.load_seconds;
  s.page_bytes = e.page_bytes;
  s.huge_bytes = e.huge_bytes;
  s.loaded_unix_s = e.loaded_unix_s;
  s.attached = e.attached;
  s.attached_pids.assign(e.attached_pids.begin(), e.attached_pids.end());
  s.owner_uid = e.owner.uid;
  s.owner_user = e.owner.user;
  s.owner_admin = e.owner.admin;
  return s;
}

Status RecordSegmentIdentity(int fd, CatalogEntry* entry) {
  struct stat st;
  if (::fstat(fd, &st) != 0) return ErrnoError("fstat of segment " + entry->shm_name, errno);
  entry->dev = static_cast<uint64_t>(st.st_dev);
  entry->ino = static_cast<uint64_t>(st.st_ino);
  return Status::Ok();
}

Result<UniqueFd> OpenSegment(const DaemonContext& ctx, const CatalogEntry& entry) {
  struct stat st;
  auto fd = ctx.segments->OpenOwned(entry.shm_name, ctx.options->shm_mode, sizeof(shm::SegmentHeader), &st);
  if (!fd.ok()) {
    if (fd.status().code() == StatusCode::kResourceExhausted) {
      return ResourceExhausted("ckptd cannot open the segment of '" + entry.name + "': " + fd.status().message());
    }
    return NotFound("the segment of '" + entry.name + "' generation " + std::to_string(entry.generation) +
                    " is gone (evicted or replaced meanwhile): " + fd.status().message());
  }
  if (static_cast<uint64_t>(st.st_dev) != entry.dev || static_cast<uint64_t>(st.st_ino) != entry.ino) {
    return NotFound("the segment file of '" + entry.name + "' generation " + std::to_string(entry.generation) +
                    " is not the one the daemon published");
  }
  return fd;
}

Result<protocol::CheckpointResponse> Evict(const DaemonContext& ctx, const Caller& caller,
                                           const protocol::EvictRequest& request) {
  const std::string& name = request.name;
  // With a wait, retry until the last client detached (or the deadline passed).
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(request.wait_s);
  auto evicted = ctx.catalog->Evict(name, request.force, caller.actor);
  while (!evicted.ok() && evicted.status().code() == StatusCode::kFailedPrecondition &&
         std::chrono::steady_clock::now() < deadline && !ctx.stopping->load()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    evicted = ctx.catalog->Evict(name, request.force, caller.actor);
  }
  if (!evicted.ok() && request.wait_s > 0 && evicted.status().code() == StatusCode::kFailedPrecondition) {
    return FailedPrecondition("still attached after waiting " + std::to_string(request.wait_s) + " s: " +
                              evicted.status().message());
  }
  CKPT_ASSIGN_OR_RETURN(CatalogEntry entry, std::move(evicted));
  spdlog::info("evicted '{}' generation {} ({} attached; owned by {}) at the request of {}", name, entry.generation,
               entry.attached, Describe(entry.owner), Describe(caller.actor));
  return protocol::CheckpointResponse{SummaryOf(entry)};
}

Result<protocol::CheckpointResponse> Attach(const DaemonContext& ctx, const Caller& caller,
                                            const protocol::AttachRequest& request, UniqueFd* segment_fd) {
  // A re-registering client names the content it mapped (segment_id), not just its number.
  if (!request.segment_id.empty() && !shm::ParseSegmentIdHex(request.segment_id)) {
    return InvalidArgument("'segment_id' must be 32 lower-case hex characters");
  }
  CKPT_ASSIGN_OR_RETURN(CatalogEntry entry, ctx.catalog->Attach(request.name, caller.peer.pid, request.generation,
                                                                request.segment_id));
  // The client maps this read-only descriptor: it needs no access to /dev/shm by name.
  auto fd = OpenSegment(ctx, entry);
  if (!fd.ok()) {
    ctx.catalog->Detach(entry.name, entry.generation, caller.peer.pid);
    return fd.status();
  }
  *segment_fd = std::move(fd).value();
  ++ctx.counters->attaches;
  spdlog::debug("attached '{}' generation {}", request.name, entry.generation);
  return protocol::CheckpointResponse{SummaryOf(entry)};
}

Result<protocol::InfoResponse> Info(const DaemonContext& ctx, const protocol::InfoRequest& request) {
  CKPT_ASSIGN_OR_RETURN(CatalogEntry entry, ctx.catalog->Get(request.name));
  protocol::InfoResponse info;
  info.checkpoint = SummaryOf(entry);
  if (entry.tensors) {
    for (const TensorInfo& t : *entry.tensors) {
      info.tensors.push_back(protocol::WireTensor{t.name, t.dtype, t.shape, t.nbytes, t.checksum});
    }
  }
  // The side files are in the segment only (the catalog keeps none): read its index.
  CKPT_ASSIGN_OR_RETURN(UniqueFd fd, OpenSegment(ctx, entry));
  CKPT_ASSIGN_OR_RETURN(auto segment, shm::SegmentReader::FromFd(fd.get(), entry.shm_name));
  for (const std::string& side : segment->side_file_names()) {
    CKPT_ASSIGN_OR_RETURN(std::string_view bytes, segment->SideFile(side));
    info.side_files.push_back(protocol::WireSideFile{side, bytes.size()});
  }
  return info;
}

protocol::ListResponse List(const DaemonContext& ctx) {
  protocol::ListResponse list;
  for (const CatalogEntry& e : ctx.catalog->List()) list.checkpoints.push_back(SummaryOf(e));
  list.loading = ctx.catalog->Loading();
  return list;
}

protocol::StatusResponse GetStatus(const DaemonContext& ctx, const Caller& caller) {
  protocol::StatusResponse s;
  for (const auto& e : ctx.catalog->List()) {
    s.shm_bytes += e.segment_bytes;
    s.attached += e.attached;
    s.checkpoint_list.push_back(SummaryOf(e));
  }
  for (const auto& e : ctx.catalog->Retired()) {
    s.shm_bytes += e.segment_bytes;
    s.attached += e.attached;
    s.retired.push_back(SummaryOf(e));
  }
  const EvictionCounts ev = ctx.catalog->evictions();
  s.version = CKPT_VERSION;
  s.protocol = protocol::kProtocolVersion;
  s.pid = ::getpid();
  s.uptime_s = NowUnixSeconds() - ctx.started_unix_s;
  s.socket = ctx.options->socket_path;
  s.shm_prefix = ctx.options->shm_prefix;
  s.segment_dir = ctx.segments->path();
  s.segment_pages = ctx.segments->pages().Describe();
  s.segment_page_bytes = ctx.segments->pages().segment_alignment();
  s.checkpoints = s.checkpoint_list.size();
  s.loading = ctx.catalog->Loading().size();
  s.memory_budget_bytes = ctx.catalog->budget_bytes();
  s.memory_used_bytes = ctx.catalog->UsedBytes();
  s.connections = ctx.limits ? ctx.limits->total() : 0;
  s.max_connections = ctx.options->max_connections;
  s.max_connections_per_uid = ctx.options->max_connections_per_uid;
  s.admin_reserved_connections = ctx.options->admin_reserved_connections;
  s.model_roots = ctx.roots->roots();
  s.evictions = protocol::WireEvictions{ev.by_request, ev.for_budget, ev.replaced};
  s.your_role = RoleName(caller.role);
  const Usage usage = ctx.catalog->UsageOf(caller.peer.uid);
  s.your_uid = caller.peer.uid;
  s.your_shm_bytes = usage.shm_bytes;
  s.your_segments = usage.segments;
  s.your_writes = ctx.writes->ActiveOf(caller.peer.uid);
  s.max_shm_bytes_per_uid = ctx.catalog->quotas().shm_bytes;
  s.max_segments_per_uid = ctx.catalog->quotas().segments;
  s.max_writes_per_uid = ctx.catalog->quotas().writes;
  return s;
}

}  // namespace ckpt::daemon
