#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <random>

#include "shm/segment_format.h"
#include "shm/segment_name.h"
#include "shm/segment_reader.h"
#include "shm/segment_writer.h"
#include "support/test_env.h"

namespace ckpt::shm {
namespace {

using testing::OpenSegmentReader;
using testing::ScratchSegmentDirectory;

SegmentSpec TwoTensorSpec(const SegmentDirectory& dir) {
  SegmentSpec spec;
  spec.directory = &dir;
  spec.checkpoint_name = "demo";
  spec.source_path = "/models/demo.safetensors";
  spec.generation = 7;
  spec.tensors.push_back({"w", DType::kF32, {3, 5}, 60, 0});
  spec.tensors.push_back({"b", DType::kU8, {3}, 3, 0});
  return spec;
}

// Writes and publishes the two-tensor segment; returns its file name.
std::string WriteDemo(const SegmentDirectory& dir, std::vector<uint64_t>* sums_out = nullptr) {
  auto writer = SegmentWriter::Create(TwoTensorSpec(dir));
  EXPECT_TRUE(writer.ok()) << writer.status().ToString();
  if (!writer.ok()) return "";
  for (int i = 0; i < 60; ++i) (*writer)->tensor_data(0)[i] = std::byte(i);
  std::memcpy((*writer)->tensor_data(1), "xyz", 3);
  std::vector<uint64_t> sums = {Checksum((*writer)->tensor_data(0), 60), Checksum("xyz", 3)};
  EXPECT_TRUE((*writer)->Publish(sums, 1234).ok());
  if (sums_out) *sums_out = sums;
  return (*writer)->file_name();
}

TEST(SegmentTest, PublishedSegmentReadsBack) {
  ScratchSegmentDirectory dir;
  std::vector<uint64_t> sums;
  const std::string name = WriteDemo(dir.dir(), &sums);
  auto reader = OpenSegmentReader(dir.dir(), name);
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  EXPECT_EQ((*reader)->checkpoint_name(), "demo");
  EXPECT_EQ((*reader)->source_path(), "/models/demo.safetensors");
  EXPECT_EQ((*reader)->generation(), 7u);
  ASSERT_EQ((*reader)->tensors().size(), 2u);
  const TensorInfo& w = (*reader)->tensors()[0];
  EXPECT_EQ(w.name, "w");
  EXPECT_EQ(w.shape, (std::vector<int64_t>{3, 5}));
  EXPECT_EQ(w.checksum, sums[0]);
  EXPECT_EQ((*reader)->Find("b"), 1);
  EXPECT_EQ((*reader)->Find("nope"), -1);
  EXPECT_EQ(std::memcmp((*reader)->tensor_data(1), "xyz", 3), 0);
  EXPECT_EQ(reinterpret_cast<uintptr_t>((*reader)->tensor_data(0)) % kDataAlignment, 0u);
  EXPECT_TRUE((*reader)->VerifyChecksums().ok());
  // The file name is <checkpoint>.<generation>.<id>, and the id is the header's.
  auto parsed = SegmentName::Parse(name);
  ASSERT_TRUE(parsed) << name;
  EXPECT_EQ(parsed->checkpoint, "demo");
  EXPECT_EQ(parsed->generation, 7u);
  EXPECT_EQ(parsed->id, (*reader)->segment_id());
  EXPECT_EQ((*reader)->header().version, 2u);
  // Created with the spec's mode, owned by us, in the directory only.
  struct stat st;
  ASSERT_EQ(::fstatat(dir.dir().fd(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW), 0);
  EXPECT_EQ(st.st_mode & 07777, 0640u);
  EXPECT_EQ(st.st_uid, ::geteuid());
}

TEST(SegmentTest, TheWriterPassesOutAReadOnlyDescriptorOfTheSameFile) {
  ScratchSegmentDirectory dir;
  auto writer = SegmentWriter::Create(TwoTensorSpec(dir.dir()));
  ASSERT_TRUE(writer.ok()) << writer.status().ToString();
  UniqueFd fd = (*writer)->TakeReadOnlyFd();
  ASSERT_TRUE(fd.valid());
  EXPECT_EQ(::fcntl(fd.get(), F_GETFL) & O_ACCMODE, O_RDONLY);
  struct stat a, b;
  ASSERT_EQ(::fstat(fd.get(), &a), 0);
  ASSERT_EQ(::fstatat(dir.dir().fd(), (*writer)->file_name().c_str(), &b, 0), 0);
  EXPECT_EQ(a.st_ino, b.st_ino);
  EXPECT_FALSE((*writer)->TakeReadOnlyFd().valid()) << "taken once";
}

TEST(SegmentTest, UnpublishedSegmentIsInvisibleAndRemoved) {
  ScratchSegmentDirectory dir;
  {
    auto writer = SegmentWriter::Create(TwoTensorSpec(dir.dir()));
    ASSERT_TRUE(writer.ok());
    auto reader = OpenSegmentReader(dir.dir(), (*writer)->file_name());
    EXPECT_EQ(reader.status().code(), StatusCode::kFailedPrecondition) << reader.status().ToString();
  }
  EXPECT_TRUE(dir.List().empty());
}

TEST(SegmentTest, NamesAreFreshEachTimeAndBadSpecsAreRefused) {
  ScratchSegmentDirectory dir;
  const std::string a = WriteDemo(dir.dir());
  const std::string b = WriteDemo(dir.dir());  // same name and generation: another file
  EXPECT_NE(a, b);
  EXPECT_EQ(dir.List().size(), 2u);
  auto spec = TwoTensorSpec(dir.dir());
  spec.tensors[0].nbytes = 59;
  EXPECT_EQ(SegmentWriter::Create(spec).status().code(), StatusCode::kInvalidArgument);
  spec = TwoTensorSpec(dir.dir());
  spec.directory = nullptr;
  EXPECT_EQ(SegmentWriter::Create(spec).status().code(), StatusCode::kInvalidArgument);
  spec = TwoTensorSpec(dir.dir());
  spec.generation = 0;
  EXPECT_EQ(SegmentWriter::Create(spec).status().code(), StatusCode::kInvalidArgument);
  for (const char* bad : {"a/b", "..", "."}) {
    spec = TwoTensorSpec(dir.dir());
    spec.checkpoint_name = bad;
    EXPECT_EQ(SegmentWriter::Create(spec).status().code(), StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_EQ(dir.List().size(), 2u);
}

TEST(SegmentTest, TooLargeForShmIsResourceExhausted) {
  ScratchSegmentDirectory dir;
  SegmentSpec spec = TwoTensorSpec(dir.dir());
  spec.tensors[0] = {"w", DType::kU8, {int64_t{1} << 50}, uint64_t{1} << 50, 0};
  auto writer = SegmentWriter::Create(spec);
  EXPECT_EQ(writer.status().code(), StatusCode::kResourceExhausted) << writer.status().ToString();
  EXPECT_TRUE(dir.List().empty());
}

TEST(SegmentTest, CorruptImagesAreRefusedWithoutCrashing) {
  ScratchSegmentDirectory dir;
  const std::string name = WriteDemo(dir.dir());
  const std::string pristine = testing::ReadFile(dir.dir().PathOf(name));
  ASSERT_FALSE(pristine.empty());

  auto check = [&](std::string image) {
    return SegmentReader::FromImage(nullptr, reinterpret_cast<const std::byte*>(image.data()), image.size()).status();
  };
  EXPECT_TRUE(check(pristine).ok());
  std::string bad = pristine;
  bad[0] = 'X';
  EXPECT_EQ(check(bad).code(), StatusCode::kCorrupt);
  bad = pristine;
  reinterpret_cast<SegmentHeader*>(bad.data())->tensor_count = 1ull << 40;
  EXPECT_EQ(check(bad).code(), StatusCode::kCorrupt);
  bad = pristine;
  bad[kHeaderBytes + 8 * 4] ^= 1;  // a shape byte of entry 0: index checksum mismatch
  EXPECT_EQ(check(bad).code(), StatusCode::kCorrupt);
  bad = pristine;
  reinterpret_cast<SegmentHeader*>(bad.data())->version = 1;  // before segment ids
  EXPECT_EQ(check(bad).code(), StatusCode::kUnsupported);
  EXPECT_EQ(check(pristine.substr(0, 100)).code(), StatusCode::kCorrupt);

  // Random corruption of the header and index: always an error or a valid reader.
  std::mt19937_64 rng(42);
  const size_t meta_bytes = kHeaderBytes + 2 * sizeof(TensorEntry) + 2;
  for (int i = 0; i < 3000; ++i) {
    std::string img = pristine;
    for (int f = 0; f < 1 + static_cast<int>(rng() % 4); ++f) img[rng() % meta_bytes] = static_cast<char>(rng());
    Status st = check(img);
    if (st.ok()) continue;
    EXPECT_FALSE(st.message().empty());
  }
}

TEST(SegmentNameTest, RoundTripsAndRefusesAnythingElse) {
  SegmentName n{"my.model-v2", 42, {}};
  for (size_t i = 0; i < n.id.size(); ++i) n.id[i] = static_cast<uint8_t>(i * 17);
  const std::string s = n.ToString();
  EXPECT_EQ(s, "my.model-v2.42.00112233445566778899aabbccddeeff");
  auto p = SegmentName::Parse(s);
  ASSERT_TRUE(p);
  EXPECT_EQ(p->checkpoint, "my.model-v2");
  EXPECT_EQ(p->generation, 42u);
  EXPECT_EQ(p->id, n.id);
  for (const char* bad : {"", "m.1", "m.1.00112233445566778899aabbccddeef", "m.1.00112233445566778899AABBCCDDEEFF",
                          "m.01.00112233445566778899aabbccddeeff", "m.0.00112233445566778899aabbccddeeff",
                          ".1.00112233445566778899aabbccddeeff", "m.x.00112233445566778899aabbccddeeff",
                          "m.99999999999999999999.00112233445566778899aabbccddeeff",
                          "a/m.1.00112233445566778899aabbccddeeff", "m.1.00112233445566778899aabbccddeeff0"}) {
    EXPECT_FALSE(SegmentName::Parse(bad)) << bad;
  }
  auto a = RandomSegmentId(), b = RandomSegmentId();
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(*a, *b);
}

}  // namespace
}  // namespace ckpt::shm
