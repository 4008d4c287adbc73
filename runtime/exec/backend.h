// Backend: the kernel-dispatch and memory interface the interpreter calls, so that the same
// interpreter runs on the host (fp32 reference kernels, ranks as threads) and on CUDA.
//
// One Backend object serves one rank (one thread on the host, one device on CUDA). Pointers
// passed to kernels are "device" pointers from Allocate (host memory for the host backend).
// Every kernel has exactly the semantics of the host kernel of the same name in
// runtime/backends/host/kernels/kernels.h (shapes, layouts, accumulate-vs-write rules); that file
// is the specification, and a CUDA kernel is correct when it matches the host kernel within the
// stated tolerance. Kernels may be asynchronous; Synchronize() waits for all of them; copies to the
// host are synchronous. Scalars that feed host decisions (loss sums, squared norms) come back
// through ReadScalars.
//
// Communicators are made by the backend too (MakeWorld), because the kind of communicator
// follows the memory the buffers live in.
//
// Made by: MakeHostBackend (host_backend.h) or the CUDA backend. Read by: the interpreter.
#ifndef PARAPLAN_RUNTIME_EXEC_BACKEND_H_
#define PARAPLAN_RUNTIME_EXEC_BACKEND_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/backends/host/kernels/kernels.h"
#include "runtime/comm/communicator.h"

namespace paraplan::exec {

using host::AdamWConfig;
using host::ColumnMap;
using host::MoeRouterConfig;
using host::TokenLayout;

// A tensor of n fp32 elements (a backend pointer), read only.
struct ConstTensor {
  const float* data = nullptr;
  int64_t n = 0;
};

// One tensor of Backend::AdamWEach: master weights, gradient, moments, its weight decay, and
// where the updated weights go as well (nullptr: nowhere).
struct AdamWTensor {
  float* param = nullptr;
  const float* grad = nullptr;
  float* m = nullptr;
  float* v = nullptr;
  int64_t n = 0;
  float weight_decay = 0.0f;
  float* copy = nullptr;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* Name() const = 0;

  // ---- Memory ----
  virtual void* Allocate(int64_t bytes) = 0;  // 64-byte aligned, zero-filled; throws on failure
  virtual void Free(void* ptr) = 0;
  virtual void CopyToDevice(void* dst, const void* src, int64_t bytes) = 0;
  virtual void CopyToHost(void* dst, const void* src, int64_t bytes) = 0;
  virtual void CopyOnDevice(void* dst, const void* src, int64_t bytes) = 0;
  virtual void Synchronize() = 0;
  // Bytes the backend currently holds and the most it ever held.
  virtual int64_t BytesInUse() const = 0;
  virtual int64_t PeakBytes() const = 0;

  // ---- Elementwise ----
  virtual void Fill(float* x, int64_t n, float value) = 0;
  virtual void Copy(float* dst, const float* src, int64_t n) = 0;
  virtual void Add(float* out, const float* a, const float* b, int64_t n) = 0;
  virtual void Accumulate(float* y, const float* x, int64_t n) = 0;
  virtual void Scale(float* x, int64_t n, float alpha) = 0;
  // Strided column copy of rows × x_cols into rows × y_cols (host::CopyColumns).
  virtual void CopyColumns(float* y, const float* x, int64_t rows, const ColumnMap& map,
                           bool accumulate) = 0;

  // ---- Dense ----
  virtual void Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const float* a,
                    const float* b, float beta, float* c) = 0;
  virtual void LinearForward(float* y, const float* x, const float* w, const float* bias,
                             int64_t rows, int64_t in, int64_t out) = 0;
  virtual void LinearBackward(float* dx, float* dw, float* dbias, const float* dy, const float* x,
                              const float* w, int64_t rows, int64_t in, int64_t out,
                              bool accumulate_dx) = 0;

  // ---- Embeddings ----
  virtual void EmbeddingForward(float* out, const int32_t* tokens, const float* table, int64_t rows,
                                int64_t dim, int64_t vocab_begin, int64_t vocab_count) = 0;
  virtual void EmbeddingBackward(float* dtable, const float* dout, const int32_t* tokens,
                                 int64_t rows, int64_t dim, int64_t vocab_begin,
                                 int64_t vocab_count) = 0;
  virtual void AddPosition(float* y, const float* x, const float* pos, int64_t rows, int64_t dim,
                           int64_t t0, int64_t seq) = 0;
  virtual void AddPositionBackward(float* dpos, const float* dy, int64_t rows, int64_t dim,
                                   int64_t t0, int64_t seq) = 0;

