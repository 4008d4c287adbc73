#include "runtime/backends/cuda/cuda_backend.h"

#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <vector>

#include "runtime/backends/cuda/comm/local_cuda_communicator.h"
#include "runtime/backends/cuda/comm/nccl_communicator.h"
#include "runtime/backends/cuda/kernels/cuda_check.h"
#include "runtime/backends/cuda/kernels/gemm.h"
#include "runtime/backends/cuda/kernels/kernels.h"

namespace paraplan::cuda {
namespace {

TokenLayout Convert(const host::TokenLayout& l) {
  return TokenLayout{l.seq, l.batch, l.seq_stride, l.batch_stride, l.seq_offset};
}

// PARAPLAN_CUDA_GEMM_CAST=1: every GEMM operand gets its own bf16 cast (the engine's older
// path, kept to time against the shared cast of dy in LinearBackward); unset or 0: shared.
bool CastEachGemmOperand() {
  const auto value = launch::ProcessEnvironment()("PARAPLAN_CUDA_GEMM_CAST");
  if (!value || value->empty()) return false;
  auto v = launch::ParseIntVariable("PARAPLAN_CUDA_GEMM_CAST", *value, 0, 1);
  if (!v) throw CudaError(v.error());
  return *v == 1;
}

AdamWConfig Convert(const host::AdamWConfig& c) {
  return AdamWConfig{c.lr, c.beta1, c.beta2, c.eps, c.weight_decay};
}

class CudaBackend final : public exec::Backend {
 public:
  explicit CudaBackend(int device) : device_(device) {
    PARAPLAN_CUDA_CHECK(cudaSetDevice(device_));
    PARAPLAN_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    gemm_ = std::make_unique<GemmEngine>(stream_, CastEachGemmOperand());
    // Keep freed stream-ordered scratch in the pool instead of returning it at every sync.
    cudaMemPool_t pool;
    if (cudaDeviceGetDefaultMemPool(&pool, device_) == cudaSuccess) {
      uint64_t threshold = UINT64_MAX;
      cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold);
    }
    // The partial sums of up to kMultiTensorMax tensors, then SumOfSquares's result.
    PARAPLAN_CUDA_CHECK(cudaMalloc(
        &sos_partials_, sizeof(double) * (int64_t{kMultiTensorMax} * kSumOfSquaresBlocks + 1)));
  }

  ~CudaBackend() override {
    cudaSetDevice(device_);
    cudaStreamSynchronize(stream_);
    gemm_.reset();
    cudaFree(sos_partials_);
    for (auto& [ptr, bytes] : sizes_) cudaFree(ptr);
    cudaStreamDestroy(stream_);
  }

  const char* Name() const override { return "cuda"; }
  cudaStream_t Stream() const { return stream_; }

