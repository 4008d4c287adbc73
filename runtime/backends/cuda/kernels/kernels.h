// CUDA kernels of the decoder ops: the same functions, arguments and semantics as the host
// reference kernels (runtime/backends/host/kernels/kernels.h, the specification), plus a stream.
//
// Numerics: tensors handed between kernels are fp32 in device memory (the backend interface
// is fp32); every reduction (norm statistics, softmax sums, losses, sums of squares, gradient
// accumulation) is fp32 and done in a fixed order, so each kernel is deterministic run to run.
// The tensor-core work runs in bf16 with fp32 accumulation: GEMMs (gemm.h) and attention
// round their operands to bf16, which is where the CUDA backend differs from the host within
// bf16 tolerance. Parameter gradients accumulate (+=), activation gradients are written, as on
// the host.
//
// All functions enqueue work on `stream` and return at once; pointers are device pointers;
// int64 sizes may exceed 2^31 elements.
//
// Source files, named the same in runtime/backends/host/kernels and runtime/backends/cuda/kernels:
// elementwise (elementwise ops, embeddings, activations), norm (RMSNorm, LayerNorm), attention
// (rotary embedding and causal attention), ring_attention (the chunk-pair pieces of context
// parallelism), gemm (the cuBLASLt GEMM engine, gemm.h), loss_optim (cross-entropy and
// optimizers), moe (mixture-of-experts router and permutation).
//
// Made by this folder; read by the CUDA backend, its communicators and the GPU tests.
#ifndef PARAPLAN_RUNTIME_BACKENDS_CUDA_KERNELS_KERNELS_H_
#define PARAPLAN_RUNTIME_BACKENDS_CUDA_KERNELS_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace paraplan::cuda {

// Same meaning as host::TokenLayout: row = s * seq_stride + b * batch_stride.
struct TokenLayout {
  int64_t seq = 1;
  int64_t batch = 1;
  int64_t seq_stride = 1;
  int64_t batch_stride = 1;
  int64_t seq_offset = 0;
};

struct AdamWConfig {
  float lr = 1e-3f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0.0f;
};

// ---- Elementwise ----
void Fill(float* x, int64_t n, float value, cudaStream_t stream);
void Copy(float* dst, const float* src, int64_t n, cudaStream_t stream);
void Add(float* out, const float* a, const float* b, int64_t n, cudaStream_t stream);
void Accumulate(float* y, const float* x, int64_t n, cudaStream_t stream);
void Scale(float* x, int64_t n, float alpha, cudaStream_t stream);
// Same meaning as host::ColumnMap (strided column copy, multi-head latent attention).
struct ColumnMap {
  int64_t groups = 1, width = 0;
  int64_t x_cols = 0, x_stride = 0, x_offset = 0;
  int64_t y_cols = 0, y_stride = 0, y_offset = 0;
};
// y[r][g·y_stride + y_offset + j] (+)= x[r][g·x_stride + x_offset + j], groups in increasing g
// (one thread per (r, j), so groups that land on the same column of y add in the host's order).
void CopyColumns(float* y, const float* x, int64_t rows, const ColumnMap& map, bool accumulate,
                 cudaStream_t stream);
// fp32 -> bf16 (round to nearest even), for GEMM operands and bf16 weight copies.
void CastToBf16(void* dst_bf16, const float* src, int64_t n, cudaStream_t stream);
// y[rows, cols] += bias[cols] (row broadcast).
void AddBias(float* y, const float* bias, int64_t rows, int64_t cols, cudaStream_t stream);
// dbias[cols] += Σ_rows dy[rows, cols], summed over rows in increasing order.
void BiasBackward(float* dbias, const float* dy, int64_t rows, int64_t cols, cudaStream_t stream);

// ---- Embeddings ----
void EmbeddingForward(float* out, const int32_t* tokens, const float* table, int64_t rows,
                      int64_t dim, int64_t vocab_begin, int64_t vocab_count, cudaStream_t stream);
