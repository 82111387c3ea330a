#include "common/suggest.h"

#include <algorithm>

namespace ckpt {

size_t EditDistance(const std::string& a, const std::string& b) {
  const size_t n = a.size(), m = b.size();
  // Three rows of the dynamic-programming table: i-2, i-1 and i.
  std::vector<size_t> before(m + 1), previous(m + 1), row(m + 1);
  for (size_t j = 0; j <= m; ++j) previous[j] = j;
  for (size_t i = 1; i <= n; ++i) {
    row[0] = i;
    for (size_t j = 1; j <= m; ++j) {
      const size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      row[j] = std::min({previous[j] + 1, row[j - 1] + 1, previous[j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) row[j] = std::min(row[j], before[j - 2] + 1);
    }
    before.swap(previous);
    previous.swap(row);
  }
  return previous[m];
}

std::vector<std::string> Suggest(const std::string& typed, const std::vector<std::string>& candidates, size_t limit) {
  const size_t threshold = std::max<size_t>(1, (typed.size() + 2) / 3);
  std::vector<std::pair<size_t, size_t>> scored;  // (distance, index)
  for (size_t i = 0; i < candidates.size(); ++i) {
    const std::string& c = candidates[i];
    if (c == typed || c.empty()) continue;
    const size_t d = EditDistance(typed, c);
    const bool prefix = !typed.empty() && (c.rfind(typed, 0) == 0 || typed.rfind(c, 0) == 0);
    if (d <= threshold || prefix) scored.emplace_back(d, i);
  }
  std::stable_sort(scored.begin(), scored.end());
  std::vector<std::string> out;
  for (const auto& [d, i] : scored) {
    if (out.size() >= limit) break;
    if (std::find(out.begin(), out.end(), candidates[i]) == out.end()) out.push_back(candidates[i]);
  }
  return out;
}

std::string DidYouMean(const std::vector<std::string>& suggestions) {
  if (suggestions.empty()) return "";
  std::string text = " (did you mean ";
  for (size_t i = 0; i < suggestions.size(); ++i) {
    if (i > 0) text += i + 1 == suggestions.size() ? " or " : ", ";
    text += "'" + suggestions[i] + "'";
  }
  return text + "?)";
}

}  // namespace ckpt
