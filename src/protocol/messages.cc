#include "protocol/messages.h"

#include <cstdio>
#include <limits>
#include <tuple>
#include <utility>

#include "common/hex.h"
#include "protocol/wire.h"

namespace ckpt::protocol {

using nlohmann::json;

namespace {

// ---- the machinery: one table of fields per struct drives Encode and Decode ----

// How a field's value is written: as its C++ type says (Plain), or as text.
struct Plain {};
struct HexU64 {};    // a uint64_t as 16 lower-case hex digits (a checksum); 1 to 16 digits are read
struct HexBytes {};  // a std::string of any bytes as lower-case hex

// One key of a struct's JSON. `required`: Decode fails without it. Encode writes it unless
// kSkipDefault and it holds the value of a default-constructed M, or `when` says no.
// `max_items`: an array longer than this is refused before its items are read (0: no limit).
template <typename M, typename T, typename C, bool kSkipDefault>
struct Field {
  using Codec = C;
  static constexpr bool kSkip = kSkipDefault;
  const char* key;
  T M::*member;
  bool required;
  bool (*when)(const M&) = nullptr;
  size_t max_items = 0;
  Field Max(size_t n) const {
    Field f = *this;
    f.max_items = n;
    return f;
  }
};

// Required: always written, Decode fails without it.
template <typename C = Plain, typename M, typename T>
Field<M, T, C, false> Req(const char* key, T M::*member) {
  return {key, member, true};
}
// Optional: always written, absent keeps the default.
template <typename C = Plain, typename M, typename T>
Field<M, T, C, false> Opt(const char* key, T M::*member) {
  return {key, member, false};
}
// Optional, and left out while it holds its default.
template <typename C = Plain, typename M, typename T>
Field<M, T, C, true> Unset(const char* key, T M::*member) {
  return {key, member, false};
}
// Optional, written only when when(m).
template <typename C = Plain, typename M, typename T>
Field<M, T, C, false> When(const char* key, T M::*member, bool (*when)(const M&)) {
  return {key, member, false, when};
}

// A struct's table: what it is called in a malformed-response error, and its fields.
template <typename... Fs>
std::pair<const char*, std::tuple<Fs...>> Table(const char* what, Fs... fields) {
  return {what, std::tuple<Fs...>(fields...)};
}

// The first error of one Decode. Paths name fields as 'pieces[2].key'.
class Errors {
 public:
  explicit Errors(bool request) : request_(request) {}
  bool ok() const { return message_.empty(); }
  bool request() const { return request_; }
  void Fail(std::string message) {
    if (ok()) message_ = std::move(message);
  }
  const std::string& message() const { return message_; }

