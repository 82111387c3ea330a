// LoadIntoSegment end to end on real files: every engine and I/O mode gives the same
// bytes and checksums, progress is monotonic and ends at the total, failures and
// cancellation leave no segment behind; VerifySegment finds a flipped byte.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <random>

#include "loader/checkpoint_loader.h"
#include "loader/segment_verifier.h"
#include "shm/segment_reader.h"
#include "support/test_env.h"

namespace ckpt::loader {
namespace {

// Two files of random bytes and a plan of tensors at odd offsets and sizes.
class LoaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::mt19937 rng(9);
    for (int f = 0; f < 2; ++f) {
      std::string bytes(3 * 1000 * 1000 + 17 * f, '\0');
      for (auto& c : bytes) c = static_cast<char>(rng());
      contents_.push_back(bytes);
      testing::WriteFile(dir_.File("f" + std::to_string(f)), bytes);
      auto opened = OpenFileNoFollow(dir_.File("f" + std::to_string(f)));
      ASSERT_TRUE(opened.ok()) << opened.status().ToString();
      plan_.files.push_back(*opened);
    }
    plan_.format = "test";
    uint64_t offset[2] = {13, 8};
    const uint64_t sizes[] = {1, 4096, 1000003, 8, 0, 513 * 4, 1234567, 40000};
    for (size_t i = 0; i < std::size(sizes); ++i) {
      format::PlannedTensor t;
      t.name = "t" + std::to_string(i);
      t.dtype = DType::kU8;
      t.shape = {static_cast<int64_t>(sizes[i])};
      t.file_index = i % 2;
      t.file_offset = offset[i % 2];
      t.nbytes = sizes[i];
      offset[i % 2] += sizes[i] + (i % 3) * 8;  // gaps between some tensors
      plan_.tensors.push_back(t);
    }
  }
  void TearDown() override { EXPECT_TRUE(segments_.List().empty()); }

  shm::SegmentSpec Spec(const std::string& tag) const {
    shm::SegmentSpec spec;
    spec.directory = &segments_.dir();
    spec.checkpoint_name = "t-" + tag;
    spec.source_path = "/x";
    spec.generation = 1;
    spec.mode = 0600;
    return spec;
  }

  void ExpectContents(const std::string& file_name) {
    auto reader = testing::OpenSegmentReader(segments_.dir(), file_name);
    ASSERT_TRUE(reader.ok()) << reader.status().ToString();
    ASSERT_TRUE((*reader)->VerifyChecksums().ok());
    for (size_t i = 0; i < plan_.tensors.size(); ++i) {
      const auto& t = plan_.tensors[i];
      ASSERT_EQ(std::memcmp((*reader)->tensor_data(i), contents_[t.file_index].data() + t.file_offset, t.nbytes), 0)
          << t.name;
    }
  }

  testing::ScratchDir dir_;
  testing::ScratchSegmentDirectory segments_;
  std::vector<std::string> contents_;
  format::LoadPlan plan_;
};

TEST_F(LoaderTest, EveryEngineAndModeLoadsTheSameBytes) {
  std::vector<uint64_t> reference;
  for (ReadEngine engine : {ReadEngine::kPread, ReadEngine::kUring}) {
    for (DirectIo direct : {DirectIo::kAlways, DirectIo::kNever, DirectIo::kAuto}) {
      LoadOptions options;
      options.engine = engine;
      options.direct_io = direct;
      options.threads = 3;
      options.chunk_bytes = 1 << 20;
      std::vector<std::pair<uint64_t, uint64_t>> progress;
      options.progress = [&](uint64_t done, uint64_t total) { progress.emplace_back(done, total); };
      auto loaded = LoadIntoSegment(plan_, Spec("ok"), options);
      ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
      SCOPED_TRACE(loaded->io_summary);
      EXPECT_NE(loaded->io_summary.find(ReadEngineName(engine)), std::string::npos);
      if (direct == DirectIo::kAlways) {
        EXPECT_EQ(loaded->io_summary.find("buffered"), std::string::npos);
      }
      if (direct == DirectIo::kNever) {
        EXPECT_NE(loaded->io_summary.find("buffered (O_DIRECT off)"), std::string::npos);
      }
      ExpectContents(loaded->file_name);
      std::vector<uint64_t> sums;
      for (const auto& t : loaded->tensors) sums.push_back(t.checksum);
      if (reference.empty()) reference = sums;
      EXPECT_EQ(sums, reference);
      ASSERT_FALSE(progress.empty());
      for (size_t k = 1; k < progress.size(); ++k) EXPECT_GE(progress[k].first, progress[k - 1].first);
      EXPECT_EQ(progress.back().first, plan_.TotalBytes());
      EXPECT_EQ(progress.back().second, plan_.TotalBytes());
      ASSERT_TRUE(segments_.dir().Remove(loaded->file_name).ok());
    }
  }
}

