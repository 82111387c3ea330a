// The loader's read path: planning of aligned/unaligned ranges, both engines, O_DIRECT
// and buffered reads, the fallback when O_DIRECT is refused, and files that end early.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/aligned_buffer.h"
#include "loader/file_reader.h"
#include "loader/read_op.h"
#include "support/test_env.h"

namespace ckpt::loader {
namespace {

constexpr uint64_t kChunk = 64 << 10;  // small, so ranges split into several ops

std::string RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string s(n, '\0');
  for (auto& c : s) c = static_cast<char>(rng());
  return s;
}

struct Range {
  uint64_t offset, length;
  size_t dst_shift;  // dst = aligned base + dst_shift
};

class FileReaderTest : public ::testing::TestWithParam<std::tuple<ReadEngine, DirectIo>> {
 protected:
  void SetUp() override {
    content_ = RandomBytes(1000 * 1000 + 333, 42);  // not a multiple of any block size
    path_ = dir_.File("data.bin");
    testing::WriteFile(path_, content_);
  }

  // Reads `ranges` with the parameterized engine and direct mode; checks every byte.
  void ReadAndCheck(const std::vector<Range>& ranges, std::vector<ReadOp>* planned = nullptr) {
    auto [engine, direct] = GetParam();
    auto file = OpenSourceFile(path_, direct);
    ASSERT_TRUE(file.ok()) << file.status().ToString();
    if (direct == DirectIo::kAlways) {
      ASSERT_TRUE(file->direct.valid()) << "scratch file system should allow O_DIRECT: " << file->buffered_reason;
    } else {
      EXPECT_FALSE(file->direct.valid());
    }
    std::vector<SourceFile> files;
    files.push_back(std::move(file).value());
    std::vector<AlignedBuffer> dsts(ranges.size());
    std::vector<ReadOp> ops;
    for (size_t r = 0; r < ranges.size(); ++r) {
      ASSERT_TRUE(dsts[r].Reserve(ranges[r].length + ranges[r].dst_shift + 1, 4096));
      std::memset(dsts[r].data(), 0xEE, dsts[r].size());
      PlanReads(files[0], 0, static_cast<uint32_t>(r), ranges[r].offset, ranges[r].length,
                dsts[r].data() + ranges[r].dst_shift, kChunk, &ops);
    }
    ReaderOptions options;
    options.threads = 3;
    options.queue_depth = 3;
    options.chunk_bytes = kChunk;
    auto reader = FileReader::Create(engine, options);
    ASSERT_TRUE(reader.ok()) << reader.status().ToString();
    std::vector<int> done(ops.size(), 0);
    std::mutex mu;
    Status st = (*reader)->ReadAll(files, ops, [&](size_t i) {
      std::lock_guard<std::mutex> lock(mu);
      ++done[i];
    }, nullptr);
    ASSERT_TRUE(st.ok()) << st.ToString();
    for (size_t i = 0; i < ops.size(); ++i) EXPECT_EQ(done[i], 1) << "op " << i;
    for (size_t r = 0; r < ranges.size(); ++r) {
      const Range& g = ranges[r];
      const std::byte* d = dsts[r].data() + g.dst_shift;
      ASSERT_EQ(std::memcmp(d, content_.data() + g.offset, g.length), 0) << "range " << r;
      // Nothing written around the range.
      for (size_t k = 0; k < g.dst_shift; ++k) ASSERT_EQ(dsts[r].data()[k], std::byte(0xEE));
      ASSERT_EQ(d[g.length], std::byte(0xEE)) << "range " << r;
    }
    if (planned) *planned = ops;
  }

  testing::ScratchDir dir_;
  std::string content_;
  std::string path_;
};

TEST_P(FileReaderTest, UnalignedRangesLandExactly) {
  ReadAndCheck({{0, 1, 0},
                {1, 4095, 64},
                {511, 513, 8},
                {4097, 300000, 64},
                {12345, 200001, 12345 % 512},  // same phase as the file: direct middle
                {0, content_.size(), 0},       // whole file, page aligned both sides
                {content_.size() - 10, 10, 0},
                {777, 0 + 4096 * 3, 777 % 4096}});
}

TEST_P(FileReaderTest, SamePhaseRangesReadStraightIntoTheDestination) {
  std::vector<ReadOp> ops;
  ReadAndCheck({{12345, 300001, 12345 % 4096}}, &ops);
  bool direct = false;
  for (const ReadOp& op : ops) direct |= op.mode == ReadMode::kDirect;
  EXPECT_EQ(direct, std::get<1>(GetParam()) == DirectIo::kAlways);
}

TEST_P(FileReaderTest, FileEndingEarlyIsCorrupt) {
  auto [engine, direct] = GetParam();
  auto file = OpenSourceFile(path_, direct);
  ASSERT_TRUE(file.ok());
  std::vector<SourceFile> files;
  files.push_back(std::move(file).value());
  for (uint64_t start : {content_.size() - 100, content_.size() / 4096 * 4096, content_.size() + 5000}) {
    AlignedBuffer dst;
    ASSERT_TRUE(dst.Reserve(1 << 20, 4096));
    std::vector<ReadOp> ops;
    PlanReads(files[0], 0, 0, start, 200000, dst.data() + start % 4096, kChunk, &ops);
    ReaderOptions options;
    options.threads = 2;
    options.chunk_bytes = kChunk;
    auto reader = FileReader::Create(engine, options);
    ASSERT_TRUE(reader.ok());
    Status st = (*reader)->ReadAll(files, ops, [](size_t) {}, nullptr);
    EXPECT_EQ(st.code(), StatusCode::kCorrupt) << start << ": " << st.ToString();
  }
}

TEST_P(FileReaderTest, CancelledBeforeStart) {
  auto [engine, direct] = GetParam();
  auto file = OpenSourceFile(path_, direct);
  ASSERT_TRUE(file.ok());
  std::vector<SourceFile> files;
  files.push_back(std::move(file).value());
  AlignedBuffer dst;
  ASSERT_TRUE(dst.Reserve(content_.size(), 4096));
  std::vector<ReadOp> ops;
  PlanReads(files[0], 0, 0, 0, content_.size(), dst.data(), kChunk, &ops);
  std::atomic<bool> cancel{true};
  ReaderOptions options;
  options.chunk_bytes = kChunk;
  options.cancel = &cancel;
  auto reader = FileReader::Create(engine, options);
  ASSERT_TRUE(reader.ok());
  Status st = (*reader)->ReadAll(files, ops, [](size_t) { ADD_FAILURE() << "no op should run"; }, nullptr);
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition) << st.ToString();
}

