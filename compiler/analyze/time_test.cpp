#include "compiler/analyze/time.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>

#include "compiler/analyze/cost_comm.h"
#include "compiler/analyze/cost_framework.h"
#include "compiler/analyze/cost_test_plans.h"
#include "compiler/analyze/memory.h"

namespace paraplan {
namespace {

Plan Llama(int64_t nodes, int64_t tp, int64_t pp) {
  Plan plan = testing::MakePlan(testing::Llama3Of70B(), testing::DgxH100(nodes), tp, pp, 128, 1);
  plan.parallel.sp = tp > 1;
  plan.recompute = Recompute::kSelective;
  plan.optimizer.zero = 1;
  return plan;
}

TEST_CASE("model FLOPs per token: Narayanan's 24h^2 + 4sh per layer, causal halving stated") {
  const ModelSpec m = testing::Gpt(48, 6144, 64);
  const double h = m.hidden, s = m.seq_len, layers = m.layers, vocab = m.vocab;
  // 3 passes x (24h^2 + 4sh per layer + 2hV logits) per token, full attention.
  CHECK(ModelFlopsPerToken(m, false) ==
        doctest::Approx(3 * (layers * (24 * h * h + 4 * s * h) + 2 * h * vocab)));
  CHECK(ModelFlopsPerToken(m, true) ==
        doctest::Approx(3 * (layers * (24 * h * h + 2 * s * h) + 2 * h * vocab)));
}

TEST_CASE("step time adds up and reports tokens/s and MFU consistently") {
  const Plan plan = Llama(8, 8, 4);
  const TimeEstimate t = EstimateTime(plan);
  REQUIRE(t.valid);
  CHECK(t.step_s == doctest::Approx(t.compute_s + t.comm_s + t.bubble_s + t.dp_exposed_s +
                                    t.optimizer_s + t.overhead_s));
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

// A DGX H100 cluster's links as the collectives see them, without per-step latency.
struct Links {
  ClusterSpec cluster;
  GpuEfficiency eff;
  double nvl = 0, net = 0;  // NVLink and network bytes/s per GPU at their bus efficiencies
};
Links H100Links(int64_t nodes) {
  Links l{testing::DgxH100(nodes), {}, 0, 0};
  l.eff = EfficiencyFor(l.cluster.gpu);
  l.eff.collective_latency_s = 0;
  l.nvl = 450e9 * l.eff.nvlink_bus_fraction;
  l.net = 50e9 * l.eff.network_bus_fraction;
  return l;
}

TEST_CASE("ring collectives: all-reduce moves 2(n-1)/n of the array, twice a reduce-scatter") {
  const Links l = H100Links(4);
  const ClusterSpec& c = l.cluster;
  const GpuEfficiency& eff = l.eff;
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

TEST_CASE("ring collectives across nodes: the slower of NVLink and network sets the time") {
  const Links l = H100Links(4);
  const ClusterSpec& c = l.cluster;
  const GpuEfficiency& eff = l.eff;
  const double bytes = 8e9, nvl = l.nvl, net = l.net;
  // 8 GPUs a node: each GPU forwards 7/8 of the array over NVLink and its 1/8 share of the
  // ring's (n-1)/n crossing over its NIC, the two pipelined.
  for (const int64_t nodes : {2, 4, 16}) {
    const CommGroup g{8 * nodes, 8};
    const double n = static_cast<double>(g.size);
    const double want = std::max(7.0 / 8 * bytes / nvl, (n - 1) / n * bytes / 8 / net);
    CAPTURE(nodes);
    CHECK(CollectiveSeconds(Collective::kAllGather, bytes, g, c, eff) == doctest::Approx(want));
    CHECK(CollectiveSeconds(Collective::kAllReduce, bytes, g, c, eff) == doctest::Approx(2 * want));
  }
  // Nearly flat in the node count (the sum of the tiers grew with it): 2 -> 16 nodes, +6%.
  const double two = CollectiveSeconds(Collective::kReduceScatter, bytes, {16, 8}, c, eff);
  const double sixteen = CollectiveSeconds(Collective::kReduceScatter, bytes, {128, 8}, c, eff);
  CHECK(sixteen / two == doctest::Approx((127.0 / 128) / (15.0 / 16)));
}

TEST_CASE("multi-token prediction: each module is a layer, a projection and a loss of its own") {
  // One stage (pp 1): the stage's FLOPs with one MTP module are those of one more layer, the
  // module's 2h -> h projection and a second logits GEMM, forward and backward.
  const Plan a = Llama(1, 8, 1);
  Plan more = a, mtp = a;
  more.model.layers += 1;
  mtp.model.mtp_layers = 1;
  const TimeEstimate ta = EstimateTime(a), tmore = EstimateTime(more), tmtp = EstimateTime(mtp);
  REQUIRE(ta.valid);
  REQUIRE(tmtp.valid);
  const ModelSpec& m = a.model;
  const double tokens = static_cast<double>(m.seq_len * a.batch.micro), t = 8;
  const double h = static_cast<double>(m.hidden), vocab = static_cast<double>(m.vocab);
  const double layer = tmore.stages[0].flops - ta.stages[0].flops;
  CHECK(tmtp.stages[0].flops - ta.stages[0].flops ==
        doctest::Approx(layer + 3 * 2 * tokens * 2 * h * h / t + 3 * 2 * tokens * h * vocab / t));
  CHECK(tmtp.step_s > tmore.step_s);
}

TEST_CASE("all-to-all across nodes: the NVLink and network shares go out at once") {
  const Links l = H100Links(4);
  const ClusterSpec& c = l.cluster;
  const GpuEfficiency& eff = l.eff;
  const double bytes = 1e9, nvl = l.nvl, net = l.net;
  // Inside a node everything stays on NVLink: 7/8 of the buffer leaves each GPU.
  CHECK(CollectiveSeconds(Collective::kAllToAll, bytes, {8, 8}, c, eff) ==
        doctest::Approx(7.0 / 8 * bytes / nvl));
  // 16 ranks on 2 nodes: 7/16 to the node's other GPUs, 8/16 over the NIC, side by side; the
  // network share sets the time.
  const double two_nodes = CollectiveSeconds(Collective::kAllToAll, bytes, {16, 8}, c, eff);
  CHECK(two_nodes == doctest::Approx(std::max(7.0 / 16 * bytes / nvl, 8.0 / 16 * bytes / net)));
  CHECK(two_nodes == doctest::Approx(8.0 / 16 * bytes / net));
}

TEST_CASE("DeepEP / HybridEP send a token once to each remote node it reaches") {
  const Links l = H100Links(8);
  const ClusterSpec& c = l.cluster;
  const GpuEfficiency& eff = l.eff;
  const double tokens = 1e8, nvl = l.nvl, net = l.net;
  // Inside a node nothing changes: every copy goes over NVLink.
  CHECK(DedupAllToAllSeconds(tokens, 8, 0, {8, 8}, c, eff) ==
        doctest::Approx(CollectiveSeconds(Collective::kAllToAll, 8 * tokens, {8, 8}, c, eff)));
  // 2 nodes, top-8: the other node is reached with probability 1 - 2^-8, once, instead of 4
  // copies on average.
  const double two = DedupAllToAllSeconds(tokens, 8, 0, {16, 8}, c, eff);
  const double nvlink = 8 * tokens * 7 / 16 + 8 * tokens * 8 / 16 * 7 / 8;
  CHECK(two == doctest::Approx(std::max(nvlink / nvl, tokens * (1 - std::pow(0.5, 8)) / net)));
  CHECK(two < CollectiveSeconds(Collective::kAllToAll, 8 * tokens, {16, 8}, c, eff) / 3);
  // 8 nodes with node-limited routing (at most 4 nodes a token): at most 3 remote copies.
  const double limited = DedupAllToAllSeconds(tokens, 8, 4, {64, 8}, c, eff);
  const double free = DedupAllToAllSeconds(tokens, 8, 0, {64, 8}, c, eff);
  CHECK(limited ==
        doctest::Approx(std::max((8 * tokens * 7 / 64 + 8 * tokens * 56 / 64 * 7 / 8) / nvl,
                                 3 * tokens / net)));
  CHECK(limited < free);
  // The plan field selects it: the flex dispatcher's EP time is below the all-to-all's.
  Plan plan = testing::MakePlan(testing::DeepSeekV2(), testing::DgxH100(32), 8, 1, 1024, 1);
  plan.parallel.ep = 32;
  plan.parallel.sp = true;
  plan.recompute = Recompute::kFull;
  const TimeEstimate a2a = EstimateTime(plan);
  plan.moe.dispatcher = Dispatcher::kFlex;
  const TimeEstimate flex = EstimateTime(plan);
  REQUIRE(a2a.valid);
  REQUIRE(flex.valid);
  CHECK(flex.stages[0].ep_comm_s < a2a.stages[0].ep_comm_s);
}

TEST_CASE("a profile's fixed cost per MoE layer falls on the MoE layers only") {
  Plan plan = testing::MakePlan(testing::DeepSeekV2(), testing::DgxH100(32), 8, 1, 1024, 1);
  plan.parallel.ep = 32;
  plan.parallel.sp = true;
  plan.recompute = Recompute::kNone;
  plan.framework = Framework::kMegatronCore;
  FrameworkProfile prof = ProfileFor("megatron_core", plan.cluster.gpu);
  prof.moe_layer_overhead_s = 0;
  CostOptions o;
  o.profile = &prof;
  const TimeEstimate base = EstimateTime(plan, o);
  prof.moe_layer_overhead_s = 2e-3;
  const TimeEstimate t = EstimateTime(plan, o);
  REQUIRE(base.valid);
  REQUIRE(t.valid);
  // DeepSeek-V2: 60 layers, the first dense; 59 MoE layers x 2 ms per microbatch, forward +
  // backward, on each of the step's microbatches (one pipeline stage).
  CHECK(t.compute_s - base.compute_s ==
        doctest::Approx(59 * 2e-3 * static_cast<double>(t.microbatches)).epsilon(0.01));
}

TEST_CASE("stragglers: a share of the step per doubling of the job's nodes, none on one node") {
  // The same per-GPU work on 1, 4 and 16 nodes (data parallelism grows with the nodes).
  auto plan_on = [](int64_t nodes) {
    Plan plan = Llama(nodes, 8, 1);
    plan.batch.global = 16 * nodes;
    plan.framework = Framework::kTorchtitan;
    return plan;
  };
  const FrameworkProfile& prof = ProfileFor("torchtitan", testing::DgxH100(1).gpu);
  REQUIRE(prof.node_scaling_loss == doctest::Approx(0.005));
  for (const int64_t nodes : {1, 4, 16}) {
    const TimeEstimate t = EstimateTime(plan_on(nodes));
    REQUIRE(t.valid);
    const double rest = t.step_s - (t.overhead_s - prof.step_overhead_s);
    const double stragglers = t.overhead_s - prof.step_overhead_s;
    CAPTURE(nodes);
    CHECK(stragglers ==
          doctest::Approx(rest * 0.005 * std::log2(static_cast<double>(nodes))).epsilon(1e-9));
    CHECK(t.step_s == doctest::Approx(t.compute_s + t.comm_s + t.bubble_s + t.dp_exposed_s +
                                      t.optimizer_s + t.overhead_s));
  }
  // Megatron-Core (and planrun, priced as Megatron-Core) carries none.
  Plan core = plan_on(16);
  core.framework = Framework::kMegatronCore;
  const TimeEstimate t = EstimateTime(core);
  CHECK(t.overhead_s ==
        doctest::Approx(ProfileFor("megatron_core", testing::DgxH100(1).gpu).step_overhead_s));
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

TEST_CASE(
    "FSDP traffic hidden behind compute slows it by the profile's share, exposed traffic not") {
  Plan plan = testing::MakePlan(testing::Gpt(24, 2048, 16), testing::DgxH100(2), 1, 1, 256, 8);
  plan.framework = Framework::kLlmFoundry;
  plan.optimizer.zero = 3;
  FrameworkProfile prof = ProfileFor("llm_foundry", plan.cluster.gpu);
  CostOptions o;
  o.profile = &prof;
  auto step = [&](double prefetch, double interference) {
    prof.shard_prefetch = prefetch;
    prof.shard_interference = interference;
    const TimeEstimate t = EstimateTime(plan, o);
    REQUIRE(t.valid);
    return t.step_s;
  };
  // Hidden traffic: the slowdown is linear in the share.
  const double base = step(0.9, 0), d1 = step(0.9, 0.2) - base, d2 = step(0.9, 0.4) - base;
  CHECK(d1 > 0);
  CHECK(d2 == doctest::Approx(2 * d1));
  // Nothing prefetched: all of it is exposed already, and nothing is left to slow the compute.
  CHECK(step(0, 0.4) == doctest::Approx(step(0, 0)));
}

TEST_CASE("compile = true fuses the memory-bound kernels where the framework runs eagerly") {
  Plan plan = testing::MakePlan(testing::Gpt(24, 2048, 16), testing::DgxH100(1), 1, 1, 64, 8);
  plan.framework = Framework::kTorchtitan;
  const TimeEstimate eager = EstimateTime(plan);
  plan.compile = true;
  const TimeEstimate compiled = EstimateTime(plan);
  REQUIRE(eager.valid);
  REQUIRE(compiled.valid);
  const double scale = ProfileFor("torchtitan", plan.cluster.gpu).compiled_memory_scale;
  CHECK(scale < 1);
  CHECK(compiled.stages[0].memory_s < eager.stages[0].memory_s);
  CHECK(compiled.stages[0].gemm_s == doctest::Approx(eager.stages[0].gemm_s));
  CHECK(compiled.step_s < eager.step_s);
  // Megatron-Core's kernels are fused already: the switch changes nothing there.
  plan.framework = Framework::kMegatronCore;
  const double fused = EstimateTime(plan).step_s;
  plan.compile = false;
  CHECK(EstimateTime(plan).step_s == doctest::Approx(fused));
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

TEST_CASE(
    "a fused attention kernel's backward costs 2.5x its forward (the scores computed again), "
    "the linear GEMMs' 2x") {
  // Halving the attention rate adds the core's forward time once to the forward and 3.5 times
  // to forward + backward; halving it again under full recompute adds it once more.
  Plan plan = testing::MakePlan(testing::Gpt(8, 2048, 16, 16384), testing::DgxH100(1), 1, 1, 8, 1);
  plan.framework = Framework::kMegatronCore;
  FrameworkProfile fast = ProfileFor("megatron_core", plan.cluster.gpu);
  FrameworkProfile slow = fast;
  slow.attention_scale = fast.attention_scale / 2;
  CostOptions of, os;
  of.profile = &fast;
  os.profile = &slow;
  for (const Recompute r : {Recompute::kNone, Recompute::kFull}) {
    plan.recompute = r;
    const TimeEstimate a = EstimateTime(plan, of), b = EstimateTime(plan, os);
    REQUIRE(a.valid);
    REQUIRE(b.valid);
    const StageTime &sa = a.stages.front(), &sb = b.stages.front();
    const double core_forward = sb.forward_s - sa.forward_s;
    REQUIRE(core_forward > 0);
    CHECK(sb.gemm_s - sa.gemm_s == doctest::Approx(3.5 * core_forward).epsilon(1e-6));
    CHECK(sb.recompute_s - sa.recompute_s ==
          doctest::Approx(r == Recompute::kFull ? core_forward : 0).epsilon(1e-6));
  }
}

TEST_CASE("head 64 runs below head 128 in the CUDA kernels, alike in llm-foundry's Triton kernel") {
  // The same attention FLOPs and weights, heads of 128 or 64.
  auto step = [](std::string_view stack, int64_t heads) {
    Plan plan =
        testing::MakePlan(testing::Gpt(8, 2048, heads, 16384), testing::DgxA100(1), 1, 1, 8, 1);
    plan.framework = stack == "llm_foundry" ? Framework::kLlmFoundry : Framework::kMegatronCore;
    const TimeEstimate t = EstimateTime(plan);
    REQUIRE(t.valid);
    return t.step_s;
  };
  CHECK(ProfileFor("llm_foundry", testing::DgxA100(1).gpu).attention_head_knee == 0);
  // (The per-head softmax statistics differ by a few bytes.)
  CHECK(step("llm_foundry", 32) == doctest::Approx(step("llm_foundry", 16)).epsilon(1e-3));
  CHECK(step("megatron_core", 32) > 1.05 * step("megatron_core", 16));
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

TEST_CASE("FP8 speeds up the linear GEMMs only: the attention core stays in bf16") {
  Plan plan = Llama(8, 8, 1);
  plan.framework = Framework::kMegatronCore;
  auto speedup = [&](int64_t seq) {
    Plan p = plan;
    p.model.seq_len = seq;
    p.batch.global = int64_t{128} * 8192 / seq;
    p.precision = Precision::kBf16;
    const double bf16 = EstimateTime(p).step_s;
    p.precision = Precision::kFp8;
    const double fp8 = EstimateTime(p).step_s;
    return bf16 / fp8;
  };
  const double short_seq = speedup(2048), long_seq = speedup(65536);
  CHECK(short_seq > 1.2);
  // At 64K the attention core dominates and gains nothing from FP8.
  CHECK(long_seq < short_seq - 0.1);
  CHECK(long_seq > 1.0);
}

TEST_CASE("row-wise FP8 scaling keeps the profile's share of what tensor-wise saves") {
  Plan plan = Llama(8, 8, 1);
  plan.framework = Framework::kTorchtitan;
  plan.precision = Precision::kBf16;
  const TimeEstimate bf16 = EstimateTime(plan);
  plan.precision = Precision::kFp8;
  plan.mixed_precision.fp8 = Fp8Recipe::kCurrent;
  plan.origins[fields::kMixedPrecisionFp8].kind = OriginKind::kFile;
  const TimeEstimate tensorwise = EstimateTime(plan);
  plan.mixed_precision.fp8 = Fp8Recipe::kRowwise;
  const TimeEstimate rowwise = EstimateTime(plan);
  REQUIRE(bf16.valid);
  REQUIRE(tensorwise.valid);
  REQUIRE(rowwise.valid);
  CHECK(tensorwise.step_s < rowwise.step_s);
  CHECK(rowwise.step_s < bf16.step_s);
  // The linear GEMMs' rate: 16-bit / (1 - share · (1 - 1/speedup)), so the GEMM seconds row-wise
  // saves are the share of those tensor-wise saves (the attention core is the same in all three).
  const FrameworkProfile& prof = ProfileFor("torchtitan", plan.cluster.gpu);
  const double saved_tensorwise = bf16.stages[0].gemm_s - tensorwise.stages[0].gemm_s;
  const double saved_rowwise = bf16.stages[0].gemm_s - rowwise.stages[0].gemm_s;
  REQUIRE(saved_tensorwise > 0);
  CHECK(saved_rowwise / saved_tensorwise == doctest::Approx(prof.fp8_rowwise_share).epsilon(0.02));
}

TEST_CASE("an FP8 recipe under a 16-bit precision has no effect on time or memory (P0517)") {
  Plan plan = Llama(8, 8, 1);
  plan.framework = Framework::kMegatronCore;
  plan.precision = Precision::kBf16;
  const TimeEstimate bf16 = EstimateTime(plan);
  const MemoryEstimate bf16_memory = EstimateMemory(plan);
  plan.mixed_precision.fp8 = Fp8Recipe::kCurrent;
  plan.origins[fields::kMixedPrecisionFp8].kind = OriginKind::kFile;
  const TimeEstimate recipe = EstimateTime(plan);
  REQUIRE(bf16.valid);
  REQUIRE(recipe.valid);
  CHECK(recipe.step_s == doctest::Approx(bf16.step_s));
  CHECK(EstimateMemory(plan).peak == bf16_memory.peak);
  plan.precision = Precision::kFp8;
  CHECK(EstimateTime(plan).step_s < bf16.step_s);
}

TEST_CASE("fused attention: time per token grows with the sequence at equal tokens per step") {
  Plan plan = Llama(8, 8, 1);
  plan.framework = Framework::kMegatronCore;
  plan.parallel.dp = 1;
  plan.cluster.nodes = 1;
  double per_token[3];
  const int64_t seqs[3] = {2048, 8192, 32768};
  for (int i = 0; i < 3; ++i) {
    plan.model.seq_len = seqs[i];
    plan.batch.global =
        int64_t{16} * 32768 / seqs[i];  // the same tokens per step and per microbatch
    plan.batch.micro = 32768 / seqs[i];
    const TimeEstimate t = EstimateTime(plan);
    REQUIRE(t.valid);
    per_token[i] = t.step_s / (16.0 * 32768);
  }
  CHECK(per_token[0] < per_token[1]);
  CHECK(per_token[1] < per_token[2]);
}

TEST_CASE("weights kept only in FP8 are gathered as FP8: half the bytes of a 16-bit gather") {
  Plan plan = Llama(8, 8, 1);
  plan.model.seq_len = 512;
  plan.batch.global = 512;
  plan.precision = Precision::kFp8;
  plan.optimizer.zero = 1;
  const TimeEstimate bf16_gather = EstimateTime(plan);
  plan.mixed_precision.fp8_params = true;
  plan.origins[fields::kMixedPrecisionFp8Params].kind = OriginKind::kFile;
  const TimeEstimate fp8_gather = EstimateTime(plan);
  REQUIRE(bf16_gather.valid);
  REQUIRE(fp8_gather.valid);
  // ZeRO 1: the gradients reduce as before, the parameter all-gather after the step moves one
  // byte per parameter instead of two.
  CHECK(fp8_gather.stages[0].dp_sync_s < bf16_gather.stages[0].dp_sync_s);
  CHECK(fp8_gather.stages[0].dp_sync_s > 0.5 * bf16_gather.stages[0].dp_sync_s);
  // Under ZeRO 3 the per-layer gathers shrink too, so every microbatch is no slower.
  plan.optimizer.zero = 3;
  const TimeEstimate z3_fp8 = EstimateTime(plan);
  plan.mixed_precision.fp8_params = false;
  const TimeEstimate z3_bf16 = EstimateTime(plan);
  REQUIRE(z3_fp8.valid);
  REQUIRE(z3_bf16.valid);
  CHECK(z3_fp8.stages[0].microbatch_s < z3_bf16.stages[0].microbatch_s);
}

TEST_CASE(
    "context parallelism: ring steps hide behind the core at long sequences, an all-gather does "
    "not") {
  Plan plan = Llama(8, 8, 1);
  plan.framework = Framework::kMegatronCore;
  plan.model.seq_len = 131072;
  plan.batch.global = 16;
  plan.parallel.cp = 4;
  plan.parallel.dp = 2;
  FrameworkProfile ring = ProfileFor("megatron_core", plan.cluster.gpu), gather = ring;
  gather.cp = CpStyle::kAllGather;
  CostOptions a, b;
  a.profile = &ring;
  b.profile = &gather;
  const TimeEstimate r = EstimateTime(plan, a), g = EstimateTime(plan, b);
  REQUIRE(r.valid);
  REQUIRE(g.valid);
  CHECK(r.stages[0].cp_comm_s >= 0);
  CHECK(g.stages[0].cp_comm_s > r.stages[0].cp_comm_s);
  // torchtitan's all-gather rotate: the gather hides behind the local block only (at 128K all of
  // it: one launch left, where the ring pays one per step).
  FrameworkProfile behind = gather;
  behind.cp = CpStyle::kGatherBehindLocal;
  CostOptions c;
  c.profile = &behind;
  const TimeEstimate t = EstimateTime(plan, c);
  REQUIRE(t.valid);
  CHECK(t.stages[0].cp_comm_s < g.stages[0].cp_comm_s);
  CHECK(t.stages[0].cp_comm_s > 0);
  CHECK(ProfileFor("torchtitan", plan.cluster.gpu).cp == CpStyle::kGatherBehindLocal);
  // Short sequences: the ring's K/V blocks outlast their 1/cp share of the core.
  plan.model.seq_len = 4096;
  plan.batch.global = 512;
  CHECK(EstimateTime(plan, a).stages[0].cp_comm_s > 0);
}

TEST_CASE("ZeRO-3 under DeepSpeed ranks below 3D parallelism for GPT-3 175B (Narayanan Table 2)") {
  // 175B on 768 A100: ZeRO-3 with micro batch 2 against TP 8 x PP 12 x DP 8, both 1,536 sequences.
  Plan zero3 = testing::MakePlan(testing::Gpt(96, 12288, 96), testing::DgxA100(96), 1, 1, 1536, 2);
  zero3.optimizer.zero = 3;
  zero3.recompute = Recompute::kFull;
  zero3.precision = Precision::kFp16;
  zero3.framework = Framework::kDeepSpeed;
  Plan ptd = testing::MakePlan(testing::Gpt(96, 12288, 96), testing::DgxA100(96), 8, 12, 1536, 1);
  ptd.recompute = Recompute::kFull;
  ptd.precision = Precision::kFp16;
  ptd.framework = Framework::kMegatronLm2021;
  const TimeEstimate z = EstimateTime(zero3), p = EstimateTime(ptd);
  REQUIRE(z.valid);
  REQUIRE(p.valid);
  CHECK(z.tokens_per_s_per_gpu < p.tokens_per_s_per_gpu);
  // The per-layer gathers are what ZeRO-3 pays: without them it would be the faster one.
  FrameworkProfile ideal = ProfileFor("deepspeed", zero3.cluster.gpu);
  ideal.shard_comm_scale = 0;
  ideal.collective_latency_s = 0;
  CostOptions o;
  o.profile = &ideal;
  CHECK(EstimateTime(zero3, o).step_s < z.step_s);
}

TEST_CASE("a ring step inside a node costs a third of one across nodes (NCCL's hwLat)") {
  const GpuEfficiency& eff = EfficiencyFor(GpuSpec{.name = "a100_80gb"});
  const double a = eff.collective_latency_s;
  CHECK(RingStepsLatency(CommGroup{1, 1}, eff) == 0);
  CHECK(RingStepsLatency(CommGroup{8, 8}, eff) == doctest::Approx(7 * a / 3));  // one node
  CHECK(RingStepsLatency(CommGroup{4, 1}, eff) == doctest::Approx(3 * a));      // a GPU per node
  // 384 ranks on 48 nodes: 47 network steps and 336 over NVLink.
  CHECK(RingStepsLatency(CommGroup{384, 8}, eff) == doctest::Approx((47 + 336.0 / 3) * a));
}

TEST_CASE("DeepSpeed's ZeRO-3 covers part of its traffic with compute (Narayanan Table 2)") {
  // 175B on 384 and 768 A100, 1,536 sequences: micro batch 4 and 2, the same traffic per GPU.
  // Measured 81.6 s and 66.8 s a step: halving the compute shortens the step by much less
  // than the compute itself.
  auto run = [](int64_t nodes, int64_t micro) {
    Plan plan =
        testing::MakePlan(testing::Gpt(96, 12288, 96), testing::DgxA100(nodes), 1, 1, 1536, micro);
    plan.optimizer.zero = 3;
    plan.recompute = Recompute::kFull;
    plan.precision = Precision::kFp16;
    plan.framework = Framework::kDeepSpeed;
    return EstimateTime(plan);
  };
  const TimeEstimate t384 = run(48, 4), t768 = run(96, 2);
  REQUIRE(t384.valid);
  REQUIRE(t768.valid);
  CHECK(t384.step_s == doctest::Approx(81.6).epsilon(0.05));
  CHECK(t768.step_s == doctest::Approx(66.8).epsilon(0.05));
  const double compute_saved = t384.stages[0].gemm_s + t384.stages[0].memory_s +
                               t384.stages[0].recompute_s - t768.stages[0].gemm_s -
                               t768.stages[0].memory_s - t768.stages[0].recompute_s;
  CHECK(t384.step_s - t768.step_s < 0.8 * compute_saved);
}

TEST_CASE(
    "FSDP2 with pipeline parallelism gathers parameters once per step, not every microbatch") {
  Plan plan = Llama(8, 8, 2);
  plan.optimizer.zero = 3;
  plan.framework = Framework::kTorchtitan;
  const TimeEstimate fsdp2 = EstimateTime(plan);
  plan.framework = Framework::kMegatronCore;
  const TimeEstimate per_microbatch = EstimateTime(plan);
  REQUIRE(fsdp2.valid);
  REQUIRE(per_microbatch.valid);
  CHECK(fsdp2.stages[0].dp_sync_s > 0);            // once per step
  CHECK(per_microbatch.stages[0].dp_sync_s == 0);  // inside every microbatch instead
}

TEST_CASE("under FP8 the forward's TP all-gathers move FP8 inputs: half their bytes") {
  Plan plan = Llama(8, 8, 1);
  plan.framework = Framework::kTorchtitan;  // no TP overlap: the collectives are all exposed
  plan.recompute = Recompute::kNone;
  plan.parallel.sp = true;
  plan.cluster.gpu.peak_fp8 = plan.cluster.gpu.peak_bf16;  // the same GEMM time
  const TimeEstimate bf16 = EstimateTime(plan);
  plan.precision = Precision::kFp8;
  const TimeEstimate fp8 = EstimateTime(plan);
  REQUIRE(bf16.valid);
  REQUIRE(fp8.valid);
  // Forward: reduce-scatter (2 bytes) + all-gather (1 byte) = 3/4 of the bf16 pass; backward
  // unchanged: 7/8 of the bf16 layer's TP time (the latency terms aside).
  CHECK(fp8.stages[0].tp_comm_s == doctest::Approx(0.875 * bf16.stages[0].tp_comm_s).epsilon(0.01));
  // Without SP the layer's collectives are all-reduces of its outputs: nothing gathered, nothing
  // in FP8.
  plan.parallel.sp = false;
  const TimeEstimate fp8_no_sp = EstimateTime(plan);
  plan.precision = Precision::kBf16;
  CHECK(fp8_no_sp.stages[0].tp_comm_s == doctest::Approx(EstimateTime(plan).stages[0].tp_comm_s));
}

TEST_CASE("TP communication overlap hides TP collectives behind the linear GEMMs") {
  Plan plan = Llama(8, 8, 1);
  plan.framework = Framework::kTorchtitan;  // no overlap unless async TP is on
  CostOptions async_tp;
  async_tp.tp_comm_overlap = true;
  const TimeEstimate off = EstimateTime(plan), on = EstimateTime(plan, async_tp);
  CHECK(off.stages[0].tp_comm_s > 0);
  CHECK(on.stages[0].tp_comm_s < 0.5 * off.stages[0].tp_comm_s);
  CHECK(on.step_s < off.step_s);
  // The plan field states the same overlap: the same step, no option needed.
  plan.parallel.tp_comm_overlap = true;
  const TimeEstimate field = EstimateTime(plan);
  CHECK(field.stages[0].tp_comm_s == doctest::Approx(on.stages[0].tp_comm_s));
  CHECK(field.step_s == doctest::Approx(on.step_s));
  CHECK(field.step_s < off.step_s);
}

TEST_CASE("fixed per-layer and per-step costs of a profile add up on small models") {
  Plan plan = testing::MakePlan(testing::Gpt(24, 2048, 16), testing::DgxH100(1), 1, 1, 64, 8);
  plan.framework = Framework::kLlmFoundry;
  FrameworkProfile prof = ProfileFor("llm_foundry", plan.cluster.gpu);
  prof.layer_overhead_s = 0;
  CostOptions o;
  o.profile = &prof;
  const double base = EstimateTime(plan, o).step_s;
  prof.layer_overhead_s = 1e-3;
  const TimeEstimate t = EstimateTime(plan, o);
  // 24 layers x 1 ms per microbatch, 1 microbatch per step.
  CHECK(t.step_s - base == doctest::Approx(24 * 1e-3).epsilon(0.01));
}

TEST_CASE(
    "llm-foundry's attention runs at the documented FlashAttention-1 rate: 1/1.8 of "
    "FlashAttention-2, which reaches 35% of the H100 peak") {
  const FrameworkProfile& a = ProfileFor("llm_foundry", testing::DgxA100(1).gpu);
  const FrameworkProfile& h = ProfileFor("llm_foundry", testing::DgxH100(1).gpu);
  CHECK(a.attention_documented);
  CHECK(h.attention_documented);
  CHECK(a.attention_scale == doctest::Approx(1 / 1.8));
  // Of the Hopper set's fused-attention fraction (FlashAttention-2's 0.35): 0.35 / 1.8 of peak.
  CHECK(h.attention_scale * EfficiencyFor(testing::DgxH100(1).gpu).attention_fraction ==
        doctest::Approx(0.35 / 1.8));
  CHECK(!ProfileFor("megatron_core", testing::DgxH100(1).gpu).attention_documented);
  // At 32K the attention core dominates: the documented rate slows the step by nearly the
  // kernels' ratio, at 2K by much less.
  for (const int64_t seq : {int64_t{2048}, int64_t{32768}}) {
    Plan plan = testing::MakePlan(testing::Gpt(32, 4096, 32, seq), testing::DgxA100(1), 1, 1, 8, 1);
    plan.framework = Framework::kLlmFoundry;
    plan.optimizer.zero = 3;
    FrameworkProfile nominal = a;
    nominal.attention_scale = 1;
    CostOptions o;
    o.profile = &nominal;
    const TimeEstimate fast = EstimateTime(plan, o);
    const TimeEstimate slow = EstimateTime(plan);
    REQUIRE(fast.valid);
    REQUIRE(slow.valid);
    const double ratio = slow.step_s / fast.step_s;
    if (seq == 2048) {
      CHECK(ratio > 1.001);  // slower attention also hides more of the FSDP traffic
      CHECK(ratio < 1.2);
    } else {
      CHECK(ratio > 1.3);
      CHECK(ratio < 1.8);
    }
  }
}

TEST_CASE("the report says how close the pricing profile came to the published runs") {
  Plan plan = Llama(8, 8, 1);
  plan.framework = Framework::kMegatronCore;
  const TimeEstimate hopper = EstimateTime(plan);
  REQUIRE(hopper.valid);
  const FrameworkProfile& prof = ProfileFor("megatron_core", plan.cluster.gpu);
  REQUIRE(prof.checked.runs > 0);
  CHECK(hopper.checked.runs == prof.checked.runs);
  const std::string text = PrintTime(hopper);
  CHECK(text.find("checked on " + std::to_string(prof.checked.runs) +
                  " published megatron_core runs") != std::string::npos);
  // planrun (`paraplan`) is priced as Megatron-Core: its runs are Megatron-Core's.
  plan.framework = Framework::kParaplan;
  CHECK(PrintTime(EstimateTime(plan)).find("published megatron_core runs") != std::string::npos);
  // Megatron-Core on Ampere has no published run in the calibration.
  plan.framework = Framework::kMegatronCore;
  plan.cluster.gpu.name = "a100_sxm4_80gb";
  CHECK(PrintTime(EstimateTime(plan)).find("unchecked") != std::string::npos);
}

TEST_CASE("every stack has a profile for Ampere and Hopper, the plan's framework selects it") {
  for (std::string_view stack : FrameworkStacks()) {
    const FrameworkProfile& a = ProfileFor(stack, testing::DgxA100(1).gpu);
    const FrameworkProfile& h = ProfileFor(stack, testing::DgxH100(1).gpu);
    CHECK(a.stack == stack);
    CHECK(h.stack == stack);
    CHECK(!a.provenance.empty());
  }
  CHECK(ProfileFor("no_such_stack", testing::DgxH100(1).gpu).stack == "paraplan");
  Plan plan = Llama(8, 8, 1);
  plan.framework = Framework::kMegatronLm2021;
  bool named = false;
  CHECK(FrameworkOf(plan, {}, &named) == "megatron_lm_2021");
  CHECK(named);
  // Its software flags come with it: unfused attention, dropout, no DP overlap.
  const CostOptions o = OptionsForFramework(plan, {});
  CHECK(!o.flash_attention);
  CHECK(o.dropout);
  CHECK(!o.overlap_grad_reduce);
}

TEST_CASE(
    "plan refinements the time model reads: reshard_after_forward, window, block recompute, "
    "imbalance") {
  // ZeRO-3 that keeps the forward's gathered weights skips the backward gather.
  Plan plan = Llama(8, 8, 1);
  plan.model.seq_len = 1024;
  plan.batch.global = 512;
  plan.optimizer.zero = 3;
  plan.framework = Framework::kDeepSpeed;
  const double resharded = EstimateTime(plan).stages[0].microbatch_s;
  plan.fsdp.reshard_after_forward = false;
  CHECK(EstimateTime(plan).stages[0].microbatch_s < resharded);
  // A sliding window caps the attention work at long sequences.
  Plan longseq = Llama(8, 8, 1);
  longseq.framework = Framework::kMegatronCore;
  longseq.model.seq_len = 32768;
  longseq.batch.global = 32;
  const double full = EstimateTime(longseq).step_s;
  longseq.model.window = 4096;
  CHECK(EstimateTime(longseq).step_s < 0.8 * full);
  // Block recompute of some layers of each chunk costs less than recomputing all of them.
  Plan rc = Llama(8, 8, 4);
  rc.recompute = Recompute::kFull;
  const double all_layers = EstimateTime(rc).step_s;
  rc.activations.recompute_method = RecomputeMethod::kBlock;
  rc.activations.recompute_layers = 5;  // of 20 per stage
  const double some = EstimateTime(rc).step_s;
  rc.recompute = Recompute::kNone;
  const double none = EstimateTime(rc).step_s;
  CHECK(some < all_layers);
  CHECK(some > none);
  // A stated routing imbalance slows the experts.
  Plan moe = testing::MakePlan(testing::DeepSeekV2(), testing::DgxH100(32), 8, 1, 1024, 1);
  moe.parallel.ep = 32;
  moe.parallel.sp = true;
  moe.recompute = Recompute::kFull;
  moe.framework = Framework::kMegatronCore;
  const double balanced = EstimateTime(moe).step_s;
  moe.moe.imbalance = 1.5;
  CHECK(EstimateTime(moe).step_s > balanced);
}

TEST_CASE(
    "HSDP: ZeRO-3 gathers within the shard group, the shards are all-reduced over the replicas") {
  Plan plan = Llama(16, 8, 1);  // dp 16 over 16 nodes
  plan.model.seq_len = 2048;
  plan.batch.global = 256;
  plan.optimizer.zero = 3;
  plan.framework = Framework::kTorchtitan;
  const TimeEstimate fsdp = EstimateTime(plan);
  plan.fsdp.replicate = 4;  // shard over 4, replicate 4 times
  const TimeEstimate hsdp = EstimateTime(plan);
  REQUIRE(fsdp.valid);
  REQUIRE(hsdp.valid);
  CHECK(fsdp.stages[0].dp_sync_s == 0);  // all of ZeRO-3's traffic is per microbatch
  CHECK(hsdp.stages[0].dp_sync_s > 0);   // the replica all-reduce, once per step
}

}  // namespace
}  // namespace paraplan
