// Vocab-parallel cross-entropy phases (one block per row), the deterministic sum of squares
// for gradient clipping, and the fused AdamW / SGD updates (fp32 master weights).
#include <algorithm>
#include <cmath>
#include <string>

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
    // An ignored row (negative target): (0, 0) on every slice marks it after the TP sum.
    const bool ignored = targets[blockIdx.x] < 0;
    st[size_t{2} * blockIdx.x] = ignored ? 0.0f : s;
    const int64_t t = static_cast<int64_t>(targets[blockIdx.x]) - vocab_begin;
    st[2 * blockIdx.x + 1] = (!ignored && t >= 0 && t < valid) ? row[t] : 0.0f;
  }
}

// One block: per-thread sums in double over a fixed stride, then the block sum in order. An
// ignored row (its sum of exponentials 0; a counted row's is at least 1) adds nothing.
__global__ void LossKernel(float* loss_sum, const float* row_max, const float* st, int64_t rows,
                           float scale) {
  __shared__ SharedArray<double, kThreads> partial;
  double s = 0.0;
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) {
    if (st[2 * r] == 0.0f) continue;
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

// An ignored row (negative target) gets zeros.
__global__ void CrossEntropyBackwardKernel(float* dlogits, const float* logits,
                                           const float* row_max, const float* st,
                                           const int32_t* targets, int64_t vocab_local,
                                           int64_t vocab_begin, int64_t valid, float scale) {
  const int64_t r = blockIdx.x;
  const bool ignored = targets[r] < 0;
  const float m = row_max[r], inv = ignored ? 0.0f : 1.0f / st[2 * r];
  const int64_t t = static_cast<int64_t>(targets[r]) - vocab_begin;
  const float* row = logits + r * vocab_local;
  float* out = dlogits + r * vocab_local;
  for (int64_t j = threadIdx.x; j < vocab_local; j += blockDim.x) {
    float p = 0.0f;
    if (!ignored && j < valid) {
      p = expf(row[j] - m) * inv;
      if (j == t) p -= 1.0f;
    }
    out[j] = p * scale;
  }
}

// The tensors of one multi-tensor launch; block_begin[t] is tensor t's first block (the blocks
// of tensor t are block_begin[t] .. block_begin[t + 1] - 1). Passed by value (about 2 KiB, under
// the 4 KiB of kernel parameters every CUDA version accepts).
struct AdamWTable {
  AdamWTensor tensors[kMultiTensorMax];
  int block_begin[kMultiTensorMax + 1];
  int count;
};

struct SumOfSquaresTable {
  const float* x[kMultiTensorMax];
  int64_t n[kMultiTensorMax];
  int block_begin[kMultiTensorMax + 1];
  int count;
};

// The tensor that block `b` belongs to (tables hold at most 32 tensors: a scan).
template <typename Table>
__device__ __forceinline__ int TensorOfBlock(const Table& table, int b) {
  int t = 0;
  while (t + 1 < table.count && table.block_begin[t + 1] <= b) ++t;
  return t;
}

// Block `block` of `blocks` sums elements block·T + t, stepping by blocks·T, in double; its
// threads' sums are added in thread order into partials[block].
template <typename Shared>
__device__ __forceinline__ void SumOfSquaresBlock(double* partials, const float* x, int64_t n,
                                                  int64_t block, int64_t blocks, Shared& lanes) {
  double s = 0.0;
  for (int64_t i = block * blockDim.x + threadIdx.x; i < n; i += blocks * blockDim.x)
    s += static_cast<double>(x[i]) * x[i];
  lanes[threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.x == 0) {
    double total = 0.0;
    for (int i = 0; i < static_cast<int>(blockDim.x); ++i) total += lanes[i];
    partials[block] = total;
  }
}

__global__ void SumOfSquaresPartialKernel(double* partials, const float* x, int64_t n) {
  __shared__ SharedArray<double, kThreads> lanes;
  SumOfSquaresBlock(partials, x, n, blockIdx.x, gridDim.x, lanes);
}

__device__ __forceinline__ double SumInOrder(const double* partials, int count) {
  double total = 0.0;
  for (int i = 0; i < count; ++i) total += partials[i];
  return total;
}

__global__ void SumPartialsKernel(double* out, const double* partials, int count) {
  if (threadIdx.x != 0) return;
  out[0] = SumInOrder(partials, count);
}

// Tensor t's blocks write partials[block_begin[t] ...], as SumOfSquaresPartialKernel would at 0.
__global__ void SumOfSquaresEachPartialKernel(double* partials, SumOfSquaresTable table) {
  __shared__ SharedArray<double, kThreads> lanes;
  const int t = TensorOfBlock(table, static_cast<int>(blockIdx.x));
  const int first = table.block_begin[t];
  SumOfSquaresBlock(partials + first, table.x[t], table.n[t], blockIdx.x - first,
                    table.block_begin[t + 1] - first, lanes);
}

// Thread t adds tensor t's partials in order.
__global__ void SumOfSquaresEachFinishKernel(double* out, const double* partials,
                                             SumOfSquaresTable table) {
  const int t = static_cast<int>(threadIdx.x);
  if (t >= table.count) return;
  const int first = table.block_begin[t];
  out[t] = SumInOrder(partials + first, table.block_begin[t + 1] - first);
}

// The blocks SumOfSquares gives n elements: the order of its sum depends on n only; small
// tensors (biases, norm weights) get as many blocks as they fill instead of 264 mostly idle ones.
int SumOfSquaresBlocks(int64_t n) {
  return static_cast<int>(std::min<int64_t>(kSumOfSquaresBlocks, (n + kThreads - 1) / kThreads));
}

// Blocks per tensor of a multi-tensor AdamW: one per 256 elements up to about a GPU's worth of
// resident threads (132 SMs · 8 blocks), then grid-stride.
int AdamWBlocks(int64_t n) {
  return static_cast<int>(std::clamp<int64_t>((n + kThreads - 1) / kThreads, 1, 1056));
}

void CheckTensorCount(int count, const char* what) {
  if (count < 0 || count > kMultiTensorMax) {
    throw CudaError(std::string(what) + ": " + std::to_string(count) + " tensors, more than " +
                    std::to_string(kMultiTensorMax) + " per launch");
  }
}

// One element of AdamW; returns the updated weight. Shared by both AdamW kernels so that they
// compile to the same arithmetic.
__device__ __forceinline__ float AdamWElement(float* param, const float* grad, float* m, float* v,
                                              int64_t i, const AdamWConfig& c, float weight_decay,
                                              float bc1, float bc2, float grad_scale) {
  const float g = grad[i] * grad_scale;
  const float mi = c.beta1 * m[i] + (1.0f - c.beta1) * g;
  const float vi = c.beta2 * v[i] + (1.0f - c.beta2) * g * g;
  m[i] = mi;
  v[i] = vi;
  const float mhat = mi / bc1, vhat = vi / bc2;
  const float p = param[i] - c.lr * (mhat / (sqrtf(vhat) + c.eps) + weight_decay * param[i]);
  param[i] = p;
  return p;
}

__global__ void AdamWKernel(float* param, const float* grad, float* m, float* v, int64_t n,
                            AdamWConfig c, float bc1, float bc2, float grad_scale,
                            __nv_bfloat16* param_bf16) {
  PARAPLAN_GRID_STRIDE(i, n) {
    const float p = AdamWElement(param, grad, m, v, i, c, c.weight_decay, bc1, bc2, grad_scale);
    if (param_bf16 != nullptr) param_bf16[i] = __float2bfloat16_rn(p);
  }
}

// Blocks of one tensor stride over it as a grid of their own.
__global__ void AdamWEachKernel(AdamWTable table, AdamWConfig c, float bc1, float bc2,
                                float grad_scale) {
  const int t = TensorOfBlock(table, static_cast<int>(blockIdx.x));
  const AdamWTensor& x = table.tensors[t];
  const int64_t block = blockIdx.x - table.block_begin[t];
  const int64_t stride =
      static_cast<int64_t>(table.block_begin[t + 1] - table.block_begin[t]) * blockDim.x;
  for (int64_t i = block * blockDim.x + threadIdx.x; i < x.n; i += stride) {
    const float p =
        AdamWElement(x.param, x.grad, x.m, x.v, i, c, x.weight_decay, bc1, bc2, grad_scale);
    if (x.copy != nullptr) x.copy[i] = p;
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
  const int blocks = SumOfSquaresBlocks(n);
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

void SumOfSquaresEach(double* out, const float* const* x, const int64_t* n, int count,
                      double* partials, cudaStream_t stream) {
  CheckTensorCount(count, "SumOfSquaresEach");
  if (count == 0) return;
  SumOfSquaresTable table{};
  table.count = count;
  int blocks = 0;
  for (int t = 0; t < count; ++t) {
    table.x[t] = x[t];
    table.n[t] = std::max<int64_t>(n[t], 0);
    table.block_begin[t] = blocks;
    // An empty tensor keeps one block, which sums nothing: its result is 0 as SumOfSquares's.
    blocks += std::max(SumOfSquaresBlocks(table.n[t]), 1);
  }
  table.block_begin[count] = blocks;
  PARAPLAN_LAUNCH(SumOfSquaresEachPartialKernel, static_cast<unsigned>(blocks), kThreads, 0, stream,
                  partials, table);
  PARAPLAN_CUDA_CHECK_LAUNCH();
  PARAPLAN_LAUNCH(SumOfSquaresEachFinishKernel, 1, 32, 0, stream, out, partials, table);
  PARAPLAN_CUDA_CHECK_LAUNCH();
}

void AdamWEach(const AdamWTensor* tensors, int count, const AdamWConfig& config, int64_t step,
               float grad_scale, cudaStream_t stream) {
  CheckTensorCount(count, "AdamWEach");
  if (step < 1) throw CudaError("AdamW: the step count starts at 1");
  AdamWTable table{};
  int blocks = 0;
  for (int t = 0; t < count; ++t) {
    if (tensors[t].n <= 0) continue;  // no blocks: AdamW of nothing does nothing
    table.tensors[table.count] = tensors[t];
    table.block_begin[table.count] = blocks;
    blocks += AdamWBlocks(tensors[t].n);
    ++table.count;
  }
  if (table.count == 0) return;
  table.block_begin[table.count] = blocks;
  const float bc1 = 1.0f - static_cast<float>(std::pow(static_cast<double>(config.beta1), step));
  const float bc2 = 1.0f - static_cast<float>(std::pow(static_cast<double>(config.beta2), step));
  PARAPLAN_LAUNCH(AdamWEachKernel, static_cast<unsigned>(blocks), kThreads, 0, stream, table,
                  config, bc1, bc2, grad_scale);
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
