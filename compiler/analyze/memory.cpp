#include "compiler/analyze/memory.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <initializer_list>

#include "compiler/analyze/cost_comm.h"
#include "compiler/analyze/cost_framework.h"
#include "compiler/analyze/cost_shape.h"
#include "compiler/analyze/cost_stages.h"

namespace paraplan {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

int64_t Scale(int64_t count, double bytes_per) {
  const double v = static_cast<double>(count) * bytes_per;
  if (!(v < 9.0e18)) return INT64_MAX;
  if (v <= -9.0e18) return INT64_MIN;
  return std::llround(v);  // v + 0.5 truncated rounds negatives (and 0.5 - 2^-54) wrongly
}

// --- planrun's static arena (framework = paraplan) -----------------------------------------
//
// What compiler/lower allocates, term by term, so that `check` and `compile` tell one truth:
// the buffers a chunk's forward and backward both touch are stashed once per in-flight
// microbatch (body.cpp, ClassifyStash), the slots per chunk are the most microbatches of that
// chunk in flight at once in the schedule (lower.cpp, AssignSlots), and everything else lives
// in a scratch region as large as the busiest op of any body (memory_plan.cpp).

struct ArenaSizes {
  int64_t t = 1;  // tensor parallel
  int64_t T = 0;  // tokens of a microbatch on one context-parallel rank: micro · seq / cp
  int64_t R = 0;  // rows a TP rank holds between layers: T / t under SP, else T
  int64_t h = 0, hd = 0, heads = 0, kv = 0, ffn = 0, vocab = 0;  // per TP rank where split
  int64_t a = 2;  // activation element bytes of the program's precision
  bool gelu = false, layernorm = false;
  bool ring = false;  // cp > 1: ring attention and its working buffers
  // Multi-head latent attention (kv_lora_rank > 0): query/key and value head sizes, latent ranks.
  bool mla = false;
  int64_t qk = 0, vd = 0, nope = 0, ql = 0, kvl = 0;
  // Mixture of experts (ArenaMoeSizesOf; zero on a dense model).
  int64_t experts = 0, topk = 0;
  int64_t expert_ffn = 0;     // each expert's width on one Etp rank
  int64_t shared_ffn = 0;     // the shared experts' width on one TP rank
  int64_t expert_rows = 0;    // rows the rank's experts run: the Etp group's under sp, else R
  bool etp_gathered = false;  // etp > 1 under sp: the group's rows and choices gathered
  bool expert_bias = false;   // aux-loss-free balancing (model.router_bias_rate > 0)
  // Expert parallelism (ArenaEpSizesOf; ep = 1 and zero otherwise).
  int64_t ep = 1;             // Ep ranks sharing a layer's experts
  int64_t local_experts = 0;  // experts / ep on each Ep rank
  int64_t dispatch_rows = 0;  // rows the rank's experts may receive (ArenaEpDispatchRows)
};

void ArenaMoeSizesOf(const Plan& plan, ArenaSizes& z);
void ArenaEpSizesOf(const Plan& plan, ArenaSizes& z);

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
  z.gelu = m.activation != Activation::kSwiGlu;
  z.layernorm = m.norm == Norm::kLayerNorm;
  z.mla = m.IsMla();
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

// --- multi-head latent attention (compiler/lower/body.cpp, MlaForward / MlaBackward) ---
// Stashed per token: q, k and v padded to the query/key head size, the output at the value head
// size, the latents before and after their norms (the core's padded output with its softmax
// statistics unless selective recompute redoes the core).
int64_t ArenaMlaAttentionStash(const ArenaSizes& z, Recompute recompute) {
  const int64_t per_token = 3 * z.heads * z.qk + z.heads * z.vd + 2 * z.ql + 2 * z.kvl;
  int64_t bytes = SatMul(z.T, per_token * z.a);
  bytes = SatAdd(bytes, SatMul(z.T, int64_t{z.ql > 0 ? 2 : 1} * 4));  // the latents' rstd
  if (recompute == Recompute::kNone) bytes = SatAdd(bytes, SatMul(z.T, z.heads * z.qk * z.a));
  return bytes;
}
// --- end multi-head latent attention ---

// Stashed bytes of one layer's attention half per microbatch (recompute none or selective): its
// input x, the gathered norm output, q, k, v, the attention output (and its softmax statistics
// unless selective recompute redoes the core), the residual and the fp32 statistics of both norms.
int64_t ArenaAttentionStash(const ArenaSizes& z, Recompute recompute) {
  int64_t bytes = SatMul(z.R, z.h * z.a);  // x
  const int64_t attention = z.mla ? 0 : 2 * z.heads * z.hd + 2 * z.kv * z.hd;
  bytes = SatAdd(bytes, SatMul(z.T, (z.h + attention) * z.a));  // n1f, q, o, k, v
  if (z.mla) bytes = SatAdd(bytes, ArenaMlaAttentionStash(z, recompute));
  bytes = SatAdd(bytes, SatMul(z.R, z.h * z.a));  // residual x1
  bytes = SatAdd(bytes,
                 SatMul(z.R, int64_t{z.layernorm ? 4 : 2} * 4));  // rstd (and mean) of both norms
  if (recompute == Recompute::kNone) bytes = SatAdd(bytes, SatMul(z.T, z.heads * 4));  // lse
  return bytes;
}

// Stashed bytes of one dense layer per microbatch: its input x and, unless the whole layer is
// recomputed, the attention half's buffers, the MLP's gathered input and its intermediates.
int64_t ArenaLayerStash(const ArenaSizes& z, Recompute recompute) {
  if (recompute == Recompute::kFull) return SatMul(z.R, z.h * z.a);  // x
  const int64_t mlp = z.h + (z.gelu ? 2 : 3) * z.ffn;                // n2f, MLP
  return SatAdd(ArenaAttentionStash(z, recompute), SatMul(z.T, mlp * z.a));
}

// Stashed bytes of a chunk beyond its layers, per microbatch: the chunk's output and the
// gradient arriving for it; token ids on the embedding chunk; on the loss chunk the final norm's
// statistics and gathered output, the logits, labels and cross-entropy statistics.
int64_t ArenaChunkExtra(const ArenaSizes& z, bool embedding, bool loss) {
  int64_t bytes = SatMul(2, SatMul(z.R, z.h * z.a));
  if (embedding) bytes = SatAdd(bytes, SatMul(z.T, 4));
  if (loss) {
    bytes = SatAdd(bytes, SatMul(z.R, int64_t{z.layernorm ? 2 : 1} * 4));
    bytes = SatAdd(bytes, SatMul(z.T, (z.h + z.vocab) * z.a));
    bytes = SatAdd(bytes, SatMul(z.T, 4 + 4 + 8));
  }
  return bytes;
}

// The loss chunk's busiest op: the logits' gradient with the final norm's.
int64_t ArenaLossPeak(const ArenaSizes& z) { return SatMul(z.T, (z.vocab + z.h) * z.a); }

// The busiest op of a chunk's bodies (scratch): the MLP and attention backward of one layer
// (with the recomputed layer under full recompute, the recomputed core under selective), and on
// the loss chunk the logits' gradient with the final norm's.
int64_t ArenaBodyPeak(const ArenaSizes& z, Recompute recompute, bool loss) {
  const int64_t mlp =
      z.gelu ? std::max(2 * z.ffn, z.ffn + z.h) + z.h : std::max(3 * z.ffn, 2 * z.ffn + z.h);
  int64_t attn = 2 * z.heads * z.hd + 2 * z.kv * z.hd;
  // Ring attention's backward also holds the ring of K, V and their partial gradients.
  if (z.ring) attn += 8 * z.kv * z.hd;
  attn = std::max(attn, z.heads * z.hd + 2 * z.kv * z.hd + z.h);
  // Latent attention's backward: the padded output gradient, dq, dk and dv at the query/key
  // head size, then dq, dk, dv beside the up projection's output gradient.
  if (z.mla) attn = std::max(4 * z.heads * z.qk, 3 * z.heads * z.qk + z.heads * (z.nope + z.vd));
  int64_t peak = SatMul(z.T, std::max(mlp, attn) * z.a);
  const int64_t core_hd = z.mla ? z.qk : z.hd;
  if (recompute == Recompute::kSelective)
    peak = SatAdd(peak, SatMul(z.T, z.heads * core_hd * z.a + z.heads * 4));
  if (recompute == Recompute::kFull)
    peak = SatAdd(peak, ArenaLayerStash(z, Recompute::kNone) - SatMul(z.R, z.h * z.a));
  if (loss) peak = std::max(peak, ArenaLossPeak(z));
  return peak;
}

// --- planrun's arena: mixture-of-experts layers (compiler/lower/body.cpp, MoeForward) ---------
//
// An MoE layer keeps the attention half of a dense layer; its MLP is the router, the routed
// experts and the shared experts. The routed buffers are sized for the worst case, every choice
// of every row landing on this rank's experts (ArenaRoutedRows). With etp = tp > 1 under sequence
// parallelism the experts run on the Etp group's rows: the rows, the router's logits, weights and
// choices are gathered over Etp before dispatch.

void ArenaMoeSizesOf(const Plan& plan, ArenaSizes& z) {
  const ModelSpec& m = plan.model;
  const int64_t etp = std::max<int64_t>(1, plan.parallel.etp);
  const int64_t ffn = m.moe_ffn_hidden > 0 ? m.moe_ffn_hidden : m.ffn_hidden;
  z.experts = m.experts;
  z.topk = std::max<int64_t>(1, m.topk);
  z.expert_ffn = ffn / etp;
  z.shared_ffn = SatMul(m.shared_experts, ffn) / z.t;
  z.etp_gathered = etp > 1 && plan.parallel.sp;
  z.expert_rows = z.etp_gathered ? SatMul(z.R, etp) : z.R;
  z.expert_bias = m.router_bias_rate > 0;
  ArenaEpSizesOf(plan, z);
}

// --- planrun's arena: expert parallelism (compiler/lower/body.cpp, EpDispatch / EpCombine) ---
//
// With ep > 1 (etp = 1) each Ep rank holds experts / ep experts. MoePermute's rows (routed) are
// dispatched to the ranks holding their experts, the local experts run on the rows received, and
// MoeCombine returns their output to the senders; the backward dispatches the output gradient
// and combines the input gradient. The receive buffers hold ArenaEpDispatchRows rows.

// The rows a rank's experts may receive: the worst case, every row of each Ep peer choosing
// min(topk, local experts) of them, or ceil(imbalance · rows · topk) when moe.imbalance is stated
// and smaller (DispatchCapacity).
// The routing imbalance the plan states (in its file, the standard library or on the command
// line; at least 1), or 0 when moe.imbalance keeps its default (lower.cpp reads it alike).
double ArenaEpStatedImbalance(const Plan& plan) {
  const FieldOrigin* origin = plan.origins.FindPath("moe.imbalance");
  if (origin == nullptr) return 0;
  const bool stated = origin->kind == OriginKind::kFile || origin->kind == OriginKind::kStdlib ||
                      origin->kind == OriginKind::kCommandLine;
  return stated ? std::max(1.0, plan.moe.imbalance) : 0;
}

int64_t ArenaEpDispatchRows(const Plan& plan, const ArenaSizes& z) {
  const int64_t worst = SatMul(SatMul(z.ep, z.R), std::min(z.topk, z.local_experts));
  const double imbalance = ArenaEpStatedImbalance(plan);
  if (imbalance <= 0) return worst;
  const double balanced = static_cast<double>(SatMul(z.R, z.topk));
  const auto stated = static_cast<int64_t>(std::ceil(imbalance * balanced));
  return std::min(worst, std::max<int64_t>(stated, 1));
}

void ArenaEpSizesOf(const Plan& plan, ArenaSizes& z) {
  z.ep = std::max<int64_t>(1, plan.parallel.ep);
  z.local_experts = z.experts / z.ep;
  if (z.ep > 1) z.dispatch_rows = ArenaEpDispatchRows(plan, z);
}

// The rows the experts' GEMMs run on: the received rows with ep > 1, else the routed ones.
int64_t ArenaExpertGemmRows(const ArenaSizes& z) {
  return z.ep > 1 ? z.dispatch_rows : SatMul(z.expert_rows, z.topk);
}

// Stashed with ep > 1 beside the routed buffers: the per-peer split of the rows (ep · local
// experts) and the local experts' counts, int32.
int64_t ArenaEpCountsStash(const ArenaSizes& z) {
  return z.ep > 1 ? SatMul(SatMul(z.ep, z.local_experts) + z.local_experts, 4) : 0;
}
// --- end expert parallelism ---

// Rows of the permuted (routed) buffers: every choice of every row the rank's experts see.
int64_t ArenaRoutedRows(const ArenaSizes& z) { return SatMul(z.expert_rows, z.topk); }

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
  if (z.etp_gathered && shared) b.group_rows = SatMul(z.expert_rows, z.h * a);
  b.permuted = SatMul(rows, z.h * a);
  b.row_map = SatMul(routed, 4);
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

// Stashed bytes of one MoE layer per microbatch: the attention half's, then every buffer of the
// MoE block its backward reads; under full recompute the layer input only.
int64_t ArenaMoeLayerStash(const ArenaSizes& z, Recompute recompute) {
  if (recompute == Recompute::kFull) return SatMul(z.R, z.h * z.a);  // x
  const ArenaMoeBuffers b = ArenaMoeBuffersOf(z);
  return SatSum({ArenaAttentionStash(z, recompute), b.input, b.weights, b.indices, b.scores,
                 b.counts, b.group_rows, b.permuted, b.row_map, b.expert_counts, b.gate_up, b.act,
                 b.out, b.ep_counts, b.shared_input, b.shared_gate_up, b.shared_act});
}

// The transient buckets live in an MoE layer's backward body under ZeRO >= 2 on dp · cp > 1
// (bytes; zero otherwise): the layer's full fp32 gradients, from its first gradient (the down
// projection's) to the end of the layer, and with ZeRO 3 its gathered weights, from the first
// weight read (the recomputed forward's under full recompute, else the down projection's). A
// tied word embedding on a chunk that also holds the loss keeps its gradient bucket open from
// the output layer's backward to the embedding's, across every layer.
struct ArenaMoeBuckets {
  int64_t grads = 0, params = 0, held = 0;
};

// --- expert parallelism: the routed path's busiest op with ep > 1 ---
// Op by op as MoeBackward emits it with ep > 1: MoeUnpermuteBackward (dy, dw), the output
// gradient's dispatch (dye on the received rows), the down projection's backward (da), the
// activation's (gate's and up's gradients), gate's and up's backward into the received rows'
// gradient (dxe), its combine back to the routed rows (dxp), and MoeUnpermute into the block
// input's gradient (dn2). Under full recompute the recomputed forward's combine comes first: the
// experts' output on the received rows (scratch) beside the combined rows. `early` and `open`
// are the buckets live before and from the down projection's backward, `held` what every step
// keeps (the router weights' gradient, the recomputed attention, router and shared buffers).
int64_t ArenaEpRoutedPeak(const ArenaSizes& z, Recompute recompute, const ArenaMoeBuffers& b,
                          int64_t early, int64_t open, int64_t held) {
  const bool full = recompute == Recompute::kFull;
  auto rc = [&](int64_t x) { return full ? x : 0; };
  const int64_t a = z.a, rows = z.dispatch_rows, routed = ArenaRoutedRows(z);
  const int64_t dy = SatMul(routed, z.h * a), dye = SatMul(rows, z.h * a);
  const int64_t dact = SatMul(rows, z.expert_ffn * a);
  const int64_t dgate_up = SatMul(rows, (z.gelu ? 1 : 2) * z.expert_ffn * a);
  const int64_t dxe = SatMul(rows, z.h * a), dxp = SatMul(routed, z.h * a);
  const int64_t dn2 = SatMul(z.expert_rows, z.h * a);
  const int64_t counts = SatSum({b.row_map, b.expert_counts, b.ep_counts});
  const int64_t recomputed_forward = full ? SatSum({early, held, b.weights, b.permuted, counts,
                                                    b.gate_up, b.act, b.out, SatMul(rows, z.h * a)})
                                          : 0;
  return std::max({
      recomputed_forward,
      SatSum(
          {early, held, dy, rc(SatSum({b.weights, b.permuted, counts, b.gate_up, b.act, b.out}))}),
      SatSum({early, held, dy, dye, rc(SatSum({b.permuted, counts, b.gate_up, b.act}))}),
      SatSum({open, held, dye, dact, rc(SatSum({b.permuted, counts, b.gate_up, b.act}))}),
      SatSum({open, held, dact, dgate_up, rc(SatSum({b.permuted, counts, b.gate_up}))}),
      SatSum({open, held, dgate_up, dxe, rc(SatSum({b.permuted, counts}))}),
      SatSum({open, held, dxe, dxp, rc(counts)}),
      SatSum({open, held, dxp, dn2, rc(b.row_map)}),
  });
}
// --- end expert parallelism ---

// The busiest op of an MoE layer's backward (scratch and the transient buckets), op by op as
// MoeBackward emits it: the gradients live at each step, and under full recompute the recomputed
// forward buffers the rest of the backward still reads (released at their last reader). The
// attention half's backward follows, as in a dense layer.
int64_t ArenaMoeLayerPeak(const ArenaSizes& z, Recompute recompute, const ArenaMoeBuckets& k) {
  const ArenaMoeBuffers b = ArenaMoeBuffersOf(z);
  const bool full = recompute == Recompute::kFull, shared = z.shared_ffn > 0;
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
  const int64_t attention = full ? ArenaAttentionStash(z, Recompute::kNone) -
                                       SatMul(z.R, z.h * a)  // x stays in the stash
                                 : 0;
  auto rc = [&](int64_t x) { return full ? x : 0; };
  // The shared experts' input: the Etp group's rows, the gathered rows under sp, else the block
  // input itself (then held to the shared experts' backward with the router's buffers).
  const int64_t shared_input =
      !shared ? 0 : (z.etp_gathered ? b.group_rows : (z.R < z.T ? b.shared_input : b.input));
  const int64_t until_shared =
      rc(SatSum({z.R < z.T ? shared_input : 0, b.shared_gate_up, b.shared_act}));
  const int64_t router = rc(SatSum({b.input, b.indices, b.scores, b.counts}));
  // Steps: MoeUnpermuteBackward, the down projection's backward, the activation's backward, the
  // gate (GELU: up) projection's backward, MoeUnpermute of the permuted gradient.
  // Before the down projection's backward only the recomputed forward has read the weights.
  const int64_t early = SatAdd(k.held, full ? k.params : 0);
  const int64_t open = SatSum({k.held, k.params, k.grads});
  const int64_t routed_peak = std::max({
      SatSum({early, grad_rows, dy, dw, attention, until_shared, router,
              rc(SatSum(
                  {b.weights, b.permuted, b.row_map, b.expert_counts, b.gate_up, b.act, b.out}))}),
      SatSum({open, held_grad_rows, dy, dact, dw, attention, until_shared, router,
              rc(SatSum({b.permuted, b.row_map, b.expert_counts, b.gate_up, b.act}))}),
      SatSum({open, held_grad_rows, dact, dgate_up, dw, attention, until_shared, router,
              rc(SatSum({b.permuted, b.row_map, b.expert_counts, b.gate_up}))}),
      SatSum({open, held_grad_rows, dgate_up, dxp, dw, attention, until_shared, router,
              rc(SatSum({b.permuted, b.row_map, b.expert_counts}))}),
      SatSum({open, held_grad_rows, dxp, dn2, dw, attention, until_shared, router, rc(b.row_map)}),
  });
  int64_t peak = routed_peak;
  if (z.ep > 1)
    peak = ArenaEpRoutedPeak(z, recompute, b, early, open,
                             SatSum({dw, attention, until_shared, router}));
  if (shared) {
    // The shared experts' backward, after the router's: the output gradient on all rows, the
    // activation's, gate's and up's gradients, the input's, beside the block input's gradient.
    const int64_t rows_grad = SatMul(z.R, z.h * a);
    const int64_t gathered = z.R < z.T ? SatMul(z.T, z.h * a) : 0;
    const int64_t dsa = SatMul(z.T, z.shared_ffn * a);
    const int64_t dsgu = SatMul(z.T, (z.gelu ? 1 : 2) * z.shared_ffn * a);
    const int64_t dnf = SatMul(z.T, z.h * a);
    const int64_t held = SatSum({open, attention, rc(shared_input)});
    peak = std::max(
        {peak, SatSum({gathered, dsa, rows_grad, held, rc(SatAdd(b.shared_gate_up, b.shared_act))}),
         SatSum({dsa, dsgu, rows_grad, held, rc(b.shared_gate_up)}),
         SatSum({dsgu, dnf, rows_grad, held})});
  }
  // The attention half: its backward's working set (as ArenaBodyPeak prices it) with the
  // recomputed attention buffers.
  int64_t attn = 2 * z.heads * z.hd + 2 * z.kv * z.hd;
  if (z.ring) attn += 8 * z.kv * z.hd;
  attn = std::max(attn, z.heads * z.hd + 2 * z.kv * z.hd + z.h);
  int64_t attention_peak = SatMul(z.T, attn * a);
  if (recompute == Recompute::kSelective)
    attention_peak = SatAdd(attention_peak, SatMul(z.T, z.heads * z.hd * a + z.heads * 4));
  attention_peak = SatSum({attention_peak, attention, open});
  return std::max(peak, attention_peak);
}

// The router's expert bias (a State buffer) and the load it is moved by, fp32 per expert, on
// each MoE layer with aux-loss-free balancing.
int64_t ArenaMoeStateBuffers(const ArenaSizes& z) { return z.expert_bias ? 2 * z.experts * 4 : 0; }

// Microbatches of each local chunk in flight at once on pipeline rank r, in the order the
// schedule runs them (Megatron's: warm-up forwards, one forward one backward, cool-down).
std::vector<int64_t> ArenaSlots(const Plan& plan, int64_t r, int64_t m) {
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
  const int64_t total = m * v;
  const int64_t warmup = std::min(total, 2 * (p - r - 1) + (v - 1) * p);
  std::vector<int64_t> live(static_cast<size_t>(v), 0);
  auto forward = [&](int64_t k) {
    const size_t c = static_cast<size_t>((k / p) % v);
    slots[c] = std::max(slots[c], ++live[c]);
  };
  auto backward = [&](int64_t k) { --live[static_cast<size_t>(v - 1 - (k / p) % v)]; };
  for (int64_t k = 0; k < warmup; ++k) forward(k);
  for (int64_t i = 0; i < total - warmup; ++i) {
    forward(warmup + i);
    backward(i);
  }
  return slots;
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
          CeilDiv(SatMul(tokens, x * MlpWidth(m, SatMul(m.shared_experts, m.moe_ffn_hidden))), t));
    if (modules & kRecomputeMoe) {
      const int64_t copies = shape.options.moe_probs_in_activation ? 1 : 2;
      drop = SatAdd(drop, SatMul(pairs, SatAdd(copies * x * m.hidden,
                                               x * CeilDiv(MlpWidth(m, m.moe_ffn_hidden), etp))));
    } else if (modules & kRecomputeMoeAct) {
      drop = SatAdd(drop,
                    SatMul(pairs, x * CeilDiv(m.moe_ffn_hidden, etp)));  // the activation's output
    }
  }
  return drop;
}

