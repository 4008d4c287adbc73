#include "compiler/check/rules.h"

#include "compiler/check/rule_support.h"

namespace paraplan {
namespace rules {

// The order is the order a Megatron user meets the failures in: model shape and mesh first,
// then the pipeline split, then batch, optimizer and precision.
void RunAllRules(RuleContext& ctx) {
  CheckMesh(ctx);
  CheckPipeline(ctx);
  CheckTrain(ctx);
}

}  // namespace rules

void CheckPlanRules(const Plan& plan, DiagnosticSink& sink) {
  CheckPlanRules(plan, sink, RuleOptions{});
}

void CheckPlanRules(const Plan& plan, DiagnosticSink& sink, const RuleOptions& options) {
  rules::RuleContext ctx(plan, sink, options.helps);
  rules::RunAllRules(ctx);
}

}  // namespace paraplan
