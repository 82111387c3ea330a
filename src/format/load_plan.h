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
  uint64_t nbytes = 0;       // contiguous, row-major bytes in the file
};

struct LoadPlan {
  std::string format;              // "safetensors", ...
  std::vector<std::string> files;  // absolute or caller-relative paths
  std::vector<PlannedTensor> tensors;

  uint64_t TotalBytes() const {
    uint64_t total = 0;
    for (const auto& t : tensors) total += t.nbytes;
    return total;
  }
};

}  // namespace ckpt::format
