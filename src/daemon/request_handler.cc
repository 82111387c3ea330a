#include "daemon/request_handler.h"

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <spdlog/spdlog.h>

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
              {"attached", e.attached}};
}

RequestHandler::~RequestHandler() {
  for (const auto& [name, generation] : attachments_) {
    ctx_.catalog->Detach(name, generation);
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
  if (!response.ok()) return protocol::ErrorResponse(response.status());
  return protocol::OkResponse(std::move(response).value());
}

Result<json> RequestHandler::Dispatch(const json& request) {
  auto v = request.find("v");
  if (v == request.end() || !v->is_number_integer() || v->get<int64_t>() != protocol::kProtocolVersion) {
    return Unsupported("protocol version mismatch: this daemon speaks version " +
                       std::to_string(protocol::kProtocolVersion));
  }
  CKPT_ASSIGN_OR_RETURN(std::string op, StringField(request, "op"));
  if (op == "status") return DaemonStatus();
  if (op == "list") return List();
  if (op == "info") return Info(request);
  if (op == "load") return Load(request);
  if (op == "evict") return Evict(request);
  if (op == "attach") return Attach(request);
  if (op == "verify") return Verify(request);
  return InvalidArgument("unknown op '" + op + "'");
}

Result<json> RequestHandler::Load(const json& request) {
  CKPT_ASSIGN_OR_RETURN(std::string path, StringField(request, "path"));
  CKPT_ASSIGN_OR_RETURN(std::string name, StringField(request, "name", /*required=*/false));
  CKPT_ASSIGN_OR_RETURN(bool progress, BoolField(request, "progress"));
  if (path.empty() || path[0] != '/') return InvalidArgument("path must be absolute: '" + path + "'");
  if (name.empty()) name = DefaultCheckpointName(path);
  CKPT_RETURN_IF_ERROR(ValidateCheckpointName(name));

  CKPT_ASSIGN_OR_RETURN(uint64_t generation, ctx_.catalog->BeginLoad(name));
  struct Reservation {
    Catalog* catalog;
    const std::string& name;
    bool held = true;
    ~Reservation() {
      if (held) catalog->AbortLoad(name);
    }
  } reservation{ctx_.catalog, name};

  spdlog::info("loading '{}' from {}", name, path);
  auto plan = format::PlanCheckpoint(path);
  if (!plan.ok()) {
    spdlog::warn("load of '{}' refused: {}", name, plan.status().ToString());
    return plan.status();
  }

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
    spdlog::warn("load of '{}' failed: {}", name, loaded.status().ToString());
    return loaded.status();
  }

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
  json summary = EntryToJson(entry);
  ctx_.catalog->Publish(std::move(entry));
  reservation.held = false;
  spdlog::info("loaded '{}' generation {}: {} tensors, {} bytes in {:.3f} s ({:.2f} GiB/s), read with {}", name,
               generation, summary["tensor_count"].get<uint64_t>(), loaded->data_bytes,
               loaded->seconds, loaded->data_bytes / std::max(loaded->seconds, 1e-9) / (1 << 30),
               loaded->io_summary);
  return json{{"checkpoint", summary}};
}

Result<json> RequestHandler::Evict(const json& request) {
  CKPT_ASSIGN_OR_RETURN(std::string name, StringField(request, "name"));
  CKPT_ASSIGN_OR_RETURN(bool force, BoolField(request, "force"));
  CKPT_ASSIGN_OR_RETURN(CatalogEntry entry, ctx_.catalog->Evict(name, force));
  Status st = shm::RemoveShmObject(entry.shm_name);
  if (!st.ok()) spdlog::error("evicted '{}' but could not unlink {}: {}", name, entry.shm_name, st.ToString());
  spdlog::info("evicted '{}' generation {} ({} attached)", name, entry.generation, entry.attached);
  return json{{"checkpoint", EntryToJson(entry)}};
}

Result<json> RequestHandler::Attach(const json& request) {
  CKPT_ASSIGN_OR_RETURN(std::string name, StringField(request, "name"));
  CKPT_ASSIGN_OR_RETURN(CatalogEntry entry, ctx_.catalog->Attach(name));
  attachments_.emplace_back(name, entry.generation);
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
  for (const auto& e : entries) {
    shm_bytes += e.segment_bytes;
    attached += e.attached;
  }
  return json{{"version", CKPT_VERSION},
              {"protocol", protocol::kProtocolVersion},
              {"pid", ::getpid()},
              {"uptime_s", NowUnixSeconds() - ctx_.started_unix_s},
              {"socket", ctx_.options->socket_path},
              {"shm_prefix", ctx_.options->shm_prefix},
              {"checkpoints", entries.size()},
              {"loading", ctx_.catalog->Loading().size()},
              {"shm_bytes", shm_bytes},
              {"attached", attached},
              {"connections", ctx_.connection_count->load()}};
}

}  // namespace ckpt::daemon
