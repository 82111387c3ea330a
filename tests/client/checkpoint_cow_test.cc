// Copy-on-write views (issue 13): Checkpoint::PrivateTensorData against the real ckptd.
// A process that writes into its zero-copy view does not crash, sees its write, and pays
// only the pages it wrote; the checkpoint's shared bytes never change for anyone (this
// process's own shared mapping, a fresh attachment, another process, Verify, the daemon's
// verify), and the shared mapping cannot be made writable.
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <vector>

#include "ckpt/client.h"
#include "support/test_env.h"

namespace ckpt {
namespace {

using testing::ReadFile;
using testing::ScratchDir;

// Anonymous bytes (pages copied on write) of the mapping that contains `p` in this
// process (/proc/self/smaps); the checkpoint's own pages, shared, are not anonymous.
uint64_t AnonymousBytesOf(const void* p) {
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  bool inside = false;
  const auto addr = reinterpret_cast<uintptr_t>(p);
  while (std::getline(smaps, line)) {
    uintptr_t lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &lo, &hi) == 2 && line.find(':') > line.find(' ')) {
      inside = addr >= lo && addr < hi;
      continue;
    }
    if (inside && line.rfind("Anonymous:", 0) == 0) {
      uint64_t kb = 0;
      std::sscanf(line.c_str(), "Anonymous: %lu kB", &kb);
      return kb * 1024;
    }
  }
  return UINT64_MAX;
}

class CheckpointCowTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(testing::MakeCheckpoint({files_.File("gpt.safetensors"), "--mib", "4", "--layers", "2"}));
    ASSERT_TRUE(daemon_.Start()) << ReadFile(daemon_.log_path());
    ASSERT_EQ(daemon_.Ctl({"load", files_.File("gpt.safetensors"), "--name", "gpt"}).exit_code, 0);
    auto client = Client::Connect(daemon_.socket());
    ASSERT_TRUE(client.ok()) << client.status().ToString();
    client_ = std::move(*client);
    auto attached = client_->Attach("gpt");
    ASSERT_TRUE(attached.ok()) << attached.status().ToString();
    ckpt_ = std::move(*attached);
    // The largest tensor: several pages.
    for (const TensorInfo& t : ckpt_->tensors())
      if (big_.empty() || t.nbytes > ckpt_->Tensor(big_).value().info->nbytes) big_ = t.name;
    nbytes_ = ckpt_->Tensor(big_).value().info->nbytes;
    ASSERT_GE(nbytes_, 64u * 4096);
    const std::byte* shared = *ckpt_->TensorData(big_);
    original_.assign(shared, shared + nbytes_);
  }

  ScratchDir files_;
  testing::DaemonProcess daemon_;
  std::unique_ptr<Client> client_;
  std::unique_ptr<Checkpoint> ckpt_;
  std::string big_;
  uint64_t nbytes_ = 0;
  std::vector<std::byte> original_;
};

