// libFuzzer target: the restricted state-dict unpickler.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "format/unpickler.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ckpt::format::UnpicklerLimits limits;
  limits.max_values = 1u << 16;  // keep each run small; the limits themselves are under test
  limits.max_stack = 1u << 16;
  limits.max_memo = 1u << 16;
  (void)ckpt::format::StateDictUnpickler::Parse(std::string_view(reinterpret_cast<const char*>(data), size), limits);
  return 0;
}
