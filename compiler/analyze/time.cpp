#include "compiler/analyze/time.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "compiler/analyze/cost_comm.h"
#include "compiler/analyze/cost_framework.h"
#include "compiler/analyze/cost_shape.h"
#include "compiler/analyze/cost_stages.h"
#include "compiler/analyze/memory.h"

namespace paraplan {
namespace {

double D(int64_t v) { return static_cast<double>(v); }

// Seconds for a GEMM of `flops` FLOP at the size-dependent efficiency.
double GemmSeconds(double flops, double peak, const GpuEfficiency& eff) {
  if (flops <= 0) return 0;
  const double fraction = eff.gemm_max_fraction * flops / (flops + eff.gemm_half_flops);
  return flops / (peak * fraction);
}

// Keys per fused-attention call at which the kernel reaches half its large-sequence rate
// (FlashAttention-2/3 and cuDNN forward+backward rates grow with the key length up to ~8K:
// Dao 2023 Fig. 4-7, Shah et al. 2024 Fig. 5), and the head size at which the rate is 80%
// of the head-128 rate (head 64 runs at ~0.8 of head 128 in the same figures).
constexpr double kAttentionHalfKeys = 384;
constexpr double kAttentionHeadKnee = 32;

// Fraction of the large-sequence fused-attention rate for calls over `keys` keys of head size d.
double AttentionShape(double keys, double d) {
  const double seq = keys / (keys + kAttentionHalfKeys);
  const double head = (d / (d + kAttentionHeadKnee)) / (128.0 / (128.0 + kAttentionHeadKnee));
  return seq * std::min(1.2, head);
}

// One layer's forward on one GPU for one microbatch.
struct LayerCost {
  double gemm_s = 0;          // forward GEMMs (backward = 2x)
  double linear_s = 0;        // the linear-layer part of gemm_s (what TP overlap can hide behind)
  double core_s = 0;          // the attention-core part of gemm_s
  double memory_s = 0;        // forward memory-bound time (backward = 2x)
  double score_memory_s = 0;  // the attention-score part of memory_s
  double tp_s = 0;            // one pass of TP collectives (2 per layer)
  double cp_s = 0;            // forward CP exchange, exposed
  double ep_s = 0;            // forward EP all-to-alls (dispatch + combine)
  double flops = 0;           // model FLOPs (causal halved), forward
};

struct Context {
  const Plan& plan;
  const CostOptions& options;  // software flags of the plan's framework (OptionsForFramework)
  const FrameworkProfile& prof;
  const GpuEfficiency& eff;  // the GPU's set, scaled by the profile's compute_scale
  CommGroups groups;
  double peak;            // linear GEMMs: bf16 peak, times the FP8 speedup under fp8
  double peak_attention;  // attention core: bf16 (FP8 training keeps attention in bf16)
  double hbm;
};

LayerCost CostOfLayer(const Context& cx, LayerKind kind) {
  const Plan& plan = cx.plan;
  const ModelSpec& m = plan.model;
  const ParallelSpec& par = plan.parallel;
  const double t = D(std::max<int64_t>(1, par.tp));
  const double micro_tokens = D(m.seq_len) * D(plan.batch.micro) / D(std::max<int64_t>(1, par.cp));
  const double h = D(m.hidden), a = D(m.heads), x = D(ActivationElementBytes(plan.precision));
  const double s = D(m.seq_len);
  // Keys per query the kernel executes: causal half of s when fused, all s unfused; a sliding
  // window of w keys (model.window) caps both.
  const double window = m.window > 0 && D(m.window) < s ? D(m.window) : 0;
  const double exec_ctx = window > 0 ? (cx.options.flash_attention ? window : s)
                                     : (cx.options.flash_attention ? s / 2 : s);
  const bool gated = m.activation == Activation::kSwiGlu;
  LayerCost c;
  c.flops = LayerForwardFlopsPerToken(m, kind, s / 2) * micro_tokens /
            t;  // rough per-GPU share for reports
  auto gemm = [&](double flops) { return GemmSeconds(flops, cx.peak, cx.eff); };
  double head_dim = 0;
  // Attention.
  double core_flops_per_head_token = 0;
  if (m.IsMla()) {
    const double qk = D(m.qk_nope_head_dim + m.qk_rope_head_dim), v = D(m.v_head_dim);
    const double ql = D(m.q_lora_rank), kl = D(m.kv_lora_rank);
    if (ql > 0)
      c.gemm_s += gemm(2 * micro_tokens * h * ql) + gemm(2 * micro_tokens * ql * a * qk / t);
    else
      c.gemm_s += gemm(2 * micro_tokens * h * a * qk / t);
    c.gemm_s += gemm(2 * micro_tokens * h * (kl + D(m.qk_rope_head_dim))) +
                gemm(2 * micro_tokens * kl * a * (D(m.qk_nope_head_dim) + v) / t);
    c.gemm_s += gemm(2 * micro_tokens * a * v * h / t);
    core_flops_per_head_token = 2 * (qk + v) * exec_ctx;
    head_dim = (qk + v) / 2;
  } else {
    const double d = D(m.head_dim > 0 ? m.head_dim : m.hidden / std::max<int64_t>(1, m.heads));
    const double kv = D(m.kv_heads > 0 ? m.kv_heads : m.heads) * d;
    c.gemm_s +=
        gemm(2 * micro_tokens * h * (a * d + 2 * kv) / t) + gemm(2 * micro_tokens * a * d * h / t);
    core_flops_per_head_token = 4 * d * exec_ctx;
    head_dim = d;
  }
  c.linear_s = c.gemm_s;
  {
    // Batched GEMMs per (sequence, head) without fusion; a fused attention kernel with it, at
    // its own efficiency (GpuEfficiency::attention_fraction).
    const double heads_rank = a / t;
    const double total = core_flops_per_head_token * micro_tokens * heads_rank;
    if (cx.options.flash_attention) {
      // One fused kernel per layer (per ring step under CP: keys per call s / cp).
      const double keys = s / D(std::max<int64_t>(1, par.cp));
      c.core_s =
          total / (cx.peak_attention * cx.eff.attention_fraction * AttentionShape(keys, head_dim));
    } else {
      const double pieces = D(plan.batch.micro) * heads_rank;  // batched per (sequence, head)
      c.core_s = pieces * GemmSeconds(total / pieces, cx.peak_attention, cx.eff);
    }
    c.gemm_s += c.core_s;
  }
  // MLP.
  const double up = gated ? 2 : 1;
  if (kind == LayerKind::kDense) {
    const double f = D(m.ffn_hidden);
    c.gemm_s += gemm(2 * micro_tokens * h * f * up / t) + gemm(2 * micro_tokens * f * h / t);
    c.linear_s += gemm(2 * micro_tokens * h * f * up / t) + gemm(2 * micro_tokens * f * h / t);
  } else {
    const double fe = D(m.moe_ffn_hidden);
    const double etp = D(std::max<int64_t>(1, par.etp));
    c.gemm_s += gemm(2 * micro_tokens * h * D(m.experts) / t);  // router on the rank's tokens
    if (m.shared_experts > 0) {
      const double fs = fe * D(m.shared_experts);
      c.gemm_s += gemm(2 * micro_tokens * h * fs * up / t) + gemm(2 * micro_tokens * fs * h / t);
    }
    ActivationShape shape;
    shape.seq = m.seq_len;
    shape.micro = plan.batch.micro;
    shape.tp = par.tp;
    shape.cp = par.cp;
    shape.etp = par.etp;
    shape.sp = par.sp;
    shape.options = cx.options;
    const double pairs = D(RoutedPairsPerRank(m, shape));
    const double local_experts = std::max(1.0, D(m.experts) / D(std::max<int64_t>(1, par.ep)));
    const double per_expert = pairs / local_experts;
    // Grouped GEMM: one GEMM per local expert at the efficiency of its own size.
    const double experts_s = local_experts * (gemm(2 * per_expert * h * fe * up / etp) +
                                              gemm(2 * per_expert * fe * h / etp));
    c.gemm_s += experts_s;
    // Dispatch and combine: each rank sends the routed copies of its own (sequence-parallel)
    // tokens over EP; with ETP > 1 the received tokens are all-gathered over ETP before the
    // experts and reduce-scattered after them (Megatron's all-to-all dispatcher).
    c.ep_s = 2 * CollectiveSeconds(Collective::kAllToAll, pairs / etp * h * x, cx.groups.ep,
                                   plan.cluster, cx.eff);
    if (par.etp > 1) {
      c.ep_s += CollectiveSeconds(Collective::kAllGather, pairs * h * x, cx.groups.etp,
                                  plan.cluster, cx.eff) +
                CollectiveSeconds(Collective::kReduceScatter, pairs * h * x, cx.groups.etp,
                                  plan.cluster, cx.eff);
    }
    // Overlapped where the stack does it (the profile's share): Megatron-Core's EP overlap runs
    // one microbatch's dispatch/combine under another's layer compute, so the layer's GEMMs
    // (attention and experts) bound what can hide.
    if (par.ep > 1 || par.etp > 1)
      c.ep_s = std::max(c.ep_s * (1 - cx.prof.ep_overlap), c.ep_s - c.gemm_s);
    // Router softmax/top-k, permute and unpermute: memory-bound passes over the routed copies.
    c.memory_s += 4 * pairs * h * x / cx.hbm;
  }
  // Memory-bound kernels: proportional to the bytes a layer stores with no recompute.
  ActivationShape shape;
  shape.seq = m.seq_len;
  shape.micro = plan.batch.micro;
  shape.tp = par.tp;
  shape.cp = par.cp;
  shape.etp = par.etp;
  shape.sp = par.sp;
  shape.element_bytes = ActivationElementBytes(plan.precision);
  shape.options = cx.options;
  shape.recompute = Recompute::kNone;
  const double stored = D(LayerActivationBytes(m, kind, shape));
  shape.recompute = Recompute::kSelective;
  const double without_scores = D(LayerActivationBytes(m, kind, shape));
  c.memory_s += cx.eff.elementwise_passes * stored / cx.hbm;
  c.score_memory_s = cx.eff.elementwise_passes * (stored - without_scores) / cx.hbm;
  // TP/SP: two all-reduces (or all-gather + reduce-scatter pairs) per pass.
  // With overlap (Megatron tp_comm_overlap, torchtitan async TP) a share of it hides behind the
  // linear GEMMs, never more than their time.
  if (par.tp > 1) {
    c.tp_s = 2 * CollectiveSeconds(Collective::kAllReduce, micro_tokens * h * x, cx.groups.tp,
                                   plan.cluster, cx.eff);
    const bool overlap = par.tp_comm_overlap || cx.options.tp_comm_overlap;
    const double share = overlap ? std::max(cx.prof.tp_overlap, 0.8) : cx.prof.tp_overlap;
    if (share > 0) c.tp_s = std::max(c.tp_s * (1 - share), c.tp_s - c.linear_s);
  }
  // CP ring: cp - 1 steps of the local K and V, hidden behind the attention core.
  if (par.cp > 1) {
    double kv_width;
    if (m.IsMla()) {
      kv_width = a * D(m.qk_nope_head_dim + m.qk_rope_head_dim + m.v_head_dim);
    } else {
      const double d = D(m.head_dim > 0 ? m.head_dim : m.hidden / std::max<int64_t>(1, m.heads));
      kv_width = 2 * D(m.kv_heads > 0 ? m.kv_heads : m.heads) * d;
    }
    const double chunk = micro_tokens * kv_width / t * x;
    const double steps = D(par.cp - 1);
    if (cx.prof.cp == CpStyle::kAllGather) {
      // K/V all-gathered before the core (dK/dV reduce-scattered after it), not overlapped.
      c.cp_s = CollectiveSeconds(Collective::kAllGather, chunk * D(par.cp), cx.groups.cp,
                                 plan.cluster, cx.eff) +
               cx.prof.collective_latency_s;
    } else {
      // Ring with load-balanced causal chunks (2·cp chunks, each rank equal work): cp - 1 steps,
      // each sending the local K/V while one 1/cp block of the core runs; a step costs the
      // longer of the two plus one launch.
      const double send =
          CollectiveSeconds(Collective::kPointToPoint, chunk, cx.groups.cp, plan.cluster, cx.eff);
      c.cp_s = steps * (std::max(0.0, send - c.core_s / D(par.cp)) + cx.prof.collective_latency_s);
    }
  }
  // Fixed costs per layer (launches, small kernels, framework dispatch): a third forward.
  c.memory_s += cx.prof.layer_overhead_s / 3 * (kind == LayerKind::kMoe ? 2 : 1);
  return c;
}

}  // namespace

double ModelFlopsPerToken(const ModelSpec& m, bool causal_halved) {
  const double ctx = causal_halved ? D(m.seq_len) / 2 : D(m.seq_len);
  double forward = LogitsForwardFlopsPerToken(m);
  const int64_t dense = m.IsMoe() ? std::min(m.dense_layers, m.layers) : m.layers;
  forward += D(dense) * LayerForwardFlopsPerToken(m, LayerKind::kDense, ctx);
  if (m.IsMoe())
    forward += D(m.layers - dense) * LayerForwardFlopsPerToken(m, LayerKind::kMoe, ctx);
  return 3 * forward;
}

TimeEstimate EstimateTime(const Plan& plan, const CostOptions& options) {
  return EstimateTime(plan, options, EstimateMemory(plan, options));
}

TimeEstimate EstimateTime(const Plan& plan, const CostOptions& given, const MemoryEstimate& mem) {
  TimeEstimate est;
  const CostOptions options = OptionsForFramework(plan, given);
  std::vector<CostChunk> chunks;
  if (!StageChunks(plan, chunks)) return est;
  const ModelSpec& m = plan.model;
  const ParallelSpec& par = plan.parallel;
  const int64_t p = par.pp, v = par.vpp;
  const double peak = PeakFlops(plan);
  if (peak <= 0 || plan.cluster.gpu.hbm_bandwidth <= 0) return est;
  const FrameworkProfile& prof =
      options.profile ? *options.profile : ProfileFor(FrameworkOf(plan, options), plan.cluster.gpu);
  GpuEfficiency eff = EfficiencyFor(plan.cluster.gpu, options);
  eff.gemm_max_fraction = std::min(0.98, eff.gemm_max_fraction * prof.compute_scale);
  eff.attention_fraction =
      std::min(0.95, eff.attention_fraction * prof.compute_scale * prof.attention_scale);
  eff.p2p_latency_s = prof.p2p_latency_s;
  // Linear GEMMs: the 16-bit peak (fp32: TF32), times the stack's FP8 speedup under fp8; the
  // attention core stays in bf16 (Transformer Engine, torchao and llm-foundry FP8 recipes).
  const double peak16 = plan.precision == Precision::kFp32 ? peak
                        : plan.precision == Precision::kFp16 && plan.cluster.gpu.peak_fp16 > 0
                            ? plan.cluster.gpu.peak_fp16
                            : plan.cluster.gpu.peak_bf16;
  const double peak_linear = UsesFp8(plan) ? peak16 * prof.fp8_gemm_speedup : peak16;
  est.framework = prof.stack;
  est.generation = prof.generation;
  Context cx{plan,
             options,
             prof,
             eff,
             PlaceGroups(plan),
             peak_linear,
             peak16,
             plan.cluster.gpu.hbm_bandwidth * eff.hbm_fraction};
  const int64_t world = std::max<int64_t>(1, plan.World());
  const int64_t denom = std::max<int64_t>(1, plan.batch.micro * par.dp);
  est.microbatches = std::max<int64_t>(1, plan.batch.global / denom);
  const double mb = D(est.microbatches);
  const double t = D(std::max<int64_t>(1, par.tp));
  const double micro_tokens = D(m.seq_len) * D(plan.batch.micro) / D(std::max<int64_t>(1, par.cp));
  const double x = D(ActivationElementBytes(plan.precision));

  const LayerCost dense = CostOfLayer(cx, LayerKind::kDense);
  const LayerCost moe = m.IsMoe() ? CostOfLayer(cx, LayerKind::kMoe) : LayerCost{};
  // Loss: logits GEMM and the vocab-parallel cross entropy (memory-bound over fp32 logits).
  const double logits_gemm =
      GemmSeconds(2 * micro_tokens * D(m.hidden) * D(m.vocab) / t, peak16, eff);
  const double loss_memory =
      eff.elementwise_passes * 3 * 4 * micro_tokens * D(m.vocab) / t / cx.hbm;
  const double p2p_bytes =
      micro_tokens * D(m.hidden) * x / t;  // SP / scatter-gather split activations
  CommGroup pp_link;
  pp_link.size = 2;
  pp_link.per_node = cx.groups.pp_crosses_nodes ? 1 : 2;
  const double p2p =
      p > 1 ? CollectiveSeconds(Collective::kPointToPoint, p2p_bytes, pp_link, plan.cluster, eff)
            : 0;

  // Element sizes of the DP traffic from the precision record (gradients reduced in their
  // stored type; parameters gathered in theirs).
  const MixedPrecisionSpec mp = EffectiveMixedPrecision(plan);
  auto bytes_of = [](ElementType e) {
    return e == ElementType::kFp32 ? 4.0 : e == ElementType::kFp8 ? 1.0 : 2.0;
  };
  const double grad_elem = bytes_of(mp.grads);
  const double param_elem = bytes_of(mp.params);

  est.stages.resize(static_cast<size_t>(p));
  double u_max = 0, u_sum = 0;
  for (int64_t r = 0; r < p; ++r) {
    StageTime& st = est.stages[static_cast<size_t>(r)];
    st.stage = r;
    double fwd = 0;
    for (int64_t c = 0; c < v; ++c) {
      const CostChunk& chunk = chunks[static_cast<size_t>(c * p + r)];
      const int64_t first = chunk.first_layer, end = chunk.first_layer + chunk.layers;
      const int64_t dense_end = m.IsMoe() ? std::clamp(m.dense_layers, first, end) : end;
      for (int kind = 0; kind < 2; ++kind) {
        const int64_t n = kind == 0 ? dense_end - first : end - dense_end;
        if (n <= 0) continue;
        const LayerCost& lc = kind == 0 ? dense : moe;
        const double nl = D(n);
        st.flops += nl * 3 * lc.flops;
        st.gemm_s += nl * 3 * lc.gemm_s;
        st.memory_s += nl * 3 * lc.memory_s;
        double tp_passes = 2;
        if (plan.recompute == Recompute::kFull) {
          // recompute_method = block recomputes only the first recompute_layers layers of each
          // chunk; uniform recomputes every layer.
          double share = 1;
          const ActivationSpec& act = plan.activations;
          if (act.recompute_method == RecomputeMethod::kBlock && act.recompute_layers > 0 &&
              chunk.layers > 0)
            share = std::min(1.0, D(act.recompute_layers) / D(chunk.layers));
          st.recompute_s += share * nl * (lc.gemm_s + lc.memory_s);
          tp_passes = 2 + share;
          st.cp_comm_s += share * nl * lc.cp_s;
          st.ep_comm_s += share * nl * lc.ep_s;
        } else if (plan.recompute == Recompute::kSelective) {
          st.recompute_s += nl * (lc.core_s + lc.score_memory_s);
        }
        st.tp_comm_s += nl * tp_passes * lc.tp_s;
        st.cp_comm_s += nl * 3 * lc.cp_s;
        st.ep_comm_s += nl * 2 * lc.ep_s;
        fwd += nl * (lc.gemm_s + lc.memory_s + lc.tp_s + lc.cp_s + lc.ep_s);
      }
      if (chunk.loss) {
        st.flops += 3 * 2 * micro_tokens * D(m.hidden) * D(m.vocab) / t;
        st.gemm_s += 3 * logits_gemm;
        st.memory_s += loss_memory;
        fwd += logits_gemm + loss_memory / 3;
      }
      // Each chunk receives its input and sends its output, forward and backward.
      if (p > 1) st.pp_comm_s += 2 * p2p;
    }
    st.forward_s = fwd;
    st.microbatch_s = st.gemm_s + st.memory_s + st.recompute_s + st.tp_comm_s + st.cp_comm_s +
                      st.ep_comm_s + st.pp_comm_s;
    const double backward = st.microbatch_s - fwd;
    // DP: gradients reduced over DP x CP (dense) and expert DP (experts); parameters gathered
    // back from ZeRO 1 on.
    double sync = 0;
    if (mem.valid) {
      const StageMemory& sm = mem.stages[static_cast<size_t>(r)];
      const double total_params = D(sm.params);
      // Split the stage's parameters into expert and shared by the model's ratio on the stage.
      double expert_params = 0;
      if (m.IsMoe()) {
        const LayerParams lp = ParamsOfLayer(m, LayerKind::kMoe);
        int64_t moe_layers = 0;
        for (int64_t c = 0; c < v; ++c) {
          const CostChunk& chunk = chunks[static_cast<size_t>(c * p + r)];
          const int64_t first = chunk.first_layer, end = first + chunk.layers;
          moe_layers += end - std::clamp(m.dense_layers, first, end);
        }
        expert_params = D(moe_layers) * D(lp.expert) / D(std::max<int64_t>(1, par.ep * par.etp));
      }
      const double shared_params = std::max(0.0, total_params - expert_params);
      // Per step (Megatron's distributed optimizer and plain DP): gradients reduced once after the
      // last microbatch, parameters gathered back after the optimizer from ZeRO 1 on. From ZeRO 2
      // the gradients are sharded, so they are reduce-scattered after every microbatch's backward
      // (they cannot accumulate unsharded); ZeRO 3 also gathers the parameters for every
      // microbatch's forward and backward (P0503's reasoning; ZeRO paper Sec. 5, with gradient
      // accumulation). Per-microbatch traffic hides behind that microbatch's compute.
      const int zero = static_cast<int>(plan.optimizer.zero);
      auto gather = [&](double params, const CommGroup& g) {
        if (g.size <= 1 || params <= 0) return 0.0;
        return CollectiveSeconds(Collective::kAllGather, params * param_elem, g, plan.cluster, eff);
      };
      auto scatter = [&](double params, const CommGroup& g) {
        if (g.size <= 1 || params <= 0) return 0.0;
        return CollectiveSeconds(zero == 0 ? Collective::kAllReduce : Collective::kReduceScatter,
                                 params * grad_elem, g, plan.cluster, eff);
      };
      // HSDP (fsdp.replicate > 1 or fsdp.shard below dp·cp): the states are sharded over the
      // inner shard group; the shards are all-reduced over the replicas once per step.
      const int64_t shard_group = std::clamp<int64_t>(ShardGroup(plan), 1, cx.groups.dp_cp.size);
      CommGroup dense_group = cx.groups.dp_cp, replicas;
      if (zero >= 1 && shard_group < cx.groups.dp_cp.size) {
        dense_group.size = shard_group;
        dense_group.per_node = std::min(shard_group, cx.groups.dp_cp.per_node);
        replicas.size = cx.groups.dp_cp.size / shard_group;
        replicas.per_node = std::max<int64_t>(1, cx.groups.dp_cp.per_node / shard_group);
      }
      const double grads_s =
          scatter(shared_params, dense_group) + scatter(expert_params, cx.groups.edp);
      const double params_s =
          gather(shared_params, dense_group) + gather(expert_params, cx.groups.edp);
      const double replica_s = replicas.size > 1
                                   ? CollectiveSeconds(Collective::kAllReduce,
                                                       shared_params / D(shard_group) * grad_elem,
                                                       replicas, plan.cluster, eff)
                                   : 0;
      double step_grads = (zero <= 1 ? grads_s : 0) + replica_s;
      double step_params = zero == 1 || zero == 2 ? params_s : 0;
      // FSDP2 with pipeline parallelism (torchtitan, Llama 3) keeps the parameters gathered over
      // the step and reduces the gradients once: priced like the distributed optimizer.
      const bool once_per_step = prof.shard == ShardStyle::kFsdp && p > 1;
      if (zero >= 2 && once_per_step) {
        step_grads = grads_s;
        step_params = params_s;
      } else if (zero >= 2) {
        // Per microbatch, layer by layer: the forward gathers each layer's parameters (ZeRO 3),
        // the backward gathers them again and reduce-scatters the gradients. The next layer's
        // gather is prefetched behind the current layer's compute (the profile's share of it);
        // the first gather is exposed, and every collective pays a launch latency.
        int64_t layers_here = 0;
        for (int64_t c = 0; c < v; ++c)
          layers_here += chunks[static_cast<size_t>(c * p + r)].layers;
        const double n_layers = D(std::max<int64_t>(1, layers_here));
        // Per layer collective: a launch, and the ring's n - 1 steps (NCCL all-gather and
        // reduce-scatter run rings; one ring latency is already in the stage-wide time).
        const double ring_steps =
            D(std::max<int64_t>(0, cx.groups.dp_cp.size - 1)) * eff.collective_latency_s;
        const double lat = n_layers * prof.collective_latency_s + (n_layers - 1) * ring_steps;
        const double k = prof.shard_comm_scale;
        const double ag_f = zero >= 3 ? k * params_s + lat : 0;
        // FSDP's shard_grad_op (zero 2) keeps the gathered parameters from forward to backward.
        // fsdp.reshard_after_forward = false keeps the forward's gathered weights for the
        // backward (no second gather).
        const double ag_b = zero >= 3 && plan.fsdp.reshard_after_forward ? k * params_s + lat : 0;
        const double rs = k * grads_s + lat;
        const double compute_f = fwd, compute_b = st.gemm_s + st.memory_s + st.recompute_s - fwd;
        const double hide = prof.shard_prefetch;
        double exposed = std::max(0.0, ag_f - hide * compute_f) +
                         std::max(0.0, ag_b + rs - hide * std::max(0.0, compute_b));
        exposed += ag_f / n_layers;  // the first layer's gather
        if (zero == 2 && prof.shard == ShardStyle::kFsdp) {
          // shard_grad_op gathers once per microbatch's forward (parameters freed after backward).
          exposed += std::max(0.0, k * params_s + lat - hide * compute_f);
          step_params = 0;
        }
        st.microbatch_s += exposed;
      }
      sync = step_grads + step_params;
      st.dp_sync_s = sync;
      if (options.overlap_grad_reduce) {
        st.dp_exposed_s =
            std::max(0.05 * step_grads, step_grads - backward) +
            (options.overlap_param_gather ? std::max(0.0, step_params - fwd) : step_params);
      } else {
        st.dp_exposed_s = sync;
      }
      // Optimizer: read and write master weights and moments, read gradients, write weights.
      const double local_opt = D(sm.Get(MemoryPart::kOptimizer));
      st.optimizer_s =
          (2 * local_opt + D(sm.Get(MemoryPart::kGradients)) + D(sm.Get(MemoryPart::kWeights))) /
          cx.hbm;
      if (plan.optimizer.offload == Offload::kCpu) {
        const double shard =
            plan.optimizer.zero >= 1 ? D(std::max<int64_t>(1, par.dp * par.cp)) : 1;
        const double local = total_params / shard;
        st.optimizer_s += local / eff.cpu_adam_params_per_s +
                          local * (grad_elem + param_elem) / eff.pcie_bandwidth;
      }
    }
    u_max = std::max(u_max, st.microbatch_s);
    u_sum += st.microbatch_s;
  }
  for (const StageTime& st : est.stages) {
    if (st.microbatch_s == u_max) {
      est.critical_stage = st.stage;
      break;
    }
  }
  const StageTime& crit = est.stages[static_cast<size_t>(est.critical_stage)];
  const double pipeline = mb * u_max + (u_sum - u_max) / D(std::max<int64_t>(1, v));
  est.compute_s = mb * (crit.gemm_s + crit.memory_s + crit.recompute_s);
  est.comm_s = mb * (u_max - (crit.gemm_s + crit.memory_s + crit.recompute_s));
  est.bubble_s = pipeline - mb * u_max;
  for (const StageTime& st : est.stages) {
    est.dp_exposed_s = std::max(est.dp_exposed_s, st.dp_exposed_s);
    est.optimizer_s = std::max(est.optimizer_s, st.optimizer_s);
  }
  est.overhead_s = prof.step_overhead_s;
  est.step_s = pipeline + est.dp_exposed_s + est.optimizer_s + est.overhead_s;
  const double tokens = D(plan.batch.global) * D(m.seq_len);
  est.tokens_per_s = tokens / est.step_s;
  est.tokens_per_s_per_gpu = est.tokens_per_s / D(world);
  est.model_flops_per_step = tokens * ModelFlopsPerToken(m, /*causal_halved=*/true);
  est.mfu = est.model_flops_per_step / (est.step_s * D(world) * peak);
  est.valid = true;
  return est;
}

std::string PrintTime(const TimeEstimate& e) {
  if (!e.valid) return "time: not estimated\n";
  std::string out;
  char buf[200];
  std::snprintf(buf, sizeof buf,
                "step %.3f s = compute %.3f + communication %.3f + bubble %.3f + dp sync %.3f + "
                "optimizer %.3f + overhead %.3f (critical stage %lld, %lld microbatches)\n",
                e.step_s, e.compute_s, e.comm_s, e.bubble_s, e.dp_exposed_s, e.optimizer_s,
                e.overhead_s, static_cast<long long>(e.critical_stage),
                static_cast<long long>(e.microbatches));
  out += buf;
  std::snprintf(buf, sizeof buf, "throughput %.1f tokens/s per GPU (%.0f tokens/s), MFU %.1f%%\n",
                e.tokens_per_s_per_gpu, e.tokens_per_s, 100 * e.mfu);
  out += buf;
  if (!e.framework.empty()) {
    out += "priced as framework " + std::string(e.framework);
    if (!e.generation.empty()) out += " on " + std::string(e.generation);
    out += "\n";
  }
  return out;
}

}  // namespace paraplan