 private:
  bool request_;
  std::string message_;
};

std::string Quoted(const std::string& path) { return "'" + path + "'"; }
std::string Join(const std::string& path, const char* key) { return path.empty() ? key : path + "." + key; }
// The prefix of a message about the struct at `path` as a whole ("" at the top).
std::string At(const std::string& path) { return path.empty() ? "" : path + ": "; }

template <typename T>
struct IsVector : std::false_type {};
template <typename T>
struct IsVector<std::vector<T>> : std::true_type {};

template <typename M>
json EncodeObject(const M& m);
template <typename M>
void DecodeObject(const json& j, M* m, const std::string& path, Errors& e);

// ---- values ----

template <typename T>
json Put(const T& v) {
  if constexpr (std::is_same_v<T, DType>) {
    return DTypeName(v);
  } else if constexpr (std::is_same_v<T, WriteChunkItem>) {
    return json::array({v.piece, v.offset, v.ring_offset, v.bytes});
  } else if constexpr (IsVector<T>::value) {
    json out = json::array();
    for (const auto& item : v) out.push_back(Put(item));
    return out;
  } else if constexpr (InList<T, Parts>::value) {
    return EncodeObject(v);
  } else {
    static_assert(std::is_arithmetic_v<T> || std::is_same_v<T, std::string>);
    return json(v);
  }
}

template <typename C, typename T>
json PutAs(const T& v) {
  if constexpr (std::is_same_v<C, HexU64>) {
    return ckpt::Hex64(v);
  } else if constexpr (std::is_same_v<C, HexBytes>) {
    return HexEncode(v);
  } else {
    return Put(v);
  }
}

// Reads `v` (the value at `path`) into *out, or records why not.
template <typename T>
void Get(const json& v, T* out, const std::string& path, size_t max_items, Errors& e) {
  auto fail = [&](const char* expected) { e.Fail(Quoted(path) + " must be " + expected); };
  if constexpr (std::is_same_v<T, std::string>) {
    if (!v.is_string()) return fail("a string");
    *out = v.get<std::string>();
  } else if constexpr (std::is_same_v<T, bool>) {
    if (!v.is_boolean()) return fail("a boolean");
    *out = v.get<bool>();
  } else if constexpr (std::is_same_v<T, uint64_t>) {
    if (!v.is_number_unsigned()) return fail("a non-negative integer");
    *out = v.get<uint64_t>();
  } else if constexpr (std::is_same_v<T, uint32_t>) {
    if (!v.is_number_unsigned() || v.get<uint64_t>() > std::numeric_limits<uint32_t>::max()) {
      return fail("a non-negative 32-bit integer");
    }
    *out = v.get<uint32_t>();
  } else if constexpr (std::is_same_v<T, int64_t>) {
    if (!v.is_number_integer()) return fail("an integer");
    if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return fail("an integer below 2^63");
    }
    *out = v.get<int64_t>();
  } else if constexpr (std::is_same_v<T, int32_t>) {
    const bool in_range =
        v.is_number_integer() &&
        (v.is_number_unsigned() ? v.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<int32_t>::max())
                                : v.get<int64_t>() >= std::numeric_limits<int32_t>::min() &&
                                      v.get<int64_t>() <= std::numeric_limits<int32_t>::max());
    if (!in_range) return fail("a 32-bit integer");
    *out = static_cast<int32_t>(v.get<int64_t>());
  } else if constexpr (std::is_same_v<T, double>) {
    if (!v.is_number()) return fail("a number");
    *out = v.get<double>();
  } else if constexpr (std::is_same_v<T, DType>) {
    if (!v.is_string()) return fail("a dtype name");
    auto parsed = DTypeFromName(v.get<std::string>());
    if (!parsed) return e.Fail(Quoted(path) + " is an unknown dtype '" + v.get<std::string>().substr(0, 32) + "'");
    *out = *parsed;
  } else if constexpr (std::is_same_v<T, WriteChunkItem>) {
    constexpr const char* kShape = "[piece, offset, ring_offset, bytes], 4 non-negative integers";
    if (!v.is_array() || v.size() != 4) return fail(kShape);
    for (const json& n : v) {
      if (!n.is_number_unsigned()) return fail(kShape);
    }
    *out = WriteChunkItem{v[0].get<uint64_t>(), v[1].get<uint64_t>(), v[2].get<uint64_t>(), v[3].get<uint64_t>()};
  } else if constexpr (IsVector<T>::value) {
    if (!v.is_array()) return fail("an array");
    if (max_items != 0 && v.size() > max_items) {
      return e.Fail(Quoted(path) + " must be an array of at most " + std::to_string(max_items) + " items");
    }
    T items(v.size());
    for (size_t i = 0; i < v.size() && e.ok(); ++i) {
      Get(v[i], &items[i], path + "[" + std::to_string(i) + "]", 0, e);
    }
    if (e.ok()) *out = std::move(items);
  } else {
    static_assert(InList<T, Parts>::value, "a field of a type the protocol cannot read");
    DecodeObject(v, out, path, e);
  }
}

template <typename C, typename T>
void GetAs(const json& v, T* out, const std::string& path, size_t max_items, Errors& e) {
  if constexpr (std::is_same_v<C, HexU64>) {
    const std::optional<uint64_t> parsed =
        v.is_string() ? ckpt::ParseHex64(v.get_ref<const std::string&>()) : std::nullopt;
    if (!parsed) return e.Fail(Quoted(path) + " must be 1 to 16 lower-case hex digits");
    *out = *parsed;
  } else if constexpr (std::is_same_v<C, HexBytes>) {
    if (!v.is_string()) return e.Fail(Quoted(path) + " must be a string");
    auto bytes = HexDecode(v.get<std::string>());
    if (!bytes.ok()) return e.Fail(Quoted(path) + ": " + bytes.status().message());
    *out = std::move(bytes).value();
  } else {
    Get(v, out, path, max_items, e);
  }
}

