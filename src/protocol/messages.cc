#include "protocol/messages.h"

#include <cstdio>
#include <limits>

#include "protocol/wire.h"
#include "common/hex.h"

namespace ckpt::protocol {

using nlohmann::json;

namespace {

// Reads typed fields from one JSON object, keeping the first error. In a request a bad
// field is the caller's InvalidArgument; in a response it means a broken daemon (Corrupt).
class Fields {
 public:
  Fields(const json& j, const char* what, bool request) : j_(j), what_(what), request_(request) {
    if (!j.is_object()) Fail(std::string("is not an object"));
  }

  template <typename T>
  void Required(const char* key, T* out) {
    Get(key, out, /*required=*/true);
  }
  template <typename T>
  void Optional(const char* key, T* out) {
    Get(key, out, /*required=*/false);
  }
  bool Has(const char* key) const { return j_.is_object() && j_.contains(key); }
  void Fail(const std::string& message) {
    if (!status_.ok()) return;
    status_ = request_ ? InvalidArgument(message)
                       : Corrupt(std::string("malformed ") + what_ + " response from ckptd: " + message);
  }
  Status status() const { return status_; }

 private:
  template <typename T>
  void Get(const char* key, T* out, bool required) {
    if (!status_.ok() || !j_.is_object()) return;
    auto it = j_.find(key);
    if (it == j_.end()) {
      if (required) Fail(std::string(request_ ? "request lacks '" : "no '") + key + "'");
      return;
    }
    const char* expected = Convert(*it, out);
    if (expected != nullptr) Fail(std::string("'") + key + "' must be " + expected);
  }

  // Each returns nullptr on success, else what the value should have been.
  static const char* Convert(const json& v, std::string* out) {
    if (!v.is_string()) return "a string";
    *out = v.get<std::string>();
    return nullptr;
  }
  static const char* Convert(const json& v, bool* out) {
    if (!v.is_boolean()) return "a boolean";
    *out = v.get<bool>();
    return nullptr;
  }
  static const char* Convert(const json& v, uint64_t* out) {
    if (!v.is_number_unsigned()) return "a non-negative integer";
    *out = v.get<uint64_t>();
    return nullptr;
  }
  static const char* Convert(const json& v, uint32_t* out) {
    if (!v.is_number_unsigned() || v.get<uint64_t>() > std::numeric_limits<uint32_t>::max()) {
      return "a non-negative 32-bit integer";
    }
    *out = v.get<uint32_t>();
    return nullptr;
  }
  static const char* Convert(const json& v, int64_t* out) {
    if (!v.is_number_integer()) return "an integer";
    if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return "an integer below 2^63";
    }
    *out = v.get<int64_t>();
    return nullptr;
  }
  static const char* Convert(const json& v, int* out) {
    int64_t wide = 0;
    if (Convert(v, &wide) != nullptr || wide < std::numeric_limits<int>::min() ||
        wide > std::numeric_limits<int>::max()) {
      return "a 32-bit integer";
    }
    *out = static_cast<int>(wide);
    return nullptr;
  }
  static const char* Convert(const json& v, double* out) {
    if (!v.is_number()) return "a number";
    *out = v.get<double>();
    return nullptr;
  }
  template <typename T>
  static const char* Convert(const json& v, std::vector<T>* out) {
    if (!v.is_array()) return "an array";
    std::vector<T> items;
    items.reserve(v.size());
    for (const json& item : v) {
      T value{};
      if (const char* e = Convert(item, &value); e != nullptr) return "an array of valid items";
      items.push_back(std::move(value));
    }
    *out = std::move(items);
    return nullptr;
  }
  static const char* Convert(const json& v, CheckpointSummary* out) {
    return Decode(v, out).ok() ? nullptr : "a checkpoint summary";
  }
  static const char* Convert(const json& v, SideFileInfo* out) {
    Fields f(v, "side file", false);
    f.Required("name", &out->name);
    f.Required("bytes", &out->bytes);
    return f.status().ok() ? nullptr : "a side file (name, bytes)";
  }
  static const char* Convert(const json& v, TensorInfo* out) {
    Fields f(v, "tensor", false);
    std::string dtype, checksum;
    f.Required("name", &out->name);
    f.Required("dtype", &dtype);
    f.Required("shape", &out->shape);
    f.Required("nbytes", &out->nbytes);
    f.Required("checksum", &checksum);
    if (!f.status().ok()) return "a tensor (name, dtype, shape, nbytes, checksum)";
    auto parsed = DTypeFromName(dtype);
    if (!parsed) return "a tensor of a known dtype";
    out->dtype = *parsed;
    const std::optional<uint64_t> sum = ParseHex64(checksum);
    if (!sum) return "a tensor with a hex checksum";
    out->checksum = *sum;
    return nullptr;
  }