  // ---- Norms ----
  virtual void RmsNormForward(float* out, float* rstd, const float* x, const float* w, int64_t rows,
                              int64_t dim, float eps) = 0;
  virtual void RmsNormBackward(float* dx, float* dw, const float* dout, const float* x,
                               const float* w, const float* rstd, int64_t rows, int64_t dim) = 0;
  virtual void LayerNormForward(float* out, float* mean, float* rstd, const float* x,
                                const float* w, const float* b, int64_t rows, int64_t dim,
                                float eps) = 0;
  virtual void LayerNormBackward(float* dx, float* dw, float* db, const float* dout, const float* x,
                                 const float* w, const float* mean, const float* rstd, int64_t rows,
                                 int64_t dim) = 0;

  // ---- Attention ----
  virtual void RopeForward(float* x, const TokenLayout& layout, int64_t heads, int64_t head_dim,
                           float theta) = 0;
  virtual void RopeBackward(float* dx, const TokenLayout& layout, int64_t heads, int64_t head_dim,
                            float theta) = 0;
  // `window`: the sliding window in keys (0 = every earlier key; host kernels.h says the mask).
  virtual void AttentionForward(float* out, float* lse, const float* q, const float* k,
                                const float* v, const TokenLayout& layout, int64_t q_heads,
                                int64_t kv_heads, int64_t head_dim, float scale,
                                int64_t window) = 0;
  virtual void AttentionBackward(float* dq, float* dk, float* dv, const float* dout,
                                 const float* out, const float* lse, const float* q, const float* k,
                                 const float* v, const TokenLayout& layout, int64_t q_heads,
                                 int64_t kv_heads, int64_t head_dim, float scale,
                                 int64_t window) = 0;

  // ---- Ring attention pieces (context parallelism; host kernels' kernels.h says the layouts) ----
  virtual void AttentionBlockForward(float* out, float* lse, const float* q, const float* k,
                                     const float* v, const TokenLayout& q_layout,
                                     const TokenLayout& kv_layout, int64_t q_heads,
                                     int64_t kv_heads, int64_t head_dim, float scale,
                                     int64_t window) = 0;
  virtual void AttentionMergeBlocks(float* out, float* lse, const float* block_out,
                                    const float* block_lse, const TokenLayout& layout,
                                    int64_t q_heads, int64_t head_dim) = 0;
  virtual void AttentionBlockBackward(float* dq, float* dk, float* dv, const float* dout,
                                      const float* out, const float* lse, const float* q,
                                      const float* k, const float* v, const TokenLayout& q_layout,
                                      const TokenLayout& kv_layout, int64_t q_heads,
                                      int64_t kv_heads, int64_t head_dim, float scale,
                                      int64_t window) = 0;

  // ---- Activations ----
  virtual void SwiGluForward(float* out, const float* gate, const float* up, int64_t n) = 0;
  virtual void SwiGluBackward(float* dgate, float* dup, const float* dout, const float* gate,
                              const float* up, int64_t n) = 0;
  virtual void GeluForward(float* out, const float* x, int64_t n) = 0;
  virtual void GeluBackward(float* dx, const float* dout, const float* x, int64_t n) = 0;
  virtual void SquaredReluForward(float* out, const float* x, int64_t n) = 0;
  virtual void SquaredReluBackward(float* dx, const float* dout, const float* x, int64_t n) = 0;

