#include "common/element_count.h"

#include <string>

#include "ckpt/tensor.h"

namespace ckpt {

Result<uint64_t> ElementCount(const std::vector<int64_t>& shape) {
  uint64_t n = 1;
  bool overflow = false;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] < 0) {
      return InvalidArgument("negative dimension " + std::to_string(shape[i]) + " in dim " + std::to_string(i));
    }
    overflow = overflow || __builtin_mul_overflow(n, static_cast<uint64_t>(shape[i]), &n);
  }
  if (overflow) return InvalidArgument("element count overflows 64 bits");
  return n;
}

uint64_t NumElements(const std::vector<int64_t>& shape) {
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

}  // namespace ckpt
