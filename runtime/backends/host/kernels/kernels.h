// Host reference kernels (fp32): the forward and backward of every op a Llama- or GPT-2-style
// decoder needs, plus the optimizer. They are the ground truth the CUDA kernels are compared to,
// and what the host backend runs.
//
// Conventions:
//  - Row-major. An activation is `rows × cols`; rows are tokens in the program's layout. Kernels
//    that need a token's (sequence, batch) position take a TokenLayout that maps them to rows,
//    so sequence-major ([S, B, C], Megatron) and batch-major ([B, S, C]) both work.
//  - Linear weights are [out, in] (PyTorch): y = x · Wᵀ.
//  - Gradients of parameters are ACCUMULATED (+=) so microbatches add up; gradients of
//    activations are WRITTEN (=) unless the argument says otherwise.
//  - Every kernel is deterministic: the same inputs give the same bits, whatever the caller's
//    threads do. Outside Gemm, results per row/element never depend on how many rows a call
//    covers, so a sharded run computes each element exactly as the one-rank run does where the
//    math is the same; GEMMs of different shapes may differ in the last bits (see Gemm).
//  - Vectorised kernels on 8 lanes never fuse multiplies and adds, so they give the same bits on
//    every x86-64 CPU (AVX2 or baseline clone); attention's 16-lane paths on AVX-512 CPUs fuse
//    them, and Gemm on OpenBLAS uses the CPU's own kernel (FMA where present), so results differ
//    across CPU kinds in the last bits, never from run to run on one machine.
//
// Source files, named the same in runtime/backends/host/kernels and runtime/backends/cuda/kernels:
// elementwise (elementwise ops, embeddings, activations), norm (RMSNorm, LayerNorm), attention
// (rotary embedding and causal attention), ring_attention (the chunk-pair pieces of context
// parallelism), gemm (GEMMs and linear layers), loss_optim (cross-entropy and optimizers), moe
// (mixture-of-experts router, token permutation and grouped GEMMs; the CUDA backend runs the
// grouped GEMMs on its GEMM engine).
//
// Made by: this folder. Read by: the host backend (runtime/backends/host/host_backend.h), kernel
// tests, the CUDA kernels' tests (as the reference).
#ifndef PARAPLAN_RUNTIME_BACKENDS_HOST_KERNELS_KERNELS_H_
#define PARAPLAN_RUNTIME_BACKENDS_HOST_KERNELS_KERNELS_H_

#include <cstdint>

namespace paraplan::host {

// Maps (sequence position s, batch index b) to a row: row = s * seq_stride + b * batch_stride.
struct TokenLayout {
  int64_t seq = 1;           // local sequence length covered by the buffer
  int64_t batch = 1;         // sequences in the buffer
  int64_t seq_stride = 1;    // rows between consecutive positions
  int64_t batch_stride = 1;  // rows between consecutive sequences
  int64_t seq_offset = 0;    // global position of local position 0 (sequence parallel shards)
  int64_t Row(int64_t s, int64_t b) const { return s * seq_stride + b * batch_stride; }
  static TokenLayout SeqMajor(int64_t seq, int64_t batch) { return {seq, batch, batch, 1, 0}; }
  static TokenLayout BatchMajor(int64_t seq, int64_t batch) { return {seq, batch, 1, seq, 0}; }
};

// ---- Vector width ------------------------------------------------------------------------
namespace simd {
// 16 where the CPU has AVX-512 (F, VL, BW, DQ), else 8: the width of the kernels' 16-lane paths
// (attention's tiles and exponentials, with fused multiply-adds: they agree with the 8-lane paths
// to rounding, not bit for bit). SetVectorWidth(8) turns the 16-lane paths off (the tests compare
// the two), SetVectorWidth(16) back on where the CPU has AVX-512.
int VectorWidth();
void SetVectorWidth(int lanes);
}  // namespace simd

// ---- Elementwise -------------------------------------------------------------------------
void Fill(float* x, int64_t n, float value);
void Copy(float* dst, const float* src, int64_t n);
void Add(float* out, const float* a, const float* b, int64_t n);  // out = a + b
void Accumulate(float* y, const float* x, int64_t n);             // y += x
void Scale(float* x, int64_t n, float alpha);                     // x *= alpha

// ---- GEMM --------------------------------------------------------------------------------
// C[M,N] = op(A) · op(B) + beta · C, op(A) is M×K (A stored K×M when trans_a), op(B) is K×N
// (B stored N×K when trans_b). beta is 0 (C overwritten, NaNs in C ignored) or 1 (accumulate).
// Runs on OpenBLAS, single-threaded in the caller's thread, when the build found it and it loads
// (see GemmLibrary). Deterministic for given shapes; a GEMM split into shards may differ from the
// whole one in the last bits (the BLAS's blocking depends on the shape).
void Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const float* a,
          const float* b, float beta, float* c);

