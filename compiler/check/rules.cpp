#include "compiler/check/rules.h"

#include "compiler/check/rule_support.h"

namespace paraplan {
namespace rules {

// The order is the order a Megatron user meets the failures in: model shape and mesh first,
// then the pipeline split, then batch, optimizer and precision.
const std::vector<Rule>& AllRules() {
  static const std::vector<Rule> kAll = [] {
    std::vector<Rule> out;
    for (const std::vector<Rule>* topic : {&MeshRules(), &PipelineRules(), &TrainRules()}) {
      out.insert(out.end(), topic->begin(), topic->end());
    }
    return out;
  }();
  return kAll;
}

void RunAllRules(RuleContext& ctx) {
  bool split_reported = false;
  for (const Rule& rule : AllRules()) {
    if (rule.chain == RuleChain::kPipelineSplit && split_reported) continue;
    if (ctx.Poisoned(rule.inputs)) continue;
    const bool reported = rule.check(ctx);
    if (rule.chain == RuleChain::kPipelineSplit) split_reported = split_reported || reported;
  }
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
