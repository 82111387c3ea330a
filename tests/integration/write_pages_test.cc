// The write path's segment and checksums (issue 15, docs/write-path.md) against the real
// ckptd with its segment directory on a private tmpfs:
//  - the checksums computed while the chunks stream in (in-order tensors) and at publish
//    (tensors written in several pieces) equal XXH3-64 of the bytes and `verify`'s;
//  - the segment is reserved in the background while the first chunks come: on a tmpfs
//    too small for the write, bytes were already streamed when the reservation fails,
//    the write fails with ResourceExhausted, nothing is left, the tmpfs is empty again
//    and the daemon keeps serving;
//  - a writer killed while its segment is still being reserved leaves nothing and its
//    memory is freed;
//  - a daemon killed -9 while a write's segment is reserved and streamed leaves, after
//    its restart, nothing listed and nothing on the tmpfs, and the name can be written;
//  - a written segment on a huge=within_size tmpfs shows its page size and huge pages in
//    `status`, like a loaded one.
#include <signal.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xxhash.h>

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <nlohmann/json.hpp>
#include <vector>

#include "ckpt/client.h"
#include "ckpt/writer.h"
#include "integration/ops_helpers.h"
#include "shm/huge_tmpfs.h"
#include "support/test_env.h"

namespace ckpt {
namespace {

using json = nlohmann::json;
using testing::DaemonProcess;
using testing::ListSegments;
using testing::ReadFile;
using testing::TmpfsMount;
using testing::WaitFor;

std::unique_ptr<Writer> MakeWriter(const DaemonProcess& d, const std::string& name, uint64_t slot_bytes = 1u << 20) {
  WriterOptions o;
  o.slot_bytes = slot_bytes;
  o.ring_slots = 3;
  o.timeout_s = 60;
  auto w = Writer::Create(d.socket(), name, o);
  EXPECT_TRUE(w.ok()) << w.status().ToString();
  return std::move(w).value();
}

PieceSource FromBytes(std::shared_ptr<std::vector<std::byte>> v, uint64_t base = 0) {
  return [v, base](uint64_t offset, void* dst, uint64_t size) {
    std::memcpy(dst, v->data() + base + offset, size);
    return Status::Ok();
  };
}

std::shared_ptr<std::vector<std::byte>> Pattern(uint64_t n, uint32_t seed) {
  auto v = std::make_shared<std::vector<std::byte>>(n);
  uint32_t x = seed * 2654435761u + 1;
  for (auto& b : *v) {
    x = x * 1664525u + 1013904223u;
    b = static_cast<std::byte>(x >> 24);
  }
  return v;
}

// Bytes used on the file system of `dir`.
uint64_t UsedBytes(const std::string& dir) {
  struct statvfs s {};
  if (::statvfs(dir.c_str(), &s) != 0) return ~0ull;
  return (s.f_blocks - s.f_bfree) * s.f_frsize;
}

// Forks a writer of `name` (768 MiB of u8 declared, 1 MiB ring slots) whose fill stops for
// good at its `stall_at`-th call (calls before it fill their chunk with 0x5a and stream);
// returns the child's pid once it has stopped there (-1 if it did not get there).
pid_t StartStalledWriter(const DaemonProcess& d, const std::string& name, int stall_at) {
  int ready[2];
  if (::pipe(ready) != 0) return -1;
  const pid_t child = ::fork();
  if (child == 0) {
    ::close(ready[0]);
    WriterOptions o;
    o.slot_bytes = 1u << 20;
    auto w = Writer::Create(d.socket(), name, o);
    if (!w.ok()) ::_exit(2);
    int calls = 0;
    (void)(*w)->AddBox("t", DType::kU8, {768ll << 20}, {}, {}, [&](uint64_t, void* dst, uint64_t n) {
      std::memset(dst, 0x5a, n);
      if (++calls == stall_at) {
        (void)!::write(ready[1], "x", 1);
        ::pause();
      }
      return Status::Ok();
    });
    (void)(*w)->Commit();
    ::_exit(3);
  }
  ::close(ready[1]);
  char c;
  const bool stalled = child > 0 && ::read(ready[0], &c, 1) == 1;
  ::close(ready[0]);
  if (!stalled && child > 0) {
    ::kill(child, SIGKILL);
    ::waitpid(child, nullptr, 0);
  }
  return stalled ? child : -1;
}

TEST(WritePagesTest, ChecksumsComputedWhileStreamingAndAtPublishEqualTheBytesAndVerify) {
  DaemonProcess daemon({"--load-threads", "4"});
  ASSERT_TRUE(daemon.Start());
  // "big": one whole piece of 5 MiB + 12 bytes streamed over many 1 MiB slots (in order);
  // "rows": two boxes of one part, written second half first (hashed at publish);
  // "flat": one flat range covering it (in order); "empty": no bytes at all.
  const uint64_t big_bytes = (5u << 20) + 12;
  auto big = Pattern(big_bytes, 1);
  auto rows = Pattern(64 * 100 * 4, 2);
  auto flat = Pattern(1000 * 2, 3);
  auto w = MakeWriter(daemon, "sums");
  ASSERT_TRUE(w->AddBox("big", DType::kU8, {static_cast<int64_t>(big_bytes)}, {}, {}, FromBytes(big)).ok());
  ASSERT_TRUE(w->AddBox("rows", DType::kF32, {64, 100}, {32, 0}, {32, 100}, FromBytes(rows, 32 * 100 * 4)).ok());
  ASSERT_TRUE(w->AddBox("rows", DType::kF32, {64, 100}, {0, 0}, {32, 100}, FromBytes(rows)).ok());
  ASSERT_TRUE(w->AddFlat("flat", DType::kF16, {10, 100}, 0, 1000, FromBytes(flat)).ok());
  ASSERT_TRUE(w->AddBox("empty", DType::kF32, {0, 7}, {}, {}, FromBytes(flat)).ok());
  auto r = w->Commit();
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  auto client = Client::Connect(daemon.socket());
  ASSERT_TRUE(client.ok());
  auto info = (*client)->Info("sums");
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  std::map<std::string, uint64_t> want = {{"big", XXH3_64bits(big->data(), big->size())},
                                          {"rows", XXH3_64bits(rows->data(), rows->size())},
                                          {"flat", XXH3_64bits(flat->data(), flat->size())},
                                          {"empty", XXH3_64bits(nullptr, 0)}};
  ASSERT_EQ((*info).size(), 4u);
  for (const TensorInfo& t : (*info)) EXPECT_EQ(t.checksum, want.at(t.name)) << t.name;
  auto verified = (*client)->Verify("sums");
  ASSERT_TRUE(verified.ok()) << verified.status().ToString();
  EXPECT_TRUE(verified->passed);
  // Which were hashed while streaming: the three in-order tensors (the empty one has no
  // bytes), the two-piece one at publish.
  EXPECT_NE(ReadFile(daemon.log_path()).find("3 tensors (" + std::to_string(big_bytes + flat->size()) +
                                              " bytes) hashed while streaming, 1 (25600 bytes) at publish"),
            std::string::npos)
      << ReadFile(daemon.log_path());
}

TEST(WritePagesTest, ATmpfsTooSmallFailsAWriteAlreadyStreamingAndLeavesNothing) {
  DaemonProcess daemon({"--load-threads", "2"}, /*own_segment_dir=*/true);
  TmpfsMount mount(daemon.segment_dir(), "huge=never,size=80m");
  if (!mount.mounted()) GTEST_SKIP() << "cannot mount a tmpfs: " << mount.error();
  ASSERT_TRUE(daemon.Start()) << ReadFile(daemon.log_path());
  const uint64_t used_before = UsedBytes(daemon.segment_dir());
  // 256 MiB into 80 MiB: within the budget (host memory), beyond the file system.
  auto w = MakeWriter(daemon, "toobig", 4u << 20);
  std::atomic<uint64_t> staged{0};
  auto one = Pattern(1u << 20, 4);
  ASSERT_TRUE(w->AddBox("t", DType::kU8, {256ll << 20}, {}, {}, [&, one](uint64_t off, void* dst, uint64_t n) {
                 for (uint64_t done = 0; done < n;) {
                   const uint64_t at = (off + done) % one->size();
                   const uint64_t k = std::min(n - done, one->size() - at);
                   std::memcpy(static_cast<std::byte*>(dst) + done, one->data() + at, k);
                   done += k;
                 }
                 staged += n;
                 return Status::Ok();
               }).ok());
  auto r = w->Commit();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted) << r.status().ToString();
  EXPECT_NE(r.status().message().find("nothing was published"), std::string::npos) << r.status().ToString();
  // The message gives the whole segment's size (not only the 64 MiB range that failed).
  const size_t needs = r.status().message().find("the segment needs ");
  ASSERT_NE(needs, std::string::npos) << r.status().ToString();
  EXPECT_GT(std::stoull(r.status().message().substr(needs + 18)), 256ull << 20) << r.status().ToString();
  // The write had started streaming before the reservation reached the end of the tmpfs.
  EXPECT_GT(staged.load(), 0u);
  auto client = Client::Connect(daemon.socket());
  ASSERT_TRUE(client.ok());
  EXPECT_TRUE(WaitFor([&] { return ListSegments(daemon.shm_prefix(), "toobig.").empty(); }, 5000));
  EXPECT_TRUE(WaitFor([&] { return UsedBytes(daemon.segment_dir()) <= used_before; }, 5000))
      << UsedBytes(daemon.segment_dir()) << " bytes still used";
  auto st = (*client)->GetStatus();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->loading, 0u);
  EXPECT_EQ(st->memory_used_bytes, 0u);
  // The daemon keeps serving: a write that fits is published.
  auto small = MakeWriter(daemon, "fits");
  auto bytes = Pattern(3u << 20, 5);
  ASSERT_TRUE(small->AddBox("t", DType::kU8, {3ll << 20}, {}, {}, FromBytes(bytes)).ok());
  auto ok = small->Commit();
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  auto verified = (*client)->Verify("fits");
  ASSERT_TRUE(verified.ok());
  EXPECT_TRUE(verified->passed);
}