// Deterministic without atomics: each distinct token's rows are added in increasing row order
// (the host's order), by the block that owns the token's first row.
void EmbeddingBackward(float* dtable, const float* dout, const int32_t* tokens, int64_t rows,
                       int64_t dim, int64_t vocab_begin, int64_t vocab_count, cudaStream_t stream);
// Learned positions over `rows` consecutive batch-major rows starting at global row t0:
// y[r] = x[r] + pos[(t0 + r) mod seq]; backward adds dy rows into dpos in increasing r.
void AddPosition(float* y, const float* x, const float* pos, int64_t rows, int64_t dim, int64_t t0,
                 int64_t seq, cudaStream_t stream);
void AddPositionBackward(float* dpos, const float* dy, int64_t rows, int64_t dim, int64_t t0,
                         int64_t seq, cudaStream_t stream);

// ---- Norms (one warp per row; dw/db summed per block, then across blocks in block order) ----
void RmsNormForward(float* out, float* rstd, const float* x, const float* w, int64_t rows,
                    int64_t dim, float eps, cudaStream_t stream);
void RmsNormBackward(float* dx, float* dw, const float* dout, const float* x, const float* w,
                     const float* rstd, int64_t rows, int64_t dim, cudaStream_t stream);
void LayerNormForward(float* out, float* mean, float* rstd, const float* x, const float* w,
                      const float* b, int64_t rows, int64_t dim, float eps, cudaStream_t stream);
void LayerNormBackward(float* dx, float* dw, float* db, const float* dout, const float* x,
                       const float* w, const float* mean, const float* rstd, int64_t rows,
                       int64_t dim, cudaStream_t stream);

// ---- Rotary embedding (half-split pairs, angles in double as on the host) ----
void RopeForward(float* x, const TokenLayout& layout, int64_t heads, int64_t head_dim, float theta,
                 cudaStream_t stream);
void RopeBackward(float* dx, const TokenLayout& layout, int64_t heads, int64_t head_dim,
                  float theta, cudaStream_t stream);

// ---- Causal grouped-query attention, flash style (attention.cu) ----
// Tiled with online softmax; the seq × seq matrix never exists. Q·Kᵀ and P·V run on bf16
// tensor cores (WMMA) with fp32 accumulation; softmax statistics and lse are fp32. head_dim
// must be 16, 32, 64, 128 or 192 (checked; other sizes throw). Backward is two deterministic
// kernels (dK/dV per key tile over the query heads of its group, dQ per query tile), no atomics.
// `window` > 0: a sliding window of that many keys (the host kernels' mask; tiles wholly outside
// a warp's window are skipped), 0 = every earlier key.
void AttentionForward(float* out, float* lse, const float* q, const float* k, const float* v,
                      const TokenLayout& layout, int64_t q_heads, int64_t kv_heads,
                      int64_t head_dim, float scale, int64_t window, cudaStream_t stream);
// `scratch` holds batch * q_heads * seq floats (D = rowsum(dout ∘ out)).
void AttentionBackward(float* dq, float* dk, float* dv, const float* dout, const float* out,
                       const float* lse, const float* q, const float* k, const float* v,
                       const TokenLayout& layout, int64_t q_heads, int64_t kv_heads,
                       int64_t head_dim, float scale, int64_t window, float* scratch,
                       cudaStream_t stream);
bool AttentionHeadDimSupported(int64_t head_dim);

// ---- Ring attention pieces (ring_attention.cu) ----
// The host kernels' chunk-pair pieces (context parallelism), fp32, one warp per query row and
// head (dK/dV: per key row and KV head); head_dim up to 256 (checked).
void AttentionBlockForward(float* out, float* lse, const float* q, const float* k, const float* v,
                           const TokenLayout& q_layout, const TokenLayout& kv_layout,
                           int64_t q_heads, int64_t kv_heads, int64_t head_dim, float scale,
                           int64_t window, cudaStream_t stream);
void AttentionMergeBlocks(float* out, float* lse, const float* block_out, const float* block_lse,
                          const TokenLayout& layout, int64_t q_heads, int64_t head_dim,
                          cudaStream_t stream);
