// The protocol's messages: one struct per request, response and event, and their JSON
// encoding, in one place. The daemon decodes requests and encodes responses with these;
// the C++ Client (and through it ckptctl and the Python module) encodes requests and
// decodes responses with them. Framing and the {"v", "ok"/"code"/"error"} envelope are
// in protocol/wire.h.
//
// Decode() checks every field's type and range and returns InvalidArgument (a request)
// naming the field; absent optional fields keep the struct's default. Encode() writes
// every field (optional ones only when set). Policy (who may do what, which names are
// allowed) is the daemon's, not the protocol's: see daemon/policy.h.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "ckpt/client.h"
#include "ckpt/status.h"
#include "ckpt/tensor.h"

namespace ckpt::protocol {

// ---- requests (each names its op) ----

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

// info and verify take just a name.
struct NameRequest {
  std::string name;
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
  bool has_value = false;  // "value" present (rank 0 publishes)
  std::string value_hex;
  double timeout_s = 60;   // 0 to 3600
};

// Sent by a client, on the connection of a load in progress, to cancel that load. It has
// no response of its own when the load consumed it (the load then answers Cancelled);
// outside a load it is answered CancelResponse{cancelled: false}.
struct CancelRequest {
  static constexpr const char* kOp = "cancel";
};

// ---- responses ----

struct CheckpointResponse {  // evict and attach
  CheckpointSummary checkpoint;
};
struct RendezvousResponse {
  std::string value_hex;
};
struct MetricsResponse {
  std::string text;
};
struct CancelResponse {
  bool cancelled = false;
};

// ---- events (frames before a response) ----

struct ProgressEvent {
  uint64_t done = 0;
  uint64_t total = 0;
};
// The daemon closes the connection right after this frame (idle, or stopping) without
// having read any request that follows: a request sent meanwhile may be repeated.
struct ClosingEvent {
  std::string reason;
};
inline constexpr const char* kProgressEvent = "progress";
inline constexpr const char* kClosingEvent = "closing";

// Ops whose request is a NameRequest or has no fields.
inline constexpr const char* kStatusOp = "status";
inline constexpr const char* kMetricsOp = "metrics";
inline constexpr const char* kListOp = "list";
inline constexpr const char* kInfoOp = "info";
inline constexpr const char* kVerifyOp = "verify";

// Every op a client may send. The daemon's table of operations (daemon/request_handler.cc)
// has exactly these (tests/daemon/op_table_test.cc checks it); an op it does not list is
// refused.
std::vector<std::string> KnownOps();

// The version and op of a request. Unsupported for another protocol version;
// InvalidArgument without an op.
Result<std::string> DecodeOp(const nlohmann::json& request);

nlohmann::json Encode(const LoadRequest& m);
nlohmann::json Encode(const EvictRequest& m);
nlohmann::json Encode(const EnsureRequest& m);
nlohmann::json Encode(const EnsureResult& m);
nlohmann::json Encode(const NameRequest& m);
nlohmann::json Encode(const AttachRequest& m);
nlohmann::json Encode(const RendezvousRequest& m);
nlohmann::json Encode(const CheckpointSummary& m);
nlohmann::json Encode(const CheckpointList& m);
nlohmann::json Encode(const CheckpointInfo& m);
nlohmann::json Encode(const LoadResult& m);
nlohmann::json Encode(const VerifyResult& m);
nlohmann::json Encode(const DaemonStatus& m);
nlohmann::json Encode(const CheckpointResponse& m);
nlohmann::json Encode(const RendezvousResponse& m);
nlohmann::json Encode(const MetricsResponse& m);
nlohmann::json Encode(const CancelResponse& m);
// Events carry their "v" and "event" fields.
nlohmann::json Encode(const ProgressEvent& m);
nlohmann::json Encode(const ClosingEvent& m);
nlohmann::json EncodeTensor(const TensorInfo& t);

// Requests: InvalidArgument naming the field that is missing or of the wrong type.
Status Decode(const nlohmann::json& j, LoadRequest* m);
Status Decode(const nlohmann::json& j, EvictRequest* m);
Status Decode(const nlohmann::json& j, EnsureRequest* m);
Status Decode(const nlohmann::json& j, NameRequest* m);
Status Decode(const nlohmann::json& j, AttachRequest* m);
Status Decode(const nlohmann::json& j, RendezvousRequest* m);
// Responses and events: Corrupt ("malformed ... response from ckptd") on a bad field.
Status Decode(const nlohmann::json& j, CheckpointSummary* m);
Status Decode(const nlohmann::json& j, CheckpointList* m);
Status Decode(const nlohmann::json& j, CheckpointInfo* m);
Status Decode(const nlohmann::json& j, LoadResult* m);
Status Decode(const nlohmann::json& j, EnsureResult* m);
Status Decode(const nlohmann::json& j, VerifyResult* m);
Status Decode(const nlohmann::json& j, DaemonStatus* m);
Status Decode(const nlohmann::json& j, CheckpointResponse* m);
Status Decode(const nlohmann::json& j, RendezvousResponse* m);
Status Decode(const nlohmann::json& j, MetricsResponse* m);
Status Decode(const nlohmann::json& j, CancelResponse* m);
Status Decode(const nlohmann::json& j, ProgressEvent* m);
Status Decode(const nlohmann::json& j, ClosingEvent* m);

// The "event" field of a frame ("" if it is not an event).
std::string EventName(const nlohmann::json& frame);

// Decodes into a fresh T.
template <typename T>
Result<T> DecodeAs(const nlohmann::json& j) {
  T m;
  Status st = Decode(j, &m);
  if (!st.ok()) return st;
  return m;
}

// ---- the write path (issue 15; docs/write-path.md) ----
// A part (rank) of a write connects, sends one WriteRequest with its staging ring (a
// sealed memfd, SCM_RIGHTS), and keeps that connection for the whole write: the daemon
// answers with a WriteReadyEvent once every part declared and the segment exists, then
// the part sends WriteChunkRequests (each answered by a WriteAckEvent once its ring bytes
// were copied) and finally one WriteSealRequest (or a CancelRequest: abort). The request's
// one response (a LoadResult, or the error that failed the whole generation) comes after
// the seal, when every part sealed and the generation is published.

// One piece of a global tensor that a part writes: a box (offsets, shape) or, with `flat`,
// the elements [start, start + numel) of the flattened tensor (a ZeRO partition).
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
  std::vector<std::pair<std::string, std::string>> side_files;  // (name, bytes); hex on the wire
};
inline constexpr int64_t kMaxWriteParts = 65536;

// Ring bytes [ring_offset, ring_offset + bytes) are the next `bytes` bytes of piece
// `piece` (an index into the part's pieces), starting at byte `offset` of the piece's
// row-major bytes (a box) or of its flat range.
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

struct WriteReadyEvent {
  uint64_t generation = 0;
};
struct WriteAckEvent {
  uint64_t slot = 0;
};
inline constexpr const char* kWriteReadyEvent = "write_ready";
inline constexpr const char* kWriteAckEvent = "write_ack";

nlohmann::json Encode(const WriteRequest& m);
nlohmann::json Encode(const WriteChunkRequest& m);
nlohmann::json Encode(const WriteReadyEvent& m);
nlohmann::json Encode(const WriteAckEvent& m);
// Requests: InvalidArgument naming the bad field (pieces' dtypes and dims are checked here;
// their coverage is the daemon's, see daemon/write_sessions.h).
Status Decode(const nlohmann::json& j, WriteRequest* m);
Status Decode(const nlohmann::json& j, WriteChunkRequest* m);
// Events: Corrupt on a bad field.
Status Decode(const nlohmann::json& j, WriteReadyEvent* m);
Status Decode(const nlohmann::json& j, WriteAckEvent* m);

}  // namespace ckpt::protocol