  const json& j_;
  const char* what_;
  bool request_;
  Status status_;
};

json EncodeAll(const std::vector<CheckpointSummary>& list) {
  json out = json::array();
  for (const auto& s : list) out.push_back(Encode(s));
  return out;
}

}  // namespace

std::vector<std::string> KnownOps() {
  return {kStatusOp,          kMetricsOp,          kListOp,
          kInfoOp,            kVerifyOp,           LoadRequest::kOp,
          EnsureRequest::kOp, EvictRequest::kOp,   AttachRequest::kOp,
          RendezvousRequest::kOp, CancelRequest::kOp, WriteRequest::kOp,
          WriteChunkRequest::kOp, WriteSealRequest::kOp};
}

Result<std::string> DecodeOp(const json& request) {
  auto v = request.find("v");
  if (v == request.end() || !v->is_number_integer() || v->get<int64_t>() != kProtocolVersion) {
    return Unsupported("protocol version mismatch: this daemon speaks version " + std::to_string(kProtocolVersion));
  }
  Fields f(request, "request", true);
  std::string op;
  f.Required("op", &op);
  if (!f.status().ok()) return f.status();
  return op;
}

std::string EventName(const json& frame) {
  auto it = frame.find("event");
  return (it != frame.end() && it->is_string()) ? it->get<std::string>() : std::string();
}

// ---- requests ----

json Encode(const LoadRequest& m) {
  json j{{"path", m.path}, {"progress", m.progress}};
  if (!m.name.empty()) j["name"] = m.name;
  if (m.replace) j["replace"] = true;
  if (m.allow_expansion) j["allow_expansion"] = true;
  return j;
}

Status Decode(const json& j, LoadRequest* m) {
  Fields f(j, "load", true);
  f.Required("path", &m->path);
  f.Optional("name", &m->name);
  f.Optional("progress", &m->progress);
  f.Optional("replace", &m->replace);
  f.Optional("allow_expansion", &m->allow_expansion);
  return f.status();
}

json Encode(const EnsureRequest& m) {
  json j{{"path", m.path}, {"progress", m.progress}};
  if (!m.name.empty()) j["name"] = m.name;
  if (m.allow_expansion) j["allow_expansion"] = true;
  return j;
}

Status Decode(const json& j, EnsureRequest* m) {
  Fields f(j, "ensure", true);
  f.Required("path", &m->path);
  f.Optional("name", &m->name);
  f.Optional("progress", &m->progress);
  f.Optional("allow_expansion", &m->allow_expansion);
  return f.status();
}

json Encode(const EvictRequest& m) {
  json j{{"name", m.name}, {"force", m.force}};
  if (m.wait_s > 0) j["wait_s"] = m.wait_s;
  return j;
}

Status Decode(const json& j, EvictRequest* m) {
  Fields f(j, "evict", true);
  f.Required("name", &m->name);
  f.Optional("force", &m->force);
  f.Optional("wait_s", &m->wait_s);
  if (f.status().ok() && !(m->wait_s >= 0 && m->wait_s <= 86400)) {
    f.Fail("'wait_s' must be a number of seconds from 0 to 86400");
  }
  return f.status();
}

json Encode(const NameRequest& m) { return json{{"name", m.name}}; }

Status Decode(const json& j, NameRequest* m) {
  Fields f(j, "request", true);
  f.Required("name", &m->name);
  return f.status();
}