  // ---- Memory ----
  void* Allocate(int64_t bytes) override {
    Use();
    void* p = nullptr;
    cudaError_t err = cudaMalloc(&p, static_cast<size_t>(std::max<int64_t>(bytes, 1)));
    if (err != cudaSuccess) {
      cudaGetLastError();
      throw CudaError(
          fmt::format("cannot allocate {} bytes on CUDA device {} ({} bytes in use): {}", bytes,
                      device_, in_use_, cudaGetErrorString(err)));
    }
    PARAPLAN_CUDA_CHECK(
        cudaMemsetAsync(p, 0, static_cast<size_t>(std::max<int64_t>(bytes, 1)), stream_));
    sizes_[p] = bytes;
    in_use_ += bytes;
    peak_ = std::max(peak_, in_use_);
    return p;
  }
  void Free(void* ptr) override {
    if (ptr == nullptr) return;
    Use();
    auto it = sizes_.find(ptr);
    if (it == sizes_.end()) throw CudaError("Free of a pointer this backend did not allocate");
    PARAPLAN_CUDA_CHECK(cudaStreamSynchronize(stream_));
    PARAPLAN_CUDA_CHECK(cudaFree(ptr));
    in_use_ -= it->second;
    sizes_.erase(it);
  }
  void CopyToDevice(void* dst, const void* src, int64_t bytes) override {
    Use();
    if (bytes <= 0) return;
    PARAPLAN_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_));
    PARAPLAN_CUDA_CHECK(cudaStreamSynchronize(stream_));  // the host buffer may go away
  }
  void CopyToHost(void* dst, const void* src, int64_t bytes) override {
    Use();
    if (bytes <= 0) return;
    PARAPLAN_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_));
    PARAPLAN_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  void CopyOnDevice(void* dst, const void* src, int64_t bytes) override {
    Use();
    if (bytes <= 0 || dst == src) return;
    PARAPLAN_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_));
  }
  void Synchronize() override {
    Use();
    PARAPLAN_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  int64_t BytesInUse() const override { return in_use_; }
  int64_t PeakBytes() const override { return peak_; }

  // ---- Elementwise ----
  void Fill(float* x, int64_t n, float value) override {
    Use();
    cuda::Fill(x, n, value, stream_);
  }
  void Copy(float* dst, const float* src, int64_t n) override {
    Use();
    cuda::Copy(dst, src, n, stream_);
  }
  void Add(float* out, const float* a, const float* b, int64_t n) override {
    Use();
    cuda::Add(out, a, b, n, stream_);
  }
  void Accumulate(float* y, const float* x, int64_t n) override {
    Use();
    cuda::Accumulate(y, x, n, stream_);
  }
  void Scale(float* x, int64_t n, float alpha) override {
    Use();
    cuda::Scale(x, n, alpha, stream_);
  }
  void CopyColumns(float* y, const float* x, int64_t rows, const host::ColumnMap& map,
                   bool accumulate) override {
    Use();
    const ColumnMap m{map.groups,   map.width,  map.x_cols,   map.x_stride,
                      map.x_offset, map.y_cols, map.y_stride, map.y_offset};
    cuda::CopyColumns(y, x, rows, m, accumulate, stream_);
  }

  // ---- Dense ----
  void Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const float* a,
            const float* b, float beta, float* c) override {
    Use();
    gemm_->Gemm(trans_a, trans_b, m, n, k, a, b, beta, c);
  }
  void LinearForward(float* y, const float* x, const float* w, const float* bias, int64_t rows,
                     int64_t in, int64_t out) override {
    Use();
    gemm_->LinearForward(y, x, w, bias, rows, in, out);
  }
  void LinearBackward(float* dx, float* dw, float* dbias, const float* dy, const float* x,
                      const float* w, int64_t rows, int64_t in, int64_t out,
                      bool accumulate_dx) override {
    Use();
    gemm_->LinearBackward(dx, dw, dbias, dy, x, w, rows, in, out, accumulate_dx);
  }

  // ---- Embeddings ----
  void EmbeddingForward(float* out, const int32_t* tokens, const float* table, int64_t rows,
                        int64_t dim, int64_t vocab_begin, int64_t vocab_count) override {
    Use();
    cuda::EmbeddingForward(out, tokens, table, rows, dim, vocab_begin, vocab_count, stream_);
  }
  void EmbeddingBackward(float* dtable, const float* dout, const int32_t* tokens, int64_t rows,
                         int64_t dim, int64_t vocab_begin, int64_t vocab_count) override {
    Use();
    cuda::EmbeddingBackward(dtable, dout, tokens, rows, dim, vocab_begin, vocab_count, stream_);
  }
  void AddPosition(float* y, const float* x, const float* pos, int64_t rows, int64_t dim,
                   int64_t t0, int64_t seq) override {
    Use();
    cuda::AddPosition(y, x, pos, rows, dim, t0, seq, stream_);
  }
  void AddPositionBackward(float* dpos, const float* dy, int64_t rows, int64_t dim, int64_t t0,
                           int64_t seq) override {
    Use();
    cuda::AddPositionBackward(dpos, dy, rows, dim, t0, seq, stream_);
  }

  // ---- Norms ----
  void RmsNormForward(float* out, float* rstd, const float* x, const float* w, int64_t rows,
                      int64_t dim, float eps) override {
    Use();
    cuda::RmsNormForward(out, rstd, x, w, rows, dim, eps, stream_);
  }
  void RmsNormBackward(float* dx, float* dw, const float* dout, const float* x, const float* w,
                       const float* rstd, int64_t rows, int64_t dim) override {
    Use();
    cuda::RmsNormBackward(dx, dw, dout, x, w, rstd, rows, dim, stream_);
  }
  void LayerNormForward(float* out, float* mean, float* rstd, const float* x, const float* w,
                        const float* b, int64_t rows, int64_t dim, float eps) override {
    Use();
    cuda::LayerNormForward(out, mean, rstd, x, w, b, rows, dim, eps, stream_);
  }
  void LayerNormBackward(float* dx, float* dw, float* db, const float* dout, const float* x,
                         const float* w, const float* mean, const float* rstd, int64_t rows,
                         int64_t dim) override {
    Use();
    cuda::LayerNormBackward(dx, dw, db, dout, x, w, mean, rstd, rows, dim, stream_);
  }

  // ---- Attention ----
  void RopeForward(float* x, const host::TokenLayout& layout, int64_t heads, int64_t head_dim,
                   float theta) override {
    Use();
    cuda::RopeForward(x, Convert(layout), heads, head_dim, theta, stream_);
  }
  void RopeBackward(float* dx, const host::TokenLayout& layout, int64_t heads, int64_t head_dim,
                    float theta) override {
    Use();
    cuda::RopeBackward(dx, Convert(layout), heads, head_dim, theta, stream_);
  }
  void AttentionForward(float* out, float* lse, const float* q, const float* k, const float* v,
                        const host::TokenLayout& layout, int64_t q_heads, int64_t kv_heads,
                        int64_t head_dim, float scale, int64_t window) override {
    Use();
    cuda::AttentionForward(out, lse, q, k, v, Convert(layout), q_heads, kv_heads, head_dim, scale,
                           window, stream_);
  }
  void AttentionBackward(float* dq, float* dk, float* dv, const float* dout, const float* out,
                         const float* lse, const float* q, const float* k, const float* v,
                         const host::TokenLayout& layout, int64_t q_heads, int64_t kv_heads,
                         int64_t head_dim, float scale, int64_t window) override {
    Use();
    const int64_t delta_count = layout.batch * q_heads * layout.seq;
    void* delta = nullptr;
    PARAPLAN_CUDA_CHECK(cudaMallocAsync(&delta, std::max<int64_t>(delta_count, 1) * 4, stream_));
    cuda::AttentionBackward(dq, dk, dv, dout, out, lse, q, k, v, Convert(layout), q_heads, kv_heads,
                            head_dim, scale, window, static_cast<float*>(delta), stream_);
    PARAPLAN_CUDA_CHECK(cudaFreeAsync(delta, stream_));
  }

  void AttentionBlockForward(float* out, float* lse, const float* q, const float* k, const float* v,
                             const host::TokenLayout& q_layout, const host::TokenLayout& kv_layout,
                             int64_t q_heads, int64_t kv_heads, int64_t head_dim, float scale,
                             int64_t window) override {
    Use();
    cuda::AttentionBlockForward(out, lse, q, k, v, Convert(q_layout), Convert(kv_layout), q_heads,
                                kv_heads, head_dim, scale, window, stream_);
  }
  void AttentionMergeBlocks(float* out, float* lse, const float* block_out, const float* block_lse,
                            const host::TokenLayout& layout, int64_t q_heads,
                            int64_t head_dim) override {
    Use();
    cuda::AttentionMergeBlocks(out, lse, block_out, block_lse, Convert(layout), q_heads, head_dim,
                               stream_);
  }
  void AttentionBlockBackward(float* dq, float* dk, float* dv, const float* dout, const float* out,
                              const float* lse, const float* q, const float* k, const float* v,
                              const host::TokenLayout& q_layout, const host::TokenLayout& kv_layout,
                              int64_t q_heads, int64_t kv_heads, int64_t head_dim, float scale,
                              int64_t window) override {
    Use();
    cuda::AttentionBlockBackward(dq, dk, dv, dout, out, lse, q, k, v, Convert(q_layout),
                                 Convert(kv_layout), q_heads, kv_heads, head_dim, scale, window,
                                 stream_);
  }

  // ---- Activations ----
  void SwiGluForward(float* out, const float* gate, const float* up, int64_t n) override {
    Use();
    cuda::SwiGluForward(out, gate, up, n, stream_);
  }
  void SwiGluBackward(float* dgate, float* dup, const float* dout, const float* gate,
                      const float* up, int64_t n) override {
    Use();
    cuda::SwiGluBackward(dgate, dup, dout, gate, up, n, stream_);
  }
  void GeluForward(float* out, const float* x, int64_t n) override {
    Use();
    cuda::GeluForward(out, x, n, stream_);
  }
  void GeluBackward(float* dx, const float* dout, const float* x, int64_t n) override {
    Use();
    cuda::GeluBackward(dx, dout, x, n, stream_);
  }
  void SquaredReluForward(float* out, const float* x, int64_t n) override {
    Use();
    cuda::SquaredReluForward(out, x, n, stream_);
  }
  void SquaredReluBackward(float* dx, const float* dout, const float* x, int64_t n) override {
    Use();
    cuda::SquaredReluBackward(dx, dout, x, n, stream_);
  }

  // ---- Cross-entropy ----
  void CrossEntropyRowMax(float* row_max, const float* logits, int64_t rows,
                          int64_t vocab_local) override {
    Use();
    cuda::CrossEntropyRowMax(row_max, logits, rows, vocab_local, stream_);
  }
  void CrossEntropySumExp(float* st, const float* logits, const float* row_max,
                          const int32_t* targets, int64_t rows, int64_t vocab_local,
                          int64_t vocab_begin, int64_t vocab) override {
    Use();
    cuda::CrossEntropySumExp(st, logits, row_max, targets, rows, vocab_local, vocab_begin, vocab,
                             stream_);
  }
  void CrossEntropyLoss(float* loss_sum, const float* row_max, const float* st, int64_t rows,
                        float scale) override {
    Use();
    cuda::CrossEntropyLoss(loss_sum, row_max, st, rows, scale, stream_);
  }
  void CrossEntropyBackward(float* dlogits, const float* logits, const float* row_max,
                            const float* st, const int32_t* targets, int64_t rows,
                            int64_t vocab_local, int64_t vocab_begin, int64_t vocab,
                            float grad_scale) override {
    Use();
    cuda::CrossEntropyBackward(dlogits, logits, row_max, st, targets, rows, vocab_local,
                               vocab_begin, vocab, grad_scale, stream_);
  }

  // ---- Optimizer ----
  double SumOfSquares(const float* x, int64_t n) override {
    Use();
    double* out =
        static_cast<double*>(sos_partials_) + int64_t{kMultiTensorMax} * kSumOfSquaresBlocks;
    cuda::SumOfSquares(out, x, n, static_cast<double*>(sos_partials_), stream_);
    double result = 0.0;
    PARAPLAN_CUDA_CHECK(
        cudaMemcpyAsync(&result, out, sizeof result, cudaMemcpyDeviceToHost, stream_));
    PARAPLAN_CUDA_CHECK(cudaStreamSynchronize(stream_));
    return result;
  }
  // kMultiTensorMax tensors per pair of launches, every result read back after one wait.
  std::vector<double> SumOfSquaresEach(const std::vector<exec::ConstTensor>& tensors) override {
    Use();
    std::vector<double> out(tensors.size(), 0.0);
    if (tensors.empty()) return out;
    void* results = nullptr;
    PARAPLAN_CUDA_CHECK(cudaMallocAsync(&results, out.size() * sizeof(double), stream_));
    const float* x[kMultiTensorMax];
    int64_t n[kMultiTensorMax];
    for (size_t first = 0; first < tensors.size(); first += kMultiTensorMax) {
      const int count = static_cast<int>(std::min<size_t>(kMultiTensorMax, tensors.size() - first));
      for (int t = 0; t < count; ++t) {
        x[t] = tensors[first + t].data;
        n[t] = tensors[first + t].n;
      }
      cuda::SumOfSquaresEach(static_cast<double*>(results) + first, x, n, count,
                             static_cast<double*>(sos_partials_), stream_);
    }
    PARAPLAN_CUDA_CHECK(cudaMemcpyAsync(out.data(), results, out.size() * sizeof(double),
                                        cudaMemcpyDeviceToHost, stream_));
    PARAPLAN_CUDA_CHECK(cudaFreeAsync(results, stream_));
    PARAPLAN_CUDA_CHECK(cudaStreamSynchronize(stream_));
    return out;
  }
  void AdamW(float* param, const float* grad, float* m, float* v, int64_t n,
             const host::AdamWConfig& config, int64_t step, float grad_scale) override {
    Use();
    cuda::AdamW(param, grad, m, v, n, Convert(config), step, grad_scale, nullptr, stream_);
  }
  void AdamWEach(const std::vector<exec::AdamWTensor>& tensors, const host::AdamWConfig& config,
                 int64_t step, float grad_scale) override {
    Use();
    cuda::AdamWTensor group[kMultiTensorMax];
    for (size_t first = 0; first < tensors.size(); first += kMultiTensorMax) {
      const int count = static_cast<int>(std::min<size_t>(kMultiTensorMax, tensors.size() - first));
      for (int t = 0; t < count; ++t) {
        const exec::AdamWTensor& e = tensors[first + t];
        // A copy onto the weights themselves is no copy (Copy skips it the same way).
        group[t] = {
            e.param, e.grad, e.m, e.v, e.n, e.weight_decay, e.copy == e.param ? nullptr : e.copy};
      }
      cuda::AdamWEach(group, count, Convert(config), step, grad_scale, stream_);
    }
  }
  void Sgd(float* param, const float* grad, int64_t n, float lr, float weight_decay,
           float grad_scale) override {
    Use();
    cuda::Sgd(param, grad, n, lr, weight_decay, grad_scale, stream_);
  }

  // ---- Mixture of experts ----
  void MoeRouterForward(float* weights, int32_t* indices, float* scores, float* counts,
                        const float* logits, const float* bias, int64_t rows,
                        const exec::MoeRouterConfig& config) override {
    Use();
    cuda::MoeRouterForward(weights, indices, scores, counts, logits, bias, rows, Router(config),
                           stream_);
  }
  void MoeRouterBackward(float* dlogits, const float* dweights, const int32_t* indices,
                         const float* scores, const float* counts, int64_t rows,
                         const exec::MoeRouterConfig& config, float aux_grad_scale) override {
    Use();
    cuda::MoeRouterBackward(dlogits, dweights, indices, scores, counts, rows, Router(config),
                            aux_grad_scale, stream_);
  }
  void MoeExpertBiasUpdate(float* bias, float* load, int64_t experts, float rate) override {
    Use();
    cuda::MoeExpertBiasUpdate(bias, load, experts, rate, stream_);
  }
  void MoeCapacityForward(float* kept, float* mask, const float* weights, const int32_t* indices,
                          int64_t rows, int64_t experts, int64_t topk, int64_t capacity,
                          bool position, int64_t segments) override {
    Use();
    cuda::MoeCapacityForward(kept, mask, weights, indices, rows, experts, topk, capacity, position,
                             segments, stream_);
  }
  void MoeCapacityBackward(float* dweights, const float* dkept, const float* mask,
                           int64_t n) override {
    Use();
    cuda::MoeCapacityBackward(dweights, dkept, mask, n, stream_);
  }
  void MoePermute(float* out, int32_t* row_map, int32_t* expert_counts, const float* x,
                  const int32_t* indices, int64_t rows, int64_t dim, int64_t experts,
                  int64_t topk) override {
    Use();
    cuda::MoePermute(out, row_map, expert_counts, x, indices, rows, dim, experts, topk, stream_);
  }
  void MoePermuteKept(float* out, int32_t* row_map, int32_t* expert_counts, const float* x,
                      const int32_t* indices, const float* mask, int64_t rows, int64_t dim,
                      int64_t experts, int64_t topk, int64_t out_rows) override {
    Use();
    cuda::MoePermuteKept(out, row_map, expert_counts, x, indices, mask, rows, dim, experts, topk,
                         out_rows, stream_);
  }
  void MoeUnpermute(float* y, const float* x, const int32_t* row_map, const float* weights,
                    int64_t rows, int64_t dim, int64_t topk) override {
    Use();
    cuda::MoeUnpermute(y, x, row_map, weights, rows, dim, topk, stream_);
  }
  void MoeUnpermuteBackward(float* dx, float* dweights, const float* dy, const float* x,
                            const int32_t* row_map, const float* weights, int64_t rows, int64_t dim,
                            int64_t topk) override {
    Use();
    cuda::MoeUnpermuteBackward(dx, dweights, dy, x, row_map, weights, rows, dim, topk, stream_);
  }
  // One GEMM per group on the engine; the group sizes are read back first (a synchronisation).
  void GroupedLinearForward(float* y, const float* x, const float* w, const int32_t* counts,
                            int64_t groups, int64_t in, int64_t out) override {
    Use();
    const std::vector<int32_t> sizes = GroupSizes(counts, groups);
    int64_t row = 0;
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t n = sizes[static_cast<size_t>(g)];
      if (n > 0)
        gemm_->LinearForward(y + row * out, x + row * in, w + g * out * in, nullptr, n, in, out);
      row += n;
    }
  }
  void GroupedLinearBackward(float* dx, float* dw, const float* dy, const float* x, const float* w,
                             const int32_t* counts, int64_t groups, int64_t in, int64_t out,
                             bool accumulate_dx) override {
    Use();
    const std::vector<int32_t> sizes = GroupSizes(counts, groups);
    int64_t row = 0;
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t n = sizes[static_cast<size_t>(g)];
      if (n > 0) {
        gemm_->LinearBackward(dx ? dx + row * in : nullptr, dw ? dw + g * out * in : nullptr,
                              nullptr, dy + row * out, x + row * in, w + g * out * in, n, in, out,
                              accumulate_dx);
      }
      row += n;
    }
  }

 private:
  // The calling thread may be new (local mode runs a thread per rank): make the device current.
  void Use() const { PARAPLAN_CUDA_CHECK(cudaSetDevice(device_)); }
  static cuda::MoeRouterConfig Router(const exec::MoeRouterConfig& c) {
    return {.experts = c.experts,
            .topk = c.topk,
            .score = static_cast<int64_t>(c.score),
            .normalize = c.normalize,
            .aux_coeff = c.aux_coeff,
            .aux_rows = c.aux_rows,
            .groups = c.groups,
            .group_topk = c.group_topk,
            .scale = c.scale};
  }
  // The rows of each group, read back from the device (waits for the stream).
  std::vector<int32_t> GroupSizes(const int32_t* counts, int64_t groups) {
    std::vector<int32_t> sizes(static_cast<size_t>(std::max<int64_t>(groups, 0)));
    if (groups <= 0) return sizes;
    PARAPLAN_CUDA_CHECK(cudaMemcpyAsync(sizes.data(), counts, sizes.size() * sizeof(int32_t),
                                        cudaMemcpyDeviceToHost, stream_));
    PARAPLAN_CUDA_CHECK(cudaStreamSynchronize(stream_));
    return sizes;
  }

  int device_;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<GemmEngine> gemm_;
  void* sos_partials_ = nullptr;
  std::map<void*, int64_t> sizes_;
  int64_t in_use_ = 0;
  int64_t peak_ = 0;
};

