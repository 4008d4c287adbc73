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
// Dao 2023 Fig. 4-7, Shah et al. 2024 Fig. 5).
constexpr double kAttentionHalfKeys = 384;

// Fraction of the large-sequence fused-attention rate for calls over `keys` keys of head size
// d, for a kernel whose rate at head size `knee` is half its rate at large heads
// (FrameworkProfile::attention_head_knee; 0: the same rate at every head size), as a share of
// the head-128 rate.
double AttentionShape(double keys, double d, double knee) {
  const double seq = keys / (keys + kAttentionHalfKeys);
  const double head = knee > 0 ? (d / (d + knee)) / (128.0 / (128.0 + knee)) : 1.0;
  return seq * std::min(1.2, head);
}

// One layer's forward on one GPU for one microbatch.
struct LayerCost {
  double gemm_s = 0;    // forward GEMMs (backward = 2x)
  double linear_s = 0;  // the linear-layer part of gemm_s (what TP overlap can hide behind)
  double core_s = 0;    // the attention-core part of gemm_s
  // The backward's work beyond twice the forward's: a fused attention kernel's backward
  // computes the scores again (five matrix products against the forward's two, 2.5x its
  // FLOPs, FlashAttention's own count), where every other GEMM's backward is two of its size.
  double backward_extra_s = 0;
  double memory_s = 0;        // forward memory-bound time (backward = 2x)
  double score_memory_s = 0;  // the attention-score part of memory_s
  double tp_s = 0;            // the backward pass's TP collectives (2 per layer)
  double tp_forward_s = 0;    // the forward's (and a recompute's): FP8 all-gathers under fp8
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

// The sizes the parts of one layer's cost share.
struct LayerDims {
  double t = 1;             // tensor parallel
  double micro_tokens = 0;  // tokens of a microbatch on one CP rank
  double h = 0;             // hidden
  double a = 0;             // attention heads
  double x = 0;             // activation element bytes
  double s = 0;             // sequence length
  double exec_ctx = 0;      // keys per query the attention kernel executes
};

LayerDims LayerDimsOf(const Context& cx) {
  const Plan& plan = cx.plan;
  const ModelSpec& m = plan.model;
  const ParallelSpec& par = plan.parallel;
  LayerDims d;
  d.t = D(std::max<int64_t>(1, par.tp));
  d.micro_tokens = D(m.seq_len) * D(plan.batch.micro) / D(std::max<int64_t>(1, par.cp));
  d.h = D(m.hidden);
  d.a = D(m.heads);
  d.x = D(ActivationElementBytes(plan.precision));
  d.s = D(m.seq_len);
  // Keys per query the kernel executes: causal half of s when fused, all s unfused; a sliding
  // window of w keys (model.window) caps both.
  const double window = m.window > 0 && D(m.window) < d.s ? D(m.window) : 0;
  d.exec_ctx = window > 0 ? (cx.options.flash_attention ? window : d.s)
                          : (cx.options.flash_attention ? d.s / 2 : d.s);
  return d;
}

// The shape of one microbatch's activations on one rank, for the activation-size functions.
ActivationShape LayerShapeOf(const Context& cx) {
  const Plan& plan = cx.plan;
  ActivationShape shape;
  shape.seq = plan.model.seq_len;
  shape.micro = plan.batch.micro;
  shape.tp = plan.parallel.tp;
  shape.cp = plan.parallel.cp;
  shape.etp = plan.parallel.etp;
  shape.sp = plan.parallel.sp;
  shape.options = cx.options;
  return shape;
}

// Attention: the projections (linear GEMMs) and the core, batched GEMMs per (sequence, head)
// without fusion, a fused attention kernel with it, at its own efficiency
// (GpuEfficiency::attention_fraction).
void AddAttention(const Context& cx, const LayerDims& d, LayerCost& c) {
  const ModelSpec& m = cx.plan.model;
  const double micro_tokens = d.micro_tokens, h = d.h, a = d.a, t = d.t;
  auto gemm = [&](double flops) { return GemmSeconds(flops, cx.peak, cx.eff); };
  double head_dim = 0;
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
    core_flops_per_head_token = 2 * (qk + v) * d.exec_ctx;
    head_dim = (qk + v) / 2;
  } else {
    const double hd = D(m.head_dim > 0 ? m.head_dim : m.hidden / std::max<int64_t>(1, m.heads));
    const double kv = D(m.kv_heads > 0 ? m.kv_heads : m.heads) * hd;
    c.gemm_s += gemm(2 * micro_tokens * h * (a * hd + 2 * kv) / t) +
                gemm(2 * micro_tokens * a * hd * h / t);
    core_flops_per_head_token = 4 * hd * d.exec_ctx;
    head_dim = hd;
  }
  c.linear_s = c.gemm_s;
  const double heads_rank = a / t;
  const double total = core_flops_per_head_token * micro_tokens * heads_rank;
  if (cx.options.flash_attention) {
    // One fused kernel per layer (per ring step under CP: keys per call s / cp).
    const double keys = d.s / D(std::max<int64_t>(1, cx.plan.parallel.cp));
    c.core_s = total / (cx.peak_attention * cx.eff.attention_fraction *
                        AttentionShape(keys, head_dim, cx.prof.attention_head_knee));
    c.backward_extra_s = 0.5 * c.core_s;
  } else {
    const double pieces = D(cx.plan.batch.micro) * heads_rank;  // batched per (sequence, head)
    c.core_s = pieces * GemmSeconds(total / pieces, cx.peak_attention, cx.eff);
  }
  c.gemm_s += c.core_s;
}

