// The memory diagnostics of `planc check` (P0701 out of memory, P0702 above 93%), and the
// verified fixes they offer.
//
// A fix is one change to the plan (`parallel.sp = true`, `recompute = selective`, a higher
// ZeRO stage, a smaller micro batch, more TP/PP/CP/EP, CPU offload, more nodes); each is
// re-derived (dp = world / (tp·pp·cp), etp following tp unless set), screened with the basic
// divisibility rules, re-estimated by the memory model and priced by the time model, so a help
// only names changes that the model itself shows to fit. Cheapest = fewest GPU-seconds per step.
// Called from RunAnalysisChecks; ProposeMemoryFixes is also read by explain.
#ifndef PARAPLAN_COMPILER_ANALYZE_MEMORY_CHECK_H_
#define PARAPLAN_COMPILER_ANALYZE_MEMORY_CHECK_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "compiler/analyze/cost_params.h"
#include "compiler/analyze/memory.h"
#include "compiler/diagnostics/diagnostic.h"
#include "compiler/plan/plan.h"

namespace paraplan {

// P0702's threshold, percent of the GPU's memory (justified in memory_check.cpp).
inline constexpr int64_t kNearLimitPercent = 93;

// Reports P0701 when a stage exceeds the GPU's memory, else P0702 above kNearLimitPercent of it.
void CheckMemory(const Plan& plan, DiagnosticSink& sink, const CostOptions& options = {});

// P0805: planrun's backends, which keep every element in f32, would hold pipeline stage `stage`'s
// program in `total` bytes per GPU (its f32 arena with the CUDA context and NCCL), more than the
// GPU; `arena` labels the plan (the arena's size). Reported by CheckMemory (framework = paraplan,
// from the estimate) and by lowering (from the program).
Diag F32ArenaWarning(const Plan& plan, int64_t stage, int64_t total, std::string arena);

struct MemoryFix {
  std::vector<std::pair<std::string, std::string>>
      sets;                 // every change: path, value as --set takes it
  std::string path;         // the first change: "parallel.sp"
  std::string value;        // "true"
  std::string description;  // "`parallel.sp = true`"
  int64_t peak = 0;         // bytes per GPU after the change (the worst stage)
  int64_t peak_stage = 0;
  double step_s = 0;       // predicted step time after the change
  double gpu_seconds = 0;  // step_s x GPUs: what "cheapest" ranks by
};

// Changes that bring the peak to at most `limit` bytes: single-field changes cheapest first
// (GPU-seconds per step), then, when fewer than max_fixes single ones fit, pairs of them.
std::vector<MemoryFix> ProposeMemoryFixes(const Plan& plan, int64_t limit,
                                          const CostOptions& options = {}, size_t max_fixes = 3);

// Re-derives the fields that follow others after a change: dp = world / (tp·pp·cp) and etp =
// tp unless etp was written. false when the world does not divide.
bool RederiveSizes(Plan& plan);

// The divisibility rules a changed plan must meet before it is offered as a fix (a subset of
// CheckPlanRules that needs no source: world, heads, experts, layers, batch, TP in a node).
bool PassesBasicRules(const Plan& plan);

}  // namespace paraplan

#endif  // PARAPLAN_COMPILER_ANALYZE_MEMORY_CHECK_H_