INSTANTIATE_TEST_SUITE_P(Engines, FileReaderTest,
                         ::testing::Combine(::testing::Values(ReadEngine::kPread, ReadEngine::kUring),
                                            ::testing::Values(DirectIo::kAlways, DirectIo::kNever)),
                         [](const auto& info) {
                           return std::string(ReadEngineName(std::get<0>(info.param))) +
                                  (std::get<1>(info.param) == DirectIo::kAlways ? "_direct" : "_buffered");
                         });

TEST(ReadOpTest, DirectReadRefusedByTheKernelFallsBackToBufferedRead) {
  testing::ScratchDir dir;
  const std::string content = RandomBytes(256 << 10, 7);
  testing::WriteFile(dir.File("f"), content);
  auto file = OpenSourceFile(dir.File("f"), DirectIo::kAlways);
  ASSERT_TRUE(file.ok());
  ASSERT_TRUE(file->direct.valid());
  AlignedBuffer dst;
  ASSERT_TRUE(dst.Reserve(128 << 10, 4096));
  // An op that claims to be aligned but whose destination is not: the kernel answers
  // EINVAL to the O_DIRECT read, and the op is redone through the page cache.
  ReadOp op{0, 0, 8192, 64 << 10, dst.data() + 3, ReadMode::kDirect};
  Status st = FinishRead(op, *file, nullptr, 0);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(std::memcmp(dst.data() + 3, content.data() + 8192, 64 << 10), 0);
  // The same through io_uring.
  std::memset(dst.data(), 0, dst.size());
  std::vector<SourceFile> files;
  files.push_back(std::move(file).value());
  ReaderOptions options;
  options.threads = 1;
  options.chunk_bytes = 64 << 10;
  auto reader = FileReader::Create(ReadEngine::kUring, options);
  ASSERT_TRUE(reader.ok());
  ASSERT_TRUE((*reader)->ReadAll(files, {op}, [](size_t) {}, nullptr).ok());
  EXPECT_EQ(std::memcmp(dst.data() + 3, content.data() + 8192, 64 << 10), 0);
}

TEST(ReadOpTest, FileWithoutDirectDescriptorIsReadBuffered) {
  testing::ScratchDir dir;
  testing::WriteFile(dir.File("f"), RandomBytes(10000, 1));
  auto file = OpenSourceFile(dir.File("f"), DirectIo::kAlways);
  ASSERT_TRUE(file.ok());
  file->direct.reset();  // what OpenSourceFile leaves when the file system refuses O_DIRECT
  std::vector<ReadOp> ops;
  AlignedBuffer dst;
  ASSERT_TRUE(dst.Reserve(16384, 4096));
  PlanReads(*file, 0, 0, 0, 10000, dst.data(), 4096, &ops);
  ASSERT_EQ(ops.size(), 3u);
  for (const ReadOp& op : ops) EXPECT_EQ(op.mode, ReadMode::kBuffered);
  auto never = OpenSourceFile(dir.File("f"), DirectIo::kNever);
  ASSERT_TRUE(never.ok());
  EXPECT_FALSE(never->direct.valid());
  EXPECT_EQ(never->buffered_reason, "O_DIRECT off");
}

TEST(ReadOpTest, AutoSkipsDirectForACachedFile) {
  testing::ScratchDir dir;
  const std::string content = RandomBytes(1 << 20, 3);
  testing::WriteFile(dir.File("f"), content);
  EXPECT_EQ(testing::ReadFile(dir.File("f")).size(), content.size());  // now in the page cache
  auto file = OpenSourceFile(dir.File("f"), DirectIo::kAuto);
  ASSERT_TRUE(file.ok());
  EXPECT_FALSE(file->direct.valid());
  EXPECT_EQ(file->buffered_reason, "file in page cache");
}

TEST(ReadOpTest, MissingFileIsNotFound) {
  EXPECT_EQ(OpenSourceFile("/nonexistent/ckpt/file", DirectIo::kAuto).status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace ckpt::loader
