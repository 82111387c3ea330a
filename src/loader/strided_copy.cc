#include "loader/strided_copy.h"

#include <cstring>
#include <memory>

#include "common/io.h"

namespace ckpt::loader {

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
      for (int64_t i = 0; i < inner; ++i) {
        std::memcpy(dst, from + static_cast<size_t>(i * inner_stride) * elem_size, elem_size);
        dst += elem_size;
      }
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

Status ReadStridedTensor(int fd, const std::string& path, const format::PlannedTensor& t, std::byte* dst) {
  const size_t es = DTypeSize(t.dtype);
  if (t.strides.size() != t.shape.size() || es == 0) return InvalidArgument("tensor '" + t.name + "': bad strides");
  if (t.nbytes == 0) return Status::Ok();
  unsigned __int128 last = 0;
  for (size_t d = 0; d < t.shape.size(); ++d) {
    if (t.shape[d] <= 0 || t.strides[d] < 0) return InvalidArgument("tensor '" + t.name + "': bad view");
    last += static_cast<unsigned __int128>(t.shape[d] - 1) * static_cast<uint64_t>(t.strides[d]);
  }
  if ((last + 1) * es > t.source_bytes) {
    return InvalidArgument("tensor '" + t.name + "': view reaches beyond its source bytes");
  }
  std::unique_ptr<std::byte[]> buf(new (std::nothrow) std::byte[t.source_bytes]);
  if (!buf) return ResourceExhausted("tensor '" + t.name + "': no memory to gather a strided view");
  CKPT_RETURN_IF_ERROR(PreadFull(fd, buf.get(), t.source_bytes, t.file_offset, path));
  StridedCopy(buf.get(), dst, t.shape, t.strides, es);
  return Status::Ok();
}

}  // namespace ckpt::loader
