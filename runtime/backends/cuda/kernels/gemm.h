// GemmEngine: every matrix product of the CUDA backend, on cuBLASLt with bf16 operands, fp32
// accumulation and fp32 output (what llm.c and Megatron use for bf16 training).
//
// Semantics are the host's (runtime/backends/host/kernels/kernels.h): row-major fp32 tensors,
// C[M,N] = op(A) · op(B) + beta · C with beta 0 (C overwritten, never read) or 1 (accumulate
// into the fp32 gradient), linear weights [out, in]. fp32 operands are rounded to bf16 in
// scratch buffers owned by the engine; operands already in bf16 (weight copies written by
// AdamW) go straight in. Descriptors and the heuristic's algorithm are chosen once per shape
// and cached, so a step reuses the same algorithm every time (reproducible runs).
//
// LinearBackward rounds dy to bf16 once for both of its products (dx = dy·w and dw += dyᵀ·x):
// the same bits go into both, so the results are those of two separate Gemm calls, with one
// cast pass over dy fewer (for the LM head, one pass over the [rows, vocab] logits gradient).
// `cast_each_operand` (PARAPLAN_CUDA_GEMM_CAST=1 in the backend) restores one cast per operand
// per product, so that both can be timed on the same build.
//
// One engine per stream (per rank); not thread-safe. Made by the CUDA backend; read by it and
// by the GPU tests.
#ifndef PARAPLAN_RUNTIME_BACKENDS_CUDA_KERNELS_GEMM_H_
#define PARAPLAN_RUNTIME_BACKENDS_CUDA_KERNELS_GEMM_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <memory>
#include <tuple>

namespace paraplan::cuda {

class GemmEngine {
 public:
  explicit GemmEngine(cudaStream_t stream, bool cast_each_operand = false);
  ~GemmEngine();
  GemmEngine(const GemmEngine&) = delete;
  GemmEngine& operator=(const GemmEngine&) = delete;

  // fp32 operands (rounded to bf16 on the way in).
  void Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const float* a,
            const float* b, float beta, float* c);
  // bf16 operands already on the device.
  void GemmBf16(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const void* a_bf16,
                const void* b_bf16, float beta, float* c);

  // y[rows,out] = x · wᵀ (+ bias).
  void LinearForward(float* y, const float* x, const float* w, const float* bias, int64_t rows,
                     int64_t in, int64_t out);
  // dx = dy · w (written or added), dw += dyᵀ · x, dbias += Σ_rows dy; null pointers skip.
  void LinearBackward(float* dx, float* dw, float* dbias, const float* dy, const float* x,
                      const float* w, int64_t rows, int64_t in, int64_t out, bool accumulate_dx);

  cudaStream_t Stream() const { return stream_; }

 private:
  struct Plan;
  using Key = std::tuple<bool, bool, int64_t, int64_t, int64_t, bool>;
  const Plan& PlanFor(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, bool beta_one);
  void* Scratch(int which, int64_t bytes);

  cudaStream_t stream_;
  bool cast_each_operand_;
  void* handle_ = nullptr;  // cublasLtHandle_t
  void* workspace_ = nullptr;
  int64_t workspace_bytes_ = 0;
  void* scratch_[2] = {nullptr, nullptr};
  int64_t scratch_bytes_[2] = {0, 0};
  std::map<Key, std::unique_ptr<Plan>> plans_;
};

}  // namespace paraplan::cuda

#endif  // PARAPLAN_RUNTIME_BACKENDS_CUDA_KERNELS_GEMM_H_
