// Pattern: the regular expressions of TP plan files, matched by this project's own small
// backtracking engine instead of std::regex. std::regex depends on libstdc++'s locale
// machinery, and in a process where PyTorch's wheels had loaded libtorch globally its
// exported libstdc++ internals interposed ours: compiling a pattern with a bracket
// expression crashed (docs/python.md). Tensor names are short, so backtracking is cheap;
// a step budget bounds pathological patterns all the same.
//
// Syntax (an ECMAScript subset): literals; `.`; escapes \d \D \w \W \s \S \b \B \t \n and
// escaped punctuation; classes [abc] [^a-z] with ranges and those escapes; groups ( ) and
// (?: ); alternation |; quantifiers * + ? {n} {n,} {n,m}, greedy or lazy (trailing ?);
// anchors ^ $. Backreferences and lookarounds are refused when compiled.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt/status.h"

namespace ckpt {

class Pattern {
 public:
  // InvalidArgument naming the position and the problem for a malformed or unsupported pattern.
  static Result<Pattern> Compile(const std::string& text);

  // The text of each group of the first match found searching `subject` left to right
  // (group 0: the whole match; "" for a group that did not take part), or an empty vector
  // if nothing matches. InvalidArgument if `subject` is longer than kMaxSubject bytes (the
  // matcher recurses per byte consumed) or the search needs more than a bounded number of
  // steps (a pathological pattern): never a silent "no match".
  Result<std::vector<std::string>> Search(std::string_view subject) const;
  static constexpr size_t kMaxSubject = 1024;  // = the segment format's longest tensor name
  // Number of capture groups.
  size_t groups() const { return groups_; }
  const std::string& text() const { return text_; }

  // `format` with $n / $nn (a group; two digits only where that group exists, as ECMAScript
  // says; "" for a group that does not), $& (the match) and $$ ($) replaced.
  static std::string Expand(const std::string& format, const std::vector<std::string>& groups);

  struct Node;  // internal

 private:
  std::string text_;
  size_t groups_ = 0;
  std::shared_ptr<const Node> root_;
};

}  // namespace ckpt
