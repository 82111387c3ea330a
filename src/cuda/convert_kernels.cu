#include "cuda/convert_kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <string>
#include <type_traits>

namespace ckpt::cuda {

namespace {

__device__ inline double ToDouble(double x) { return x; }
__device__ inline double ToDouble(float x) { return x; }
__device__ inline double ToDouble(__half x) { return __half2float(x); }
__device__ inline double ToDouble(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename D> __device__ inline D FromFloat(float x);
template <> __device__ inline float FromFloat<float>(float x) { return x; }
template <> __device__ inline double FromFloat<double>(float x) { return x; }
template <> __device__ inline __half FromFloat<__half>(float x) { return __float2half_rn(x); }
template <> __device__ inline __nv_bfloat16 FromFloat<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

template <typename S, typename D>
__device__ inline D Convert(S x, int* overflow, int tag) {
  if constexpr (std::is_same_v<S, D>) {
    return x;
  } else if constexpr (std::is_same_v<D, double>) {
    return ToDouble(x);
  } else if constexpr (std::is_same_v<S, double>) {
    float f = static_cast<float>(x);  // round to nearest
    D y = FromFloat<D>(f);
    if (isfinite(x) && isinf(ToDouble(y))) atomicCAS(overflow, 0, tag);
    return y;
  } else {
    float f = static_cast<float>(ToDouble(x));
    D y = FromFloat<D>(f);
    if (isfinite(f) && isinf(ToDouble(y))) atomicCAS(overflow, 0, tag);
    return y;
  }
}

template <typename S, typename D>
__global__ void ConvertRowsKernel(const S* src, uint64_t row_elems, uint64_t n, D* dst, uint64_t dst_first,
                                  uint64_t dst_pitch, int* overflow, int tag) {
  for (uint64_t k = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; k < n; k += uint64_t(gridDim.x) * blockDim.x) {
    uint64_t i = k / row_elems, j = k - i * row_elems;
    dst[dst_first + i * dst_pitch + j] = Convert<S, D>(src[k], overflow, tag);
  }
}

constexpr int kTile = 32;

template <typename S, typename D>
__global__ void TransposeKernel(const S* src, uint64_t rows, uint64_t cols, D* dst, uint64_t dst_ld,
                                uint64_t col0, int* overflow, int tag) {
  __shared__ D tile[kTile][kTile + 1];
  const uint64_t r0 = uint64_t(blockIdx.y) * kTile, c0 = uint64_t(blockIdx.x) * kTile;
  for (int y = threadIdx.y; y < kTile; y += blockDim.y) {
    uint64_t r = r0 + y, c = c0 + threadIdx.x;
    if (r < rows && c < cols) tile[y][threadIdx.x] = Convert<S, D>(src[r * cols + c], overflow, tag);
  }
  __syncthreads();
  for (int y = threadIdx.y; y < kTile; y += blockDim.y) {
    uint64_t c = c0 + y, r = r0 + threadIdx.x;
    if (r < rows && c < cols) dst[c * dst_ld + col0 + r] = tile[threadIdx.x][y];
  }
}

struct Args {
  const void* src;
  uint64_t a, b;  // rows/cols or row_elems/n
  void* dst;
  uint64_t c, d;
  int* overflow;
  int tag;
  cudaStream_t stream;
  bool transpose;
};

template <typename S, typename D>
Status Launch(const Args& x) {
  if (x.transpose) {
    if (x.a == 0 || x.b == 0) return Status::Ok();
    dim3 block(kTile, 8);
    dim3 grid(static_cast<unsigned>((x.b + kTile - 1) / kTile), static_cast<unsigned>((x.a + kTile - 1) / kTile));
    if (grid.y > 65535) return Unsupported("transpose of a tensor with more than 2M rows");
    TransposeKernel<S, D><<<grid, block, 0, x.stream>>>(static_cast<const S*>(x.src), x.a, x.b,
                                                        static_cast<D*>(x.dst), x.c, x.d, x.overflow, x.tag);
  } else {
    if (x.b == 0) return Status::Ok();
    uint64_t blocks = (x.b + 255) / 256;
    if (blocks > 8192) blocks = 8192;
    ConvertRowsKernel<S, D><<<static_cast<unsigned>(blocks), 256, 0, x.stream>>>(
        static_cast<const S*>(x.src), x.a, x.b, static_cast<D*>(x.dst), x.c, x.d, x.overflow, x.tag);
  }
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return Internal(std::string("kernel launch: ") + cudaGetErrorString(err));
  return Status::Ok();
}

template <typename S>
Status LaunchFrom(DType to, const Args& x) {
  switch (to) {
    case DType::kF64: return Launch<S, double>(x);
    case DType::kF32: return Launch<S, float>(x);
    case DType::kF16: return Launch<S, __half>(x);
    case DType::kBF16: return Launch<S, __nv_bfloat16>(x);
    default: return InvalidArgument("cannot convert to " + std::string(DTypeName(to)));
  }
}

Status Dispatch(DType from, DType to, const Args& x) {
  if (from == to) {
    switch (DTypeSize(from)) {
      case 1: return Launch<uint8_t, uint8_t>(x);
      case 2: return Launch<uint16_t, uint16_t>(x);
      case 4: return Launch<uint32_t, uint32_t>(x);
      case 8: return Launch<uint64_t, uint64_t>(x);
      default: return Unsupported("no kernel for elements of " + std::to_string(DTypeSize(from)) + " bytes");
    }
  }
  if (!CanConvert(from, to))
    return InvalidArgument(std::string("refusing to convert ") + DTypeName(from) + " to " + DTypeName(to));
  switch (from) {
    case DType::kF64: return LaunchFrom<double>(to, x);
    case DType::kF32: return LaunchFrom<float>(to, x);
    case DType::kF16: return LaunchFrom<__half>(to, x);
    case DType::kBF16: return LaunchFrom<__nv_bfloat16>(to, x);
    default: return InvalidArgument(std::string("refusing to convert ") + DTypeName(from));
  }
}

bool IsFloat(DType t) {
  return t == DType::kF64 || t == DType::kF32 || t == DType::kF16 || t == DType::kBF16;
}

}  // namespace

bool CanConvert(DType from, DType to) { return from == to || (IsFloat(from) && IsFloat(to)); }

Status LaunchConvertRows(DType from, DType to, const void* src, uint64_t row_elems, uint64_t rows,
                         void* dst, uint64_t dst_first, uint64_t dst_pitch_elems, int* overflow,
                         int tag, cudaStream_t stream) {
  if (row_elems == 0) return Status::Ok();
  return Dispatch(from, to, Args{src, row_elems, row_elems * rows, dst, dst_first, dst_pitch_elems, overflow, tag, stream, false});
}

Status LaunchTranspose(DType from, DType to, const void* src, uint64_t rows, uint64_t cols,
                       void* dst, uint64_t dst_ld, uint64_t col0, int* overflow, int tag,
                       cudaStream_t stream) {
  return Dispatch(from, to, Args{src, rows, cols, dst, dst_ld, col0, overflow, tag, stream, true});
}

}  // namespace ckpt::cuda
