// Vocab-parallel cross-entropy phases (one block per row), the deterministic sum of squares
// for gradient clipping, and the fused AdamW / SGD updates (fp32 master weights).
#include <cmath>

#include "runtime/backends/cuda/kernels/common.cuh"
#include "runtime/backends/cuda/kernels/kernels.h"

namespace paraplan::cuda {

// Kernel signatures follow the Backend interface (runtime/exec/backend.h) and the host
// specification: tensors as raw pointers and sizes in the specification's order, several of one
// type side by side; every argument is checked against the reference by the kernel tests.
// NOLINTBEGIN(bugprone-easily-swappable-parameters)
namespace {

unsigned RowGrid(int64_t rows) {
  if (rows > 0x7fffffff) throw CudaError("cross-entropy: more than 2^31 rows");
  return static_cast<unsigned>(rows);
}

__global__ void RowMaxKernel(float* row_max, const float* logits, int64_t vocab) {
  __shared__ SharedArray<float, 32> shared32;
  const float* row = logits + blockIdx.x * vocab;
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) m = fmaxf(m, row[j]);
  m = BlockMax(m, shared32);
  if (threadIdx.x == 0) row_max[blockIdx.x] = m;
}

__global__ void SumExpKernel(float* st, const float* logits, const float* row_max,
                             const int32_t* targets, int64_t vocab_local, int64_t vocab_begin,
                             int64_t valid) {
  __shared__ SharedArray<float, 32> shared32;
  const float* row = logits + blockIdx.x * vocab_local;
  const float m = row_max[blockIdx.x];
  float s = 0.0f;
  for (int64_t j = threadIdx.x; j < valid; j += blockDim.x) s += expf(row[j] - m);
  s = BlockSum(s, shared32);
  if (threadIdx.x == 0) {
    st[size_t{2} * blockIdx.x] = s;
    const int64_t t = static_cast<int64_t>(targets[blockIdx.x]) - vocab_begin;
    st[2 * blockIdx.x + 1] = (t >= 0 && t < valid) ? row[t] : 0.0f;
  }
}

// One block: per-thread sums in double over a fixed stride, then the block sum in order.
__global__ void LossKernel(float* loss_sum, const float* row_max, const float* st, int64_t rows,
                           float scale) {
  __shared__ SharedArray<double, kThreads> partial;
  double s = 0.0;
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) {
    s += static_cast<double>(logf(st[2 * r]) + row_max[r] - st[2 * r + 1]);
  }
  partial[threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.x == 0) {
    double total = 0.0;
    for (int i = 0; i < static_cast<int>(blockDim.x); ++i) total += partial[i];
    loss_sum[0] += static_cast<float>(scale * total / static_cast<double>(rows));
  }
}

__global__ void CrossEntropyBackwardKernel(float* dlogits, const float* logits,
                                           const float* row_max, const float* st,
                                           const int32_t* targets, int64_t vocab_local,
                                           int64_t vocab_begin, int64_t valid, float scale) {
  const int64_t r = blockIdx.x;
  const float m = row_max[r], inv = 1.0f / st[2 * r];
  const int64_t t = static_cast<int64_t>(targets[r]) - vocab_begin;
  const float* row = logits + r * vocab_local;
  float* out = dlogits + r * vocab_local;
  for (int64_t j = threadIdx.x; j < vocab_local; j += blockDim.x) {
    float p = 0.0f;
    if (j < valid) {
      p = expf(row[j] - m) * inv;
      if (j == t) p -= 1.0f;
    }
    out[j] = p * scale;
  }
}

// Block b sums elements b·T + t, stepping by the whole grid, in double.
__global__ void SumOfSquaresPartialKernel(double* partials, const float* x, int64_t n) {
  __shared__ SharedArray<double, kThreads> lanes;
  double s = 0.0;
  PARAPLAN_GRID_STRIDE(i, n) s += static_cast<double>(x[i]) * x[i];
  lanes[threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.x == 0) {
    double total = 0.0;
    for (int i = 0; i < static_cast<int>(blockDim.x); ++i) total += lanes[i];
    partials[blockIdx.x] = total;
  }
}

