// Splitting a strided copy at registration boundaries: the driver refuses a copy whose
// source spans two cudaHostRegister ranges. Pure host code (tested without a GPU).
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

namespace ckpt::cuda {

// Calls f(row0, col0, width, rows) for sub-copies of the copy of `h` rows of `w` bytes
// starting at address `s` with pitch `spitch`: together they cover every row's bytes
// once, and none reads across an address in `bounds` (sorted). Stops at, and returns, the
// first non-zero value f returns.
template <typename F>
int SplitAtBounds(uint64_t s, uint64_t spitch, uint64_t w, uint64_t h, const std::vector<uint64_t>& bounds, F&& f) {
  if (w == 0 || h == 0) return 0;
  const uint64_t end = s + (h - 1) * spitch + w;
  auto it = std::upper_bound(bounds.begin(), bounds.end(), s);
  uint64_t cur = 0;  // first row not yet copied
  auto rows = [&](uint64_t r0, uint64_t r1) { return r1 > r0 ? f(r0, uint64_t{0}, w, r1 - r0) : 0; };
  while (it != bounds.end() && *it < end) {
    const uint64_t k = (*it - s) / spitch, o = (*it - s) % spitch;
    if (o >= w) {  // between rows k and k + 1
      if (int e = rows(cur, k + 1)) return e;
      cur = k + 1;
      ++it;
      continue;
    }
    if (int e = rows(cur, k)) return e;  // rows before k, then row k cut at each boundary in it
    const uint64_t row = s + k * spitch;
    uint64_t pos = 0;
    for (; it != bounds.end() && *it < row + w; ++it) {
      const uint64_t b = *it - row;
      if (b > pos) {
        if (int e = f(k, pos, b - pos, uint64_t{1})) return e;
      }
      pos = b;
    }
    if (int e = f(k, pos, w - pos, uint64_t{1})) return e;
    cur = k + 1;
  }
  return rows(cur, h);
}

}  // namespace ckpt::cuda
