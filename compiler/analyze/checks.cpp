#include "compiler/analyze/checks.h"

namespace paraplan {

void RunAnalysisChecks(const Plan& plan, DiagnosticSink& sink) {}

}  // namespace paraplan
