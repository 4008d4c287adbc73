#include "compiler/ast/names.h"

#include <algorithm>
#include <cctype>

namespace paraplan::ast {

double EditDistance(std::string_view a, std::string_view b) {
  // Optimal string alignment: insertions, deletions, substitutions and swaps of neighbours.
  std::vector<double> prev2(b.size() + 1), prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = static_cast<double>(j);
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = static_cast<double>(i);
    for (size_t j = 1; j <= b.size(); ++j) {
      double subst = 0;
      if (a[i - 1] != b[j - 1]) {
        subst = std::tolower(static_cast<unsigned char>(a[i - 1])) ==
                        std::tolower(static_cast<unsigned char>(b[j - 1]))
                    ? 0.5
                    : 1.0;
      }
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + subst});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] && a[i - 1] != b[j - 1]) {
        cur[j] = std::min(cur[j], prev2[j - 2] + 1);
      }
    }
    std::swap(prev2, prev);
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string ClosestName(std::string_view word, const std::vector<std::string_view>& candidates) {
  double best = 1e9;
  std::string_view best_name;
  for (std::string_view c : candidates) {
    if (c == word) continue;
    double d = EditDistance(word, c);
    if (d < best) {
      best = d;
      best_name = c;
    }
  }
  double limit = std::max(1.0, static_cast<double>(word.size()) / 3.0);
  if (best_name.empty() || best > limit) return {};
  return std::string(best_name);
}

}  // namespace paraplan::ast
