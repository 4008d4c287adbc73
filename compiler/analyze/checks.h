// Diagnostics that need the analysis (rank layout and topology, the pipeline partition,
// memory), run by `planc check` after the rules pass, and by search for every candidate.
// Each analysis adds its own call inside RunAnalysisChecks.
#ifndef PARAPLAN_COMPILER_ANALYZE_CHECKS_H_
#define PARAPLAN_COMPILER_ANALYZE_CHECKS_H_

#include "compiler/diagnostics/diagnostic.h"
#include "compiler/plan/plan.h"

namespace paraplan {

void RunAnalysisChecks(const Plan& plan, DiagnosticSink& sink);

}  // namespace paraplan

#endif  // PARAPLAN_COMPILER_ANALYZE_CHECKS_H_
