#include "compiler/analyze/memory.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <initializer_list>

#include "compiler/analyze/cost_comm.h"
#include "compiler/analyze/cost_framework.h"
#include "compiler/analyze/cost_shape.h"
#include "compiler/analyze/cost_stages.h"
#include "compiler/analyze/memory_arena.h"

namespace paraplan {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

int64_t Scale(int64_t count, double bytes_per) {
  const double v = static_cast<double>(count) * bytes_per;
  if (!(v < 9.0e18)) return INT64_MAX;
  if (v <= -9.0e18) return INT64_MIN;
  return std::llround(v);  // v + 0.5 truncated rounds negatives (and 0.5 - 2^-54) wrongly
}

// --- Activations of one layer under the recompute the plan states ------------------------

int64_t MlpWidth(const ModelSpec& m, int64_t f) {
  return SatMul(m.activation == Activation::kSwiGlu ? 3 : 2, f);
}

struct LayerActivations {
  int64_t none = 0;       // stored with no recompute
  int64_t stored = 0;     // stored under the plan's recompute (modules, fp8 copies)
  int64_t input = 0;      // the layer input only (what full recompute keeps)
  int64_t workspace = 0;  // working set while the layer (or its modules) is recomputed
};

// Bytes a selective recompute of `modules` (Megatron's --recompute-modules) stops storing in one
// layer per microbatch: each module keeps its input and recomputes what it made.
int64_t DroppedByModules(const ModelSpec& m, LayerKind kind, const ActivationShape& shape,
                         uint32_t modules) {
  const int64_t x = shape.element_bytes, t = std::max<int64_t>(1, shape.tp);
  const int64_t tokens = CeilDiv(SatMul(shape.seq, shape.micro), std::max<int64_t>(1, shape.cp));
  const int64_t rep = shape.sp ? CeilDiv(tokens, t) : tokens;
  const bool moe = kind == LayerKind::kMoe;
  int64_t drop = 0;
  if (modules & kRecomputeCoreAttn) {
    ActivationShape none = shape, selective = shape;
    none.recompute = Recompute::kNone;
    selective.recompute = Recompute::kSelective;
    drop = SatAdd(drop,
                  LayerActivationBytes(m, kind, none) - LayerActivationBytes(m, kind, selective));
  }
  if (modules & kRecomputeLayernorm)
    drop = SatAdd(drop, SatMul(rep, 2 * x * m.hidden));  // QKV and fc1 inputs
  if ((modules & kRecomputeMlp) && !moe)
    drop = SatAdd(drop, CeilDiv(SatMul(tokens, x * MlpWidth(m, m.ffn_hidden)), t));
  if ((modules & kRecomputeMlaUpProj) && m.IsMla()) {
    const int64_t qkv = m.heads * (2 * (m.qk_nope_head_dim + m.qk_rope_head_dim) + m.v_head_dim);
    drop = SatAdd(drop, CeilDiv(SatMul(tokens, x * qkv), t));
  }
  if (moe) {
    const int64_t pairs = RoutedPairsPerRank(m, shape);
    const int64_t etp = std::max<int64_t>(1, shape.etp);
    if (modules & kRecomputeSharedExperts)
      drop = SatAdd(
          drop,
          CeilDiv(SatMul(tokens, x * MlpWidth(m, SatMul(m.shared_experts, m.ExpertFfn()))), t));
    if (modules & kRecomputeMoe) {
      const int64_t copies = shape.options.moe_probs_in_activation ? 1 : 2;
      drop = SatAdd(drop, SatMul(pairs, SatAdd(copies * x * m.hidden,
                                               x * CeilDiv(MlpWidth(m, m.ExpertFfn()), etp))));
    } else if (modules & kRecomputeMoeAct) {
      drop =
          SatAdd(drop, SatMul(pairs, x * CeilDiv(m.ExpertFfn(), etp)));  // the activation's output
    }
  }
  return drop;
}

// Transformer Engine's FP8 GEMMs save their inputs for the backward as 1-byte copies instead of
// 16-bit ones (cost-models.md 2.2): the QKV and fc1 inputs (norm outputs), the attention output
// projection's input and the fc2 input, one byte less per element each. torchao's Float8Linear
// (torchtitan) saves the high-precision input and casts it again in the backward: no saving,
// except where the input arrives already cast (TorchtitanGatheredInputs).
int64_t Fp8Saving(const ModelSpec& m, LayerKind kind, const ActivationShape& shape,
                  uint32_t modules) {
  if (shape.element_bytes != 2) return 0;
  const int64_t t = std::max<int64_t>(1, shape.tp);
  const int64_t tokens = CeilDiv(SatMul(shape.seq, shape.micro), std::max<int64_t>(1, shape.cp));
  const int64_t rep = shape.sp ? CeilDiv(tokens, t) : tokens;
  const int64_t head_dim =
      m.IsMla() ? m.v_head_dim
                : (m.head_dim > 0 ? m.head_dim : m.hidden / std::max<int64_t>(1, m.heads));
  int64_t saving = 0;
  if (!(modules & kRecomputeLayernorm)) saving = SatMul(rep, 2 * m.hidden);
  saving = SatAdd(saving, CeilDiv(SatMul(tokens, m.heads * head_dim), t));
  const int64_t f =
      kind == LayerKind::kDense ? m.ffn_hidden : SatMul(m.shared_experts, m.ExpertFfn());
  if (!(modules & kRecomputeMlp) || kind == LayerKind::kMoe)
    saving = SatAdd(saving, CeilDiv(SatMul(tokens, f), t));
  return saving;
}

// torchtitan's per-op selective activation checkpointing (`selective_ac_option = "op"`): the
// layer is checkpointed, and inside it the outputs of attention (with its log-sum-exp) and of
// every other matrix multiply are saved: wq, wv, w1 and w2 of a Llama layer (the 1st, 3rd, 5th
// and 7th mm), plus the layer input.
int64_t TorchtitanOpSacBytes(const ModelSpec& m, const ActivationShape& shape) {
  const int64_t x = shape.element_bytes, t = std::max<int64_t>(1, shape.tp);
  const int64_t tokens = CeilDiv(SatMul(shape.seq, shape.micro), std::max<int64_t>(1, shape.cp));
  const int64_t rep = shape.sp ? CeilDiv(tokens, t) : tokens;
  const int64_t d = m.head_dim > 0 ? m.head_dim : m.hidden / std::max<int64_t>(1, m.heads);
  const int64_t kv = m.kv_heads > 0 ? m.kv_heads : m.heads;
  const int64_t split = 2 * m.heads * d + kv * d + m.ffn_hidden;  // q, attention out, v, w1 out
  int64_t bytes = SatMul(rep, x * m.hidden);                      // layer input
  bytes = SatAdd(bytes, CeilDiv(SatMul(tokens, x * split), t));
  bytes = SatAdd(bytes, SatMul(tokens, x * m.hidden));  // w2 out (partial sum, full width)
  return SatAdd(bytes, SatMul(tokens, 4 * CeilDiv(m.heads, t)));  // log-sum-exp
}

// torchtitan's tensor parallelism is DTensor's: under sequence parallelism the attention and
// MLP norms' outputs are all-gathered by PrepareModuleInput before the column-parallel wq/wk/wv
// and w1/w3, and autograd saves the gathered, full-sequence tensor as those linears' input,
// where Megatron saves the 1/t shard and gathers it again in the backward. With float8 linears
// the gather runs on the FP8 cast (torchao's PrepareFloat8ModuleInput), so the saved copy has
// 1-byte elements. The bytes beyond the shard the Korthikanti count already holds, per layer.
int64_t TorchtitanGatheredInputs(const Plan& plan, LayerKind kind, const ActivationShape& shape,
                                 bool fp8) {
  if (plan.framework != Framework::kTorchtitan || !shape.sp || shape.tp <= 1 ||
      kind != LayerKind::kDense)
    return 0;
  const int64_t tokens = CeilDiv(SatMul(shape.seq, shape.micro), std::max<int64_t>(1, shape.cp));
  const int64_t rest = tokens - CeilDiv(tokens, shape.tp);
  const int64_t x = fp8 ? 1 : shape.element_bytes;
  return SatMul(rest, SatMul(2 * x, plan.model.hidden));  // the attention and the MLP inputs
}

LayerActivations ActivationsOfLayer(const Plan& plan, LayerKind kind, const ActivationShape& shape,
                                    bool fp8) {
  const ModelSpec& m = plan.model;
  LayerActivations a;
  ActivationShape none = shape, full = shape;
  none.recompute = Recompute::kNone;
  full.recompute = Recompute::kFull;
  a.none = LayerActivationBytes(m, kind, none);
  a.input = LayerActivationBytes(m, kind, full);
  switch (plan.recompute) {
    case Recompute::kNone:
      a.stored = a.none;
      break;
    case Recompute::kFull:
      a.stored = a.input;
      a.workspace = a.none;
      break;
    case Recompute::kSelective: {
      if (plan.framework == Framework::kTorchtitan && kind == LayerKind::kDense && !m.IsMla() &&
          plan.activations.recompute_modules.empty()) {
        a.stored = std::min(a.none, TorchtitanOpSacBytes(m, shape));
        a.workspace = a.none - a.stored;
        break;
      }
      const int64_t drop =
          std::min(a.none, DroppedByModules(m, kind, shape, EffectiveRecomputeModules(plan)));
      a.stored = a.none - drop;
      a.workspace = drop;
      break;
    }
  }
  if (fp8 && plan.recompute != Recompute::kFull && plan.framework != Framework::kTorchtitan) {
    const uint32_t modules = EffectiveRecomputeModules(plan);
    a.stored = std::max<int64_t>(a.input, a.stored - Fp8Saving(m, kind, shape, modules));
    a.none = std::max<int64_t>(a.input, a.none - Fp8Saving(m, kind, shape, 0));
  }
  if (const int64_t gathered = TorchtitanGatheredInputs(plan, kind, shape, fp8); gathered > 0) {
    // Saved wherever the linears' inputs are: with everything stored, and in the working set of
    // a recomputed layer. torchtitan's op-level SAC recomputes the norms and their gathers.
    if (plan.recompute == Recompute::kNone) a.stored = SatAdd(a.stored, gathered);
    a.none = SatAdd(a.none, gathered);
    if (plan.recompute == Recompute::kFull) a.workspace = a.none;
  }
  return a;
}

// Stored bytes of `layers` layers of one chunk per microbatch under full recompute with
// Megatron's --recompute-method / --recompute-num-layers; and the working set of the backward.
void FullRecomputeChunk(const Plan& plan, int64_t layers, const LayerActivations& a,
                        int64_t* stored, int64_t* workspace) {
  const int64_t n = plan.activations.recompute_layers;
  if (plan.recompute != Recompute::kFull || n <= 0 || layers <= 0) {
    *stored = SatMul(layers, a.stored);
    *workspace = layers > 0 ? a.workspace : 0;
    return;
  }
  if (plan.activations.recompute_method == RecomputeMethod::kBlock) {
    // The first n layers of the chunk recompute; the others keep everything.
    const int64_t r = std::min(n, layers);
    *stored = SatAdd(SatMul(r, a.input), SatMul(layers - r, a.none));
    *workspace = r > 0 ? a.none : 0;
  } else {
    // Uniform: one checkpointed input per group of n layers; a group is recomputed at once.
    *stored = SatMul(CeilDiv(layers, n), a.input);
    *workspace = SatMul(std::min(n, layers), a.none);
  }
}

}  // namespace

