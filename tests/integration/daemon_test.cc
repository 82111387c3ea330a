// End-to-end: the real ckptd, driven by the real ckptctl and libckptclient, on
// checkpoints written by PyTorch.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <nlohmann/json.hpp>
#include <thread>

#include "ckpt/client.h"
#include "shm/segment_format.h"
#include "shm/shm_object.h"
#include "support/test_env.h"

// Written in C (c_api_check.c) so the C header is compiled as C.
extern "C" int ckpt_c_api_check(const char* socket, const char* ref_dir, char* error, size_t error_size);

namespace ckpt {
namespace {

using nlohmann::json;
using testing::CommandResult;
using testing::DaemonProcess;
using testing::ReadFile;
using testing::RunCommand;
using testing::ScratchDir;

constexpr int kWorld = 4;

class DaemonTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(testing::MakeCheckpoint(
        {files_.File("gpt.safetensors"), "--mib", "24", "--layers", "2", "--slices", files_.File("ref"),
         "--world", std::to_string(kWorld)}));
    ASSERT_TRUE(daemon_.Start()) << ReadFile(daemon_.log_path());
  }

  std::unique_ptr<Client> Connect() {
    auto client = Client::Connect(daemon_.socket());
    EXPECT_TRUE(client.ok()) << client.status().ToString();
    return client.ok() ? std::move(client).value() : nullptr;
  }

  json CtlJson(const std::vector<std::string>& args) {
    std::vector<std::string> a = args;
    a.push_back("--json");
    CommandResult r = daemon_.Ctl(a);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return json::parse(r.out, nullptr, false);
  }

  ScratchDir files_;
  DaemonProcess daemon_;
};

TEST_F(DaemonTest, CtlLoadListInfoStatusEvict) {
  CommandResult load = daemon_.Ctl({"load", files_.File("gpt.safetensors"), "--name", "gpt"});
  ASSERT_EQ(load.exit_code, 0) << load.err;
  EXPECT_NE(load.out.find("loaded 'gpt'"), std::string::npos) << load.out;

  json list = CtlJson({"list"});
  ASSERT_EQ(list["checkpoints"].size(), 1u);
  EXPECT_EQ(list["checkpoints"][0]["name"], "gpt");
  EXPECT_EQ(list["checkpoints"][0]["attached"], 0);
  EXPECT_EQ(list["checkpoints"][0]["format"], "safetensors");

  CommandResult table = daemon_.Ctl({"list"});
  EXPECT_NE(table.out.find("NAME"), std::string::npos);
  EXPECT_NE(table.out.find("gpt"), std::string::npos);

  json info = CtlJson({"info", "gpt"});
  EXPECT_EQ(info["tensors"].size(), info["checkpoint"]["tensor_count"].get<size_t>());
  bool saw_qkv = false;
  for (const json& t : info["tensors"]) {
    if (t["name"] == "h.0.attn.qkv.weight") {
      saw_qkv = true;
      EXPECT_EQ(t["dtype"], "F32");
    }
  }
  EXPECT_TRUE(saw_qkv);

  json status = CtlJson({"status"});
  EXPECT_EQ(status["checkpoints"], 1);
  EXPECT_EQ(status["shm_prefix"], daemon_.shm_prefix());
  EXPECT_EQ(status["pid"], daemon_.pid());

  // The default name is the file name without its extension; a relative path works.
  EXPECT_EQ(daemon_.Ctl({"evict", "gpt"}).exit_code, 0);
  CommandResult rel = RunCommand({"/bin/sh", "-c",
                                  "cd " + files_.path() + " && " + CKPTCTL_BIN + " --socket " + daemon_.socket() +
                                      " load gpt.safetensors"});
  ASSERT_EQ(rel.exit_code, 0) << rel.err;
  EXPECT_EQ(CtlJson({"list"})["checkpoints"][0]["name"], "gpt");
  EXPECT_EQ(CtlJson({"list"})["checkpoints"][0]["source"], files_.File("gpt.safetensors"));

  EXPECT_EQ(daemon_.Ctl({"evict", "gpt"}).exit_code, 0);
  EXPECT_EQ(daemon_.Ctl({"evict", "gpt"}).exit_code, 1) << "already evicted";
  EXPECT_EQ(testing::ListSegments(daemon_.shm_prefix(), "gpt.").size(), 0u);
}

