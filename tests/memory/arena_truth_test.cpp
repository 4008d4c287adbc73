// One memory truth: for `framework = paraplan` the estimate of `planc check` (EstimateMemory)
// is planrun's static arena, so it must agree with the arena compiler/lower lays out for every
// stage, within 3%, on every example and bench plan that lowers (as written, and with the
// other recompute modes, ZeRO stages, precisions and optimizers, which change what is stashed,
// what is transient and which states are kept).
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "compiler/analyze/memory.h"
#include "compiler/driver/frontend.h"
#include "compiler/lower/lower.h"

namespace paraplan {
namespace {

std::vector<std::string> PlanFiles() {
  namespace fs = std::filesystem;
  std::vector<std::string> out;
  for (const char* dir : {"examples", "bench"}) {
    for (const auto& e : fs::recursive_directory_iterator(fs::path(PARAPLAN_ROOT) / dir)) {
      if (e.is_regular_file() && e.path().extension() == ".plan") out.push_back(e.path().string());
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::optional<Plan> Load(const std::string& file, const std::vector<std::string>& sets) {
  FrontendOptions opts;
  opts.file = file;
  opts.sets = sets;
  opts.sets.push_back("framework=paraplan");
  SourceManager sm;
  DiagnosticSink sink;
  std::optional<Plan> plan = LoadPlan(opts, sm, sink);
  if (!plan || sink.has_errors()) return std::nullopt;
  return plan;
}

TEST_CASE(
    "check's estimate is compile's arena within 3% on every example and bench plan that lowers") {
  int compared = 0;
  double worst = 0;
  const std::vector<std::vector<std::string>> variants = {
      {},
      {"recompute=full"},
      {"recompute=none"},
      {"recompute=selective", "optimizer.zero=2"},
      {"optimizer.zero=3"},
      {"precision=fp16"},
      {"precision=fp8"},
      {"precision=fp32"},
      {"optimizer.type=sgd"}};
  for (const std::string& file : PlanFiles()) {
    for (const auto& sets : variants) {
      std::optional<Plan> plan = Load(file, sets);
      if (!plan || !ArenaModelApplies(*plan)) continue;
      // The arena is compared whatever its size: lower with a device large enough to hold it.
      plan->cluster.gpu.memory = int64_t{1} << 50;
      DiagnosticSink sink;
      lower::LowerOptions options;
      options.verify = false;
      std::optional<lower::Program> program = lower::LowerPlan(*plan, options, sink);
      if (!program) continue;
      const MemoryEstimate est = EstimateMemory(*plan);
      REQUIRE(est.valid);
      for (const lower::Role& role : program->roles) {
        const StageMemory& s = est.stages.at(static_cast<size_t>(role.pipeline_rank));
        const double error =
            std::fabs(static_cast<double>(s.arena) / static_cast<double>(role.peak_bytes) - 1);
        std::string sets_text;
        for (const std::string& x : sets) sets_text += " --set " + x;
        CHECK_MESSAGE(error <= 0.03, file, sets_text, " stage ", role.pipeline_rank, ": arena ",
                      FormatGiB(role.peak_bytes), ", estimate ", FormatGiB(s.arena));
        ++compared;
        worst = std::max(worst, error);
      }
    }
  }
  // tiny_llama, llama3_70b, the compile and explain benchmarks at least, in five variants.
  CHECK(compared >= 40);
  MESSAGE(compared << " stages compared, largest difference " << 100 * worst << "%");
}

// Multi-head latent attention (kv_lora_rank > 0): the Llama-style example plans given DeepSeek's
// attention shape (latents, decoupled RoPE, value heads padded to the query/key head size).
TEST_CASE("check's estimate is compile's arena within 3% with multi-head latent attention") {
  const std::vector<std::pair<std::string, std::vector<std::string>>> shapes = {
      {"examples/tiny_llama.plan",
       {"model.kv_heads=8", "model.q_lora_rank=64", "model.kv_lora_rank=32",
        "model.qk_nope_head_dim=32", "model.qk_rope_head_dim=16", "model.v_head_dim=32",
        "model.head_dim=48"}},
      {"examples/llama3_70b.plan",
       {"model.kv_heads=64", "model.q_lora_rank=0", "model.kv_lora_rank=512",
        "model.qk_nope_head_dim=128", "model.qk_rope_head_dim=64", "model.v_head_dim=128",
        "model.head_dim=192"}}};
  int compared = 0;
  double worst = 0;
  for (const auto& entry : shapes) {
    // Named references, not structured bindings: doctest's message lambdas capture them.
    const std::string& file = entry.first;
    const std::vector<std::string>& shape = entry.second;
    for (const char* variant :
         {"recompute=none", "recompute=selective", "recompute=full", "optimizer.zero=3"}) {
      std::vector<std::string> sets = shape;
      sets.emplace_back(variant);
      std::optional<Plan> plan = Load(std::string(PARAPLAN_ROOT) + "/" + file, sets);
      REQUIRE_MESSAGE(plan.has_value(), file, " ", variant);
      REQUIRE(plan->model.IsMla());
      REQUIRE(ArenaModelApplies(*plan));
      plan->cluster.gpu.memory = int64_t{1} << 50;
      DiagnosticSink sink;
      lower::LowerOptions options;
      options.verify = false;
      std::optional<lower::Program> program = lower::LowerPlan(*plan, options, sink);
      REQUIRE_MESSAGE(program.has_value(), file, " ", variant);
      const MemoryEstimate est = EstimateMemory(*plan);
      REQUIRE(est.valid);
      for (const lower::Role& role : program->roles) {
        const StageMemory& s = est.stages.at(static_cast<size_t>(role.pipeline_rank));
        const double error =
            std::fabs(static_cast<double>(s.arena) / static_cast<double>(role.peak_bytes) - 1);
        CHECK_MESSAGE(error <= 0.03, file, " --set ", variant, " stage ", role.pipeline_rank,
                      ": arena ", FormatGiB(role.peak_bytes), ", estimate ", FormatGiB(s.arena));
        ++compared;
        worst = std::max(worst, error);
      }
    }
  }
  CHECK(compared >= 8);
  MESSAGE(compared << " stages compared, largest difference " << 100 * worst << "%");
}

}  // namespace
}  // namespace paraplan