// What Gemm runs on: "OpenBLAS 0.3.21, SkylakeX kernel", or "built-in (why)".
const char* GemmLibrary();

// y[rows,out] = x[rows,in] · w[out,in]ᵀ (+ bias[out] when bias is not null).
void LinearForward(float* y, const float* x, const float* w, const float* bias, int64_t rows,
                   int64_t in, int64_t out);
// dx = dy · w (written, or added when accumulate_dx), dw += dyᵀ · x, dbias += Σ_rows dy.
// dx, dw, dbias may be null to skip them.
void LinearBackward(float* dx, float* dw, float* dbias, const float* dy, const float* x,
                    const float* w, int64_t rows, int64_t in, int64_t out, bool accumulate_dx);

// ---- Embedding (vocab-parallel) ----------------------------------------------------------
// out[r] = table[tokens[r] - vocab_begin] when the token is in [vocab_begin, vocab_begin +
// vocab_count), else zeros (the TP all-reduce then sums the owners' rows).
void EmbeddingForward(float* out, const int32_t* tokens, const float* table, int64_t rows,
                      int64_t dim, int64_t vocab_begin, int64_t vocab_count);
void EmbeddingBackward(float* dtable, const float* dout, const int32_t* tokens, int64_t rows,
                       int64_t dim, int64_t vocab_begin, int64_t vocab_count);

// Learned positions over `rows` consecutive rows of a batch-major buffer whose first row is
// global row t0: y[r] = x[r] + P[(t0 + r) mod seq] (y may be x); backward accumulates
// dP[(t0 + r) mod seq] += dy[r] in increasing r.
void AddPosition(float* y, const float* x, const float* pos, int64_t rows, int64_t dim, int64_t t0,
                 int64_t seq);
void AddPositionBackward(float* dpos, const float* dy, int64_t rows, int64_t dim, int64_t t0,
                         int64_t seq);

// ---- Normalisation -----------------------------------------------------------------------
// RMSNorm: out = x / rms(x) * w; rstd[rows] saved for backward.
void RmsNormForward(float* out, float* rstd, const float* x, const float* w, int64_t rows,
                    int64_t dim, float eps);
void RmsNormBackward(float* dx, float* dw, const float* dout, const float* x, const float* w,
                     const float* rstd, int64_t rows, int64_t dim);
// LayerNorm: out = (x - mean) * rstd * w + b; mean, rstd saved.
void LayerNormForward(float* out, float* mean, float* rstd, const float* x, const float* w,
                      const float* b, int64_t rows, int64_t dim, float eps);
void LayerNormBackward(float* dx, float* dw, float* db, const float* dout, const float* x,
                       const float* w, const float* mean, const float* rstd, int64_t rows,
                       int64_t dim);

// ---- Rotary position embedding (half-split pairs (i, i + d/2), as Llama) -----------------
// x holds rows × heads × head_dim; rotated in place by the angle of the token's global
// position. Backward rotates the gradient back (in place).
void RopeForward(float* x, const TokenLayout& layout, int64_t heads, int64_t head_dim, float theta);
void RopeBackward(float* dx, const TokenLayout& layout, int64_t heads, int64_t head_dim,
                  float theta);

