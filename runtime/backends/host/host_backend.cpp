#include "runtime/backends/host/host_backend.h"

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>
#include <unordered_map>

namespace paraplan::exec {
namespace {

class HostBackend final : public Backend {
 public:
  ~HostBackend() override {
    for (auto& [ptr, bytes] : sizes_) std::free(ptr);
  }
  const char* Name() const override { return "host"; }

  void* Allocate(int64_t bytes) override {
    if (bytes < 0 || bytes > (int64_t{1} << 40)) {
      throw std::runtime_error("cannot allocate " + std::to_string(bytes) +
                               " bytes of host memory");
    }
    const size_t rounded = static_cast<size_t>((bytes + 63) / 64 * 64);
    void* p = std::aligned_alloc(64, rounded == 0 ? 64 : rounded);
    if (!p)
      throw std::runtime_error("out of host memory allocating " + std::to_string(bytes) + " bytes");
    std::memset(p, 0, rounded == 0 ? 64 : rounded);
    sizes_[p] = bytes;
    in_use_ += bytes;
    if (in_use_ > peak_) peak_ = in_use_;
    return p;
  }
  void Free(void* ptr) override {
    auto it = sizes_.find(ptr);
    if (it == sizes_.end()) return;
    in_use_ -= it->second;
    sizes_.erase(it);
    std::free(ptr);
  }
  void CopyToDevice(void* dst, const void* src, int64_t bytes) override { Move(dst, src, bytes); }
  void CopyToHost(void* dst, const void* src, int64_t bytes) override { Move(dst, src, bytes); }
  void CopyOnDevice(void* dst, const void* src, int64_t bytes) override { Move(dst, src, bytes); }
  void Synchronize() override {}
  int64_t BytesInUse() const override { return in_use_; }
  int64_t PeakBytes() const override { return peak_; }

