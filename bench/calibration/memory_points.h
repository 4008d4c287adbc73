// The memory model against every memory figure calibration_runs.json holds: the runs with a
// measured peak (priced as the throughput calibration lays them out) and the memory references
// (Megatron-Bridge's measured allocations, Korthikanti et al.'s closed-form Figures 1 and 7),
// written as plans in tests/memory/calibration/. Printed per point and per framework, with the
// error when the source is left out of the one memory parameter that is fitted (a stack's
// allocator margin, fitted on that stack's own measured peaks).
#ifndef PARAPLAN_BENCH_CALIBRATION_MEMORY_POINTS_H_
#define PARAPLAN_BENCH_CALIBRATION_MEMORY_POINTS_H_

#include <string>
#include <vector>

#include "compiler/analyze/cost_params.h"
#include "compiler/plan/plan.h"
#include "llvm/Support/JSON.h"

namespace paraplan::calibration {

// A published run with a measured peak, as the throughput calibration chose its unstated
// fields; `plan.framework` is the stack whose memory behaviour prices it.
struct MeasuredPeak {
  std::string id, source;
  Plan plan;
  CostOptions options;
  double measured_gib = 0;
};

// The largest stage's peak in GiB as the plan's stack's allocator reports it (torch's
// max_memory_reserved for the PyTorch stacks, planrun's arena), or the device peak where the
// model gives no allocator figure; 0 when the plan cannot be priced.
double AllocatorPeakGiB(const Plan& plan, const CostOptions& options);

// Prints the memory section. `root` is the whole calibration_runs.json; `plans_dir` holds the
// plan files of the references (measured.plan, korthikanti.plan). Returns false, with a message
// on stderr, when a reference's plan cannot be loaded.
bool PrintMemoryReport(const llvm::json::Object& root, const std::vector<MeasuredPeak>& peaks,
                       const std::string& plans_dir);

}  // namespace paraplan::calibration

#endif  // PARAPLAN_BENCH_CALIBRATION_MEMORY_POINTS_H_