// ---- Causal attention with grouped-query heads -------------------------------------------
// q: rows × q_heads × d; k, v: rows × kv_heads × d (q_heads a multiple of kv_heads; query head h
// reads kv head h / (q_heads / kv_heads)). out: rows × q_heads × d. lse: batch × q_heads × seq,
// the log-sum-exp of each query's scaled scores (saved for backward); scores are scaled by
// `scale` (usually 1/sqrt(d)).
// Under a sliding window (window > 0) a query at position i sees the keys at positions
// i - window + 1 .. i (window keys, itself included; Hugging Face's `sliding_window`,
// Megatron-Core's `--window-size (window - 1, 0)`); window 0 = every earlier key.
// The layout must cover whole sequences (seq_offset 0).
void AttentionForward(float* out, float* lse, const float* q, const float* k, const float* v,
                      const TokenLayout& layout, int64_t q_heads, int64_t kv_heads,
                      int64_t head_dim, float scale, int64_t window = 0);
// dq, dk, dv are written.
void AttentionBackward(float* dq, float* dk, float* dv, const float* dout, const float* out,
                       const float* lse, const float* q, const float* k, const float* v,
                       const TokenLayout& layout, int64_t q_heads, int64_t kv_heads,
                       int64_t head_dim, float scale, int64_t window = 0);

// ---- Strided column copy (multi-head latent attention) -----------------------------------
// x holds rows × x_cols, y rows × y_cols. For every row r, group g < groups (in increasing g) and
// column j < width: y[r][g·y_stride + y_offset + j] = x[r][g·x_stride + x_offset + j], or += with
// `accumulate`. x_stride = 0 broadcasts one group of x; y_stride = 0 with accumulate sums the
// groups of x into one. Columns of y outside the groups are left as they are. The backward of a
// copy is the copy with x and y swapped, accumulating into a zeroed gradient.
struct ColumnMap {
  int64_t groups = 1, width = 0;
  int64_t x_cols = 0, x_stride = 0, x_offset = 0;
  int64_t y_cols = 0, y_stride = 0, y_offset = 0;
  // The same copy read backward: from y's columns into x's.
  ColumnMap Transposed() const {
    return {groups, width, y_cols, y_stride, y_offset, x_cols, x_stride, x_offset};
  }
};
void CopyColumns(float* y, const float* x, int64_t rows, const ColumnMap& map, bool accumulate);

// ---- Ring attention pieces (context parallelism) ----------------------------------------
// A context-parallel rank holds some runs of consecutive positions of each sequence (chunks);
// attention is computed chunk pair by chunk pair as K/V chunks arrive around the ring. A chunk
// is a TokenLayout whose seq_offset is the global position of its local position 0; a query at
// global position i sees the keys at global positions <= i (and, under a sliding window, above
// i - window). Query and key layouts cover the same sequences (equal batch). Unlike
// AttentionForward, lse is indexed like the rows: lse[row · q_heads + h], so a chunk of a larger
// buffer is a pointer offset for both.
//
// out, lse of one query chunk against one K/V chunk (written): a query that sees no key of the
// chunk gets out 0 and lse -inf.
void AttentionBlockForward(float* out, float* lse, const float* q, const float* k, const float* v,
                           const TokenLayout& q_layout, const TokenLayout& kv_layout,
                           int64_t q_heads, int64_t kv_heads, int64_t head_dim, float scale,
                           int64_t window = 0);
// Folds a chunk's partial result into the running one, per query row and head:
// lse' = log(e^lse + e^block_lse), out' = out · e^{lse - lse'} + block_out · e^{block_lse - lse'};
// -inf on either side leaves the other as it is.
void AttentionMergeBlocks(float* out, float* lse, const float* block_out, const float* block_lse,
                          const TokenLayout& layout, int64_t q_heads, int64_t head_dim);