// FP8 GEMMs (Transformer Engine, torchtitan float8) save their inputs for the backward as 1-byte
// copies instead of 16-bit ones (cost-models.md 2.2): the QKV and fc1 inputs (norm outputs), the
// attention output projection's input and the fc2 input, one byte less per element each.
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
      kind == LayerKind::kDense ? m.ffn_hidden : SatMul(m.shared_experts, m.moe_ffn_hidden);
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
  if (fp8 && plan.recompute != Recompute::kFull) {
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

// Mixture of experts as lowering emits it: with ep = 1 the experts whole (etp = 1) or split over
// the Tp group (etp = tp); with ep > 1 split over Ep (etp = 1); no capacity factor (no token
// dropping).
bool MoeArenaApplies(const Plan& plan) {
  const ParallelSpec& q = plan.parallel;
  if (plan.moe.capacity_factor > 0) return false;
  // Expert parallelism lowers with etp = 1, ZeRO 0 or 1 and sequence parallelism under tp > 1.
  if (q.ep > 1)
    return q.etp == 1 && plan.optimizer.zero <= 1 && (q.tp == 1 || q.sp) &&
           plan.model.experts % q.ep == 0;
  return q.ep == 1 && (q.etp == 1 || q.etp == q.tp);
}

}  // namespace