  // ---- Mixture of experts (see kernels.h) ----
  virtual void MoeRouterForward(float* weights, int32_t* indices, float* scores, float* counts,
                                const float* logits, const float* bias, int64_t rows,
                                const MoeRouterConfig& config) = 0;
  virtual void MoeRouterBackward(float* dlogits, const float* dweights, const int32_t* indices,
                                 const float* scores, const float* counts, int64_t rows,
                                 const MoeRouterConfig& config, float aux_grad_scale) = 0;
  virtual void MoeExpertBiasUpdate(float* bias, float* load, int64_t experts, float rate) = 0;
  virtual void MoeCapacityForward(float* kept, float* mask, const float* weights,
                                  const int32_t* indices, int64_t rows, int64_t experts,
                                  int64_t topk, int64_t capacity, bool position,
                                  int64_t segments) = 0;
  virtual void MoeCapacityBackward(float* dweights, const float* dkept, const float* mask,
                                   int64_t n) = 0;
  virtual void MoePermute(float* out, int32_t* row_map, int32_t* expert_counts, const float* x,
                          const int32_t* indices, int64_t rows, int64_t dim, int64_t experts,
                          int64_t topk) = 0;
  // MoePermute of the pairs the mask keeps (a capacity factor); out holds out_rows rows.
  virtual void MoePermuteKept(float* out, int32_t* row_map, int32_t* expert_counts, const float* x,
                              const int32_t* indices, const float* mask, int64_t rows, int64_t dim,
                              int64_t experts, int64_t topk, int64_t out_rows) = 0;
  virtual void MoeUnpermute(float* y, const float* x, const int32_t* row_map, const float* weights,
                            int64_t rows, int64_t dim, int64_t topk) = 0;
  virtual void MoeUnpermuteBackward(float* dx, float* dweights, const float* dy, const float* x,
                                    const int32_t* row_map, const float* weights, int64_t rows,
                                    int64_t dim, int64_t topk) = 0;
  // counts is a device buffer; a backend may read it back to the host (a synchronisation).
  virtual void GroupedLinearForward(float* y, const float* x, const float* w, const int32_t* counts,
                                    int64_t groups, int64_t in, int64_t out) = 0;
  virtual void GroupedLinearBackward(float* dx, float* dw, const float* dy, const float* x,
                                     const float* w, const int32_t* counts, int64_t groups,
                                     int64_t in, int64_t out, bool accumulate_dx) = 0;

  // ---- Cross-entropy (vocab-parallel phases; see kernels.h) ----
  virtual void CrossEntropyRowMax(float* row_max, const float* logits, int64_t rows,
                                  int64_t vocab_local) = 0;
  virtual void CrossEntropySumExp(float* st, const float* logits, const float* row_max,
                                  const int32_t* targets, int64_t rows, int64_t vocab_local,
                                  int64_t vocab_begin, int64_t vocab) = 0;
  virtual void CrossEntropyLoss(float* loss_sum, const float* row_max, const float* st,
                                int64_t rows, float scale) = 0;
  virtual void CrossEntropyBackward(float* dlogits, const float* logits, const float* row_max,
                                    const float* st, const int32_t* targets, int64_t rows,
                                    int64_t vocab_local, int64_t vocab_begin, int64_t vocab,
                                    float grad_scale) = 0;

  // ---- Optimizer ----
  // Σ x² over n elements (double accumulation on the host), returned to the host.
  virtual double SumOfSquares(const float* x, int64_t n) = 0;
  // SumOfSquares of each tensor, bit for bit, returned together (one wait for the device
  // instead of one per tensor where the backend batches them).
  virtual std::vector<double> SumOfSquaresEach(const std::vector<ConstTensor>& tensors) {
    std::vector<double> out;
    out.reserve(tensors.size());
    for (const ConstTensor& t : tensors) out.push_back(SumOfSquares(t.data, t.n));
    return out;
  }
  virtual void AdamW(float* param, const float* grad, float* m, float* v, int64_t n,
                     const AdamWConfig& config, int64_t step, float grad_scale) = 0;
  // AdamW on each tensor (config with the tensor's weight decay), each updated weight also
  // copied to `copy` when that is set: the same bits as AdamW and Copy per tensor.
  virtual void AdamWEach(const std::vector<AdamWTensor>& tensors, const AdamWConfig& config,
                         int64_t step, float grad_scale) {
    for (const AdamWTensor& t : tensors) {
      AdamWConfig c = config;
      c.weight_decay = t.weight_decay;
      AdamW(t.param, t.grad, t.m, t.v, t.n, c, step, grad_scale);
      if (t.copy != nullptr) Copy(t.copy, t.param, t.n);
    }
  }
  virtual void Sgd(float* param, const float* grad, int64_t n, float lr, float weight_decay,
                   float grad_scale) = 0;
};

// A world of communicators for one process: the host backend's threads share one; a CUDA
// process holds its NCCL world. Join(members, world_rank, tag) gives `world_rank` its handle on
// the group of `members` (world ranks, order = group ranks); the interpreter passes the
// communicator's index in the program as `tag`, so equal member lists of different kinds stay
// separate communicators. Thread-safe.
class CommWorld {
 public:
  virtual ~CommWorld() = default;
  virtual int Size() const = 0;
  virtual std::unique_ptr<comm::Communicator> Join(const std::vector<int>& members, int world_rank,
                                                   int tag) = 0;
  virtual void Abort(const std::string& reason) = 0;
};

}  // namespace paraplan::exec

#endif  // PARAPLAN_RUNTIME_EXEC_BACKEND_H_
