// The protocol's messages: every struct survives Encode then Decode, and requests with a
// field of the wrong type or range are refused naming the field.
#include "protocol/messages.h"

#include <gtest/gtest.h>

namespace ckpt::protocol {
namespace {

using nlohmann::json;

TEST(MessagesTest, ResponsesRoundTrip) {
  CheckpointSummary s;
  s.name = "m";
  s.generation = 7;
  s.shm_name = "ckpt.m.7";
  s.segment_id = std::string(32, 'a');
  s.source = "/models/m.safetensors";
  s.format = "safetensors";
  s.segment_bytes = 1 << 20;
  s.data_bytes = 1000;
  s.tensor_count = 2;
  s.load_seconds = 0.5;
  s.loaded_unix_s = 1700000000;
  s.attached = 2;
  s.attached_pids = {10, 11};
  DaemonStatus st;
  st.version = "1";
  st.protocol = 1;
  st.pid = 3;
  st.shm_prefix = "ckpt";
  st.checkpoint_list = {s};
  st.evictions.for_budget = 4;
  st.model_roots = {"/models"};
  auto back = DecodeAs<DaemonStatus>(Encode(st));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(Encode(*back), Encode(st));
  CheckpointInfo info{s, {TensorInfo{"w\x1b[2J", DType::kF32, {2, 3}, 24, 0xdeadbeefcafef00dull}}};
  auto info_back = DecodeAs<CheckpointInfo>(Encode(info));
  ASSERT_TRUE(info_back.ok()) << info_back.status().ToString();
  EXPECT_EQ(info_back->tensors[0].checksum, 0xdeadbeefcafef00dull);
  EXPECT_EQ(info_back->checkpoint.segment_id, s.segment_id);
  EXPECT_EQ(Encode(*info_back), Encode(info));
  EXPECT_EQ(DecodeAs<CheckpointSummary>(json{{"name", 3}, {"generation", 1}}).status().code(), StatusCode::kCorrupt);
}

TEST(MessagesTest, RequestsAreCheckedField_by_Field) {
  LoadRequest load{"/x", "n", true, true, true};
  auto back = DecodeAs<LoadRequest>(Encode(load));
  ASSERT_TRUE(back.ok());
  EXPECT_TRUE(back->allow_expansion && back->replace && back->progress);
  auto bad = DecodeAs<LoadRequest>(json{{"path", "/x"}, {"replace", 3}});
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("replace"), std::string::npos);
  EXPECT_EQ(DecodeAs<EvictRequest>(json{{"name", "m"}, {"wait_s", -1}}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(DecodeAs<AttachRequest>(json{{"name", "m"}, {"generation", -1}}).status().code(),
            StatusCode::kInvalidArgument);
  AttachRequest attach{"m", 3, std::string(32, 'f')};
  EXPECT_EQ(DecodeAs<AttachRequest>(Encode(attach))->segment_id, attach.segment_id);
  EXPECT_EQ(DecodeAs<RendezvousRequest>(json{{"job", "j"}, {"rank", 2}, {"world", 2}}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(DecodeOp(json{{"v", 99}, {"op", "list"}}).status().code(), StatusCode::kUnsupported);
}

TEST(MessagesTest, EnsureRoundTripsAndIsChecked) {
  EnsureRequest request{"/m/a.safetensors", "a", true, true};
  auto back = DecodeAs<EnsureRequest>(Encode(request));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->path, request.path);
  EXPECT_EQ(back->name, "a");
  EXPECT_TRUE(back->progress && back->allow_expansion);
  EXPECT_EQ(DecodeAs<EnsureRequest>(json{{"name", "a"}}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(DecodeAs<EnsureRequest>(json{{"path", "/x"}, {"progress", "yes"}}).status().code(),
            StatusCode::kInvalidArgument);
  EnsureResult result;
  result.checkpoint.name = "a";
  result.checkpoint.generation = 7;
  result.checkpoint.source_fingerprint = "0123456789abcdef";
  result.evicted = {"b", "c"};
  result.action = "joined";
  auto decoded = DecodeAs<EnsureResult>(Encode(result));
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  EXPECT_EQ(decoded->action, "joined");
  EXPECT_EQ(decoded->evicted, result.evicted);
  EXPECT_EQ(decoded->checkpoint.source_fingerprint, "0123456789abcdef");
  EXPECT_EQ(Encode(*decoded), Encode(result));
  // A response without its action is a broken daemon's.
  EXPECT_EQ(DecodeAs<EnsureResult>(json{{"checkpoint", Encode(result.checkpoint)}}).status().code(),
            StatusCode::kCorrupt);
}

}  // namespace
}  // namespace ckpt::protocol
