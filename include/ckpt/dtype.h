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
  // Sub-byte floats, packed (safetensors F4 = float4 e2m1, F6_E2M3, F6_E3M2). A tensor's
  // element count times the bits must be a whole number of bytes. They are stored and
  // attached like any tensor but can only be taken whole (no shards, no GPU conversion).
  kF4 = 19,
  kF6E2M3 = 20,
  kF6E3M2 = 21,
};

// Size of one element in bytes (1 for kBool); 0 for the sub-byte types.
uint32_t DTypeSize(DType dtype);
// Size of one element in bits (4 or 6 for the sub-byte types).
uint32_t DTypeBits(DType dtype);
// Bytes of `numel` elements; nullopt if they are not a whole number of bytes or overflow.
std::optional<uint64_t> TensorBytes(DType dtype, uint64_t numel);
// The safetensors name ("F32", "BF16", "F8_E4M3", ...).
const char* DTypeName(DType dtype);
// Parses a safetensors dtype name; nullopt if it is not one this build knows.
std::optional<DType> DTypeFromName(const std::string& name);
// True if `value` is one of the enumerators above.
bool IsValidDType(uint32_t value);

}  // namespace ckpt
