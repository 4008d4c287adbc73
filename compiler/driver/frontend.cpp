#include "compiler/driver/frontend.h"

#include <cstdlib>

#include "compiler/check/rules.h"
#include "compiler/driver/import_args.h"

#ifndef PARAPLAN_STDLIB_DIR
#define PARAPLAN_STDLIB_DIR "stdlib"
#endif

namespace paraplan {

bool ParseFrontendArgs(const std::vector<std::string>& args, FrontendOptions* opts,
                       std::vector<std::string>* rest, std::string* error) {
  ImportArgs import;
  bool empty_path = false;  // an empty argument where the file belongs
  auto value_of = [&](size_t& i, std::string_view flag, std::string* out) -> bool {
    const std::string& a = args[i];
    if (a.size() > flag.size() && a.compare(0, flag.size(), flag) == 0 && a[flag.size()] == '=') {
      *out = a.substr(flag.size() + 1);
      return true;
    }
    if (i + 1 >= args.size()) {
      *error = std::string(flag) + " needs a value";
      return false;
    }
    *out = args[++i];
    return true;
  };
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto is = [&](std::string_view flag) {
      return a == flag || (a.size() > flag.size() && a.compare(0, flag.size(), flag) == 0 &&
                           a[flag.size()] == '=');
    };
    if (is("--plan")) {
      if (!value_of(i, "--plan", &opts->plan_name)) return false;
      if (opts->plan_name.empty()) {
        *error = "--plan needs a plan name";
        return false;
      }
    } else if (is("--set")) {
      std::string set;
      if (!value_of(i, "--set", &set)) return false;
      if (set.find('=') == std::string::npos) {
        *error = "--set takes PATH=VALUE (e.g. --set parallel.tp=4), got '" + set + "'";
        return false;
      }
      opts->sets.push_back(std::move(set));
    } else if (int taken = TakeImportArg(args, i, &import, error); taken != 0) {
      if (taken < 0) return false;
    } else if (a == "-I") {
      if (i + 1 >= args.size()) {
        *error = "-I needs a directory";
        return false;
      }
      opts->include_dirs.push_back(args[++i]);
    } else if (a.size() > 2 && a.compare(0, 2, "-I") == 0) {
      opts->include_dirs.push_back(a.substr(2));
    } else if (a.empty() && opts->file.empty()) {
      empty_path = true;
    } else if (!a.empty() && a[0] != '-' && opts->file.empty()) {
      opts->file = a;
    } else {
      rest->push_back(a);
    }
  }
  if (opts->file.empty() || empty_path) {
    const std::string what = import.kind ? "configuration file" : "plan file";
    *error = empty_path ? "the " + what + " path is empty" : "no " + what + " given";
    return false;
  }
  if (!import.kind &&
      (import.options.nodes || import.options.gpus_per_node || !import.options.gpu.empty())) {
    *error = "--nodes, --gpus-per-node and --gpu go with --from=KIND";
    return false;
  }
  opts->from = import.kind;
  opts->import = import.options;
  return true;
}

std::string StdlibDir() {
  if (const char* env = std::getenv("PARAPLAN_STDLIB"); env && *env) return env;
  return PARAPLAN_STDLIB_DIR;
}

std::unique_ptr<PlanVariants> PlanVariants::Load(const FrontendOptions& opts, SourceManager& sm,
                                                 DiagnosticSink& sink) {
  LoadOptions load;
  load.stdlib_dir = StdlibDir();
  load.include_dirs = opts.include_dirs;
  std::unique_ptr<PlanVariants> v(new PlanVariants());
  std::unique_ptr<PlanSource> source;
  if (opts.from) {
    ImportOptions import = opts.import;
    import.stdlib_dir = load.stdlib_dir;
    auto imported = ImportConfig(*opts.from, opts.file, import, sm, sink);
    if (!imported) return nullptr;
    v->imported_buffer_ = static_cast<uint32_t>(sm.BufferCount()) + 1;  // FromText adds it next
    source = PlanSource::FromText(opts.file + " (as a plan)", imported->text, load, sm, sink);
    v->imported_ = std::move(imported);
  } else {
    source = PlanSource::Load(opts.file, load, sm, sink);
  }
  if (!source) return nullptr;
  v->opts_ = opts;
  v->sm_ = &sm;
  v->source_ = std::move(source);
  auto sets = v->ParseSets(opts.sets, sink);
  if (!sets) return nullptr;
  v->base_sets_ = std::move(*sets);
  return v;
}

std::optional<std::vector<SetOverride>> PlanVariants::ParseSets(
    const std::vector<std::string>& sets, DiagnosticSink& sink) {
  std::vector<SetOverride> out;
  bool ok = true;
  for (const std::string& s : sets) {
    auto o = source_->ParseSet(s, *sm_, sink);
    if (o) {
      out.push_back(*o);
    } else {
      ok = false;
    }
  }
  if (!ok) return std::nullopt;
  return out;
}

std::optional<Plan> PlanVariants::Check(const std::vector<SetOverride>& extra, DiagnosticSink& sink,
                                        bool run_rules) const {
  EvalOptions eval;
  eval.allow_sweeps = opts_.allow_sweeps;
  // An imported configuration: diagnostics are collected here and moved into the user's file.
  DiagnosticSink local;
  DiagnosticSink& out = imported_ ? local : sink;
  const int errors_before = sink.error_count();
  std::optional<Plan> plan;
  if (extra.empty()) {
    plan = source_->Evaluate(opts_.plan_name, base_sets_, eval, out);
  } else {
    std::vector<SetOverride> all = base_sets_;
    all.insert(all.end(), extra.begin(), extra.end());
    plan = source_->Evaluate(opts_.plan_name, all, eval, out);
  }
  if (plan && imported_) ApplyImportedOrigins(*imported_, imported_buffer_, *sm_, *plan);
  if (plan && run_rules) CheckPlanRules(*plan, out);
  if (imported_) {
    for (const Diagnostic& d : local.diagnostics()) {
      sink.Report(RemapImportedDiagnostic(*imported_, imported_buffer_, *sm_, d));
    }
  }
  if (!plan) return std::nullopt;
  if (sink.error_count() > errors_before) return std::nullopt;
  return plan;
}

std::optional<Plan> LoadPlan(const FrontendOptions& opts, SourceManager& sm, DiagnosticSink& sink) {
  auto variants = PlanVariants::Load(opts, sm, sink);
  if (!variants) return std::nullopt;
  return variants->Check({}, sink);
}

}  // namespace paraplan
