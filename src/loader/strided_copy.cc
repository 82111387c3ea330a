#include "loader/strided_copy.h"

#include <algorithm>
#include <cstring>
#include <memory>

#include "common/io.h"

namespace ckpt::loader {
namespace {

// One strided row of `n` elements of ES bytes (a constant, so each copy is one move).
template <size_t ES>
void GatherRow(const std::byte* from, int64_t stride, int64_t n, std::byte* dst) {
  for (int64_t i = 0; i < n; ++i) std::memcpy(dst + i * ES, from + i * stride * static_cast<int64_t>(ES), ES);
}

void GatherRowAny(const std::byte* from, int64_t stride, int64_t n, std::byte* dst, size_t es) {
  switch (es) {
    case 1: return GatherRow<1>(from, stride, n, dst);
    case 2: return GatherRow<2>(from, stride, n, dst);
    case 4: return GatherRow<4>(from, stride, n, dst);
    case 8: return GatherRow<8>(from, stride, n, dst);
    case 16: return GatherRow<16>(from, stride, n, dst);
    default:
      for (int64_t i = 0; i < n; ++i) std::memcpy(dst + i * es, from + static_cast<size_t>(i * stride) * es, es);
  }
}

// A 2-D view with unit stride on its outer dimension (a transpose: dst[r][c] =
// src[r * row_stride + c * col_stride]), copied in square tiles so that both the reads and
// the writes stay in cache.
template <size_t ES>
void TransposeTiles(const std::byte* src, std::byte* dst, int64_t rows, int64_t cols, int64_t row_stride,
                    int64_t col_stride) {
  constexpr int64_t kTile = 64;
  for (int64_t r0 = 0; r0 < rows; r0 += kTile) {
    const int64_t r1 = std::min(rows, r0 + kTile);
    for (int64_t c0 = 0; c0 < cols; c0 += kTile) {
      const int64_t c1 = std::min(cols, c0 + kTile);
      for (int64_t r = r0; r < r1; ++r) {
        for (int64_t c = c0; c < c1; ++c) {
          std::memcpy(dst + (r * cols + c) * static_cast<int64_t>(ES),
                      src + (r * row_stride + c * col_stride) * static_cast<int64_t>(ES), ES);
        }
      }
    }
  }
}

bool TryTranspose(const std::byte* src, std::byte* dst, int64_t rows, int64_t cols, int64_t rs, int64_t cs, size_t es) {
  switch (es) {
    case 1: TransposeTiles<1>(src, dst, rows, cols, rs, cs); return true;
    case 2: TransposeTiles<2>(src, dst, rows, cols, rs, cs); return true;
    case 4: TransposeTiles<4>(src, dst, rows, cols, rs, cs); return true;
    case 8: TransposeTiles<8>(src, dst, rows, cols, rs, cs); return true;
    case 16: TransposeTiles<16>(src, dst, rows, cols, rs, cs); return true;
    default: return false;
  }
}

}  // namespace

void StridedCopy(const std::byte* src, std::byte* dst, const std::vector<int64_t>& shape,
                 const std::vector<int64_t>& strides, size_t elem_size) {
  const size_t ndim = shape.size();
  for (int64_t s : shape) {
    if (s == 0) return;
  }
  if (ndim == 0) {
    std::memcpy(dst, src, elem_size);
    return;
  }
  // A 2-D view whose rows are not contiguous but whose columns are (a transpose): tiles.
  if (ndim == 2 && strides[1] != 1 && strides[0] == 1 && shape[0] > 1 &&
      TryTranspose(src, dst, shape[0], shape[1], strides[0], strides[1], elem_size)) {
    return;
  }
  // The innermost dimension is copied in one run when it is contiguous, else per element.
  const int64_t inner = shape[ndim - 1];
  const int64_t inner_stride = strides[ndim - 1];
  const size_t run_bytes = static_cast<size_t>(inner) * elem_size;
  std::vector<int64_t> index(ndim, 0);
  while (true) {
    int64_t base = 0;
    for (size_t d = 0; d + 1 < ndim; ++d) base += index[d] * strides[d];
    const std::byte* from = src + static_cast<size_t>(base) * elem_size;
    if (inner_stride == 1) {
      std::memcpy(dst, from, run_bytes);
      dst += run_bytes;
    } else {
      GatherRowAny(from, inner_stride, inner, dst, elem_size);
      dst += run_bytes;
    }
    // Next index over the outer dimensions, last fastest.
    size_t d = ndim - 1;
    while (d > 0) {
      --d;
      if (++index[d] < shape[d]) break;
      index[d] = 0;
      if (d == 0) return;
    }
    if (ndim == 1) return;
  }
}

Status ReadStridedTensor(int fd, const std::string& path, const format::PlannedTensor& t, std::byte* dst,
                         uint64_t window_bytes) {
  const uint64_t es = DTypeSize(t.dtype);
  if (t.strides.empty() || t.strides.size() != t.shape.size() || es == 0) {
    return InvalidArgument("tensor '" + t.name + "': bad strides");
  }
  if (t.nbytes == 0) return Status::Ok();
  unsigned __int128 last = 0;
  for (size_t d = 0; d < t.shape.size(); ++d) {
    if (t.shape[d] <= 0 || t.strides[d] < 0) return InvalidArgument("tensor '" + t.name + "': bad view");
    last += static_cast<unsigned __int128>(t.shape[d] - 1) * static_cast<uint64_t>(t.strides[d]);
  }
  if ((last + 1) * es > t.source_bytes) {
    return InvalidArgument("tensor '" + t.name + "': view reaches beyond its source bytes");
  }
  // Windows of whole rows of dim 0, each reading at most about window_bytes of source
  // (at least one row), so a narrow view of a large storage needs little memory.
  const uint64_t rows = static_cast<uint64_t>(t.shape[0]);
  const uint64_t row_stride = static_cast<uint64_t>(t.strides[0]);
  const uint64_t row_span = static_cast<uint64_t>(last) - (rows - 1) * row_stride + 1;  // elements of one row
  const uint64_t row_out = t.nbytes / rows;
  uint64_t per = rows;
  if (row_stride > 0) {
    const uint64_t budget = window_bytes / es;
    per = budget > row_span ? std::min<uint64_t>(rows, (budget - row_span) / row_stride + 1) : 1;
  }
  const uint64_t buf_bytes = ((per - 1) * row_stride + row_span) * es;
  std::unique_ptr<std::byte[]> buf(new (std::nothrow) std::byte[buf_bytes]);
  if (!buf) return ResourceExhausted("tensor '" + t.name + "': no memory to gather a strided view");
  std::vector<int64_t> shape = t.shape;
  for (uint64_t r0 = 0; r0 < rows; r0 += per) {
    const uint64_t n = std::min(per, rows - r0);
    const uint64_t bytes = ((n - 1) * row_stride + row_span) * es;
    CKPT_RETURN_IF_ERROR(PreadFull(fd, buf.get(), bytes, t.file_offset + r0 * row_stride * es, path));
    shape[0] = static_cast<int64_t>(n);
    StridedCopy(buf.get(), dst + r0 * row_out, shape, t.strides, es);
  }
  return Status::Ok();
}

}  // namespace ckpt::loader
