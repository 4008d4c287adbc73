// The front end every planc subcommand shares: command-line options for a plan, then read,
// parse and evaluate the plan (imports, derivation, --set, auto, require) and run the
// parallel-configuration rules (CheckPlanRules). The result is the checked Plan that analyze/,
// search/ and lower/ read.
//
// Two ways in:
//   * LoadPlan: one file, one plan, one set of --set overrides (planc check/explain/compile).
//   * PlanVariants: parse once, then check many variants, each with its own overrides, fast
//     (planc search, bench/check). Each variant is evaluated from the parsed source, so `auto`,
//     defaults such as etp = tp and every `require` are re-derived for it.
#ifndef PARAPLAN_COMPILER_DRIVER_FRONTEND_H_
#define PARAPLAN_COMPILER_DRIVER_FRONTEND_H_

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "compiler/check/evaluate.h"
#include "compiler/diagnostics/diagnostic.h"
#include "compiler/interop/interop.h"
#include "compiler/plan/plan.h"
#include "compiler/source/source.h"

namespace paraplan {

struct FrontendOptions {
  std::string file;
  std::string plan_name;                  // --plan NAME; empty: the file's only (or last) plan
  std::vector<std::string> sets;          // --set PATH=VALUE, in order
  std::vector<std::string> include_dirs;  // -I DIR
  bool allow_sweeps = false;  // planc search: list-valued / auto axes become Plan::sweeps
  // --from=KIND: `file` is a framework configuration, imported (compiler/interop) and checked
  // as the plan it describes; diagnostics point into the configuration.
  std::optional<ConfigKind> from;
  ImportOptions import;  // --nodes, --gpus-per-node, --gpu with --from
};

// Takes FILE, --plan NAME (also --plan=NAME), --set PATH=VALUE (repeatable, also
// --set=PATH=VALUE), -I DIR (also -IDIR), --from=KIND with --nodes/--gpus-per-node/--gpu out of
// `args`; everything else is returned in *rest in
// its original order. false and *error on bad usage (no FILE, two FILEs, an option without its
// value, --set without '=').
bool ParseFrontendArgs(const std::vector<std::string>& args, FrontendOptions* opts,
                       std::vector<std::string>* rest, std::string* error);

// The stdlib directory compiled into planc (PARAPLAN_STDLIB_DIR); the environment variable
// PARAPLAN_STDLIB overrides it.
std::string StdlibDir();

// Read + parse + evaluate + CheckPlanRules. nullopt when any error was reported (warnings
// allowed). Without allow_sweeps a sweep is an error pointing at it.
std::optional<Plan> LoadPlan(const FrontendOptions& opts, SourceManager& sm, DiagnosticSink& sink);

// Parse once, check many variants.
//
//   SourceManager sm; DiagnosticSink sink;
//   auto variants = PlanVariants::Load(opts, sm, sink);     // parses opts.file and opts.sets
//   auto v = variants->ParseSets({"parallel.tp=4", "cluster.nodes=16"}, sink);
//   std::optional<Plan> plan = variants->Check(*v, sink);   // evaluate + CheckPlanRules
//
// ParseSets adds one "<command line>" buffer per override to `sm`; parse a set list once and
// reuse it when the same variant is checked again.
class PlanVariants {
 public:
  static std::unique_ptr<PlanVariants> Load(const FrontendOptions& opts, SourceManager& sm,
                                            DiagnosticSink& sink);

  // nullopt (with diagnostics) when an override does not parse.
  std::optional<std::vector<SetOverride>> ParseSets(const std::vector<std::string>& sets,
                                                    DiagnosticSink& sink);

  // The plan with opts.sets followed by `extra` applied; nullopt when any error was reported.
  // With run_rules = false only evaluation runs (no CheckPlanRules).
  std::optional<Plan> Check(const std::vector<SetOverride>& extra, DiagnosticSink& sink,
                            bool run_rules = true) const;

  const PlanSource& source() const { return *source_; }
  const FrontendOptions& options() const { return opts_; }

 private:
  PlanVariants() = default;
  FrontendOptions opts_;
  SourceManager* sm_ = nullptr;
  std::unique_ptr<PlanSource> source_;
  std::vector<SetOverride> base_sets_;
  // With --from: the imported plan and the buffer its text was loaded into.
  std::optional<ImportedPlan> imported_;
  uint32_t imported_buffer_ = 0;
};

}  // namespace paraplan

#endif  // PARAPLAN_COMPILER_DRIVER_FRONTEND_H_
