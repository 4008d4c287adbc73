// Predicted vs published throughput for every run in runs.json (bench/calibration/README.md).
//
// One set of options for all rows (the 2021-22 Megatron-LM software: no fused attention,
// dropout on, fp16, no DP/TP overlap) and the GPU's single efficiency set (EfficiencyFor).
// Fields a source does not state (micro batch, interleaving degree) are chosen by the model
// itself: the fastest predicted setting that fits in memory, as the authors tuned theirs.
// Usage: paraplan_calibrate [runs.json] [--csv] [--verbose]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "compiler/analyze/cost_params.h"
#include "compiler/analyze/memory.h"
#include "compiler/analyze/time.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/MemoryBuffer.h"

namespace {

using namespace paraplan;

constexpr int64_t kGiB = int64_t{1} << 30;

CostOptions Megatron2021() {
  CostOptions o;
  o.flash_attention = false;
  o.dropout = true;
  o.overlap_grad_reduce = false;
  o.overlap_param_gather = false;
  o.tp_comm_overlap = false;
  return o;
}

ClusterSpec DgxA100(int64_t gpus) {
  ClusterSpec c;
  c.name = "dgx_a100";
  c.gpu = {"a100_sxm4_80gb", 80 * kGiB, 312e12, 312e12, 0, 2.039e12};
  c.gpus_per_node = 8;
  c.nodes = (gpus + 7) / 8;
  c.nvlink_bandwidth = 300e9;   // NVLink3 per direction
  c.network_bandwidth = 25e9;   // one 200 Gb/s HDR HCA per GPU
  return c;
}

struct Row {
  std::string id, metric;
  double published = 0, predicted = 0;
  int64_t micro = 0, vpp = 0;
  double peak_gib = 0, step_s = 0, tokens_per_gpu = 0, mfu = 0;
  std::string breakdown;
  bool fits = false;
};

struct Summary {
  double median = 0, worst = 0;
};

// Korthikanti eq. 7 model FLOPs per token (full attention, no recompute).
double Eq7FlopsPerToken(const ModelSpec& m) {
  const double h = m.hidden, s = m.seq_len, L = m.layers, V = m.vocab;
  return 72 * L * h * h * (1 + s / (6 * h) + V / (12 * h * L));
}

int64_t GetInt(const llvm::json::Object& o, llvm::StringRef key, int64_t fallback = 0) {
  if (auto v = o.getInteger(key)) return *v;
  return fallback;
}

struct Input {
  Plan plan;
  std::string metric;
  double published = 0;
  std::vector<int64_t> micros, vpps;
};

std::vector<Row> Evaluate(const std::vector<Input>& inputs, const CostOptions& options) {
  std::vector<Row> rows;
  for (const Input& in : inputs) {
    const Plan& plan = in.plan;
    const ModelSpec& m = plan.model;
    const int64_t gpus = plan.World();
    Row row;
    row.id = plan.name;
    row.metric = in.metric;
    row.published = in.published;
    const auto& micros = in.micros;
    const auto& vpps = in.vpps;
    double best = 1e300;
    for (int64_t micro : micros) {
      if (plan.batch.global % (micro * plan.parallel.dp) != 0) continue;
      for (int64_t v : vpps) {
        Plan candidate = plan;
        candidate.batch.micro = micro;
        candidate.parallel.vpp = v;
        candidate.pipeline.schedule = v > 1 ? Schedule::kInterleaved1F1B : Schedule::k1F1B;
        const int64_t mbs = candidate.batch.global / (micro * candidate.parallel.dp);
        if (v > 1 && mbs % candidate.parallel.pp != 0) continue;
        const MemoryEstimate mem = EstimateMemory(candidate, options);
        const TimeEstimate time = EstimateTime(candidate, options);
        if (!mem.valid || !time.valid) continue;
        const bool fits = mem.peak <= mem.capacity;
        // Prefer plans that fit; among them the fastest.
        const double key = time.step_s + (fits ? 0 : 1e6);
        if (key < best) {
          best = key;
          row.micro = micro;
          row.vpp = v;
          row.fits = fits;
          row.peak_gib = static_cast<double>(mem.peak) / kGiB;
          row.step_s = time.step_s;
          row.tokens_per_gpu = time.tokens_per_s_per_gpu;
          row.breakdown = PrintTime(time);
          row.mfu = static_cast<double>(candidate.batch.global) * m.seq_len * Eq7FlopsPerToken(m) /
                    (time.step_s * gpus * 312e12);
        }
      }
    }
    if (row.metric == "tokens_per_s_per_gpu") row.predicted = row.tokens_per_gpu;
    else if (row.metric == "step_s") row.predicted = row.step_s;
    else row.predicted = row.mfu;
    rows.push_back(row);
  }
  return rows;
}

Summary Summarize(const std::vector<Row>& rows) {
  Summary s;
  std::vector<double> e;
  for (const Row& r : rows) e.push_back(r.published > 0 ? std::fabs(r.predicted - r.published) / r.published : 1);
  std::sort(e.begin(), e.end());
  const size_t n = e.size();
  s.median = n == 0 ? 0 : (n % 2 ? e[n / 2] : (e[n / 2 - 1] + e[n / 2]) / 2);
  s.worst = n == 0 ? 0 : e.back();
  return s;
}

// Coarse grid over the Ampere set; prints the best median error (ties: the smaller maximum).
void Fit(const std::vector<Input>& inputs, CostOptions options) {
  GpuEfficiency eff = EfficiencyFor(inputs.front().plan.cluster.gpu);
  GpuEfficiency best = eff;
  Summary best_s{1e9, 1e9};
  for (double gmax : {0.78, 0.80, 0.82, 0.84, 0.86, 0.90})
    for (double ghalf : {0.5e9, 1e9, 2e9, 4e9, 8e9})
      for (double passes : {1.0, 1.5, 2.0, 3.0, 4.0})
        for (double net : {0.4, 0.5, 0.6, 0.7, 0.85})
          for (double lat : {20e-6, 0.5e-3, 1e-3, 1.5e-3, 2e-3, 3e-3, 4e-3}) {
            eff.gemm_max_fraction = gmax;
            eff.gemm_half_flops = ghalf;
            eff.elementwise_passes = passes;
            eff.network_bus_fraction = net;
            eff.p2p_latency_s = lat;
            options.efficiency = &eff;
            const Summary s = Summarize(Evaluate(inputs, options));
            if (s.median < best_s.median - 1e-9 || (std::fabs(s.median - best_s.median) < 1e-9 && s.worst < best_s.worst)) {
              best_s = s;
              best = eff;
            }
          }
  std::printf("best: gemm_max %.2f gemm_half %.3g passes %.1f network %.2f p2p_latency %.4g -> median %.1f%% max %.1f%%\n",
              best.gemm_max_fraction, best.gemm_half_flops, best.elementwise_passes, best.network_bus_fraction,
              best.p2p_latency_s, 100 * best_s.median, 100 * best_s.worst);
}

}  // namespace