// A MoE layer's MLP: the router, the shared experts, the routed experts and the dispatch and
// combine of the routed tokens over EP (and ETP).
void AddMoeMlp(const Context& cx, const LayerDims& d, LayerCost& c) {
  const Plan& plan = cx.plan;
  const ModelSpec& m = plan.model;
  const ParallelSpec& par = plan.parallel;
  const double micro_tokens = d.micro_tokens, h = d.h, t = d.t, x = d.x;
  auto gemm = [&](double flops) { return GemmSeconds(flops, cx.peak, cx.eff); };
  const double up = m.activation == Activation::kSwiGlu ? 2 : 1;
  const double fe = D(m.ExpertFfn());
  const double etp = D(std::max<int64_t>(1, par.etp));
  c.gemm_s += gemm(2 * micro_tokens * h * D(m.experts) / t);  // router on the rank's tokens
  if (m.shared_experts > 0) {
    const double fs = fe * D(m.shared_experts);
    c.gemm_s += gemm(2 * micro_tokens * h * fs * up / t) + gemm(2 * micro_tokens * fs * h / t);
  }
  const double pairs = D(RoutedPairsPerRank(m, LayerShapeOf(cx)));
  const double local_experts = std::max(1.0, D(m.experts) / D(std::max<int64_t>(1, par.ep)));
  const double per_expert = pairs / local_experts;
  // Grouped GEMM: one GEMM per local expert at the efficiency of its own size.
  const double experts_s = local_experts * (gemm(2 * per_expert * h * fe * up / etp) +
                                            gemm(2 * per_expert * fe * h / etp));
  c.gemm_s += experts_s;
  // Dispatch and combine: each rank sends the routed copies of its own (sequence-parallel)
  // tokens over EP; with ETP > 1 the received tokens are all-gathered over ETP before the
  // experts and reduce-scattered after them (Megatron's all-to-all dispatcher).
  if (plan.moe.dispatcher == Dispatcher::kFlex) {
    // DeepEP / HybridEP: one network copy per remote node a token reaches (DeepSeek's
    // node-limited routing caps them at router_group_topk groups when the groups are nodes).
    const double groups = D(std::max<int64_t>(1, m.router_groups));
    const double nodes = D(cx.groups.ep.size) / D(std::max<int64_t>(1, cx.groups.ep.per_node));
    const double max_nodes =
        groups > 1 && std::fabs(groups - nodes) < 0.5 ? D(m.router_group_topk) : 0;
    const double topk = D(std::max<int64_t>(1, m.topk));
    c.ep_s = 2 * DedupAllToAllSeconds(pairs / topk / etp * h * x, topk, max_nodes, cx.groups.ep,
                                      plan.cluster, cx.eff);
  } else {
    c.ep_s = 2 * CollectiveSeconds(Collective::kAllToAll, pairs / etp * h * x, cx.groups.ep,
                                   plan.cluster, cx.eff);
  }
  if (par.etp > 1) {
    c.ep_s += CollectiveSeconds(Collective::kAllGather, pairs * h * x, cx.groups.etp, plan.cluster,
                                cx.eff) +
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

// The MLP: two (gated: three) GEMMs on a dense layer, the experts on a MoE layer.
void AddMlp(const Context& cx, const LayerDims& d, LayerKind kind, LayerCost& c) {
  if (kind != LayerKind::kDense) {
    AddMoeMlp(cx, d, c);
    return;
  }
  const double micro_tokens = d.micro_tokens, h = d.h, t = d.t;
  auto gemm = [&](double flops) { return GemmSeconds(flops, cx.peak, cx.eff); };
  const double up = cx.plan.model.activation == Activation::kSwiGlu ? 2 : 1;
  const double f = D(cx.plan.model.ffn_hidden);
  c.gemm_s += gemm(2 * micro_tokens * h * f * up / t) + gemm(2 * micro_tokens * f * h / t);
  c.linear_s += gemm(2 * micro_tokens * h * f * up / t) + gemm(2 * micro_tokens * f * h / t);
}

// Memory-bound kernels: proportional to the bytes a layer stores with no recompute.
void AddMemoryBound(const Context& cx, LayerKind kind, LayerCost& c) {
  ActivationShape shape = LayerShapeOf(cx);
  shape.element_bytes = ActivationElementBytes(cx.plan.precision);
  shape.recompute = Recompute::kNone;
  const double stored = D(LayerActivationBytes(cx.plan.model, kind, shape));
  shape.recompute = Recompute::kSelective;
  const double without_scores = D(LayerActivationBytes(cx.plan.model, kind, shape));
  // torch.compile fuses the elementwise kernels (the profile's share of the eager passes left).
  const double passes =
      cx.eff.elementwise_passes * (cx.plan.compile ? cx.prof.compiled_memory_scale : 1.0);
  c.memory_s += passes * stored / cx.hbm;
  c.score_memory_s = passes * (stored - without_scores) / cx.hbm;
}

// TP/SP: two all-reduces (or all-gather + reduce-scatter pairs) per pass.
// With overlap (Megatron tp_comm_overlap, torchtitan async TP) a share of it hides behind the
// linear GEMMs, never more than their time.
void AddTpCollectives(const Context& cx, const LayerDims& d, LayerCost& c) {
  const ParallelSpec& par = cx.plan.parallel;
  if (par.tp <= 1) return;
  const double bytes = d.micro_tokens * d.h * d.x;
  auto collective = [&](Collective kind, double b) {
    return CollectiveSeconds(kind, b, cx.groups.tp, cx.plan.cluster, cx.eff);
  };
  // Each of the two per layer is an all-reduce, or under SP an all-gather and a reduce-scatter
  // (the same bytes). Under FP8 with SP the forward gathers the GEMM inputs already cast to FP8
  // (Transformer Engine's and torchtitan's Float8 tensor-parallel linears): half the bytes;
  // the backward's gradients stay 16-bit.
  c.tp_s = 2 * collective(Collective::kAllReduce, bytes);
  const double gathered = cx.plan.precision == Precision::kFp8 && par.sp ? bytes / 2 : bytes;
  c.tp_forward_s = 2 * (collective(Collective::kReduceScatter, bytes) +
                        collective(Collective::kAllGather, gathered));
  const bool overlap = par.tp_comm_overlap || cx.options.tp_comm_overlap;
  const double share = overlap ? std::max(cx.prof.tp_overlap, 0.8) : cx.prof.tp_overlap;
  if (share > 0) {
    c.tp_s = std::max(c.tp_s * (1 - share), c.tp_s - c.linear_s);
    c.tp_forward_s = std::max(c.tp_forward_s * (1 - share), c.tp_forward_s - c.linear_s);
  }
}

// CP ring: cp - 1 steps of the local K and V, hidden behind the attention core.
void AddCpExchange(const Context& cx, const LayerDims& d, LayerCost& c) {
  const Plan& plan = cx.plan;
  const ModelSpec& m = plan.model;
  const ParallelSpec& par = plan.parallel;
  if (par.cp <= 1) return;
  double kv_width;
  if (m.IsMla()) {
    kv_width = d.a * D(m.qk_nope_head_dim + m.qk_rope_head_dim + m.v_head_dim);
  } else {
    const double hd = D(m.head_dim > 0 ? m.head_dim : m.hidden / std::max<int64_t>(1, m.heads));
    kv_width = 2 * D(m.kv_heads > 0 ? m.kv_heads : m.heads) * hd;
  }
  const double chunk = d.micro_tokens * kv_width / d.t * d.x;
  const double steps = D(par.cp - 1);
  if (cx.prof.cp == CpStyle::kAllGather || cx.prof.cp == CpStyle::kGatherBehindLocal) {
    // K/V all-gathered before the core (dK/dV reduce-scattered after it): not overlapped, or
    // behind the local block of the core only.
    const double gather = CollectiveSeconds(Collective::kAllGather, chunk * D(par.cp), cx.groups.cp,
                                            plan.cluster, cx.eff);
    const double hidden = cx.prof.cp == CpStyle::kGatherBehindLocal ? c.core_s / D(par.cp) : 0;
    c.cp_s = std::max(0.0, gather - hidden) + cx.prof.collective_latency_s;
  } else {
    // Ring with load-balanced causal chunks (2·cp chunks, each rank equal work): cp - 1 steps,
    // each sending the local K/V while one 1/cp block of the core runs; a step costs the
    // longer of the two plus one launch.
    const double send =
        CollectiveSeconds(Collective::kPointToPoint, chunk, cx.groups.cp, plan.cluster, cx.eff);
    c.cp_s = steps * (std::max(0.0, send - c.core_s / D(par.cp)) + cx.prof.collective_latency_s);
  }
}

LayerCost CostOfLayer(const Context& cx, LayerKind kind) {
  const LayerDims d = LayerDimsOf(cx);
  LayerCost c;
  c.flops = LayerForwardFlopsPerToken(cx.plan.model, kind, d.s / 2) * d.micro_tokens /
            d.t;  // rough per-GPU share for reports
  AddAttention(cx, d, c);
  AddMlp(cx, d, kind, c);
  AddMemoryBound(cx, kind, c);
  AddTpCollectives(cx, d, c);
  AddCpExchange(cx, d, c);
  // Fixed costs per layer (launches, small kernels, framework dispatch): a third forward.
  c.memory_s += cx.prof.layer_overhead_s / 3 * (kind == LayerKind::kMoe ? 2 : 1);
  if (kind == LayerKind::kMoe) c.memory_s += cx.prof.moe_layer_overhead_s / 3;
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

namespace {

// The GPU's efficiency set for the plan, scaled by the framework profile's fitted numbers.
GpuEfficiency ProfiledEfficiency(const Plan& plan, const CostOptions& options,
                                 const FrameworkProfile& prof) {
  GpuEfficiency eff = EfficiencyFor(plan.cluster.gpu, options);
  eff.gemm_max_fraction = std::min(0.98, eff.gemm_max_fraction * prof.compute_scale);
  eff.attention_fraction =
      std::min(0.95, eff.attention_fraction * prof.compute_scale * prof.attention_scale);
  eff.p2p_latency_s = prof.p2p_latency_s;
  return eff;
}

// The 16-bit peak (fp32: TF32, the plan's `peak`) of the plan's precision.
double SixteenBitPeak(const Plan& plan, double peak) {
  return plan.precision == Precision::kFp32 ? peak
         : plan.precision == Precision::kFp16 && plan.cluster.gpu.peak_fp16 > 0
             ? plan.cluster.gpu.peak_fp16
             : plan.cluster.gpu.peak_bf16;
}

// What every stage of EstimateTime prices alike: one layer of each kind, the loss, a pipeline
// exchange and the element sizes of the DP traffic.
struct StepPrices {
  double peak = 0;  // PeakFlops(plan): the denominator of the MFU
  double t = 1;     // tensor parallel
  double micro_tokens = 0;
  LayerCost dense, moe;
  double logits_gemm = 0;  // the loss's logits GEMM, forward
  double loss_memory = 0;  // the vocab-parallel cross entropy, forward and backward
  double p2p = 0;          // one pipeline send or receive
  double grad_elem = 0;    // bytes of a reduced gradient
  double param_elem = 0;   // bytes of a gathered parameter
};

StepPrices StepPricesOf(const Context& cx, double peak) {
  const Plan& plan = cx.plan;
  const ModelSpec& m = plan.model;
  const ParallelSpec& par = plan.parallel;
  StepPrices sp;
  sp.peak = peak;
  sp.t = D(std::max<int64_t>(1, par.tp));
  sp.micro_tokens = D(m.seq_len) * D(plan.batch.micro) / D(std::max<int64_t>(1, par.cp));
  const double t = sp.t, micro_tokens = sp.micro_tokens;
  const double x = D(ActivationElementBytes(plan.precision));
  sp.dense = CostOfLayer(cx, LayerKind::kDense);
  sp.moe = m.IsMoe() ? CostOfLayer(cx, LayerKind::kMoe) : LayerCost{};
  // Loss: logits GEMM (at the 16-bit peak) and the vocab-parallel cross entropy (memory-bound
  // over fp32 logits).
  sp.logits_gemm =
      GemmSeconds(2 * micro_tokens * D(m.hidden) * D(m.vocab) / t, cx.peak_attention, cx.eff);
  sp.loss_memory = cx.eff.elementwise_passes * 3 * 4 * micro_tokens * D(m.vocab) / t / cx.hbm;
  const double p2p_bytes =
      micro_tokens * D(m.hidden) * x / t;  // SP / scatter-gather split activations
  CommGroup pp_link;
  pp_link.size = 2;
  pp_link.per_node = cx.groups.pp_crosses_nodes ? 1 : 2;
  sp.p2p = par.pp > 1 ? CollectiveSeconds(Collective::kPointToPoint, p2p_bytes, pp_link,
                                          plan.cluster, cx.eff)
                      : 0;
  // Element sizes of the DP traffic from the precision record (gradients reduced in their
  // stored type; parameters gathered in theirs).
  const MixedPrecisionSpec mp = EffectiveMixedPrecision(plan);
  auto bytes_of = [](ElementType e) {
    return e == ElementType::kFp32 ? 4.0 : e == ElementType::kFp8 ? 1.0 : 2.0;
  };
  sp.grad_elem = bytes_of(mp.grads);
  // Weights kept only in FP8 (Megatron's --fp8-param-gather, torchtitan's FSDP float8
  // all-gather) are gathered as FP8: one byte each.
  sp.param_elem = mp.fp8_params && UsesFp8(plan) ? 1.0 : bytes_of(mp.params);
  return sp;
}

// `n` layers of one kind in a chunk of `chunk_layers` layers, per microbatch: forward, backward
// and recompute, their collectives, and their forward share in forward_s.
void AddLayers(const Plan& plan, const LayerCost& lc, int64_t n, int64_t chunk_layers,
               StageTime& st) {
  const double nl = D(n);
  st.flops += nl * 3 * lc.flops;
  st.gemm_s += nl * (3 * lc.gemm_s + lc.backward_extra_s);
  st.memory_s += nl * 3 * lc.memory_s;
  double tp_recompute = 0;  // the share of the layers whose forward TP traffic runs again
  if (plan.recompute == Recompute::kFull) {
    // recompute_method = block recomputes only the first recompute_layers layers of each
    // chunk; uniform recomputes every layer.
    double share = 1;
    const ActivationSpec& act = plan.activations;
    if (act.recompute_method == RecomputeMethod::kBlock && act.recompute_layers > 0 &&
        chunk_layers > 0)
      share = std::min(1.0, D(act.recompute_layers) / D(chunk_layers));
    st.recompute_s += share * nl * (lc.gemm_s + lc.memory_s);
    tp_recompute = share;
    st.cp_comm_s += share * nl * lc.cp_s;
    st.ep_comm_s += share * nl * lc.ep_s;
  } else if (plan.recompute == Recompute::kSelective) {
    st.recompute_s += nl * (lc.core_s + lc.score_memory_s);
  }
  st.tp_comm_s += nl * ((1 + tp_recompute) * lc.tp_forward_s + lc.tp_s);
  st.cp_comm_s += nl * 3 * lc.cp_s;
  st.ep_comm_s += nl * 2 * lc.ep_s;
  st.forward_s += nl * (lc.gemm_s + lc.memory_s + lc.tp_forward_s + lc.cp_s + lc.ep_s);
}

// One chunk of a stage per microbatch: its layers, the loss on the last chunk, and its
// pipeline exchanges.
void AddChunk(const Context& cx, const StepPrices& sp, const CostChunk& chunk, StageTime& st) {
  const Plan& plan = cx.plan;
  const ModelSpec& m = plan.model;
  const int64_t first = chunk.first_layer, end = chunk.first_layer + chunk.layers;
  const int64_t dense_end = m.IsMoe() ? std::clamp(m.dense_layers, first, end) : end;
  for (int kind = 0; kind < 2; ++kind) {
    const int64_t n = kind == 0 ? dense_end - first : end - dense_end;
    if (n <= 0) continue;
    AddLayers(plan, kind == 0 ? sp.dense : sp.moe, n, chunk.layers, st);
  }
  if (chunk.loss) {
    // The loss, and each multi-token-prediction module (DeepSeek-V3) after it on the same
    // chunk: one layer of the last layer's kind, its 2h -> h projection, and a loss of its own
    // through the shared output layer.
    const bool moe_last = IsMoeLayer(m, m.layers - 1);
    for (int64_t k = 0; k <= std::max<int64_t>(0, m.mtp_layers); ++k) {
      if (k > 0) {
        AddLayers(plan, moe_last ? sp.moe : sp.dense, 1, chunk.layers + 1, st);
        const double projection = 2 * sp.micro_tokens * 2 * D(m.hidden) * D(m.hidden) / sp.t;
        const double projection_s = GemmSeconds(projection, cx.peak, cx.eff);
        st.flops += 3 * projection;
        st.gemm_s += 3 * projection_s;
        st.forward_s += projection_s;
      }
      st.flops += 3 * 2 * sp.micro_tokens * D(m.hidden) * D(m.vocab) / sp.t;
      st.gemm_s += 3 * sp.logits_gemm;
      st.memory_s += sp.loss_memory;
      st.forward_s += sp.logits_gemm + sp.loss_memory / 3;
    }
  }
  // Each chunk receives its input and sends its output, forward and backward.
  if (plan.parallel.pp > 1) st.pp_comm_s += 2 * sp.p2p;
}

// Expert parameters on one GPU of pipeline rank r: the stage's MoE layers' experts over EP·ETP.
double ExpertParamsOnStage(const Plan& plan, const std::vector<CostChunk>& chunks, int64_t r) {
  const ModelSpec& m = plan.model;
  const ParallelSpec& par = plan.parallel;
  if (!m.IsMoe()) return 0;
  const int64_t p = par.pp, v = par.vpp;
  const LayerParams lp = ParamsOfLayer(m, LayerKind::kMoe);
  int64_t moe_layers = 0;
  for (int64_t c = 0; c < v; ++c) {
    const CostChunk& chunk = chunks[static_cast<size_t>(c * p + r)];
    const int64_t first = chunk.first_layer, end = first + chunk.layers;
    moe_layers += end - std::clamp(m.dense_layers, first, end);
  }
  return D(moe_layers) * D(lp.expert) / D(std::max<int64_t>(1, par.ep * par.etp));
}

// One stage's data-parallel collectives, each priced whole.
struct DpTraffic {
  double grads_s = 0;    // gradients reduced (or reduce-scattered) over the shard groups
  double params_s = 0;   // parameters gathered back over the shard groups
  double replica_s = 0;  // HSDP: the shards all-reduced over the replicas
};

DpTraffic DpTrafficOf(const Context& cx, const StepPrices& sp, double shared_params,
                      double expert_params) {
  const Plan& plan = cx.plan;
  const int zero = static_cast<int>(plan.optimizer.zero);
  auto gather = [&](double params, const CommGroup& g) {
    if (g.size <= 1 || params <= 0) return 0.0;
    return CollectiveSeconds(Collective::kAllGather, params * sp.param_elem, g, plan.cluster,
                             cx.eff);
  };
  auto scatter = [&](double params, const CommGroup& g) {
    if (g.size <= 1 || params <= 0) return 0.0;
    return CollectiveSeconds(zero == 0 ? Collective::kAllReduce : Collective::kReduceScatter,
                             params * sp.grad_elem, g, plan.cluster, cx.eff);
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
  DpTraffic dp;
  dp.grads_s = scatter(shared_params, dense_group) + scatter(expert_params, cx.groups.edp);
  dp.params_s = gather(shared_params, dense_group) + gather(expert_params, cx.groups.edp);
  dp.replica_s =
      replicas.size > 1
          ? CollectiveSeconds(Collective::kAllReduce, shared_params / D(shard_group) * sp.grad_elem,
                              replicas, plan.cluster, cx.eff)
          : 0;
  return dp;
}

// The parameter tensors of one dense transformer layer as a framework registers them: the
// fused QKV, output, first (gate and up fused) and second MLP matrices; their biases in the
// GPT-style models (LayerNorm, learned positions); the two norms' weights (and LayerNorm's
// biases); the query/key norms.
double ParameterTensorsPerLayer(const ModelSpec& m) {
  const bool layer_norm = m.norm == Norm::kLayerNorm;
  double tensors = 4;            // QKV, output, MLP in, MLP out
  if (layer_norm) tensors += 4;  // their biases
  tensors += 2 * (layer_norm ? 2 : 1);
  if (m.qk_norm) tensors += 2;
  return tensors;
}

// ZeRO 2/3 per microbatch, layer by layer: the forward gathers each layer's parameters (ZeRO 3),
// the backward gathers them again and reduce-scatters the gradients. The next layer's gather is
// prefetched behind the current layer's compute (the profile's share of it); the first gather
// is exposed, and every collective pays a launch latency. Returns the exposed seconds.
double ShardedMicrobatchExposure(const Context& cx, const DpTraffic& dp, int64_t layers_here,
                                 const StageTime& st) {
  const Plan& plan = cx.plan;
  const FrameworkProfile& prof = cx.prof;
  const int zero = static_cast<int>(plan.optimizer.zero);
  const double fwd = st.forward_s;
  const double n_layers = D(std::max<int64_t>(1, layers_here));
  // Per layer collective: a launch, and the ring's n - 1 steps (NCCL all-gather and
  // reduce-scatter run rings; one ring latency is already in the stage-wide time). DeepSpeed's
  // per-tensor gathers are mostly small, latency-bound ones, and are priced step by step as
  // NCCL prices them, the steps inside a node at a third of a network step
  // (RingStepsLatency). FSDP's profiles charge every step at the network rate: their layer
  // gathers are large, and the fit keeps the slowdown that llm-foundry's 256 and 512 GPU runs
  // show per doubling (3-4%) in this term.
  const double ring_steps =
      prof.shard == ShardStyle::kDeepSpeed
          ? RingStepsLatency(cx.groups.dp_cp, cx.eff)
          : D(std::max<int64_t>(0, cx.groups.dp_cp.size - 1)) * cx.eff.collective_latency_s;
  const double lat = n_layers * prof.collective_latency_s + (n_layers - 1) * ring_steps;
  // DeepSpeed's ZeRO-3 of 2021 gathers every parameter tensor with its own all-gather (the
  // tensors of a layer, not the layer): each of them pays the launch and the ring's steps.
  const double gather_calls =
      prof.shard == ShardStyle::kDeepSpeed ? ParameterTensorsPerLayer(plan.model) : 1;
  const double lat_gather = gather_calls * n_layers * (prof.collective_latency_s + ring_steps);
  const double k = prof.shard_comm_scale;
  const double ag_lat = prof.shard == ShardStyle::kDeepSpeed ? lat_gather : lat;
  const double ag_f = zero >= 3 ? k * dp.params_s + ag_lat : 0;
  // FSDP's shard_grad_op (zero 2) keeps the gathered parameters from forward to backward.
  // fsdp.reshard_after_forward = false keeps the forward's gathered weights for the
  // backward (no second gather).
  const double ag_b = zero >= 3 && plan.fsdp.reshard_after_forward ? k * dp.params_s + ag_lat : 0;
  const double rs = k * dp.grads_s + lat;
  const double compute_f = fwd, compute_b = st.gemm_s + st.memory_s + st.recompute_s - fwd;
  const double hide = prof.shard_prefetch;
  const double exposed_f = std::max(0.0, ag_f - hide * compute_f);
  const double exposed_b = std::max(0.0, ag_b + rs - hide * std::max(0.0, compute_b));
  double exposed = exposed_f + exposed_b;
  exposed += ag_f / n_layers;  // the first layer's gather
  // The traffic that hides behind compute still slows it: NCCL's kernels hold SMs and HBM
  // bandwidth while the GEMMs run (the profile's share of the hidden seconds).
  exposed += prof.shard_interference * ((ag_f - exposed_f) + (ag_b + rs - exposed_b));
  if (zero == 2 && prof.shard == ShardStyle::kFsdp) {
    // shard_grad_op gathers once per microbatch's forward (parameters freed after backward).
    exposed += std::max(0.0, k * dp.params_s + lat - hide * compute_f);
  }
  return exposed;
}

// Optimizer: read and write master weights and moments, read gradients, write weights; with
// the optimizer offloaded, the host's Adam and the PCIe transfers.
double OptimizerSeconds(const Context& cx, const StepPrices& sp, const StageMemory& sm) {
  const Plan& plan = cx.plan;
  const double local_opt = D(sm.Get(MemoryPart::kOptimizer));
  double seconds =
      (2 * local_opt + D(sm.Get(MemoryPart::kGradients)) + D(sm.Get(MemoryPart::kWeights))) /
      cx.hbm;
  if (plan.optimizer.offload == Offload::kCpu) {
    const double shard = plan.optimizer.zero >= 1 ? D(std::max<int64_t>(1, ShardGroup(plan))) : 1;
    const double local = D(sm.params) / shard;
    seconds += local / cx.eff.cpu_adam_params_per_s +
               local * (sp.grad_elem + sp.param_elem) / cx.eff.pcie_bandwidth;
  }
  return seconds;
}

// DP: gradients reduced over DP x CP (dense) and expert DP (experts); parameters gathered
// back from ZeRO 1 on. Per step (Megatron's distributed optimizer and plain DP): gradients
// reduced once after the last microbatch, parameters gathered back after the optimizer from
// ZeRO 1 on. From ZeRO 2 the gradients are sharded, so they are reduce-scattered after every
// microbatch's backward (they cannot accumulate unsharded); ZeRO 3 also gathers the parameters
// for every microbatch's forward and backward (P0503's reasoning; ZeRO paper Sec. 5, with
// gradient accumulation). Per-microbatch traffic hides behind that microbatch's compute.
void AddDataParallel(const Context& cx, const StepPrices& sp, const StageMemory& sm,
                     double expert_params, int64_t layers_here, StageTime& st) {
  const Plan& plan = cx.plan;
  const double fwd = st.forward_s;
  const double backward = st.microbatch_s - fwd;
  const double total_params = D(sm.params);
  // Split the stage's parameters into expert and shared by the model's ratio on the stage.
  const double shared_params = std::max(0.0, total_params - expert_params);
  const int zero = static_cast<int>(plan.optimizer.zero);
  const DpTraffic dp = DpTrafficOf(cx, sp, shared_params, expert_params);
  double step_grads = (zero <= 1 ? dp.grads_s : 0) + dp.replica_s;
  double step_params = zero == 1 || zero == 2 ? dp.params_s : 0;
  // FSDP2 with pipeline parallelism (torchtitan, Llama 3) keeps the parameters gathered over
  // the step and reduces the gradients once: priced like the distributed optimizer.
  const bool once_per_step = cx.prof.shard == ShardStyle::kFsdp && plan.parallel.pp > 1;
  if (zero >= 2 && once_per_step) {
    step_grads = dp.grads_s;
    step_params = dp.params_s;
  } else if (zero >= 2) {
    st.microbatch_s += ShardedMicrobatchExposure(cx, dp, layers_here, st);
    // shard_grad_op gathers per microbatch instead (ShardedMicrobatchExposure).
    if (zero == 2 && cx.prof.shard == ShardStyle::kFsdp) step_params = 0;
  }
  const double sync = step_grads + step_params;
  st.dp_sync_s = sync;
  if (cx.options.overlap_grad_reduce) {
    st.dp_exposed_s =
        std::max(0.05 * step_grads, step_grads - backward) +
        (cx.options.overlap_param_gather ? std::max(0.0, step_params - fwd) : step_params);
  } else {
    st.dp_exposed_s = sync;
  }
  st.optimizer_s = OptimizerSeconds(cx, sp, sm);
}

// Pipeline rank r's time per microbatch, and per step its DP sync and optimizer.
void PriceStage(const Context& cx, const StepPrices& sp, const std::vector<CostChunk>& chunks,
                const MemoryEstimate& mem, int64_t r, StageTime& st) {
  const int64_t p = cx.plan.parallel.pp, v = cx.plan.parallel.vpp;
  st.stage = r;
  int64_t layers_here = 0;
  for (int64_t c = 0; c < v; ++c) {
    const CostChunk& chunk = chunks[static_cast<size_t>(c * p + r)];
    AddChunk(cx, sp, chunk, st);
    layers_here += chunk.layers;
  }
  st.microbatch_s = st.gemm_s + st.memory_s + st.recompute_s + st.tp_comm_s + st.cp_comm_s +
                    st.ep_comm_s + st.pp_comm_s;
  if (!mem.valid) return;
  AddDataParallel(cx, sp, mem.stages[static_cast<size_t>(r)],
                  ExpertParamsOnStage(cx.plan, chunks, r), layers_here, st);
}

// The step from the stages: the pipeline (critical stage and bubble), the most exposed DP sync
// and optimizer of any stage, the framework's fixed cost; throughput and MFU.
void SumStep(const Context& cx, const StepPrices& sp, TimeEstimate& est) {
  const Plan& plan = cx.plan;
  double u_max = 0, u_sum = 0;
  for (const StageTime& st : est.stages) {
    u_max = std::max(u_max, st.microbatch_s);
    u_sum += st.microbatch_s;
  }
  for (const StageTime& st : est.stages) {
    if (st.microbatch_s == u_max) {
      est.critical_stage = st.stage;
      break;
    }
  }
  const double mb = D(est.microbatches);
  const StageTime& crit = est.stages[static_cast<size_t>(est.critical_stage)];
  const double pipeline = mb * u_max + (u_sum - u_max) / D(std::max<int64_t>(1, plan.parallel.vpp));
  est.compute_s = mb * (crit.gemm_s + crit.memory_s + crit.recompute_s);
  est.comm_s = mb * (u_max - (crit.gemm_s + crit.memory_s + crit.recompute_s));
  est.bubble_s = pipeline - mb * u_max;
  for (const StageTime& st : est.stages) {
    est.dp_exposed_s = std::max(est.dp_exposed_s, st.dp_exposed_s);
    est.optimizer_s = std::max(est.optimizer_s, st.optimizer_s);
  }
  // The overhead: the framework's fixed cost per step, and what the step loses to stragglers
  // as the job spans more nodes (a share of everything else per doubling of the nodes).
  const int64_t world = std::max<int64_t>(1, plan.World());
  const double nodes = D(world) / D(std::max<int64_t>(1, plan.cluster.gpus_per_node));
  const double rest = pipeline + est.dp_exposed_s + est.optimizer_s + cx.prof.step_overhead_s;
  const double stragglers = nodes > 1 ? rest * cx.prof.node_scaling_loss * std::log2(nodes) : 0.0;
  est.overhead_s = cx.prof.step_overhead_s + stragglers;
  est.step_s = pipeline + est.dp_exposed_s + est.optimizer_s + est.overhead_s;
  const double tokens = D(plan.batch.global) * D(plan.model.seq_len);
  est.tokens_per_s = tokens / est.step_s;
  est.tokens_per_s_per_gpu = est.tokens_per_s / D(world);
  est.model_flops_per_step = tokens * ModelFlopsPerToken(plan.model, /*causal_halved=*/true);
  est.mfu = est.model_flops_per_step / (est.step_s * D(world) * sp.peak);
}

}  // namespace

TimeEstimate EstimateTime(const Plan& plan, const CostOptions& given, const MemoryEstimate& mem) {
  TimeEstimate est;
  const CostOptions options = OptionsForFramework(plan, given);
  std::vector<CostChunk> chunks;
  if (!StageChunks(plan, chunks)) return est;
  const double peak = PeakFlops(plan);
  if (peak <= 0 || plan.cluster.gpu.hbm_bandwidth <= 0) return est;
  const FrameworkProfile& prof = PricingProfile(plan, options);
  const GpuEfficiency eff = ProfiledEfficiency(plan, options, prof);
  // Linear GEMMs: the 16-bit peak (fp32: TF32), times the stack's FP8 speedup under fp8; the
  // attention core stays in bf16 (Transformer Engine, torchao and llm-foundry FP8 recipes).
  const double peak16 = SixteenBitPeak(plan, peak);
  double peak_linear = peak16;
  if (UsesFp8(plan)) {
    peak_linear = peak16 * prof.fp8_gemm_speedup;
    // Row-wise scaling saves only a share of the time tensor-wise scaling saves.
    if (EffectiveMixedPrecision(plan).fp8 == Fp8Recipe::kRowwise)
      peak_linear = peak16 / (1 - prof.fp8_rowwise_share * (1 - 1 / prof.fp8_gemm_speedup));
  }
  est.framework = prof.stack;
  est.generation = prof.generation;
  est.checked = prof.checked;
  const Context cx{plan,
                   options,
                   prof,
                   eff,
                   PlaceGroups(plan),
                   peak_linear,
                   peak16,
                   plan.cluster.gpu.hbm_bandwidth * eff.hbm_fraction};
  const int64_t denom = std::max<int64_t>(1, plan.batch.micro * plan.parallel.dp);
  est.microbatches = std::max<int64_t>(1, plan.batch.global / denom);
  const StepPrices sp = StepPricesOf(cx, peak);
  const int64_t p = plan.parallel.pp;
  est.stages.resize(static_cast<size_t>(p));
  for (int64_t r = 0; r < p; ++r)
    PriceStage(cx, sp, chunks, mem, r, est.stages[static_cast<size_t>(r)]);
  SumStep(cx, sp, est);
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
    out += "\n" + DescribeCheck(e.checked) + "\n";
  }
  return out;
}

}  // namespace paraplan
