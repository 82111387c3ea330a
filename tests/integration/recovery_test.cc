// kill -9 of the daemon during a load and after it: on restart every complete checkpoint
// is back with the same checksums, partial ones are gone, attached clients kept working
// and the client library reconnects by itself.
#include <gtest/gtest.h>
#include <unistd.h>

#include <future>
#include <nlohmann/json.hpp>

#include "ckpt/client.h"
#include "integration/ops_helpers.h"
#include "support/test_env.h"

namespace ckpt {
namespace {

using testing::ChildProcess;
using testing::CommandResult;
using testing::DaemonProcess;
using testing::ReadFile;
using testing::ScratchDir;

uint64_t WrongFloats(const Checkpoint& c) {
  auto meta = c.Tensor("meta");
  auto w = c.Tensor("w");
  if (!meta.ok() || !w.ok()) return ~0ull;
  return testing::WrongFloats(reinterpret_cast<const int64_t*>(meta->data), reinterpret_cast<const float*>(w->data),
                              w->info->nbytes / 4);
}

std::vector<uint64_t> Checksums(Client& client, const std::string& name) {
  std::vector<uint64_t> out;
  auto info = client.Info(name);
  EXPECT_TRUE(info.ok()) << info.status().ToString();
  if (info.ok()) {
    for (const auto& t : *info) out.push_back(t.checksum);
  }
  return out;
}

TEST(RecoveryTest, KillDuringAndAfterALoadThenRestart) {
  ScratchDir files;
  testing::WritePatternCheckpoint(files.File("small"), 7, 1, 1024);  // 1 MiB
  testing::WritePatternCheckpoint(files.File("other"), 8, 1, 512);
  ASSERT_NO_FATAL_FAILURE(testing::WriteSparseCheckpoint(files.File("big"), 2ull << 30));  // 2 GiB hole
  DaemonProcess daemon({"--load-threads", "1"});
  ASSERT_TRUE(daemon.Start()) << ReadFile(daemon.log_path());

  auto client = Client::Connect(daemon.socket());
  ASSERT_TRUE(client.ok());
  auto small = (*client)->Load(files.File("small"), "small");
  ASSERT_TRUE(small.ok());
  ASSERT_TRUE((*client)->Load(files.File("other"), "other").ok());
  const std::vector<uint64_t> small_sums = Checksums(**client, "small");
  const std::vector<uint64_t> other_sums = Checksums(**client, "other");
  auto attached = (*client)->Attach("small");  // in this process
  ASSERT_TRUE(attached.ok());
  auto rank = std::make_unique<ChildProcess>(  // and in another one
      std::vector<std::string>{CKPT_SHARD_READER_BIN, daemon.socket(), "small", "0", "1"});
  ASSERT_TRUE(rank->WaitForOutput("attached", 10000));

  // 1. kill -9 while "big" is being loaded (its segment exists, not yet complete).
  auto load = std::async(std::launch::async, [&] { return daemon.Ctl({"load", files.File("big"), "--name", "big"}); });
  const std::string big_prefix = "big.";
  auto big_segments = [&] { return testing::ListSegments(daemon.shm_prefix(), big_prefix); };
  ASSERT_TRUE(testing::WaitFor([&] { return !big_segments().empty(); }, 20000))
      << "the load never started";
  daemon.Kill();
  CommandResult interrupted = load.get();
  EXPECT_NE(interrupted.exit_code, 0) << "the load finished before the kill: " << interrupted.out;
  EXPECT_EQ(big_segments().size(), 1u) << "the partial segment should be left by the crash";

  // Attached clients keep working while the daemon is down.
  EXPECT_EQ(WrongFloats(**attached), 0u);
  EXPECT_TRUE((*attached)->Verify().ok());

  ASSERT_TRUE(daemon.Start()) << ReadFile(daemon.log_path());
  if (const auto left = big_segments(); !left.empty()) {
    ADD_FAILURE() << "the partial segment was not removed: " << left.front() << " (" << left.size()
                  << " left); the daemon's log:\n" << ReadFile(daemon.log_path());
  }
  // The same Client object reconnects by itself.
  auto list = (*client)->List();
  ASSERT_TRUE(list.ok()) << list.status().ToString();
  ASSERT_EQ(list->size(), 2u);
  EXPECT_EQ((*list)[0].name, "other");
  EXPECT_EQ((*list)[1].name, "small");
  EXPECT_EQ((*list)[1].generation, small->generation);
  EXPECT_EQ(Checksums(**client, "small"), small_sums);
  EXPECT_EQ(Checksums(**client, "other"), other_sums);
  EXPECT_EQ(WrongFloats(**attached), 0u);
  EXPECT_NE(ReadFile(daemon.log_path()).find("removing segment " + daemon.segment_dir() + "/" + big_prefix), std::string::npos);
  // Both attachments of "small" (this process and the child rank) re-register their lease.
  auto attached_count = [&](const std::string& name) {
    auto l = (*client)->List();
    if (!l.ok()) return -1;
    for (const auto& c : *l) {
      if (c.name == name) return static_cast<int>(c.attached);
    }
    return -1;
  };
  EXPECT_TRUE(testing::WaitFor([&] { return attached_count("small") == 2; }, 10000)) << attached_count("small");

  // 2. kill -9 with everything complete: all of it comes back, new generations go on.
  auto again = (*client)->Attach("other");
  ASSERT_TRUE(again.ok());
  daemon.Kill();
  ASSERT_TRUE(daemon.Start()) << ReadFile(daemon.log_path());
  EXPECT_EQ(Checksums(**client, "small"), small_sums);
  EXPECT_EQ(Checksums(**client, "other"), other_sums);
  EXPECT_TRUE(testing::WaitFor([&] { return attached_count("small") == 2 && attached_count("other") == 1; }, 10000))
      << attached_count("small") << " " << attached_count("other");
  CommandResult refused = daemon.Ctl({"evict", "small"});
  EXPECT_NE(refused.exit_code, 0) << "the re-registered leases protect 'small'";
  auto fresh = (*client)->Attach("small");
  ASSERT_TRUE(fresh.ok());
  EXPECT_EQ(WrongFloats(**fresh), 0u);
  EXPECT_EQ(WrongFloats(**again), 0u);
  EXPECT_EQ(WrongFloats(**attached), 0u);
  auto replaced = (*client)->Load(files.File("small"), "small");  // without replace: refused
  EXPECT_EQ(replaced.status().code(), StatusCode::kAlreadyExists);
  CommandResult r = daemon.Ctl({"load", files.File("small"), "--name", "small", "--replace", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_GT(nlohmann::json::parse(r.out)["checkpoint"]["generation"].get<uint64_t>(), small->generation);

  // The child rank is still attached through both restarts and exits cleanly.
  CommandResult rank_result = rank->Wait();
  EXPECT_EQ(rank_result.exit_code, 0) << rank_result.err;
}

}  // namespace
}  // namespace ckpt