std::string_view MemoryPartName(MemoryPart part) {
  switch (part) {
    case MemoryPart::kWeights:
      return "weights";
    case MemoryPart::kGradients:
      return "gradients";
    case MemoryPart::kOptimizer:
      return "optimizer";
    case MemoryPart::kActivations:
      return "activations";
    case MemoryPart::kEmbeddingAndLoss:
      return "embedding_and_loss";
    case MemoryPart::kRecomputeWorkspace:
      return "recompute_workspace";
    case MemoryPart::kCommBuffers:
      return "comm_buffers";
    case MemoryPart::kRuntimeReserve:
      return "runtime_reserve";
    case MemoryPart::kAllocatorMargin:
      return "allocator_margin";
    case MemoryPart::kCount:
      break;
  }
  return "?";
}

std::string_view MemoryPartTitle(MemoryPart part) {
  switch (part) {
    case MemoryPart::kWeights:
      return "weights";
    case MemoryPart::kGradients:
      return "gradients";
    case MemoryPart::kOptimizer:
      return "optimizer state";
    case MemoryPart::kActivations:
      return "activations";
    case MemoryPart::kEmbeddingAndLoss:
      return "embedding/logits";
    case MemoryPart::kRecomputeWorkspace:
      return "recompute workspace";
    case MemoryPart::kCommBuffers:
      return "comm buffers";
    case MemoryPart::kRuntimeReserve:
      return "CUDA/runtime";
    case MemoryPart::kAllocatorMargin:
      return "allocator margin";
    case MemoryPart::kCount:
      break;
  }
  return "?";
}

namespace {

int64_t BytesOf(ElementType t) {
  switch (t) {
    case ElementType::kFp32:
      return 4;
    case ElementType::kBf16:
    case ElementType::kFp16:
      return 2;
    case ElementType::kFp8:
      return 1;
  }
  return 4;
}

// Frameworks whose ZeRO-3 is PyTorch FSDP: the sharded parameter is the fp32 master itself and
// the 16-bit compute copy exists only while a layer is gathered.
bool FsdpKeepsFp32Shards(Framework f) {
  return f == Framework::kTorchtitan || f == Framework::kLlmFoundry;
}

// Transformer Engine (Megatron-Core, NeMo, planrun's FP8 path) caches the FP8 cast of each
// weight across the microbatches of a step (cost-models.md 2.1: "fp8 casts / transpose caches");
// torchtitan's float8 linears cast per call.
bool CachesFp8Weights(Framework f) {
  return f != Framework::kTorchtitan && f != Framework::kLlmFoundry;
}

// Bytes per parameter before any ZeRO sharding.
StateBytesPerParam UnshardedStateBytes(const Plan& plan) {
  StateBytesPerParam b;
  if (ArenaModelApplies(plan)) {
    // planrun's buckets (compiler/lower/body.cpp, BuildBuckets): weights in the activation type
    // (fp32 under fp32, fp16 under fp16, else bf16: no FP8 weights or cached casts), gradients
    // in the precision record's type (fp32 unless it states bf16 or fp16), and an fp32 master
    // shard with two fp32 moments whatever the precision and the optimizer (SGD's buckets have
    // them too): 12 bytes of optimizer state per parameter.
    b.weights = plan.precision == Precision::kFp32 ? 4 : 2;
    b.gradients = static_cast<double>(ArenaGradBytes(plan));
    b.optimizer = 12;
    return b;
  }
  // Megatron's distributed-optimizer table (cost-models.md 2.1): bf16 params 2, fp32 main grads
  // 4, fp32 master 4, Adam moments 2 x 4; each term follows the precision record.
  const MixedPrecisionSpec mp = EffectiveMixedPrecision(plan);
  const bool adam = plan.optimizer.type == OptimizerType::kAdamW;
  b.weights = mp.fp8_params ? 1 : static_cast<double>(BytesOf(mp.params));
  if (UsesFp8(plan) && !mp.fp8_params && CachesFp8Weights(plan.framework)) b.weights += 1;
  b.gradients = static_cast<double>(BytesOf(mp.grads));
  const double moments = static_cast<double>((adam ? 2 : 1) * BytesOf(mp.optimizer_state));
  b.optimizer = (mp.main_params ? 4 : 0) + moments;
  // fp16 with fp16 gradients: Megatron's optimizer keeps an fp32 copy of the main gradient too.
  // DeepSpeed's ZeRO keeps K = 12 bytes (fp32 master and two moments) beside the 16-bit
  // gradient partition, converting it to fp32 one sub-group at a time during the step
  // (cost-models.md 2.1).
  if (mp.params == ElementType::kFp16 && mp.grads == ElementType::kFp16 && mp.main_params &&
      plan.framework != Framework::kDeepSpeed)
    b.optimizer += 4;
  if (plan.optimizer.zero >= 3 && FsdpKeepsFp32Shards(plan.framework) && mp.main_params &&
      !mp.fp8_params) {
    // FSDP2 / FSDP mixed precision: the fp32 shard is the parameter; no separate master copy.
    b.weights = 4;
    b.optimizer = moments;
  }
  return b;
}

}  // namespace

