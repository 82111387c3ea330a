// Bad input to the real daemon: every case gets a clear error, the daemon keeps serving,
// the checkpoint already loaded stays intact and no partial segment is left behind.
#include <gtest/gtest.h>
#include <sys/socket.h>

#include <cstring>
#include <nlohmann/json.hpp>

#include "ckpt/client.h"
#include "ckpt/writer.h"
#include "common/io.h"
#include "protocol/wire.h"
#include "shm/shm_object.h"
#include "support/test_env.h"

namespace ckpt {
namespace {

using nlohmann::json;
using testing::CommandResult;
using testing::DaemonProcess;
using testing::ReadFile;
using testing::ScratchDir;
using testing::WriteFile;

using testing::Le64;

std::string Safetensors(const std::string& header, size_t data_bytes) {
  return testing::SafetensorsBytes(header, std::string(data_bytes, '\x5a'));
}

class BadInputTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(testing::MakeCheckpoint({files_.File("good.safetensors"), "--mib", "4", "--layers", "1"}));
    ASSERT_TRUE(daemon_.Start()) << ReadFile(daemon_.log_path());
    auto client = Client::Connect(daemon_.socket());
    ASSERT_TRUE(client.ok());
    client_ = std::move(client).value();
    ASSERT_TRUE(client_->Load(files_.File("good.safetensors"), "good").ok());
    auto info = client_->Info("good");
    ASSERT_TRUE(info.ok());
    good_ = *info;
  }

  // The daemon still answers, "good" is unchanged and verifies, and no other segment exists.
  void ExpectDaemonIntact() {
    auto client = Client::Connect(daemon_.socket());
    ASSERT_TRUE(client.ok()) << "daemon stopped serving: " << ReadFile(daemon_.log_path());
    auto list = (*client)->List();
    ASSERT_TRUE(list.ok());
    ASSERT_EQ(list->size(), 1u);
    EXPECT_EQ((*list)[0].name, "good");
    auto info = (*client)->Info("good");
    ASSERT_TRUE(info.ok());
    ASSERT_EQ(info->size(), good_.size());
    for (size_t i = 0; i < good_.size(); ++i) EXPECT_EQ((*info)[i].checksum, good_[i].checksum);
    auto ckpt = (*client)->Attach("good");
    ASSERT_TRUE(ckpt.ok());
    EXPECT_TRUE((*ckpt)->Verify().ok());
    EXPECT_EQ(testing::ListSegments(daemon_.shm_prefix()).size(), 1u) << "a partial segment was left";
  }

  ScratchDir files_;
  DaemonProcess daemon_;
  std::unique_ptr<Client> client_;
  std::vector<TensorInfo> good_;
};

struct BadFile {
  const char* name;
  std::string bytes;
  const char* expected;  // part of the one-line error
};

TEST_F(BadInputTest, BadFilesAreRefusedWithAClearOneLineError) {
  const std::string ok_header = R"({"w":{"dtype":"F32","shape":[4,4],"data_offsets":[0,64]}})";
  const std::string full = Safetensors(ok_header, 64);
  std::vector<BadFile> cases = {
      {"truncated", full.substr(0, full.size() - 10), "beyond"},
      {"header_longer_than_file", Le64(1 << 20) + ok_header, "longer than the file"},
      {"invalid_json", Safetensors(R"({"w":{"dtype":"F32","shape":[4,4],)", 64), "not valid JSON"},
      {"unknown_dtype", Safetensors(R"({"w":{"dtype":"F24","shape":[4],"data_offsets":[0,12]}})", 12),
       "unknown dtype 'F24'"},
      {"offsets_out_of_range", Safetensors(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8),
       "beyond"},
      {"overlapping", Safetensors(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},
                                       "b":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}})", 24),
       "overlap"},
      {"shape_bytes_disagree", Safetensors(R"({"w":{"dtype":"F32","shape":[5],"data_offsets":[0,16]}})", 16),
       "shape and dtype give 20 bytes"},
      {"empty_file", "", "too short"},
      {"not_a_checkpoint.dat", std::string(100, '#'), "unrecognised"},
  };
  for (const BadFile& c : cases) {
    SCOPED_TRACE(c.name);
    std::string path = files_.File(c.name);
    if (std::string(c.name).find('.') == std::string::npos) path += ".safetensors";
    WriteFile(path, c.bytes);
    CommandResult r = daemon_.Ctl({"load", path, "--name", "bad"});
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.err.find(c.expected), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << "one line: " << r.err;
    EXPECT_EQ(r.err.rfind("ckptctl: ", 0), 0u) << r.err;
    ExpectDaemonIntact();
  }
}