TEST_F(CheckpointCowTest, WritesArePrivateAndTheCheckpointStaysIntact) {
  auto priv = ckpt_->PrivateTensorData(big_);
  ASSERT_TRUE(priv.ok()) << priv.status().ToString();
  std::byte* p = *priv;
  const std::byte* shared = *ckpt_->TensorData(big_);
  ASSERT_NE(static_cast<const void*>(p), static_cast<const void*>(shared)) << "a mapping of its own";
  EXPECT_EQ(std::memcmp(p, original_.data(), nbytes_), 0) << "reads see the checkpoint's bytes";
  EXPECT_EQ(*ckpt_->PrivateTensorData(big_), p) << "one private mapping per attachment";

  // A forked child writes the whole view: no fault, and it sees its own bytes.
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    std::memset(p, 0x5a, nbytes_);
    for (uint64_t i = 0; i < nbytes_; ++i)
      if (p[i] != std::byte{0x5a}) ::_exit(3);
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status)) << "the writer died of signal " << (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the writer did not see its write";

  // This process writes too: it sees its write through every pointer into its view.
  p[0] = ~original_[0];
  p[nbytes_ - 1] = ~original_[nbytes_ - 1];
  EXPECT_EQ((*ckpt_->PrivateTensorData(big_))[0], ~original_[0]);

  // The checkpoint's bytes are unchanged for everyone else: this process's shared
  // mapping, a fresh attachment, another process, the checksums here and in the daemon.
  EXPECT_EQ(std::memcmp(shared, original_.data(), nbytes_), 0);
  auto again = client_->Attach("gpt");
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(std::memcmp(*(*again)->PrivateTensorData(big_), original_.data(), nbytes_), 0);
  EXPECT_EQ(std::memcmp(*(*again)->TensorData(big_), original_.data(), nbytes_), 0);
  EXPECT_TRUE(ckpt_->Verify().ok());
  testing::CommandResult verify = daemon_.Ctl({"verify", "gpt"});
  EXPECT_EQ(verify.exit_code, 0) << verify.out << verify.err;
  testing::CommandResult reader =
      testing::RunCommand({CKPT_SHARD_READER_BIN, daemon_.socket(), "gpt", "0", "1", "--whole"}, "");
  EXPECT_EQ(reader.exit_code, 0) << reader.err;
  // Copies read the shared mapping, never this process's writes.
  auto layout = ckpt_->PlanShard(big_, ShardSpec::Replicate());
  ASSERT_TRUE(layout.ok());
  std::vector<std::byte> copy(nbytes_);
  ASSERT_TRUE(ckpt_->CopyShard(big_, ShardSpec::Replicate(), copy.data(), copy.size()).ok());
  EXPECT_EQ(std::memcmp(copy.data(), original_.data(), nbytes_), 0);
}

TEST_F(CheckpointCowTest, OnlyThePagesWrittenAreCopied) {
  EXPECT_EQ(ckpt_->PrivateBytes().value(), 0u) << "no private mapping yet";
  std::byte* p = *ckpt_->PrivateTensorData(big_);
  const long page = ::sysconf(_SC_PAGESIZE);
  // Reading the whole view copies nothing.
  uint64_t sum = 0;
  for (uint64_t i = 0; i < nbytes_; i += 64) sum += static_cast<uint8_t>(p[i]);
  EXPECT_GE(sum, 0u);
  EXPECT_EQ(AnonymousBytesOf(p), 0u) << "reads share the checkpoint's pages";
  EXPECT_EQ(ckpt_->PrivateBytes().value(), 0u);
  // Writing one byte in each of 8 pages copies 8 pages, not the tensor.
  const std::byte* first_page = reinterpret_cast<const std::byte*>(
      (reinterpret_cast<uintptr_t>(p) + page - 1) / page * page);
  std::byte* w = p + (first_page - p);
  for (int i = 0; i < 8; ++i) w[i * page] = std::byte{1};
  const uint64_t dirty = AnonymousBytesOf(p);
  EXPECT_GE(dirty, 8u * page);
  EXPECT_LE(dirty, 8u * page + 2u * 1024 * 1024) << "at most the pages written (huge pages aside)";
  auto accounted = ckpt_->PrivateBytes();
  ASSERT_TRUE(accounted.ok()) << accounted.status().ToString();
  EXPECT_EQ(*accounted, dirty) << "what the Checkpoint reports is what the kernel counts";
}

TEST_F(CheckpointCowTest, TheSharedMappingCannotBeMadeWritable) {
  const std::byte* shared = *ckpt_->TensorData(big_);
  const long page = ::sysconf(_SC_PAGESIZE);
  void* aligned = reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(shared) / page * page);
  // The descriptor the daemon passed is read-only: the kernel refuses PROT_WRITE on a
  // shared mapping of it, so no reader can turn its view into a writer's.
  errno = 0;
  EXPECT_EQ(::mprotect(aligned, page, PROT_READ | PROT_WRITE), -1);
  EXPECT_EQ(errno, EACCES);
  EXPECT_EQ(std::memcmp(shared, original_.data(), nbytes_), 0);
}

TEST_F(CheckpointCowTest, UnknownTensorIsNotFound) {
  auto r = ckpt_->PrivateTensorData("no.such.tensor");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace ckpt