TEST_F(DaemonTest, EverySliceEqualsPyTorchsSliceByteForByte) {
  auto client = Connect();
  ASSERT_TRUE(client);
  auto summary = client->Load(files_.File("gpt.safetensors"), "gpt");
  ASSERT_TRUE(summary.ok()) << summary.status().ToString();
  auto ckpt = client->Attach("gpt");
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().ToString();
  EXPECT_EQ((*ckpt)->tensors().size(), summary->tensor_count);
  EXPECT_TRUE((*ckpt)->Verify().ok());

  size_t compared = 0;
  for (const TensorInfo& t : (*ckpt)->tensors()) {
    auto view = (*ckpt)->Tensor(t.name);
    ASSERT_TRUE(view.ok());
    const std::string full = ReadFile(files_.File("ref/" + t.name + ".full.bin"));
    ASSERT_EQ(full.size(), t.nbytes) << t.name;
    EXPECT_EQ(std::memcmp(view->data, full.data(), full.size()), 0) << t.name;
    for (int dim = 0; dim < static_cast<int>(t.shape.size()); ++dim) {
      for (int rank = 0; rank < kWorld; ++rank) {
        const std::string ref = ReadFile(files_.File("ref/" + t.name + "." + std::to_string(dim) + "." +
                                                     std::to_string(rank) + "-of-" + std::to_string(kWorld) + ".bin"));
        ShardSpec spec = ShardSpec::Split(dim, rank, kWorld, 1, /*allow_uneven=*/true);
        auto layout = (*ckpt)->PlanShard(t.name, spec);
        ASSERT_TRUE(layout.ok()) << layout.status().ToString();
        ASSERT_EQ(layout->nbytes, ref.size()) << t.name << " dim " << dim << " rank " << rank;
        std::string got(layout->nbytes, '\0');
        ASSERT_TRUE((*ckpt)->CopyShard(t.name, spec, got.data(), got.size()).ok());
        EXPECT_TRUE(got == ref) << t.name << " dim " << dim << " rank " << rank;
        ++compared;
      }
    }
  }
  EXPECT_GT(compared, 100u);
}

TEST_F(DaemonTest, AttachedProcessesAreCountedAndBlockEvictUntilTheyExit) {
  ASSERT_EQ(daemon_.Ctl({"load", files_.File("gpt.safetensors"), "--name", "gpt"}).exit_code, 0);
  // Four client processes, each taking its own TP shard, held attached by an open stdin.
  std::vector<std::unique_ptr<testing::ChildProcess>> ranks;
  for (int r = 0; r < kWorld; ++r) {
    ranks.push_back(std::make_unique<testing::ChildProcess>(std::vector<std::string>{
        CKPT_SHARD_READER_BIN, daemon_.socket(), "gpt", std::to_string(r), std::to_string(kWorld)}));
  }
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_TRUE(ranks[r]->WaitForOutput("rank " + std::to_string(r) + "/4", 30000)) << ranks[r]->Wait().err;
  }
  int attached = CtlJson({"list"})["checkpoints"][0]["attached"].get<int>();
  EXPECT_EQ(attached, kWorld);
  CommandResult evict = daemon_.Ctl({"evict", "gpt"});
  EXPECT_EQ(evict.exit_code, 1);
  EXPECT_NE(evict.err.find("attached"), std::string::npos) << evict.err;
  for (int r = 0; r < kWorld; ++r) {
    CommandResult result = ranks[r]->Wait();
    EXPECT_EQ(result.exit_code, 0) << result.err;
  }
  for (int i = 0; i < 500 && attached > 0; ++i) {
    attached = CtlJson({"list"})["checkpoints"][0]["attached"].get<int>();
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(attached, 0);
  EXPECT_EQ(daemon_.Ctl({"evict", "gpt"}).exit_code, 0);
}