TEST_F(LoaderTest, FileShorterThanThePlanIsCorruptAndLeavesNoSegment) {
  const uint64_t planned_offset = plan_.tensors.back().file_offset;
  plan_.tensors.back().file_offset = contents_[plan_.tensors.back().file_index].size() - 100;
  for (DirectIo direct : {DirectIo::kAlways, DirectIo::kNever}) {
    LoadOptions options;
    options.direct_io = direct;
    auto loaded = LoadIntoSegment(plan_, Spec("short"), options);
    EXPECT_EQ(loaded.status().code(), StatusCode::kCorrupt) << loaded.status().ToString();
  }
  // A file truncated after planning: the reads hit the end, and the file's identity says
  // why: it changed while it was being loaded.
  plan_.tensors.back().file_offset = planned_offset;
  ::truncate(dir_.File("f0").c_str(), 500000);
  for (ReadEngine engine : {ReadEngine::kPread, ReadEngine::kUring}) {
    LoadOptions options;
    options.engine = engine;
    auto loaded = LoadIntoSegment(plan_, Spec("short"), options);
    EXPECT_EQ(loaded.status().code(), StatusCode::kFailedPrecondition) << loaded.status().ToString();
    EXPECT_NE(loaded.status().message().find("changed while it was being loaded"), std::string::npos)
        << loaded.status().ToString();
    EXPECT_TRUE(segments_.List().empty());
  }
}

// The plan's descriptors are the only way to the bytes: a file rewritten in place (same
// size, new bytes), or renamed away and replaced by another, after planning fails the
// load instead of publishing whatever is there now.
TEST_F(LoaderTest, FileChangedOrReplacedAfterPlanningFailsTheLoad) {
  {
    std::string other = contents_[1];
    other[5] ^= 1;
    testing::WriteFile(dir_.File("f1.new"), other);
    ASSERT_EQ(::rename(dir_.File("f1").c_str(), dir_.File("f1.old").c_str()), 0);
    ASSERT_EQ(::rename(dir_.File("f1.new").c_str(), dir_.File("f1").c_str()), 0);
    auto loaded = LoadIntoSegment(plan_, Spec("swap"), LoadOptions{});
    EXPECT_EQ(loaded.status().code(), StatusCode::kFailedPrecondition) << loaded.status().ToString();
    EXPECT_TRUE(segments_.List().empty());
  }
  {
    std::string same_size = contents_[0];
    same_size[100] ^= 1;
    testing::WriteFile(dir_.File("f0"), same_size);  // truncate and regrow in place
    auto loaded = LoadIntoSegment(plan_, Spec("rewrite"), LoadOptions{});
    EXPECT_EQ(loaded.status().code(), StatusCode::kFailedPrecondition) << loaded.status().ToString();
    EXPECT_NE(loaded.status().message().find("changed while it was being loaded"), std::string::npos);
    EXPECT_TRUE(segments_.List().empty());
  }
}

TEST_F(LoaderTest, CancellationLeavesNoSegment) {
  for (ReadEngine engine : {ReadEngine::kPread, ReadEngine::kUring}) {
    std::atomic<bool> cancel{true};
    LoadOptions options;
    options.engine = engine;
    options.cancel = &cancel;
    auto loaded = LoadIntoSegment(plan_, Spec("cancel"), options);
    EXPECT_EQ(loaded.status().code(), StatusCode::kFailedPrecondition) << loaded.status().ToString();
    EXPECT_TRUE(segments_.List().empty());
  }
  // Cancelled while reading: the first completed read raises the flag.
  std::atomic<bool> cancel{false};
  LoadOptions options;
  options.threads = 1;
  options.chunk_bytes = 1 << 20;
  options.direct_io = DirectIo::kNever;
  options.cancel = &cancel;
  options.progress = [&](uint64_t, uint64_t) { cancel = true; };
  // Progress comes every 100 ms; make the load long enough by repeating tensors.
  format::LoadPlan big = plan_;
  for (int r = 0; r < 100; ++r) {
    for (auto t : plan_.tensors) {
      t.name += "." + std::to_string(r);
      big.tensors.push_back(t);
    }
  }
  auto loaded = LoadIntoSegment(big, Spec("cancel"), options);
  if (loaded.ok()) {
    GTEST_SKIP() << "load finished before the first progress tick";
  }
  EXPECT_EQ(loaded.status().code(), StatusCode::kFailedPrecondition) << loaded.status().ToString();
}

TEST_F(LoaderTest, VerifySegmentFindsAFlippedByte) {
  LoadOptions options;
  auto loaded = LoadIntoSegment(plan_, Spec("verify"), options);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  {
    auto reader = testing::OpenSegmentReader(segments_.dir(), loaded->file_name);
    ASSERT_TRUE(reader.ok());
    auto report = VerifySegment(**reader, 2);
    ASSERT_TRUE(report.ok());
    EXPECT_TRUE(report->ok());
    EXPECT_EQ(report->tensors, plan_.tensors.size());
    EXPECT_EQ(report->bytes, plan_.TotalBytes());

    // Flip one byte of tensor t2 through a writable mapping of the object.
    const uint64_t at = static_cast<uint64_t>((*reader)->tensor_data(2) - reinterpret_cast<const std::byte*>(&(*reader)->header()));
    int fd = ::openat(segments_.dir().fd(), loaded->file_name.c_str(), O_RDWR | O_CLOEXEC);
    ASSERT_GE(fd, 0);
    void* p = ::mmap(nullptr, (*reader)->segment_bytes(), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ::close(fd);
    ASSERT_NE(p, MAP_FAILED);
    static_cast<unsigned char*>(p)[at + 500] ^= 0x40;
    ::munmap(p, (*reader)->segment_bytes());

    report = VerifySegment(**reader, 2);
    ASSERT_TRUE(report.ok());
    EXPECT_FALSE(report->ok());
    EXPECT_EQ(report->mismatch_count, 1u);
    ASSERT_EQ(report->mismatched.size(), 1u);
    EXPECT_EQ(report->mismatched[0], "t2");
  }
  ASSERT_TRUE(segments_.dir().Remove(loaded->file_name).ok());
}

}  // namespace
}  // namespace ckpt::loader
