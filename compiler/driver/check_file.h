// What `planc check` does before rendering: load and check one plan file, run the analysis
// checks on a plan without errors, and produce the requested dump. Shared by cmd_check.cpp and
// the file-test runner (tests/filetest), so that golden dumps are exactly what planc prints.
//
//   SourceManager sm; DiagnosticSink sink;
//   CheckResult r = CheckFile(opts, CheckDump::kAst, sm, sink);
//   // r.dump goes to stdout, the diagnostics in `sink` to stderr
#ifndef PARAPLAN_COMPILER_DRIVER_CHECK_FILE_H_
#define PARAPLAN_COMPILER_DRIVER_CHECK_FILE_H_

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "compiler/driver/frontend.h"

namespace paraplan {

// `--dump=ast|plan`.
enum class CheckDump : uint8_t { kNone, kAst, kPlan };
// "ast" → kAst, "plan" → kPlan; nullopt for anything else.
std::optional<CheckDump> ParseCheckDump(std::string_view text);

struct CheckResult {
  // The checked plan; nullopt when loading, evaluation or the plan rules reported an error (the
  // analysis checks run on it and may still report errors).
  std::optional<Plan> plan;
  // kAst: PrintAst of the main file (ranges as line:col) whenever the file and its imports
  // load, also when evaluation then reports errors. kPlan: PrintPlan of a plan without errors.
  // Empty otherwise.
  std::string dump;
  // Violations of the dumped structure's verifier (VerifyAst, VerifyPlan): a compiler bug,
  // reported as an internal error (exit 70). The dump is left empty then.
  std::vector<std::string> internal_errors;
};

CheckResult CheckFile(const FrontendOptions& opts, CheckDump dump, SourceManager& sm,
                      DiagnosticSink& sink);

}  // namespace paraplan

#endif  // PARAPLAN_COMPILER_DRIVER_CHECK_FILE_H_
