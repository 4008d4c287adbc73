#include "compiler/check/rules.h"

namespace paraplan {

// The rule catalogue lands in check_mesh.cpp, check_pipeline.cpp and check_train.cpp.
void CheckPlanRules(const Plan& plan, DiagnosticSink& sink) {}

}  // namespace paraplan