// ---- the tables (one per struct) and the checks beyond types ----

// Checks of a decoded struct beyond its fields' types (ranges, fields that depend on
// others); `j` is its JSON object. None unless a struct has its own below.
template <typename M>
void Check(const json&, M*, const std::string&, Errors&) {}

// Requests.
auto Schema(const StatusRequest*) { return Table("status"); }
auto Schema(const MetricsRequest*) { return Table("metrics"); }
auto Schema(const ListRequest*) { return Table("list"); }
auto Schema(const InfoRequest*) { return Table("info", Req("name", &InfoRequest::name)); }
auto Schema(const VerifyRequest*) { return Table("verify", Req("name", &VerifyRequest::name)); }
auto Schema(const CancelRequest*) { return Table("cancel"); }
auto Schema(const WriteSealRequest*) { return Table("write_seal"); }

auto Schema(const LoadRequest*) {
  return Table("load", Req("path", &LoadRequest::path), Unset("name", &LoadRequest::name),
               Opt("progress", &LoadRequest::progress), Unset("replace", &LoadRequest::replace),
               Unset("allow_expansion", &LoadRequest::allow_expansion));
}

auto Schema(const EnsureRequest*) {
  return Table("ensure", Req("path", &EnsureRequest::path), Unset("name", &EnsureRequest::name),
               Opt("progress", &EnsureRequest::progress), Unset("allow_expansion", &EnsureRequest::allow_expansion));
}

auto Schema(const EvictRequest*) {
  return Table("evict", Req("name", &EvictRequest::name), Opt("force", &EvictRequest::force),
               Unset("wait_s", &EvictRequest::wait_s));
}
void Check(const json&, EvictRequest* m, const std::string& path, Errors& e) {
  if (!(m->wait_s >= 0 && m->wait_s <= 86400)) e.Fail("'wait_s' must be a number of seconds from 0 to 86400");
}

auto Schema(const AttachRequest*) {
  return Table("attach", Req("name", &AttachRequest::name), Unset("generation", &AttachRequest::generation),
               Unset("segment_id", &AttachRequest::segment_id));
}

bool HasValue(const RendezvousRequest& m) { return m.has_value; }
auto Schema(const RendezvousRequest*) {
  return Table("rendezvous", Req("job", &RendezvousRequest::job), Req("rank", &RendezvousRequest::rank),
               Req("world", &RendezvousRequest::world), When("value", &RendezvousRequest::value_hex, HasValue),
               Opt("timeout_s", &RendezvousRequest::timeout_s));
}
void Check(const json& j, RendezvousRequest* m, const std::string& path, Errors& e) {
  m->has_value = j.contains("value");
  if (m->world < 1 || m->world > 65536) e.Fail("'world' must be 1 to 65536, not " + std::to_string(m->world));
  if (m->rank < 0 || m->rank >= m->world) {
    e.Fail("'rank' must be in [0, world): rank " + std::to_string(m->rank) + ", world " + std::to_string(m->world));
  }
  if (!(m->timeout_s >= 0 && m->timeout_s <= 3600)) e.Fail("'timeout_s' must be a number of seconds from 0 to 3600");
}

constexpr size_t kMaxWritePieces = 1u << 20;
constexpr size_t kMaxChunkItems = 1u << 16;
static_assert(kWriteChunkItemsPerFrame <= kMaxChunkItems);