void AttentionBlockBackward(float* dq, float* dk, float* dv, const float* dout, const float* out,
                            const float* lse, const float* q, const float* k, const float* v,
                            const TokenLayout& q_layout, const TokenLayout& kv_layout,
                            int64_t q_heads, int64_t kv_heads, int64_t head_dim, float scale,
                            int64_t window, cudaStream_t stream);

// ---- Activations ----
void SwiGluForward(float* out, const float* gate, const float* up, int64_t n, cudaStream_t stream);
void SwiGluBackward(float* dgate, float* dup, const float* dout, const float* gate, const float* up,
                    int64_t n, cudaStream_t stream);
void GeluForward(float* out, const float* x, int64_t n, cudaStream_t stream);
void GeluBackward(float* dx, const float* dout, const float* x, int64_t n, cudaStream_t stream);
void SquaredReluForward(float* out, const float* x, int64_t n, cudaStream_t stream);
void SquaredReluBackward(float* dx, const float* dout, const float* x, int64_t n,
                         cudaStream_t stream);

// ---- Vocab-parallel cross-entropy, in the host's phases (one block per row) ----
// Columns with a global id >= vocab (padding) are left out of the softmax, as on the host.
void CrossEntropyRowMax(float* row_max, const float* logits, int64_t rows, int64_t vocab_local,
                        cudaStream_t stream);
// st[r] = (Σ exp(z - row_max), the target's logit or 0), interleaved [rows, 2].
void CrossEntropySumExp(float* st, const float* logits, const float* row_max,
                        const int32_t* targets, int64_t rows, int64_t vocab_local,
                        int64_t vocab_begin, int64_t vocab, cudaStream_t stream);
// loss_sum[0] += scale · Σ_r (log st[r,0] + row_max[r] − st[r,1]) / rows (one block, in order).
void CrossEntropyLoss(float* loss_sum, const float* row_max, const float* st, int64_t rows,
                      float scale, cudaStream_t stream);
void CrossEntropyBackward(float* dlogits, const float* logits, const float* row_max,
                          const float* st, const int32_t* targets, int64_t rows,
                          int64_t vocab_local, int64_t vocab_begin, int64_t vocab, float grad_scale,
                          cudaStream_t stream);

// ---- Optimizer ----
// out[0] = Σ x² accumulated in double: per-block partial sums in `partials` (at least
// kSumOfSquaresBlocks doubles; min(264, ceil(n / 256)) blocks), then one block adds them in order
// (llm.c's deterministic sum, in double as the host accumulates).
inline constexpr int kSumOfSquaresBlocks = 264;
void SumOfSquares(double* out, const float* x, int64_t n, double* partials, cudaStream_t stream);
// fp32 master weights, moments and gradient; when param_bf16 is not null the updated weight is
// also written there in bf16 (round to nearest even) for bf16 GEMM operands.
void AdamW(float* param, const float* grad, float* m, float* v, int64_t n,
           const AdamWConfig& config, int64_t step, float grad_scale, void* param_bf16,
           cudaStream_t stream);
void Sgd(float* param, const float* grad, int64_t n, float lr, float weight_decay, float grad_scale,
         cudaStream_t stream);
// Several tensors per launch (the optimizer step's and the gradient norm's launch count is the
// bucket's tensor count divided by kMultiTensorMax, not the tensor count).
inline constexpr int kMultiTensorMax = 32;
// out[t] = SumOfSquares(x[t], n[t]) bit for bit (each tensor keeps its own blocks, order and
// final sum) for count ≤ kMultiTensorMax tensors, in two launches; `partials` holds at least
// kMultiTensorMax · kSumOfSquaresBlocks doubles.
void SumOfSquaresEach(double* out, const float* const* x, const int64_t* n, int count,
                      double* partials, cudaStream_t stream);
// AdamW on count ≤ kMultiTensorMax tensors in one launch, each with its own weight decay
// (config.weight_decay is not read); element by element the same arithmetic as AdamW, and the
// updated weight is also stored to copy (when not null).
struct AdamWTensor {
  float* param;
  const float* grad;
  float *m, *v;
  int64_t n;
  float weight_decay;
  float* copy;
};
void AdamWEach(const AdamWTensor* tensors, int count, const AdamWConfig& config, int64_t step,
               float grad_scale, cudaStream_t stream);

