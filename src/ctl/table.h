// Plain-text tables and human-readable sizes for ckptctl.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/byte_size.h"

namespace ckpt::ctl {

// "512 B", "1.50 KiB", "9.88 GiB" (common/byte_size.h: the daemon's errors use it too).
using ckpt::HumanBytes;

// `text` made safe for a terminal: backslash, control characters (C0, DEL, C1),
// bidirectional overrides and bytes that are not valid UTF-8 are written as escapes
// (\\, \n, \t, \r, \xNN, \uNNNN); everything else is kept. Every text ckptctl prints
// that came from the daemon or a file (names, paths, tensor names) goes through it.
std::string Printable(const std::string& text);

// Renders rows under a header, columns padded to their widest cell; columns listed in
// `right_aligned` (by index) are right-aligned. Every cell is passed through Printable.
std::string RenderTable(const std::vector<std::string>& header,
                        const std::vector<std::vector<std::string>>& rows,
                        const std::vector<size_t>& right_aligned = {});

}  // namespace ckpt::ctl
