// The one checked element count of a shape.
#include "common/element_count.h"

#include <gtest/gtest.h>

#include "ckpt/tensor.h"

namespace ckpt {
namespace {

TEST(ElementCountTest, ProductOfTheDimensions) {
  EXPECT_EQ(*ElementCount({}), 1u) << "a scalar";
  EXPECT_EQ(*ElementCount({5}), 5u);
  EXPECT_EQ(*ElementCount({2, 3, 4}), 24u);
  EXPECT_EQ(*ElementCount({7, 0, 3}), 0u);
  EXPECT_EQ(*ElementCount({int64_t{1} << 31, int64_t{1} << 32}), uint64_t{1} << 63);
  EXPECT_EQ(*ElementCount({INT64_MAX, 2}), uint64_t{INT64_MAX} * 2) << "fits in 64 unsigned bits";
  EXPECT_EQ(NumElements({2, 3, 4}), 24u) << "the unchecked form agrees";
}

TEST(ElementCountTest, NegativeDimensionsAreRefusedNamingThem) {
  auto r = ElementCount({4, -3, 2});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(), "negative dimension -3 in dim 1");
  EXPECT_FALSE(ElementCount({0, -1}).ok()) << "a zero before does not hide it";
}

TEST(ElementCountTest, OverflowIsRefusedEvenWhenALaterDimensionIsZero) {
  for (const std::vector<int64_t>& shape : std::vector<std::vector<int64_t>>{
           {int64_t{1} << 32, int64_t{1} << 32}, {INT64_MAX, 3}, {int64_t{1} << 40, int64_t{1} << 40, 0}}) {
    auto r = ElementCount(shape);
    ASSERT_FALSE(r.ok()) << *r;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(r.status().message(), "element count overflows 64 bits");
  }
}

}  // namespace
}  // namespace ckpt
