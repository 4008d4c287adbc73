#include "bench/calibration/memory_points.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <initializer_list>
#include <map>
#include <optional>

#include "bench/calibration/error_stats.h"
#include "compiler/analyze/cost_framework.h"
#include "compiler/analyze/memory.h"
#include "compiler/driver/frontend.h"

namespace paraplan::calibration {
namespace {

using llvm::json::Object;

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

struct Point {
  std::string id, what, framework;
  double measured = 0, predicted = 0, loso = 0;  // GiB; percent for Figure 7's ratios
};

// The stacks whose allocator margin is fitted, each on the measured peaks of one source
// (cost_framework.cpp). Left out, the stack falls back to the unfitted default.
struct MarginFit {
  Framework stack;
  const char* source;
};
constexpr MarginFit kMarginFits[] = {{Framework::kTorchtitan, "torchtitan"}};

// `options` for pricing a point of `source` with that source left out of the fit: the plan's
// stack keeps its other numbers, its allocator margin goes back to the default.
CostOptions LeftOut(const Plan& plan, const CostOptions& options, const std::string& source,
                    FrameworkProfile& storage) {
  for (const MarginFit& fit : kMarginFits) {
    if (plan.framework != fit.stack || source != fit.source) continue;
    storage = ProfileFor(ToString(plan.framework), plan.cluster.gpu);
    storage.allocator_margin_percent = FrameworkProfile{}.allocator_margin_percent;
    CostOptions o = options;
    o.profile = &storage;
    return o;
  }
  return options;
}

std::optional<Plan> LoadReference(const std::string& dir, const std::string& file,
                                  const std::string& name) {
  FrontendOptions opts;
  opts.file = dir + "/" + file;
  opts.plan_name = name;
  SourceManager sm;
  DiagnosticSink sink;
  std::optional<Plan> plan = LoadPlan(opts, sm, sink);
  for (const Diagnostic& d : sink.diagnostics())
    if (d.level == DiagLevel::kError) plan.reset();
  if (!plan)
    std::fprintf(stderr, "paraplan_calibrate: plan %s in %s does not load\n", name.c_str(),
                 opts.file.c_str());
  return plan;
}

double PartsGiB(const StageMemory& s, std::initializer_list<MemoryPart> parts) {
  int64_t bytes = 0;
  for (MemoryPart part : parts) bytes += s.bytes[static_cast<size_t>(part)];
  return static_cast<double>(bytes) / kGiB;
}

double ActivationsGiB(const Plan& plan) {
  const MemoryEstimate est = EstimateMemory(plan);
  return est.valid ? PartsGiB(est.stages.front(), {MemoryPart::kActivations}) : 0;
}

std::string Name(const Plan& plan) { return std::string(ToString(plan.framework)); }

// A point priced identically with its source left out (nothing fitted on it).
Point Fixed(std::string id, std::string what, const Plan& plan, double measured, double predicted) {
  return {std::move(id), std::move(what), Name(plan), measured, predicted, predicted};
}

// Korthikanti Figure 1: the first stage's activations without recompute (TP only) and with
// SP + selective recompute, and the weights with optimizer state of a stage that holds no
// embedding (the figure counts the transformer layers only; 22B has one stage, embedding in).
bool Figure1(const Object& ref, const std::string& id, const std::string& dir,
             std::vector<Point>& out) {
  const std::string size = id.substr(id.rfind('-') + 1);
  const std::optional<Plan> tp = LoadReference(dir, "korthikanti.plan", "fig1_" + size + "_tp");
  const std::optional<Plan> sel =
      LoadReference(dir, "korthikanti.plan", "fig1_" + size + "_sp_selective");
  if (!tp || !sel) return false;
  if (const Object* acts = ref.getObject("activations_gib")) {
    if (auto v = acts->getNumber("tp_only_no_recompute"))
      out.push_back(Fixed(id, "activations, TP only", *tp, *v, ActivationsGiB(*tp)));
    if (auto v = acts->getNumber("tp_sp_selective_recompute"))
      out.push_back(Fixed(id, "activations, TP+SP+selective", *sel, *v, ActivationsGiB(*sel)));
  }
  if (auto v = ref.getNumber("weights_plus_optimizer_gib")) {
    const MemoryEstimate est = EstimateMemory(*tp);
    if (!est.valid) return false;
    const StageMemory& s = est.stages[est.stages.size() > 2 ? 1 : 0];
    out.push_back(
        Fixed(id, "weights+grads+optimizer", *tp, *v,
              PartsGiB(s, {MemoryPart::kWeights, MemoryPart::kGradients, MemoryPart::kOptimizer})));
  }
  return true;
}

// Korthikanti Figure 7: activations under each technique as a percentage of TP only.
bool Figure7(const Object& ref, const std::string& id, const std::string& dir,
             std::vector<Point>& out) {
  const std::string size = id.substr(id.rfind('-') + 1);
  const std::optional<Plan> tp = LoadReference(dir, "korthikanti.plan", "fig1_" + size + "_tp");
  const Object* pct = ref.getObject("activation_pct_of_tp_baseline");
  if (!tp || !pct) return false;
  const double base = ActivationsGiB(*tp);
  struct Variant {
    const char* key;
    bool sp;
    Recompute recompute;
  };
  for (const Variant& v : {Variant{"sequence_parallel", true, Recompute::kNone},
                           Variant{"selective_recompute", false, Recompute::kSelective},
                           Variant{"sp_plus_selective", true, Recompute::kSelective},
                           Variant{"full_recompute", false, Recompute::kFull}}) {
    const auto measured = pct->getNumber(v.key);
    if (!measured || base <= 0) continue;
    Plan plan = *tp;
    plan.parallel.sp = v.sp;
    plan.recompute = v.recompute;
    out.push_back(Fixed(id, std::string("% of TP only: ") + v.key, plan, *measured,
                        100 * ActivationsGiB(plan) / base));
  }
  return true;
}

// Megatron-Bridge's memory estimator README: the allocated peak of a 4-layer MoE on one node.
bool MbridgeMeasured(const Object& ref, const std::string& id, const std::string& dir,
                     std::vector<Point>& out) {
  std::string name = "mbridge_" + id.substr(id.find("-4l-") + 4);
  std::replace(name.begin(), name.end(), '-', '_');
  const std::optional<Plan> plan = LoadReference(dir, "measured.plan", name);
  const Object* values = ref.getObject("values_gb");
  if (!plan || !values) return false;
  const auto allocated = values->getNumber("allocated");
  if (!allocated) return true;
  out.push_back(
      Fixed(id, "allocated peak", *plan, *allocated * 1e9 / kGiB, AllocatorPeakGiB(*plan, {})));
  return true;
}

double Err(double predicted, double measured) { return predicted / measured - 1; }

void PrintPoints(const std::vector<Point>& points) {
  std::printf(
      "\nmemory: predicted vs published (GiB; Figure 7 in %% of the TP-only activations)\n"
      "%-44s %-33s %-17s %9s %9s %7s %7s\n",
      "point", "what", "framework", "published", "predicted", "error", "LOSO");
  for (const Point& p : points)
    std::printf("%-44s %-33s %-17s %9.2f %9.2f %+6.1f%% %+6.1f%%\n", p.id.c_str(), p.what.c_str(),
                p.framework.c_str(), p.measured, p.predicted, 100 * Err(p.predicted, p.measured),
                100 * Err(p.loso, p.measured));
}

void PrintSpreads(const std::vector<Point>& points) {
  std::map<std::string, std::pair<std::vector<double>, std::vector<double>>> per_framework;
  std::vector<double> all_in, all_lo;
  for (const Point& p : points) {
    auto& [in, lo] = per_framework[p.framework];
    in.push_back(Err(p.predicted, p.measured));
    lo.push_back(Err(p.loso, p.measured));
    all_in.push_back(in.back());
    all_lo.push_back(lo.back());
  }
  auto line = [](const std::string& label, const Stats& in, const Stats& lo) {
    std::printf("  %-26s %4zu  median %5.1f%%  p90 %5.1f%%   | LOSO median %5.1f%%  p90 %5.1f%%\n",
                label.c_str(), in.n, 100 * in.median, 100 * in.p90, 100 * lo.median, 100 * lo.p90);
  };
  std::printf("memory per framework (|error|, in-sample | leave-one-source-out):\n");
  for (const auto& [name, errors] : per_framework)
    line(name, Summarize(errors.first), Summarize(errors.second));
  line("all memory points", Summarize(all_in), Summarize(all_lo));
}

}  // namespace

double AllocatorPeakGiB(const Plan& plan, const CostOptions& options) {
  int64_t peak = 0;
  for (const StagePeak& s : PredictedPeaks(plan, options))
    peak = std::max(peak, s.allocator > 0 ? s.allocator : s.device);
  return static_cast<double>(peak) / kGiB;
}

bool PrintMemoryReport(const Object& root, const std::vector<MeasuredPeak>& peaks,
                       const std::string& plans_dir) {
  std::vector<Point> points;
  for (const MeasuredPeak& run : peaks) {
    FrameworkProfile storage;
    const CostOptions loso = LeftOut(run.plan, run.options, run.source, storage);
    points.push_back({run.id, "peak (max reserved)", Name(run.plan), run.measured_gib,
                      AllocatorPeakGiB(run.plan, run.options), AllocatorPeakGiB(run.plan, loso)});
  }
  if (const llvm::json::Array* refs = root.getArray("memory_references")) {
    for (const llvm::json::Value& value : *refs) {
      const Object* ref = value.getAsObject();
      const auto id = ref ? ref->getString("id") : llvm::None;
      if (!ref || !id) continue;
      const std::string name = id->str();
      bool ok = true;
      auto starts = [&name](const char* prefix) { return name.rfind(prefix, 0) == 0; };
      if (starts("korthikanti22-fig1-"))
        ok = Figure1(*ref, name, plans_dir, points);
      else if (starts("korthikanti22-fig7-"))
        ok = Figure7(*ref, name, plans_dir, points);
      else if (starts("mbridge-memest-"))
        ok = MbridgeMeasured(*ref, name, plans_dir, points);
      else
        std::printf("memory reference %s: no plan prices it\n", name.c_str());
      if (!ok) return false;
    }
  }
  PrintPoints(points);
  PrintSpreads(points);
  return true;
}

}  // namespace paraplan::calibration
