#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <random>

#include "shm/segment_format.h"
#include "shm/segment_reader.h"
#include "shm/segment_writer.h"

namespace ckpt::shm {
namespace {

std::string UniqueName(const char* tag) {
  static int n = 0;
  return "ckpttest-seg-" + std::to_string(::getpid()) + "-" + tag + "-" + std::to_string(n++);
}

SegmentSpec TwoTensorSpec(const std::string& shm_name) {
  SegmentSpec spec;
  spec.shm_name = shm_name;
  spec.checkpoint_name = "demo";
  spec.source_path = "/models/demo.safetensors";
  spec.generation = 7;
  spec.tensors.push_back({"w", DType::kF32, {3, 5}, 60, 0});
  spec.tensors.push_back({"b", DType::kU8, {3}, 3, 0});
  return spec;
}

// Writes and publishes the two-tensor segment; returns its checksums.
std::vector<uint64_t> WriteDemo(const std::string& name) {
  auto writer = SegmentWriter::Create(TwoTensorSpec(name));
  EXPECT_TRUE(writer.ok()) << writer.status().ToString();
  for (int i = 0; i < 60; ++i) (*writer)->tensor_data(0)[i] = std::byte(i);
  std::memcpy((*writer)->tensor_data(1), "xyz", 3);
  std::vector<uint64_t> sums = {Checksum((*writer)->tensor_data(0), 60), Checksum("xyz", 3)};
  EXPECT_TRUE((*writer)->Publish(sums, 1234).ok());
  return sums;
}

TEST(SegmentTest, PublishedSegmentReadsBack) {
  const std::string name = UniqueName("rt");
  auto sums = WriteDemo(name);
  auto reader = SegmentReader::Open(name);
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
  EXPECT_TRUE(RemoveShmObject(name).ok());
}

TEST(SegmentTest, UnpublishedSegmentIsInvisibleAndRemoved) {
  const std::string name = UniqueName("partial");
  {
    auto writer = SegmentWriter::Create(TwoTensorSpec(name));
    ASSERT_TRUE(writer.ok());
    auto reader = SegmentReader::Open(name);
    EXPECT_EQ(reader.status().code(), StatusCode::kFailedPrecondition) << reader.status().ToString();
  }
  EXPECT_EQ(SegmentReader::Open(name).status().code(), StatusCode::kNotFound);
}

TEST(SegmentTest, CreateRefusesExistingNameAndBadSpecs) {
  const std::string name = UniqueName("dup");
  WriteDemo(name);
  EXPECT_EQ(SegmentWriter::Create(TwoTensorSpec(name)).status().code(), StatusCode::kAlreadyExists);
  auto spec = TwoTensorSpec(UniqueName("bad"));
  spec.tensors[0].nbytes = 59;
  EXPECT_EQ(SegmentWriter::Create(spec).status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(RemoveShmObject(name).ok());
}

TEST(SegmentTest, TooLargeForShmIsResourceExhausted) {
  SegmentSpec spec = TwoTensorSpec(UniqueName("huge"));
  spec.tensors[0] = {"w", DType::kU8, {int64_t{1} << 50}, uint64_t{1} << 50, 0};
  auto writer = SegmentWriter::Create(spec);
  EXPECT_EQ(writer.status().code(), StatusCode::kResourceExhausted) << writer.status().ToString();
  EXPECT_EQ(SegmentReader::Open(spec.shm_name).status().code(), StatusCode::kNotFound);
}

TEST(SegmentTest, CorruptImagesAreRefusedWithoutCrashing) {
  const std::string name = UniqueName("img");
  WriteDemo(name);
  auto mapping = ShmMapping::OpenReadOnly(name);
  ASSERT_TRUE(mapping.ok());
  const std::string pristine(reinterpret_cast<const char*>((*mapping)->data()), (*mapping)->size());
  ASSERT_TRUE(RemoveShmObject(name).ok());

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

}  // namespace
}  // namespace ckpt::shm
