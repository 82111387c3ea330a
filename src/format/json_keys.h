// Duplicate keys in JSON headers (a safetensors header, a shard index's weight_map):
// nlohmann keeps one value of a key given twice, so the parsers look for them first with
// this SAX pass. (nlohmann's parser callback, used before, scans the enclosing object at
// the end of every value it holds: a header of N tensors cost O(N^2); issue 23.)
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace ckpt::format {

// The first key given twice in the same object at nesting `depth` of `json_text` (1: the
// top-level object's keys; 2: the keys of the object that the top-level key `under` holds),
// or nullopt if there is none or the text is not valid JSON (the caller's parse reports
// that). One pass, linear in the text.
std::optional<std::string> FirstDuplicateKey(std::string_view json_text, int depth, const std::string& under = "");

}  // namespace ckpt::format
