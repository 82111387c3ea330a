// Tied weights: two index entries that share one data offset.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>

#include "shm/segment_reader.h"
#include "shm/segment_writer.h"
#include "support/test_env.h"

namespace ckpt::shm {
namespace {

TEST(SegmentAliasTest, TwoNamesShareOneCopyAndTheReaderAcceptsIt) {
  testing::ScratchSegmentDirectory dir;
  SegmentSpec spec;
  spec.directory = &dir.dir();
  spec.generation = 1;
  spec.checkpoint_name = "tied";
  spec.tensors.push_back({"embed.weight", DType::kF32, {4, 2}, 32, 0});
  spec.tensors.push_back({"norm", DType::kU8, {3}, 3, 0});
  spec.tensors.push_back({"lm_head.weight", DType::kF32, {4, 2}, 32, 0});
  spec.alias_of = {-1, -1, 0};
  auto writer = SegmentWriter::Create(spec);
  ASSERT_TRUE(writer.ok()) << writer.status().ToString();
  EXPECT_EQ((*writer)->tensor_data(0), (*writer)->tensor_data(2));
  for (int i = 0; i < 32; ++i) (*writer)->tensor_data(0)[i] = std::byte(i);
  std::memcpy((*writer)->tensor_data(1), "abc", 3);
  const uint64_t sum = Checksum((*writer)->tensor_data(0), 32);
  ASSERT_TRUE((*writer)->Publish({sum, Checksum("abc", 3), sum}, 1).ok());

  auto reader = testing::OpenSegmentReader(dir.dir(), (*writer)->file_name());
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  const int64_t a = (*reader)->Find("embed.weight"), b = (*reader)->Find("lm_head.weight");
  ASSERT_GE(a, 0);
  ASSERT_GE(b, 0);
  EXPECT_EQ((*reader)->tensor_data(a), (*reader)->tensor_data(b));
  EXPECT_TRUE((*reader)->VerifyChecksums().ok());
}

TEST(SegmentAliasTest, BadAliasesRefused) {
  testing::ScratchSegmentDirectory dir;
  SegmentSpec spec;
  spec.directory = &dir.dir();
  spec.generation = 1;
  spec.checkpoint_name = "tied";
  spec.tensors.push_back({"a", DType::kF32, {4}, 16, 0});
  spec.tensors.push_back({"b", DType::kF32, {2}, 8, 0});
  for (std::vector<int64_t> alias : {std::vector<int64_t>{-1, 0}, {1, -1}, {-1, 1}, {-1}}) {
    spec.alias_of = alias;
    auto writer = SegmentWriter::Create(spec);
    EXPECT_EQ(writer.status().code(), StatusCode::kInvalidArgument);
  }
}

}  // namespace
}  // namespace ckpt::shm
