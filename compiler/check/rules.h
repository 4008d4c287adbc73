// The parallel-configuration rules (Megatron-Core's, plus the ones Megatron lacks), run on a
// resolved Plan. Each rule reports a registered diagnostic kind with labels on every field it
// read (Plan::Origin), the evaluated numbers, a note with the rule and helps with verified
// fixes. Rules skip fields listed in Plan::poisoned, so one bad value yields one error.
//
// Called by the frontend after evaluation (planc check, explain, compile) and by search for
// every candidate, so it must stay cheap: no I/O, few allocations on the success path.
#ifndef PARAPLAN_COMPILER_CHECK_RULES_H_
#define PARAPLAN_COMPILER_CHECK_RULES_H_

#include "compiler/diagnostics/diagnostic.h"
#include "compiler/plan/plan.h"

namespace paraplan {

void CheckPlanRules(const Plan& plan, DiagnosticSink& sink);

}  // namespace paraplan

#endif  // PARAPLAN_COMPILER_CHECK_RULES_H_
