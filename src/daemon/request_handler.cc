#include "daemon/request_handler.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>
#include <spdlog/spdlog.h>

#include "common/checked_math.h"
#include "common/hex.h"
#include "format/checkpoint_formats.h"
#include "loader/checkpoint_loader.h"
#include "loader/segment_verifier.h"
#include "protocol/wire.h"
#include "shm/segment_reader.h"
#include "shm/shm_object.h"

namespace ckpt::daemon {

using nlohmann::json;

namespace {

Result<std::string> StringField(const json& request, const char* key, bool required = true) {
  auto it = request.find(key);
  if (it == request.end()) {
    if (required) return InvalidArgument(std::string("request lacks '") + key + "'");
    return std::string();
  }
  if (!it->is_string()) return InvalidArgument(std::string("'") + key + "' must be a string");
  return it->get<std::string>();
}

Result<bool> BoolField(const json& request, const char* key) {
  auto it = request.find(key);
  if (it == request.end()) return false;
  if (!it->is_boolean()) return InvalidArgument(std::string("'") + key + "' must be a boolean");
  return it->get<bool>();
}

Result<int64_t> IntField(const json& request, const char* key) {
  auto it = request.find(key);
  if (it == request.end()) return InvalidArgument(std::string("request lacks '") + key + "'");
  if (!it->is_number_integer()) return InvalidArgument(std::string("'") + key + "' must be an integer");
  return it->get<int64_t>();
}

bool NameChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
         c == '-' || c == '.';
}

std::string Hex(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

int64_t NowUnixSeconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

Status ValidateCheckpointName(const std::string& name) {
  if (name.empty() || name.size() > 100 || name[0] == '.') {
    return InvalidArgument("checkpoint name must be 1 to 100 characters and not start with '.': '" +
                           name + "'");
  }
  for (char c : name) {
    if (!NameChar(c)) {
      return InvalidArgument("checkpoint name '" + name + "' may hold only letters, digits, '_', '-' and '.'");
    }
  }
  return Status::Ok();
}

Status ValidateJobName(const std::string& job) {
  bool ok = !job.empty() && job.size() <= 200;
  for (char c : job) ok = ok && (NameChar(c) || c == ':');
  if (!ok) {
    return InvalidArgument("job name must be 1 to 200 characters of letters, digits, '_', '-', '.' and ':': '" +
                           job.substr(0, 220) + "'");
  }
  return Status::Ok();
}

std::string DefaultCheckpointName(const std::string& path) {
  std::string base = path;
  while (!base.empty() && base.back() == '/') base.pop_back();
  struct stat st;
  bool folder = ::stat(base.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
  auto ends_with = [&](const char* suffix) {
    const size_t n = std::strlen(suffix);
    return base.size() >= n && base.compare(base.size() - n, n, suffix) == 0;
  };
  // A model folder's own files (an index, model.safetensors, ...) name the folder.
  if (ends_with(".index.json") || ends_with("/model.safetensors") || ends_with("/pytorch_model.bin")) {
    if (auto slash = base.rfind('/'); slash != std::string::npos && slash > 0) {
      base.resize(slash);
      folder = true;
    }
  }
  if (auto slash = base.rfind('/'); slash != std::string::npos) base = base.substr(slash + 1);
  if (auto dot = base.rfind('.'); !folder && dot != std::string::npos && dot > 0) base = base.substr(0, dot);
  for (char& c : base) {
    if (!NameChar(c)) c = '_';
  }
  while (!base.empty() && base[0] == '.') base.erase(0, 1);
  if (base.size() > 100) base.resize(100);
  return base.empty() ? "checkpoint" : base;
}

json EntryToJson(const CatalogEntry& e) {
  return json{{"name", e.name},
              {"generation", e.generation},
              {"shm_name", e.shm_name},
              {"source", e.source_path},
              {"format", e.format},
              {"segment_bytes", e.segment_bytes},
              {"data_bytes", e.data_bytes},
              {"tensor_count", e.tensors ? e.tensors->size() : 0},
              {"load_seconds", e.load_seconds},
              {"loaded_unix_s", e.loaded_unix_s},
              {"attached", e.attached},
              {"attached_pids", e.attached_pids}};
}

RequestHandler::~RequestHandler() {
  for (const auto& [name, generation] : attachments_) {
    ctx_.catalog->Detach(name, generation, peer_.pid);
    spdlog::debug("detached '{}' generation {}", name, generation);
  }
}

json RequestHandler::Handle(const json& request) {
  Result<json> response = InvalidArgument("unhandled");
  try {
    response = Dispatch(request);
  } catch (const std::exception& e) {
    response = Internal(std::string("request failed: ") + e.what());
  }
  ++ctx_.counters->requests;
  if (!response.ok()) {
    ++ctx_.counters->request_errors;
    response_fd_.reset();
    return protocol::ErrorResponse(response.status());
  }
  return protocol::OkResponse(std::move(response).value());
}

Status RequestHandler::Require(Role needed, const std::string& op) const {
  if (static_cast<int>(role_) >= static_cast<int>(needed)) return Status::Ok();
  ++ctx_.counters->denied;
  spdlog::warn("refused '{}' to uid {} gid {} pid {} (role {})", op, peer_.uid, peer_.gid, peer_.pid,
               RoleName(role_));
  return PermissionDenied("'" + op + "' needs the " + RoleName(needed) + " role; uid " +
                          std::to_string(peer_.uid) + " is " +
                          (role_ == Role::kNone ? "in neither the reader nor the admin group"
                                                : "only a reader (not root, not in the admin group)"));
}

Result<json> RequestHandler::Dispatch(const json& request) {
  auto v = request.find("v");
  if (v == request.end() || !v->is_number_integer() || v->get<int64_t>() != protocol::kProtocolVersion) {
    return Unsupported("protocol version mismatch: this daemon speaks version " +
                       std::to_string(protocol::kProtocolVersion));
  }
  CKPT_ASSIGN_OR_RETURN(std::string op, StringField(request, "op"));
  const bool admin_op = op == "load" || op == "evict" || op == "verify";  // verify costs the daemon a full read
  CKPT_RETURN_IF_ERROR(Require(admin_op ? Role::kAdmin : Role::kReader, op));
  if (op == "status") return DaemonStatus();
  if (op == "metrics") return Metrics();
  if (op == "list") return List();
  if (op == "info") return Info(request);
  if (op == "load") return Load(request);
  if (op == "evict") return Evict(request);
  if (op == "attach") return Attach(request);
  if (op == "verify") return Verify(request);
  if (op == "rendezvous") return Rendezvous(request);
  return InvalidArgument("unknown op '" + op + "'");
}

Result<json> RequestHandler::Load(const json& request) {
  CKPT_ASSIGN_OR_RETURN(std::string path, StringField(request, "path"));
  CKPT_ASSIGN_OR_RETURN(std::string name, StringField(request, "name", /*required=*/false));
  CKPT_ASSIGN_OR_RETURN(bool progress, BoolField(request, "progress"));
  CKPT_ASSIGN_OR_RETURN(bool replace, BoolField(request, "replace"));
  if (path.empty() || path[0] != '/') return InvalidArgument("path must be absolute: '" + path + "'");
  if (name.empty()) name = DefaultCheckpointName(path);
  CKPT_RETURN_IF_ERROR(ValidateCheckpointName(name));
  CKPT_ASSIGN_OR_RETURN(bool allow_expansion, BoolField(request, "allow_expansion"));
  // The file (or folder) is opened once here, beneath a model root without following any
  // link; the plan and the loader read only through these descriptors.
  auto location = ctx_.roots->Open(path);
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
  if (!allow_expansion) {
    Status expansion = format::CheckExpansion(*plan, ctx_.options->max_expansion);
    if (!expansion.ok()) {
      spdlog::warn("load of '{}' refused: {}", name, expansion.ToString());
      return expansion;
    }
  }
  // The segment adds a header, an aligned index and the side files to the tensor bytes.
  CKPT_ASSIGN_OR_RETURN(const uint64_t stored, plan->StoredBytes());
  CheckedSum estimate_sum(stored);
  estimate_sum.AddProduct(plan->tensors.size() + 2, 4096).Add(1u << 20);
  for (const auto& side : plan->side_files) estimate_sum.Add(side.bytes.size());
  CKPT_ASSIGN_OR_RETURN(const uint64_t estimate, estimate_sum.Get("the checkpoint's size"));
  std::vector<std::string> evicted;
  CKPT_ASSIGN_OR_RETURN(uint64_t generation, ctx_.catalog->BeginLoad(name, replace, estimate, &evicted));
  struct Reservation {
    Catalog* catalog;
    const std::string& name;
    bool held = true;
    ~Reservation() {
      if (held) catalog->AbortLoad(name);
    }
  } reservation{ctx_.catalog, name};

  spdlog::info("loading '{}' generation {} from {}", name, generation, path);

  shm::SegmentSpec spec;
  spec.shm_name = ctx_.options->shm_prefix + "." + name + "." + std::to_string(generation);
  spec.checkpoint_name = name;
  spec.source_path = path;
  spec.generation = generation;
  spec.mode = ctx_.options->shm_mode;

  loader::LoadOptions load_options;
  load_options.threads = ctx_.options->load_threads;
  load_options.cancel = ctx_.stopping;
  if (progress) {
    load_options.progress = [this](uint64_t done, uint64_t total) {
      // A client that went away does not stop the load; its progress is just dropped.
      (void)protocol::WriteFrame(fd_, json{{"v", protocol::kProtocolVersion},
                                           {"event", "progress"},
                                           {"done", done},
                                           {"total", total}});
    };
  }
  auto loaded = loader::LoadIntoSegment(*plan, spec, load_options);
  if (!loaded.ok()) {
    ++ctx_.counters->load_failures;
    spdlog::warn("load of '{}' failed: {}", name, loaded.status().ToString());
    return loaded.status();
  }
  auto segment_fd = shm::OpenShmReadOnlyFd(loaded->shm_name);
  if (!segment_fd.ok()) {
    ++ctx_.counters->load_failures;
    (void)shm::RemoveShmObject(loaded->shm_name);
    return segment_fd.status();
  }
  SetSegmentOwnership(segment_fd->get(), *ctx_.access, ctx_.options->shm_mode);

  CatalogEntry entry;
  entry.name = name;
  entry.generation = generation;
  entry.shm_name = loaded->shm_name;
  entry.source_path = path;
  entry.format = plan->format;
  entry.segment_bytes = loaded->segment_bytes;
  entry.data_bytes = loaded->data_bytes;
  entry.load_seconds = loaded->seconds;
  entry.loaded_unix_s = NowUnixSeconds();
  entry.tensors = std::make_shared<const std::vector<TensorInfo>>(std::move(loaded->tensors));
  entry.fd = std::make_shared<const UniqueFd>(std::move(segment_fd).value());
  json summary = EntryToJson(entry);
  ++ctx_.counters->loads;
  ctx_.counters->loaded_bytes += loaded->data_bytes;
  ctx_.catalog->Publish(std::move(entry));
  reservation.held = false;
  spdlog::info("loaded '{}' generation {}: {} tensors, {} bytes in {:.3f} s ({:.2f} GiB/s), read with {}", name,
               generation, summary["tensor_count"].get<uint64_t>(), loaded->data_bytes,
               loaded->seconds, loaded->data_bytes / std::max(loaded->seconds, 1e-9) / (1 << 30),
               loaded->io_summary);
  return json{{"checkpoint", summary}, {"evicted", evicted}};
}

Result<json> RequestHandler::Evict(const json& request) {
  CKPT_ASSIGN_OR_RETURN(std::string name, StringField(request, "name"));
  CKPT_ASSIGN_OR_RETURN(bool force, BoolField(request, "force"));
  double wait_s = 0;
  if (auto w = request.find("wait_s"); w != request.end()) {
    if (!w->is_number() || w->get<double>() < 0 || w->get<double>() > 86400) {
      return InvalidArgument("'wait_s' must be a number of seconds from 0 to 86400");
    }
    wait_s = w->get<double>();
  }
  // With a wait, retry until the last client detached (or the deadline passed).
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(wait_s);
  auto evicted = ctx_.catalog->Evict(name, force);
  while (!evicted.ok() && evicted.status().code() == StatusCode::kFailedPrecondition &&
         std::chrono::steady_clock::now() < deadline && !ctx_.stopping->load()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    evicted = ctx_.catalog->Evict(name, force);
  }
  if (!evicted.ok() && wait_s > 0 && evicted.status().code() == StatusCode::kFailedPrecondition) {
    return FailedPrecondition("still attached after waiting " + std::to_string(wait_s) + " s: " +
                            evicted.status().message());
  }
  CKPT_ASSIGN_OR_RETURN(CatalogEntry entry, std::move(evicted));
  spdlog::info("evicted '{}' generation {} ({} attached)", name, entry.generation, entry.attached);
  return json{{"checkpoint", EntryToJson(entry)}};
}

Result<json> RequestHandler::Attach(const json& request) {
  CKPT_ASSIGN_OR_RETURN(std::string name, StringField(request, "name"));
  uint64_t want_generation = 0;  // set by a client re-registering after a daemon restart
  if (auto g = request.find("generation"); g != request.end()) {
    if (!g->is_number_unsigned()) return InvalidArgument("'generation' must be a positive integer");
    want_generation = g->get<uint64_t>();
  }
  CKPT_ASSIGN_OR_RETURN(CatalogEntry entry, ctx_.catalog->Attach(name, peer_.pid, want_generation));
  attachments_.emplace_back(name, entry.generation);
  ++ctx_.counters->attaches;
  // The client maps this read-only descriptor: it needs no access to /dev/shm by name.
  if (entry.fd) response_fd_.reset(::fcntl(entry.fd->get(), F_DUPFD_CLOEXEC, 0));
  spdlog::debug("attached '{}' generation {}", name, entry.generation);
  return json{{"checkpoint", EntryToJson(entry)}};
}

Result<json> RequestHandler::Verify(const json& request) {
  CKPT_ASSIGN_OR_RETURN(std::string name, StringField(request, "name"));
  CKPT_ASSIGN_OR_RETURN(CatalogEntry entry, ctx_.catalog->Get(name));
  // Our own read-only mapping: stays valid even if the checkpoint is evicted meanwhile.
  CKPT_ASSIGN_OR_RETURN(auto segment, shm::SegmentReader::Open(entry.shm_name));
  CKPT_ASSIGN_OR_RETURN(loader::VerifyReport report,
                        loader::VerifySegment(*segment, std::max(1, ctx_.options->load_threads), ctx_.stopping));
  if (report.ok()) {
    spdlog::info("verified '{}' generation {}: {} tensors, {} bytes OK in {:.3f} s", name, entry.generation,
                 report.tensors, report.bytes, report.seconds);
  } else {
    spdlog::warn("verify of '{}' generation {}: {} of {} tensors do not match their checksums (first: '{}')", name,
                 entry.generation, report.mismatch_count, report.tensors, report.mismatched.front());
  }
  return json{{"name", name},
              {"generation", entry.generation},
              {"passed", report.ok()},
              {"tensors", report.tensors},
              {"bytes", report.bytes},
              {"seconds", report.seconds},
              {"mismatch_count", report.mismatch_count},
              {"mismatched", report.mismatched}};
}

Result<json> RequestHandler::Rendezvous(const json& request) {
  ++ctx_.counters->rendezvous;
  CKPT_ASSIGN_OR_RETURN(std::string job, StringField(request, "job"));
  CKPT_RETURN_IF_ERROR(ValidateJobName(job));
  CKPT_ASSIGN_OR_RETURN(int64_t rank, IntField(request, "rank"));
  CKPT_ASSIGN_OR_RETURN(int64_t world, IntField(request, "world"));
  if (world < 1 || world > 65536) return InvalidArgument("'world' must be 1 to 65536, not " + std::to_string(world));
  if (rank < 0 || rank >= world) {
    return InvalidArgument("'rank' must be in [0, world): rank " + std::to_string(rank) + ", world " +
                           std::to_string(world));
  }
  CKPT_ASSIGN_OR_RETURN(std::string hex, StringField(request, "value", /*required=*/false));
  double timeout_s = 60;
  if (auto t = request.find("timeout_s"); t != request.end()) {
    if (!t->is_number() || !(t->get<double>() >= 0) || t->get<double>() > 3600) {
      return InvalidArgument("'timeout_s' must be a number of seconds from 0 to 3600");
    }
    timeout_s = t->get<double>();
  }
  if (rank != 0) {
    if (request.contains("value")) {
      return InvalidArgument("only rank 0 publishes a 'value'; rank " + std::to_string(rank) + " waits for it");
    }
    // Wait without blocking other connections; give up when the daemon stops or the
    // client hangs up (nobody would read the answer).
    auto interrupted = [this]() -> Status {
      if (ctx_.stopping->load()) return Unavailable("ckptd is stopping");
      if (fd_ >= 0) {
        pollfd p{fd_, POLLRDHUP, 0};
        if (::poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR))) {
          return Unavailable("the client hung up while waiting");
        }
      }
      return Status::Ok();
    };
    CKPT_ASSIGN_OR_RETURN(std::string value,
                          ctx_.rendezvous->Await(job, static_cast<int>(rank), static_cast<int>(world),
                                                 std::chrono::duration<double>(timeout_s), interrupted));
    spdlog::debug("rendezvous '{}': rank {} of {} fetched {} bytes", job, rank, world, value.size());
    return json{{"value", HexEncode(value)}};
  }
  if (hex.empty()) return InvalidArgument("rank 0 of job '" + job + "' must publish a non-empty 'value'");
  if (hex.size() > kMaxRendezvousHexChars) {
    return InvalidArgument("'value' is " + std::to_string(hex.size()) + " hex characters; at most " +
                           std::to_string(kMaxRendezvousHexChars) + " are accepted");
  }
  CKPT_ASSIGN_OR_RETURN(std::string bytes, HexDecode(hex));
  CKPT_ASSIGN_OR_RETURN(uint64_t generation, ctx_.rendezvous->Publish(job, static_cast<int>(world), std::move(bytes)));
  spdlog::info("rendezvous '{}': rank 0 published {} bytes for world {} (generation {})", job, hex.size() / 2, world,
               generation);
  return json{{"value", hex}};
}

Result<json> RequestHandler::Info(const json& request) {
  CKPT_ASSIGN_OR_RETURN(std::string name, StringField(request, "name"));
  CKPT_ASSIGN_OR_RETURN(CatalogEntry entry, ctx_.catalog->Get(name));
  json tensors = json::array();
  for (const TensorInfo& t : *entry.tensors) {
    tensors.push_back(json{{"name", t.name},
                           {"dtype", DTypeName(t.dtype)},
                           {"shape", t.shape},
                           {"nbytes", t.nbytes},
                           {"checksum", Hex(t.checksum)}});
  }
  return json{{"checkpoint", EntryToJson(entry)}, {"tensors", std::move(tensors)}};
}

json RequestHandler::List() const {
  json list = json::array();
  for (const CatalogEntry& e : ctx_.catalog->List()) list.push_back(EntryToJson(e));
  return json{{"checkpoints", std::move(list)}, {"loading", ctx_.catalog->Loading()}};
}

json RequestHandler::DaemonStatus() const {
  uint64_t shm_bytes = 0, attached = 0;
  auto entries = ctx_.catalog->List();
  json checkpoints = json::array();
  for (const auto& e : entries) {
    shm_bytes += e.segment_bytes;
    attached += e.attached;
    checkpoints.push_back(EntryToJson(e));
  }
  json retired = json::array();
  for (const auto& e : ctx_.catalog->Retired()) {
    shm_bytes += e.segment_bytes;
    attached += e.attached;
    retired.push_back(EntryToJson(e));
  }
  const EvictionCounts ev = ctx_.catalog->evictions();
  return json{{"version", CKPT_VERSION},
              {"protocol", protocol::kProtocolVersion},
              {"pid", ::getpid()},
              {"uptime_s", NowUnixSeconds() - ctx_.started_unix_s},
              {"socket", ctx_.options->socket_path},
              {"shm_prefix", ctx_.options->shm_prefix},
              {"checkpoints", entries.size()},
              {"loading", ctx_.catalog->Loading().size()},
              {"shm_bytes", shm_bytes},
              {"memory_budget_bytes", ctx_.catalog->budget_bytes()},
              {"memory_used_bytes", ctx_.catalog->UsedBytes()},
              {"attached", attached},
              {"connections", ctx_.connection_count->load()},
              {"max_connections", ctx_.options->max_connections},
              {"model_roots", ctx_.roots->roots()},
              {"evictions", json{{"by_request", ev.by_request}, {"for_budget", ev.for_budget}, {"replaced", ev.replaced}}},
              {"your_role", RoleName(role_)},
              {"checkpoint_list", std::move(checkpoints)},
              {"retired", std::move(retired)}};
}

json RequestHandler::Metrics() const {
  std::string out;
  auto metric = [&](const char* name, const char* type, const char* help) {
    out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
  };
  auto value = [&](const std::string& series, double v) {
    char buf[64];
    std::snprintf(buf, sizeof(buf), " %.17g\n", v);
    out += series + buf;
  };
  auto label = [](const std::string& s) {  // Prometheus label escaping
    std::string e;
    for (char c : s) {
      if (c == '\\' || c == '"') e += '\\';
      if (c == '\n') {
        e += "\\n";
        continue;
      }
      e += c;
    }
    return e;
  };
  const DaemonCounters& c = *ctx_.counters;
  const EvictionCounts ev = ctx_.catalog->evictions();
  auto entries = ctx_.catalog->List();
  auto retired = ctx_.catalog->Retired();
  metric("ckptd_up", "gauge", "1 while the daemon serves");
  value("ckptd_up", 1);
  metric("ckptd_uptime_seconds", "gauge", "seconds since the daemon started");
  value("ckptd_uptime_seconds", static_cast<double>(NowUnixSeconds() - ctx_.started_unix_s));
  metric("ckptd_memory_budget_bytes", "gauge", "configured memory budget (0: none)");
  value("ckptd_memory_budget_bytes", static_cast<double>(ctx_.catalog->budget_bytes()));
  metric("ckptd_memory_used_bytes", "gauge", "shared memory of published, retired and loading segments");
  value("ckptd_memory_used_bytes", static_cast<double>(ctx_.catalog->UsedBytes()));
  metric("ckptd_checkpoints", "gauge", "published checkpoints");
  value("ckptd_checkpoints", static_cast<double>(entries.size()));
  metric("ckptd_retired_generations", "gauge", "replaced or force-evicted generations still attached");
  value("ckptd_retired_generations", static_cast<double>(retired.size()));
  metric("ckptd_loading", "gauge", "loads in progress");
  value("ckptd_loading", static_cast<double>(ctx_.catalog->Loading().size()));
  metric("ckptd_connections", "gauge", "open client connections");
  value("ckptd_connections", ctx_.connection_count->load());
  metric("ckptd_checkpoint_bytes", "gauge", "shared memory of one checkpoint generation");
  for (const auto& e : entries) {
    value("ckptd_checkpoint_bytes{name=\"" + label(e.name) + "\",generation=\"" + std::to_string(e.generation) + "\"}",
          static_cast<double>(e.segment_bytes));
  }
  metric("ckptd_checkpoint_attached", "gauge", "live attachments of one checkpoint generation");
  for (const auto& e : entries) {
    value("ckptd_checkpoint_attached{name=\"" + label(e.name) + "\",generation=\"" + std::to_string(e.generation) + "\"}",
          e.attached);
  }
  metric("ckptd_checkpoint_load_seconds", "gauge", "time the load of one checkpoint generation took");
  for (const auto& e : entries) {
    value("ckptd_checkpoint_load_seconds{name=\"" + label(e.name) + "\",generation=\"" + std::to_string(e.generation) + "\"}",
          e.load_seconds);
  }
  metric("ckptd_requests_total", "counter", "requests served");
  value("ckptd_requests_total", static_cast<double>(c.requests.load()));
  metric("ckptd_request_errors_total", "counter", "requests answered with an error");
  value("ckptd_request_errors_total", static_cast<double>(c.request_errors.load()));
  metric("ckptd_requests_denied_total", "counter", "requests refused by access control");
  value("ckptd_requests_denied_total", static_cast<double>(c.denied.load()));
  metric("ckptd_loads_total", "counter", "checkpoint generations loaded");
  value("ckptd_loads_total", static_cast<double>(c.loads.load()));
  metric("ckptd_load_failures_total", "counter", "loads that failed after they started");
  value("ckptd_load_failures_total", static_cast<double>(c.load_failures.load()));
  metric("ckptd_loaded_bytes_total", "counter", "tensor bytes loaded");
  value("ckptd_loaded_bytes_total", static_cast<double>(c.loaded_bytes.load()));
  metric("ckptd_attaches_total", "counter", "attachments made");
  value("ckptd_attaches_total", static_cast<double>(c.attaches.load()));
  metric("ckptd_evictions_total", "counter", "generations removed, by reason");
  value("ckptd_evictions_total{reason=\"request\"}", static_cast<double>(ev.by_request));
  value("ckptd_evictions_total{reason=\"budget\"}", static_cast<double>(ev.for_budget));
  value("ckptd_evictions_total{reason=\"replaced\"}", static_cast<double>(ev.replaced));
  metric("ckptd_connections_total", "counter", "connections accepted");
  value("ckptd_connections_total", static_cast<double>(c.connections_total.load()));
  metric("ckptd_connections_refused_total", "counter", "connections refused over max-connections");
  value("ckptd_connections_refused_total", static_cast<double>(c.connections_refused.load()));
  metric("ckptd_bad_frames_total", "counter", "malformed frames received");
  value("ckptd_bad_frames_total", static_cast<double>(c.bad_frames.load()));
  metric("ckptd_rendezvous_total", "counter", "rendezvous requests (published and awaited)");
  value("ckptd_rendezvous_total", static_cast<double>(c.rendezvous.load()));
  return json{{"text", out}};
}

}  // namespace ckpt::daemon