json Encode(const AttachRequest& m) {
  json j{{"name", m.name}};
  if (m.generation != 0) j["generation"] = m.generation;
  if (!m.segment_id.empty()) j["segment_id"] = m.segment_id;
  return j;
}

Status Decode(const json& j, AttachRequest* m) {
  Fields f(j, "attach", true);
  f.Required("name", &m->name);
  f.Optional("generation", &m->generation);
  f.Optional("segment_id", &m->segment_id);
  return f.status();
}

json Encode(const RendezvousRequest& m) {
  json j{{"job", m.job}, {"rank", m.rank}, {"world", m.world}, {"timeout_s", m.timeout_s}};
  if (m.has_value) j["value"] = m.value_hex;
  return j;
}

Status Decode(const json& j, RendezvousRequest* m) {
  Fields f(j, "rendezvous", true);
  f.Required("job", &m->job);
  f.Required("rank", &m->rank);
  f.Required("world", &m->world);
  m->has_value = f.Has("value");
  f.Optional("value", &m->value_hex);
  f.Optional("timeout_s", &m->timeout_s);
  if (!f.status().ok()) return f.status();
  if (m->world < 1 || m->world > 65536) f.Fail("'world' must be 1 to 65536, not " + std::to_string(m->world));
  if (m->rank < 0 || m->rank >= m->world) {
    f.Fail("'rank' must be in [0, world): rank " + std::to_string(m->rank) + ", world " + std::to_string(m->world));
  }
  if (!(m->timeout_s >= 0 && m->timeout_s <= 3600)) f.Fail("'timeout_s' must be a number of seconds from 0 to 3600");
  return f.status();
}

// ---- responses ----

json Encode(const CheckpointSummary& m) {
  json j{{"name", m.name},
         {"generation", m.generation},
         {"shm_name", m.shm_name},
         {"source", m.source},
         {"format", m.format},
         {"segment_bytes", m.segment_bytes},
         {"data_bytes", m.data_bytes},
         {"tensor_count", m.tensor_count},
         {"load_seconds", m.load_seconds},
         {"loaded_unix_s", m.loaded_unix_s},
         {"attached", m.attached},
         {"attached_pids", m.attached_pids},
         {"owner_uid", m.owner_uid},
         {"owner_user", m.owner_user},
         {"owner_admin", m.owner_admin}};
  if (!m.segment_id.empty()) j["segment_id"] = m.segment_id;
  if (m.page_bytes != 0) j["page_bytes"] = m.page_bytes;
  if (m.huge_bytes >= 0) j["huge_bytes"] = m.huge_bytes;
  if (!m.source_fingerprint.empty()) j["source_fingerprint"] = m.source_fingerprint;
  return j;
}

Status Decode(const json& j, CheckpointSummary* m) {
  Fields f(j, "checkpoint", false);
  f.Required("name", &m->name);
  f.Required("generation", &m->generation);
  f.Optional("shm_name", &m->shm_name);
  f.Optional("segment_id", &m->segment_id);
  f.Optional("source", &m->source);
  f.Optional("format", &m->format);
  f.Optional("segment_bytes", &m->segment_bytes);
  f.Optional("data_bytes", &m->data_bytes);
  f.Optional("tensor_count", &m->tensor_count);
  f.Optional("load_seconds", &m->load_seconds);
  f.Optional("loaded_unix_s", &m->loaded_unix_s);
  f.Optional("attached", &m->attached);
  f.Optional("attached_pids", &m->attached_pids);
  f.Optional("page_bytes", &m->page_bytes);
  f.Optional("huge_bytes", &m->huge_bytes);
  f.Optional("source_fingerprint", &m->source_fingerprint);
  f.Optional("owner_uid", &m->owner_uid);
  f.Optional("owner_user", &m->owner_user);
  f.Optional("owner_admin", &m->owner_admin);
  return f.status();
}

json Encode(const CheckpointList& m) { return json{{"checkpoints", EncodeAll(m.checkpoints)}, {"loading", m.loading}}; }

Status Decode(const json& j, CheckpointList* m) {
  Fields f(j, "list", false);
  f.Required("checkpoints", &m->checkpoints);
  f.Optional("loading", &m->loading);
  return f.status();
}