int main(int argc, char** argv) {
  std::string path = PARAPLAN_CALIBRATION_RUNS;
  bool csv = false, verbose = false, fit = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--csv") csv = true;
    else if (a == "--verbose") verbose = true;
    else if (a == "--fit") fit = true;
    else path = a;
  }
  auto buffer = llvm::MemoryBuffer::getFile(path);
  if (!buffer) {
    std::fprintf(stderr, "paraplan_calibrate: cannot read %s\n", path.c_str());
    return 2;
  }
  auto parsed = llvm::json::parse((*buffer)->getBuffer());
  if (!parsed) {
    std::fprintf(stderr, "paraplan_calibrate: %s: %s\n", path.c_str(),
                 llvm::toString(parsed.takeError()).c_str());
    return 2;
  }
  const llvm::json::Array* runs = parsed->getAsObject() ? parsed->getAsObject()->getArray("runs") : nullptr;
  if (!runs) {
    std::fprintf(stderr, "paraplan_calibrate: %s has no \"runs\" array\n", path.c_str());
    return 2;
  }
  std::vector<Input> inputs;
  for (const llvm::json::Value& value : *runs) {
    const llvm::json::Object* run = value.getAsObject();
    const llvm::json::Object* model = run ? run->getObject("model") : nullptr;
    const llvm::json::Object* published = run ? run->getObject("published") : nullptr;
    if (!model || !published) {
      std::fprintf(stderr, "paraplan_calibrate: a run lacks model or published\n");
      return 2;
    }
    Plan plan;
    plan.name = run->getString("id").getValueOr("").str();
    ModelSpec& m = plan.model;
    m.name = model->getString("name").getValueOr("").str();
    m.layers = GetInt(*model, "layers");
    m.hidden = GetInt(*model, "hidden");
    m.heads = GetInt(*model, "heads");
    m.kv_heads = m.heads;
    m.head_dim = m.heads ? m.hidden / m.heads : 0;
    m.ffn_hidden = GetInt(*model, "ffn_hidden");
    m.vocab = GetInt(*model, "vocab");
    m.seq_len = GetInt(*model, "seq_len");
    m.norm = Norm::kLayerNorm;
    m.activation = Activation::kGelu;
    m.position = Position::kLearned;
    m.tied_embeddings = true;
    const int64_t gpus = GetInt(*run, "gpus");
    plan.cluster = DgxA100(gpus);
    plan.precision = Precision::kFp16;
    plan.parallel.tp = GetInt(*run, "tp", 1);
    plan.parallel.etp = plan.parallel.tp;
    plan.parallel.pp = GetInt(*run, "pp", 1);
    plan.parallel.dp = GetInt(*run, "dp", 1);
    plan.parallel.sp = run->getBoolean("sp").getValueOr(false);
    const std::string recompute = run->getString("recompute").getValueOr("full").str();
    plan.recompute = recompute == "selective" ? Recompute::kSelective
                   : recompute == "none" ? Recompute::kNone : Recompute::kFull;
    plan.batch.global = GetInt(*run, "global_batch");
    // World = tp·pp·dp exactly (the 310B/530B rows do not fill whole nodes).
    plan.cluster.nodes = 1;
    plan.cluster.gpus_per_node = gpus;
    if (gpus % 8 == 0) {
      plan.cluster.nodes = gpus / 8;
      plan.cluster.gpus_per_node = 8;
    }

    Input in;
    in.plan = plan;
    in.metric = published->getString("metric").getValueOr("").str();
    in.published = published->getNumber("value").getValueOr(0);
    std::vector<int64_t> micros, vpps;
    if (auto mb = run->getInteger("micro_batch")) in.micros = {*mb};
    else in.micros = {1, 2, 4, 8};
    if (auto v = run->getInteger("vpp")) in.vpps = {*v};
    else {
      for (int64_t v = 1; v <= 8; ++v)
        if (plan.parallel.pp > 1 ? m.layers % (plan.parallel.pp * v) == 0 : v == 1) in.vpps.push_back(v);
    }
    inputs.push_back(std::move(in));
  }
  const CostOptions base = Megatron2021();
  if (fit) {
    Fit(inputs, base);
    return 0;
  }
  const std::vector<Row> rows = Evaluate(inputs, base);
  std::vector<double> errors;
  if (csv) std::printf("id,metric,published,predicted,error_pct,micro,vpp,peak_gib,fits\n");
  else
    std::printf("%-44s %-20s %10s %10s %8s %5s %4s %9s\n", "run", "metric", "published", "predicted",
                "error", "micro", "vpp", "peak GiB");
  for (const Row& r : rows) {
    const double err = r.published > 0 ? (r.predicted - r.published) / r.published : 0;
    errors.push_back(std::fabs(err));
    if (csv)
      std::printf("%s,%s,%.4g,%.4g,%.1f,%lld,%lld,%.1f,%d\n", r.id.c_str(), r.metric.c_str(), r.published,
                  r.predicted, 100 * err, (long long)r.micro, (long long)r.vpp, r.peak_gib, r.fits);
    else
      std::printf("%-44s %-20s %10.4g %10.4g %+7.1f%% %5lld %4lld %8.1f%s\n", r.id.c_str(), r.metric.c_str(),
                  r.published, r.predicted, 100 * err, (long long)r.micro, (long long)r.vpp, r.peak_gib,
                  r.fits ? "" : " (does not fit)");
    if (verbose && !csv) std::printf("    %s", r.breakdown.c_str());
  }
  std::vector<double> sorted = errors;
  std::sort(sorted.begin(), sorted.end());
  const size_t n = sorted.size();
  const double median = n == 0 ? 0 : (n % 2 ? sorted[n / 2] : (sorted[n / 2 - 1] + sorted[n / 2]) / 2);
  const double worst = n == 0 ? 0 : sorted.back();
  size_t within = 0;
  for (double e : errors) within += e <= 0.25 ? 1 : 0;
  if (!csv)
    std::printf("\n%zu runs: median |error| %.1f%%, max |error| %.1f%%, %zu within 25%%\n", n, 100 * median,
                100 * worst, within);
  return 0;
}
