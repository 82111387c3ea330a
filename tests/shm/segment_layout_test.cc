// PlanSegmentLayout alone: the byte layout of a segment, computed without any file.
#include "shm/segment_layout.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>

#include "shm/segment_writer.h"

namespace ckpt::shm {
namespace {

SegmentSpec TwoTensors() {
  SegmentSpec spec;  // no directory, name or generation: the layout does not need them
  spec.tensors.push_back({"a", DType::kF32, {3}, 12, 0});     // names: "a" "bb"
  spec.tensors.push_back({"bb", DType::kU8, {100}, 100, 0});
  return spec;
}

TEST(SegmentLayoutTest, HeaderIndexNamesThenAlignedDataRoundedToThePage) {
  auto layout = PlanSegmentLayout(TwoTensors(), 4096);
  ASSERT_TRUE(layout.ok()) << layout.status().ToString();
  EXPECT_EQ(layout->index_offset, kHeaderBytes);
  EXPECT_EQ(layout->strings_offset, kHeaderBytes + 2 * sizeof(TensorEntry));
  EXPECT_EQ(layout->strings_bytes, 3u);
  EXPECT_EQ(layout->side_offset, 0u);
  EXPECT_EQ(layout->side_bytes, 0u);
  EXPECT_TRUE(layout->sides.empty());
  EXPECT_EQ(layout->data_offset, 8192u);  // header + index + names, 4096-aligned
  ASSERT_EQ(layout->tensor_offsets.size(), 2u);
  EXPECT_EQ(layout->tensor_offsets[0], 8192u);
  EXPECT_EQ(layout->tensor_offsets[1], 8192u + kDataAlignment);  // 12 bytes, then aligned
  EXPECT_EQ(layout->data_end, 8192u + 3 * kDataAlignment);  // the last tensor's end, aligned too
  EXPECT_EQ(layout->segment_bytes, 12288u);
  // a huge-page directory: the same offsets, the size a whole 2 MiB page
  auto huge = PlanSegmentLayout(TwoTensors(), 2u << 20);
  ASSERT_TRUE(huge.ok());
  EXPECT_EQ(huge->tensor_offsets, layout->tensor_offsets);
  EXPECT_EQ(huge->segment_bytes, 2u << 20);
}

TEST(SegmentLayoutTest, NoTensorsStillGetsAPageOfData) {
  auto layout = PlanSegmentLayout(SegmentSpec{}, 4096);
  ASSERT_TRUE(layout.ok()) << layout.status().ToString();
  EXPECT_EQ(layout->data_offset, 4096u);
  EXPECT_EQ(layout->data_end, 4096u);
  EXPECT_EQ(layout->segment_bytes, 8192u);  // strictly past data_offset
}

TEST(SegmentLayoutTest, SideFilesThenMetadataEachEightAligned) {
  SegmentSpec spec = TwoTensors();
  spec.side_files = {{"config.json", "{}"}, {"tok", "xyz"}};
  spec.metadata = {{"format", "pt"}};
  auto layout = PlanSegmentLayout(spec, 4096);
  ASSERT_TRUE(layout.ok()) << layout.status().ToString();
  const uint64_t strings_end = layout->strings_offset + layout->strings_bytes;
  EXPECT_EQ(layout->side_offset, (strings_end + 7) / 8 * 8);
  ASSERT_EQ(layout->sides.size(), 3u);
  EXPECT_EQ(layout->sides[0].name, "config.json");
  EXPECT_EQ(layout->sides[0].kind, SideFileKind::kFile);
  EXPECT_EQ(layout->sides[2].name, kMetadataName);
  EXPECT_EQ(layout->sides[2].kind, SideFileKind::kMetadata);
  EXPECT_EQ(layout->sides[2].bytes, R"({"format":"pt"})");
  // entries, then the names back to back, then the bytes, each 8-aligned
  EXPECT_EQ(layout->sides[0].name_offset, 3 * sizeof(SideFileEntry));
  EXPECT_EQ(layout->sides[1].name_offset, 3 * sizeof(SideFileEntry) + 11);
  EXPECT_EQ(layout->sides[2].name_offset, 3 * sizeof(SideFileEntry) + 14);
  uint64_t prev_end = layout->side_offset + layout->sides[2].name_offset + layout->sides[2].name.size();
  for (const SideFilePlacement& side : layout->sides) {
    EXPECT_EQ(side.data_offset % 8, 0u);
    EXPECT_GE(side.data_offset, prev_end);
    EXPECT_LT(side.data_offset, prev_end + 8);
    prev_end = side.data_offset + side.bytes.size();
  }
  EXPECT_EQ(layout->side_offset + layout->side_bytes, prev_end);
  EXPECT_EQ(layout->data_offset, (prev_end + 4095) / 4096 * 4096);
}

TEST(SegmentLayoutTest, AnAliasSharesItsTargetsOffsetAndTakesNoBytes) {
  SegmentSpec spec = TwoTensors();
  spec.tensors.push_back({"tied", DType::kF32, {3}, 12, 0});
  spec.alias_of = {-1, -1, 0};
  auto layout = PlanSegmentLayout(spec, 4096);
  ASSERT_TRUE(layout.ok()) << layout.status().ToString();
  EXPECT_EQ(layout->tensor_offsets[2], layout->tensor_offsets[0]);
  EXPECT_EQ(layout->data_end, layout->tensor_offsets[1] + 2 * kDataAlignment);  // 100 bytes, aligned
}

TEST(SegmentLayoutTest, RefusesWhatCannotBeLaidOut) {
  auto refused = [](SegmentSpec spec) {
    auto layout = PlanSegmentLayout(spec, 4096);
    return !layout.ok() && layout.status().code() == StatusCode::kInvalidArgument;
  };
  SegmentSpec s = TwoTensors();
  s.tensors[0].nbytes = 13;  // not 3 x f32
  EXPECT_TRUE(refused(s));
  s = TwoTensors();
  s.tensors[1].name.clear();
  EXPECT_TRUE(refused(s));
  s = TwoTensors();
  s.tensors[1].shape = {-1};
  EXPECT_TRUE(refused(s));
  s = TwoTensors();
  s.side_files = {{"x", "1"}, {"x", "2"}};  // repeated
  EXPECT_TRUE(refused(s));
  s = TwoTensors();
  s.side_files = {{kMetadataName, "{}"}};  // reserved
  EXPECT_TRUE(refused(s));
  s = TwoTensors();
  s.alias_of = {-1};  // one entry for two tensors
  EXPECT_TRUE(refused(s));
  s = TwoTensors();
  s.alias_of = {1, -1};  // not an earlier tensor
  EXPECT_TRUE(refused(s));
  s = TwoTensors();
  s.tensors[0] = {"big", DType::kU8, {std::numeric_limits<int64_t>::max()},
                  static_cast<uint64_t>(std::numeric_limits<int64_t>::max()), 0};
  s.tensors[1] = {"big2", DType::kU8, {std::numeric_limits<int64_t>::max()},
                  static_cast<uint64_t>(std::numeric_limits<int64_t>::max()), 0};
  s.tensors.push_back(s.tensors[0]);
  s.tensors.back().name = "big3";
  EXPECT_TRUE(refused(s));  // the data's end overflows 64 bits
}

}  // namespace
}  // namespace ckpt::shm