TEST(WritePagesTest, AWriterKilledWhileItsSegmentIsReservedLeavesNothingAndFreesItsMemory) {
  DaemonProcess daemon({"--load-threads", "2"}, /*own_segment_dir=*/true);
  TmpfsMount mount(daemon.segment_dir(), "huge=never,size=1g");
  if (!mount.mounted()) GTEST_SKIP() << "cannot mount a tmpfs: " << mount.error();
  ASSERT_TRUE(daemon.Start()) << ReadFile(daemon.log_path());
  const uint64_t used_before = UsedBytes(daemon.segment_dir());
  // 768 MiB declared: the daemon answers write_ready with the header reserved and
  // reserves the rest 64 MiB at a time; the writer stops at its first chunk, before it
  // sends a byte.
  const pid_t child = StartStalledWriter(daemon, "killed", 1);
  ASSERT_GT(child, 0);
  // The segment file exists (its reservation under way or done), nothing is listed.
  EXPECT_EQ(ListSegments(daemon.shm_prefix(), "killed.").size(), 1u);
  ASSERT_EQ(::kill(child, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  auto client = Client::Connect(daemon.socket());
  ASSERT_TRUE(client.ok());
  EXPECT_TRUE(WaitFor([&] { return ListSegments(daemon.shm_prefix(), "killed.").empty(); }, 10000));
  EXPECT_TRUE(WaitFor([&] { return UsedBytes(daemon.segment_dir()) <= used_before; }, 10000))
      << UsedBytes(daemon.segment_dir()) << " bytes still used";
  EXPECT_TRUE(WaitFor([&] {
    auto st = (*client)->GetStatus();
    return st.ok() && st->loading == 0 && st->memory_used_bytes == 0 && st->checkpoints == 0;
  }, 10000));
  EXPECT_NE(ReadFile(daemon.log_path()).find("part 0 disconnected"), std::string::npos) << ReadFile(daemon.log_path());
}

TEST(WritePagesTest, ADaemonKilledWhileAWriteIsReservedAndStreamingLeavesNothingAfterItsRestart) {
  DaemonProcess daemon({"--load-threads", "2"}, /*own_segment_dir=*/true);
  TmpfsMount mount(daemon.segment_dir(), "huge=never,size=1g");
  if (!mount.mounted()) GTEST_SKIP() << "cannot mount a tmpfs: " << mount.error();
  ASSERT_TRUE(daemon.Start()) << ReadFile(daemon.log_path());
  const uint64_t used_before = UsedBytes(daemon.segment_dir());
  // 768 MiB declared; 4 MiB streamed (copied into the half-reserved segment), then the
  // writer stops: the daemon dies with the segment neither reserved nor written whole.
  const pid_t child = StartStalledWriter(daemon, "half", 5);
  ASSERT_GT(child, 0);
  EXPECT_EQ(ListSegments(daemon.shm_prefix(), "half.").size(), 1u);
  daemon.Kill();
  ASSERT_EQ(::kill(child, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  // What the killed daemon left: the segment file, in kLoading, partly reserved.
  EXPECT_EQ(ListSegments(daemon.shm_prefix(), "half.").size(), 1u);
  ASSERT_TRUE(daemon.Start()) << ReadFile(daemon.log_path());
  EXPECT_TRUE(ListSegments(daemon.shm_prefix(), "half.").empty());
  // The kernel frees an unlinked file's pages once the last reference to it (the killed
  // daemon's mapping) is dropped, which can lag the unlink a little.
  EXPECT_TRUE(WaitFor([&] { return UsedBytes(daemon.segment_dir()) <= used_before; }, 10000))
      << UsedBytes(daemon.segment_dir()) << " bytes still used";
  auto client = Client::Connect(daemon.socket());
  ASSERT_TRUE(client.ok());
  auto st = (*client)->GetStatus();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->checkpoints, 0u);
  EXPECT_EQ(st->memory_used_bytes, 0u);
  EXPECT_FALSE((*client)->Info("half").ok());
  // The name is free again: a write of it is published and verifies.
  auto w = MakeWriter(daemon, "half");
  auto bytes = Pattern(3u << 20, 6);
  ASSERT_TRUE(w->AddBox("t", DType::kU8, {3ll << 20}, {}, {}, FromBytes(bytes)).ok());
  auto r = w->Commit();
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  auto verified = (*client)->Verify("half");
  ASSERT_TRUE(verified.ok()) << verified.status().ToString();
  EXPECT_TRUE(verified->passed);
}

TEST(WritePagesTest, AWrittenSegmentOnAHugeTmpfsShowsItsPages) {
  DaemonProcess daemon({"--load-threads", "2"}, /*own_segment_dir=*/true);
  TmpfsMount mount(daemon.segment_dir(), "huge=within_size,size=64m");
  if (!mount.mounted()) GTEST_SKIP() << "cannot mount a tmpfs: " << mount.error();
  const bool kernel_huge = mount.KernelGivesHugePages();
  ASSERT_TRUE(daemon.Start()) << ReadFile(daemon.log_path());
  auto w = MakeWriter(daemon, "hugew");
  auto bytes = Pattern(10u << 20, 6);
  ASSERT_TRUE(w->AddBox("t", DType::kU8, {10ll << 20}, {}, {}, FromBytes(bytes)).ok());
  auto r = w->Commit();
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->checkpoint.page_bytes, 2u << 20);
  testing::CommandResult status = daemon.Ctl({"status", "--json"});
  ASSERT_EQ(status.exit_code, 0) << status.err;
  const json s = json::parse(status.out);
  ASSERT_EQ(s["checkpoint_list"].size(), 1u);
  const json& c = s["checkpoint_list"][0];
  EXPECT_EQ(c["page_bytes"], 2u << 20) << status.out;
  EXPECT_EQ(c["segment_bytes"].get<uint64_t>() % (2u << 20), 0u);
  ASSERT_TRUE(c.contains("huge_bytes")) << status.out;
  if (kernel_huge) {
    EXPECT_GE(c["huge_bytes"].get<uint64_t>(), 10u << 20) << status.out;
  }
  testing::CommandResult info = daemon.Ctl({"info", "hugew"});
  EXPECT_NE(info.out.find("pages: 2 MiB"), std::string::npos) << info.out;
  auto client = Client::Connect(daemon.socket());
  ASSERT_TRUE(client.ok());
  auto verified = (*client)->Verify("hugew");
  ASSERT_TRUE(verified.ok());
  EXPECT_TRUE(verified->passed);
}

}  // namespace
}  // namespace ckpt