json EncodeTensor(const TensorInfo& t) {
  return json{{"name", t.name},
              {"dtype", DTypeName(t.dtype)},
              {"shape", t.shape},
              {"nbytes", t.nbytes},
              {"checksum", Hex64(t.checksum)}};
}

json Encode(const CheckpointInfo& m) {
  json tensors = json::array();
  for (const TensorInfo& t : m.tensors) tensors.push_back(EncodeTensor(t));
  json sides = json::array();
  for (const SideFileInfo& side : m.side_files) sides.push_back(json{{"name", side.name}, {"bytes", side.bytes}});
  return json{{"checkpoint", Encode(m.checkpoint)}, {"tensors", std::move(tensors)}, {"side_files", std::move(sides)}};
}

Status Decode(const json& j, CheckpointInfo* m) {
  Fields f(j, "info", false);
  f.Required("checkpoint", &m->checkpoint);
  f.Required("tensors", &m->tensors);
  f.Optional("side_files", &m->side_files);  // absent from daemons before 0.1.0's issue 22
  return f.status();
}

json Encode(const LoadResult& m) { return json{{"checkpoint", Encode(m.checkpoint)}, {"evicted", m.evicted}}; }

Status Decode(const json& j, LoadResult* m) {
  Fields f(j, "load", false);
  f.Required("checkpoint", &m->checkpoint);
  f.Optional("evicted", &m->evicted);
  return f.status();
}

json Encode(const EnsureResult& m) {
  return json{{"checkpoint", Encode(m.checkpoint)}, {"evicted", m.evicted}, {"action", m.action}};
}

Status Decode(const json& j, EnsureResult* m) {
  Fields f(j, "ensure", false);
  f.Required("checkpoint", &m->checkpoint);
  f.Optional("evicted", &m->evicted);
  f.Required("action", &m->action);
  return f.status();
}

json Encode(const VerifyResult& m) {
  return json{{"name", m.name},
              {"generation", m.generation},
              {"passed", m.passed},
              {"tensors", m.tensors},
              {"bytes", m.bytes},
              {"seconds", m.seconds},
              {"mismatch_count", m.mismatch_count},
              {"mismatched", m.mismatched}};
}

Status Decode(const json& j, VerifyResult* m) {
  Fields f(j, "verify", false);
  f.Required("name", &m->name);
  f.Required("generation", &m->generation);
  f.Required("passed", &m->passed);
  f.Optional("tensors", &m->tensors);
  f.Optional("bytes", &m->bytes);
  f.Optional("seconds", &m->seconds);
  f.Optional("mismatch_count", &m->mismatch_count);
  f.Optional("mismatched", &m->mismatched);
  return f.status();
}

json Encode(const DaemonStatus& m) {
  json j{{"version", m.version},
              {"protocol", m.protocol},
              {"pid", m.pid},
              {"uptime_s", m.uptime_s},
              {"socket", m.socket},
              {"shm_prefix", m.shm_prefix},
              {"checkpoints", m.checkpoints},
              {"loading", m.loading},
              {"shm_bytes", m.shm_bytes},
              {"memory_budget_bytes", m.memory_budget_bytes},
              {"memory_used_bytes", m.memory_used_bytes},
              {"attached", m.attached},
              {"connections", m.connections},
              {"max_connections", m.max_connections},
              {"max_connections_per_uid", m.max_connections_per_uid},
              {"admin_reserved_connections", m.admin_reserved_connections},
              {"model_roots", m.model_roots},
              {"evictions",
               json{{"by_request", m.evictions.by_request},
                    {"for_budget", m.evictions.for_budget},
                    {"replaced", m.evictions.replaced}}},
              {"your_role", m.your_role},
              {"your_uid", m.your_uid},
              {"your_shm_bytes", m.your_shm_bytes},
              {"your_segments", m.your_segments},
              {"your_writes", m.your_writes},
              {"max_shm_bytes_per_uid", m.max_shm_bytes_per_uid},
              {"max_segments_per_uid", m.max_segments_per_uid},
              {"max_writes_per_uid", m.max_writes_per_uid},
              {"checkpoint_list", EncodeAll(m.checkpoint_list)},
              {"retired", EncodeAll(m.retired)}};
  if (!m.segment_dir.empty()) j["segment_dir"] = m.segment_dir;
  if (!m.segment_pages.empty()) j["segment_pages"] = m.segment_pages;
  if (m.segment_page_bytes != 0) j["segment_page_bytes"] = m.segment_page_bytes;
  return j;
}