  void Fill(float* x, int64_t n, float value) override { host::Fill(x, n, value); }
  void Copy(float* dst, const float* src, int64_t n) override { host::Copy(dst, src, n); }
  void Add(float* out, const float* a, const float* b, int64_t n) override {
    host::Add(out, a, b, n);
  }
  void Accumulate(float* y, const float* x, int64_t n) override { host::Accumulate(y, x, n); }
  void Scale(float* x, int64_t n, float alpha) override { host::Scale(x, n, alpha); }
  void CopyColumns(float* y, const float* x, int64_t rows, const ColumnMap& map,
                   bool accumulate) override {
    host::CopyColumns(y, x, rows, map, accumulate);
  }
  void Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const float* a,
            const float* b, float beta, float* c) override {
    host::Gemm(trans_a, trans_b, m, n, k, a, b, beta, c);
  }
  void LinearForward(float* y, const float* x, const float* w, const float* bias, int64_t rows,
                     int64_t in, int64_t out) override {
    host::LinearForward(y, x, w, bias, rows, in, out);
  }
  void LinearBackward(float* dx, float* dw, float* dbias, const float* dy, const float* x,
                      const float* w, int64_t rows, int64_t in, int64_t out,
                      bool accumulate_dx) override {
    host::LinearBackward(dx, dw, dbias, dy, x, w, rows, in, out, accumulate_dx);
  }
  void EmbeddingForward(float* out, const int32_t* tokens, const float* table, int64_t rows,
                        int64_t dim, int64_t vocab_begin, int64_t vocab_count) override {
    host::EmbeddingForward(out, tokens, table, rows, dim, vocab_begin, vocab_count);
  }
  void EmbeddingBackward(float* dtable, const float* dout, const int32_t* tokens, int64_t rows,
                         int64_t dim, int64_t vocab_begin, int64_t vocab_count) override {
    host::EmbeddingBackward(dtable, dout, tokens, rows, dim, vocab_begin, vocab_count);
  }
  void AddPosition(float* y, const float* x, const float* pos, int64_t rows, int64_t dim,
                   int64_t t0, int64_t seq) override {
    host::AddPosition(y, x, pos, rows, dim, t0, seq);
  }
  void AddPositionBackward(float* dpos, const float* dy, int64_t rows, int64_t dim, int64_t t0,
                           int64_t seq) override {
    host::AddPositionBackward(dpos, dy, rows, dim, t0, seq);
  }
  void RmsNormForward(float* out, float* rstd, const float* x, const float* w, int64_t rows,
                      int64_t dim, float eps) override {
    host::RmsNormForward(out, rstd, x, w, rows, dim, eps);
  }
  void RmsNormBackward(float* dx, float* dw, const float* dout, const float* x, const float* w,
                       const float* rstd, int64_t rows, int64_t dim) override {
    host::RmsNormBackward(dx, dw, dout, x, w, rstd, rows, dim);
  }
  void LayerNormForward(float* out, float* mean, float* rstd, const float* x, const float* w,
                        const float* b, int64_t rows, int64_t dim, float eps) override {
    host::LayerNormForward(out, mean, rstd, x, w, b, rows, dim, eps);
  }
  void LayerNormBackward(float* dx, float* dw, float* db, const float* dout, const float* x,
                         const float* w, const float* mean, const float* rstd, int64_t rows,
                         int64_t dim) override {
    host::LayerNormBackward(dx, dw, db, dout, x, w, mean, rstd, rows, dim);
  }
  void RopeForward(float* x, const TokenLayout& layout, int64_t heads, int64_t head_dim,
                   float theta) override {
    host::RopeForward(x, layout, heads, head_dim, theta);
  }
  void RopeBackward(float* dx, const TokenLayout& layout, int64_t heads, int64_t head_dim,
                    float theta) override {
    host::RopeBackward(dx, layout, heads, head_dim, theta);
  }
  void AttentionForward(float* out, float* lse, const float* q, const float* k, const float* v,
                        const TokenLayout& layout, int64_t q_heads, int64_t kv_heads,
                        int64_t head_dim, float scale, int64_t window) override {
    host::AttentionForward(out, lse, q, k, v, layout, q_heads, kv_heads, head_dim, scale, window);
  }
  void AttentionBackward(float* dq, float* dk, float* dv, const float* dout, const float* out,
                         const float* lse, const float* q, const float* k, const float* v,
                         const TokenLayout& layout, int64_t q_heads, int64_t kv_heads,
                         int64_t head_dim, float scale, int64_t window) override {
    host::AttentionBackward(dq, dk, dv, dout, out, lse, q, k, v, layout, q_heads, kv_heads,
                            head_dim, scale, window);
  }
  void AttentionBlockForward(float* out, float* lse, const float* q, const float* k, const float* v,
                             const TokenLayout& q_layout, const TokenLayout& kv_layout,
                             int64_t q_heads, int64_t kv_heads, int64_t head_dim, float scale,
                             int64_t window) override {
    host::AttentionBlockForward(out, lse, q, k, v, q_layout, kv_layout, q_heads, kv_heads, head_dim,
                                scale, window);
  }
  void AttentionMergeBlocks(float* out, float* lse, const float* block_out, const float* block_lse,
                            const TokenLayout& layout, int64_t q_heads, int64_t head_dim) override {
    host::AttentionMergeBlocks(out, lse, block_out, block_lse, layout, q_heads, head_dim);
  }
  void AttentionBlockBackward(float* dq, float* dk, float* dv, const float* dout, const float* out,
                              const float* lse, const float* q, const float* k, const float* v,
                              const TokenLayout& q_layout, const TokenLayout& kv_layout,
                              int64_t q_heads, int64_t kv_heads, int64_t head_dim, float scale,
                              int64_t window) override {
    host::AttentionBlockBackward(dq, dk, dv, dout, out, lse, q, k, v, q_layout, kv_layout, q_heads,
                                 kv_heads, head_dim, scale, window);
  }
  void SwiGluForward(float* out, const float* gate, const float* up, int64_t n) override {
    host::SwiGluForward(out, gate, up, n);
  }
  void SwiGluBackward(float* dgate, float* dup, const float* dout, const float* gate,
                      const float* up, int64_t n) override {
    host::SwiGluBackward(dgate, dup, dout, gate, up, n);
  }
  void GeluForward(float* out, const float* x, int64_t n) override { host::GeluForward(out, x, n); }
  void SquaredReluForward(float* out, const float* x, int64_t n) override {
    host::SquaredReluForward(out, x, n);
  }
  void SquaredReluBackward(float* dx, const float* dout, const float* x, int64_t n) override {
    host::SquaredReluBackward(dx, dout, x, n);
  }
  void GeluBackward(float* dx, const float* dout, const float* x, int64_t n) override {
    host::GeluBackward(dx, dout, x, n);
  }
  // ---- Mixture of experts ----
  void MoeRouterForward(float* weights, int32_t* indices, float* scores, float* counts,
                        const float* logits, const float* bias, int64_t rows,
                        const MoeRouterConfig& config) override {
    host::MoeRouterForward(weights, indices, scores, counts, logits, bias, rows, config);
  }
  void MoeRouterBackward(float* dlogits, const float* dweights, const int32_t* indices,
                         const float* scores, const float* counts, int64_t rows,
                         const MoeRouterConfig& config, float aux_grad_scale) override {
    host::MoeRouterBackward(dlogits, dweights, indices, scores, counts, rows, config,
                            aux_grad_scale);
  }
  void MoeExpertBiasUpdate(float* bias, float* load, int64_t experts, float rate) override {
    host::MoeExpertBiasUpdate(bias, load, experts, rate);
  }
  void MoeCapacityForward(float* kept, float* mask, const float* weights, const int32_t* indices,
                          int64_t rows, int64_t experts, int64_t topk, int64_t capacity,
                          bool position, int64_t segments) override {
    host::MoeCapacityForward(kept, mask, weights, indices, rows, experts, topk, capacity, position,
                             segments);
  }
  void MoeCapacityBackward(float* dweights, const float* dkept, const float* mask,
                           int64_t n) override {
    host::MoeCapacityBackward(dweights, dkept, mask, n);
  }
  void MoePermute(float* out, int32_t* row_map, int32_t* expert_counts, const float* x,
                  const int32_t* indices, int64_t rows, int64_t dim, int64_t experts,
                  int64_t topk) override {
    host::MoePermute(out, row_map, expert_counts, x, indices, rows, dim, experts, topk);
  }
  void MoePermuteKept(float* out, int32_t* row_map, int32_t* expert_counts, const float* x,
                      const int32_t* indices, const float* mask, int64_t rows, int64_t dim,
                      int64_t experts, int64_t topk, int64_t out_rows) override {
    host::MoePermuteKept(out, row_map, expert_counts, x, indices, mask, rows, dim, experts, topk,
                         out_rows);
  }
  void MoeUnpermute(float* y, const float* x, const int32_t* row_map, const float* weights,
                    int64_t rows, int64_t dim, int64_t topk) override {
    host::MoeUnpermute(y, x, row_map, weights, rows, dim, topk);
  }
  void MoeUnpermuteBackward(float* dx, float* dweights, const float* dy, const float* x,
                            const int32_t* row_map, const float* weights, int64_t rows, int64_t dim,
                            int64_t topk) override {
    host::MoeUnpermuteBackward(dx, dweights, dy, x, row_map, weights, rows, dim, topk);
  }
  void GroupedLinearForward(float* y, const float* x, const float* w, const int32_t* counts,
                            int64_t groups, int64_t in, int64_t out) override {
    host::GroupedLinearForward(y, x, w, counts, groups, in, out);
  }
  void GroupedLinearBackward(float* dx, float* dw, const float* dy, const float* x, const float* w,
                             const int32_t* counts, int64_t groups, int64_t in, int64_t out,
                             bool accumulate_dx) override {
    host::GroupedLinearBackward(dx, dw, dy, x, w, counts, groups, in, out, accumulate_dx);
  }

