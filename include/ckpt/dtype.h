// Element types of checkpoint tensors, named as safetensors names them.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace ckpt {

// Stable numeric values: they are stored in shared-memory segments. Append only.
enum class DType : uint32_t {
  kBool = 1,
  kU8 = 2,
  kI8 = 3,
  kI16 = 4,
  kU16 = 5,
  kI32 = 6,
  kU32 = 7,
  kI64 = 8,
  kU64 = 9,
  kF16 = 10,
  kBF16 = 11,
  kF32 = 12,
  kF64 = 13,
  kF8E4M3 = 14,
  kF8E5M2 = 15,
  kF8E8M0 = 16,
  kC64 = 17,   // complex64: two F32
  kC128 = 18,  // complex128: two F64 (torch.complex128; safetensors has no name for it)
};

// Size of one element in bytes (1 for kBool).
uint32_t DTypeSize(DType dtype);
// The safetensors name ("F32", "BF16", "F8_E4M3", ...).
const char* DTypeName(DType dtype);
// Parses a safetensors dtype name; nullopt if it is not one this build knows.
std::optional<DType> DTypeFromName(const std::string& name);
// True if `value` is one of the enumerators above.
bool IsValidDType(uint32_t value);

}  // namespace ckpt
