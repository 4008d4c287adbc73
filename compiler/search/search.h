// planc search: exhaustive enumeration of the fields a plan gives as lists or `auto`
// (Plan::sweeps), pruning by the checks of `planc check`, ranking by predicted step time.
//
// For every candidate the base plan is changed in place (no copy), dp and etp are re-derived
// (dp = world / (tp·pp·cp); etp follows tp unless written; the schedule becomes
// interleaved_1f1b when vpp > 1 and the schedule is not itself searched); a candidate with
// sp = true and tp = 1 is skipped as the duplicate of its sp = false twin when sp = false is
// searched too (Megatron turns SP off at TP 1), and so is zero > 0 over a data-parallel domain
// of one rank (it shards nothing) when zero = 0 is searched; then:
//   1. CheckPlanRules (the rules of `planc check`): any error rejects the candidate;
//   2. the pipeline partition (BuildPartition, through the memory model): no split rejects it;
//   3. the memory model: a stage over the GPU's memory rejects it;
//   4. the time model prices the rest.
// The best `top` are then re-verified by the caller's `verify` (the full front end: `require`
// rules and every derived field evaluated from the source) and replaced by the next ones when
// that fails. Made by RunSearch; printed by the driver (cmd_search.cpp) and bench/search.
#ifndef PARAPLAN_COMPILER_SEARCH_SEARCH_H_
#define PARAPLAN_COMPILER_SEARCH_SEARCH_H_

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "compiler/analyze/cost_framework.h"
#include "compiler/analyze/cost_params.h"
#include "compiler/plan/plan.h"

namespace paraplan {

struct SearchAxis {
  std::string path;                 // "parallel.tp"
  std::vector<std::string> values;  // as --set takes them
};

// The axes of a plan's sweeps, in the order they were written.
std::vector<SearchAxis> AxesFromSweeps(const Plan& plan);

using SearchSettings = std::vector<std::pair<std::string, std::string>>;  // path, value

struct SearchOptions {
  int64_t top = 10;
  int64_t max_candidates = 4'000'000;
  CostOptions cost;
  // Full re-check of a reported candidate; nullptr accepts all.
  std::function<bool(const SearchSettings&)> verify;
};

struct SearchCandidate {
  SearchSettings settings;  // every axis, then the derived parallel.dp (and etp, schedule)
  int64_t peak = 0;         // bytes per GPU, the largest stage
  int64_t peak_stage = 0;
  double step_s = 0;
  double tokens_per_s_per_gpu = 0;
  double mfu = 0;
};

struct SearchResult {
  bool too_large = false;  // more than max_candidates: nothing enumerated
  int64_t space = 0;       // product of the axis sizes (INT64_MAX when it overflows)
  int64_t enumerated = 0;
  int64_t duplicates = 0;          // sp = true at tp = 1 while sp = false is searched (Megatron
                                   // turns SP off at TP 1): counted once, as sp = false; and
                                   // zero > 0 with dp · cp = 1 (and edp = 1), no offload, while
                                   // zero = 0 is searched: counted once, as zero = 0
  int64_t rejected_rules = 0;      // CheckPlanRules errors (or dp not whole)
  int64_t rejected_partition = 0;  // no pipeline split
  int64_t rejected_memory = 0;     // over the GPU's memory
  int64_t rejected_verify = 0;     // failed the full re-check among the reported ones
  int64_t fitting = 0;
  int64_t smallest_rejected_peak = 0;  // the least memory among memory-rejected candidates
  std::vector<SearchCandidate> best;   // fastest first, at most `top`
  // The framework profile the candidates were priced with: its stack and GPU generation, and how
  // close it came to the published runs of its stack.
  std::string_view framework, generation;
  ProfileCheck checked;
};

SearchResult RunSearch(const Plan& base, const std::vector<SearchAxis>& axes,
                       const SearchOptions& options);

// The candidate's predicted step over the best one's, less 1 (0.021: 2.1% slower).
double StepOverBest(const SearchCandidate& c, const SearchCandidate& best);

// How many of the reported candidates, from the best, predict a step closer to the best's than
// the profile's median error on published runs (ties as far as the model can tell); 0 when the
// profile has no checked runs.
size_t TiesWithBest(const SearchResult& r);

// Text table and JSON (DESIGN.md: "version", canonical paths) of a result.
std::string PrintSearchText(const Plan& base, const std::vector<SearchAxis>& axes,
                            const SearchResult& result);
std::string PrintSearchJson(const Plan& base, const std::vector<SearchAxis>& axes,
                            const SearchResult& result, double seconds);

}  // namespace paraplan

#endif  // PARAPLAN_COMPILER_SEARCH_SEARCH_H_