Status Decode(const json& j, DaemonStatus* m) {
  Fields f(j, "status", false);
  f.Required("version", &m->version);
  f.Required("protocol", &m->protocol);
  f.Required("pid", &m->pid);
  f.Required("uptime_s", &m->uptime_s);
  f.Optional("socket", &m->socket);
  f.Required("shm_prefix", &m->shm_prefix);
  f.Required("checkpoints", &m->checkpoints);
  f.Required("loading", &m->loading);
  f.Required("shm_bytes", &m->shm_bytes);
  f.Optional("memory_budget_bytes", &m->memory_budget_bytes);
  f.Optional("memory_used_bytes", &m->memory_used_bytes);
  f.Required("attached", &m->attached);
  f.Required("connections", &m->connections);
  f.Optional("max_connections", &m->max_connections);
  f.Optional("max_connections_per_uid", &m->max_connections_per_uid);
  f.Optional("admin_reserved_connections", &m->admin_reserved_connections);
  f.Optional("model_roots", &m->model_roots);
  f.Optional("segment_dir", &m->segment_dir);
  f.Optional("segment_pages", &m->segment_pages);
  f.Optional("segment_page_bytes", &m->segment_page_bytes);
  f.Optional("your_role", &m->your_role);
  f.Optional("your_uid", &m->your_uid);
  f.Optional("your_shm_bytes", &m->your_shm_bytes);
  f.Optional("your_segments", &m->your_segments);
  f.Optional("your_writes", &m->your_writes);
  f.Optional("max_shm_bytes_per_uid", &m->max_shm_bytes_per_uid);
  f.Optional("max_segments_per_uid", &m->max_segments_per_uid);
  f.Optional("max_writes_per_uid", &m->max_writes_per_uid);
  f.Optional("checkpoint_list", &m->checkpoint_list);
  f.Optional("retired", &m->retired);
  if (f.status().ok() && j.contains("evictions")) {
    Fields e(j.at("evictions"), "status", false);
    e.Optional("by_request", &m->evictions.by_request);
    e.Optional("for_budget", &m->evictions.for_budget);
    e.Optional("replaced", &m->evictions.replaced);
    if (!e.status().ok()) return e.status();
  }
  return f.status();
}

json Encode(const CheckpointResponse& m) { return json{{"checkpoint", Encode(m.checkpoint)}}; }

Status Decode(const json& j, CheckpointResponse* m) {
  Fields f(j, "checkpoint", false);
  f.Required("checkpoint", &m->checkpoint);
  return f.status();
}

json Encode(const RendezvousResponse& m) { return json{{"value", m.value_hex}}; }

Status Decode(const json& j, RendezvousResponse* m) {
  Fields f(j, "rendezvous", false);
  f.Required("value", &m->value_hex);
  return f.status();
}

json Encode(const MetricsResponse& m) { return json{{"text", m.text}}; }

Status Decode(const json& j, MetricsResponse* m) {
  Fields f(j, "metrics", false);
  f.Required("text", &m->text);
  return f.status();
}

json Encode(const CancelResponse& m) { return json{{"cancelled", m.cancelled}}; }

Status Decode(const json& j, CancelResponse* m) {
  Fields f(j, "cancel", false);
  f.Optional("cancelled", &m->cancelled);
  return f.status();
}

// ---- events ----

json Encode(const ProgressEvent& m) {
  return json{{"v", kProtocolVersion}, {"event", kProgressEvent}, {"done", m.done}, {"total", m.total}};
}

Status Decode(const json& j, ProgressEvent* m) {
  Fields f(j, "progress", false);
  f.Required("done", &m->done);
  f.Required("total", &m->total);
  return f.status();
}

json Encode(const ClosingEvent& m) {
  return json{{"v", kProtocolVersion}, {"event", kClosingEvent}, {"reason", m.reason}};
}

