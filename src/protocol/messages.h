// The protocol's messages: one struct per request, response and event, each the wire's own
// type (not the public structs of include/ckpt/: the client maps between the two in
// client/wire_mapping.h, the daemon builds these directly). Framing and the
// {"v", "ok"/"code"/"error"} envelope are in protocol/wire.h.
//
// Each struct's JSON is one table in messages.cc (its keys, which are required, which are
// left out when unset), which drives both Encode and Decode: no field is named twice.
// Decode() checks every field's type and range and fails naming the field (by its path,
// e.g. 'pieces[2].key'); absent optional fields keep the struct's default. A bad request
// is InvalidArgument; a bad response or event is Corrupt ("malformed ... response from
// ckptd"). Neither throws. Policy (who may do what, which names are allowed) is the
// daemon's, not the protocol's: see daemon/policy.h.
//
// Every message type is in one of the lists at the end (Requests, Responses, Events);
// tests/protocol/messages_test.cc checks each of them against golden JSON, so a message
// added there without a test does not compile.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <type_traits>
#include <vector>

#include "ckpt/dtype.h"
#include "ckpt/status.h"

namespace ckpt::protocol {

// ---- parts of messages ----

// One checkpoint generation (see ckpt::CheckpointSummary for each field's meaning).
struct WireSummary {
  std::string name;
  uint64_t generation = 0;
  std::string shm_name;
  std::string segment_id;  // empty: not reported (left out)
  std::string source;
  std::string format;
  uint64_t segment_bytes = 0;
  uint64_t data_bytes = 0;
  uint64_t tensor_count = 0;
  double load_seconds = 0;
  int64_t loaded_unix_s = 0;
  uint32_t attached = 0;
  std::vector<int64_t> attached_pids;
  uint64_t page_bytes = 0;            // 0: not reported (left out)
  int64_t huge_bytes = -1;            // -1: not known (left out)
  std::string source_fingerprint;     // empty: not known (left out)
  uint32_t owner_uid = 0;
  std::string owner_user;
  bool owner_admin = false;
};

// One tensor of a checkpoint's index: dtype by its safetensors name, checksum as 16 hex digits.
struct WireTensor {
  std::string name;
  DType dtype = DType::kU8;
  std::vector<int64_t> shape;
  uint64_t nbytes = 0;
  uint64_t checksum = 0;
};

// A side file kept with a checkpoint: its name and size.
struct WireSideFile {
  std::string name;
  uint64_t bytes = 0;
};

struct WireEvictions {
  uint64_t by_request = 0;
  uint64_t for_budget = 0;
  uint64_t replaced = 0;
};

// ---- requests (each names its op) ----

struct StatusRequest {
  static constexpr const char* kOp = "status";
};
struct MetricsRequest {
  static constexpr const char* kOp = "metrics";
};
struct ListRequest {
  static constexpr const char* kOp = "list";
};
struct InfoRequest {
  static constexpr const char* kOp = "info";
  std::string name;
};
struct VerifyRequest {
  static constexpr const char* kOp = "verify";
  std::string name;
};

struct LoadRequest {
  static constexpr const char* kOp = "load";
  std::string path;       // absolute
  std::string name;       // empty: the daemon derives one from the path
  bool progress = false;  // send progress events (and watch the connection for a cancel)
  bool replace = false;
  bool allow_expansion = false;
};

// Loads `path` under `name` unless that name already holds the file's current content
// (see Client::Ensure).
struct EnsureRequest {
  static constexpr const char* kOp = "ensure";
  std::string path;       // absolute
  std::string name;       // empty: the daemon derives one from the path
  bool progress = false;  // send progress events while a load runs or is waited for
  bool allow_expansion = false;
};

struct EvictRequest {
  static constexpr const char* kOp = "evict";
  std::string name;
  bool force = false;
  double wait_s = 0;  // 0 to 86400
};

struct AttachRequest {
  static constexpr const char* kOp = "attach";
  std::string name;
  uint64_t generation = 0;  // 0: the current one; set by a lease re-registering after a restart
  std::string segment_id;   // empty: any; else the segment identity the lease names
};

struct RendezvousRequest {
  static constexpr const char* kOp = "rendezvous";
  std::string job;
  int64_t rank = 0;
  int64_t world = 0;
  bool has_value = false;  // "value" present (rank 0 publishes); not a key of its own
  std::string value_hex;
  double timeout_s = 60;   // 0 to 3600
};

// Sent by a client, on the connection of a load in progress, to cancel that load. It has
// no response of its own when the load consumed it (the load then answers Cancelled);
// outside a load it is answered CancelResponse{cancelled: false}.
struct CancelRequest {
  static constexpr const char* kOp = "cancel";
};

// ---- the write path (issue 15; docs/write-path.md) ----
// A part (rank) of a write connects, sends one WriteRequest with its staging ring (a
// sealed memfd, SCM_RIGHTS), and keeps that connection for the whole write: the daemon
// answers with a WriteReadyEvent once every part declared and the segment exists, then
// the part sends WriteChunkRequests (each answered by a WriteAckEvent once its ring bytes
// were copied) and finally one WriteSealRequest (or a CancelRequest: abort). The request's
// one response (a LoadResponse, or the error that failed the whole generation) comes after
// the seal, when every part sealed and the generation is published.

// One piece of a global tensor that a part writes: a box (offsets, shape) or, with `flat`,
// the elements [start, start + numel) of the flattened tensor (a ZeRO partition). A box
// whose offsets (shape) are absent on the wire starts at 0 (covers the global shape).
struct WritePiece {
  std::string key;
  DType dtype = DType::kU8;
  std::vector<int64_t> global_shape;
  bool flat = false;
  std::vector<int64_t> offsets;  // box: the piece's first index in each dim
  std::vector<int64_t> shape;    // box: its extent in each dim
  uint64_t start = 0;            // flat
  uint64_t numel = 0;            // flat
};

// A side file a write publishes: its bytes (any bytes), hex on the wire as "data".
struct WriteSideFile {
  std::string name;
  std::string bytes;
};

struct WriteRequest {
  static constexpr const char* kOp = "write";
  std::string name;
  std::string job;         // shared by every part; empty only when parts == 1
  int64_t part = 0;
  int64_t parts = 1;       // 1 to kMaxWriteParts
  bool replace = false;
  double timeout_s = 600;  // the whole write, from its first part's request (0 to 86400)
  uint64_t ring_bytes = 0; // size of the ring passed with the request (0: no ring, no bytes)
  std::vector<WritePiece> pieces;
  std::vector<WriteSideFile> side_files;
};
inline constexpr int64_t kMaxWriteParts = 65536;

// Ring bytes [ring_offset, ring_offset + bytes) are the next `bytes` bytes of piece
// `piece` (an index into the part's pieces), starting at byte `offset` of the piece's
// row-major bytes (a box) or of its flat range. On the wire: [piece, offset, ring_offset, bytes].
struct WriteChunkItem {
  uint64_t piece = 0;
  uint64_t offset = 0;
  uint64_t ring_offset = 0;
  uint64_t bytes = 0;
};
// Items a client puts in one write_chunk frame: each is at most about 70 bytes of JSON,
// so a frame stays under kMaxRequestBytes however small the pieces (many small tensors
// fill one ring slot with more items than that: the client sends the slot in parts).
inline constexpr size_t kWriteChunkItemsPerFrame = 8192;
struct WriteChunkRequest {
  static constexpr const char* kOp = "write_chunk";
  uint64_t slot = 0;  // echoed by the ack: the ring region the client may reuse then
  std::vector<WriteChunkItem> items;
};
struct WriteSealRequest {
  static constexpr const char* kOp = "write_seal";
};

// ---- responses ----

// load and write (what was published, and what the budget evicted for it).
struct LoadResponse {
  WireSummary checkpoint;
  std::vector<std::string> evicted;
};
// ensure; `action` is "loaded", "reloaded", "joined" or "current" (see ckpt::EnsureResult).
struct EnsureResponse {
  WireSummary checkpoint;
  std::vector<std::string> evicted;
  std::string action;
};
// evict and attach.
struct CheckpointResponse {
  WireSummary checkpoint;
};
struct ListResponse {
  std::vector<WireSummary> checkpoints;
  std::vector<std::string> loading;
};
struct InfoResponse {
  WireSummary checkpoint;
  std::vector<WireTensor> tensors;
  std::vector<WireSideFile> side_files;  // absent from daemons before 0.1.0's issue 22
};
struct VerifyResponse {
  std::string name;
  uint64_t generation = 0;
  bool passed = false;
  uint64_t tensors = 0;
  uint64_t bytes = 0;
  double seconds = 0;
  uint64_t mismatch_count = 0;
  std::vector<std::string> mismatched;
};
// status (see ckpt::DaemonStatus for each field's meaning).
struct StatusResponse {
  std::string version;
  int32_t protocol = 0;
  int64_t pid = 0;
  int64_t uptime_s = 0;
  std::string socket;
  std::string shm_prefix;
  std::string segment_dir;  // empty: left out
  uint64_t checkpoints = 0;
  uint64_t loading = 0;
  uint64_t shm_bytes = 0;
  uint64_t memory_budget_bytes = 0;
  uint64_t memory_used_bytes = 0;
  uint64_t attached = 0;
  int64_t connections = 0;
  int64_t max_connections = 0;
  int64_t max_connections_per_uid = 0;
  int64_t admin_reserved_connections = 0;
  std::vector<std::string> model_roots;
  WireEvictions evictions;
  std::string your_role;
  uint32_t your_uid = 0;
  uint64_t your_shm_bytes = 0;
  uint64_t your_segments = 0;
  uint64_t your_writes = 0;
  uint64_t max_shm_bytes_per_uid = 0;
  uint64_t max_segments_per_uid = 0;
  uint64_t max_writes_per_uid = 0;
  std::vector<WireSummary> checkpoint_list;
  std::vector<WireSummary> retired;
  std::string segment_pages;        // empty: left out
  uint64_t segment_page_bytes = 0;  // 0: left out
};
struct RendezvousResponse {
  std::string value_hex;  // "value" on the wire
};
struct MetricsResponse {
  std::string text;
};
struct CancelResponse {
  bool cancelled = false;
};

// ---- events (frames before a response; Encode adds their "v" and "event") ----

struct ProgressEvent {
  static constexpr const char* kEvent = "progress";
  uint64_t done = 0;
  uint64_t total = 0;
};
// The daemon closes the connection right after this frame (idle, or stopping) without
// having read any request that follows: a request sent meanwhile may be repeated.
struct ClosingEvent {
  static constexpr const char* kEvent = "closing";
  std::string reason;
};
struct WriteReadyEvent {
  static constexpr const char* kEvent = "write_ready";
  uint64_t generation = 0;
};
struct WriteAckEvent {
  static constexpr const char* kEvent = "write_ack";
  uint64_t slot = 0;
};
inline constexpr const char* kProgressEvent = ProgressEvent::kEvent;
inline constexpr const char* kClosingEvent = ClosingEvent::kEvent;
inline constexpr const char* kWriteReadyEvent = WriteReadyEvent::kEvent;
inline constexpr const char* kWriteAckEvent = WriteAckEvent::kEvent;

// ---- the registry ----

template <typename... T>
struct TypeList {};

// Every request a client may send (their kOp are the ops), every response and every event.
using Requests = TypeList<StatusRequest, MetricsRequest, ListRequest, InfoRequest, VerifyRequest, LoadRequest,
                          EnsureRequest, EvictRequest, AttachRequest, RendezvousRequest, CancelRequest, WriteRequest,
                          WriteChunkRequest, WriteSealRequest>;
using Responses = TypeList<LoadResponse, EnsureResponse, CheckpointResponse, ListResponse, InfoResponse,
                           VerifyResponse, StatusResponse, RendezvousResponse, MetricsResponse, CancelResponse>;
using Events = TypeList<ProgressEvent, ClosingEvent, WriteReadyEvent, WriteAckEvent>;
// Structs that are parts of messages and have a JSON object of their own.
using Parts = TypeList<WireSummary, WireTensor, WireSideFile, WireEvictions, WritePiece, WriteSideFile>;

template <typename T, typename List>
struct InList;
template <typename T, typename... Ts>
struct InList<T, TypeList<Ts...>> : std::bool_constant<(std::is_same_v<T, Ts> || ...)> {};

template <typename T>
inline constexpr bool kIsRequest = InList<T, Requests>::value;
template <typename T>
inline constexpr bool kIsEvent = InList<T, Events>::value;
template <typename T>
inline constexpr bool kIsMessage =
    kIsRequest<T> || InList<T, Responses>::value || kIsEvent<T> || InList<T, Parts>::value;

// Every op a client may send: the kOp of each of Requests. The daemon's table of
// operations (daemon/request_handler.cc) has exactly these (tests/daemon/ownership_test.cc
// checks it); an op it does not list is refused.
std::vector<std::string> KnownOps();

// The version and op of a request. Unsupported for another protocol version;
// InvalidArgument without an op.
Result<std::string> DecodeOp(const nlohmann::json& request);

// The "event" field of a frame ("" if it is not an event).
std::string EventName(const nlohmann::json& frame);

namespace detail {
// Defined in messages.cc for every type of the lists above.
template <typename M>
struct Codec {
  static nlohmann::json Encode(const M& m);
  static Status Decode(const nlohmann::json& j, M* m);
};
}  // namespace detail

// The JSON of `m`: every field, optional ones only when set; events with "v" and "event";
// requests without "v" and "op" (the connection adds them). Never throws.
template <typename M>
nlohmann::json Encode(const M& m) {
  static_assert(kIsMessage<M>, "not a protocol message: add it to a list in protocol/messages.h");
  return detail::Codec<M>::Encode(m);
}

// Reads `j` into `*m` (see the top of this file for the errors). Never throws.
template <typename M>
Status Decode(const nlohmann::json& j, M* m) {
  static_assert(kIsMessage<M>, "not a protocol message: add it to a list in protocol/messages.h");
  return detail::Codec<M>::Decode(j, m);
}

// Decodes into a fresh M.
template <typename M>
Result<M> DecodeAs(const nlohmann::json& j) {
  M m;
  Status st = Decode(j, &m);
  if (!st.ok()) return st;
  return m;
}

}  // namespace ckpt::protocol
