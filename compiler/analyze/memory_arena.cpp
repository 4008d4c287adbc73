// planrun's static arena (framework = paraplan), term by term: see memory_arena.h.

#include "compiler/analyze/memory_arena.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <vector>

#include "compiler/analyze/cost_shape.h"
#include "compiler/analyze/memory.h"
#include "compiler/analyze/slot_pool.h"

namespace paraplan {

namespace {

void ArenaMoeSizesOf(const Plan& plan, ArenaSizes& z);
void ArenaEpSizesOf(const Plan& plan, ArenaSizes& z);

}  // namespace

int64_t ArenaGradBytes(const Plan& plan) {
  const ElementType grads = EffectiveMixedPrecision(plan).grads;
  return grads == ElementType::kBf16 || grads == ElementType::kFp16 ? 2 : 4;
}

ArenaSizes ArenaSizesOf(const Plan& plan) {
  const ModelSpec& m = plan.model;
  ArenaSizes z;
  z.t = std::max<int64_t>(1, plan.parallel.tp);
  z.T = SatMul(plan.batch.micro, m.seq_len / std::max<int64_t>(1, plan.parallel.cp));
  z.ring = plan.parallel.cp > 1;
  z.R = plan.parallel.sp && z.t > 1 ? z.T / z.t : z.T;
  z.h = m.hidden;
  z.hd = m.head_dim > 0 ? m.head_dim : m.hidden / std::max<int64_t>(1, m.heads);
  z.heads = m.heads / z.t;
  z.kv = std::max<int64_t>(1, (m.kv_heads > 0 ? m.kv_heads : m.heads) / z.t);
  z.ffn = m.ffn_hidden / z.t;
  const int64_t multiple = 128 * z.t;
  z.vocab = CeilDiv(m.vocab, multiple) * multiple / z.t;
  z.a = plan.precision == Precision::kFp32 ? 4 : 2;
  z.g = ArenaGradBytes(plan);
  z.gelu = m.activation != Activation::kSwiGlu;
  z.layernorm = m.norm == Norm::kLayerNorm;
  z.mla = m.IsMla();
  z.qk_norm = m.qk_norm && !z.mla;
  if (plan.recompute == Recompute::kSelective) {
    const uint32_t modules = LoweredRecomputeModules(plan);
    z.core_kept = (modules & kRecomputeCoreAttn) == 0;
    z.moe_act = (modules & kRecomputeMoeAct) != 0;
    z.mlp_recomputed = (modules & kRecomputeMlp) != 0;
    z.shared_recomputed = (modules & kRecomputeSharedExperts) != 0;
    z.norm_recomputed = (modules & kRecomputeLayernorm) != 0;
    z.moe_recomputed = (modules & kRecomputeMoe) != 0;
    z.mla_up_recomputed = (modules & kRecomputeMlaUpProj) != 0;
  }
  if (z.mla) {
    z.nope = m.qk_nope_head_dim;
    z.qk = m.qk_nope_head_dim + m.qk_rope_head_dim;
    z.vd = m.v_head_dim;
    z.ql = m.q_lora_rank;
    z.kvl = m.kv_lora_rank;
  }
  if (m.IsMoe()) ArenaMoeSizesOf(plan, z);
  return z;
}

namespace {

// --- multi-head latent attention (compiler/lower/body.cpp, MlaForward / MlaBackward) ---
// Stashed per token: q, k and v padded to the query/key head size, the output at the value head
// size, the latents before and after their norms (the core's padded output with its softmax
// statistics unless selective recompute redoes the core).
int64_t ArenaMlaAttentionStash(const ArenaSizes& z, Recompute recompute) {
  // mla_up_proj: q, k and v made again from the latents, the kv latent with its rope columns
  // kept for it.
  const bool up = recompute == Recompute::kSelective && z.mla_up_recomputed;
  const int64_t qkv = up ? z.kvl + z.qk - z.nope : 3 * z.heads * z.qk;
  const int64_t per_token = qkv + z.heads * z.vd + 2 * z.ql + 2 * z.kvl;
  int64_t bytes = SatMul(z.T, per_token * z.a);
  bytes = SatAdd(bytes, SatMul(z.T, int64_t{z.ql > 0 ? 2 : 1} * 4));  // the latents' rstd
  if (recompute == Recompute::kNone || z.core_kept)
    bytes = SatAdd(bytes, SatMul(z.T, z.heads * z.qk * z.a));
  return bytes;
}
// --- end multi-head latent attention ---

// Stashed bytes of one layer's attention half per microbatch (recompute none or selective): its
// input x, the gathered norm output, q, k, v, the attention output (and its softmax statistics
// unless selective recompute redoes the core), the residual and the fp32 statistics of both norms
// (not the norms' outputs and statistics under the layernorm module); with query/key norms also
// the projections before them and the norms' statistics, per head.
int64_t ArenaAttentionStash(const ArenaSizes& z, Recompute recompute) {
  const bool norms = recompute == Recompute::kSelective && z.norm_recomputed;
  int64_t bytes = SatMul(z.R, z.h * z.a);  // x
  const int64_t attention = z.mla ? 0 : 2 * z.heads * z.hd + 2 * z.kv * z.hd;
  bytes = SatAdd(bytes, SatMul(z.T, attention * z.a));  // q, o, k, v
  // The norm's output on the rank's rows (gathered again in the backward under sp).
  if (!norms) bytes = SatAdd(bytes, SatMul(z.R, z.h * z.a));
  if (z.qk_norm) {
    const int64_t heads = z.heads + z.kv;
    bytes = SatAdd(bytes, SatMul(z.T, heads * z.hd * z.a));  // q and k before the norms
    bytes = SatAdd(bytes, SatMul(z.T, heads * int64_t{z.layernorm ? 2 : 1} * 4));  // statistics
  }
  if (z.mla) bytes = SatAdd(bytes, ArenaMlaAttentionStash(z, recompute));
  bytes = SatAdd(bytes, SatMul(z.R, z.h * z.a));  // residual x1
  if (!norms)
    bytes = SatAdd(bytes,
                   SatMul(z.R, int64_t{z.layernorm ? 4 : 2} * 4));  // rstd (and mean) of both norms
  if (recompute == Recompute::kNone || z.core_kept)
    bytes = SatAdd(bytes, SatMul(z.T, z.heads * 4));  // lse
  return bytes;
}

}  // namespace

// Stashed bytes of one dense layer per microbatch: its input x and, unless the whole layer is
// recomputed, the attention half's buffers, the MLP's gathered input and its intermediates.
int64_t ArenaLayerStash(const ArenaSizes& z, Recompute recompute) {
  if (recompute == Recompute::kFull) return SatMul(z.R, z.h * z.a);  // x
  // The mlp module of selective recompute keeps only the norm's output (the rank's rows), the
  // layernorm module not even that.
  const bool norms = recompute == Recompute::kSelective && z.norm_recomputed;
  const int64_t norm_rows = norms ? 0 : SatMul(z.R, z.h * z.a);  // the MLP norm's output
  if (recompute == Recompute::kSelective && z.mlp_recomputed)
    return SatAdd(ArenaAttentionStash(z, recompute), norm_rows);
  const int64_t mlp = (z.gelu ? 2 : 3) * z.ffn;  // the MLP's intermediates
  return SatAdd(SatAdd(ArenaAttentionStash(z, recompute), norm_rows), SatMul(z.T, mlp * z.a));
}

// Full recompute by layers (compiler/lower/body.h, RecomputeLayers): with `block` the first n
// layers of the chunk keep only their input and the others everything; `uniform` keeps the
// input of each group of n layers, and a group's backward holds the whole group's recomputed
// forward at once.
int64_t ArenaDenseLayersStash(const ArenaSizes& z, const Plan& plan, int64_t layers,
                              int64_t block_recomputed) {
  const int64_t n = plan.activations.recompute_layers;
  if (plan.recompute != Recompute::kFull || n <= 0 || layers <= 0)
    return SatMul(layers, ArenaLayerStash(z, plan.recompute));
  if (plan.activations.recompute_method == RecomputeMethod::kBlock) {
    const int64_t r = std::min(block_recomputed, layers);
    return SatAdd(SatMul(r, ArenaLayerStash(z, Recompute::kFull)),
                  SatMul(layers - r, ArenaLayerStash(z, Recompute::kNone)));
  }
  return SatMul(CeilDiv(layers, n), ArenaLayerStash(z, Recompute::kFull));
}

int64_t ArenaDenseLayersPeak(const ArenaSizes& z, const Plan& plan, int64_t layers,
                             int64_t block_recomputed) {
  const int64_t n = plan.activations.recompute_layers;
  if (plan.recompute != Recompute::kFull || n <= 0 || layers <= 0)
    return ArenaBodyPeak(z, plan.recompute, /*loss=*/false);
  if (plan.activations.recompute_method == RecomputeMethod::kBlock) {
    const int64_t r = std::min(block_recomputed, layers);
    int64_t peak = r > 0 ? ArenaBodyPeak(z, Recompute::kFull, /*loss=*/false) : 0;
    if (r < layers) peak = std::max(peak, ArenaBodyPeak(z, Recompute::kNone, /*loss=*/false));
    return peak;
  }
  // The group's other layers' recomputed tensors, their inputs included, beside the last one's.
  const int64_t others = std::min(n, layers) - 1;
  return SatAdd(ArenaBodyPeak(z, Recompute::kFull, /*loss=*/false),
                SatMul(others, ArenaRecomputedLayer(z, /*moe=*/false)));
}

// Stashed bytes of a chunk beyond its layers, per microbatch: token ids on the embedding chunk;
// on the loss chunk the last layer's output, the final norm's statistics and gathered output,
// the logits, labels and cross-entropy statistics. (The chunk's output and gradient are one
// buffer each: ArenaBoundaryBytes.)
int64_t ArenaChunkExtra(const ArenaSizes& z, bool embedding, bool loss) {
  int64_t bytes = 0;
  if (embedding) bytes = SatAdd(bytes, SatMul(z.T, 4));
  if (loss) {
    bytes = SatAdd(bytes, SatMul(z.R, z.h * z.a));
    bytes = SatAdd(bytes, SatMul(z.R, int64_t{z.layernorm ? 2 : 1} * 4));
    bytes = SatAdd(bytes, SatMul(z.T, (z.h + z.vocab) * z.a));
    bytes = SatAdd(bytes, SatMul(z.T, 4 + 4 + 8));
  }
  return bytes;
}

int64_t ArenaMtpExtra(const ArenaSizes& z) {
  const int64_t stats = SatMul(z.R, int64_t{z.layernorm ? 2 : 1} * 4);
  const int64_t rows = SatMul(z.R, z.h * z.a);
  // The module's output head is the loss chunk's: its layer's output, the final norm's statistics
  // and gathered output, the logits, labels and cross-entropy statistics.
  int64_t bytes = ArenaChunkExtra(z, /*embedding=*/false, /*loss=*/true);
  bytes = SatAdd(bytes, SatMul(z.T, 4));       // shifted ids
  bytes = SatAdd(bytes, rows);                 // embedding rows
  bytes = SatAdd(bytes, SatMul(2, stats));     // enorm, hnorm
  if (z.R < z.T) bytes = SatAdd(bytes, rows);  // the rows the hidden norm reads
  return SatAdd(bytes, SatMul(2, rows));       // [embedding, hidden]
}

Recompute ArenaMtpRecompute(const Plan& plan) {
  if (plan.recompute == Recompute::kFull && plan.activations.recompute_layers > 0 &&
      plan.activations.recompute_method == RecomputeMethod::kBlock)
    return Recompute::kNone;
  return plan.recompute;
}

// A chunk's boundary buffers, one each whatever the microbatches in flight (compiler/lower/
// lower.cpp, BoundaryBuffersOf): its gradient; its output, but on the loss chunk; and where it
// both receives and sends gradients, the landing buffer they arrive in.
int64_t ArenaBoundaryBytes(const ArenaSizes& z, bool embedding, bool loss) {
  const int64_t buffers = 1 + (loss ? 0 : 1) + (!loss && !embedding ? 1 : 0);
  return SatMul(buffers, SatMul(z.R, z.h * z.a));
}

// The loss chunk's busiest op: the logits' gradient with the final norm's.
int64_t ArenaLossPeak(const ArenaSizes& z) { return SatMul(z.T, (z.vocab + z.h) * z.a); }

int64_t ArenaRecomputedNorm(const ArenaSizes& z) {
  return SatAdd(SatMul(z.T, z.h * z.a), SatMul(z.R, int64_t{z.layernorm ? 2 : 1} * 4));
}

// The busiest op of a chunk's bodies (scratch): the MLP and attention backward of one layer
// (with the recomputed layer under full recompute, the recomputed core under selective), and on
// the loss chunk the logits' gradient with the final norm's.
int64_t ArenaBodyPeak(const ArenaSizes& z, Recompute recompute, bool loss) {
  int64_t mlp =
      z.gelu ? std::max(2 * z.ffn, z.ffn + z.h) + z.h : std::max(3 * z.ffn, 2 * z.ffn + z.h);
  if (recompute == Recompute::kSelective && z.mlp_recomputed) {
    // The MLP made again from its norm's output (gathered under sp) before its backward: its
    // intermediates live beside the gradients until their last reader.
    const int64_t gathered = z.R < z.T ? z.h : 0;
    const int64_t act = (z.gelu ? 2 : 3) * z.ffn;  // g, (u,) a
    mlp = std::max({mlp + gathered, z.ffn + act + gathered + gathered,
                    (z.gelu ? 2 : 3) * z.ffn + act - z.ffn + gathered});
  }
  int64_t attn = 2 * z.heads * z.hd + 2 * z.kv * z.hd;
  // Ring attention's backward also holds the ring of K, V and their partial gradients.
  if (z.ring) attn += 8 * z.kv * z.hd;
  attn = std::max(attn, z.heads * z.hd + 2 * z.kv * z.hd + z.h);
  // Latent attention's backward: the padded output gradient, dq, dk and dv at the query/key
  // head size, then dq, dk, dv beside the up projection's output gradient.
  if (z.mla) {
    attn = std::max(4 * z.heads * z.qk, 3 * z.heads * z.qk + z.heads * (z.nope + z.vd));
    // mla_up_proj: the recomputed q, k and v beside the core's gradients.
    if (recompute == Recompute::kSelective && z.mla_up_recomputed) attn += 3 * z.heads * z.qk;
    // Under context parallelism every head's K and V travel the ring at the query/key size.
    if (z.ring) attn += 8 * z.heads * z.qk;
  }
  // Under sequence parallelism each half's backward gathers its norm's output again and holds it
  // to the weight gradients (unless a recompute module makes it: ArenaRecomputedNorm, or the mlp
  // module's own gather above).
  const bool kept = recompute != Recompute::kFull && z.R < z.T &&
                    !(recompute == Recompute::kSelective && z.norm_recomputed);
  if (kept) {
    attn += z.h;
    if (!(recompute == Recompute::kSelective && z.mlp_recomputed)) mlp += z.h;
  }
  int64_t peak = SatMul(z.T, std::max(mlp, attn) * z.a);
  const int64_t core_hd = z.mla ? z.qk : z.hd;
  if (recompute == Recompute::kSelective && !z.core_kept)
    peak = SatAdd(peak, SatMul(z.T, z.heads * core_hd * z.a + z.heads * 4));
  if (recompute == Recompute::kFull)
    peak = SatAdd(peak, ArenaRecomputedLayer(z, /*moe=*/false) - SatMul(z.R, z.h * z.a));
  if (recompute == Recompute::kSelective && z.norm_recomputed)
    peak = SatAdd(peak, ArenaRecomputedNorm(z));
  if (loss) peak = std::max(peak, ArenaLossPeak(z));
  return peak;
}

namespace {

// --- planrun's arena: mixture-of-experts layers (compiler/lower/body.cpp, MoeForward) ---------
//
// An MoE layer keeps the attention half of a dense layer; its MLP is the router, the routed
// experts and the shared experts. The routed buffers are sized for the worst case, every choice
// of every row landing on this rank's experts (ArenaRoutedRows). With etp = tp > 1 under sequence
// parallelism the experts run on the Etp group's rows: the rows, the router's logits, weights and
// choices are gathered over Etp before dispatch. With a capacity factor the kept weights take the
// router weights' place (the same size) and their fp32 mask is stashed beside them; the dropped
// pairs are never permuted, so the routed rows are at most every expert's capacity per segment.

void ArenaMoeSizesOf(const Plan& plan, ArenaSizes& z) {
  const ModelSpec& m = plan.model;
  const int64_t etp = std::max<int64_t>(1, plan.parallel.etp);
  const int64_t ffn = m.ExpertFfn();
  z.experts = m.experts;
  z.topk = std::max<int64_t>(1, m.topk);
  z.expert_ffn = ffn / etp;
  z.shared_ffn = SatMul(m.shared_experts, ffn) / z.t;
  z.etp_gathered = etp > 1 && plan.parallel.sp;
  z.expert_rows = z.etp_gathered ? SatMul(z.R, etp) : z.R;
  z.expert_bias = m.router_bias_rate > 0;
  if (plan.moe.capacity_factor > 0 && z.R > 0) {
    // Each expert's capacity on one rank's rows, once per segment (rank) of the rows it sees.
    const int64_t capacity = ExpertCapacity(z.R, z.topk, z.experts, plan.moe.capacity_factor);
    z.expert_kept = std::max<int64_t>(SatMul(capacity, z.expert_rows / z.R), 1);
  }
  ArenaEpSizesOf(plan, z);
}

// --- planrun's arena: expert parallelism (compiler/lower/body.cpp, EpDispatch / EpCombine) ---
//
// With ep > 1 each Ep rank holds experts / ep experts (with etp = tp > 1 each expert's Etp slice
// of them, the Etp group's rows gathered first under sp). MoePermute's rows (routed) are
// dispatched to the ranks holding their experts, the local experts run on the rows received, and
// MoeCombine returns their output to the senders; the backward dispatches the output gradient
// and combines the input gradient. The receive buffers hold ArenaEpDispatchRows rows.

// The rows a rank's experts may receive: the worst case, every row each Ep peer routes (the Etp
// group's rows when gathered) choosing min(topk, local experts) of them (with a capacity factor at
// most each local expert's capacity per segment of each peer, if fewer), or ceil(imbalance · rows
// · topk) when moe.imbalance is stated and smaller (DispatchCapacity).
int64_t ArenaEpDispatchRows(const Plan& plan, const ArenaSizes& z) {
  int64_t worst = SatMul(SatMul(z.ep, z.expert_rows), std::min(z.topk, z.local_experts));
  if (z.expert_kept > 0)
    worst = std::min(worst, SatMul(SatMul(z.ep, z.local_experts), z.expert_kept));
  const double imbalance = StatedMoeImbalance(plan);
  if (imbalance <= 0) return worst;
  const double balanced = static_cast<double>(SatMul(z.expert_rows, z.topk));
  const auto stated = static_cast<int64_t>(std::ceil(imbalance * balanced));
  return std::min(worst, std::max<int64_t>(stated, 1));
}

void ArenaEpSizesOf(const Plan& plan, ArenaSizes& z) {
  z.ep = std::max<int64_t>(1, plan.parallel.ep);
  z.local_experts = z.experts / z.ep;
  if (z.ep > 1) z.dispatch_rows = ArenaEpDispatchRows(plan, z);
}

// Rows of the permuted (routed) buffers: every choice of every row the rank's experts see, or
// with a capacity factor every expert's kept pairs when fewer.
int64_t ArenaRoutedRows(const ArenaSizes& z) {
  const int64_t pairs = SatMul(z.expert_rows, z.topk);
  return z.expert_kept > 0 ? std::min(pairs, SatMul(z.experts, z.expert_kept)) : pairs;
}

// The rows the experts' GEMMs run on: the received rows with ep > 1, else the routed ones.
int64_t ArenaExpertGemmRows(const ArenaSizes& z) {
  return z.ep > 1 ? z.dispatch_rows : ArenaRoutedRows(z);
}

// Stashed with ep > 1 beside the routed buffers: the per-peer split of the rows (ep · local
// experts) and the local experts' counts, int32.
int64_t ArenaEpCountsStash(const ArenaSizes& z) {
  return z.ep > 1 ? SatMul(SatMul(z.ep, z.local_experts) + z.local_experts, 4) : 0;
}
// --- end expert parallelism ---

// The sizes, in bytes, of the buffers of one MoE block (after the MLP norm), per microbatch.
struct ArenaMoeBuffers {
  // Router on this rank's rows: its input, the top-k weights (the Etp group's when gathered),
  // indices, fp32 scores and the per-expert counts.
  int64_t input = 0, weights = 0, indices = 0, scores = 0, counts = 0;
  // The Etp group's gathered rows when the shared experts read them (etp_gathered).
  int64_t group_rows = 0;
  // Dispatch and the experts: the permuted rows, the row map and the experts' counts (int32),
  // gate and up (up only with GELU), the activation and the experts' output. With ep > 1 the
  // permuted rows stashed are the received ones, the experts run on them, the output is the
  // combined rows, and the split and local counts are stashed too (ep_counts).
  int64_t permuted = 0, row_map = 0, expert_counts = 0, gate_up = 0, act = 0, out = 0;
  int64_t ep_counts = 0;
  // A capacity factor: the kept pairs' mask (fp32, one per routed choice), read by the router
  // weights' gradient; the kept weights take the routed weights' place in `weights`.
  int64_t capacity_mask = 0;
  // Shared experts: their gathered input (under sp, when not the Etp group's rows), gate and
  // up, and the activation.
  int64_t shared_input = 0, shared_gate_up = 0, shared_act = 0;
};

ArenaMoeBuffers ArenaMoeBuffersOf(const ArenaSizes& z) {
  const bool shared = z.shared_ffn > 0, gathered_sp = z.R < z.T;
  const int64_t routed = ArenaRoutedRows(z), a = z.a, rows = ArenaExpertGemmRows(z);
  ArenaMoeBuffers b;
  b.input = SatMul(z.R, z.h * a);
  b.weights = SatMul(z.expert_rows, z.topk * a);
  b.indices = SatMul(z.R, z.topk * 4);
  b.scores = SatMul(z.R, z.experts * 4);
  b.counts = z.experts * 4;
  if (z.expert_kept > 0) b.capacity_mask = SatMul(z.expert_rows, z.topk * 4);
  if (z.etp_gathered && shared) b.group_rows = SatMul(z.expert_rows, z.h * a);
  b.permuted = SatMul(rows, z.h * a);
  b.row_map = SatMul(z.expert_rows, z.topk * 4);  // one per pair, kept or dropped
  b.expert_counts = z.experts * 4;
  b.gate_up = SatMul(rows, (z.gelu ? 1 : 2) * z.expert_ffn * a);
  b.act = SatMul(rows, z.expert_ffn * a);
  b.out = SatMul(routed, z.h * a);
  b.ep_counts = ArenaEpCountsStash(z);
  if (shared) {
    if (gathered_sp && !z.etp_gathered) b.shared_input = SatMul(z.T, z.h * a);
    b.shared_gate_up = SatMul(z.T, (z.gelu ? 1 : 2) * z.shared_ffn * a);
    b.shared_act = SatMul(z.T, z.shared_ffn * a);
  }
  return b;
}

int64_t SatSum(std::initializer_list<int64_t> parts) {
  int64_t total = 0;
  for (int64_t x : parts) total = SatAdd(total, x);
  return total;
}

}  // namespace

// Stashed bytes of one MoE layer per microbatch: the attention half's, then every buffer of the
// MoE block its backward reads; under full recompute the layer input only.
int64_t ArenaMoeLayerStash(const ArenaSizes& z, Recompute recompute) {
  if (recompute == Recompute::kFull) return SatMul(z.R, z.h * z.a);  // x
  const ArenaMoeBuffers b = ArenaMoeBuffersOf(z);
  const bool selective = recompute == Recompute::kSelective;
  const int64_t act = selective && z.moe_act ? 0 : b.act;
  // shared_experts: their gate, up and activation made again from their kept input.
  const int64_t shared_kept = selective && z.shared_recomputed ? 0 : 1;
  // layernorm: the norm's output (and its gathered sequence) made again from the residual.
  const int64_t norm_kept = selective && z.norm_recomputed ? 0 : 1;
  // moe: the whole block made again from its input.
  if (selective && z.moe_recomputed)
    return SatAdd(ArenaAttentionStash(z, recompute), norm_kept * b.input);
  return SatSum({ArenaAttentionStash(z, recompute), norm_kept * b.input, b.weights, b.indices,
                 b.scores, b.counts, b.group_rows, b.permuted, b.row_map, b.expert_counts,
                 b.gate_up, act, b.out, b.ep_counts, b.capacity_mask,
                 shared_kept * b.shared_gate_up, shared_kept * b.shared_act});
}

namespace {

// --- expert parallelism: the routed path's busiest op with ep > 1 ---
// Op by op as MoeBackward emits it with ep > 1: MoeUnpermuteBackward (dy, dw), the output
// gradient's dispatch (dye on the received rows), the down projection's backward (da), the
// activation's (gate's and up's gradients), gate's and up's backward into the received rows'
// gradient (dxe), its combine back to the routed rows (dxp), and MoeUnpermute into the block
// input's gradient (dn2). Under full recompute the recomputed forward's combine comes first: the
// experts' output on the received rows (scratch) beside the combined rows. `early` and `open`
// are the buckets live before and from the down projection's backward, `held` what every step
// keeps (the router weights' gradient, the recomputed attention, router and shared buffers), and
// `forward_held` what of it the recomputed forward's combine meets (the recomputed attention and
// router: the shared experts run after the combine, the router weights' gradient later still).
int64_t ArenaEpRoutedPeak(const ArenaSizes& z, Recompute recompute, const ArenaMoeBuffers& b,
                          int64_t early, int64_t open, int64_t held, int64_t forward_held) {
  const bool full =
      recompute == Recompute::kFull || (recompute == Recompute::kSelective && z.moe_recomputed);
  auto rc = [&](int64_t x) { return full ? x : 0; };
  // moe_act: the activation recomputed for the down projection's backward.
  const int64_t act_rc = recompute == Recompute::kSelective && z.moe_act ? b.act : 0;
  const int64_t a = z.a, rows = z.dispatch_rows, routed = ArenaRoutedRows(z);
  const int64_t dy = SatMul(routed, z.h * a), dye = SatMul(rows, z.h * a);
  const int64_t dact = SatMul(rows, z.expert_ffn * a);
  const int64_t dgate_up = SatMul(rows, (z.gelu ? 1 : 2) * z.expert_ffn * a);
  const int64_t dxe = SatMul(rows, z.h * a), dxp = SatMul(routed, z.h * a);
  const int64_t dn2 = SatMul(z.expert_rows, z.h * a);
  const int64_t counts = SatSum({b.row_map, b.expert_counts, b.ep_counts});
  const int64_t recomputed_forward =
      full ? SatSum({early, forward_held, b.weights, b.capacity_mask, b.permuted, counts, b.gate_up,
                     b.act, b.out, SatMul(rows, z.h * a)})
           : 0;
  return std::max({
      recomputed_forward,
      SatSum(
          {early, held, dy,
           rc(SatSum({b.weights, b.capacity_mask, b.permuted, counts, b.gate_up, b.act, b.out}))}),
      SatSum({early, held, dy, dye, rc(SatSum({b.permuted, counts, b.gate_up, b.act}))}),
      SatSum({open, held, dye, dact, act_rc, rc(SatSum({b.permuted, counts, b.gate_up, b.act}))}),
      SatSum({open, held, dact, dgate_up, rc(SatSum({b.permuted, counts, b.gate_up}))}),
      SatSum({open, held, dgate_up, dxe, rc(SatSum({b.permuted, counts}))}),
      SatSum({open, held, dxe, dxp, rc(counts)}),
      SatSum({open, held, dxp, dn2, rc(b.row_map)}),
  });
}
// --- end expert parallelism ---

}  // namespace

int64_t ArenaRecomputedLayer(const ArenaSizes& z, bool moe) {
  // The norms' outputs a recomputed forward gathers over the whole sequence (sp), beside what
  // the layer keeps of them without recompute (the rank's rows); an MoE layer's shared experts
  // read their input gathered too.
  if (!moe)
    return SatAdd(ArenaLayerStash(z, Recompute::kNone), SatMul(2, SatMul(z.T - z.R, z.h * z.a)));
  return SatSum({ArenaMoeLayerStash(z, Recompute::kNone), SatMul(z.T - z.R, z.h * z.a),
                 ArenaMoeBuffersOf(z).shared_input});
}

// The busiest op of an MoE layer's backward (scratch and the transient buckets), op by op as
// MoeBackward emits it: the gradients live at each step, and under full recompute the recomputed
// forward buffers the rest of the backward still reads (released at their last reader). The
// attention half's backward follows, as in a dense layer.
int64_t ArenaMoeLayerPeak(const ArenaSizes& z, Recompute recompute, const ArenaMoeBuckets& k) {
  const ArenaMoeBuffers b = ArenaMoeBuffersOf(z);
  const bool full = recompute == Recompute::kFull, shared = z.shared_ffn > 0;
  // The MoE block made again before its backward: under full recompute, or selective's moe
  // module (then from its kept input, the attention half not recomputed).
  const bool remade = full || (recompute == Recompute::kSelective && z.moe_recomputed);
  const int64_t routed = ArenaRoutedRows(z), a = z.a;
  // Gradients of the routed path: the experts' output (dy), the router weights' (dw), the
  // activation's (da), gate's and up's (dg, du), the permuted rows' (dxp), and the block
  // input's on the group's rows (dn2). Under etp_gathered the output gradient is gathered to
  // the group's rows and, with shared experts, read again by their backward.
  const int64_t dy = SatMul(routed, z.h * a), dw = SatMul(z.expert_rows, z.topk * a);
  const int64_t dact = SatMul(routed, z.expert_ffn * a);
  const int64_t dgate_up = SatMul(routed, (z.gelu ? 1 : 2) * z.expert_ffn * a);
  const int64_t dxp = SatMul(routed, z.h * a), dn2 = SatMul(z.expert_rows, z.h * a);
  const int64_t grad_rows = z.etp_gathered ? SatMul(z.expert_rows, z.h * a) : 0;
  const int64_t held_grad_rows = shared ? grad_rows : 0;
  // Recomputed buffers (full recompute), grouped by the step after which they are released.
  const int64_t attention =
      full ? ArenaAttentionStash(z, Recompute::kNone) - SatMul(z.R, z.h * a) +  // x stays stashed
                 SatMul(z.T - z.R, z.h * a)  // the attention norm's output gathered again
           : 0;
  auto rc = [&](int64_t x) { return remade ? x : 0; };
  // The shared experts' input: the Etp group's rows, the gathered rows under sp, else the block
  // input itself (then held to the shared experts' backward with the router's buffers).
  const int64_t shared_input =
      !shared ? 0 : (z.etp_gathered ? b.group_rows : (z.R < z.T ? b.shared_input : b.input));
  const int64_t until_shared =
      rc(SatSum({z.R < z.T ? shared_input : 0, b.shared_gate_up, b.shared_act}));
  const int64_t router = rc(SatSum({full ? b.input : 0, b.indices, b.scores, b.counts}));
  // Steps: MoeUnpermuteBackward, the down projection's backward, the activation's backward, the
  // gate (GELU: up) projection's backward, MoeUnpermute of the permuted gradient.
  // Before the down projection's backward only the recomputed forward has read the weights.
  const int64_t early = SatAdd(k.held, remade ? k.params : 0);
  const int64_t open = SatSum({k.held, k.params, k.grads});
  // moe_act: the activation recomputed for the down projection's backward.
  const int64_t recomputed_act = recompute == Recompute::kSelective && z.moe_act ? b.act : 0;
  const int64_t routed_peak = std::max({
      SatSum({early, grad_rows, dy, dw, attention, until_shared, router,
              rc(SatSum({b.weights, b.capacity_mask, b.permuted, b.row_map, b.expert_counts,
                         b.gate_up, b.act, b.out}))}),
      SatSum({open, held_grad_rows, dy, dact, dw, attention, until_shared, router, recomputed_act,
              rc(SatSum({b.permuted, b.row_map, b.expert_counts, b.gate_up, b.act}))}),
      SatSum({open, held_grad_rows, dact, dgate_up, dw, attention, until_shared, router,
              rc(SatSum({b.permuted, b.row_map, b.expert_counts, b.gate_up}))}),
      SatSum({open, held_grad_rows, dgate_up, dxp, dw, attention, until_shared, router,
              rc(SatSum({b.permuted, b.row_map, b.expert_counts}))}),
      SatSum({open, held_grad_rows, dxp, dn2, dw, attention, until_shared, router, rc(b.row_map)}),
  });
  int64_t peak = routed_peak;
  if (z.ep > 1)
    peak =
        ArenaEpRoutedPeak(z, recompute, b, early, open,
                          SatSum({dw, attention, until_shared, router}), SatAdd(attention, router));
  if (shared) {
    // The shared experts' backward, after the router's: the output gradient on all rows, the
    // activation's, gate's and up's gradients, the input's, beside the block input's gradient.
    const int64_t rows_grad = SatMul(z.R, z.h * a);
    const int64_t gathered = z.R < z.T ? SatMul(z.T, z.h * a) : 0;
    const int64_t dsa = SatMul(z.T, z.shared_ffn * a);
    const int64_t dsgu = SatMul(z.T, (z.gelu ? 1 : 2) * z.shared_ffn * a);
    const int64_t dnf = SatMul(z.T, z.h * a);
    const int64_t held = SatSum({open, attention, rc(shared_input)});
    // Made again for their backward: under full recompute, or with the shared_experts module.
    const bool shared_remade =
        remade || (recompute == Recompute::kSelective && z.shared_recomputed);
    auto rs = [&](int64_t x) { return shared_remade ? x : 0; };
    peak = std::max(
        {peak, SatSum({gathered, dsa, rows_grad, held, rs(SatAdd(b.shared_gate_up, b.shared_act))}),
         SatSum({dsa, dsgu, rows_grad, held, rs(b.shared_gate_up)}),
         SatSum({dsgu, dnf, rows_grad, held})});
  }
  // The attention half: its backward's working set (as ArenaBodyPeak prices it) with the
  // recomputed attention buffers.
  int64_t attn = 2 * z.heads * z.hd + 2 * z.kv * z.hd;
  if (z.ring) attn += 8 * z.kv * z.hd;
  attn = std::max(attn, z.heads * z.hd + 2 * z.kv * z.hd + z.h);
  int64_t attention_peak = SatMul(z.T, attn * a);
  if (recompute == Recompute::kSelective && !z.core_kept)
    attention_peak = SatAdd(attention_peak, SatMul(z.T, z.heads * z.hd * a + z.heads * 4));
  attention_peak = SatSum({attention_peak, attention, open});
  if (recompute == Recompute::kSelective && z.norm_recomputed) {
    // layernorm: the recomputed norm's output rows (gathered for the shared experts under sp)
    // and statistics live through the MoE block's backward, the attention norm's through the
    // attention half's.
    peak = SatSum({peak, b.input, b.shared_input, SatMul(z.R, int64_t{z.layernorm ? 2 : 1} * 4)});
    attention_peak = SatAdd(attention_peak, ArenaRecomputedNorm(z));
  }
  if (!full && z.R < z.T && !(recompute == Recompute::kSelective && z.norm_recomputed)) {
    // Under sequence parallelism the kept rows are gathered again: the shared experts' input
    // through the MoE block's backward (unless the moe module's recomputed block holds it), the
    // attention norm's output through the attention half's.
    if (!remade) peak = SatAdd(peak, b.shared_input);
    attention_peak = SatAdd(attention_peak, SatMul(z.T, z.h * a));
  }
  return std::max(peak, attention_peak);
}

// The router's expert bias (a State buffer) and the load it is moved by, fp32 per expert, on
// each MoE layer with aux-loss-free balancing.
int64_t ArenaMoeStateBuffers(const ArenaSizes& z) { return z.expert_bias ? 2 * z.experts * 4 : 0; }

namespace {

// Microbatches of each local chunk in flight at once on pipeline rank r, in the order the
// schedule runs them (Megatron's: warm-up forwards, one forward one backward, cool-down). A
// microbatch takes its chunk's slot at its first transfer or forward (compiler/lower/lower.cpp,
// AssignSlots). In the interleaved steady state the transfer placement (compiler/lower/
// schedule.cpp) posts the first stage's next input (from the last stage, for every chunk but the
// first) in the group before the backward: received into its slot (`early_receive`), that slot
// is taken before the backward gives its own back. The other stages receive right before the
// forward, after the backward.
std::vector<int64_t> SlotsInFlight(const Plan& plan, int64_t r, int64_t m, bool early_receive) {
  const int64_t p = std::max<int64_t>(1, plan.parallel.pp),
                v = std::max<int64_t>(1, plan.parallel.vpp);
  std::vector<int64_t> slots(static_cast<size_t>(v), 0);
  if (plan.pipeline.schedule == Schedule::kGpipe) {
    std::fill(slots.begin(), slots.end(), m);
    return slots;
  }
  if (v == 1) {
    slots[0] = std::min(p - r, m);
    return slots;
  }
  // The steady state repeats every p microbatches (p forwards and p backwards of every chunk),
  // and the live counts are the same at each repeat: a run with whole repeats taken out of its
  // steady state reaches the same counts. 4 p microbatches keep the warm-up (at most (v + 1) p
  // forwards), a whole repeat and the cool-down; the search's cost stays independent of the
  // batch (tests/memory/arena_truth_test.cpp compares with the lowered programs).
  if (m > 5 * p) m -= p * ((m - 4 * p) / p);
  // The search prices thousands of candidates that share their pipeline shape: the counts are
  // kept per shape (per thread; planrun's ranks may price plans at once).
  const std::array<int64_t, 5> key = {p, v, r, m, early_receive && r == 0 ? 1 : 0};
  thread_local std::map<std::array<int64_t, 5>, std::vector<int64_t>> known;
  if (const auto it = known.find(key); it != known.end()) return it->second;
  if (known.size() > 4096) known.clear();
  const int64_t total = m * v;
  const int64_t warmup = std::min(total, 2 * (p - r - 1) + (v - 1) * p);
  std::vector<int64_t> live(static_cast<size_t>(v), 0);
  int64_t taken = 0;  // forwards whose slot is taken: 0 .. taken - 1
  auto take = [&](int64_t k) {
    if (k < taken) return;
    const size_t c = static_cast<size_t>((k / p) % v);
    slots[c] = std::max(slots[c], ++live[c]);
    taken = k + 1;
  };
  auto early = [&](int64_t k) { return early_receive && r == 0 && (k / p) % v != 0; };
  auto backward = [&](int64_t k) { --live[static_cast<size_t>(v - 1 - (k / p) % v)]; };
  for (int64_t k = 0; k < warmup; ++k) take(k);
  for (int64_t i = 0; i < total - warmup; ++i) {
    take(warmup + i);
    if (warmup + i + 1 < total && early(warmup + i + 1)) take(warmup + i + 1);
    backward(i);
  }
  known.emplace(key, slots);
  return slots;
}

// The stash slots of each local chunk of pipeline rank r, and which chunks have a landing buffer
// (compiler/lower/lower.cpp, LandingChunks): where its early receive would raise its slots, the
// first rank of the interleaved schedule receives into one activation of its own, copied into
// the input slot by the forward, and the early receive takes no slot.
struct StageSlots {
  std::vector<int64_t> slots;
  std::vector<bool> landing;
};

StageSlots SlotsOfStage(const Plan& plan, int64_t r, int64_t m) {
  StageSlots s;
  s.slots = SlotsInFlight(plan, r, m, true);
  s.landing.assign(s.slots.size(), false);
  // Only the first rank receives early (SlotsInFlight).
  if (plan.pipeline.schedule != Schedule::kInterleaved1F1B || plan.parallel.vpp < 2 ||
      plan.parallel.pp < 2 || r != 0)
    return s;
  const std::vector<int64_t> landed = SlotsInFlight(plan, r, m, false);
  for (size_t c = 1; c < s.slots.size(); ++c) {
    if (s.slots[c] <= landed[c]) continue;
    s.landing[c] = true;
    s.slots[c] = landed[c];
  }
  return s;
}

}  // namespace

// Microbatches of each local chunk in flight at once: SlotsInFlight, the early receives of the
// chunks with a landing buffer taking no slot.
std::vector<int64_t> ArenaSlots(const Plan& plan, int64_t r, int64_t m) {
  return SlotsOfStage(plan, r, m).slots;
}

namespace {

// The stash slots pipeline rank r's microbatches hold under the interleaved schedule, in the
// order SlotsInFlight runs them, with the transfer groups compiler/lower/schedule.cpp places: a
// forward takes its slot at the receive of its input (in the group after the previous
// computation, or on the first rank, for every chunk but the first, early in the group before
// the backward; into a landing buffer: at the forward itself), the first virtual stage's at the
// forward; a backward gives it back at its SendGrad, in one group with the next forward's
// receive (the first virtual stage's at the backward itself).
std::vector<SlotUse> SlotUsesOfStage(int64_t p, int64_t v, int64_t r, int64_t m,
                                     const std::vector<bool>& landing) {
  const int64_t total = m * v;
  const int64_t warmup = std::min(total, 2 * (p - r - 1) + (v - 1) * p);
  auto chunk_of = [&](int64_t k, bool backward) {
    const int64_t c = (k / p) % v;
    return backward ? v - 1 - c : c;
  };
  auto microbatch_of = [&](int64_t k) { return (k / (p * v)) * p + k % p; };
  auto receives = [&](int64_t k) {  // the forward's input arrives into its slot
    const int64_t c = chunk_of(k, false);
    return !(r == 0 && c == 0) && !landing[static_cast<size_t>(c)];
  };
  std::vector<SlotUse> uses;
  std::vector<int64_t> use_of(static_cast<size_t>(total), -1);  // forward k -> its use
  int64_t pos = 0;
  auto take = [&](int64_t k, bool recv) {
    if (k >= total || use_of[static_cast<size_t>(k)] >= 0) return;
    use_of[static_cast<size_t>(k)] = static_cast<int64_t>(uses.size());
    SlotUse u;
    u.chunk = static_cast<int32_t>(chunk_of(k, false));
    u.microbatch = microbatch_of(k);
    u.take = pos++;
    u.recv_take = recv;
    uses.push_back(u);
  };
  // Forward k of the chunk-microbatch backward i gives back.
  auto forward_of = [&](int64_t i) {
    const int64_t c = chunk_of(i, true), mb = microbatch_of(i);
    return (mb / p) * p * v + c * p + mb % p;
  };
  auto backward = [&](int64_t i, int64_t next) {
    SlotUse& u = uses[static_cast<size_t>(use_of[static_cast<size_t>(forward_of(i))])];
    u.free = u.release = pos++;
    if (r == 0 && u.chunk == 0) return;  // the first virtual stage sends no gradient
    if (next < total && receives(next) && use_of[static_cast<size_t>(next)] < 0) {
      u.release = pos;
      take(next, true);
    }
  };
  for (int64_t k = 0; k < warmup; ++k) take(k, receives(k));
  for (int64_t i = 0; i < total - warmup; ++i) {
    const int64_t k = warmup + i;
    take(k, receives(k));
    if (r == 0 && k + 1 < total && receives(k + 1)) take(k + 1, true);  // early, before backward
    backward(i, k + 1);
  }
  for (int64_t i = total - warmup; i < total; ++i) backward(i, total);
  return uses;
}

}  // namespace

ArenaStashSlots ArenaPooledSlots(const Plan& plan, int64_t r, int64_t m,
                                 const std::vector<int64_t>& frames) {
  const StageSlots stage = SlotsOfStage(plan, r, m);
  ArenaStashSlots out;
  out.slots = stage.slots;
  out.pooled.assign(stage.slots.size(), false);
  const int64_t p = std::max<int64_t>(1, plan.parallel.pp),
                v = std::max<int64_t>(1, plan.parallel.vpp);
  if (plan.pipeline.schedule != Schedule::kInterleaved1F1B || v < 2 || p < 2 ||
      frames.size() != stage.slots.size())
    return out;
  // As SlotsInFlight, whole repeats of the steady state taken out give the same slots; 8 p
  // microbatches keep a steady repeat between the warm-up and the cool-down, from which the
  // pool's slots are packed (slot_pool.h), as compiler/lower's samples do.
  if (m > 10 * p) m -= p * ((m - 8 * p) / p);
  std::vector<int32_t> own;
  for (int64_t s : stage.slots) own.push_back(static_cast<int32_t>(s));
  // The pool's slots per shape and pooled chunks (the search prices thousands of candidates).
  thread_local std::map<std::vector<int64_t>, int32_t> known;
  if (known.size() > 4096) known.clear();
  std::vector<SlotUse> uses;
  const std::optional<PoolChoice> choice =
      ChooseSlotPool(frames, own, [&](const std::vector<bool>& pooled, int32_t max_slots) {
        std::vector<int64_t> key = {p, v, r, m, max_slots};
        for (size_t c = 0; c < pooled.size(); ++c)
          key.push_back((pooled[c] ? 1 : 0) + (stage.landing[c] ? 2 : 0));
        auto it = known.find(key);
        if (it == known.end()) {
          if (uses.empty()) uses = SlotUsesOfStage(p, v, r, m, stage.landing);
          const std::optional<PoolSlots> solved =
              AssignPoolSlots(PooledUses(uses, pooled), static_cast<int32_t>(p), max_slots);
          it = known.emplace(key, solved ? solved->slots : -1).first;
        }
        std::optional<PoolSlots> counted;
        if (it->second > 0) counted = PoolSlots{it->second, 0, {}};
        return counted;
      });
  if (!choice) return out;
  out.pooled = choice->pooled;
  for (size_t c = 0; c < out.slots.size(); ++c)
    if (out.pooled[c]) out.slots[c] = choice->slots.slots;
  return out;
}

int64_t ArenaLandingBytes(const Plan& plan, const ArenaSizes& z, int64_t r, int64_t m, int64_t c) {
  if (r != 0 || c <= 0) return 0;
  const StageSlots s = SlotsOfStage(plan, r, m);
  return static_cast<size_t>(c) < s.landing.size() && s.landing[static_cast<size_t>(c)]
             ? SatMul(z.R, z.h * z.a)
             : 0;
}

namespace {

// Mixture of experts as lowering emits it: the experts whole (etp = 1) or split over the Tp group
// (etp = tp), with ep = 1 or split over Ep as well, with or without a capacity factor.
bool MoeArenaApplies(const Plan& plan) {
  const ParallelSpec& q = plan.parallel;
  if (q.etp != 1 && q.etp != q.tp) return false;
  // Expert parallelism lowers beside tp > 1 under sequence parallelism or with the experts split
  // over the Tp group (with any ZeRO stage: the experts' buckets sharded over Edp).
  if (q.ep > 1) return (q.tp == 1 || q.sp || q.etp == q.tp) && plan.model.experts % q.ep == 0;
  return true;
}

}  // namespace

bool ArenaModelApplies(const Plan& plan) {
  const ModelSpec& m = plan.model;
  // Context parallelism lowers whole: learned positions, and ZeRO sharded over dp · cp.
  const ParallelSpec& q = plan.parallel;
  return plan.framework == Framework::kParaplan && (!m.IsMoe() ? q.ep == 1 : MoeArenaApplies(plan));
}

// --- expert parallelism: planrun keeps the experts in a bucket of their own, their gradients
// reduced and (ZeRO 1) their optimizer state sharded over the Edp group, the
// tp · cp · dp / (ep · etp) ranks holding the same expert slices, with ep > 1 and with ep = 1,
// etp = 1 beside tp > 1 under sequence parallelism and ZeRO 0 or 1 (Edp then spans the Tp
// ranks, as Megatron-Core's expert data-parallel group); otherwise beside the dense parameters,
// over dp · cp (compiler/lower/body_internal.h, ExpertsOverEdp) ---
int64_t ArenaExpertShardGroup(const Plan& plan, int64_t dense_shard) {
  const ParallelSpec& q = plan.parallel;
  const bool whole_over_tp = q.etp <= 1 && q.tp > 1 && q.sp && plan.optimizer.zero <= 1;
  if (q.ep <= 1 && !whole_over_tp) return dense_shard;
  return std::max<int64_t>(1, int64_t{q.tp} * q.cp * q.dp / (q.ep * std::max<int64_t>(1, q.etp)));
}
// --- end expert parallelism ---

}  // namespace paraplan