StateBytesPerParam StateBytes(const Plan& plan, int64_t shard) {
  StateBytesPerParam b = UnshardedStateBytes(plan);
  const double d = static_cast<double>(std::max<int64_t>(1, shard));
  if (plan.optimizer.zero >= 1) b.optimizer /= d;
  if (plan.optimizer.zero >= 2) b.gradients /= d;
  if (plan.optimizer.zero >= 3) b.weights /= d;
  return b;
}

namespace {

// What every stage of one plan shares: the plan's sizes, the state bytes per parameter, one
// layer's activations and the buffers every rank holds. Made once by MemoryInputsOf, read by
// PriceStage for each pipeline rank.
struct MemoryInputs {
  const Plan* plan = nullptr;
  CostOptions options;  // the software flags of the plan's framework (OptionsForFramework)
  const GpuEfficiency* eff = nullptr;
  int64_t p = 0, v = 0;  // pipeline ranks, chunks per rank
  int64_t t = 1;         // tensor parallel
  int64_t mb = 1;        // microbatches per step and DP replica
  // Weights, gradients and optimizer state.
  StateBytesPerParam dense_state, expert_state;
  double offload_fraction = 0;
  // Activations.
  ActivationShape shape;
  LayerActivations la_dense, la_moe;
  int64_t emb_act = 0, loss_act = 0;
  ModelSpec padded;  // the model with the vocabulary its framework pads to
  LayerParams dense_params, moe_params;
  int64_t ep_etp = 1;
  // Communication buffers.
  int64_t communicators = 0;
  int64_t tokens = 0;  // tokens of a microbatch on one CP rank
  int64_t sp_gather = 0, cp_ring = 0, ep_buffers = 0;
  // planrun's static arena (framework = paraplan).
  bool arena = false;
  ArenaSizes arena_sizes;
};

// The ranks ZeRO shards the routed experts' states over. Megatron-Core: the expert data-parallel
// group, world / (etp · ep · pp) = `edp` (with etp = 1 and tp > 1 it spans the Tp ranks, which
// hold the same whole experts), less HSDP's replicas. planrun (the arena model): over Edp with
// ep > 1, and with ep = 1, etp = 1 beside tp > 1 under sequence parallelism and ZeRO 0 or 1, as
// Megatron-Core; otherwise (etp = tp, no sequence parallelism, ZeRO 2 or 3) the experts sit in
// the chunk's buckets beside the dense parameters and shard over dp · cp
// (ArenaExpertShardGroup).
int64_t ExpertShardGroup(const Plan& plan, int64_t edp, int64_t dense_shard) {
  if (ArenaModelApplies(plan)) return ArenaExpertShardGroup(plan, dense_shard);
  return std::max<int64_t>(1, edp / std::max<int64_t>(1, plan.fsdp.replicate));
}

// Weights, gradients and optimizer state per parameter: dense parameters shard over the ZeRO
// group, expert parameters over their own data-parallel group.
void PriceStatePerParam(MemoryInputs& in) {
  const Plan& plan = *in.plan;
  const ParallelSpec& par = plan.parallel;
  const int64_t world = std::max<int64_t>(1, plan.cluster.nodes * plan.cluster.gpus_per_node);
  const int64_t edp = std::max<int64_t>(1, world / std::max<int64_t>(1, par.etp * par.ep * in.p));
  // ZeRO shards over fsdp.shard ranks (dp·cp unless HSDP replicates); experts over their DP group.
  const int64_t dense_shard = ShardGroup(plan);
  const int64_t expert_shard = ExpertShardGroup(plan, edp, dense_shard);
  in.dense_state = StateBytes(plan, dense_shard);
  in.expert_state = StateBytes(plan, expert_shard);
  const bool offload = plan.optimizer.offload == Offload::kCpu;
  in.offload_fraction = offload ? plan.optimizer.offload_fraction : 0.0;
}

// The shape of one microbatch's activations on one rank.
ActivationShape ActivationShapeOf(const Plan& plan, const CostOptions& options, int64_t t) {
  const ParallelSpec& par = plan.parallel;
  ActivationShape shape;
  shape.seq = plan.model.seq_len;
  shape.micro = plan.batch.micro;
  shape.tp = t;
  shape.cp = par.cp;
  shape.etp = par.etp;
  shape.sp = par.sp;
  shape.recompute = plan.recompute;
  shape.element_bytes = ActivationElementBytes(plan.precision);
  // The routing imbalance the plan states (moe.imbalance), capped by a capacity factor, which
  // drops the tokens past it.
  CostOptions opts = options;
  opts.moe_imbalance = std::max(opts.moe_imbalance, plan.moe.imbalance);
  if (plan.moe.capacity_factor > 0)
    opts.moe_imbalance = std::min(opts.moe_imbalance, plan.moe.capacity_factor);
  shape.options = opts;
  return shape;
}

// Megatron-based frameworks pad the vocabulary to a multiple of vocab_divisor · tp (P0502): the
// embedding, the output layer and the logits have the padded rows. torchtitan and LLM Foundry
// use the vocabulary as configured.
ModelSpec PaddedVocabModel(const Plan& plan, int64_t t) {
  const ModelSpec& m = plan.model;
  ModelSpec padded = m;
  if (plan.framework != Framework::kTorchtitan && plan.framework != Framework::kLlmFoundry) {
    const int64_t multiple = SatMul(std::max<int64_t>(1, m.vocab_divisor), t);
    padded.vocab = SatMul(CeilDiv(m.vocab, multiple), multiple);
  }
  return padded;
}

// Activations of one layer of each kind, of the embedding and of the loss per microbatch, and
// the parameters of one layer of each kind.
void PriceActivationsPerLayer(MemoryInputs& in) {
  const Plan& plan = *in.plan;
  const ModelSpec& m = plan.model;
  in.shape = ActivationShapeOf(plan, in.options, in.t);
  const bool fp8 = UsesFp8(plan);
  in.la_dense = ActivationsOfLayer(plan, LayerKind::kDense, in.shape, fp8);
  in.la_moe =
      m.IsMoe() ? ActivationsOfLayer(plan, LayerKind::kMoe, in.shape, fp8) : LayerActivations{};
  in.emb_act = EmbeddingActivationBytes(m, in.shape);
  in.padded = PaddedVocabModel(plan, in.t);
  in.loss_act = LossActivationBytes(in.padded, in.shape);
  in.dense_params = ParamsOfLayer(m, LayerKind::kDense);
  in.moe_params = m.IsMoe() ? ParamsOfLayer(m, LayerKind::kMoe) : LayerParams{};
  in.ep_etp = std::max<int64_t>(1, plan.parallel.ep * plan.parallel.etp);
}

// Communicator buffers and the staging buffers of the SP, CP and EP exchanges.
void PriceCommBuffers(MemoryInputs& in) {
  const Plan& plan = *in.plan;
  const ModelSpec& m = plan.model;
  const ParallelSpec& par = plan.parallel;
  const int64_t t = in.t;
  // Communicator buffers: one NCCL communicator per group of size > 1 that a rank belongs to.
  const CommGroups groups = PlaceGroups(plan);
  for (const CommGroup* g :
       {&groups.tp, &groups.cp, &groups.dp_cp, &groups.pp, &groups.ep, &groups.etp, &groups.edp})
    in.communicators += g->size > 1 ? 1 : 0;
  const int64_t tokens = CeilDiv(SatMul(m.seq_len, plan.batch.micro), std::max<int64_t>(1, par.cp));
  in.tokens = tokens;
  const int64_t x = in.shape.element_bytes;
  // Sequence parallel gathers the full sequence of one GEMM input (double-buffered).
  in.sp_gather = par.sp && t > 1 ? SatMul(2, SatMul(tokens, SatMul(x, m.hidden))) : 0;
  // Context parallel: K and V chunks in flight (send and receive) of the ring.
  const int64_t kv_width =
      m.IsMla() ? m.heads * (m.qk_nope_head_dim + m.qk_rope_head_dim + m.v_head_dim)
                : 2 * std::max<int64_t>(1, m.kv_heads) *
                      (m.head_dim > 0 ? m.head_dim : m.hidden / std::max<int64_t>(1, m.heads));
  in.cp_ring = par.cp > 1 ? SatMul(2, SatMul(tokens, CeilDiv(SatMul(x, kv_width), t))) : 0;
  // Dispatch buffers: the routed pairs (all-to-all, DeepEP's flex), or every token of the EP
  // group (all-gather dispatcher).
  in.ep_buffers =
      !m.IsMoe() ? 0
      : plan.moe.dispatcher == Dispatcher::kAllGather
          ? SatMul(2, SatMul(SatMul(tokens, std::max<int64_t>(1, par.ep)), SatMul(x, m.hidden)))
          : SatMul(2, SatMul(RoutedPairsPerRank(m, in.shape), SatMul(x, m.hidden)));
}

// Everything EstimateMemory prices once per plan; `mb` microbatches per step.
MemoryInputs MemoryInputsOf(const Plan& plan, const CostOptions& options, int64_t mb) {
  MemoryInputs in;
  in.plan = &plan;
  in.options = options;
  in.eff = &EfficiencyFor(plan.cluster.gpu, in.options);
  in.p = plan.parallel.pp;
  in.v = plan.parallel.vpp;
  in.t = std::max<int64_t>(1, plan.parallel.tp);
  in.mb = mb;
  PriceStatePerParam(in);
  PriceActivationsPerLayer(in);
  PriceCommBuffers(in);
  in.arena = ArenaModelApplies(plan);
  in.arena_sizes = in.arena ? ArenaSizesOf(plan) : ArenaSizes{};
  return in;
}

// Microbatches in flight per local chunk of pipeline rank r at the stage's peak.
std::vector<int64_t> InFlightPerChunk(const MemoryInputs& in, int64_t r) {
  const int64_t p = in.p, v = in.v, mb = in.mb;
  if (in.arena) return ArenaSlots(*in.plan, r, mb);
  std::vector<int64_t> counts(static_cast<size_t>(v), 0);
  if (in.plan->pipeline.schedule == Schedule::kGpipe) {
    for (auto& c : counts) c = mb;
  } else if (v == 1) {
    counts[0] = std::min(p - r, mb);
  } else {
    const int64_t held = std::min(2 * (p - r - 1) + (v - 1) * p + 1, mb * v);
    for (int64_t k = 0; k < held; ++k) ++counts[static_cast<size_t>((k % (p * v)) / p)];
  }
  return counts;
}

// What the chunks of one stage add up to, before the prices per parameter apply.
struct StageTally {
  int64_t dense_count = 0, moe_count = 0;  // transformer layers of each kind
  int64_t activations = 0;                 // stored activations of the microbatches in flight
  int64_t workspace = 0;                   // recompute working set (arena: the layers' busiest op)
  int64_t loss_workspace = 0;              // arena: the loss's busiest op (logits, its backward)
  int64_t moe_workspace = 0;  // arena: the MoE layers' busiest op, their transient buckets included
  int64_t extra = 0;          // embedding, logits and loss
  int64_t dense_p = 0;        // TP-sharded parameters, per TP rank
  int64_t repl_p = 0;         // parameters replicated over TP
  int64_t expert_p = 0;       // expert parameters, per EP·ETP rank
};

// planrun's arena under ZeRO >= 2: the elements of an MoE layer's bucket on one rank, its
// attention half, router and shared experts with the routed experts (whole with etp = 1, a slice
// with etp = tp).
int64_t ArenaMoeLayerBucket(const MemoryInputs& in) {
  const LayerParams& moe = in.moe_params;
  return SatAdd(CeilDiv(moe.tp_sharded, in.t) + moe.replicated, CeilDiv(moe.expert, in.ep_etp));
}

ArenaMoeBuckets ArenaMoeBucketsOf(const MemoryInputs& in, const CostChunk& chunk) {
  const Plan& plan = *in.plan;
  ArenaMoeBuckets k;
  if (plan.optimizer.zero < 2 || ShardGroup(plan) <= 1) return k;
  const int64_t elements = ArenaMoeLayerBucket(in);
  const int64_t g = in.arena_sizes.g;
  k.grads = SatMul(elements, g);
  if (plan.optimizer.zero >= 3) k.params = SatMul(elements, in.arena_sizes.a);
  if (plan.model.tied_embeddings && chunk.embedding && chunk.loss)
    k.held = SatMul(SatMul(in.arena_sizes.vocab, plan.model.hidden), g);
  return k;
}

// planrun's arena: the stash of a chunk's `layers` MoE layers with `held` microbatches in flight,
// and the busiest op of their backward with their transient buckets (StageTally::moe_workspace;
// the chunk's loss, when it has no dense layer, in StageTally::workspace).
// With full recompute by layers (block), `recomputed` of the chunk's MoE layers are recomputed
// whole (those among the chunk's first recompute_layers layers) and the others keep everything;
// otherwise (recomputed = -1) every layer follows the plan's recompute.
void AddArenaMoeLayers(const MemoryInputs& in, const CostChunk& chunk, int64_t layers,
                       int64_t recomputed, int64_t held, StageTally& s) {
  const ArenaSizes& z = in.arena_sizes;
  const ArenaMoeBuckets buckets = ArenaMoeBucketsOf(in, chunk);
  const Recompute rest = recomputed >= 0 ? Recompute::kNone : in.plan->recompute;
  recomputed = std::max<int64_t>(0, recomputed);
  const int64_t plain = layers - recomputed;
  s.activations = SatAdd(s.activations, SatMul(held, SatMul(plain, ArenaMoeLayerStash(z, rest))));
  s.activations = SatAdd(s.activations,
                         SatMul(held, SatMul(recomputed, ArenaMoeLayerStash(z, Recompute::kFull))));
  if (plain > 0) s.moe_workspace = std::max(s.moe_workspace, ArenaMoeLayerPeak(z, rest, buckets));
  if (recomputed > 0)
    s.moe_workspace = std::max(s.moe_workspace, ArenaMoeLayerPeak(z, Recompute::kFull, buckets));
  if (chunk.loss) s.loss_workspace = std::max(s.loss_workspace, ArenaLossPeak(z));
}

// Full recompute by layers with the uniform method in a chunk holding MoE layers: groups of
// recompute_layers consecutive layers of either kind keep their first layer's input, and a
// group's backward holds the recomputed forward of its other layers (their whole stash) beside the
// last layer's busiest op (compiler/lower/body.cpp, RecomputedLayersBackward).
void AddArenaUniformGroups(const MemoryInputs& in, const CostChunk& chunk, int64_t held,
                           StageTally& s) {
  const Plan& plan = *in.plan;
  const ArenaSizes& z = in.arena_sizes;
  const ArenaMoeBuckets buckets = ArenaMoeBucketsOf(in, chunk);
  const int64_t n = plan.activations.recompute_layers;
  const int64_t first = chunk.first_layer, end = chunk.first_layer + chunk.layers;
  auto moe = [&](int64_t l) { return IsMoeLayer(plan.model, l); };
  for (int64_t begin = first; begin < end; begin += n) {
    const int64_t last = std::min(end, begin + n) - 1;
    const int64_t input =
        moe(begin) ? ArenaMoeLayerStash(z, Recompute::kFull) : ArenaLayerStash(z, Recompute::kFull);
    s.activations = SatAdd(s.activations, SatMul(held, input));
    int64_t others = 0;
    for (int64_t l = begin; l < last; ++l) others = SatAdd(others, ArenaRecomputedLayer(z, moe(l)));
    if (moe(last))
      s.moe_workspace = std::max(s.moe_workspace,
                                 SatAdd(others, ArenaMoeLayerPeak(z, Recompute::kFull, buckets)));
    else
      s.workspace =
          std::max(s.workspace, SatAdd(others, ArenaBodyPeak(z, Recompute::kFull, /*loss=*/false)));
  }
  if (chunk.loss) s.loss_workspace = std::max(s.loss_workspace, ArenaLossPeak(z));
}

// planrun's arena: the params a multi-token prediction module holds beside its layer's: the
// 2h -> h projection, whole on every TP rank, and three norms.
int64_t MtpModuleExtraParams(const ModelSpec& m) {
  return SatAdd(SatMul(2 * m.hidden, m.hidden),
                3 * m.hidden * (m.norm == Norm::kLayerNorm ? 2 : 1));
}

// planrun's arena: the multi-token prediction modules' stash on the loss chunk with `held`
// microbatches in flight (their layers' own and ArenaMtpExtra), and their layers' busiest op.
void AddArenaMtpStash(const MemoryInputs& in, const CostChunk& chunk, int64_t held, StageTally& s) {
  const ArenaSizes& z = in.arena_sizes;
  const ModelSpec& m = in.plan->model;
  const Recompute rc = ArenaMtpRecompute(*in.plan);
  const bool moe = IsMoeLayer(m, m.layers - 1);
  const int64_t layer = moe ? ArenaMoeLayerStash(z, rc) : ArenaLayerStash(z, rc);
  s.activations = SatAdd(s.activations, SatMul(SatMul(held, m.mtp_layers), layer));
  s.extra = SatAdd(s.extra, SatMul(SatMul(held, m.mtp_layers), ArenaMtpExtra(z)));
  if (moe) {
    // Under ZeRO >= 2 the module's bucket is its layer's with the projection and norms beside.
    ArenaMoeBuckets k = ArenaMoeBucketsOf(in, chunk);
    const int64_t extra = MtpModuleExtraParams(m);
    if (k.grads > 0) k.grads = SatAdd(k.grads, SatMul(extra, z.g));
    if (k.params > 0) k.params = SatAdd(k.params, SatMul(extra, z.a));
    s.moe_workspace = std::max(s.moe_workspace, ArenaMoeLayerPeak(z, rc, k));
  } else {
    s.workspace = std::max(s.workspace, ArenaBodyPeak(z, rc, /*loss=*/false));
  }
}

// The transformer layers of one chunk with `held` microbatches in flight: their stored
// activations and the recompute working set.
void AddChunkLayers(const MemoryInputs& in, const CostChunk& chunk, int64_t held, StageTally& s) {
  const Plan& plan = *in.plan;
  const ModelSpec& m = plan.model;
  const int64_t first = chunk.first_layer, end = chunk.first_layer + chunk.layers;
  int64_t nm = 0;
  if (m.IsMoe())
    for (int64_t l = first; l < end; ++l) nm += IsMoeLayer(m, l) ? 1 : 0;
  const int64_t nd = (end - first) - nm;
  // Full recompute by layers with the block method: the chunk's first recompute_layers layers,
  // of either kind (compiler/lower/body.h, RecomputeLayers); the dense ones among them.
  int64_t block_dense = -1, block_moe = -1;
  if (plan.recompute == Recompute::kFull && plan.activations.recompute_layers > 0 &&
      plan.activations.recompute_method == RecomputeMethod::kBlock) {
    block_dense = 0;
    block_moe = 0;
    for (int64_t l = first; l < std::min(end, first + plan.activations.recompute_layers); ++l)
      (m.IsMoe() && IsMoeLayer(m, l) ? block_moe : block_dense) += 1;
  }
  s.dense_count += nd;
  s.moe_count += nm;
  int64_t stored_dense = 0, stored_moe = 0, work_d = 0, work_m = 0;
  FullRecomputeChunk(plan, nd, in.la_dense, &stored_dense, &work_d);
  FullRecomputeChunk(plan, nm, in.la_moe, &stored_moe, &work_m);
  const int64_t chunk_act = SatAdd(stored_dense, stored_moe);
  const bool uniform_moe = nm > 0 && plan.recompute == Recompute::kFull &&
                           plan.activations.recompute_layers > 0 &&
                           plan.activations.recompute_method != RecomputeMethod::kBlock;
  if (in.arena)
    s.extra = SatAdd(s.extra, ArenaBoundaryBytes(in.arena_sizes, chunk.embedding, chunk.loss));
  if (in.arena && chunk.loss && m.mtp_layers > 0) AddArenaMtpStash(in, chunk, held, s);
  if (in.arena && uniform_moe) {
    s.extra =
        SatAdd(s.extra, SatMul(held, ArenaChunkExtra(in.arena_sizes, chunk.embedding, chunk.loss)));
    AddArenaUniformGroups(in, chunk, held, s);
  } else if (in.arena) {
    const ArenaSizes& z = in.arena_sizes;
    s.activations =
        SatAdd(s.activations, SatMul(held, ArenaDenseLayersStash(z, plan, nd, block_dense)));
    s.extra = SatAdd(s.extra, SatMul(held, ArenaChunkExtra(z, chunk.embedding, chunk.loss)));
    if (nd > 0 || nm == 0)
      s.workspace = std::max(s.workspace, ArenaDenseLayersPeak(z, plan, nd, block_dense));
    if (chunk.loss) s.loss_workspace = std::max(s.loss_workspace, ArenaLossPeak(z));
    if (nm > 0) AddArenaMoeLayers(in, chunk, nm, block_moe, held, s);
  } else {
    s.activations = SatAdd(s.activations, SatMul(held, chunk_act));
  }
  if (!in.arena) s.workspace = std::max({s.workspace, work_d, work_m});
}

// The embedding chunk: its activations and its parameters.
void AddEmbedding(const MemoryInputs& in, int64_t held, StageTally& s) {
  if (!in.arena) s.extra = SatAdd(s.extra, SatMul(held, in.emb_act));
  s.dense_p = SatAdd(s.dense_p, CeilDiv(EmbeddingParams(in.padded), in.t));
  s.repl_p = SatAdd(s.repl_p, PositionParams(in.plan->model));
}

// DeepSeek-V3's multi-token prediction: per module one transformer layer (of the last layer's
// kind), a 2h -> h projection, three norms (the embedding's, the hidden rows', its final one)
// and its own logits; on the last of several pipeline stages the word embedding the modules
// look their tokens up in (Megatron-Core builds it wherever MTP runs; a tied one is there
// already). Megatron-Core splits the projection over tp; planrun's arena keeps it whole on every
// TP rank (its stash is AddArenaMtpStash's).
void AddMtpModules(const MemoryInputs& in, int64_t held, StageTally& s) {
  const ModelSpec& m = in.plan->model;
  const bool moe_last = IsMoeLayer(m, m.layers - 1);
  const LayerParams& lp = moe_last ? in.moe_params : in.dense_params;
  const LayerActivations& la = moe_last ? in.la_moe : in.la_dense;
  const int64_t projection = SatMul(2 * m.hidden, m.hidden);
  const int64_t norms = MtpModuleExtraParams(m) - projection;
  if (!m.tied_embeddings && in.p > 1)
    s.dense_p = SatAdd(s.dense_p, CeilDiv(EmbeddingParams(in.padded), in.t));
  s.expert_p = SatAdd(s.expert_p, SatMul(m.mtp_layers, CeilDiv(lp.expert, in.ep_etp)));
  if (in.arena) {
    s.dense_p = SatAdd(s.dense_p, SatMul(m.mtp_layers, CeilDiv(lp.tp_sharded, in.t)));
    s.repl_p =
        SatAdd(s.repl_p, SatMul(m.mtp_layers, SatAdd(SatAdd(lp.replicated, norms), projection)));
    return;
  }
  s.dense_p =
      SatAdd(s.dense_p, SatMul(m.mtp_layers, CeilDiv(SatAdd(lp.tp_sharded, projection), in.t)));
  s.repl_p = SatAdd(s.repl_p, SatMul(m.mtp_layers, SatAdd(lp.replicated, norms)));
  s.extra = SatAdd(s.extra, SatMul(SatMul(m.mtp_layers, std::max<int64_t>(1, held)),
                                   SatAdd(la.stored, in.loss_act)));
}

// The loss chunk: logits and loss activations, multi-token prediction, the final norm and the
// output layer.
void AddLoss(const MemoryInputs& in, int64_t held, StageTally& s) {
  const Plan& plan = *in.plan;
  const ModelSpec& m = plan.model;
  if (!in.arena) s.extra = SatAdd(s.extra, SatMul(std::max<int64_t>(1, held), in.loss_act));
  if (!in.arena && plan.framework == Framework::kTorchtitan) {
    // torchtitan's loss upcasts the logits (`pred.float()`): at the backward of the fused
    // cross entropy the saved fp32 log-probabilities, the fp32 gradient of the loss and the
    // fp32 gradient of the upcast are live at once, 8 B per logit beyond the 4 B above. Under
    // TP the loss is DTensor's loss_parallel, whose backward is decomposed into eager ops
    // (torch.distributed.tensor.parallel.loss): zeros for the one-hot, exp of the
    // log-probabilities and their sum are live together with the saved log-probabilities and
    // the product, 16 B per logit in all.
    const int64_t logits = SatMul(in.tokens, CeilDiv(m.vocab, in.t));
    s.extra = SatAdd(s.extra, SatMul(in.t > 1 ? 12 : 8, logits));
  }
  if (m.mtp_layers > 0) AddMtpModules(in, held, s);
  s.repl_p = SatAdd(s.repl_p, FinalNormParams(m));
  int64_t head = OutputParams(in.padded);
  if (m.tied_embeddings && in.p > 1)
    head = EmbeddingParams(in.padded);  // the tied copy on the last stage
  s.dense_p = SatAdd(s.dense_p, CeilDiv(head, in.t));
}

// The parameters of the stage's transformer layers.
void AddLayerParams(const MemoryInputs& in, StageTally& s) {
  const LayerParams& dense = in.dense_params;
  const LayerParams& moe = in.moe_params;
  s.dense_p = SatAdd(s.dense_p, CeilDiv(SatAdd(SatMul(s.dense_count, dense.tp_sharded),
                                               SatMul(s.moe_count, moe.tp_sharded)),
                                        in.t));
  s.repl_p = SatAdd(s.repl_p, SatAdd(SatMul(s.dense_count, dense.replicated),
                                     SatMul(s.moe_count, moe.replicated)));
  s.expert_p = SatAdd(s.expert_p, CeilDiv(SatMul(s.moe_count, moe.expert), in.ep_etp));
}

// Weights, gradients and optimizer state of the stage's parameters; the offloaded share of the
// optimizer state goes to host_bytes.
void PriceStateBytes(const MemoryInputs& in, const StageTally& tally, StageMemory& s) {
  const int64_t shared_p = SatAdd(tally.dense_p, tally.repl_p);
  const int64_t expert_p = tally.expert_p;
  const StateBytesPerParam& dense = in.dense_state;
  const StateBytesPerParam& expert = in.expert_state;
  auto& b = s.bytes;
  b[size_t(MemoryPart::kWeights)] =
      SatAdd(Scale(shared_p, dense.weights), Scale(expert_p, expert.weights));
  b[size_t(MemoryPart::kGradients)] =
      SatAdd(Scale(shared_p, dense.gradients), Scale(expert_p, expert.gradients));
  const int64_t optimizer =
      SatAdd(Scale(shared_p, dense.optimizer), Scale(expert_p, expert.optimizer));
  // Megatron --optimizer-offload-fraction: that share of the optimizer state lives on the host.
  s.host_bytes = Scale(optimizer, in.offload_fraction);
  b[size_t(MemoryPart::kOptimizer)] = optimizer - s.host_bytes;
}

// The stored activations left on the GPU; the offloaded ones go to host_bytes.
int64_t ActivationsOnGpu(const MemoryInputs& in, int64_t activations, StageMemory& s) {
  const ActivationSpec& act = in.plan->activations;
  if (in.arena || act.offload_layers <= 0 || s.layers <= 0) return activations;
  // Activation offload (--cpu-offloading-num-layers): those layers' stored activations wait
  // on the host for the backward.
  const int64_t moved = static_cast<int64_t>(
      static_cast<double>(activations) *
      std::min(1.0, static_cast<double>(act.offload_layers) / static_cast<double>(s.layers)));
  s.host_bytes = SatAdd(s.host_bytes, moved);
  return activations - moved;
}

// planrun's arena: the expert bias State buffers of the stage's MoE layers, kept beside the
// weights.
int64_t ArenaMoeStateBytes(const MemoryInputs& in, const StageTally& tally) {
  if (!in.arena) return 0;
  return SatMul(tally.moe_count, ArenaMoeStateBuffers(in.arena_sizes));
}

// planrun's arena: the stage's busiest op with the transient buckets live beside it. Under ZeRO
// >= 2 each layer's fp32 full gradients (and under ZeRO 3 its gathered 16-bit parameters) live
// through that layer's backward, beside the layer's busiest op. The embedding's are used after
// every layer's backward, and the lookup's backward scatters into the gradient without reading
// the table: on a stage without the loss its gathered copy (forward) and its full gradient
// (backward) are never live together, nor beside a layer's op. On the loss's stage the output
// layer's bucket is priced beside the busiest op of the stage (layers or loss), and under ZeRO 3
// a tied embedding stays gathered from its lookup to the output layer's backward.
int64_t ArenaWorkspace(const MemoryInputs& in, const StageTally& tally, const StageMemory& s) {
  const Plan& plan = *in.plan;
  const int64_t ops = std::max(tally.workspace, tally.loss_workspace);
  if (!in.arena || plan.optimizer.zero < 2 || ShardGroup(plan) <= 1)
    return std::max(ops, tally.moe_workspace);
  const bool zero3 = plan.optimizer.zero >= 3;
  const int64_t g = in.arena_sizes.g;  // a gradient element
  const int64_t per = g + (zero3 ? in.arena_sizes.a : 0);
  int64_t layer = CeilDiv(in.dense_params.tp_sharded, in.t) + in.dense_params.replicated;
  // A dense multi-token prediction module's bucket on the loss stage: its layer's, the projection
  // and norms beside.
  if (s.loss && plan.model.mtp_layers > 0 && !IsMoeLayer(plan.model, plan.model.layers - 1))
    layer = SatAdd(layer, MtpModuleExtraParams(plan.model));
  const int64_t embedding = SatMul(in.arena_sizes.vocab, plan.model.hidden);
  int64_t peak = 0;
  if (s.loss) {
    peak = SatAdd(ops, SatMul(std::max(layer, embedding), per));
    if (zero3 && plan.model.tied_embeddings && s.embedding)
      peak = SatAdd(peak, SatMul(embedding, in.arena_sizes.a));
    // Multi-token prediction: its lookups' gradient (the word embedding's, or its copy's) opens
    // in the modules' backward, beside the output layer's bucket the modules' logits open.
    const bool mtp = plan.model.mtp_layers > 0;
    if (mtp)
      peak = std::max(peak, SatAdd(SatAdd(ops, SatMul(embedding, per)), SatMul(embedding, g)));
    // A tied embedding's full gradient (or, with multi-token prediction, the word embedding's) is
    // open from the output layer's (the modules') backward to the lookup's: beside every layer's
    // busiest op, with that layer's own bucket.
    if ((plan.model.tied_embeddings || mtp) && s.embedding)
      peak =
          std::max(peak, SatAdd(SatAdd(tally.workspace, SatMul(layer, per)), SatMul(embedding, g)));
  } else {
    peak = SatAdd(tally.workspace, SatMul(layer, per));
    if (s.embedding)
      peak = std::max(peak, SatMul(embedding, zero3 ? std::max(g, in.arena_sizes.a) : g));
  }
  return std::max(peak, tally.moe_workspace);
}

// The parameters of the stage's largest layer on one rank, unsharded by ZeRO: what gathering
// one layer brings in.
int64_t GatheredLayerParams(const MemoryInputs& in, const StageTally& tally) {
  const LayerParams& dense = in.dense_params;
  const LayerParams& moe = in.moe_params;
  return std::max(
      tally.dense_count > 0 ? dense.tp_sharded / in.t + dense.replicated : 0,
      tally.moe_count > 0 ? moe.tp_sharded / in.t + moe.replicated + moe.expert / in.ep_etp : 0);
}

// DeepSpeed's stage3_max_live_parameters default: gathered parameters it keeps resident before
// it stops prefetching (`fsdp.max_live_params` states another).
constexpr int64_t kDeepSpeedMaxLiveParameters = 1'000'000'000;

// DeepSpeed ZeRO-3 gathers tensor by tensor and frees each after use unless it is used again
// within stage3_max_reuse_distance. Prefetching stops at stage3_max_live_parameters, and the
// tensor being fetched may overshoot it, so at most that many plus the stage's largest tensor
// are gathered (never more than two layers), beside the largest tensor's unreduced 16-bit
// gradient before it is reduce-scattered into its partition.
int64_t DeepSpeedGatheredBytes(const MemoryInputs& in, const StageTally& tally) {
  const ModelSpec& m = in.plan->model;
  int64_t largest = 0;
  if (tally.dense_count > 0) largest = CeilDiv(LargestTensorOfLayer(m, LayerKind::kDense), in.t);
  if (tally.moe_count > 0)
    largest = std::max(largest, CeilDiv(LargestTensorOfLayer(m, LayerKind::kMoe), in.t));
  const int64_t layer = GatheredLayerParams(in, tally);
  const MixedPrecisionSpec mp = EffectiveMixedPrecision(*in.plan);
  const int64_t max_live = in.plan->fsdp.max_live_params > 0 ? in.plan->fsdp.max_live_params
                                                             : kDeepSpeedMaxLiveParameters;
  const int64_t live = std::min(SatMul(2, layer), SatAdd(max_live, largest));
  return SatAdd(SatMul(live, BytesOf(mp.params)), SatMul(largest, BytesOf(mp.grads)));
}

// ZeRO-3 weights gathered outside the arena: kept from the forward to the backward, or two
// layers' worth while gathering layer by layer (DeepSpeed: tensor by tensor).
int64_t GatheredWeightBytes(const MemoryInputs& in, const StageTally& tally) {
  const Plan& plan = *in.plan;
  if (plan.optimizer.zero < 3 || in.arena) return 0;
  if (plan.framework == Framework::kDeepSpeed) return DeepSpeedGatheredBytes(in, tally);
  const bool keep_gathered =
      !plan.fsdp.reshard_after_forward || (plan.framework == Framework::kTorchtitan && in.p > 1);
  if (keep_gathered) {
    // Weights gathered for the forward stay until the backward (reshard_after_forward off;
    // torchtitan turns it off under pipeline parallelism): the stage's 16-bit weights, whole.
    const MixedPrecisionSpec mp = EffectiveMixedPrecision(plan);
    double w = static_cast<double>(BytesOf(mp.params));
    // torch.distributed.pipelining turns gradient sync off for all but the last microbatch of
    // an FSDP stage: its unsharded gradients accumulate across the step, in the reduce dtype.
    if (plan.framework == Framework::kTorchtitan && in.p > 1)
      w += static_cast<double>(BytesOf(mp.grads));
    const int64_t shared_p = SatAdd(tally.dense_p, tally.repl_p);
    return SatAdd(Scale(shared_p, w), Scale(tally.expert_p, w));
  }
  // Two layers' full (unsharded) 16-bit weights: the one computing and the one prefetched.
  return SatMul(4, GatheredLayerParams(in, tally));
}

// Communicator buffers, the exchanges' staging buffers and ZeRO-3's gathered weights.
int64_t CommBufferBytes(const MemoryInputs& in, const StageTally& tally) {
  int64_t comm = SatMul(in.communicators, in.eff->nccl_bytes_per_communicator);
  if (!in.arena)
    comm =
        SatAdd(comm, std::max({in.sp_gather, in.cp_ring, tally.moe_count > 0 ? in.ep_buffers : 0}));
  return SatAdd(comm, GatheredWeightBytes(in, tally));
}

// The sum of the parts, the allocator's margin on it and what lives outside the allocator.
void TotalOfParts(const MemoryInputs& in, StageMemory& s) {
  auto& b = s.bytes;
  b[size_t(MemoryPart::kRuntimeReserve)] = in.eff->runtime_reserve_bytes;
  int64_t sum = 0;
  for (size_t i = 0; i < kMemoryPartCount; ++i) sum = SatAdd(sum, b[i]);
  // planrun allocates one static arena per rank: no caching-allocator fragmentation.
  const int64_t margin =
      sum == INT64_MAX || in.arena ? 0 : sum / 100 * in.options.allocator_margin_percent;
  b[size_t(MemoryPart::kAllocatorMargin)] = margin;
  s.total = SatAdd(sum, margin);
  if (in.arena)
    s.arena = sum - b[size_t(MemoryPart::kCommBuffers)] - b[size_t(MemoryPart::kRuntimeReserve)];
  s.outside_allocator = SatAdd(b[size_t(MemoryPart::kRuntimeReserve)],
                               SatMul(in.communicators, in.eff->nccl_bytes_per_communicator));
}

// planrun's arena: the bytes one microbatch stashes in each local chunk of pipeline rank r (the
// activations and extras AddChunkLayers adds per microbatch in flight).
std::vector<int64_t> ArenaStashFrames(const MemoryInputs& in, const std::vector<CostChunk>& chunks,
                                      int64_t r) {
  std::vector<int64_t> frames;
  for (int64_t c = 0; c < in.v; ++c) {
    const CostChunk& chunk = chunks[static_cast<size_t>(c * in.p + r)];
    StageTally none, one;
    AddChunkLayers(in, chunk, 0, none);
    AddChunkLayers(in, chunk, 1, one);
    frames.push_back(SatAdd(one.activations, one.extra) - SatAdd(none.activations, none.extra));
  }
  return frames;
}

// The memory of pipeline rank r, part by part.
void PriceStage(const MemoryInputs& in, const std::vector<CostChunk>& chunks, int64_t r,
                StageMemory& s) {
  s.stage = r;
  const std::vector<int64_t> counts = InFlightPerChunk(in, r);
  // planrun's slot pool (ArenaPooledSlots): the pooled chunks' stash is the pool's slots, each
  // the largest member's frame.
  std::vector<bool> pooled(counts.size(), false);
  int64_t pool_bytes = 0, pool_slots = 0;
  if (in.arena && in.v > 1) {
    const std::vector<int64_t> frames = ArenaStashFrames(in, chunks, r);
    const ArenaStashSlots a = ArenaPooledSlots(*in.plan, r, in.mb, frames);
    int64_t largest = 0;
    s.chunk_slots = a.slots;
    for (size_t c = 0; c < counts.size(); ++c) {
      if (!a.pooled[c]) continue;
      pooled[c] = true;
      pool_slots = a.slots[c];
      largest = std::max(largest, frames[c]);
    }
    pool_bytes = SatMul(pool_slots, largest);
  }
  if (s.chunk_slots.empty()) s.chunk_slots = counts;
  StageTally tally;
  tally.activations = pool_bytes;
  s.in_flight = pool_slots;
  for (int64_t c = 0; c < in.v; ++c) {
    const CostChunk& chunk = chunks[static_cast<size_t>(c * in.p + r)];
    const int64_t held = pooled[static_cast<size_t>(c)] ? 0 : counts[static_cast<size_t>(c)];
    AddChunkLayers(in, chunk, held, tally);
    if (in.arena)
      tally.extra = SatAdd(tally.extra, ArenaLandingBytes(*in.plan, in.arena_sizes, r, in.mb, c));
    if (chunk.embedding) {
      s.embedding = true;
      AddEmbedding(in, held, tally);
    }
    if (chunk.loss) {
      s.loss = true;
      AddLoss(in, held, tally);
    }
    s.in_flight += held;
  }
  s.layers = tally.dense_count + tally.moe_count;
  AddLayerParams(in, tally);
  s.params = SatAdd(SatAdd(tally.dense_p, tally.repl_p), tally.expert_p);
  PriceStateBytes(in, tally, s);
  auto& b = s.bytes;
  b[size_t(MemoryPart::kActivations)] = ActivationsOnGpu(in, tally.activations, s);
  b[size_t(MemoryPart::kEmbeddingAndLoss)] = tally.extra;
  b[size_t(MemoryPart::kRecomputeWorkspace)] = ArenaWorkspace(in, tally, s);
  b[size_t(MemoryPart::kWeights)] =
      SatAdd(b[size_t(MemoryPart::kWeights)], ArenaMoeStateBytes(in, tally));
  b[size_t(MemoryPart::kCommBuffers)] = CommBufferBytes(in, tally);
  TotalOfParts(in, s);
}

}  // namespace

