// "Did you mean ...": the known names closest to a mistyped one. The one implementation
// for ckptctl (commands, checkpoint names), ckptd (flags, configuration keys) and the
// client library (NotFound for a checkpoint name, which the Python module raises too).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace ckpt {

// Optimal-string-alignment distance between `a` and `b`: insertions, deletions,
// substitutions and swaps of two adjacent bytes each cost 1.
size_t EditDistance(const std::string& a, const std::string& b);

// The candidates close enough to `typed` to be what was meant, nearest first (ties in
// the candidates' order), at most `limit`: those within max(1, (|typed| + 2) / 3) edits,
// and those of which `typed` is a prefix (or that are a prefix of it). Never `typed`
// itself. Empty if none is close.
std::vector<std::string> Suggest(const std::string& typed, const std::vector<std::string>& candidates,
                                 size_t limit = 3);

// " (did you mean 'a' or 'b'?)" for the suggestions, "" for none. The names are quoted as
// they are: a caller that prints to a terminal escapes the whole message (ckptctl's
// Printable).
std::string DidYouMean(const std::vector<std::string>& suggestions);

}  // namespace ckpt
