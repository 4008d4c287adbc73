// "Did you mean" for names: the closest spelling among candidates by edit distance. Used by
// parse/ (units, record kinds) and check/ (fields, names, enum values, --set paths).
#ifndef PARAPLAN_COMPILER_AST_NAMES_H_
#define PARAPLAN_COMPILER_AST_NAMES_H_

#include <string>
#include <string_view>
#include <vector>

namespace paraplan::ast {

// Levenshtein distance, case-sensitive; a case-only difference counts as half an edit so that
// `gib` finds `GiB`.
double EditDistance(std::string_view a, std::string_view b);

// The candidate closest to `word` if it is close enough to be a plausible typo (at most a
// third of the word's length in edits, and at least one), else empty.
std::string ClosestName(std::string_view word, const std::vector<std::string_view>& candidates);

}  // namespace paraplan::ast

#endif  // PARAPLAN_COMPILER_AST_NAMES_H_
