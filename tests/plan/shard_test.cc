#include "ckpt/shard.h"

#include <gtest/gtest.h>

#include <numeric>

namespace ckpt {
namespace {

// A [rows, cols] int32 tensor holding 0, 1, 2, ... and a helper to gather shards of it.
struct Matrix {
  std::vector<int64_t> shape;
  std::vector<int32_t> values;
  explicit Matrix(std::vector<int64_t> s) : shape(std::move(s)) {
    int64_t n = 1;
    for (auto d : shape) n *= d;
    values.resize(n);
    std::iota(values.begin(), values.end(), 0);
  }
  std::vector<int32_t> Shard(const ShardSpec& spec, ShardLayout* layout_out = nullptr) const {
    auto layout = PlanShard(DType::kI32, shape, spec);
    EXPECT_TRUE(layout.ok()) << layout.status().ToString();
    std::vector<int32_t> out(layout->nbytes / 4, -7);  // garbage: every byte must be written
    EXPECT_TRUE(GatherShard(*layout, values.data(), out.data(), layout->nbytes).ok());
    if (layout_out) *layout_out = *layout;
    return out;
  }
};

TEST(ShardTest, ReplicateIsTheWholeTensor) {
  Matrix m({2, 3});
  ShardLayout layout;
  EXPECT_EQ(m.Shard(ShardSpec::Replicate(), &layout), m.values);
  EXPECT_TRUE(layout.contiguous());
  EXPECT_EQ(layout.shape, m.shape);
}

TEST(ShardTest, RowSplitIsContiguous) {
  Matrix m({4, 3});
  ShardLayout layout;
  EXPECT_EQ(m.Shard(ShardSpec::Split(0, 1, 2), &layout), (std::vector<int32_t>{6, 7, 8, 9, 10, 11}));
  EXPECT_TRUE(layout.contiguous());
  EXPECT_EQ(layout.regions[0].src_offset, 24u);
  EXPECT_EQ(layout.shape, (std::vector<int64_t>{2, 3}));
}

TEST(ShardTest, ColumnSplitIsStrided) {
  Matrix m({2, 4});  // [[0 1 2 3] [4 5 6 7]]
  ShardLayout layout;
  EXPECT_EQ(m.Shard(ShardSpec::Split(1, 1, 2), &layout), (std::vector<int32_t>{2, 3, 6, 7}));
  EXPECT_FALSE(layout.contiguous());
  ASSERT_EQ(layout.regions.size(), 1u);
  EXPECT_EQ(layout.regions[0].rows, 2u);
  EXPECT_EQ(layout.regions[0].row_bytes, 8u);
  EXPECT_EQ(layout.regions[0].src_pitch, 16u);
  EXPECT_EQ(m.Shard(ShardSpec::Split(-1, 0, 2)), (std::vector<int32_t>{0, 1, 4, 5}));
}

TEST(ShardTest, FusedQkvTakesTheRankPartOfEachChunk) {
  Matrix m({12, 1});  // q = 0..3, k = 4..7, v = 8..11
  EXPECT_EQ(m.Shard(ShardSpec::Split(0, 0, 2, 3)), (std::vector<int32_t>{0, 1, 4, 5, 8, 9}));
  EXPECT_EQ(m.Shard(ShardSpec::Split(0, 1, 2, 3)), (std::vector<int32_t>{2, 3, 6, 7, 10, 11}));
  Matrix bias({6});
  EXPECT_EQ(bias.Shard(ShardSpec::Split(0, 1, 2, 3)), (std::vector<int32_t>{1, 3, 5}));
}

TEST(ShardTest, MiddleDimensionOfA3dTensor) {
  Matrix m({2, 4, 2});
  // dim 1 split in 2: rank 1 takes rows 2..3 of each of the 2 outer blocks.
  EXPECT_EQ(m.Shard(ShardSpec::Split(1, 1, 2)), (std::vector<int32_t>{4, 5, 6, 7, 12, 13, 14, 15}));
}

TEST(ShardTest, UnevenSplitsFollowTensorSplit) {
  Matrix m({5});
  EXPECT_EQ(PlanShard(DType::kI32, m.shape, ShardSpec::Split(0, 0, 2)).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(m.Shard(ShardSpec::Split(0, 0, 2, 1, true)), (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(m.Shard(ShardSpec::Split(0, 1, 2, 1, true)), (std::vector<int32_t>{3, 4}));
  Matrix small({2});
  EXPECT_TRUE(small.Shard(ShardSpec::Split(0, 3, 4, 1, true)).empty());
}

TEST(ShardTest, FlatPartitionsArePaddedLikeDeepSpeed) {
  Matrix m({2, 5});  // 10 elements over 4 ranks: 3 each, the last holds 1 and 2 zeros
  ShardLayout layout;
  EXPECT_EQ(m.Shard(ShardSpec::FlatPartition(0, 4), &layout), (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(layout.shape, (std::vector<int64_t>{3}));
  EXPECT_TRUE(layout.contiguous());
  EXPECT_EQ(m.Shard(ShardSpec::FlatPartition(3, 4), &layout), (std::vector<int32_t>{9, 0, 0}));
  EXPECT_EQ(layout.padding_bytes, 8u);
  EXPECT_FALSE(layout.contiguous());
  Matrix tiny({2});  // 2 elements over 4 ranks: ranks 2 and 3 hold only padding
  EXPECT_EQ(tiny.Shard(ShardSpec::FlatPartition(3, 4)), (std::vector<int32_t>{0}));
  EXPECT_EQ(PlanShard(DType::kI32, {4}, ShardSpec::FlatPartition(4, 4)).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(ShardTest, InvalidSpecsAreErrors) {
  std::vector<int64_t> shape = {4, 4};
  auto code = [&](ShardSpec s) { return PlanShard(DType::kF32, shape, s).status().code(); };
  EXPECT_EQ(code(ShardSpec::Split(0, 2, 2)), StatusCode::kInvalidArgument);
  EXPECT_EQ(code(ShardSpec::Split(0, -1, 2)), StatusCode::kInvalidArgument);
  EXPECT_EQ(code(ShardSpec::Split(0, 0, 0)), StatusCode::kInvalidArgument);
  EXPECT_EQ(code(ShardSpec::Split(2, 0, 2)), StatusCode::kInvalidArgument);
  EXPECT_EQ(code(ShardSpec::Split(-3, 0, 2)), StatusCode::kInvalidArgument);
  EXPECT_EQ(code(ShardSpec::Split(0, 0, 2, 3)), StatusCode::kInvalidArgument);
  EXPECT_EQ(code(ShardSpec::Split(0, 0, 2, 0)), StatusCode::kInvalidArgument);
  EXPECT_EQ(PlanShard(DType::kF32, {}, ShardSpec::Split(0, 0, 1)).status().code(), StatusCode::kInvalidArgument);
  auto layout = PlanShard(DType::kF32, shape, ShardSpec::Replicate());
  ASSERT_TRUE(layout.ok());
  float dst[3];
  EXPECT_EQ(GatherShard(*layout, dst, dst, sizeof(dst)).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ckpt