MemoryEstimate EstimateMemory(const Plan& plan, const CostOptions& given) {
  // The plan's framework decides the software flags (fused attention, dropout, ...) here as in
  // the time model, so check, explain, search and calibration price one plan's memory alike.
  const CostOptions options = OptionsForFramework(plan, given);
  MemoryEstimate est;
  est.capacity = plan.cluster.gpu.memory;
  std::vector<CostChunk> chunks;
  if (!StageChunks(plan, chunks)) return est;
  const int64_t denom = std::max<int64_t>(1, plan.batch.micro * plan.parallel.dp);
  est.microbatches = std::max<int64_t>(1, plan.batch.global / denom);
  const MemoryInputs in = MemoryInputsOf(plan, options, est.microbatches);
  est.stages.resize(static_cast<size_t>(in.p));
  for (int64_t r = 0; r < in.p; ++r) {
    StageMemory& s = est.stages[static_cast<size_t>(r)];
    PriceStage(in, chunks, r, s);
    if (s.total > est.peak) {
      est.peak = s.total;
      est.peak_stage = r;
    }
  }
  est.valid = true;
  return est;
}

std::vector<StagePeak> PredictedPeaks(const Plan& plan, const CostOptions& options) {
  std::vector<StagePeak> out;
  const MemoryEstimate est = EstimateMemory(plan, options);
  if (!est.valid) return out;
  for (const StageMemory& s : est.stages) {
    out.push_back({s.stage, s.total, s.arena > 0 ? s.arena : s.total - s.outside_allocator});
  }
  return out;
}

