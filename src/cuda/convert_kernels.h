// GPU kernels of the copy engine: dtype conversion of packed rows into a strided
// destination, and tiled transposes (with conversion). Launch errors are returned.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "ckpt/dtype.h"
#include "ckpt/status.h"

namespace ckpt::cuda {

// True if the engine can convert `from` to `to` (identity, or among F64/F32/F16/BF16).
bool CanConvert(DType from, DType to);

// For i < rows, j < row_elems: dst[(dst_first + i * dst_pitch_elems + j)] =
// convert(src[i * row_elems + j]). `overflow` (device int) is set to `tag` if a finite
// value became infinite.
Status LaunchConvertRows(DType from, DType to, const void* src, uint64_t row_elems, uint64_t rows,
                         void* dst, uint64_t dst_first, uint64_t dst_pitch_elems, int* overflow,
                         int tag, cudaStream_t stream);

// src is [rows, cols] (dense); dst is [cols, dst_ld] with dst[c * dst_ld + col0 + r] =
// convert(src[r * cols + c]).
Status LaunchTranspose(DType from, DType to, const void* src, uint64_t rows, uint64_t cols,
                       void* dst, uint64_t dst_ld, uint64_t col0, int* overflow, int tag,
                       cudaStream_t stream);

}  // namespace ckpt::cuda
