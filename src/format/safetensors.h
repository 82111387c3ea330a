// Parser for the safetensors format: an 8-byte little-endian header length N, N bytes of
// JSON describing every tensor (dtype, shape, [begin, end) offsets into the data), then
// the data. https://github.com/huggingface/safetensors#format
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>

#include "ckpt/status.h"
#include "format/load_plan.h"

namespace ckpt::format {

// Largest JSON header accepted (the safetensors reference implementation's limit).
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100ull << 20;

// Parses the JSON header of a safetensors file whose data section (after the header)
// holds `data_bytes` bytes and starts at `data_start` in file `file_index`. Appends the
// tensors to `plan` only if the whole header is valid; otherwise returns Corrupt or
// Unsupported naming the first offending tensor and leaves `plan` unchanged.
// Checks: JSON object; known dtypes; shapes of <= 8 non-negative dims; offsets within the
// data, ordered begin <= end, matching shape x dtype size, not overlapping; no empty or
// oversized names; no name given twice (nlohmann would silently keep one: duplicates are
// found while parsing); "__metadata__", if present, maps strings to strings, and is
// copied into `metadata` when that is not null.
Status ParseSafetensorsHeader(std::string_view header_json, uint64_t data_start,
                              uint64_t data_bytes, uint32_t file_index, LoadPlan* plan,
                              std::map<std::string, std::string>* metadata = nullptr);

// Reads the header of the open safetensors `file` and appends its tensors to `plan` (the
// file to plan->files, its __metadata__ to plan->metadata). Errors: IoError for the file,
// Corrupt for a truncated file or a header length beyond the file or the limit.
Status PlanSafetensorsFile(const std::shared_ptr<const OpenedFile>& file, LoadPlan* plan);
// The same for `path`, opened without following a final symlink (tests and tools).
Status PlanSafetensorsFile(const std::string& path, LoadPlan* plan);

}  // namespace ckpt::format
