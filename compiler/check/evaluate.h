// Evaluation of plan files: from parsed modules to a resolved Plan.
//
// A PlanSource is a plan file parsed once together with everything it imports (stdlib modules,
// -I directories, relative files). It is immutable after Load, so one PlanSource can evaluate
// many variants of a plan, each with its own `--set` overrides, cheaply: this is what
// `planc search` and bench/check use. Evaluate() resolves imports, derivation (`extends`,
// `base { ... }`), nested blocks, `let`, field references, units, defaults (etp = tp,
// kv_heads = heads, head_dim = hidden / heads, ...), `auto` (dp = world / (tp·pp·cp)) and
// `require`, and fills Plan::origins for every canonical path. It does not run the
// parallel-configuration rules (CheckPlanRules in rules.h); the driver's LoadPlan does both.
//
// Made by the driver (compiler/driver/frontend.h) and by search; reads AST from parse/.
// Diagnostics go to the sink; checking continues after an error and failed values are
// poisoned (Plan::poisoned) so that later rules stay quiet about them.
#ifndef PARAPLAN_COMPILER_CHECK_EVALUATE_H_
#define PARAPLAN_COMPILER_CHECK_EVALUATE_H_

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "compiler/diagnostics/diagnostic.h"
#include "compiler/plan/plan.h"
#include "compiler/source/source.h"

namespace paraplan {

namespace ast {
struct Member;
struct Module;
}  // namespace ast

struct LoadOptions {
  // Root of the standard library: `import std.models.llama` reads <stdlib_dir>/models/llama.plan.
  std::string stdlib_dir;
  // -I DIR: `import foo.bar` reads <dir>/foo/bar.plan from the first directory that has it.
  std::vector<std::string> include_dirs;
};

struct EvalOptions {
  // Search mode: a list-valued axis field (`tp = [1, 2, 4]`) or `auto` on an axis other than dp
  // becomes a Plan::sweeps entry (the field takes the first value) instead of an error.
  bool allow_sweeps = false;
};

// One `--set PATH=VALUE`, parsed into its own "<command line>" buffer. Owned by the PlanSource
// that parsed it; cheap to copy.
struct SetOverride {
  std::string path;  // "parallel.tp"
  const ast::Member* member = nullptr;
  SourceRange range;  // the whole "PATH=VALUE" text
};

class PlanSource {
 public:
  ~PlanSource();
  PlanSource(const PlanSource&) = delete;
  PlanSource& operator=(const PlanSource&) = delete;

  // Reads and parses `file` and its imports. nullptr when the file cannot be read or parsed
  // (diagnostics reported). Import errors are reported here too.
  static std::unique_ptr<PlanSource> Load(const std::string& file, const LoadOptions& options,
                                          SourceManager& sm, DiagnosticSink& sink);
  // The same for a text held in memory (tests, fuzzing, bench); `name` names the buffer.
  static std::unique_ptr<PlanSource> FromText(std::string name, std::string text,
                                              const LoadOptions& options, SourceManager& sm,
                                              DiagnosticSink& sink);

  // Parses "PATH=VALUE" (the value is an expression of the language) into a new
  // "<command line>" buffer. nullopt, with a diagnostic, when it does not parse.
  std::optional<SetOverride> ParseSet(std::string_view text, SourceManager& sm,
                                      DiagnosticSink& sink);

  // Names of the plans declared in the main file, in order.
  std::vector<std::string> PlanNames() const;

  // Evaluates plan `plan_name` (empty: the last plan declared in the main file; an error
  // when the file declares none) with the overrides applied in order, as
  // if written at the end of the plan. Returns the plan even when errors were reported (failed
  // fields are listed in Plan::poisoned, so the rules can still run without cascades);
  // nullopt only when there is no plan to evaluate (none declared, --plan names none).
  std::optional<Plan> Evaluate(std::string_view plan_name, std::span<const SetOverride> sets,
                               const EvalOptions& options, DiagnosticSink& sink) const;

  const SourceManager& source_manager() const { return sm_; }
  // The parsed main file (what `planc check --dump=ast` prints).
  const ast::Module& main_module() const;

  friend int EvaluateAllRecords(const PlanSource& source, DiagnosticSink& sink);

 private:
  explicit PlanSource(SourceManager& sm);
  SourceManager& sm_;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Every record declared in a module and the modules it imports, each evaluated on its own
// (requires run, fields resolved, no plan rules); reports errors in any of them. Used by the
// stdlib test. Returns the number of records evaluated.
int EvaluateAllRecords(const PlanSource& source, DiagnosticSink& sink);

}  // namespace paraplan

#endif  // PARAPLAN_COMPILER_CHECK_EVALUATE_H_
