#include "ckpt/dtype.h"

namespace ckpt {
namespace {
struct DTypeRow {
  DType dtype;
  const char* name;
  uint32_t size;
};
constexpr DTypeRow kRows[] = {
    {DType::kBool, "BOOL", 1},       {DType::kU8, "U8", 1},         {DType::kI8, "I8", 1},
    {DType::kI16, "I16", 2},         {DType::kU16, "U16", 2},       {DType::kI32, "I32", 4},
    {DType::kU32, "U32", 4},         {DType::kI64, "I64", 8},       {DType::kU64, "U64", 8},
    {DType::kF16, "F16", 2},         {DType::kBF16, "BF16", 2},     {DType::kF32, "F32", 4},
    {DType::kF64, "F64", 8},         {DType::kF8E4M3, "F8_E4M3", 1}, {DType::kF8E5M2, "F8_E5M2", 1},
    {DType::kF8E8M0, "F8_E8M0", 1},  {DType::kC64, "C64", 8},       {DType::kC128, "C128", 16},
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