Status Decode(const json& j, ClosingEvent* m) {
  Fields f(j, "closing", false);
  f.Optional("reason", &m->reason);
  return f.status();
}

// ---- the write path ----

namespace {
constexpr size_t kMaxWritePieces = 1u << 20;
constexpr size_t kMaxChunkItems = 1u << 16;
static_assert(kWriteChunkItemsPerFrame <= kMaxChunkItems);

json EncodePiece(const WritePiece& p) {
  json j{{"key", p.key}, {"dtype", DTypeName(p.dtype)}, {"global_shape", p.global_shape}};
  if (p.flat) {
    j["flat"] = true;
    j["start"] = p.start;
    j["numel"] = p.numel;
  } else {
    j["offsets"] = p.offsets;
    j["shape"] = p.shape;
  }
  return j;
}

Status DecodePiece(const json& j, size_t index, WritePiece* p) {
  const std::string what = "pieces[" + std::to_string(index) + "]";
  if (!j.is_object()) return InvalidArgument("'" + what + "' must be an object");
  Fields f(j, "write", true);
  std::string dtype;
  f.Required("key", &p->key);
  f.Required("dtype", &dtype);
  f.Required("global_shape", &p->global_shape);
  f.Optional("flat", &p->flat);
  if (p->flat) {
    f.Required("start", &p->start);
    f.Required("numel", &p->numel);
  } else {
    f.Optional("offsets", &p->offsets);
    f.Optional("shape", &p->shape);
  }
  if (!f.status().ok()) return InvalidArgument(what + ": " + f.status().message());
  auto parsed = DTypeFromName(dtype);
  if (!parsed) return InvalidArgument(what + " ('" + p->key + "'): unknown dtype '" + dtype.substr(0, 32) + "'");
  p->dtype = *parsed;
  if (p->key.empty() || p->key.size() > 1024) return InvalidArgument(what + ": a key must be 1 to 1024 bytes");
  if (p->global_shape.size() > 8) return InvalidArgument(what + " ('" + p->key + "'): more than 8 dims");
  for (int64_t d : p->global_shape) {
    if (d < 0) return InvalidArgument(what + " ('" + p->key + "'): a negative dimension");
  }
  if (!p->flat) {
    // A box defaults to the whole tensor.
    if (p->offsets.empty()) p->offsets.assign(p->global_shape.size(), 0);
    if (p->shape.empty() && !j.contains("shape")) p->shape = p->global_shape;
    if (p->offsets.size() != p->global_shape.size() || p->shape.size() != p->global_shape.size()) {
      return InvalidArgument(what + " ('" + p->key + "'): offsets and shape must have one entry per dim of " +
                             "global_shape");
    }
    for (size_t d = 0; d < p->shape.size(); ++d) {
      if (p->offsets[d] < 0 || p->shape[d] < 0 || p->offsets[d] > p->global_shape[d] ||
          p->shape[d] > p->global_shape[d] - p->offsets[d]) {
        return InvalidArgument(what + " ('" + p->key + "'): the box leaves the global shape in dim " +
                               std::to_string(d));
      }
    }
  }
  return Status::Ok();
}
}  // namespace

json Encode(const WriteRequest& m) {
  json pieces = json::array();
  for (const WritePiece& p : m.pieces) pieces.push_back(EncodePiece(p));
  json sides = json::array();
  for (const auto& [name, bytes] : m.side_files) {
    sides.push_back(json{{"name", name}, {"data", HexEncode(bytes)}});
  }
  json j{{"name", m.name},      {"part", m.part},           {"parts", m.parts},
         {"timeout_s", m.timeout_s}, {"ring_bytes", m.ring_bytes}, {"pieces", std::move(pieces)}};
  if (!m.job.empty()) j["job"] = m.job;
  if (m.replace) j["replace"] = true;
  if (!m.side_files.empty()) j["side_files"] = std::move(sides);
  return j;
}

