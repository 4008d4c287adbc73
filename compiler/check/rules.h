// The parallel-configuration rules (Megatron-Core's, plus the ones Megatron lacks), run on a
// resolved Plan. Each rule reports a registered diagnostic kind with labels on every field it
// read (Plan::Origin), the evaluated numbers, a note with the rule and helps with verified
// fixes. Each rule checks one kind; the runner skips a rule when a field it reads is listed in
// Plan::poisoned, so one bad value yields one error (rule_support.h).
//
// Called by the frontend after evaluation (planc check, explain, compile) and by search for
// every candidate, so it must stay cheap: no I/O, few allocations on the success path.
#ifndef PARAPLAN_COMPILER_CHECK_RULES_H_
#define PARAPLAN_COMPILER_CHECK_RULES_H_

#include "compiler/diagnostics/diagnostic.h"
#include "compiler/plan/plan.h"

namespace paraplan {

struct RuleOptions {
  // Search for verified fixes (helps) when a rule fails. Each candidate fix re-runs the rules on
  // a changed copy of the plan, which costs microseconds to a millisecond per failing rule;
  // `planc search` screening thousands of candidates can turn it off and keep only the verdicts.
  bool helps = true;
};

void CheckPlanRules(const Plan& plan, DiagnosticSink& sink);
void CheckPlanRules(const Plan& plan, DiagnosticSink& sink, const RuleOptions& options);

}  // namespace paraplan

#endif  // PARAPLAN_COMPILER_CHECK_RULES_H_
