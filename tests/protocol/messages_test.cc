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

TEST(MessagesTest, WriteMessagesRoundTripAndAreChecked) {
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
  auto back = DecodeAs<WriteRequest>(Encode(w));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(Encode(*back), Encode(w));
  EXPECT_EQ(back->side_files[0].second, w.side_files[0].second);
  EXPECT_EQ(back->pieces[0].offsets, box.offsets);
  EXPECT_EQ(back->pieces[1].start, 5u);
  auto chunk = DecodeAs<WriteChunkRequest>(Encode(WriteChunkRequest{3, {{1, 2, 3, 4}}}));
  ASSERT_TRUE(chunk.ok());
  EXPECT_EQ(chunk->slot, 3u);
  EXPECT_EQ(chunk->items[0].bytes, 4u);
  auto bad = [](json j) { return DecodeAs<WriteRequest>(j).status(); };
  const json ok = Encode(w);
  auto with = [&](const char* key, json v) {
    json j = ok;
    j[key] = std::move(v);
    return j;
  };
  EXPECT_EQ(bad(with("parts", 0)).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad(with("part", 2)).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad(with("timeout_s", -1)).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad(with("pieces", 3)).code(), StatusCode::kInvalidArgument);
  json piece = ok["pieces"][0];
  piece["dtype"] = "F99";
  EXPECT_NE(bad(with("pieces", json::array({piece}))).message().find("unknown dtype"), std::string::npos);
  piece = ok["pieces"][0];
  piece["offsets"] = json::array({3, 0});  // 3 + 2 > 4
  EXPECT_NE(bad(with("pieces", json::array({piece}))).message().find("leaves the global shape"), std::string::npos);
  piece = ok["pieces"][0];
  piece["shape"] = json::array({2});
  EXPECT_EQ(bad(with("pieces", json::array({piece}))).code(), StatusCode::kInvalidArgument);
  piece = ok["pieces"][0];
  piece["global_shape"] = json::array({-1, 6});
  EXPECT_EQ(bad(with("pieces", json::array({piece}))).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad(with("side_files", json::array({json{{"name", "x"}, {"data", "zz"}}}))).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(DecodeAs<WriteChunkRequest>(json{{"slot", 0}, {"items", json::array({json::array({1, 2, 3})})}})
                .status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(DecodeAs<WriteChunkRequest>(json{{"slot", 0}, {"items", json::array({json::array({1, -2, 3, 4})})}})
                .status().code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ckpt::protocol
