// libFuzzer target: the safetensors JSON header parser.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "format/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 8) return 0;
  // The first 8 bytes choose the data section size; the rest is the header.
  uint64_t data_bytes = 0;
  for (int i = 7; i >= 0; --i) data_bytes = (data_bytes << 8) | data[i];
  ckpt::format::LoadPlan plan;
  (void)ckpt::format::ParseSafetensorsHeader(
      std::string_view(reinterpret_cast<const char*>(data) + 8, size - 8), 8, data_bytes, 0, &plan);
  return 0;
}