// The backward of one chunk pair, given the final (merged over every chunk) out and lse and the
// gradient dout: dq, dk, dv are ADDED to, so the pairs of a ring sum up.
void AttentionBlockBackward(float* dq, float* dk, float* dv, const float* dout, const float* out,
                            const float* lse, const float* q, const float* k, const float* v,
                            const TokenLayout& q_layout, const TokenLayout& kv_layout,
                            int64_t q_heads, int64_t kv_heads, int64_t head_dim, float scale,
                            int64_t window = 0);

// ---- Activations -------------------------------------------------------------------------
// SwiGLU: out = silu(gate) * up.
void SwiGluForward(float* out, const float* gate, const float* up, int64_t n);
void SwiGluBackward(float* dgate, float* dup, const float* dout, const float* gate, const float* up,
                    int64_t n);
// GELU, tanh approximation (GPT-2).
void GeluForward(float* out, const float* x, int64_t n);
void GeluBackward(float* dx, const float* dout, const float* x, int64_t n);
// Squared ReLU (Nemotron-4): out = max(x, 0)²; dx = dout · 2 max(x, 0).
void SquaredReluForward(float* out, const float* x, int64_t n);
void SquaredReluBackward(float* dx, const float* dout, const float* x, int64_t n);

// ---- Mixture of experts ------------------------------------------------------------------
// A MoE layer: router logits z = x · W_rᵀ (a Linear), MoeRouterForward (scores, top-k experts
// per token and their weights), MoePermute (tokens grouped by expert), GroupedLinearForward (one
// GEMM per expert over its rows), MoeUnpermute (the weighted combine back into token order).
// Expert-parallel runs exchange the permuted rows by all-to-all between MoePermute and the grouped
// GEMMs; the kernels themselves see only local buffers.

// How a router turns logits into scores and picks experts.
enum class RouterScore : int64_t { kSoftmax = 0, kSigmoid = 1 };
struct MoeRouterConfig {
  int64_t experts = 1;
  int64_t topk = 1;
  RouterScore score = RouterScore::kSoftmax;
  bool normalize = false;  // weights = selected scores / their sum (Mixtral, DeepSeek-V3)
  float aux_coeff = 0.0f;  // load-balancing loss coefficient (0: no auxiliary loss)
  // Tokens the counts of the auxiliary loss cover (the rows of every rank whose counts were
  // summed into `counts`); 0 means `rows`.
  int64_t aux_rows = 0;
  // Group-limited routing (DeepSeek-V2/V3, Megatron-Core's group_limited_topk): the experts form
  // `groups` equal groups (1: no grouping) and each row picks among the `group_topk` groups of
  // highest group score only. Needs groups dividing experts, 1 <= group_topk <= min(groups,
  // topk) and topk <= group_topk · experts / groups (the kept groups hold the top k).
  int64_t groups = 1;
  int64_t group_topk = 1;
  float scale = 1.0f;  // the top-k weights' factor, after renormalising (routed_scaling_factor)
};
// scores[rows, experts] = softmax or sigmoid of logits[rows, experts]. Each row picks the topk
// experts of largest score + bias[e] (bias may be null; the expert bias of auxiliary-loss-free
// balancing changes the choice, never the weights), ties going to the lower expert index, in
// decreasing order: indices[rows, topk] (I32). With config.groups > 1 the choice is limited to
// the config.group_topk groups (experts / groups consecutive experts each) of highest group
// score, the float sum of the group's topk / group_topk largest keys (score + bias) added in
// decreasing order, ties going to the lower group index. weights[rows, topk] are the picked
// scores (divided by their sum when config.normalize), times config.scale. counts[experts]
// (written) is how many rows picked each expert.
void MoeRouterForward(float* weights, int32_t* indices, float* scores, float* counts,
                      const float* logits, const float* bias, int64_t rows,
                      const MoeRouterConfig& config);
