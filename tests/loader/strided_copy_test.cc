#include "loader/strided_copy.h"

#include <gtest/gtest.h>

#include <cstring>
#include <numeric>

#include "ckpt/tensor.h"
#include "common/io.h"
#include "support/test_env.h"

namespace ckpt::loader {
namespace {

TEST(StridedCopyTest, TransposeSliceAndBroadcast) {
  std::vector<int32_t> src(24);
  std::iota(src.begin(), src.end(), 0);  // a 4x6 row-major matrix
  auto run = [&](size_t first, std::vector<int64_t> shape, std::vector<int64_t> strides) {
    size_t n = 1;
    for (auto s : shape) n *= static_cast<size_t>(s);
    std::vector<int32_t> dst(n, -1);
    StridedCopy(reinterpret_cast<const std::byte*>(src.data() + first), reinterpret_cast<std::byte*>(dst.data()),
                shape, strides, sizeof(int32_t));
    return dst;
  };
  EXPECT_EQ(run(0, {6, 4}, {1, 6}), (std::vector<int32_t>{0, 6, 12, 18, 1, 7, 13, 19, 2, 8, 14, 20,
                                                           3, 9, 15, 21, 4, 10, 16, 22, 5, 11, 17, 23}));
  EXPECT_EQ(run(1, {4, 2}, {6, 1}), (std::vector<int32_t>{1, 2, 7, 8, 13, 14, 19, 20}));
  EXPECT_EQ(run(0, {2, 3}, {12, 2}), (std::vector<int32_t>{0, 2, 4, 12, 14, 16}));
  EXPECT_EQ(run(2, {3, 2}, {0, 1}), (std::vector<int32_t>{2, 3, 2, 3, 2, 3}));
  EXPECT_EQ(run(5, {}, {}), (std::vector<int32_t>{5}));
  EXPECT_EQ(run(0, {2, 2, 2}, {12, 1, 6}), (std::vector<int32_t>{0, 6, 1, 7, 12, 18, 13, 19}));
  EXPECT_EQ(run(0, {3, 0}, {1, 1}), (std::vector<int32_t>{}));
}

TEST(StridedCopyTest, LargeTransposesAcrossTilesForEveryElementSize) {
  const int64_t rows = 130, cols = 70;  // view of a cols x rows row-major source, transposed
  for (size_t es : {1, 2, 4, 8, 16, 3}) {
    std::vector<std::byte> src(static_cast<size_t>(rows * cols) * es);
    for (size_t i = 0; i < src.size(); ++i) src[i] = std::byte(i * 7 + i / 251);
    std::vector<std::byte> dst(src.size());
    StridedCopy(src.data(), dst.data(), {rows, cols}, {1, rows}, es);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        ASSERT_EQ(std::memcmp(&dst[(r * cols + c) * es], &src[(c * rows + r) * es], es), 0) << es << " " << r << "," << c;
      }
    }
  }
}

TEST(StridedCopyTest, ReadStridedInWindowsOfRows) {
  // A 40 x 10 int32 matrix in a file after a 12-byte prefix; views of it read in small windows.
  testing::ScratchDir dir;
  std::vector<int32_t> m(400);
  std::iota(m.begin(), m.end(), 0);
  std::string bytes(12, 'p');
  bytes.append(reinterpret_cast<const char*>(m.data()), m.size() * 4);
  testing::WriteFile(dir.File("m"), bytes);
  auto fd = OpenForRead(dir.File("m"));
  ASSERT_TRUE(fd.ok());
  struct View {
    int64_t first;
    std::vector<int64_t> shape, strides;
  };
  for (const View& v : {View{3, {40, 2}, {10, 1}}, View{0, {10, 40}, {1, 10}}, View{5, {20, 3}, {20, 2}},
                        View{7, {5, 4}, {0, 1}}}) {
    format::PlannedTensor t;
    t.name = "v";
    t.dtype = DType::kI32;
    t.shape = v.shape;
    t.strides = v.strides;
    t.file_offset = 12 + 4 * static_cast<uint64_t>(v.first);
    t.nbytes = 4 * NumElements(v.shape);
    t.source_bytes = 4 * (400 - static_cast<uint64_t>(v.first));
    std::vector<int32_t> want(NumElements(v.shape));
    StridedCopy(reinterpret_cast<const std::byte*>(m.data() + v.first), reinterpret_cast<std::byte*>(want.data()),
                v.shape, v.strides, 4);
    for (uint64_t window : {uint64_t{1}, uint64_t{64}, uint64_t{1000}, uint64_t{1} << 20}) {
      std::vector<int32_t> got(want.size(), -1);
      Status st = ReadStridedTensor(fd->get(), "m", t, reinterpret_cast<std::byte*>(got.data()), window);
      ASSERT_TRUE(st.ok()) << st.ToString();
      EXPECT_EQ(got, want) << "window " << window << " first " << v.first;
    }
  }
}

TEST(StridedCopyTest, ReadStridedRefusesAViewBeyondItsSource) {
  format::PlannedTensor t;
  t.name = "w";
  t.dtype = DType::kF32;
  t.shape = {4, 4};
  t.strides = {1, 4};
  t.nbytes = 64;
  t.source_bytes = 60;  // one element short
  std::vector<std::byte> dst(64);
  Status st = ReadStridedTensor(-1, "x", t, dst.data());
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
}

}  // namespace
}  // namespace ckpt::loader
