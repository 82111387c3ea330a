// What a checkpoint format parser produces: which bytes of which files hold each tensor.
// The loader turns a LoadPlan into a shared-memory segment; parsers never allocate data.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ckpt/dtype.h"

namespace ckpt::format {

struct PlannedTensor {
  std::string name;
  DType dtype = DType::kU8;
  std::vector<int64_t> shape;
  uint32_t file_index = 0;   // into LoadPlan::files
  uint64_t file_offset = 0;  // first byte of the tensor in that file
  uint64_t nbytes = 0;       // bytes of the tensor (contiguous, row-major) in the segment
  // A non-contiguous view (PyTorch): when `strides` is non-empty (one per dim, in
  // elements, >= 0), the tensor's elements are at file_offset + sum(i_d * strides[d]) *
  // dtype size; the loader reads the `source_bytes` bytes at file_offset that cover them
  // and gathers them into row-major order. Empty: the nbytes at file_offset are the tensor.
  std::vector<int64_t> strides;
  uint64_t source_bytes = 0;
  // Index into LoadPlan::tensors of an earlier tensor with the same dtype, shape and
  // bytes (tied weights): this one is stored once, sharing that tensor's data. -1: none.
  int64_t alias_of = -1;
};

struct LoadPlan {
  std::string format;              // "safetensors", ...
  std::vector<std::string> files;  // absolute or caller-relative paths
  std::vector<PlannedTensor> tensors;

  // Bytes stored (aliases counted once).
  uint64_t TotalBytes() const {
    uint64_t total = 0;
    for (const auto& t : tensors) total += t.alias_of < 0 ? t.nbytes : 0;
    return total;
  }
};

}  // namespace ckpt::format
