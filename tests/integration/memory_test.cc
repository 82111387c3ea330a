// The point of ckptd: N processes attached to a checkpoint of S bytes cost the node about
// S of memory, not N x S. Measured as the summed PSS of the daemon and the N clients (which
// no other process on the machine can disturb), and printed as the rise of Shmem +
// AnonPages in /proc/meminfo as well.
#include <gtest/gtest.h>
#include <unistd.h>


#include "ckpt/client.h"
#include "support/test_env.h"

namespace ckpt {
namespace {

using testing::CommandResult;
using testing::DaemonProcess;
using testing::ReadFile;
using testing::ScratchDir;

TEST(MemoryTest, FourAttachedProcessesCostOneCopy) {
  constexpr int kProcesses = 4;
  ScratchDir files;
  ASSERT_NO_FATAL_FAILURE(testing::MakeCheckpoint({files.File("big.safetensors"), "--mib", "768", "--layers", "4"}));
  DaemonProcess daemon({"--cleanup-on-exit"});
  ASSERT_TRUE(daemon.Start()) << ReadFile(daemon.log_path());

  const uint64_t before = testing::NodeSharedPlusAnonBytes();
  auto client = Client::Connect(daemon.socket());
  ASSERT_TRUE(client.ok());
  auto summary = (*client)->Load(files.File("big.safetensors"), "big");
  ASSERT_TRUE(summary.ok()) << summary.status().ToString();
  const uint64_t size = summary->data_bytes;

  // Each process reads every byte of every tensor (--whole) through its mapping, prints
  // its line, then stays attached until its stdin closes.
  std::vector<std::unique_ptr<testing::ChildProcess>> procs;
  for (int r = 0; r < kProcesses; ++r) {
    procs.push_back(std::make_unique<testing::ChildProcess>(std::vector<std::string>{
        CKPT_SHARD_READER_BIN, daemon.socket(), "big", std::to_string(r), std::to_string(kProcesses), "--whole"}));
  }
  const std::string expected = "read " + std::to_string(size) + " shard bytes";
  for (int r = 0; r < kProcesses; ++r) {
    ASSERT_TRUE(procs[r]->WaitForOutput(expected, 60000)) << "process " << r << ": " << procs[r]->Wait().err;
  }
  const uint64_t during = testing::NodeSharedPlusAnonBytes();
  uint64_t pss = testing::ProcessPssBytes(daemon.pid());
  for (auto& p : procs) pss += testing::ProcessPssBytes(p->pid());
  auto list = (*client)->List();
  ASSERT_TRUE(list.ok());
  EXPECT_EQ((*list)[0].attached, static_cast<uint32_t>(kProcesses));
  for (auto& p : procs) EXPECT_EQ(p->Wait().exit_code, 0);

  const double rise = static_cast<double>(during) - static_cast<double>(before);
  std::printf("checkpoint %.1f MiB, %d processes attached, each having read all of it:\n"
              "  summed PSS of ckptd + clients: %.1f MiB = %.3f x\n"
              "  node Shmem+AnonPages rose by:  %.1f MiB = %.3f x (machine-wide, other processes included)\n",
              size / 1048576.0, kProcesses, pss / 1048576.0, static_cast<double>(pss) / size, rise / 1048576.0,
              rise / size);
  EXPECT_LE(pss, 1.05 * size) << "attached processes must share one copy";
  EXPECT_GE(pss, 0.95 * size) << "every process read the whole checkpoint, so it is resident";
}

}  // namespace
}  // namespace ckpt