bool IsFlat(const WritePiece& p) { return p.flat; }
bool IsBox(const WritePiece& p) { return !p.flat; }
auto Schema(const WritePiece*) {
  return Table("write", Req("key", &WritePiece::key), Req("dtype", &WritePiece::dtype),
               Req("global_shape", &WritePiece::global_shape), When("flat", &WritePiece::flat, IsFlat),
               When("offsets", &WritePiece::offsets, IsBox), When("shape", &WritePiece::shape, IsBox),
               When("start", &WritePiece::start, IsFlat), When("numel", &WritePiece::numel, IsFlat));
}
void Check(const json& j, WritePiece* p, const std::string& path, Errors& e) {
  const std::string at = At(path);
  const std::string which = at + "'" + p->key.substr(0, 64) + "': ";
  if (p->flat) {
    for (const char* key : {"start", "numel"}) {
      if (!j.contains(key)) return e.Fail("request lacks " + Quoted(Join(path, key)));
    }
    p->offsets.clear();  // a flat piece has no box
    p->shape.clear();
  } else {
    p->start = p->numel = 0;  // nor a box a flat range
  }
  if (p->key.empty() || p->key.size() > 1024) return e.Fail(at + "a key must be 1 to 1024 bytes");
  if (p->global_shape.size() > 8) return e.Fail(which + "more than 8 dims");
  for (int64_t d : p->global_shape) {
    if (d < 0) return e.Fail(which + "a negative dimension");
  }
  if (p->flat) return;
  // A box defaults to the whole tensor.
  if (p->offsets.empty()) p->offsets.assign(p->global_shape.size(), 0);
  if (p->shape.empty() && !j.contains("shape")) p->shape = p->global_shape;
  if (p->offsets.size() != p->global_shape.size() || p->shape.size() != p->global_shape.size()) {
    return e.Fail(which + "offsets and shape must have one entry per dim of global_shape");
  }
  for (size_t d = 0; d < p->shape.size(); ++d) {
    if (p->offsets[d] < 0 || p->shape[d] < 0 || p->offsets[d] > p->global_shape[d] ||
        p->shape[d] > p->global_shape[d] - p->offsets[d]) {
      return e.Fail(which + "the box leaves the global shape in dim " + std::to_string(d));
    }
  }
}

auto Schema(const WriteSideFile*) {
  return Table("write", Req("name", &WriteSideFile::name), Req<HexBytes>("data", &WriteSideFile::bytes));
}

bool HasSideFiles(const WriteRequest& m) { return !m.side_files.empty(); }
auto Schema(const WriteRequest*) {
  return Table("write", Req("name", &WriteRequest::name), Unset("job", &WriteRequest::job),
               Opt("part", &WriteRequest::part), Opt("parts", &WriteRequest::parts),
               Unset("replace", &WriteRequest::replace), Opt("timeout_s", &WriteRequest::timeout_s),
               Opt("ring_bytes", &WriteRequest::ring_bytes), Req("pieces", &WriteRequest::pieces).Max(kMaxWritePieces),
               When("side_files", &WriteRequest::side_files, HasSideFiles));
}
void Check(const json&, WriteRequest* m, const std::string& path, Errors& e) {
  if (m->parts < 1 || m->parts > kMaxWriteParts) {
    return e.Fail("'parts' must be 1 to " + std::to_string(kMaxWriteParts) + ", not " + std::to_string(m->parts));
  }
  if (m->part < 0 || m->part >= m->parts) {
    return e.Fail("'part' must be in [0, parts): part " + std::to_string(m->part) + ", parts " +
                  std::to_string(m->parts));
  }
  if (!(m->timeout_s >= 0 && m->timeout_s <= 86400)) {
    return e.Fail("'timeout_s' must be a number of seconds from 0 to 86400");
  }
}

auto Schema(const WriteChunkRequest*) {
  return Table("write_chunk", Req("slot", &WriteChunkRequest::slot),
               Req("items", &WriteChunkRequest::items).Max(kMaxChunkItems));
}

// Parts of responses.
auto Schema(const WireSummary*) {
  using S = WireSummary;
  return Table("checkpoint", Req("name", &S::name), Req("generation", &S::generation), Opt("shm_name", &S::shm_name),
               Unset("segment_id", &S::segment_id), Opt("source", &S::source), Opt("format", &S::format),
               Opt("segment_bytes", &S::segment_bytes), Opt("data_bytes", &S::data_bytes),
               Opt("tensor_count", &S::tensor_count), Opt("load_seconds", &S::load_seconds),
               Opt("loaded_unix_s", &S::loaded_unix_s), Opt("attached", &S::attached),
               Opt("attached_pids", &S::attached_pids), Unset("page_bytes", &S::page_bytes),
               Unset("huge_bytes", &S::huge_bytes), Unset("source_fingerprint", &S::source_fingerprint),
               Opt("owner_uid", &S::owner_uid), Opt("owner_user", &S::owner_user),
               Opt("owner_admin", &S::owner_admin));
}