std::string FormatGiB(int64_t bytes) {
  if (bytes == INT64_MAX) return "more than 8 EiB";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f GiB", static_cast<double>(bytes) / kGiB);
  return buf;
}

std::string PrintMemory(const MemoryEstimate& e) {
  std::string out;
  if (!e.valid) return "memory: not estimated (the pipeline split cannot be formed)\n";
  char buf[160];
  std::snprintf(buf, sizeof buf, "memory per GPU (capacity %s, %lld microbatches per step)\n",
                FormatGiB(e.capacity).c_str(), static_cast<long long>(e.microbatches));
  out += buf;
  std::snprintf(buf, sizeof buf, "%-22s", "stage");
  out += buf;
  for (const auto& s : e.stages) {
    std::snprintf(buf, sizeof buf, " %10lld", static_cast<long long>(s.stage));
    out += buf;
  }
  out += "\n";
  auto row = [&](std::string_view title, auto get) {
    std::snprintf(buf, sizeof buf, "%-22.*s", static_cast<int>(title.size()), title.data());
    out += buf;
    for (const auto& s : e.stages) {
      std::snprintf(buf, sizeof buf, " %10.2f", static_cast<double>(get(s)) / kGiB);
      out += buf;
    }
    out += "\n";
  };
  for (size_t i = 0; i < kMemoryPartCount; ++i)
    row(MemoryPartTitle(static_cast<MemoryPart>(i)),
        [&](const StageMemory& s) { return s.bytes[i]; });
  row("total (GiB)", [](const StageMemory& s) { return s.total; });
  return out;
}

}  // namespace paraplan