class LocalCudaCommWorld final : public exec::CommWorld {
 public:
  LocalCudaCommWorld(std::vector<cudaStream_t> streams, double timeout)
      : world_(std::move(streams), timeout) {}
  int Size() const override { return world_.Size(); }
  std::unique_ptr<comm::Communicator> Join(const std::vector<int>& members, int world_rank,
                                           int tag) override {
    return world_.Join(members, world_rank, tag);
  }
  void Abort(const std::string& reason) override { world_.Abort(reason); }

 private:
  comm::LocalCudaWorld world_;
};

class NcclCommWorld final : public exec::CommWorld {
 public:
  explicit NcclCommWorld(std::unique_ptr<comm::NcclWorld> world) : world_(std::move(world)) {}
  int Size() const override { return world_->Size(); }
  std::unique_ptr<comm::Communicator> Join(const std::vector<int>& members, int world_rank,
                                           int tag) override {
    return world_->Join(members, world_rank, tag);
  }
  void Abort(const std::string& reason) override { world_->Abort(reason); }

 private:
  std::unique_ptr<comm::NcclWorld> world_;
};

}  // namespace

int CudaDeviceCount() { return VisibleDeviceCount(); }

std::string CudaUnavailableReason() { return NoDeviceReason(); }

CudaRanks MakeLocalCudaRanks(int ranks, int device, double timeout_seconds) {
  if (ranks < 1 || ranks > kMaxLocalRanks) {
    throw CudaError(fmt::format("the local CUDA mode runs 1 to {} ranks on one GPU, not {}",
                                kMaxLocalRanks, ranks));
  }
  CudaRanks out;
  std::vector<cudaStream_t> streams;
  for (int r = 0; r < ranks; ++r) {
    auto backend = std::make_unique<CudaBackend>(device);
    streams.push_back(backend->Stream());
    out.backends.push_back(std::move(backend));
  }
  out.world = std::make_unique<LocalCudaCommWorld>(std::move(streams), timeout_seconds);
  return out;
}

CudaRanks MakeNcclRank(const launch::LaunchEnvironment& env, int device, uint64_t job_key,
                       const std::vector<CommGroup>& groups, const launch::EnvLookup& lookup) {
  CudaRanks out;
  auto backend = std::make_unique<CudaBackend>(device);
  cudaStream_t stream = backend->Stream();
  auto options = comm::NcclWorldOptionsFromEnvironment(lookup);
  auto world = comm::NcclWorld::Create(env, stream, job_key, options);
  std::vector<comm::NcclGroupSpec> specs;
  specs.reserve(groups.size());
  for (const auto& g : groups) specs.push_back(comm::NcclGroupSpec{g.kind, g.members});
  world->CreateGroups(specs);
  out.backends.push_back(std::move(backend));
  out.world = std::make_unique<NcclCommWorld>(std::move(world));
  return out;
}

}  // namespace paraplan::cuda
