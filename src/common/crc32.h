// CRC-32 as zip (and zlib, gzip, PNG) define it: polynomial 0x04C11DB7 bit-reflected,
// initial value and final XOR 0xFFFFFFFF. On x86-64 with PCLMULQDQ it folds 64 bytes per
// step with carry-less multiplications (tens of GB/s on one core); elsewhere a table.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ckpt {

// The CRC-32 of `size` bytes at `data`, continuing `crc` (the CRC-32 of the bytes before
// them; 0 to start): Crc32(b, n) equals zlib's crc32(0, b, n), and
// Crc32(b2, n2, Crc32(b1, n1)) the CRC-32 of b1 followed by b2. Thread-safe.
uint32_t Crc32(const void* data, size_t size, uint32_t crc = 0);

// The CRC-32 of A followed by B from crc_a = Crc32(A), crc_b = Crc32(B) and B's length
// (zlib's crc32_combine), in O(log len_b): parts checked on several threads are joined
// in order without reading them again. Thread-safe.
uint32_t Crc32Combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b);

// Whether Crc32 uses the carry-less multiply path on this CPU (for benchmarks and logs).
bool Crc32IsAccelerated();

}  // namespace ckpt
