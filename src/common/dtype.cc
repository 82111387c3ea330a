#include "ckpt/dtype.h"

namespace ckpt {
namespace {
struct DTypeRow {
  DType dtype;
  const char* name;
  uint32_t size;  // bytes; 0 for sub-byte types
  uint32_t bits;
};
constexpr DTypeRow kRows[] = {
    {DType::kBool, "BOOL", 1, 8},         {DType::kU8, "U8", 1, 8},           {DType::kI8, "I8", 1, 8},
    {DType::kI16, "I16", 2, 16},          {DType::kU16, "U16", 2, 16},        {DType::kI32, "I32", 4, 32},
    {DType::kU32, "U32", 4, 32},          {DType::kI64, "I64", 8, 64},        {DType::kU64, "U64", 8, 64},
    {DType::kF16, "F16", 2, 16},          {DType::kBF16, "BF16", 2, 16},      {DType::kF32, "F32", 4, 32},
    {DType::kF64, "F64", 8, 64},          {DType::kF8E4M3, "F8_E4M3", 1, 8},  {DType::kF8E5M2, "F8_E5M2", 1, 8},
    {DType::kF8E8M0, "F8_E8M0", 1, 8},    {DType::kC64, "C64", 8, 64},        {DType::kC128, "C128", 16, 128},
    {DType::kF4, "F4", 0, 4},             {DType::kF6E2M3, "F6_E2M3", 0, 6},  {DType::kF6E3M2, "F6_E3M2", 0, 6},
};

const DTypeRow* Find(DType dtype) {
  for (const auto& row : kRows) {
    if (row.dtype == dtype) return &row;
  }
  return nullptr;
}
}  // namespace

uint32_t DTypeSize(DType dtype) {
  const DTypeRow* row = Find(dtype);
  return row ? row->size : 0;
}

uint32_t DTypeBits(DType dtype) {
  const DTypeRow* row = Find(dtype);
  return row ? row->bits : 0;
}

std::optional<uint64_t> TensorBytes(DType dtype, uint64_t numel) {
  const uint64_t bits = DTypeBits(dtype);
  if (bits == 0 || (numel != 0 && numel > UINT64_MAX / bits)) return std::nullopt;
  if (numel * bits % 8 != 0) return std::nullopt;
  return numel * bits / 8;
}

const char* DTypeName(DType dtype) {
  const DTypeRow* row = Find(dtype);
  return row ? row->name : "INVALID";
}

std::optional<DType> DTypeFromName(const std::string& name) {
  for (const auto& row : kRows) {
    if (name == row.name) return row.dtype;
  }
  return std::nullopt;
}

bool IsValidDType(uint32_t value) { return Find(static_cast<DType>(value)) != nullptr; }

}  // namespace ckpt