TEST_F(BadInputTest, BadRequestsGetErrors) {
  struct Case {
    std::vector<std::string> args;
    const char* expected;
  } cases[] = {
      {{"load", files_.File("missing.safetensors")}, "no such file"},
      {{"load", files_.File("good.safetensors"), "--name", "good"}, "already loaded"},
      {{"load", files_.File("good.safetensors"), "--name", "../etc"}, "checkpoint name"},
      {{"load", files_.path()}, "directory"},
      {{"info", "nope"}, "no checkpoint named 'nope'"},
      {{"evict", "nope"}, "no checkpoint named 'nope'"},
  };
  for (const Case& c : cases) {
    CommandResult r = daemon_.Ctl(c.args);
    EXPECT_EQ(r.exit_code, 1) << c.args[0];
    EXPECT_NE(r.err.find(c.expected), std::string::npos) << r.err;
  }
  EXPECT_EQ(client_->Attach("nope").status().code(), StatusCode::kNotFound);
  ExpectDaemonIntact();

  CommandResult usage = daemon_.Ctl({"frobnicate"});
  EXPECT_NE(usage.exit_code, 0);
  testing::ScratchDir other;
  CommandResult no_daemon = testing::RunCommand({CKPTCTL_BIN, "--socket", other.File("none.sock"), "list"});
  EXPECT_EQ(no_daemon.exit_code, 1);
  EXPECT_NE(no_daemon.err.find("is the daemon running"), std::string::npos) << no_daemon.err;
}

// A name begins with a letter or digit: '-rf' (an option to any tool it is passed on to),
// '_x', '.x' are refused by load and by the write path; a file named '-rf.safetensors'
// loaded without --name gets the default name 'rf'.
TEST_F(BadInputTest, NamesMustBeginWithALetterOrDigit) {
  for (const std::string bad : {"-rf", "--help", "_x", ".x", "-", "_"}) {
    SCOPED_TRACE(bad);
    CommandResult r = daemon_.Ctl({"load", files_.File("good.safetensors"), "--name=" + bad});
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.err.find("begin with a letter or digit"), std::string::npos) << r.err;
    auto w = Writer::Create(daemon_.socket(), bad, WriterOptions{});
    ASSERT_TRUE(w.ok()) << w.status().message();
    std::vector<float> data(4, 1.0f);
    ASSERT_TRUE((*w)->Add("t", DType::kF32, {4}, data.data()).ok());
    auto committed = (*w)->Commit();
    EXPECT_EQ(committed.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(committed.status().message().find("begin with a letter or digit"), std::string::npos)
        << committed.status().message();
    ExpectDaemonIntact();
  }
  const std::string dash = files_.File("-rf.safetensors");
  WriteFile(dash, ReadFile(files_.File("good.safetensors")));
  CommandResult r = daemon_.Ctl({"load", "--", dash});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  auto loaded = client_->List();
  ASSERT_TRUE(loaded.ok());
  std::vector<std::string> names;
  for (const auto& c : *loaded) names.push_back(c.name);
  EXPECT_EQ(names, (std::vector<std::string>{"good", "rf"}));
}

