// The one rule for side-file names (config.json, dcp.metadata.json, ...): checked by the
// daemon when a write declares them and by persist before it writes them beside the
// tensors, so a name persist would write is a name publish accepted, and the reverse.
#pragma once

#include <cstddef>
#include <string_view>

#include "ckpt/status.h"

namespace ckpt {

// The longest side-file name (a file name's limit on Linux; the segment format keeps it).
inline constexpr size_t kMaxSideFileNameBytes = 255;

// OK for a name of 1..kMaxSideFileNameBytes bytes whose first byte is a letter or digit
// and whose others are letters, digits, '.', '_' or '-' (so no '/', no escape, newline or
// other control byte, no '..', nothing a shell or a terminal takes for more than a name),
// and that no loader would take for the checkpoint's own files: not model.safetensors,
// model-NNNNN-of-NNNNN.safetensors or model.safetensors.index.json (what persist writes for
// the tensors), nor any name ending in .safetensors, .bin, .pt, .pth, .ckpt or .index.json.
// InvalidArgument naming the name (escaped) and the cause otherwise.
Status CheckSideFileName(std::string_view name);

}  // namespace ckpt
