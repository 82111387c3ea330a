// Tensor metadata and zero-copy host views into an attached checkpoint.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "ckpt/dtype.h"

namespace ckpt {

// Description of one tensor of a checkpoint, as stored in its segment index.
struct TensorInfo {
  std::string name;
  DType dtype = DType::kU8;
  std::vector<int64_t> shape;  // row-major; empty for a scalar
  uint64_t nbytes = 0;         // = NumElements(shape) * DTypeSize(dtype)
  uint64_t checksum = 0;       // XXH3-64 of the tensor's bytes, computed when loaded
};

// Product of the dimensions (1 for a scalar). Precondition: every dimension >= 0.
uint64_t NumElements(const std::vector<int64_t>& shape);

// A read-only view of one whole tensor in shared memory. Valid while the Checkpoint that
// returned it is alive; it owns nothing.
struct TensorView {
  const TensorInfo* info = nullptr;
  const std::byte* data = nullptr;  // info->nbytes bytes, 64-byte aligned
};

}  // namespace ckpt