bool ArenaModelApplies(const Plan& plan) {
  const ModelSpec& m = plan.model;
  // Context parallelism lowers whole: learned positions, and ZeRO sharded over dp · cp.
  const ParallelSpec& q = plan.parallel;
  return plan.framework == Framework::kParaplan && (!m.IsMoe() ? q.ep == 1 : MoeArenaApplies(plan));
}

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
    // (fp32 under fp32, fp16 under fp16, else bf16: no FP8 weights or cached casts), fp32
    // gradients, and an fp32 master shard with two fp32 moments whatever the precision and the
    // optimizer (SGD's buckets have them too): 12 bytes of optimizer state per parameter.
    b.weights = plan.precision == Precision::kFp32 ? 4 : 2;
    b.gradients = 4;
    b.optimizer = 12;
    return b;
  }
  // Megatron's distributed-optimizer table (cost-models.md 2.1): bf16 params 2, fp32 main grads
  // 4, fp32 master 4, Adam moments 2 x 4; each term follows the precision record.
  const MixedPrecisionSpec mp = EffectiveMixedPrecision(plan);
  const bool adam = plan.optimizer.type == OptimizerType::kAdamW;
  b.weights = mp.fp8_params ? 1 : static_cast<double>(BytesOf(mp.params));
  if (mp.fp8 != Fp8Recipe::kNone && !mp.fp8_params && CachesFp8Weights(plan.framework))
    b.weights += 1;
  b.gradients = static_cast<double>(BytesOf(mp.grads));
  const double moments = static_cast<double>((adam ? 2 : 1) * BytesOf(mp.optimizer_state));
  b.optimizer = (mp.main_params ? 4 : 0) + moments;
  // fp16 with fp16 gradients: the optimizer keeps an fp32 copy of the main gradient too.
  if (mp.params == ElementType::kFp16 && mp.grads == ElementType::kFp16 && mp.main_params)
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