Status Decode(const json& j, WriteRequest* m) {
  Fields f(j, "write", true);
  f.Required("name", &m->name);
  f.Optional("job", &m->job);
  f.Optional("part", &m->part);
  f.Optional("parts", &m->parts);
  f.Optional("replace", &m->replace);
  f.Optional("timeout_s", &m->timeout_s);
  f.Optional("ring_bytes", &m->ring_bytes);
  if (!f.status().ok()) return f.status();
  if (m->parts < 1 || m->parts > kMaxWriteParts) {
    return InvalidArgument("'parts' must be 1 to " + std::to_string(kMaxWriteParts) + ", not " +
                           std::to_string(m->parts));
  }
  if (m->part < 0 || m->part >= m->parts) {
    return InvalidArgument("'part' must be in [0, parts): part " + std::to_string(m->part) + ", parts " +
                           std::to_string(m->parts));
  }
  if (!(m->timeout_s >= 0 && m->timeout_s <= 86400)) {
    return InvalidArgument("'timeout_s' must be a number of seconds from 0 to 86400");
  }
  auto pieces = j.find("pieces");
  if (pieces == j.end() || !pieces->is_array()) return InvalidArgument("'pieces' must be an array");
  if (pieces->size() > kMaxWritePieces) return InvalidArgument("too many pieces in one part");
  m->pieces.resize(pieces->size());
  for (size_t i = 0; i < pieces->size(); ++i) CKPT_RETURN_IF_ERROR(DecodePiece((*pieces)[i], i, &m->pieces[i]));
  if (auto sides = j.find("side_files"); sides != j.end()) {
    if (!sides->is_array()) return InvalidArgument("'side_files' must be an array");
    for (const json& s : *sides) {
      Fields sf(s, "write", true);
      std::string name, hex;
      sf.Required("name", &name);
      sf.Required("data", &hex);
      if (!sf.status().ok()) return InvalidArgument("side_files: " + sf.status().message());
      auto bytes = HexDecode(hex);
      if (!bytes.ok()) return InvalidArgument("side file '" + name.substr(0, 255) + "': " + bytes.status().message());
      m->side_files.emplace_back(std::move(name), std::move(bytes).value());
    }
  }
  return Status::Ok();
}

json Encode(const WriteChunkRequest& m) {
  json items = json::array();
  for (const WriteChunkItem& i : m.items) items.push_back(json::array({i.piece, i.offset, i.ring_offset, i.bytes}));
  return json{{"slot", m.slot}, {"items", std::move(items)}};
}

Status Decode(const json& j, WriteChunkRequest* m) {
  Fields f(j, "write_chunk", true);
  f.Required("slot", &m->slot);
  if (!f.status().ok()) return f.status();
  auto items = j.find("items");
  if (items == j.end() || !items->is_array() || items->size() > kMaxChunkItems) {
    return InvalidArgument("'items' must be an array of at most " + std::to_string(kMaxChunkItems) + " items");
  }
  m->items.clear();
  m->items.reserve(items->size());
  for (const json& item : *items) {
    if (!item.is_array() || item.size() != 4) {
      return InvalidArgument("each of 'items' must be [piece, offset, ring_offset, bytes]");
    }
    uint64_t v[4];
    for (size_t k = 0; k < 4; ++k) {
      if (!item[k].is_number_unsigned()) {
        return InvalidArgument("each of 'items' must be 4 non-negative integers [piece, offset, ring_offset, bytes]");
      }
      v[k] = item[k].get<uint64_t>();
    }
    m->items.push_back(WriteChunkItem{v[0], v[1], v[2], v[3]});
  }
  return Status::Ok();
}

json Encode(const WriteReadyEvent& m) {
  return json{{"v", kProtocolVersion}, {"event", kWriteReadyEvent}, {"generation", m.generation}};
}

Status Decode(const json& j, WriteReadyEvent* m) {
  Fields f(j, "write_ready", false);
  f.Required("generation", &m->generation);
  return f.status();
}

json Encode(const WriteAckEvent& m) { return json{{"v", kProtocolVersion}, {"event", kWriteAckEvent}, {"slot", m.slot}}; }

Status Decode(const json& j, WriteAckEvent* m) {
  Fields f(j, "write_ack", false);
  f.Required("slot", &m->slot);
  return f.status();
}

}  // namespace ckpt::protocol
