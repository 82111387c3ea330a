// The protocol's messages, every one of them (the lists of protocol/messages.h):
//  - each Sample below encodes to its golden JSON, which is what the daemon and ckptctl
//    --json sent before the messages were types of their own (the strings were printed
//    by the encoders of 0.1.0 at 77a7e6a: the wire must not change), and that JSON decodes
//    back to it;
//  - removing a required key, giving any key a value of the wrong type, or a value out of
//    range is refused, naming the field (InvalidArgument for a request, Corrupt for a
//    response or an event), never thrown;
//  - a message type without a Sample here does not compile (kEveryMessageHasASample).
#include "protocol/messages.h"

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <utility>
#include <vector>

namespace ckpt::protocol {
namespace {

using nlohmann::json;

// Sample<M>: Cases() are (message, its golden JSON), the first with every field set;
// kRequired the keys a decoder must refuse to go without; Bad() inputs (patches of the
// first case's JSON, null = remove) and a part of the error each must give.
template <typename M>
struct Sample;

struct BadCase {
  json patch;  // merged into the first case's JSON (a null removes the key)
  std::string needle;
};

WireSummary FullSummary() {
  WireSummary s;
  s.name = "gpt";
  s.generation = 7;
  s.shm_name = "ckpt.gpt.7";
  s.segment_id = std::string(32, 'a');
  s.source = "/models/gpt.safetensors";
  s.format = "safetensors";
  s.segment_bytes = 1048576;
  s.data_bytes = 1000;
  s.tensor_count = 2;
  s.load_seconds = 0.5;
  s.loaded_unix_s = 1700000000;
  s.attached = 2;
  s.attached_pids = {10, 11};
  s.page_bytes = 4096;
  s.huge_bytes = 2097152;
  s.source_fingerprint = "0123456789abcdef";
  s.owner_uid = 1000;
  s.owner_user = "alice";
  s.owner_admin = true;
  return s;
}

// ---- requests ----

template <>
struct Sample<StatusRequest> {
  static std::vector<std::pair<StatusRequest, const char*>> Cases() { return {{{}, "{}"}}; }
  static std::set<std::string> Required() { return {}; }
  static std::vector<BadCase> Bad() { return {}; }
};
template <>
struct Sample<MetricsRequest> : Sample<StatusRequest> {
  static std::vector<std::pair<MetricsRequest, const char*>> Cases() { return {{{}, "{}"}}; }
};
template <>
struct Sample<ListRequest> : Sample<StatusRequest> {
  static std::vector<std::pair<ListRequest, const char*>> Cases() { return {{{}, "{}"}}; }
};
template <>
struct Sample<CancelRequest> : Sample<StatusRequest> {
  static std::vector<std::pair<CancelRequest, const char*>> Cases() { return {{{}, "{}"}}; }
};
template <>
struct Sample<WriteSealRequest> : Sample<StatusRequest> {
  static std::vector<std::pair<WriteSealRequest, const char*>> Cases() { return {{{}, "{}"}}; }
};

template <>
struct Sample<InfoRequest> {
  static std::vector<std::pair<InfoRequest, const char*>> Cases() { return {{{"a"}, R"({"name":"a"})"}}; }
  static std::set<std::string> Required() { return {"name"}; }
  static std::vector<BadCase> Bad() { return {}; }
};
template <>
struct Sample<VerifyRequest> {
  static std::vector<std::pair<VerifyRequest, const char*>> Cases() { return {{{"a"}, R"({"name":"a"})"}}; }
  static std::set<std::string> Required() { return {"name"}; }
  static std::vector<BadCase> Bad() { return {}; }
};

template <>
struct Sample<LoadRequest> {
  static std::vector<std::pair<LoadRequest, const char*>> Cases() {
    return {{{"/m/a.safetensors", "a", true, true, true}, R"({"allow_expansion":true,"name":"a","path":"/m/a.safetensors","progress":true,"replace":true})"},
            {{}, R"({"path":"","progress":false})"}};
  }
  static std::set<std::string> Required() { return {"path"}; }
  static std::vector<BadCase> Bad() { return {{{{"path", 7}}, "'path' must be a string"}}; }
};

template <>
struct Sample<EnsureRequest> {
  static std::vector<std::pair<EnsureRequest, const char*>> Cases() {
    return {{{"/m/a.safetensors", "a", true, true}, R"({"allow_expansion":true,"name":"a","path":"/m/a.safetensors","progress":true})"},
            {{}, R"({"path":"","progress":false})"}};
  }
  static std::set<std::string> Required() { return {"path"}; }
  static std::vector<BadCase> Bad() { return {{{{"progress", "yes"}}, "'progress' must be a boolean"}}; }
};

template <>
struct Sample<EvictRequest> {
  static std::vector<std::pair<EvictRequest, const char*>> Cases() {
    return {{{"a", true, 2.5}, R"({"force":true,"name":"a","wait_s":2.5})"}, {{}, R"({"force":false,"name":""})"}};
  }
  static std::set<std::string> Required() { return {"name"}; }
  static std::vector<BadCase> Bad() {
    return {{{{"wait_s", -1}}, "'wait_s' must be a number of seconds from 0 to 86400"},
            {{{"wait_s", 86401}}, "'wait_s' must be a number of seconds from 0 to 86400"}};
  }
};

template <>
struct Sample<AttachRequest> {
  static std::vector<std::pair<AttachRequest, const char*>> Cases() {
    return {{{"a", 3, std::string(32, 'f')}, R"({"generation":3,"name":"a","segment_id":"ffffffffffffffffffffffffffffffff"})"}, {{}, R"({"name":""})"}};
  }
  static std::set<std::string> Required() { return {"name"}; }
  static std::vector<BadCase> Bad() { return {{{{"generation", -1}}, "'generation' must be a non-negative integer"}}; }
};

template <>
struct Sample<RendezvousRequest> {
  static std::vector<std::pair<RendezvousRequest, const char*>> Cases() {
    RendezvousRequest publish{"job:1", 0, 4, true, "00ff", 5};
    RendezvousRequest wait{"job:1", 3, 4, false, "", 60};
    return {{publish, R"({"job":"job:1","rank":0,"timeout_s":5.0,"value":"00ff","world":4})"}, {wait, R"({"job":"job:1","rank":3,"timeout_s":60.0,"world":4})"}};
  }
  static std::set<std::string> Required() { return {"job", "rank", "world"}; }
  static std::vector<BadCase> Bad() {
    return {{{{"world", 0}}, "'world' must be 1 to 65536, not 0"},
            {{{"world", 65537}}, "'world' must be 1 to 65536"},
            {{{"rank", 4}}, "'rank' must be in [0, world): rank 4, world 4"},
            {{{"rank", -1}}, "'rank' must be in [0, world)"},
            {{{"rank", 0.5}}, "'rank' must be an integer"},
            {{{"rank", 18446744073709551615ull}}, "'rank' must be an integer below 2^63"},
            {{{"timeout_s", 3601}}, "'timeout_s' must be a number of seconds from 0 to 3600"},
            {{{"timeout_s", -1}}, "'timeout_s' must be"}};
  }
};

template <>
struct Sample<WriteRequest> {
  static std::vector<std::pair<WriteRequest, const char*>> Cases() {
    WriteRequest w;
    w.name = "step";
    w.job = "job:1";
    w.part = 1;
    w.parts = 2;
    w.replace = true;
    w.timeout_s = 5;
    w.ring_bytes = 8192;
    WritePiece box;
    box.key = "w";
    box.dtype = DType::kBF16;
    box.global_shape = {4, 6};
    box.offsets = {2, 0};
    box.shape = {2, 6};
    WritePiece flat;
    flat.key = "z";
    flat.dtype = DType::kF32;
    flat.global_shape = {10};
    flat.flat = true;
    flat.start = 5;
    flat.numel = 5;
    w.pieces = {box, flat};
    w.side_files = {{"config.json", std::string("{\"a\":\0\xff}", 8)}};
    WriteRequest one;
    one.name = "one";
    return {{w, R"({"job":"job:1","name":"step","part":1,"parts":2,"pieces":[{"dtype":"BF16","global_shape":[4,6],"key":"w","offsets":[2,0],"shape":[2,6]},{"dtype":"F32","flat":true,"global_shape":[10],"key":"z","numel":5,"start":5}],"replace":true,"ring_bytes":8192,"side_files":[{"data":"7b2261223a00ff7d","name":"config.json"}],"timeout_s":5.0})"}, {one, R"({"name":"one","part":0,"parts":1,"pieces":[],"ring_bytes":0,"timeout_s":600.0})"}};
  }
  static std::set<std::string> Required() { return {"name", "pieces"}; }
  static std::vector<BadCase> Bad() {
    auto piece = [](json patch) {
      json p = json::parse(R"({"key": "w", "dtype": "BF16", "global_shape": [4, 6], "offsets": [2, 0], "shape": [2, 6]})");
      p.merge_patch(patch);
      return json{{"pieces", json::array({p})}};
    };
    return {{{{"parts", 0}}, "'parts' must be 1 to 65536, not 0"},
            {{{"parts", 65537}}, "'parts' must be 1 to 65536"},
            {{{"part", 2}}, "'part' must be in [0, parts): part 2, parts 2"},
            {{{"timeout_s", -1}}, "'timeout_s' must be a number of seconds from 0 to 86400"},
            {{{"pieces", json::array({3})}}, "'pieces[0]' must be an object"},
            {piece({{"dtype", "F99"}}), "'pieces[0].dtype' is an unknown dtype 'F99'"},
            {piece({{"key", nullptr}}), "request lacks 'pieces[0].key'"},
            {piece({{"key", ""}}), "pieces[0]: a key must be 1 to 1024 bytes"},
            {piece({{"global_shape", {1, 2, 3, 4, 5, 6, 7, 8, 9}}}), "pieces[0]: 'w': more than 8 dims"},
            {piece({{"global_shape", {-1, 6}}}), "pieces[0]: 'w': a negative dimension"},
            {piece({{"offsets", {3, 0}}}), "pieces[0]: 'w': the box leaves the global shape in dim 0"},
            {piece({{"shape", {2}}}), "offsets and shape must have one entry per dim"},
            {piece({{"flat", true}}), "request lacks 'pieces[0].start'"},
            {piece({{"flat", true}, {"start", 0u}}), "request lacks 'pieces[0].numel'"},
            {{{"side_files", json::array({json{{"name", "x"}, {"data", "zz"}}})}}, "'side_files[0].data'"},
            {{{"side_files", json::array({json{{"name", "x"}}})}}, "request lacks 'side_files[0].data'"}};
  }
};

template <>
struct Sample<WriteChunkRequest> {
  static std::vector<std::pair<WriteChunkRequest, const char*>> Cases() {
    return {{{3, {{1, 2, 3, 4}, {0, 0, 8, 16}}}, R"({"items":[[1,2,3,4],[0,0,8,16]],"slot":3})"},
            {{}, R"({"items":[],"slot":0})"}};
  }
  static std::set<std::string> Required() { return {"slot", "items"}; }
  static std::vector<BadCase> Bad() {
    return {{{{"items", json::array({json::array({1, 2, 3})})}}, "'items[0]' must be [piece, offset, ring_offset, bytes]"},
            {{{"items", json::array({json::array({1, -2, 3, 4})})}}, "'items[0]' must be [piece, offset"},
            {{{"items", json(std::vector<std::vector<int>>(65537, std::vector<int>{0, 0, 0, 0}))}},
             "'items' must be an array of at most 65536 items"}};
  }
};

// ---- responses ----

template <>
struct Sample<LoadResponse> {
  static std::vector<std::pair<LoadResponse, const char*>> Cases() {
    return {{{FullSummary(), {"old", "older"}}, R"({"checkpoint":{"attached":2,"attached_pids":[10,11],"data_bytes":1000,"format":"safetensors","generation":7,"huge_bytes":2097152,"load_seconds":0.5,"loaded_unix_s":1700000000,"name":"gpt","owner_admin":true,"owner_uid":1000,"owner_user":"alice","page_bytes":4096,"segment_bytes":1048576,"segment_id":"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa","shm_name":"ckpt.gpt.7","source":"/models/gpt.safetensors","source_fingerprint":"0123456789abcdef","tensor_count":2},"evicted":["old","older"]})"}, {{}, R"({"checkpoint":{"attached":0,"attached_pids":[],"data_bytes":0,"format":"","generation":0,"load_seconds":0.0,"loaded_unix_s":0,"name":"","owner_admin":false,"owner_uid":0,"owner_user":"","segment_bytes":0,"shm_name":"","source":"","tensor_count":0},"evicted":[]})"}};
  }
  static std::set<std::string> Required() { return {"checkpoint"}; }
  static std::vector<BadCase> Bad() {
    return {{{{"checkpoint", {{"name", nullptr}}}}, "no 'checkpoint.name'"},
            {{{"checkpoint", {{"generation", -7}}}}, "'checkpoint.generation' must be a non-negative integer"},
            {{{"checkpoint", {{"attached", 4294967296ull}}}}, "'checkpoint.attached' must be a non-negative 32-bit"},
            {{{"checkpoint", {{"attached_pids", {1, "2"}}}}}, "'checkpoint.attached_pids[1]' must be an integer"}};
  }
};

template <>
struct Sample<EnsureResponse> {
  static std::vector<std::pair<EnsureResponse, const char*>> Cases() {
    return {{{FullSummary(), {"old"}, "reloaded"}, R"({"action":"reloaded","checkpoint":{"attached":2,"attached_pids":[10,11],"data_bytes":1000,"format":"safetensors","generation":7,"huge_bytes":2097152,"load_seconds":0.5,"loaded_unix_s":1700000000,"name":"gpt","owner_admin":true,"owner_uid":1000,"owner_user":"alice","page_bytes":4096,"segment_bytes":1048576,"segment_id":"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa","shm_name":"ckpt.gpt.7","source":"/models/gpt.safetensors","source_fingerprint":"0123456789abcdef","tensor_count":2},"evicted":["old"]})"},
            {{}, R"({"action":"","checkpoint":{"attached":0,"attached_pids":[],"data_bytes":0,"format":"","generation":0,"load_seconds":0.0,"loaded_unix_s":0,"name":"","owner_admin":false,"owner_uid":0,"owner_user":"","segment_bytes":0,"shm_name":"","source":"","tensor_count":0},"evicted":[]})"}};
  }
  static std::set<std::string> Required() { return {"checkpoint", "action"}; }
  static std::vector<BadCase> Bad() { return {}; }
};

template <>
struct Sample<CheckpointResponse> {
  static std::vector<std::pair<CheckpointResponse, const char*>> Cases() {
    return {{{FullSummary()}, R"({"checkpoint":{"attached":2,"attached_pids":[10,11],"data_bytes":1000,"format":"safetensors","generation":7,"huge_bytes":2097152,"load_seconds":0.5,"loaded_unix_s":1700000000,"name":"gpt","owner_admin":true,"owner_uid":1000,"owner_user":"alice","page_bytes":4096,"segment_bytes":1048576,"segment_id":"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa","shm_name":"ckpt.gpt.7","source":"/models/gpt.safetensors","source_fingerprint":"0123456789abcdef","tensor_count":2}})"}, {{}, R"({"checkpoint":{"attached":0,"attached_pids":[],"data_bytes":0,"format":"","generation":0,"load_seconds":0.0,"loaded_unix_s":0,"name":"","owner_admin":false,"owner_uid":0,"owner_user":"","segment_bytes":0,"shm_name":"","source":"","tensor_count":0}})"}};
  }
  static std::set<std::string> Required() { return {"checkpoint"}; }
  static std::vector<BadCase> Bad() { return {}; }
};

template <>
struct Sample<ListResponse> {
  static std::vector<std::pair<ListResponse, const char*>> Cases() {
    return {{{{FullSummary(), WireSummary{}}, {"loading1"}}, R"({"checkpoints":[{"attached":2,"attached_pids":[10,11],"data_bytes":1000,"format":"safetensors","generation":7,"huge_bytes":2097152,"load_seconds":0.5,"loaded_unix_s":1700000000,"name":"gpt","owner_admin":true,"owner_uid":1000,"owner_user":"alice","page_bytes":4096,"segment_bytes":1048576,"segment_id":"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa","shm_name":"ckpt.gpt.7","source":"/models/gpt.safetensors","source_fingerprint":"0123456789abcdef","tensor_count":2},{"attached":0,"attached_pids":[],"data_bytes":0,"format":"","generation":0,"load_seconds":0.0,"loaded_unix_s":0,"name":"","owner_admin":false,"owner_uid":0,"owner_user":"","segment_bytes":0,"shm_name":"","source":"","tensor_count":0}],"loading":["loading1"]})"},
            {{}, R"({"checkpoints":[],"loading":[]})"}};
  }
  static std::set<std::string> Required() { return {"checkpoints"}; }
  static std::vector<BadCase> Bad() {
    return {{{{"checkpoints", json::array({json{{"name", "x"}}})}}, "no 'checkpoints[0].generation'"}};
  }
};

template <>
struct Sample<InfoResponse> {
  static std::vector<std::pair<InfoResponse, const char*>> Cases() {
    InfoResponse info{FullSummary(),
                      {WireTensor{"w\x1b[2J", DType::kF32, {2, 3}, 24, 0xdeadbeefcafef00dull},
                       WireTensor{"s", DType::kBF16, {}, 2, 1}},
                      {WireSideFile{"config.json", 612}}};
    return {{info, R"({"checkpoint":{"attached":2,"attached_pids":[10,11],"data_bytes":1000,"format":"safetensors","generation":7,"huge_bytes":2097152,"load_seconds":0.5,"loaded_unix_s":1700000000,"name":"gpt","owner_admin":true,"owner_uid":1000,"owner_user":"alice","page_bytes":4096,"segment_bytes":1048576,"segment_id":"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa","shm_name":"ckpt.gpt.7","source":"/models/gpt.safetensors","source_fingerprint":"0123456789abcdef","tensor_count":2},"side_files":[{"bytes":612,"name":"config.json"}],"tensors":[{"checksum":"deadbeefcafef00d","dtype":"F32","name":"w\u001b[2J","nbytes":24,"shape":[2,3]},{"checksum":"0000000000000001","dtype":"BF16","name":"s","nbytes":2,"shape":[]}]})"}, {{}, R"({"checkpoint":{"attached":0,"attached_pids":[],"data_bytes":0,"format":"","generation":0,"load_seconds":0.0,"loaded_unix_s":0,"name":"","owner_admin":false,"owner_uid":0,"owner_user":"","segment_bytes":0,"shm_name":"","source":"","tensor_count":0},"side_files":[],"tensors":[]})"}};
  }
  static std::set<std::string> Required() { return {"checkpoint", "tensors"}; }
  static std::vector<BadCase> Bad() {
    auto tensor = [](json patch) {
      json t = json::parse(R"({"name": "w", "dtype": "F32", "shape": [2], "nbytes": 8, "checksum": "00000000000000ff"})");
      t.merge_patch(patch);
      return json{{"tensors", json::array({t})}};
    };
    return {{tensor({{"dtype", "F99"}}), "'tensors[0].dtype' is an unknown dtype 'F99'"},
            {tensor({{"checksum", "xyz"}}), "'tensors[0].checksum' must be 1 to 16 lower-case hex digits"},
            {tensor({{"checksum", "00000000000000000"}}), "'tensors[0].checksum' must be 1 to 16"},
            {tensor({{"checksum", "ABCDEF"}}), "'tensors[0].checksum' must be 1 to 16"},
            {tensor({{"nbytes", nullptr}}), "no 'tensors[0].nbytes'"},
            {{{"side_files", json::array({json{{"name", "x"}}})}}, "no 'side_files[0].bytes'"}};
  }
};

template <>
struct Sample<VerifyResponse> {
  static std::vector<std::pair<VerifyResponse, const char*>> Cases() {
    return {{{"gpt", 7, false, 420, 1000, 1.5, 2, {"a", "b"}}, R"({"bytes":1000,"generation":7,"mismatch_count":2,"mismatched":["a","b"],"name":"gpt","passed":false,"seconds":1.5,"tensors":420})"},
            {{}, R"({"bytes":0,"generation":0,"mismatch_count":0,"mismatched":[],"name":"","passed":false,"seconds":0.0,"tensors":0})"}};
  }
  static std::set<std::string> Required() { return {"name", "generation", "passed"}; }
  static std::vector<BadCase> Bad() { return {}; }
};

template <>
struct Sample<StatusResponse> {
  static std::vector<std::pair<StatusResponse, const char*>> Cases() {
    StatusResponse s;
    s.version = "0.1.0";
    s.protocol = 1;
    s.pid = 42;
    s.uptime_s = 60;
    s.socket = "/run/ckptd/ckptd.sock";
    s.shm_prefix = "ckpt";
    s.segment_dir = "/dev/shm/ckpt.x";
    s.checkpoints = 1;
    s.loading = 2;
    s.shm_bytes = 1048576;
    s.memory_budget_bytes = 1 << 30;
    s.memory_used_bytes = 1048576;
    s.attached = 3;
    s.connections = 4;
    s.max_connections = 256;
    s.max_connections_per_uid = 64;
    s.admin_reserved_connections = 8;
    s.model_roots = {"/models"};
    s.evictions = WireEvictions{1, 2, 3};
    s.your_role = "admin";
    s.your_uid = 1000;
    s.your_shm_bytes = 5;
    s.your_segments = 6;
    s.your_writes = 7;
    s.max_shm_bytes_per_uid = 8;
    s.max_segments_per_uid = 9;
    s.max_writes_per_uid = 10;
    s.checkpoint_list = {FullSummary()};
    s.retired = {FullSummary()};
    s.segment_pages = "tmpfs huge=within_size: 2 MiB pages";
    s.segment_page_bytes = 2097152;
    return {{s, R"({"admin_reserved_connections":8,"attached":3,"checkpoint_list":[{"attached":2,"attached_pids":[10,11],"data_bytes":1000,"format":"safetensors","generation":7,"huge_bytes":2097152,"load_seconds":0.5,"loaded_unix_s":1700000000,"name":"gpt","owner_admin":true,"owner_uid":1000,"owner_user":"alice","page_bytes":4096,"segment_bytes":1048576,"segment_id":"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa","shm_name":"ckpt.gpt.7","source":"/models/gpt.safetensors","source_fingerprint":"0123456789abcdef","tensor_count":2}],"checkpoints":1,"connections":4,"evictions":{"by_request":1,"for_budget":2,"replaced":3},"loading":2,"max_connections":256,"max_connections_per_uid":64,"max_segments_per_uid":9,"max_shm_bytes_per_uid":8,"max_writes_per_uid":10,"memory_budget_bytes":1073741824,"memory_used_bytes":1048576,"model_roots":["/models"],"pid":42,"protocol":1,"retired":[{"attached":2,"attached_pids":[10,11],"data_bytes":1000,"format":"safetensors","generation":7,"huge_bytes":2097152,"load_seconds":0.5,"loaded_unix_s":1700000000,"name":"gpt","owner_admin":true,"owner_uid":1000,"owner_user":"alice","page_bytes":4096,"segment_bytes":1048576,"segment_id":"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa","shm_name":"ckpt.gpt.7","source":"/models/gpt.safetensors","source_fingerprint":"0123456789abcdef","tensor_count":2}],"segment_dir":"/dev/shm/ckpt.x","segment_page_bytes":2097152,"segment_pages":"tmpfs huge=within_size: 2 MiB pages","shm_bytes":1048576,"shm_prefix":"ckpt","socket":"/run/ckptd/ckptd.sock","uptime_s":60,"version":"0.1.0","your_role":"admin","your_segments":6,"your_shm_bytes":5,"your_uid":1000,"your_writes":7})"}, {{}, R"({"admin_reserved_connections":0,"attached":0,"checkpoint_list":[],"checkpoints":0,"connections":0,"evictions":{"by_request":0,"for_budget":0,"replaced":0},"loading":0,"max_connections":0,"max_connections_per_uid":0,"max_segments_per_uid":0,"max_shm_bytes_per_uid":0,"max_writes_per_uid":0,"memory_budget_bytes":0,"memory_used_bytes":0,"model_roots":[],"pid":0,"protocol":0,"retired":[],"shm_bytes":0,"shm_prefix":"","socket":"","uptime_s":0,"version":"","your_role":"","your_segments":0,"your_shm_bytes":0,"your_uid":0,"your_writes":0})"}};
  }
  static std::set<std::string> Required() {
    return {"version", "protocol", "pid", "uptime_s", "shm_prefix", "checkpoints", "loading",
            "shm_bytes", "attached", "connections"};
  }
  static std::vector<BadCase> Bad() {
    return {{{{"protocol", 4294967296ll}}, "'protocol' must be a 32-bit integer"},
            {{{"evictions", {{"for_budget", -1}}}}, "'evictions.for_budget' must be a non-negative integer"}};
  }
};

template <>
struct Sample<RendezvousResponse> {
  static std::vector<std::pair<RendezvousResponse, const char*>> Cases() {
    return {{{"00ff"}, R"({"value":"00ff"})"}, {{}, R"({"value":""})"}};
  }
  static std::set<std::string> Required() { return {"value"}; }
  static std::vector<BadCase> Bad() { return {}; }
};

template <>
struct Sample<MetricsResponse> {
  static std::vector<std::pair<MetricsResponse, const char*>> Cases() {
    return {{{"ckptd_up 1\n"}, R"({"text":"ckptd_up 1\n"})"}, {{}, R"({"text":""})"}};
  }
  static std::set<std::string> Required() { return {"text"}; }
  static std::vector<BadCase> Bad() { return {}; }
};

template <>
struct Sample<CancelResponse> {
  static std::vector<std::pair<CancelResponse, const char*>> Cases() {
    return {{{true}, R"({"cancelled":true})"}, {{}, R"({"cancelled":false})"}};
  }
  static std::set<std::string> Required() { return {}; }
  static std::vector<BadCase> Bad() { return {}; }
};

// ---- events ----

template <>
struct Sample<ProgressEvent> {
  static std::vector<std::pair<ProgressEvent, const char*>> Cases() {
    return {{{10, 100}, R"({"done":10,"event":"progress","total":100,"v":1})"}, {{}, R"({"done":0,"event":"progress","total":0,"v":1})"}};
  }
  static std::set<std::string> Required() { return {"done", "total"}; }
  static std::vector<BadCase> Bad() { return {}; }
};

template <>
struct Sample<ClosingEvent> {
  static std::vector<std::pair<ClosingEvent, const char*>> Cases() {
    return {{{"idle"}, R"({"event":"closing","reason":"idle","v":1})"}, {{}, R"({"event":"closing","reason":"","v":1})"}};
  }
  static std::set<std::string> Required() { return {}; }
  static std::vector<BadCase> Bad() { return {}; }
};

template <>
struct Sample<WriteReadyEvent> {
  static std::vector<std::pair<WriteReadyEvent, const char*>> Cases() {
    return {{{9}, R"({"event":"write_ready","generation":9,"v":1})"}, {{}, R"({"event":"write_ready","generation":0,"v":1})"}};
  }
  static std::set<std::string> Required() { return {"generation"}; }
  static std::vector<BadCase> Bad() { return {}; }
};

template <>
struct Sample<WriteAckEvent> {
  static std::vector<std::pair<WriteAckEvent, const char*>> Cases() {
    return {{{4}, R"({"event":"write_ack","slot":4,"v":1})"}, {{}, R"({"event":"write_ack","slot":0,"v":1})"}};
  }
  static std::set<std::string> Required() { return {"slot"}; }
  static std::vector<BadCase> Bad() { return {}; }
};

// ---- every message has a Sample ----

template <typename M, typename = void>
struct HasSample : std::false_type {};
template <typename M>
struct HasSample<M, std::void_t<decltype(Sample<M>::Cases())>> : std::true_type {};

template <typename M>
constexpr bool Require() {
  static_assert(HasSample<M>::value, "a protocol message without a Sample in tests/protocol/messages_test.cc");
  return HasSample<M>::value;
}
template <typename... Ts>
constexpr bool AllHaveSamples(TypeList<Ts...>) {
  return (Require<Ts>() && ...);
}
static_assert(AllHaveSamples(Requests{}) && AllHaveSamples(Responses{}) && AllHaveSamples(Events{}));

template <typename... Lists>
struct GTestTypes;
template <typename... A, typename... B, typename... C>
struct GTestTypes<TypeList<A...>, TypeList<B...>, TypeList<C...>> {
  using type = ::testing::Types<A..., B..., C...>;
};
using AllMessages = GTestTypes<Requests, Responses, Events>::type;

template <typename M>
class MessageTest : public ::testing::Test {};
TYPED_TEST_SUITE(MessageTest, AllMessages);

template <typename M>
StatusCode BadCode() {
  return kIsRequest<M> ? StatusCode::kInvalidArgument : StatusCode::kCorrupt;
}

// A value of another JSON type than `v`'s.
json WrongType(const json& v) {
  if (v.is_string()) return 42;
  if (v.is_number()) return "42";
  if (v.is_boolean()) return 1;
  return "x";  // arrays, objects
}

TYPED_TEST(MessageTest, EncodesToItsGoldenJsonAndDecodesBack) {
  using M = TypeParam;
  for (const auto& [message, golden_text] : Sample<M>::Cases()) {
    const json golden = json::parse(golden_text);
    EXPECT_EQ(Encode(message).dump(), golden.dump());
    auto decoded = DecodeAs<M>(golden);
    ASSERT_TRUE(decoded.ok()) << decoded.status().ToString() << "\n" << golden_text;
    EXPECT_EQ(Encode(*decoded).dump(), golden.dump());
    auto again = DecodeAs<M>(Encode(message));
    ASSERT_TRUE(again.ok()) << again.status().ToString();
    EXPECT_EQ(Encode(*again), Encode(message));
  }
}

TYPED_TEST(MessageTest, RequiredKeysAreRequiredAndOthersAreNot) {
  using M = TypeParam;
  const json full = json::parse(Sample<M>::Cases().front().second);
  const std::set<std::string> required = Sample<M>::Required();
  for (const std::string& key : required) EXPECT_TRUE(full.contains(key)) << key;
  for (const auto& [key, value] : full.items()) {
    json without = full;
    without.erase(key);
    Status st = DecodeAs<M>(without).status();
    if (required.count(key) != 0) {
      EXPECT_EQ(st.code(), BadCode<M>()) << key << ": " << st.ToString();
      EXPECT_NE(st.message().find("'" + key + "'"), std::string::npos) << st.ToString();
    } else {  // its absence is never the error (a range check on another field may be)
      EXPECT_EQ(st.message().find("'" + key + "'"), std::string::npos) << key << ": " << st.ToString();
    }
  }
}

TYPED_TEST(MessageTest, AWrongTypeIsRefusedNamingTheKey) {
  using M = TypeParam;
  const json full = json::parse(Sample<M>::Cases().front().second);
  for (const auto& [key, value] : full.items()) {
    if (kIsEvent<M> && (key == "v" || key == "event")) continue;  // the frame's, not the event's
    json bad = full;
    bad[key] = WrongType(value);
    auto decoded = DecodeAs<M>(bad);
    EXPECT_EQ(decoded.status().code(), BadCode<M>()) << key << ": " << decoded.status().ToString();
    EXPECT_NE(decoded.status().message().find("'" + key), std::string::npos) << decoded.status().ToString();
  }
  for (const json& not_object : {json::array(), json(3), json("x"), json(nullptr)}) {
    EXPECT_EQ(DecodeAs<M>(not_object).status().code(), BadCode<M>()) << not_object.dump();
  }
}

TYPED_TEST(MessageTest, ValuesOutOfRangeAreRefusedNamingTheField) {
  using M = TypeParam;
  const json full = json::parse(Sample<M>::Cases().front().second);
  for (const BadCase& c : Sample<M>::Bad()) {
    json bad = full;
    bad.merge_patch(c.patch);
    auto decoded = DecodeAs<M>(bad);
    EXPECT_EQ(decoded.status().code(), BadCode<M>()) << c.patch.dump() << ": " << decoded.status().ToString();
    EXPECT_NE(decoded.status().message().find(c.needle), std::string::npos)
        << c.patch.dump() << ": " << decoded.status().ToString() << "\nwanted: " << c.needle;
  }
}

// ---- beyond single messages ----

TEST(MessagesTest, KnownOpsAreTheRequestsOps) {
  const std::vector<std::string> ops = KnownOps();
  const std::set<std::string> unique(ops.begin(), ops.end());
  EXPECT_EQ(unique.size(), ops.size());
  EXPECT_EQ(unique, (std::set<std::string>{"status", "metrics", "list", "info", "verify", "load", "ensure", "evict",
                                           "attach", "rendezvous", "cancel", "write", "write_chunk", "write_seal"}));
}

TEST(MessagesTest, DecodeOpChecksVersionAndOp) {
  EXPECT_EQ(DecodeOp(json{{"v", 99}, {"op", "list"}}).status().code(), StatusCode::kUnsupported);
  EXPECT_EQ(DecodeOp(json{{"op", "list"}}).status().code(), StatusCode::kUnsupported);
  EXPECT_EQ(DecodeOp(json{{"v", 1}}).status().message(), "request lacks 'op'");
  EXPECT_EQ(DecodeOp(json{{"v", 1}, {"op", 3}}).status().message(), "'op' must be a string");
  EXPECT_EQ(*DecodeOp(json{{"v", 1}, {"op", "list"}}), "list");
}

TEST(MessagesTest, ErrorsSayWhatWasMalformed) {
  // Requests: the caller's error, as the daemon answers it.
  EXPECT_EQ(DecodeAs<LoadRequest>(json::object()).status().message(), "request lacks 'path'");
  EXPECT_EQ(DecodeAs<LoadRequest>(json{{"path", "/x"}, {"replace", 3}}).status().message(),
            "'replace' must be a boolean");
  // Responses: a broken daemon's, named by what was asked.
  EXPECT_EQ(DecodeAs<ListResponse>(json{{"checkpoints", 3}}).status().message(),
            "malformed list response from ckptd: 'checkpoints' must be an array");
  EXPECT_EQ(DecodeAs<WireSummary>(json{{"name", 3}, {"generation", 1}}).status().code(), StatusCode::kCorrupt);
}

TEST(MessagesTest, ABoxPieceDefaultsToTheWholeTensorAndAFlatOneHasNoBox) {
  json j = json::parse(R"({"name": "n", "pieces": [{"key": "a", "dtype": "F32", "global_shape": [2, 3]},
      {"key": "b", "dtype": "F32", "global_shape": [4], "flat": true, "start": 1, "numel": 2, "shape": [9]}]})");
  auto w = DecodeAs<WriteRequest>(j);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_EQ(w->pieces[0].offsets, (std::vector<int64_t>{0, 0}));
  EXPECT_EQ(w->pieces[0].shape, (std::vector<int64_t>{2, 3}));
  EXPECT_TRUE(w->pieces[1].shape.empty());
  EXPECT_EQ(w->pieces[1].numel, 2u);
  EXPECT_EQ(w->side_files.size(), 0u);
}

}  // namespace
}  // namespace ckpt::protocol