TEST_F(DaemonTest, ForcedEvictKeepsAttachedMappingsValid) {
  auto client = Connect();
  ASSERT_TRUE(client);
  ASSERT_TRUE(client->Load(files_.File("gpt.safetensors"), "gpt").ok());
  auto ckpt = client->Attach("gpt");
  ASSERT_TRUE(ckpt.ok());
  EXPECT_EQ(client->Evict("gpt").code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(client->Evict("gpt", /*force=*/true).ok());
  EXPECT_EQ(testing::ListSegments(daemon_.shm_prefix()).size(), 0u) << "unlinked at once";
  EXPECT_TRUE((*ckpt)->Verify().ok()) << "the mapping outlives the eviction";
  EXPECT_EQ(client->Attach("gpt").status().code(), StatusCode::kNotFound);
  // The name is free again.
  EXPECT_TRUE(client->Load(files_.File("gpt.safetensors"), "gpt").ok());
}

TEST_F(DaemonTest, ConcurrentLoadsOfOneNameOneWins) {
  std::vector<std::thread> threads;
  std::vector<Status> results(4);
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] {
      auto client = Client::Connect(daemon_.socket());
      results[i] = client.ok() ? (*client)->Load(files_.File("gpt.safetensors"), "same").status() : client.status();
    });
  }
  for (auto& t : threads) t.join();
  int ok = 0;
  for (const Status& st : results) {
    if (st.ok()) {
      ++ok;
    } else {
      EXPECT_EQ(st.code(), StatusCode::kAlreadyExists) << st.ToString();
    }
  }
  EXPECT_EQ(ok, 1);
  EXPECT_EQ(testing::ListSegments(daemon_.shm_prefix()).size(), 1u);
}

TEST_F(DaemonTest, RestartReadoptsCompleteSegmentsAndRemovesPartialOnes) {
  auto client = Connect();
  ASSERT_TRUE(client);
  ASSERT_TRUE(client->Load(files_.File("gpt.safetensors"), "gpt").ok());
  auto before = client->Info("gpt");
  ASSERT_TRUE(before.ok());
  auto ckpt = client->Attach("gpt");
  ASSERT_TRUE(ckpt.ok());
  client.reset();
  daemon_.Kill();  // no clean-up at all

  // A segment that a dead daemon left half-written.
  const std::string partial = "half.99.0123456789abcdef0123456789abcdef";
  {
    auto dir = shm::SegmentDirectory::Open(daemon_.segment_dir(), {}, nullptr);
    ASSERT_TRUE(dir.ok()) << dir.status().ToString();
    auto fd = (*dir)->Create(partial, 8192, 0640);
    ASSERT_TRUE(fd.ok()) << fd.status().ToString();
    auto m = shm::ShmMapping::MapFd(fd->get(), partial, /*writable=*/true);
    ASSERT_TRUE(m.ok());
    auto* h = reinterpret_cast<shm::SegmentHeader*>((*m)->data());
    std::memcpy(h->magic, shm::kSegmentMagic, 8);
    h->version = shm::kSegmentVersion;
    h->state = static_cast<uint32_t>(shm::SegmentState::kLoading);
  }
  ASSERT_TRUE(daemon_.Start()) << ReadFile(daemon_.log_path());
  EXPECT_EQ(testing::ListSegments(daemon_.shm_prefix(), "half.").size(), 0u) << "partial segment removed";
  client = Connect();
  auto after = client->Info("gpt");
  ASSERT_TRUE(after.ok()) << after.status().ToString();
  ASSERT_EQ(after->size(), before->size());
  for (size_t i = 0; i < after->size(); ++i) EXPECT_EQ((*after)[i].checksum, (*before)[i].checksum);
  EXPECT_TRUE((*ckpt)->Verify().ok()) << "a client attached before the crash keeps reading";
  auto again = client->Attach("gpt");
  ASSERT_TRUE(again.ok());
  EXPECT_EQ((*again)->generation(), (*ckpt)->generation());
  // New loads get a generation above every adopted one.
  auto second = client->Load(files_.File("gpt.safetensors"), "other");
  ASSERT_TRUE(second.ok());
  EXPECT_GT(second->generation, (*ckpt)->generation());
}

TEST_F(DaemonTest, CApiAttachesAndSlices) {
  ASSERT_EQ(daemon_.Ctl({"load", files_.File("gpt.safetensors"), "--name", "gpt"}).exit_code, 0);
  char error[512] = "";
  EXPECT_EQ(ckpt_c_api_check(daemon_.socket().c_str(), files_.File("ref").c_str(), error, sizeof(error)), 0)
      << error;
}

}  // namespace
}  // namespace ckpt