// The load-balancing loss (Switch Transformer, as Megatron's aux_loss): with T = aux_rows (or
// rows), loss_sum[0] += aux_coeff · E / (topk · T²) · Σ_e counts[e] · Σ_rows scores[r, e]. Summed
// over the ranks whose counts were all-reduced, it is the loss of all T tokens.
void MoeAuxLoss(float* loss_sum, const float* scores, const float* counts, int64_t rows,
                const MoeRouterConfig& config);
// dlogits[rows, experts] (written) from dweights[rows, topk] (the weights' config.scale
// included), plus aux_grad_scale times the gradient of MoeAuxLoss's term (counts held constant;
// aux_grad_scale 0 leaves it out).
void MoeRouterBackward(float* dlogits, const float* dweights, const int32_t* indices,
                       const float* scores, const float* counts, int64_t rows,
                       const MoeRouterConfig& config, float aux_grad_scale);

// Auxiliary-loss-free balancing (DeepSeek-V3): with load[experts] the tokens each expert took in
// the step and m their mean, bias[e] += rate · sign(m - load[e]) (an overloaded expert is picked
// less), then load is zeroed for the next step.
void MoeExpertBiasUpdate(float* bias, float* load, int64_t experts, float rate);

// Token dropping by capacity: of the (token, choice) pairs routed to each expert, the `capacity`
// of largest weight are kept (ties to the lower pair index r · topk + j): mask[p] = 1 and
// kept[p] = weights[p]; the others get mask 0 and weight 0. Backward: dweights = dkept · mask.
// With `position` the first `capacity` pairs in pair order are kept instead. The rows are
// `segments` equal contiguous runs (rows a multiple of it), each choosing on its own pairs with
// its own `capacity` per expert: the Etp group's gathered rows, one run per member.
void MoeCapacityForward(float* kept, float* mask, const float* weights, const int32_t* indices,
                        int64_t rows, int64_t experts, int64_t topk, int64_t capacity,
                        bool position, int64_t segments);
void MoeCapacityBackward(float* dweights, const float* dkept, const float* mask, int64_t n);

// Groups the rows · topk (token, choice) pairs by expert: out[rows · topk, dim] holds expert 0's
// tokens, then expert 1's, ..., each expert's in increasing token order. row_map[r · topk + j]
// (I32, written) is the row of out that holds token r's choice j; expert_counts[experts] (I32,
// written) the rows of each expert. Backward: MoeUnpermute with weights null.
void MoePermute(float* out, int32_t* row_map, int32_t* expert_counts, const float* x,
                const int32_t* indices, int64_t rows, int64_t dim, int64_t experts, int64_t topk);
// MoePermute of the kept pairs only (mask[r · topk + j] != 0: MoeCapacity's mask under a
// capacity factor): expert_counts count them, out holds them grouped by expert as MoePermute
// does, and a dropped pair's row_map is -1. out holds out_rows rows: a kept pair placed past them
// is not copied (the caller compares the counts' sum with out_rows); the rest is left as it is.
void MoePermuteKept(float* out, int32_t* row_map, int32_t* expert_counts, const float* x,
                    const int32_t* indices, const float* mask, int64_t rows, int64_t dim,
                    int64_t experts, int64_t topk, int64_t out_rows);
// y[r] = Σ_j weights[r, j] · x[row_map[r · topk + j]] (j increasing; weights null: weight 1),
// written; a pair with row_map -1 (dropped) adds nothing, a row whose pairs are all dropped is 0.
void MoeUnpermute(float* y, const float* x, const int32_t* row_map, const float* weights,
                  int64_t rows, int64_t dim, int64_t topk);
// Backward of MoeUnpermute: dx[row_map[r · topk + j]] = weights[r, j] · dy[r] (written; every
// row of dx some pair maps to), dweights[r, j] = dy[r] · x[row_map[r · topk + j]] (written; may
// be null); a dropped pair (row_map -1) gets dweights 0 and writes no row of dx.
void MoeUnpermuteBackward(float* dx, float* dweights, const float* dy, const float* x,
                          const int32_t* row_map, const float* weights, int64_t rows, int64_t dim,
                          int64_t topk);

