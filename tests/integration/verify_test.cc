// End-to-end through the real ckptd: load progress reaches the client library in order
// and ends at the total; `ckptctl verify` passes on a clean segment and fails, naming the
// tensor, once a byte of the shared memory is flipped.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "ckpt/client.h"
#include "shm/segment_reader.h"
#include "support/test_env.h"

namespace ckpt {
namespace {

using nlohmann::json;
using testing::CommandResult;
using testing::DaemonProcess;
using testing::ReadFile;

class VerifyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(testing::MakeCheckpoint({files_.File("gpt.safetensors"), "--mib", "96", "--layers", "2"}));
    ASSERT_TRUE(daemon_.Start()) << ReadFile(daemon_.log_path());
  }

  // Flips one byte in the middle of tensor `tensor` of the checkpoint's segment.
  void FlipByte(const std::string& name, const std::string& tensor) {
    CommandResult info = daemon_.Ctl({"info", name, "--json"});
    ASSERT_EQ(info.exit_code, 0) << info.err;
    const std::string shm_name = json::parse(info.out)["checkpoint"]["shm_name"].get<std::string>();
    const std::string path = daemon_.segment_dir() + "/" + shm_name;
    int fd = ::open(path.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC);
    ASSERT_GE(fd, 0) << "cannot open " << path << " read-write";
    auto segment = shm::SegmentReader::FromFd(fd, path);
    ASSERT_TRUE(segment.ok()) << segment.status().ToString();
    const int64_t i = (*segment)->Find(tensor);
    ASSERT_GE(i, 0);
    const uint64_t at = static_cast<uint64_t>((*segment)->tensor_data(i) -
                                              reinterpret_cast<const std::byte*>(&(*segment)->header())) +
                        (*segment)->tensors()[i].nbytes / 2;
    void* p = ::mmap(nullptr, (*segment)->segment_bytes(), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ::close(fd);
    ASSERT_NE(p, MAP_FAILED);
    static_cast<unsigned char*>(p)[at] ^= 0x01;
    ::munmap(p, (*segment)->segment_bytes());
    EXPECT_NE(shm::Checksum((*segment)->tensor_data(i), (*segment)->tensors()[i].nbytes),
              (*segment)->tensors()[i].checksum) << "flipping byte " << at << " of " << shm_name;
  }

  testing::ScratchDir files_;
  DaemonProcess daemon_;
};

TEST_F(VerifyTest, ProgressIsMonotonicAndEndsAtTheTotal) {
  // Out of the page cache, so the daemon reads from the disk (O_DIRECT) and takes a while.
  int fd = ::open(files_.File("gpt.safetensors").c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
  auto client = Client::Connect(daemon_.socket());
  ASSERT_TRUE(client.ok());
  std::vector<std::pair<uint64_t, uint64_t>> events;
  auto summary = (*client)->Load(files_.File("gpt.safetensors"), "gpt",
                                 [&](uint64_t done, uint64_t total) { events.emplace_back(done, total); });
  ASSERT_TRUE(summary.ok()) << summary.status().ToString();
  ASSERT_FALSE(events.empty());
  for (size_t k = 0; k < events.size(); ++k) {
    EXPECT_EQ(events[k].second, summary->data_bytes);
    EXPECT_LE(events[k].first, events[k].second);
    if (k > 0) {
      EXPECT_GE(events[k].first, events[k - 1].first);
    }
  }
  EXPECT_EQ(events.back().first, summary->data_bytes);
  // The daemon says how it read the file.
  EXPECT_NE(ReadFile(daemon_.log_path()).find("read with "), std::string::npos) << ReadFile(daemon_.log_path());
}

TEST_F(VerifyTest, CtlLoadDrawsABarWithBytesRateAndEtaOnATerminal) {
  if (::access("/usr/bin/script", X_OK) != 0) GTEST_SKIP() << "no script(1) to give ckptctl a terminal";
  int fd = ::open(files_.File("gpt.safetensors").c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
  // script(1) runs ckptctl on a pseudo-terminal, so stderr is a TTY and the bar is drawn.
  const std::string cmd = std::string(CKPTCTL_BIN) + " --socket " + daemon_.socket() + " load " +
                          files_.File("gpt.safetensors") + " --name bar";
  CommandResult r = testing::RunCommand({"/usr/bin/script", "-qec", cmd, "/dev/null"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("100.0%"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("/s"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("ETA"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("/ 96."), std::string::npos) << r.out;  // bytes done / total
  EXPECT_NE(r.out.find("loaded 'bar'"), std::string::npos) << r.out;
}

TEST_F(VerifyTest, CtlVerifyPassesCleanAndFailsOnAFlippedByte) {
  CommandResult load = daemon_.Ctl({"load", files_.File("gpt.safetensors"), "--name", "gpt"});
  ASSERT_EQ(load.exit_code, 0) << load.err;

  CommandResult ok = daemon_.Ctl({"verify", "gpt"});
  EXPECT_EQ(ok.exit_code, 0) << ok.out << ok.err;
  EXPECT_NE(ok.out.find("OK"), std::string::npos) << ok.out;

  ASSERT_NO_FATAL_FAILURE(FlipByte("gpt", "h.1.mlp.c_fc.weight"));
  CommandResult bad = daemon_.Ctl({"verify", "gpt"});
  EXPECT_EQ(bad.exit_code, 1) << bad.out << bad.err;
  EXPECT_NE(bad.out.find("MISMATCH"), std::string::npos) << bad.out;
  EXPECT_NE(bad.out.find("h.1.mlp.c_fc.weight"), std::string::npos) << bad.out;

  CommandResult bad_json = daemon_.Ctl({"verify", "gpt", "--json"});
  EXPECT_EQ(bad_json.exit_code, 1);
  json r = json::parse(bad_json.out, nullptr, false);
  EXPECT_EQ(r["passed"], false);
  EXPECT_EQ(r["mismatch_count"], 1);
  EXPECT_EQ(r["mismatched"], json::array({"h.1.mlp.c_fc.weight"}));

  CommandResult unknown = daemon_.Ctl({"verify", "nope"});
  EXPECT_EQ(unknown.exit_code, 1);
  EXPECT_FALSE(unknown.err.empty());
}

}  // namespace
}  // namespace ckpt