auto Schema(const WireTensor*) {
  return Table("tensor", Req("name", &WireTensor::name), Req("dtype", &WireTensor::dtype),
               Req("shape", &WireTensor::shape), Req("nbytes", &WireTensor::nbytes),
               Req<HexU64>("checksum", &WireTensor::checksum));
}

auto Schema(const WireSideFile*) {
  return Table("side file", Req("name", &WireSideFile::name), Req("bytes", &WireSideFile::bytes));
}

auto Schema(const WireEvictions*) {
  return Table("status", Opt("by_request", &WireEvictions::by_request),
               Opt("for_budget", &WireEvictions::for_budget), Opt("replaced", &WireEvictions::replaced));
}

// Responses.
auto Schema(const LoadResponse*) {
  return Table("load", Req("checkpoint", &LoadResponse::checkpoint), Opt("evicted", &LoadResponse::evicted));
}

auto Schema(const EnsureResponse*) {
  return Table("ensure", Req("checkpoint", &EnsureResponse::checkpoint), Opt("evicted", &EnsureResponse::evicted),
               Req("action", &EnsureResponse::action));
}

auto Schema(const CheckpointResponse*) {
  return Table("checkpoint", Req("checkpoint", &CheckpointResponse::checkpoint));
}

auto Schema(const ListResponse*) {
  return Table("list", Req("checkpoints", &ListResponse::checkpoints), Opt("loading", &ListResponse::loading));
}

auto Schema(const InfoResponse*) {
  return Table("info", Req("checkpoint", &InfoResponse::checkpoint), Req("tensors", &InfoResponse::tensors),
               Opt("side_files", &InfoResponse::side_files));
}

auto Schema(const VerifyResponse*) {
  using V = VerifyResponse;
  return Table("verify", Req("name", &V::name), Req("generation", &V::generation), Req("passed", &V::passed),
               Opt("tensors", &V::tensors), Opt("bytes", &V::bytes), Opt("seconds", &V::seconds),
               Opt("mismatch_count", &V::mismatch_count), Opt("mismatched", &V::mismatched));
}

auto Schema(const StatusResponse*) {
  using S = StatusResponse;
  return Table("status", Req("version", &S::version), Req("protocol", &S::protocol), Req("pid", &S::pid),
               Req("uptime_s", &S::uptime_s), Opt("socket", &S::socket), Req("shm_prefix", &S::shm_prefix),
               Unset("segment_dir", &S::segment_dir), Req("checkpoints", &S::checkpoints),
               Req("loading", &S::loading), Req("shm_bytes", &S::shm_bytes),
               Opt("memory_budget_bytes", &S::memory_budget_bytes), Opt("memory_used_bytes", &S::memory_used_bytes),
               Req("attached", &S::attached), Req("connections", &S::connections),
               Opt("max_connections", &S::max_connections), Opt("max_connections_per_uid", &S::max_connections_per_uid),
               Opt("admin_reserved_connections", &S::admin_reserved_connections),
               Opt("model_roots", &S::model_roots), Opt("evictions", &S::evictions), Opt("your_role", &S::your_role),
               Opt("your_uid", &S::your_uid), Opt("your_shm_bytes", &S::your_shm_bytes),
               Opt("your_segments", &S::your_segments), Opt("your_writes", &S::your_writes),
               Opt("max_shm_bytes_per_uid", &S::max_shm_bytes_per_uid),
               Opt("max_segments_per_uid", &S::max_segments_per_uid),
               Opt("max_writes_per_uid", &S::max_writes_per_uid), Opt("checkpoint_list", &S::checkpoint_list),
               Opt("retired", &S::retired), Unset("segment_pages", &S::segment_pages),
               Unset("segment_page_bytes", &S::segment_page_bytes));
}

auto Schema(const RendezvousResponse*) { return Table("rendezvous", Req("value", &RendezvousResponse::value_hex)); }
auto Schema(const MetricsResponse*) { return Table("metrics", Req("text", &MetricsResponse::text)); }
auto Schema(const CancelResponse*) { return Table("cancel", Opt("cancelled", &CancelResponse::cancelled)); }

