#include "compiler/analyze/memory_check.h"

#include <doctest/doctest.h>

#include "compiler/analyze/checks.h"
#include "compiler/analyze/cost_test_plans.h"
#include "compiler/analyze/time.h"

namespace paraplan {
namespace {

// Llama 3 70B on 8 DGX H100 with TP 8, no SP, no recompute, no ZeRO: far beyond 80 GB.
Plan Oversized() {
  Plan plan = testing::MakePlan(testing::Llama3Of70B(), testing::DgxH100(8), 8, 2, 256, 1);
  plan.recompute = Recompute::kNone;
  plan.optimizer.zero = 0;
  return plan;
}

const Diagnostic* Find(const DiagnosticSink& sink, DiagKind kind) {
  for (const Diagnostic& d : sink.diagnostics())
    if (d.kind == kind) return &d;
  return nullptr;
}

TEST_CASE(
    "for DeepSpeed, ZeRO 2 and 3 are offered as fixes only without pipeline parallelism (P0503)") {
  Plan plan = Oversized();
  REQUIRE(plan.parallel.pp > 1);
  plan.framework = Framework::kDeepSpeed;
  for (const MemoryFix& fix : ProposeMemoryFixes(plan, int64_t{1} << 50, {}, 100))
    for (const auto& [path, value] : fix.sets)
      if (path == "optimizer.zero") CHECK(std::stoi(value) <= 1);
  // Megatron-Core and torchtitan shard with pipeline parallelism: ZeRO 3 is among the fixes.
  plan.framework = Framework::kTorchtitan;
  bool zero3 = false;
  for (const MemoryFix& fix : ProposeMemoryFixes(plan, int64_t{1} << 50, {}, 100))
    for (const auto& [path, value] : fix.sets) zero3 |= path == "optimizer.zero" && value == "3";
  CHECK(zero3);
}

TEST_CASE("module recompute and bf16 moments are offered where the framework has them") {
  Plan plan = Oversized();
  plan.recompute = Recompute::kNone;
  auto offered = [&](const Plan& p, std::string_view path) {
    for (const MemoryFix& fix : ProposeMemoryFixes(p, int64_t{1} << 50, {}, 100))
      for (const auto& [where, value] : fix.sets)
        if (where == path) return true;
    return false;
  };
  plan.framework = Framework::kMegatronCore;
  CHECK(offered(plan, "activations.recompute_modules"));
  CHECK(offered(plan, "mixed_precision.optimizer_state"));
  plan.framework = Framework::kParaplan;  // planrun lowers the modules, keeps fp32 moments
  CHECK(offered(plan, "activations.recompute_modules"));
  CHECK(!offered(plan, "mixed_precision.optimizer_state"));
}

TEST_CASE("planrun's expert-parallel buffers: a stated routing imbalance is offered as a fix") {
  Plan plan = testing::MakePlan(testing::Llama3Of70B(), testing::DgxH100(2), 1, 1, 64, 1);
  plan.model.experts = 64;
  plan.model.topk = 8;
  plan.model.moe_ffn_hidden = 768;
  plan.parallel.ep = 16;
  plan.framework = Framework::kParaplan;
  REQUIRE(RederiveSizes(plan));
  auto offered = [&](const Plan& p) {
    for (const MemoryFix& fix : ProposeMemoryFixes(p, int64_t{1} << 50, {}, 100))
      for (const auto& [where, value] : fix.sets)
        if (where == "moe.imbalance") return true;
    return false;
  };
  CHECK(offered(plan));
  // Stated already, or sized by a capacity factor, or priced as Megatron-LM holds it: not offered.
  Plan stated = plan;
  stated.origins["moe.imbalance"].kind = OriginKind::kFile;
  CHECK(!offered(stated));
  Plan capped = plan;
  capped.moe.capacity_factor = 1.25;
  CHECK(!offered(capped));
  plan.framework = Framework::kMegatronCore;
  CHECK(!offered(plan));
}

TEST_CASE("a stage over the GPU's memory is error P0701 with its breakdown and verified fixes") {
  const Plan plan = Oversized();
  const MemoryEstimate mem = EstimateMemory(plan);
  REQUIRE(mem.peak > plan.cluster.gpu.memory);
  DiagnosticSink sink;
  CheckMemory(plan, sink);
  const Diagnostic* d = Find(sink, DiagKind::kStageOutOfMemory);
  REQUIRE(d != nullptr);
  CHECK(d->level == DiagLevel::kError);
  CHECK(d->message.find("pipeline stage 0 needs") == 0);
  CHECK(d->message.find("`h100_sxm` has 80.00 GiB") != std::string::npos);
  // The breakdown: weights, gradients, optimizer state, activations, ..., and the total.
  REQUIRE(d->values.size() >= 5);
  CHECK(d->values.front().first == "weights");
  CHECK(d->values.back().first == "stage 0 total");
  CHECK(d->values.back().second.find("> 80.00 GiB") != std::string::npos);
  // Up to three helps, each naming a change and the size the model computed for it.
  REQUIRE(!d->helps.empty());
  CHECK(d->helps.size() <= 3);
  CHECK(d->helps.front().find(" the largest stage (") != std::string::npos);  // "brings" or "bring"
  // Every offered fix fits when re-estimated, and they come fastest first.
  const auto fixes = ProposeMemoryFixes(plan, plan.cluster.gpu.memory);
  REQUIRE(!fixes.empty());
  double last = 0;
  for (const MemoryFix& fix : fixes) {
    CAPTURE(fix.description);
    Plan variant = plan;
    for (const auto& [path, value] : fix.sets) REQUIRE(SetFieldText(variant, path, value).empty());
    REQUIRE(RederiveSizes(variant));
    CHECK(EstimateMemory(variant).peak == fix.peak);
    CHECK(fix.peak <= plan.cluster.gpu.memory);
    if (fix.sets.size() == fixes.front().sets.size()) {
      CHECK(fix.gpu_seconds >= last);
      last = fix.gpu_seconds;
    }
  }
}

TEST_CASE("above 93% of the GPU's memory is warning P0702; below it nothing") {
  Plan plan = testing::MakePlan(testing::Llama3Of70B(), testing::DgxH100(8), 8, 4, 64, 1);
  plan.parallel.sp = true;
  plan.recompute = Recompute::kSelective;
  plan.optimizer.zero = 1;
  const int64_t peak = EstimateMemory(plan).peak;
  plan.cluster.gpu.memory = peak / 95 * 100;  // the peak is 95% of the GPU
  DiagnosticSink sink;
  CheckMemory(plan, sink);
  const Diagnostic* d = Find(sink, DiagKind::kStageMemoryNearLimit);
  REQUIRE(d != nullptr);
  CHECK(d->level == DiagLevel::kWarning);
  CHECK(d->message.find("95.0%") != std::string::npos);
  CHECK(Find(sink, DiagKind::kStageOutOfMemory) == nullptr);
  plan.cluster.gpu.memory = peak * 2;
  DiagnosticSink quiet;
  CheckMemory(plan, quiet);
  CHECK(quiet.diagnostics().empty());
}

TEST_CASE("planrun's f32 arena over the GPU is warning P0805 beside a fitting bf16 arena") {
  // examples/llama3_70b.plan under framework = paraplan (TP 8 x PP 4 x VPP 2, selective
  // recompute, ZeRO 1, 512 sequences): the program fits 80 GB in bf16 (57 GiB), while planrun's
  // backends hold every element in f32 (93 GiB).
  Plan plan = testing::MakePlan(testing::Llama3Of70B(), testing::DgxH100(8), 8, 4, 512, 1);
  plan.parallel.vpp = 2;
  plan.pipeline.schedule = Schedule::kInterleaved1F1B;
  plan.framework = Framework::kParaplan;
  plan.parallel.sp = true;
  plan.recompute = Recompute::kSelective;
  plan.optimizer.zero = 1;
  REQUIRE(ArenaModelApplies(plan));
  const MemoryEstimate bf16 = EstimateMemory(plan);
  REQUIRE(bf16.peak < plan.cluster.gpu.memory);
  DiagnosticSink sink;
  CheckMemory(plan, sink, {});
  const Diagnostic* d = Find(sink, DiagKind::kLowerF32Arena);
  REQUIRE(d != nullptr);
  CHECK(d->level == DiagLevel::kWarning);
  CHECK(d->message.find("planrun's backends hold pipeline stage") == 0);
  CHECK(Find(sink, DiagKind::kStageOutOfMemory) == nullptr);
  // The same plan in fp32 has one arena: no P0805 (P0701 says whether it fits).
  plan.precision = Precision::kFp32;
  DiagnosticSink fp32;
  CheckMemory(plan, fp32, {});
  CHECK(Find(fp32, DiagKind::kLowerF32Arena) == nullptr);
  // Megatron-Core's own memory has no f32 placement.
  plan.precision = Precision::kBf16;
  plan.framework = Framework::kMegatronCore;
  DiagnosticSink megatron;
  CheckMemory(plan, megatron, {});
  CHECK(Find(megatron, DiagKind::kLowerF32Arena) == nullptr);
}

TEST_CASE("RunAnalysisChecks reports the memory error") {
  DiagnosticSink sink;
  RunAnalysisChecks(Oversized(), sink);
  CHECK(Find(sink, DiagKind::kStageOutOfMemory) != nullptr);
}

// Megatron-LM's job (the configuration DeepSeek-V2 trained with). planrun's arena would reserve
// the experts' receive buffers for the worst case here (no stated imbalance): examples/
// deepseek_v2_32node.plan states one.
TEST_CASE("DeepSeek-V2 on 32 nodes with TP 8, PP 1, EP 32 and SP fits in 80 GB") {
  Plan plan = testing::MakePlan(testing::DeepSeekV2(), testing::DgxH100(32), 8, 1, 1536, 1);
  plan.framework = Framework::kMegatronCore;
  plan.parallel.ep = 32;
  plan.parallel.sp = true;
  plan.recompute = Recompute::kSelective;
  plan.optimizer.zero = 1;
  const MemoryEstimate mem = EstimateMemory(plan);
  REQUIRE(mem.valid);
  CHECK(mem.peak < plan.cluster.gpu.memory);
}

TEST_CASE("fixes re-derive dp and respect the basic rules") {
  Plan plan = Oversized();
  plan.parallel.tp = 4;
  plan.parallel.etp = 4;
  REQUIRE(RederiveSizes(plan));
  CHECK(plan.parallel.dp == 8);
  CHECK(PassesBasicRules(plan));
  plan.batch.global = 100;  // not a multiple of micro · dp
  CHECK_FALSE(PassesBasicRules(plan));
}

}  // namespace
}  // namespace paraplan
