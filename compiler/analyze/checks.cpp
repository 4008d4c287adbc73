#include "compiler/analyze/checks.h"

#include <fmt/format.h>

#include "compiler/analyze/layout.h"
#include "compiler/analyze/memory_check.h"
#include "compiler/analyze/partition.h"
#include "compiler/analyze/topology.h"

namespace paraplan {

void RunAnalysisChecks(const Plan& plan, DiagnosticSink& sink) {
  // Rank layout and topology (P0604, P0605).
  std::string error;
  if (auto layout = BuildLayout(plan, &error)) {
    RunTopologyChecks(plan, *layout, AnalyzeTopology(*layout), sink);
  } else {
    sink.Report(
        Diag(DiagKind::kRankLayoutInvalid, error)
            .At(plan.Range(fields::kParallelOrder))
            .Note(
                "ranks are numbered as Megatron-Core's RankGenerator does: the order string lists "
                "the axes from the fastest-varying to the slowest")
            .Help("use `parallel.order = \"tp-cp-ep-dp-pp\"` (the default) or \"tp-cp-ep-pp-dp\""));
  }
  // Pipeline partition (P0601-P0603).
  BuildPartition(plan, &sink);
  // Memory per pipeline stage (P0701, P0702).
  CheckMemory(plan, sink);
}

}  // namespace paraplan