__global__ void SumPartialsKernel(double* out, const double* partials, int count) {
  if (threadIdx.x != 0) return;
  double total = 0.0;
  for (int i = 0; i < count; ++i) total += partials[i];
  out[0] = total;
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
  PARAPLAN_LAUNCH(RowMaxKernel, RowGrid(rows), kThreads, 0, stream, row_max, logits, vocab_local);
  PARAPLAN_CUDA_CHECK_LAUNCH();
}

void CrossEntropySumExp(float* st, const float* logits, const float* row_max,
                        const int32_t* targets, int64_t rows, int64_t vocab_local,
                        int64_t vocab_begin, int64_t vocab, cudaStream_t stream) {
  if (rows <= 0) return;
  const int64_t valid = std::clamp<int64_t>(vocab - vocab_begin, 0, vocab_local);
  PARAPLAN_LAUNCH(SumExpKernel, RowGrid(rows), kThreads, 0, stream, st, logits, row_max, targets,
                  vocab_local, vocab_begin, valid);
  PARAPLAN_CUDA_CHECK_LAUNCH();
}

void CrossEntropyLoss(float* loss_sum, const float* row_max, const float* st, int64_t rows,
                      float scale, cudaStream_t stream) {
  if (rows <= 0) return;
  PARAPLAN_LAUNCH(LossKernel, 1, kThreads, 0, stream, loss_sum, row_max, st, rows, scale);
  PARAPLAN_CUDA_CHECK_LAUNCH();
}

void CrossEntropyBackward(float* dlogits, const float* logits, const float* row_max,
                          const float* st, const int32_t* targets, int64_t rows,
                          int64_t vocab_local, int64_t vocab_begin, int64_t vocab, float grad_scale,
                          cudaStream_t stream) {
  if (rows <= 0) return;
  const int64_t valid = std::clamp<int64_t>(vocab - vocab_begin, 0, vocab_local);
  const float scale = grad_scale / static_cast<float>(rows);
  PARAPLAN_LAUNCH(CrossEntropyBackwardKernel, RowGrid(rows), kThreads, 0, stream, dlogits, logits,
                  row_max, st, targets, vocab_local, vocab_begin, valid, scale);
  PARAPLAN_CUDA_CHECK_LAUNCH();
}

void SumOfSquares(double* out, const float* x, int64_t n, double* partials, cudaStream_t stream) {
  if (n <= 0) {
    PARAPLAN_CUDA_CHECK(cudaMemsetAsync(out, 0, sizeof(double), stream));
    return;
  }
  // A fixed grid for a given n (the order of the sum depends on n only); small tensors (biases,
  // norm weights) get as many blocks as they fill instead of 264 mostly idle ones.
  const int blocks =
      static_cast<int>(std::min<int64_t>(kSumOfSquaresBlocks, (n + kThreads - 1) / kThreads));
  PARAPLAN_LAUNCH(SumOfSquaresPartialKernel, blocks, kThreads, 0, stream, partials, x, n);
  PARAPLAN_CUDA_CHECK_LAUNCH();
  PARAPLAN_LAUNCH(SumPartialsKernel, 1, 32, 0, stream, out, partials, blocks);
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
  PARAPLAN_LAUNCH(AdamWKernel, GridFor(n), kThreads, 0, stream, param, grad, m, v, n, config, bc1,
                  bc2, grad_scale, static_cast<__nv_bfloat16*>(param_bf16));
  PARAPLAN_CUDA_CHECK_LAUNCH();
}

void Sgd(float* param, const float* grad, int64_t n, float lr, float weight_decay, float grad_scale,
         cudaStream_t stream) {
  if (n <= 0) return;
  PARAPLAN_LAUNCH(SgdKernel, GridFor(n), kThreads, 0, stream, param, grad, n, lr, weight_decay,
                  grad_scale);
  PARAPLAN_CUDA_CHECK_LAUNCH();
}

// NOLINTEND(bugprone-easily-swappable-parameters)

}  // namespace paraplan::cuda
