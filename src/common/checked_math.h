// Checked arithmetic for sizes and offsets that come from files or the wire: every sum,
// product and alignment of such a value goes through these, so a hostile value that
// would wrap 64 bits is an error instead of a small number.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "ckpt/status.h"

namespace ckpt {

// a + b, or nullopt if it does not fit in 64 bits.
[[nodiscard]] inline std::optional<uint64_t> CheckedAdd(uint64_t a, uint64_t b) {
  uint64_t out;
  if (__builtin_add_overflow(a, b, &out)) return std::nullopt;
  return out;
}

// a * b, or nullopt if it does not fit in 64 bits.
[[nodiscard]] inline std::optional<uint64_t> CheckedMul(uint64_t a, uint64_t b) {
  uint64_t out;
  if (__builtin_mul_overflow(a, b, &out)) return std::nullopt;
  return out;
}

// v rounded up to a multiple of `align` (> 0), or nullopt if that does not fit.
[[nodiscard]] inline std::optional<uint64_t> CheckedAlignUp(uint64_t v, uint64_t align) {
  auto bumped = CheckedAdd(v, align - 1);
  if (!bumped) return std::nullopt;
  return *bumped / align * align;
}

// Accumulates a sum and remembers whether any step overflowed; for totals over many
// terms (the segment cursor, the budget estimate). Not thread-safe.
class CheckedSum {
 public:
  explicit CheckedSum(uint64_t start = 0) : value_(start) {}
  CheckedSum& Add(uint64_t v) {
    overflow_ = overflow_ || __builtin_add_overflow(value_, v, &value_);
    return *this;
  }
  CheckedSum& AddProduct(uint64_t a, uint64_t b) {
    uint64_t p;
    if (__builtin_mul_overflow(a, b, &p)) overflow_ = true;
    return overflow_ ? *this : Add(p);
  }
  CheckedSum& AlignUp(uint64_t align) {
    if (!overflow_) {
      auto a = CheckedAlignUp(value_, align);
      if (a) value_ = *a;
      else overflow_ = true;
    }
    return *this;
  }
  bool overflowed() const { return overflow_; }
  // The total, or InvalidArgument "<what> overflows 64 bits" if any step wrapped.
  Result<uint64_t> Get(const std::string& what) const {
    if (overflow_) return InvalidArgument(what + " overflows 64 bits");
    return value_;
  }

 private:
  uint64_t value_;
  bool overflow_ = false;
};

}  // namespace ckpt
