// Regex: the regular expressions of TP plans, matched by PCRE2 (Debian's libpcre2-8).
//
// Why PCRE2 and not std::regex: std::regex depends on libstdc++'s locale machinery, and in a
// process where PyTorch's wheels had loaded libtorch globally its exported libstdc++
// internals interposed ours (compiling a bracket expression crashed, docs/python.md). PCRE2
// is a C library with its own symbols. Patterns are compiled without UTF/UCP, so \d, \w, \s
// are ASCII classes, as in Python's `re` on the ASCII tensor names checkpoints use.
//
// A match limit bounds pathological patterns: a search that exceeds it is an error, never a
// silent "no match". Instances are immutable and safe to share between threads (each search
// allocates its own match data).
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt/status.h"

namespace ckpt {

class Regex {
 public:
  // InvalidArgument naming the offset and PCRE2's message for a malformed pattern.
  static Result<Regex> Compile(const std::string& text);

  // The text of each group of the first match searching `subject` left to right (group 0:
  // the whole match; "" for a group that did not take part), or an empty vector if nothing
  // matches. InvalidArgument if the search exceeds the match limit or `subject` is longer
  // than kMaxSubject bytes.
  Result<std::vector<std::string>> Search(std::string_view subject) const;
  static constexpr size_t kMaxSubject = 1024;  // = the segment format's longest tensor name
  static constexpr uint32_t kMatchLimit = 200000;

  // `format` with $n / ${n} (group n; "" when it did not take part) and $$ ($) replaced,
  // expanded by pcre2_substitute against the first match in `subject`. InvalidArgument if
  // `subject` does not match or `format` names a group the pattern lacks.
  Result<std::string> Substitute(std::string_view subject, const std::string& format) const;

  // The largest group number `format` refers to ($n, ${n}), or InvalidArgument for a `$`
  // that is neither `$$` nor a group reference. For checking a template when a plan is read.
  static Result<size_t> MaxGroupReferenced(const std::string& format);

  size_t groups() const { return groups_; }
  const std::string& text() const { return text_; }

  struct Code;  // internal: owns the pcre2_code

 private:
  std::string text_;
  size_t groups_ = 0;
  std::shared_ptr<const Code> code_;
};

}  // namespace ckpt
