// Element counts of shapes: the one checked product of a tensor's dimensions, for every
// shape that comes from a file, the wire or a caller (safetensors and PyTorch headers,
// load plans, segment specs, write pieces). ckpt::NumElements (ckpt/tensor.h) is its
// unchecked form, for shapes already validated.
#pragma once

#include <cstdint>
#include <vector>

#include "ckpt/status.h"

namespace ckpt {

// The number of elements of a tensor of `shape` (1 for a scalar, 0 if any dimension is 0).
// InvalidArgument "negative dimension <d> in dim <i>" for a dimension below 0, or
// "element count overflows 64 bits" when the product does not fit (even if a later
// dimension is 0: such a shape is refused whatever follows). Callers that report
// Corrupt (file headers) wrap the message. Thread-safe, no allocation on success.
Result<uint64_t> ElementCount(const std::vector<int64_t>& shape);

}  // namespace ckpt
