// Hex, the one home of it: binary blobs for JSON frames, 64-bit checksums and fingerprints
// as 16 digits, fixed-size ids (segment ids), and bytes escaped as \xNN in messages. Always
// lower-case; decoding refuses upper-case digits (every form ckpt writes is lower-case).
// All functions are pure and thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "ckpt/status.h"

namespace ckpt {

// `bytes` (any bytes, NULs included) as lower-case hex, two characters a byte.
std::string HexEncode(std::string_view bytes);
// The `size` bytes at `data` as lower-case hex, two characters a byte.
std::string HexEncode(const void* data, size_t size);
// The bytes `hex` encodes. InvalidArgument for an odd length or a character outside
// [0-9a-f] (upper-case digits are refused too: the wire form is lower-case).
Result<std::string> HexDecode(std::string_view hex);
// Decodes exactly `size` bytes into `out`: false (out unspecified) unless `hex` is
// 2 * size lower-case hex digits.
bool HexDecodeInto(std::string_view hex, void* out, size_t size);

// `v` as exactly 16 lower-case hex digits, zero-padded ("00000000000000ff"): checksums
// and fingerprints as the wire, the catalog and ckptctl show them.
std::string Hex64(uint64_t v);
// The value of 1 to 16 lower-case hex digits (Hex64's output and its unpadded forms);
// nullopt for anything else (empty, longer, another character).
std::optional<uint64_t> ParseHex64(std::string_view hex);

// `text` for an error message: printable ASCII as is, every other byte (and '\') as \xNN;
// at most `max_bytes` bytes of it shown, then "..." when it is longer.
std::string EscapedForMessage(std::string_view text, size_t max_bytes);

}  // namespace ckpt