  void CrossEntropyRowMax(float* row_max, const float* logits, int64_t rows,
                          int64_t vocab_local) override {
    host::CrossEntropyRowMax(row_max, logits, rows, vocab_local);
  }
  void CrossEntropySumExp(float* st, const float* logits, const float* row_max,
                          const int32_t* targets, int64_t rows, int64_t vocab_local,
                          int64_t vocab_begin, int64_t vocab) override {
    host::CrossEntropySumExp(st, logits, row_max, targets, rows, vocab_local, vocab_begin, vocab);
  }
  void CrossEntropyLoss(float* loss_sum, const float* row_max, const float* st, int64_t rows,
                        float scale) override {
    host::CrossEntropyLoss(loss_sum, row_max, st, rows, scale);
  }
  void CrossEntropyBackward(float* dlogits, const float* logits, const float* row_max,
                            const float* st, const int32_t* targets, int64_t rows,
                            int64_t vocab_local, int64_t vocab_begin, int64_t vocab,
                            float grad_scale) override {
    host::CrossEntropyBackward(dlogits, logits, row_max, st, targets, rows, vocab_local,
                               vocab_begin, vocab, grad_scale);
  }
  double SumOfSquares(const float* x, int64_t n) override { return host::SumOfSquares(x, n); }
  void AdamW(float* param, const float* grad, float* m, float* v, int64_t n,
             const AdamWConfig& config, int64_t step, float grad_scale) override {
    host::AdamW(param, grad, m, v, n, config, step, grad_scale);
  }
  void Sgd(float* param, const float* grad, int64_t n, float lr, float weight_decay,
           float grad_scale) override {
    host::Sgd(param, grad, n, lr, weight_decay, grad_scale);
  }

 private:
  static void Move(void* dst, const void* src, int64_t bytes) {
    if (bytes > 0 && dst != src) std::memmove(dst, src, static_cast<size_t>(bytes));
  }
  std::unordered_map<void*, int64_t> sizes_;
  int64_t in_use_ = 0;
  int64_t peak_ = 0;
};

}  // namespace

std::unique_ptr<Backend> MakeHostBackend() { return std::make_unique<HostBackend>(); }

}  // namespace paraplan::exec