// One linear layer per group over consecutive rows: group g owns counts[g] rows (I32) starting
// after the rows of groups 0..g-1, and y = x · w[g]ᵀ on them, w [groups, out, in]. Each group is
// one Gemm, as LinearForward; a group with no rows costs nothing.
void GroupedLinearForward(float* y, const float* x, const float* w, const int32_t* counts,
                          int64_t groups, int64_t in, int64_t out);
// dx written (added when accumulate_dx), dw[g] += dyᵀ · x over the group's rows; dx or dw may be
// null.
void GroupedLinearBackward(float* dx, float* dw, const float* dy, const float* x, const float* w,
                           const int32_t* counts, int64_t groups, int64_t in, int64_t out,
                           bool accumulate_dx);

// ---- Vocab-parallel cross-entropy, in phases (the caller all-reduces between them) -------
// Logits z are rows × vocab_local, columns are global vocabulary ids vocab_begin + j; columns
// with a global id >= vocab (padding) are excluded from the softmax. A row whose target is
// negative is ignored (multi-token prediction's last positions): it adds nothing to the loss and
// gets a zero gradient; the means stay over all rows (the caller's scale accounts for the rows
// it ignores, so that the mean does not depend on how the rows are split over ranks).
// 1. row_max[r] = max over all local columns. (then all-reduce MAX over the TP group)
void CrossEntropyRowMax(float* row_max, const float* logits, int64_t rows, int64_t vocab_local);
// 2. st[r] = (Σ_j exp(z[r,j] - row_max[r]), z[r, target - vocab_begin] when this slice owns the
//    target else 0), interleaved [rows, 2]; (0, 0) for an ignored row, which the sum over the
//    TP group keeps (a counted row's first entry is at least exp(0) = 1). (then all-reduce SUM
//    over the TP group)
void CrossEntropySumExp(float* st, const float* logits, const float* row_max,
                        const int32_t* targets, int64_t rows, int64_t vocab_local,
                        int64_t vocab_begin, int64_t vocab);
// 3. loss_sum[0] += scale · Σ_r (log st[r,0] + row_max[r] - st[r,1]) / rows over the rows with
//    st[r,0] != 0.
void CrossEntropyLoss(float* loss_sum, const float* row_max, const float* st, int64_t rows,
                      float scale);
// dz[r,j] = grad_scale / rows · (exp(z[r,j] - row_max[r]) / st[r,0] - [j + vocab_begin ==
// target]) (written); padding columns and ignored rows get 0.
void CrossEntropyBackward(float* dlogits, const float* logits, const float* row_max,
                          const float* st, const int32_t* targets, int64_t rows,
                          int64_t vocab_local, int64_t vocab_begin, int64_t vocab,
                          float grad_scale);

// ---- Optimizer ---------------------------------------------------------------------------
// Σ x², accumulated in double.
double SumOfSquares(const float* x, int64_t n);
struct AdamWConfig {
  float lr = 1e-3f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0.0f;
};
// One AdamW step (step counts from 1) with bias correction; grad is multiplied by grad_scale
// (the clipping factor) first. Decoupled weight decay: p -= lr * wd * p.
void AdamW(float* param, const float* grad, float* m, float* v, int64_t n,
           const AdamWConfig& config, int64_t step, float grad_scale);
// Plain SGD (with weight decay): p -= lr * (g * grad_scale + wd * p).
void Sgd(float* param, const float* grad, int64_t n, float lr, float weight_decay,
         float grad_scale);

// Learning rate of `step` (from 0): linear warmup lr·(step+1)/warmup for step < warmup, then
// cosine from lr to min_lr over the remaining steps: p = (step - warmup) / max(1, steps -
// warmup), lr = min_lr + ½(lr - min_lr)(1 + cos(π·min(p, 1))).
double WarmupCosineLr(int64_t step, int64_t warmup, int64_t total_steps, double max_lr,
                      double min_lr);

}  // namespace paraplan::host

#endif  // PARAPLAN_RUNTIME_BACKENDS_HOST_KERNELS_KERNELS_H_
