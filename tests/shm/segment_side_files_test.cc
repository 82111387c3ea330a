// The side-file section: written by SegmentWriter, read back byte for byte by
// SegmentReader, covered by the index checksum and by each file's own checksum, so a
// corrupted side file (or metadata) is found at validation; layouts that overflow 64 bits
// are refused instead of wrapping.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <limits>
#include <vector>

#include "shm/segment_format.h"
#include "shm/segment_reader.h"
#include "shm/segment_writer.h"
#include "support/test_env.h"

namespace ckpt::shm {
namespace {

using testing::OpenSegmentReader;
using testing::ScratchSegmentDirectory;

SegmentSpec SideSpec(const SegmentDirectory& dir) {
  SegmentSpec spec;
  spec.directory = &dir;
  spec.checkpoint_name = "demo";
  spec.generation = 1;
  spec.tensors.push_back({"w", DType::kU8, {3}, 3, 0});
  std::string binary(300, '\0');
  for (size_t i = 0; i < binary.size(); ++i) binary[i] = static_cast<char>(i * 7);
  spec.side_files = {{"config.json", "{\"model_type\": \"llama\"}"}, {"generation_config.json", binary},
                     {"empty.json", ""}};
  spec.metadata = {{"format", "pt"}, {"note", "caf\xc3\xa9"}};
  return spec;
}

// A private copy of the published segment's bytes.
std::vector<std::byte> Image(const SegmentDirectory& dir, const std::string& name) {
  auto reader = OpenSegmentReader(dir, name);
  EXPECT_TRUE(reader.ok()) << reader.status().ToString();
  const std::byte* base = (*reader)->tensor_data(0) - (*reader)->header().data_offset;
  return std::vector<std::byte>(base, base + (*reader)->segment_bytes());
}

TEST(SegmentSideFilesTest, RoundTripAndCorruptionIsFound) {
  ScratchSegmentDirectory dir;
  const SegmentSpec spec = SideSpec(dir.dir());
  std::string name;
  {
    auto writer = SegmentWriter::Create(spec);
    ASSERT_TRUE(writer.ok()) << writer.status().ToString();
    std::memcpy((*writer)->tensor_data(0), "abc", 3);
    ASSERT_TRUE((*writer)->Publish({Checksum("abc", 3)}, 1).ok());
    name = (*writer)->file_name();
  }
  auto reader = OpenSegmentReader(dir.dir(), name);
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  EXPECT_EQ((*reader)->side_file_names(), (std::vector<std::string>{"config.json", "generation_config.json", "empty.json"}));
  for (const auto& [file, bytes] : spec.side_files) {
    auto got = (*reader)->SideFile(file);
    ASSERT_TRUE(got.ok()) << file;
    EXPECT_EQ(std::string(*got), bytes) << file;
  }
  EXPECT_EQ((*reader)->SideFile("missing").status().code(), StatusCode::kNotFound);
  EXPECT_EQ((*reader)->metadata(), spec.metadata);
  const SegmentHeader h = (*reader)->header();
  EXPECT_EQ(h.side_count, 4u);
  EXPECT_GE(h.side_offset, h.strings_offset + h.strings_bytes);
  EXPECT_LE(h.side_offset + h.side_bytes, h.data_offset);

  std::vector<std::byte> image = Image(dir.dir(), name);
  auto validate = [](std::vector<std::byte> img) {
    return SegmentReader::FromImage(nullptr, img.data(), img.size()).status();
  };
  ASSERT_TRUE(validate(image).ok());
  // The bytes of config.json: one flipped byte breaks the index checksum.
  SideFileEntry e;
  std::memcpy(&e, image.data() + h.side_offset, sizeof(e));
  std::vector<std::byte> flipped = image;
  flipped[e.data_offset] ^= std::byte{1};
  Status st = validate(flipped);
  EXPECT_EQ(st.code(), StatusCode::kCorrupt);
  EXPECT_NE(st.message().find("index checksum"), std::string::npos) << st.ToString();
  // Flipped and the index checksum recomputed (a forger who knows XXH3): the file's own
  // checksum still catches it.
  auto* fh = reinterpret_cast<SegmentHeader*>(flipped.data());
  fh->index_checksum = Checksum(flipped.data() + fh->index_offset, IndexChecksumEnd(*fh) - fh->index_offset);
  st = validate(flipped);
  EXPECT_EQ(st.code(), StatusCode::kCorrupt);
  EXPECT_NE(st.message().find("checksum mismatch in side file 'config.json'"), std::string::npos) << st.ToString();
  // An entry pointing outside the section, with a consistent index checksum.
  std::vector<std::byte> outside = image;
  auto* oh = reinterpret_cast<SegmentHeader*>(outside.data());
  SideFileEntry bad = e;
  bad.data_offset = oh->data_offset;
  std::memcpy(outside.data() + oh->side_offset, &bad, sizeof(bad));
  oh->index_checksum = Checksum(outside.data() + oh->index_offset, IndexChecksumEnd(*oh) - oh->index_offset);
  st = validate(outside);
  EXPECT_EQ(st.code(), StatusCode::kCorrupt);
  EXPECT_NE(st.message().find("out of range"), std::string::npos) << st.ToString();
  // A section that claims to run into the tensor data.
  std::vector<std::byte> long_section = image;
  reinterpret_cast<SegmentHeader*>(long_section.data())->side_bytes = h.data_offset;
  EXPECT_EQ(validate(long_section).code(), StatusCode::kCorrupt);
  ASSERT_TRUE(dir.dir().Remove(name).ok());
}

TEST(SegmentSideFilesTest, LayoutsThatOverflowAreRefusedNotWrapped) {
  // Sixteen 2^60-byte tensors: each is fine, the cursor wraps to where it started.
  ScratchSegmentDirectory dir;
  SegmentSpec spec;
  spec.directory = &dir.dir();
  spec.generation = 1;
  spec.checkpoint_name = "wrap";
  for (int i = 0; i < 16; ++i) {
    spec.tensors.push_back({"t" + std::to_string(i), DType::kU8, {int64_t{1} << 60}, uint64_t{1} << 60, 0});
  }
  auto writer = SegmentWriter::Create(spec);
  EXPECT_EQ(writer.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(writer.status().message().find("overflows 64 bits"), std::string::npos) << writer.status().ToString();
  // A shape whose element count overflows.
  SegmentSpec shape;
  shape.directory = &dir.dir();
  shape.generation = 1;
  shape.checkpoint_name = "shape";
  shape.tensors.push_back({"t", DType::kU8, {int64_t{1} << 40, int64_t{1} << 40}, 0, 0});
  EXPECT_EQ(SegmentWriter::Create(shape).status().code(), StatusCode::kInvalidArgument);
  // Side files: a reserved or repeated name.
  SegmentSpec sides = SideSpec(dir.dir());
  sides.side_files.push_back({"config.json", "again"});
  EXPECT_EQ(SegmentWriter::Create(sides).status().code(), StatusCode::kInvalidArgument);
  sides.side_files.pop_back();
  sides.side_files.push_back({kMetadataName, "{}"});
  EXPECT_EQ(SegmentWriter::Create(sides).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ckpt::shm
