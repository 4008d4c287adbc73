// libFuzzer target for the front end: lexer, parser, AST builder and evaluator on arbitrary
// bytes. Built only with -DPARAPLAN_FUZZ=ON and clang (target `parse_fuzz`); the corpus in
// tests/fuzz/parse_corpus/ is replayed by a normal test through CheckFuzzInput.
//
// The first line of an input is also parsed as a `--set` override, so the override grammar is
// fuzzed too. Invariants checked on every input: no crash, no hang, every diagnostic points
// at a valid range (or none), and the syntax tree passes VerifyAst and prints (PrintAst).
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "compiler/ast/ast.h"
#include "compiler/check/evaluate.h"

#ifndef PARAPLAN_STDLIB_DIR
#define PARAPLAN_STDLIB_DIR "stdlib"
#endif

namespace paraplan {

// Runs the front end on one input; false when an invariant does not hold.
bool CheckFuzzInput(std::string_view text) {
  SourceManager sm;
  DiagnosticSink sink;
  LoadOptions load;
  const char* stdlib = std::getenv("PARAPLAN_STDLIB");
  load.stdlib_dir = stdlib && *stdlib ? stdlib : PARAPLAN_STDLIB_DIR;
  auto source = PlanSource::FromText("fuzz.plan", std::string(text), load, sm, sink);
  if (source) {
    if (!ast::VerifyAst(source->main_module()).empty()) return false;
    (void)ast::PrintAst(source->main_module(), &sm);
    std::vector<SetOverride> sets;
    std::string_view first_line = text.substr(0, text.find('\n'));
    if (auto o = source->ParseSet(first_line, sm, sink)) sets.push_back(*o);
    for (bool sweeps : {false, true}) {
      EvalOptions options;
      options.allow_sweeps = sweeps;
      auto plan = source->Evaluate("", sets, options, sink);
      if (plan) {
        (void)PrintPlan(*plan);
        (void)VerifyPlan(*plan);
      }
    }
    DiagnosticSink all;
    EvaluateAllRecords(*source, all);
  }
  for (const Diagnostic& d : sink.diagnostics()) {
    if (d.primary.IsValid() && !sm.IsValid(d.primary)) return false;
    for (const DiagLabel& l : d.labels) {
      if (l.range.IsValid() && !sm.IsValid(l.range)) return false;
    }
  }
  // Refused input always says why.
  if (!source && !sink.has_errors()) return false;
  return true;
}

}  // namespace paraplan

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  if (!paraplan::CheckFuzzInput(text)) __builtin_trap();
  return 0;
}
