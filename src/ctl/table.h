// Plain-text tables and human-readable sizes for ckptctl.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ckpt::ctl {

// "512 B", "1.50 KiB", "9.88 GiB".
std::string HumanBytes(uint64_t bytes);

// Renders rows under a header, columns padded to their widest cell; columns listed in
// `right_aligned` (by index) are right-aligned.
std::string RenderTable(const std::vector<std::string>& header,
                        const std::vector<std::vector<std::string>>& rows,
                        const std::vector<size_t>& right_aligned = {});

}  // namespace ckpt::ctl
