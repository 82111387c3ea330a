// Hex encoding of binary blobs for JSON frames (lower-case, two digits a byte).
#pragma once

#include <string>

#include "ckpt/status.h"

namespace ckpt {

// `bytes` (any bytes, NULs included) as lower-case hex, two characters a byte.
std::string HexEncode(const std::string& bytes);
// The bytes `hex` encodes. InvalidArgument for an odd length or a character outside
// [0-9a-f] (upper-case digits are refused too: the wire form is lower-case).
Result<std::string> HexDecode(const std::string& hex);

}  // namespace ckpt
