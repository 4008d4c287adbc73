#include "compiler/analyze/time.h"

#include <doctest/doctest.h>

#include "compiler/analyze/cost_comm.h"
#include "compiler/analyze/cost_test_plans.h"

namespace paraplan {
namespace {

Plan Llama(int64_t nodes, int64_t tp, int64_t pp) {
  Plan plan = testing::MakePlan(testing::Llama3_70B(), testing::DgxH100(nodes), tp, pp, 128, 1);
  plan.parallel.sp = tp > 1;
  plan.recompute = Recompute::kSelective;
  plan.optimizer.zero = 1;
  return plan;
}

TEST_CASE("model FLOPs per token: Narayanan's 24h^2 + 4sh per layer, causal halving stated") {
  const ModelSpec m = testing::Gpt(48, 6144, 64);
  const double h = m.hidden, s = m.seq_len, L = m.layers, V = m.vocab;
  // 3 passes x (24h^2 + 4sh per layer + 2hV logits) per token, full attention.
  CHECK(ModelFlopsPerToken(m, false) == doctest::Approx(3 * (L * (24 * h * h + 4 * s * h) + 2 * h * V)));
  CHECK(ModelFlopsPerToken(m, true) == doctest::Approx(3 * (L * (24 * h * h + 2 * s * h) + 2 * h * V)));
}

TEST_CASE("step time adds up and reports tokens/s and MFU consistently") {
  const Plan plan = Llama(8, 8, 4);
  const TimeEstimate t = EstimateTime(plan);
  REQUIRE(t.valid);
  CHECK(t.step_s == doctest::Approx(t.compute_s + t.comm_s + t.bubble_s + t.dp_exposed_s + t.optimizer_s + t.overhead_s));
  CHECK(t.tokens_per_s_per_gpu == doctest::Approx(128.0 * 8192 / t.step_s / 64));
  CHECK(t.mfu == doctest::Approx(t.model_flops_per_step / (t.step_s * 64 * 989e12)));
  CHECK(t.mfu > 0.2);
  CHECK(t.mfu < 0.8);
  CHECK(t.stages.size() == 4);
}

TEST_CASE("the pipeline bubble follows the schedule: (p-1)/m for 1F1B, divided by v interleaved") {
  Plan plan = Llama(8, 8, 4);
  const TimeEstimate one = EstimateTime(plan);
  plan.parallel.vpp = 2;
  plan.pipeline.schedule = Schedule::kInterleaved1F1B;
  const TimeEstimate two = EstimateTime(plan);
  REQUIRE(one.valid);
  REQUIRE(two.valid);
  CHECK(two.bubble_s < one.bubble_s * 0.6);
  // Balanced stages: bubble = (p-1)/v x U with U the per-microbatch stage time.
  const double u = one.stages[1].microbatch_s;
  CHECK(one.bubble_s == doctest::Approx(3 * u).epsilon(0.05));
}

TEST_CASE("TP across nodes is priced on the network and is slower") {
  const Plan inside = Llama(8, 8, 1);
  Plan across = inside;
  across.cluster.gpus_per_node = 4;
  across.cluster.nodes = 16;
  REQUIRE(PlaceGroups(inside).tp.per_node == 8);
  REQUIRE(PlaceGroups(across).tp.CrossesNodes());
  const TimeEstimate a = EstimateTime(inside), b = EstimateTime(across);
  CHECK(b.stages[0].tp_comm_s > 1.5 * a.stages[0].tp_comm_s);
}

TEST_CASE("ring collectives: all-reduce moves 2(n-1)/n of the array, twice a reduce-scatter") {
  const ClusterSpec c = testing::DgxH100(4);
  GpuEfficiency eff = EfficiencyFor(c.gpu);
  eff.collective_latency_s = 0;
  CommGroup node{8, 8};
  const double bytes = 1e9;
  CHECK(CollectiveSeconds(Collective::kAllReduce, bytes, node, c, eff) ==
        doctest::Approx(2 * 7.0 / 8 * bytes / (450e9 * eff.nvlink_bus_fraction)));
  CHECK(CollectiveSeconds(Collective::kAllReduce, bytes, node, c, eff) ==
        doctest::Approx(2 * CollectiveSeconds(Collective::kReduceScatter, bytes, node, c, eff)));
  // Across 4 nodes, one member per node: the network carries it.
  CommGroup spread{4, 1};
  CHECK(CollectiveSeconds(Collective::kAllReduce, bytes, spread, c, eff) ==
        doctest::Approx(2 * 3.0 / 4 * bytes / (50e9 * eff.network_bus_fraction)));
}

TEST_CASE("overlapping the DP gradient reduce hides it behind the backward") {
  Plan plan = Llama(8, 8, 1);
  plan.optimizer.zero = 0;
  CostOptions overlap, none;
  none.overlap_grad_reduce = false;
  none.overlap_param_gather = false;
  const TimeEstimate a = EstimateTime(plan, overlap), b = EstimateTime(plan, none);
  CHECK(b.dp_exposed_s == doctest::Approx(b.stages[0].dp_sync_s));
  CHECK(a.dp_exposed_s < b.dp_exposed_s);
}

TEST_CASE("ZeRO 2 reduce-scatters gradients every microbatch, ZeRO 3 also gathers parameters") {
  // Short sequences: little compute per microbatch to hide the per-microbatch traffic behind.
  Plan plan = Llama(8, 8, 1);
  plan.model.seq_len = 512;
  plan.batch.global = 512;
  TimeEstimate z[4];
  for (int zero = 0; zero <= 3; ++zero) {
    plan.optimizer.zero = zero;
    z[zero] = EstimateTime(plan);
    REQUIRE(z[zero].valid);
  }
  REQUIRE(z[1].microbatches == 64);
  // Per step: ZeRO 1 reduces and gathers once, ZeRO 2 only gathers back, ZeRO 3 neither.
  CHECK(z[2].stages[0].dp_sync_s > 0);
  CHECK(z[2].stages[0].dp_sync_s < z[1].stages[0].dp_sync_s);
  CHECK(z[3].stages[0].dp_sync_s == 0);
  // Per microbatch: the traffic that does not hide behind compute slows every microbatch.
  CHECK(z[2].stages[0].microbatch_s > z[1].stages[0].microbatch_s);
  CHECK(z[3].stages[0].microbatch_s > z[2].stages[0].microbatch_s);
  CHECK(z[1].step_s < z[2].step_s);
  CHECK(z[2].step_s < z[3].step_s);
}

TEST_CASE("fused attention runs at its own efficiency, below large GEMMs") {
  Plan plan = Llama(8, 8, 1);
  CostOptions fused;
  const GpuEfficiency& eff = EfficiencyFor(plan.cluster.gpu);
  CHECK(eff.attention_fraction > 0);
  CHECK(eff.attention_fraction < eff.gemm_max_fraction);
  GpuEfficiency faster = eff;
  faster.attention_fraction = eff.gemm_max_fraction;
  fused.efficiency = &faster;
  CHECK(EstimateTime(plan, fused).step_s < EstimateTime(plan).step_s);
}

TEST_CASE("recompute costs time: full > selective > none") {
  Plan plan = Llama(8, 8, 4);
  plan.recompute = Recompute::kNone;
  const double none = EstimateTime(plan).step_s;
  plan.recompute = Recompute::kSelective;
  const double selective = EstimateTime(plan).step_s;
  plan.recompute = Recompute::kFull;
  const double full = EstimateTime(plan).step_s;
  CHECK(none < selective);
  CHECK(selective < full);
  CHECK(full < none * 1.5);
}

TEST_CASE("MoE layers pay the EP all-to-all") {
  Plan plan = testing::MakePlan(testing::DeepSeekV2(), testing::DgxH100(32), 8, 1, 1024, 1);
  plan.parallel.ep = 32;
  plan.parallel.sp = true;
  plan.recompute = Recompute::kFull;
  const TimeEstimate t = EstimateTime(plan);
  REQUIRE(t.valid);
  CHECK(t.stages[0].ep_comm_s > 0);
  CHECK(t.mfu > 0.05);
  CHECK(t.mfu < 0.6);
}

}  // namespace
}  // namespace paraplan
