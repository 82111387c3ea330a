// The real ckptd with its segment directory on a private tmpfs (its --segment-dir, as the
// unit's ckptd-mount-segments mounts /run/ckptd-segments):
//  - huge=within_size: the daemon logs what it got, `ckptctl status --json` and `info`
//    show 2 MiB pages per segment and for the daemon, a client's own mapping of the
//    segment uses PMD entries (ShmemPmdMapped in its smaps) and reads the right bytes;
//    after a SIGKILL the restarted daemon re-adopts the 2 MiB-sized segment;
//  - huge=within_size with size= too small for a checkpoint: the load fails with a clear
//    error, no segment file is left, the daemon keeps serving and a client reading the
//    checkpoint that fits gets no SIGBUS;
//  - huge=never (huge pages unavailable): 4 KiB pages, said so, loads still work.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "ckpt/client.h"
#include "integration/ops_helpers.h"
#include "shm/huge_pages.h"
#include "shm/huge_tmpfs.h"
#include "support/test_env.h"

namespace ckpt {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using testing::CommandResult;
using testing::DaemonProcess;
using testing::ReadFile;
using testing::ScratchDir;
using testing::TmpfsMount;

// Attaches to `name`, reads every byte of "w" against its pattern; returns the bytes of
// the client's own mapping that are on PMD entries (-1 on error).
int64_t AttachAndRead(const DaemonProcess& daemon, const std::string& name, uint64_t* wrong) {
  auto client = Client::Connect(daemon.socket());
  if (!client.ok()) return -1;
  auto ckpt = (*client)->Attach(name);
  if (!ckpt.ok()) {
    ADD_FAILURE() << ckpt.status().ToString();
    return -1;
  }
  auto meta = (*ckpt)->Tensor("meta");
  auto w = (*ckpt)->Tensor("w");
  if (!meta.ok() || !w.ok()) return -1;
  *wrong = testing::WrongFloats(reinterpret_cast<const int64_t*>(meta->data),
                                reinterpret_cast<const float*>(w->data), w->info->nbytes / 4);
  auto pmd = shm::PmdMappedBytes(w->data);
  return pmd.ok() ? static_cast<int64_t>(*pmd) : -1;
}

TEST(HugePagesDaemonTest, SegmentsOnAHugeTmpfsAreShownMappedHugeAndReadopted) {
  ScratchDir files;
  testing::WritePatternCheckpoint(files.File("c.safetensors"), 4, 1, 10 * 1024);  // 10 MiB
  DaemonProcess daemon({}, /*own_segment_dir=*/true);
  TmpfsMount mount(daemon.segment_dir(), "huge=within_size,size=64m");
  if (!mount.mounted()) GTEST_SKIP() << "cannot mount a tmpfs: " << mount.error();
  const bool kernel_huge = mount.KernelGivesHugePages();
  ASSERT_TRUE(daemon.Start()) << ReadFile(daemon.log_path());
  EXPECT_NE(ReadFile(daemon.log_path()).find("tmpfs huge=within_size: 2 MiB pages"), std::string::npos)
      << ReadFile(daemon.log_path());

  CommandResult load = daemon.Ctl({"load", files.File("c.safetensors"), "--name", "c"});
  ASSERT_EQ(load.exit_code, 0) << load.err << ReadFile(daemon.log_path());
  CommandResult status = daemon.Ctl({"status", "--json"});
  ASSERT_EQ(status.exit_code, 0) << status.err;
  const json s = json::parse(status.out);
  EXPECT_EQ(s["segment_page_bytes"], 2u << 20) << status.out;
  EXPECT_NE(s["segment_pages"].get<std::string>().find("2 MiB pages"), std::string::npos);
  ASSERT_EQ(s["checkpoint_list"].size(), 1u);
  const json& c = s["checkpoint_list"][0];
  EXPECT_EQ(c["page_bytes"], 2u << 20);
  EXPECT_EQ(c["segment_bytes"].get<uint64_t>() % (2u << 20), 0u);
  if (kernel_huge) EXPECT_GE(c["huge_bytes"].get<uint64_t>(), 8u << 20) << status.out;
  CommandResult info = daemon.Ctl({"info", "c"});
  EXPECT_NE(info.out.find("pages: 2 MiB"), std::string::npos) << info.out;
  CommandResult plain = daemon.Ctl({"status"});
  EXPECT_NE(plain.out.find("segment pages"), std::string::npos) << plain.out;
  EXPECT_NE(daemon.Ctl({"info", "c", "--json"}).out.find("\"page_bytes\": 2097152"), std::string::npos);

  uint64_t wrong = 1;
  const int64_t pmd = AttachAndRead(daemon, "c", &wrong);
  EXPECT_EQ(wrong, 0u);
  if (!kernel_huge) GTEST_SKIP() << "the kernel offers no shmem THP: nothing more to check";
  EXPECT_GE(pmd, 8 << 20) << "the client maps the segment with 2 MiB entries";

  // A crash: the segment stays in the directory, the next daemon adopts it.
  daemon.Kill();
  ASSERT_TRUE(daemon.Start()) << ReadFile(daemon.log_path());
  CommandResult again = daemon.Ctl({"status", "--json"});
  ASSERT_EQ(again.exit_code, 0) << again.err;
  const json a = json::parse(again.out);
  ASSERT_EQ(a["checkpoint_list"].size(), 1u) << again.out;
  EXPECT_EQ(a["checkpoint_list"][0]["page_bytes"], 2u << 20);
  EXPECT_FALSE(a["checkpoint_list"][0].contains("huge_bytes")) << "not measured for adopted segments";
  wrong = 1;
  EXPECT_GE(AttachAndRead(daemon, "c", &wrong), 8 << 20);
  EXPECT_EQ(wrong, 0u);
}

TEST(HugePagesDaemonTest, AHugeTmpfsTooSmallFailsTheLoadCleanlyAndTheDaemonKeepsServing) {
  ScratchDir files;
  testing::WritePatternCheckpoint(files.File("big.safetensors"), 5, 1, 12 * 1024);  // 12 MiB
  testing::WritePatternCheckpoint(files.File("small.safetensors"), 6, 1, 1024);     // 1 MiB
  for (const char* threads : {"1", "4"}) {
    SCOPED_TRACE(threads);
    DaemonProcess daemon({"--load-threads", threads}, /*own_segment_dir=*/true);
    TmpfsMount mount(daemon.segment_dir(), "huge=within_size,size=8m");
    if (!mount.mounted()) GTEST_SKIP() << "cannot mount a tmpfs: " << mount.error();
    ASSERT_TRUE(daemon.Start()) << ReadFile(daemon.log_path());
    CommandResult big = daemon.Ctl({"load", files.File("big.safetensors"), "--name", "big"});
    EXPECT_NE(big.exit_code, 0);
    EXPECT_NE(big.err.find("not enough room"), std::string::npos) << big.err;
    EXPECT_TRUE(testing::ListSegments(daemon.shm_prefix()).empty()) << "no segment left behind";
    EXPECT_TRUE(daemon.Running());
    CommandResult list = daemon.Ctl({"list", "--json"});
    EXPECT_EQ(list.exit_code, 0) << list.err;
    EXPECT_EQ(list.out.find("\"big\""), std::string::npos) << list.out;
    CommandResult small = daemon.Ctl({"load", files.File("small.safetensors"), "--name", "small"});
    ASSERT_EQ(small.exit_code, 0) << small.err << ReadFile(daemon.log_path());
    uint64_t wrong = 1;
    EXPECT_GE(AttachAndRead(daemon, "small", &wrong), 0);
    EXPECT_EQ(wrong, 0u);
  }
}

TEST(HugePagesDaemonTest, WithoutHugePagesTheDaemonSaysSoAndUsesSmallPages) {
  ScratchDir files;
  testing::WritePatternCheckpoint(files.File("c.safetensors"), 7, 1, 3 * 1024);
  DaemonProcess daemon({}, /*own_segment_dir=*/true);
  TmpfsMount mount(daemon.segment_dir(), "huge=never,size=64m");
  if (!mount.mounted()) GTEST_SKIP() << "cannot mount a tmpfs: " << mount.error();
  ASSERT_TRUE(daemon.Start()) << ReadFile(daemon.log_path());
  EXPECT_NE(ReadFile(daemon.log_path()).find("tmpfs huge=never: 4 KiB pages"), std::string::npos)
      << ReadFile(daemon.log_path());
  ASSERT_EQ(daemon.Ctl({"load", files.File("c.safetensors"), "--name", "c"}).exit_code, 0);
  const json s = json::parse(daemon.Ctl({"status", "--json"}).out);
  EXPECT_EQ(s["segment_page_bytes"], 4096);
  EXPECT_EQ(s["checkpoint_list"][0]["page_bytes"], 4096);
  EXPECT_EQ(s["checkpoint_list"][0]["huge_bytes"], 0);
  uint64_t wrong = 1;
  EXPECT_EQ(AttachAndRead(daemon, "c", &wrong), 0);
  EXPECT_EQ(wrong, 0u);
}

}  // namespace
}  // namespace ckpt
