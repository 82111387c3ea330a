// Byte sizes: the one parser of sizes people write (ParseByteSize, ckpt/byte_size.h) and
// the one formatting of byte counts that ckptctl prints and the daemon writes into its
// errors and warnings.
#pragma once

#include <cstdint>
#include <string>

#include "ckpt/byte_size.h"

namespace ckpt {

// "512 B", "1.50 KiB", "9.88 GiB" (binary units, two decimals).
std::string HumanBytes(uint64_t bytes);

// HumanBytes with the exact count, for errors about budgets and limits, where the number
// may be compared with a configured value: "12.00 GiB (12884901888 bytes)"; below 1 KiB
// just "512 bytes".
std::string BytesText(uint64_t bytes);

}  // namespace ckpt
