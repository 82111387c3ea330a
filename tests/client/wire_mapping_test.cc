// The client's mapping between the wire's structs and the public ones: a response decoded
// into a public struct and encoded again is the JSON the daemon sent, key for key (what
// ckptctl --json and the Python module print), for every public struct the Client
// returns. The goldens have every field set, so a field the mapping drops fails here.
#include "client/wire_mapping.h"

#include <gtest/gtest.h>

namespace ckpt::client {
namespace {

using nlohmann::json;

template <typename P>
void ExpectSameJson(const char* golden_text) {
  const json golden = json::parse(golden_text);
  auto decoded = DecodePublic<P>(golden);
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  EXPECT_EQ(EncodePublic(*decoded).dump(), golden.dump());
  EXPECT_EQ(protocol::Encode(ToWire(FromWire<P>(ToWire(*decoded)))).dump(), golden.dump());
}

TEST(WireMappingTest, EveryPublicResponseMapsBothWaysWithoutLosingAField) {
  ExpectSameJson<LoadResult>(R"({"checkpoint":{"attached":2,"attached_pids":[10,11],"data_bytes":1000,"format":"safetensors","generation":7,"huge_bytes":2097152,"load_seconds":0.5,"loaded_unix_s":1700000000,"name":"gpt","owner_admin":true,"owner_uid":1000,"owner_user":"alice","page_bytes":4096,"segment_bytes":1048576,"segment_id":"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa","shm_name":"ckpt.gpt.7","source":"/models/gpt.safetensors","source_fingerprint":"0123456789abcdef","tensor_count":2},"evicted":["old","older"]})");
  ExpectSameJson<EnsureResult>(R"({"action":"reloaded","checkpoint":{"attached":2,"attached_pids":[10,11],"data_bytes":1000,"format":"safetensors","generation":7,"huge_bytes":2097152,"load_seconds":0.5,"loaded_unix_s":1700000000,"name":"gpt","owner_admin":true,"owner_uid":1000,"owner_user":"alice","page_bytes":4096,"segment_bytes":1048576,"segment_id":"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa","shm_name":"ckpt.gpt.7","source":"/models/gpt.safetensors","source_fingerprint":"0123456789abcdef","tensor_count":2},"evicted":["old"]})");
  ExpectSameJson<CheckpointList>(R"({"checkpoints":[{"attached":2,"attached_pids":[10,11],"data_bytes":1000,"format":"safetensors","generation":7,"huge_bytes":2097152,"load_seconds":0.5,"loaded_unix_s":1700000000,"name":"gpt","owner_admin":true,"owner_uid":1000,"owner_user":"alice","page_bytes":4096,"segment_bytes":1048576,"segment_id":"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa","shm_name":"ckpt.gpt.7","source":"/models/gpt.safetensors","source_fingerprint":"0123456789abcdef","tensor_count":2},{"attached":0,"attached_pids":[],"data_bytes":0,"format":"","generation":0,"load_seconds":0.0,"loaded_unix_s":0,"name":"","owner_admin":false,"owner_uid":0,"owner_user":"","segment_bytes":0,"shm_name":"","source":"","tensor_count":0}],"loading":["loading1"]})");
  ExpectSameJson<CheckpointInfo>(R"({"checkpoint":{"attached":2,"attached_pids":[10,11],"data_bytes":1000,"format":"safetensors","generation":7,"huge_bytes":2097152,"load_seconds":0.5,"loaded_unix_s":1700000000,"name":"gpt","owner_admin":true,"owner_uid":1000,"owner_user":"alice","page_bytes":4096,"segment_bytes":1048576,"segment_id":"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa","shm_name":"ckpt.gpt.7","source":"/models/gpt.safetensors","source_fingerprint":"0123456789abcdef","tensor_count":2},"side_files":[{"bytes":612,"name":"config.json"}],"tensors":[{"checksum":"deadbeefcafef00d","dtype":"F32","name":"w\u001b[2J","nbytes":24,"shape":[2,3]},{"checksum":"0000000000000001","dtype":"BF16","name":"s","nbytes":2,"shape":[]}]})");
  ExpectSameJson<VerifyResult>(R"({"bytes":1000,"generation":7,"mismatch_count":2,"mismatched":["a","b"],"name":"gpt","passed":false,"seconds":1.5,"tensors":420})");
  ExpectSameJson<DaemonStatus>(R"({"admin_reserved_connections":8,"attached":3,"checkpoint_list":[{"attached":2,"attached_pids":[10,11],"data_bytes":1000,"format":"safetensors","generation":7,"huge_bytes":2097152,"load_seconds":0.5,"loaded_unix_s":1700000000,"name":"gpt","owner_admin":true,"owner_uid":1000,"owner_user":"alice","page_bytes":4096,"segment_bytes":1048576,"segment_id":"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa","shm_name":"ckpt.gpt.7","source":"/models/gpt.safetensors","source_fingerprint":"0123456789abcdef","tensor_count":2}],"checkpoints":1,"connections":4,"evictions":{"by_request":1,"for_budget":2,"replaced":3},"loading":2,"max_connections":256,"max_connections_per_uid":64,"max_segments_per_uid":9,"max_shm_bytes_per_uid":8,"max_writes_per_uid":10,"memory_budget_bytes":1073741824,"memory_used_bytes":1048576,"model_roots":["/models"],"pid":42,"protocol":1,"retired":[{"attached":2,"attached_pids":[10,11],"data_bytes":1000,"format":"safetensors","generation":7,"huge_bytes":2097152,"load_seconds":0.5,"loaded_unix_s":1700000000,"name":"gpt","owner_admin":true,"owner_uid":1000,"owner_user":"alice","page_bytes":4096,"segment_bytes":1048576,"segment_id":"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa","shm_name":"ckpt.gpt.7","source":"/models/gpt.safetensors","source_fingerprint":"0123456789abcdef","tensor_count":2}],"segment_dir":"/dev/shm/ckpt.x","segment_page_bytes":2097152,"segment_pages":"tmpfs huge=within_size: 2 MiB pages","shm_bytes":1048576,"shm_prefix":"ckpt","socket":"/run/ckptd/ckptd.sock","uptime_s":60,"version":"0.1.0","your_role":"admin","your_segments":6,"your_shm_bytes":5,"your_uid":1000,"your_writes":7})");
  ExpectSameJson<CheckpointSummary>(R"({"attached":2,"attached_pids":[10,11],"data_bytes":1000,"format":"safetensors","generation":7,"huge_bytes":2097152,"load_seconds":0.5,"loaded_unix_s":1700000000,"name":"gpt","owner_admin":true,"owner_uid":1000,"owner_user":"alice","page_bytes":4096,"segment_bytes":1048576,"segment_id":"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa","shm_name":"ckpt.gpt.7","source":"/models/gpt.safetensors","source_fingerprint":"0123456789abcdef","tensor_count":2})");
}

TEST(WireMappingTest, PublicValuesArriveInThePublicStruct) {
  auto info = DecodePublic<CheckpointInfo>(json::parse(R"({"checkpoint":{"attached":2,"attached_pids":[10,11],"data_bytes":1000,"format":"safetensors","generation":7,"huge_bytes":2097152,"load_seconds":0.5,"loaded_unix_s":1700000000,"name":"gpt","owner_admin":true,"owner_uid":1000,"owner_user":"alice","page_bytes":4096,"segment_bytes":1048576,"segment_id":"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa","shm_name":"ckpt.gpt.7","source":"/models/gpt.safetensors","source_fingerprint":"0123456789abcdef","tensor_count":2},"side_files":[{"bytes":612,"name":"config.json"}],"tensors":[{"checksum":"deadbeefcafef00d","dtype":"F32","name":"w\u001b[2J","nbytes":24,"shape":[2,3]},{"checksum":"0000000000000001","dtype":"BF16","name":"s","nbytes":2,"shape":[]}]})"));
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  EXPECT_EQ(info->checkpoint.huge_bytes, 2097152);
  EXPECT_EQ(info->checkpoint.owner_user, "alice");
  ASSERT_EQ(info->tensors.size(), 2u);
  EXPECT_EQ(info->tensors[0].checksum, 0xdeadbeefcafef00dull);
  EXPECT_EQ(info->tensors[1].dtype, DType::kBF16);
  ASSERT_EQ(info->side_files.size(), 1u);
  EXPECT_EQ(info->side_files[0].bytes, 612u);
  auto status = DecodePublic<DaemonStatus>(json::parse(R"({"admin_reserved_connections":8,"attached":3,"checkpoint_list":[{"attached":2,"attached_pids":[10,11],"data_bytes":1000,"format":"safetensors","generation":7,"huge_bytes":2097152,"load_seconds":0.5,"loaded_unix_s":1700000000,"name":"gpt","owner_admin":true,"owner_uid":1000,"owner_user":"alice","page_bytes":4096,"segment_bytes":1048576,"segment_id":"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa","shm_name":"ckpt.gpt.7","source":"/models/gpt.safetensors","source_fingerprint":"0123456789abcdef","tensor_count":2}],"checkpoints":1,"connections":4,"evictions":{"by_request":1,"for_budget":2,"replaced":3},"loading":2,"max_connections":256,"max_connections_per_uid":64,"max_segments_per_uid":9,"max_shm_bytes_per_uid":8,"max_writes_per_uid":10,"memory_budget_bytes":1073741824,"memory_used_bytes":1048576,"model_roots":["/models"],"pid":42,"protocol":1,"retired":[{"attached":2,"attached_pids":[10,11],"data_bytes":1000,"format":"safetensors","generation":7,"huge_bytes":2097152,"load_seconds":0.5,"loaded_unix_s":1700000000,"name":"gpt","owner_admin":true,"owner_uid":1000,"owner_user":"alice","page_bytes":4096,"segment_bytes":1048576,"segment_id":"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa","shm_name":"ckpt.gpt.7","source":"/models/gpt.safetensors","source_fingerprint":"0123456789abcdef","tensor_count":2}],"segment_dir":"/dev/shm/ckpt.x","segment_page_bytes":2097152,"segment_pages":"tmpfs huge=within_size: 2 MiB pages","shm_bytes":1048576,"shm_prefix":"ckpt","socket":"/run/ckptd/ckptd.sock","uptime_s":60,"version":"0.1.0","your_role":"admin","your_segments":6,"your_shm_bytes":5,"your_uid":1000,"your_writes":7})"));
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(status->evictions.replaced, 3u);
  EXPECT_EQ(status->retired.at(0).source_fingerprint, "0123456789abcdef");
  // A malformed response stays the protocol's Corrupt.
  EXPECT_EQ(DecodePublic<LoadResult>(json::object()).status().code(), StatusCode::kCorrupt);
}

}  // namespace
}  // namespace ckpt::client