// --- expert parallelism: planrun keeps the Ep-sharded experts in a bucket of their own, their
// gradients reduced and (ZeRO 1) their optimizer state sharded over the Edp group, the
// tp · cp · dp / ep ranks holding the same experts (compiler/lower/body.cpp, BuildBuckets) ---
int64_t ArenaExpertShardGroup(const Plan& plan, int64_t dense_shard) {
  const ParallelSpec& q = plan.parallel;
  if (q.ep <= 1) return dense_shard;
  return std::max<int64_t>(1, int64_t{q.tp} * q.cp * q.dp / q.ep);
}
// --- end expert parallelism ---

// The ranks ZeRO shards the routed experts' states over. Megatron-Core: the expert data-parallel
// group, world / (etp · ep · pp) = `edp` (with etp = 1 and tp > 1 it spans the Tp ranks, which
// hold the same whole experts), less HSDP's replicas. planrun (the arena model): with ep = 1 the
// experts sit in the chunk's buckets beside the dense parameters (compiler/lower/body.cpp,
// BuildBuckets), so they shard over the dense ZeRO group, dp · cp, whatever etp; with ep > 1
// over Edp (ArenaExpertShardGroup).
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
  int64_t workspace = 0;                   // recompute working set (arena: the busiest op)
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
  if (plan.optimizer.zero < 2 || plan.parallel.dp * plan.parallel.cp <= 1) return k;
  const int64_t elements = ArenaMoeLayerBucket(in);
  k.grads = SatMul(elements, 4);
  if (plan.optimizer.zero >= 3) k.params = SatMul(elements, in.arena_sizes.a);
  if (plan.model.tied_embeddings && chunk.embedding && chunk.loss)
    k.held = SatMul(SatMul(in.arena_sizes.vocab, plan.model.hidden), 4);
  return k;
}

