// Vocab-parallel cross-entropy phases (one block per row), the deterministic sum of squares
// for gradient clipping, and the fused AdamW / SGD updates (fp32 master weights).
#include <cmath>

#include "runtime/kernels/cuda/common.cuh"
#include "runtime/kernels/cuda/kernels.h"

namespace paraplan::cuda {
namespace {

unsigned RowGrid(int64_t rows) {
  if (rows > 0x7fffffff) throw CudaError("cross-entropy: more than 2^31 rows");
  return static_cast<unsigned>(rows);
}

__global__ void RowMaxKernel(float* row_max, const float* logits, int64_t vocab) {
  __shared__ float shared32[32];
  const float* row = logits + blockIdx.x * vocab;
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) m = fmaxf(m, row[j]);
  m = BlockMax(m, shared32);
  if (threadIdx.x == 0) row_max[blockIdx.x] = m;
}

__global__ void SumExpKernel(float* sum_exp, float* target_logit, const float* logits,
                             const float* row_max, const int32_t* targets, int64_t vocab,
                             int64_t vocab_begin) {
  __shared__ float shared32[32];
  const float* row = logits + blockIdx.x * vocab;
  const float m = row_max[blockIdx.x];
  float s = 0.0f;
  for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) s += expf(row[j] - m);
  s = BlockSum(s, shared32);
  if (threadIdx.x == 0) {
    sum_exp[blockIdx.x] = s;
    const int64_t t = static_cast<int64_t>(targets[blockIdx.x]) - vocab_begin;
    target_logit[blockIdx.x] = (t >= 0 && t < vocab) ? row[t] : 0.0f;
  }
}

__global__ void LossKernel(float* loss, const float* row_max, const float* sum_exp,
                           const float* target_logit, int64_t rows) {
  PARAPLAN_GRID_STRIDE(r, rows) loss[r] = logf(sum_exp[r]) + row_max[r] - target_logit[r];
}

__global__ void CrossEntropyBackwardKernel(float* dlogits, const float* logits,
                                           const float* row_max, const float* sum_exp,
                                           const int32_t* targets, int64_t vocab,
                                           int64_t vocab_begin, float scale) {
  const int64_t r = blockIdx.x;
  const float m = row_max[r], inv = 1.0f / sum_exp[r];
  const int64_t t = static_cast<int64_t>(targets[r]) - vocab_begin;
  const float* row = logits + r * vocab;
  float* out = dlogits + r * vocab;
  for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) {
    float p = expf(row[j] - m) * inv;
    if (j == t) p -= 1.0f;
    out[j] = p * scale;
  }
}

// Fixed grid: block b sums elements b, b + B, b + 2B, ... (grid-stride) in thread order.
__global__ void SumOfSquaresPartialKernel(float* partials, const float* x, int64_t n) {
  __shared__ float shared32[32];
  float s = 0.0f;
  PARAPLAN_GRID_STRIDE(i, n) s += x[i] * x[i];
  s = BlockSum(s, shared32);
  if (threadIdx.x == 0) partials[blockIdx.x] = s;
}

__global__ void SumPartialsKernel(float* out, const float* partials, int count) {
  __shared__ float shared32[32];
  float s = 0.0f;
  for (int i = threadIdx.x; i < count; i += blockDim.x) s += partials[i];
  s = BlockSum(s, shared32);
  if (threadIdx.x == 0) out[0] = s;
}

__global__ void AdamWKernel(float* param, const float* grad, float* m, float* v, int64_t n,
                            AdamWConfig c, float bc1, float bc2, float grad_scale,
                            __nv_bfloat16* param_bf16) {
  PARAPLAN_GRID_STRIDE(i, n) {
    const float g = grad[i] * grad_scale;
    const float mi = c.beta1 * m[i] + (1.0f - c.beta1) * g;
    const float vi = c.beta2 * v[i] + (1.0f - c.beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    const float mhat = mi / bc1, vhat = vi / bc2;
    const float p = param[i] - c.lr * (mhat / (sqrtf(vhat) + c.eps) + c.weight_decay * param[i]);
    param[i] = p;
    if (param_bf16 != nullptr) param_bf16[i] = __float2bfloat16_rn(p);
  }
}

__global__ void SgdKernel(float* param, const float* grad, int64_t n, float lr, float wd,
                          float grad_scale) {
  PARAPLAN_GRID_STRIDE(i, n) param[i] -= lr * (grad[i] * grad_scale + wd * param[i]);
}

}  // namespace