// ---- Mixture of experts (moe.cu; host::MoeRouterConfig's fields, score 0 softmax, 1 sigmoid) ----
struct MoeRouterConfig {
  int64_t experts = 1;
  int64_t topk = 1;
  int64_t score = 0;
  bool normalize = false;
  float aux_coeff = 0.0f;
  int64_t aux_rows = 0;
  int64_t groups = 1;
  int64_t group_topk = 1;
  float scale = 1.0f;
};
// One thread per row, in the host's order (top-k ties to the lower index; with groups the
// host's group scores, recomputed instead of stored); counts by one thread per expert. Scores
// and weights agree with the host to fp32 rounding (expf).
void MoeRouterForward(float* weights, int32_t* indices, float* scores, float* counts,
                      const float* logits, const float* bias, int64_t rows,
                      const MoeRouterConfig& config, cudaStream_t stream);
void MoeRouterBackward(float* dlogits, const float* dweights, const int32_t* indices,
                       const float* scores, const float* counts, int64_t rows,
                       const MoeRouterConfig& config, float aux_grad_scale, cudaStream_t stream);
// The host's bias update (one thread: the mean in the host's order, then every expert).
void MoeExpertBiasUpdate(float* bias, float* load, int64_t experts, float rate,
                         cudaStream_t stream);
// The host's capacity choice exactly: one thread per pair counts the pairs of its expert that
// come before it (heavier, or as heavy and earlier) within its segment of rows / segments rows —
// O(pairs²), kept simple and exact.
void MoeCapacityForward(float* kept, float* mask, const float* weights, const int32_t* indices,
                        int64_t rows, int64_t experts, int64_t topk, int64_t capacity,
                        bool position, int64_t segments, cudaStream_t stream);
void MoeCapacityBackward(float* dweights, const float* dkept, const float* mask, int64_t n,
                         cudaStream_t stream);
// The host's permutation exactly (each expert's thread scans the pairs in order; no atomics).
void MoePermute(float* out, int32_t* row_map, int32_t* expert_counts, const float* x,
                const int32_t* indices, int64_t rows, int64_t dim, int64_t experts, int64_t topk,
                cudaStream_t stream);
// The host's MoePermuteKept exactly (the same scans, over the kept pairs).
void MoePermuteKept(float* out, int32_t* row_map, int32_t* expert_counts, const float* x,
                    const int32_t* indices, const float* mask, int64_t rows, int64_t dim,
                    int64_t experts, int64_t topk, int64_t out_rows, cudaStream_t stream);
// A pair with row_map -1 (dropped by MoePermuteKept) adds nothing, as on the host.
void MoeUnpermute(float* y, const float* x, const int32_t* row_map, const float* weights,
                  int64_t rows, int64_t dim, int64_t topk, cudaStream_t stream);
void MoeUnpermuteBackward(float* dx, float* dweights, const float* dy, const float* x,
                          const int32_t* row_map, const float* weights, int64_t rows, int64_t dim,
                          int64_t topk, cudaStream_t stream);

// ---- Collective helpers for the local (one GPU, several ranks) communicator ----
// out[i] = Σ_r in[r][i] in rank order 0..ranks-1 (fp32), for i in [begin, end); in and out
// are arrays of `ranks` device pointers (host memory, copied into the kernel's parameters).
inline constexpr int kMaxLocalRanks = 64;
void SumAcrossRanks(float* const* out, int out_count, const float* const* in, int ranks,
                    int64_t begin, int64_t end, cudaStream_t stream);
void MaxAcrossRanks(float* const* out, int out_count, const float* const* in, int ranks,
                    int64_t begin, int64_t end, cudaStream_t stream);

}  // namespace paraplan::cuda

#endif  // PARAPLAN_RUNTIME_BACKENDS_CUDA_KERNELS_KERNELS_H_