// planrun's arena: the stash of a chunk's `layers` MoE layers with `held` microbatches in flight,
// and the busiest op of their backward with their transient buckets (StageTally::moe_workspace;
// the chunk's loss, when it has no dense layer, in StageTally::workspace).
void AddArenaMoeLayers(const MemoryInputs& in, const CostChunk& chunk, int64_t layers, int64_t held,
                       StageTally& s) {
  const ArenaSizes& z = in.arena_sizes;
  const Recompute recompute = in.plan->recompute;
  s.activations =
      SatAdd(s.activations, SatMul(held, SatMul(layers, ArenaMoeLayerStash(z, recompute))));
  s.moe_workspace =
      std::max(s.moe_workspace, ArenaMoeLayerPeak(z, recompute, ArenaMoeBucketsOf(in, chunk)));
  if (chunk.loss) s.workspace = std::max(s.workspace, ArenaLossPeak(z));
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
  s.dense_count += nd;
  s.moe_count += nm;
  int64_t stored_dense = 0, stored_moe = 0, work_d = 0, work_m = 0;
  FullRecomputeChunk(plan, nd, in.la_dense, &stored_dense, &work_d);
  FullRecomputeChunk(plan, nm, in.la_moe, &stored_moe, &work_m);
  const int64_t chunk_act = SatAdd(stored_dense, stored_moe);
  if (in.arena) {
    const ArenaSizes& z = in.arena_sizes;
    s.activations =
        SatAdd(s.activations, SatMul(held, SatMul(nd, ArenaLayerStash(z, plan.recompute))));
    s.extra = SatAdd(s.extra, SatMul(held, ArenaChunkExtra(z, chunk.embedding, chunk.loss)));
    if (nd > 0 || nm == 0)
      s.workspace = std::max(s.workspace, ArenaBodyPeak(z, plan.recompute, chunk.loss));
    if (nm > 0) AddArenaMoeLayers(in, chunk, nm, held, s);
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
// kind), a 2h -> h projection and two norms, and its own logits.
void AddMtpModules(const MemoryInputs& in, int64_t held, StageTally& s) {
  const ModelSpec& m = in.plan->model;
  const bool moe_last = IsMoeLayer(m, m.layers - 1);
  const LayerParams& lp = moe_last ? in.moe_params : in.dense_params;
  const LayerActivations& la = moe_last ? in.la_moe : in.la_dense;
  s.dense_p = SatAdd(
      s.dense_p,
      SatMul(m.mtp_layers, CeilDiv(SatAdd(lp.tp_sharded, SatMul(2 * m.hidden, m.hidden)), in.t)));
  s.repl_p = SatAdd(s.repl_p, SatMul(m.mtp_layers, SatAdd(lp.replicated, 2 * m.hidden)));
  s.expert_p = SatAdd(s.expert_p, SatMul(m.mtp_layers, CeilDiv(lp.expert, in.ep_etp)));
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
  if (m.mtp_layers > 0 && !in.arena) AddMtpModules(in, held, s);
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

// planrun's arena under ZeRO >= 2 on dp · cp > 1 (the ZeRO group): a layer's (or the
// embedding's) full grad bucket, fp32, and with ZeRO-3 its gathered weights live inside the body
// that uses them.
int64_t ArenaShardBuckets(const MemoryInputs& in, const StageMemory& s) {
  const Plan& plan = *in.plan;
  if (!in.arena || plan.optimizer.zero < 2 || plan.parallel.dp * plan.parallel.cp <= 1) return 0;
  int64_t bucket = CeilDiv(in.dense_params.tp_sharded, in.t) + in.dense_params.replicated;
  if (s.embedding || s.loss)
    bucket = std::max(bucket, SatMul(in.arena_sizes.vocab, plan.model.hidden));
  const int64_t per = 4 + (plan.optimizer.zero >= 3 ? in.arena_sizes.a : 0);
  return SatMul(bucket, per);
}

// ZeRO-3 weights gathered outside the arena: kept from the forward to the backward, or two
// layers' worth while gathering layer by layer.
int64_t GatheredWeightBytes(const MemoryInputs& in, const StageTally& tally) {
  const Plan& plan = *in.plan;
  if (plan.optimizer.zero < 3 || in.arena) return 0;
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
  const LayerParams& dense = in.dense_params;
  const LayerParams& moe = in.moe_params;
  const int64_t layer = std::max(
      tally.dense_count > 0 ? dense.tp_sharded / in.t + dense.replicated : 0,
      tally.moe_count > 0 ? moe.tp_sharded / in.t + moe.replicated + moe.expert / in.ep_etp : 0);
  return SatMul(4, layer);
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

// The memory of pipeline rank r, part by part.
void PriceStage(const MemoryInputs& in, const std::vector<CostChunk>& chunks, int64_t r,
                StageMemory& s) {
  s.stage = r;
  const std::vector<int64_t> counts = InFlightPerChunk(in, r);
  StageTally tally;
  for (int64_t c = 0; c < in.v; ++c) {
    const CostChunk& chunk = chunks[static_cast<size_t>(c * in.p + r)];
    const int64_t held = counts[static_cast<size_t>(c)];
    AddChunkLayers(in, chunk, held, tally);
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
  b[size_t(MemoryPart::kRecomputeWorkspace)] =
      std::max(SatAdd(tally.workspace, ArenaShardBuckets(in, s)), tally.moe_workspace);
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