void CrossEntropyRowMax(float* row_max, const float* logits, int64_t rows, int64_t vocab_local,
                        cudaStream_t stream) {
  if (rows <= 0) return;
  RowMaxKernel<<<RowGrid(rows), kThreads, 0, stream>>>(row_max, logits, vocab_local);
  PARAPLAN_CUDA_CHECK_LAUNCH();
}

void CrossEntropySumExp(float* sum_exp, float* target_logit, const float* logits,
                        const float* row_max, const int32_t* targets, int64_t rows,
                        int64_t vocab_local, int64_t vocab_begin, cudaStream_t stream) {
  if (rows <= 0) return;
  SumExpKernel<<<RowGrid(rows), kThreads, 0, stream>>>(sum_exp, target_logit, logits, row_max,
                                                       targets, vocab_local, vocab_begin);
  PARAPLAN_CUDA_CHECK_LAUNCH();
}

void CrossEntropyLoss(float* loss, const float* row_max, const float* sum_exp,
                      const float* target_logit, int64_t rows, cudaStream_t stream) {
  if (rows <= 0) return;
  LossKernel<<<GridFor(rows), kThreads, 0, stream>>>(loss, row_max, sum_exp, target_logit, rows);
  PARAPLAN_CUDA_CHECK_LAUNCH();
}

void CrossEntropyBackward(float* dlogits, const float* logits, const float* row_max,
                          const float* sum_exp, const int32_t* targets, int64_t rows,
                          int64_t vocab_local, int64_t vocab_begin, float scale,
                          cudaStream_t stream) {
  if (rows <= 0) return;
  CrossEntropyBackwardKernel<<<RowGrid(rows), kThreads, 0, stream>>>(
      dlogits, logits, row_max, sum_exp, targets, vocab_local, vocab_begin, scale);
  PARAPLAN_CUDA_CHECK_LAUNCH();
}

void SumOfSquares(float* out, const float* x, int64_t n, float* partials, cudaStream_t stream) {
  if (n <= 0) {
    PARAPLAN_CUDA_CHECK(cudaMemsetAsync(out, 0, sizeof(float), stream));
    return;
  }
  SumOfSquaresPartialKernel<<<kSumOfSquaresBlocks, kThreads, 0, stream>>>(partials, x, n);
  PARAPLAN_CUDA_CHECK_LAUNCH();
  SumPartialsKernel<<<1, kThreads, 0, stream>>>(out, partials, kSumOfSquaresBlocks);
  PARAPLAN_CUDA_CHECK_LAUNCH();
}

void AdamW(float* param, const float* grad, float* m, float* v, int64_t n,
           const AdamWConfig& config, int64_t step, float grad_scale, void* param_bf16,
           cudaStream_t stream) {
  if (n <= 0) return;
  if (step < 1) throw CudaError("AdamW: the step count starts at 1");
  // Bias corrections exactly as the host computes them (pow in double, then float).
  const float bc1 = 1.0f - static_cast<float>(std::pow(static_cast<double>(config.beta1), step));
  const float bc2 = 1.0f - static_cast<float>(std::pow(static_cast<double>(config.beta2), step));
  AdamWKernel<<<GridFor(n), kThreads, 0, stream>>>(param, grad, m, v, n, config, bc1, bc2,
                                                   grad_scale,
                                                   static_cast<__nv_bfloat16*>(param_bf16));
  PARAPLAN_CUDA_CHECK_LAUNCH();
}

void Sgd(float* param, const float* grad, int64_t n, float lr, float weight_decay,
         float grad_scale, cudaStream_t stream) {
  if (n <= 0) return;
  SgdKernel<<<GridFor(n), kThreads, 0, stream>>>(param, grad, n, lr, weight_decay, grad_scale);
  PARAPLAN_CUDA_CHECK_LAUNCH();
}

}  // namespace paraplan::cuda
