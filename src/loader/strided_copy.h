// Gathering a strided tensor view (PyTorch's non-contiguous tensors) into row-major order.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "ckpt/status.h"
#include "format/load_plan.h"

namespace ckpt::loader {

// Copies the elements of the view (`shape`, `strides` in elements, both the same length,
// strides >= 0) of `src` into `dst` in row-major order. `src` points at the view's first
// element; the caller guarantees every element the view reaches lies in `src`, and that
// `dst` holds NumElements(shape) * elem_size bytes. Thread-safe (no shared state).
void StridedCopy(const std::byte* src, std::byte* dst, const std::vector<int64_t>& shape,
                 const std::vector<int64_t>& strides, size_t elem_size);

// Reads the source bytes of a strided planned tensor (within t.source_bytes at
// t.file_offset of `fd`) into a temporary buffer, in windows of whole rows of dim 0 of
// about `window_bytes` (at least one row), and gathers them into `dst` (t.nbytes).
// Errors: those of the read (Corrupt if the file is short), InvalidArgument if the plan's
// strides reach beyond source_bytes or do not match its shape, ResourceExhausted if the
// buffer cannot be allocated. Thread-safe.
Status ReadStridedTensor(int fd, const std::string& path, const format::PlannedTensor& t, std::byte* dst,
                         uint64_t window_bytes = 64ull << 20);

}  // namespace ckpt::loader
