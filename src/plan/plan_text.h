// Text helpers of the plan generators (hf_plans.cc): regex-escaping
// and transformers' plan keys as patterns.
#pragma once

#include <string>

namespace ckpt::plan_text {

// `s` with every PCRE2 metacharacter escaped, so that the pattern matches `s` literally.
inline std::string RegexEscape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (std::string(".^$|()[]{}*+?\\").find(c) != std::string::npos) out += '\\';
    out += c;
  }
  return out;
}

// A transformers plan key ("model.layers.*.self_attn.q_proj") as an unanchored pattern: a
// "*" segment is a layer number (transformers 5's replace_layer_number_by_wildcard turns
// only ".N." and a final ".N" into "*"; digits inside a name such as "w1" stay).
inline std::string PlanKeyRegex(const std::string& key) {
  std::string out;
  size_t start = 0;
  while (true) {
    const size_t dot = key.find('.', start);
    const std::string seg = key.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    out += seg == "*" ? "\\d+" : RegexEscape(seg);
    if (dot == std::string::npos) break;
    out += "\\.";
    start = dot + 1;
  }
  return out;
}

}  // namespace ckpt::plan_text
