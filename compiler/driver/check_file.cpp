#include "compiler/driver/check_file.h"

#include "compiler/analyze/checks.h"
#include "compiler/ast/ast.h"

namespace paraplan {

std::optional<CheckDump> ParseCheckDump(std::string_view text) {
  if (text == "ast") return CheckDump::kAst;
  if (text == "plan") return CheckDump::kPlan;
  return std::nullopt;
}

CheckResult CheckFile(const FrontendOptions& opts, CheckDump dump, SourceManager& sm,
                      DiagnosticSink& sink) {
  CheckResult result;
  auto variants = PlanVariants::Load(opts, sm, sink);
  if (!variants) return result;
  if (dump == CheckDump::kAst) {
    const ast::Module& module = variants->source().main_module();
    result.internal_errors = ast::VerifyAst(module);
    if (result.internal_errors.empty()) result.dump = ast::PrintAst(module, &sm);
  }
  result.plan = variants->Check({}, sink);
  if (!result.plan) return result;
  RunAnalysisChecks(*result.plan, sink);
  if (dump == CheckDump::kPlan && !sink.has_errors()) {
    result.internal_errors = VerifyPlan(*result.plan);
    if (result.internal_errors.empty()) result.dump = PrintPlan(*result.plan);
  }
  return result;
}

}  // namespace paraplan