// Events.
auto Schema(const ProgressEvent*) {
  return Table("progress", Req("done", &ProgressEvent::done), Req("total", &ProgressEvent::total));
}
auto Schema(const ClosingEvent*) { return Table("closing", Opt("reason", &ClosingEvent::reason)); }
auto Schema(const WriteReadyEvent*) { return Table("write_ready", Req("generation", &WriteReadyEvent::generation)); }
auto Schema(const WriteAckEvent*) { return Table("write_ack", Req("slot", &WriteAckEvent::slot)); }

// ---- encode and decode by the tables ----

// Calls f(field) for each field of M's table, in table order.
template <typename M, typename F>
void ForEachField(F f) {
  std::apply([&](const auto&... field) { (f(field), ...); }, Schema(static_cast<const M*>(nullptr)).second);
}

template <typename M>
json EncodeObject(const M& m) {
  json j = json::object();
  ForEachField<M>([&](const auto& f) {
    using F = std::decay_t<decltype(f)>;
    if constexpr (F::kSkip) {
      static const M defaults{};
      if (m.*f.member == defaults.*f.member) return;
    }
    if (f.when != nullptr && !f.when(m)) return;
    j[f.key] = PutAs<typename F::Codec>(m.*f.member);
  });
  return j;
}

template <typename M>
void DecodeObject(const json& j, M* m, const std::string& path, Errors& e) {
  if (!j.is_object()) return e.Fail(path.empty() ? std::string("is not an object") : Quoted(path) + " must be an object");
  ForEachField<M>([&](const auto& f) {
    using F = std::decay_t<decltype(f)>;
    if (!e.ok()) return;
    const std::string key = Join(path, f.key);
    auto it = j.find(f.key);
    if (it == j.end()) {
      if (f.required) e.Fail((e.request() ? "request lacks " : "no ") + Quoted(key));
      return;
    }
    GetAs<typename F::Codec>(*it, &(m->*f.member), key, f.max_items, e);
  });
  if (e.ok()) Check(j, m, path, e);
}

}  // namespace

namespace detail {

template <typename M>
json Codec<M>::Encode(const M& m) {
  json j = EncodeObject(m);
  if constexpr (kIsEvent<M>) {
    j["v"] = kProtocolVersion;
    j["event"] = M::kEvent;
  }
  return j;
}

template <typename M>
Status Codec<M>::Decode(const json& j, M* m) {
  Errors e(kIsRequest<M> || std::is_same_v<M, WritePiece> || std::is_same_v<M, WriteSideFile>);
  DecodeObject(j, m, "", e);
  if (e.ok()) return Status::Ok();
  if (e.request()) return InvalidArgument(e.message());
  return Corrupt(std::string("malformed ") + Schema(static_cast<const M*>(nullptr)).first +
                 " response from ckptd: " + e.message());
}

template <typename... Ts>
void AddAddresses(TypeList<Ts...>, std::vector<const void*>* out) {
  (out->push_back(reinterpret_cast<const void*>(&Codec<Ts>::Encode)), ...);
  (out->push_back(reinterpret_cast<const void*>(&Codec<Ts>::Decode)), ...);
}

// Never called: it names every message's Codec, so that this file (the only one that has
// their definitions) emits them all for the others to link against.
std::vector<const void*> AllCodecs() {
  std::vector<const void*> out;
  AddAddresses(Requests{}, &out);
  AddAddresses(Responses{}, &out);
  AddAddresses(Events{}, &out);
  AddAddresses(Parts{}, &out);
  return out;
}

}  // namespace detail

namespace {
template <typename... Ts>
std::vector<std::string> OpsOf(TypeList<Ts...>) {
  return {Ts::kOp...};
}
}  // namespace

std::vector<std::string> KnownOps() { return OpsOf(Requests{}); }

Result<std::string> DecodeOp(const json& request) {
  auto v = request.find("v");
  if (v == request.end() || !v->is_number_integer() || v->get<int64_t>() != kProtocolVersion) {
    return Unsupported("protocol version mismatch: this daemon speaks version " + std::to_string(kProtocolVersion));
  }
  auto op = request.find("op");
  if (op == request.end()) return InvalidArgument("request lacks 'op'");
  if (!op->is_string()) return InvalidArgument("'op' must be a string");
  return op->get<std::string>();
}

std::string EventName(const json& frame) {
  auto it = frame.find("event");
  return (it != frame.end() && it->is_string()) ? it->get<std::string>() : std::string();
}

}  // namespace ckpt::protocol