// Side-file names are checked at publish with persist's rule (common/side_file_name.h):
// a name persist would write over the tensors' own files, a fake shard, an index, a path,
// escape or newline bytes, an option-like or hidden name are refused by the client's
// Writer and, sent raw, by the daemon; nothing is published and the daemon keeps serving.
TEST_F(BadInputTest, SideFileNamesAreCheckedAtPublishWithPersistsRule) {
  const std::vector<std::string> bad = {"model.safetensors",
                                        "model.safetensors.index.json",
                                        "model-00001-of-00002.safetensors",
                                        "pytorch_model.bin",
                                        "weights.pt",
                                        "tokenizer.index.json",
                                        "notes\n.txt",
                                        "\x1b[31mred.json",
                                        std::string("nul\0.json", 9),
                                        "a/b.json",
                                        "../up.json",
                                        ".hidden",
                                        "-rf",
                                        "",
                                        std::string(256, 'a')};
  for (const std::string& name : bad) {
    SCOPED_TRACE(::testing::PrintToString(name));
    auto w = Writer::Create(daemon_.socket(), "sides", WriterOptions{});
    ASSERT_TRUE(w.ok());
    Status added = (*w)->AddSideFile(name, "{}");
    EXPECT_EQ(added.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(added.message().find("side file name"), std::string::npos) << added.message();
    // The same name sent to the daemon without the client's check.
    auto fd = protocol::ConnectUnix(daemon_.socket());
    ASSERT_TRUE(fd.ok());
    json request = {{"v", 1},        {"op", "write"},     {"name", "sides"},
                    {"pieces", json::array()},
                    {"side_files", json::array({json{{"name", name}, {"data", "7b7d"}}})}};
    ASSERT_TRUE(protocol::WriteFrame(fd->get(), request).ok());
    auto reply = protocol::ReadFrame(fd->get(), protocol::kMaxResponseBytes);
    ASSERT_TRUE(reply.ok()) << reply.status().ToString();
    EXPECT_NE(reply->dump().find("side file name"), std::string::npos) << reply->dump();
    ExpectDaemonIntact();
  }
  // A name the rule allows is published and persisted beside the tensors.
  auto w = Writer::Create(daemon_.socket(), "sides", WriterOptions{});
  ASSERT_TRUE(w.ok());
  std::vector<float> data(4, 2.0f);
  ASSERT_TRUE((*w)->Add("t", DType::kF32, {4}, data.data()).ok());
  ASSERT_TRUE((*w)->AddSideFile("dcp.metadata.json", "{}").ok());
  ASSERT_TRUE((*w)->Commit().ok());
  CommandResult persisted = daemon_.Ctl({"persist", "sides", files_.File("sides-out")});
  EXPECT_EQ(persisted.exit_code, 0) << persisted.err;
  EXPECT_EQ(ReadFile(files_.File("sides-out") + "/dcp.metadata.json"), "{}");
}

TEST_F(BadInputTest, MalformedProtocolTrafficIsAnsweredOrDropped) {
  auto raw_exchange = [&](const std::string& bytes) -> std::string {
    auto fd = protocol::ConnectUnix(daemon_.socket());
    EXPECT_TRUE(fd.ok());
    EXPECT_TRUE(SendAll(fd->get(), bytes.data(), bytes.size()).ok());
    ::shutdown(fd->get(), SHUT_WR);
    auto reply = protocol::ReadFrame(fd->get(), protocol::kMaxResponseBytes);
    return reply.ok() ? reply->dump() : "";
  };
  auto frame = [](const std::string& body) {
    std::string len(4, '\0');
    for (int i = 0; i < 4; ++i) len[i] = static_cast<char>((body.size() >> (8 * i)) & 0xff);
    return len + body;
  };
  EXPECT_NE(raw_exchange(std::string("\xff\xff\xff\x7f", 4)).find("exceeds the limit"), std::string::npos);
  EXPECT_NE(raw_exchange(frame("{not json")).find("not a JSON object"), std::string::npos);
  EXPECT_NE(raw_exchange(frame("[1,2]")).find("not a JSON object"), std::string::npos);
  EXPECT_NE(raw_exchange(frame(R"({"v":99,"op":"list"})")).find("protocol version"), std::string::npos);
  EXPECT_NE(raw_exchange(frame(R"({"v":1,"op":"explode"})")).find("unknown op"), std::string::npos);
  EXPECT_NE(raw_exchange(frame(R"({"v":1,"op":"load","path":7})")).find("must be a string"), std::string::npos);
  EXPECT_NE(raw_exchange(frame(R"({"v":1,"op":"load","path":"relative/x"})")).find("absolute"), std::string::npos);
  EXPECT_NE(raw_exchange(frame(R"({"v":1,"op":"evict","name":"good","force":"yes"})")).find("boolean"),
            std::string::npos);
  EXPECT_NE(raw_exchange(frame("{\"v\":1,\"op\":\"list\"}").substr(0, 12)).find("cut short"), std::string::npos);
  EXPECT_EQ(raw_exchange(""), "");
  ExpectDaemonIntact();
}

}  // namespace
}  // namespace ckpt
