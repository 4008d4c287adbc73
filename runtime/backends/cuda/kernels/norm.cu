// RMSNorm and LayerNorm, forward and backward: one warp per row (statistics in fp32 with warp
// shuffles), weight and bias gradients as deterministic column sums (common.cuh).
#include "runtime/backends/cuda/kernels/common.cuh"
#include "runtime/backends/cuda/kernels/kernels.h"

namespace paraplan::cuda {
namespace {

constexpr int kRowsPerBlock = kThreads / 32;

unsigned RowBlocks(int64_t rows) {
  return static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock);
}

__global__ void RmsNormForwardKernel(float* out, float* rstd, const float* x, const float* w,
                                     int64_t rows, int64_t dim, float eps) {
  const int64_t row = blockIdx.x * static_cast<int64_t>(kRowsPerBlock) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const float* xr = x + row * dim;
  float ss = 0.0f;
  for (int64_t c = lane; c < dim; c += 32) ss += xr[c] * xr[c];
  ss = WarpSum(ss);
  const float r = rsqrtf(ss / static_cast<float>(dim) + eps);
  float* o = out + row * dim;
  for (int64_t c = lane; c < dim; c += 32) o[c] = xr[c] * r * w[c];
  if (lane == 0 && rstd != nullptr) rstd[row] = r;
}

// dx = rstd * (w∘dout − x · rstd² · mean(w∘dout∘x)).
__global__ void RmsNormBackwardKernel(float* dx, const float* dout, const float* x, const float* w,
                                      const float* rstd, int64_t rows, int64_t dim) {
  const int64_t row = blockIdx.x * static_cast<int64_t>(kRowsPerBlock) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const float* xr = x + row * dim;
  const float* dr = dout + row * dim;
  float dot = 0.0f;
  for (int64_t c = lane; c < dim; c += 32) dot += w[c] * dr[c] * xr[c];
  dot = WarpSum(dot);
  const float r = rstd[row];
  const float k = r * r * dot / static_cast<float>(dim);
  float* o = dx + row * dim;
  for (int64_t c = lane; c < dim; c += 32) o[c] = r * (w[c] * dr[c] - xr[c] * k);
}

struct RmsNormWeightGradient {
  const float* dout;
  const float* x;
  const float* rstd;
  int64_t dim;
  __device__ float operator()(int64_t r, int64_t c) const {
    return dout[r * dim + c] * x[r * dim + c] * rstd[r];
  }
};

__global__ void LayerNormForwardKernel(float* out, float* mean_out, float* rstd_out, const float* x,
                                       const float* w, const float* b, int64_t rows, int64_t dim,
                                       float eps) {
  const int64_t row = blockIdx.x * static_cast<int64_t>(kRowsPerBlock) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const float* xr = x + row * dim;
  float sum = 0.0f;
  for (int64_t c = lane; c < dim; c += 32) sum += xr[c];
  const float mean = WarpSum(sum) / static_cast<float>(dim);
  float var = 0.0f;
  for (int64_t c = lane; c < dim; c += 32) {
    const float d = xr[c] - mean;
    var += d * d;
  }
  const float r = rsqrtf(WarpSum(var) / static_cast<float>(dim) + eps);
  float* o = out + row * dim;
  for (int64_t c = lane; c < dim; c += 32) {
    o[c] = (xr[c] - mean) * r * w[c] + (b != nullptr ? b[c] : 0.0f);
  }
  if (lane == 0) {
    if (mean_out != nullptr) mean_out[row] = mean;
    if (rstd_out != nullptr) rstd_out[row] = r;
  }
}

// dx = rstd * (g − mean(g) − x̂ · mean(g∘x̂)), g = w∘dout, x̂ = (x − mean) · rstd.
__global__ void LayerNormBackwardKernel(float* dx, const float* dout, const float* x,
                                        const float* w, const float* mean, const float* rstd,
                                        int64_t rows, int64_t dim) {
  const int64_t row = blockIdx.x * static_cast<int64_t>(kRowsPerBlock) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const float* xr = x + row * dim;
  const float* dr = dout + row * dim;
  const float mu = mean[row], r = rstd[row];
  float g_sum = 0.0f, gx_sum = 0.0f;
  for (int64_t c = lane; c < dim; c += 32) {
    const float g = w[c] * dr[c];
    g_sum += g;
    gx_sum += g * (xr[c] - mu) * r;
  }
  const float g_mean = WarpSum(g_sum) / static_cast<float>(dim);
  const float gx_mean = WarpSum(gx_sum) / static_cast<float>(dim);
  float* o = dx + row * dim;
  for (int64_t c = lane; c < dim; c += 32) {
    const float xhat = (xr[c] - mu) * r;
    o[c] = r * (w[c] * dr[c] - g_mean - xhat * gx_mean);
  }
}

struct LayerNormWeightGradient {
  const float* dout;
  const float* x;
  const float* mean;
  const float* rstd;
  int64_t dim;
  __device__ float operator()(int64_t r, int64_t c) const {
    return dout[r * dim + c] * (x[r * dim + c] - mean[r]) * rstd[r];
  }
};

struct LayerNormBiasGradient {
  const float* dout;
  int64_t dim;
  __device__ float operator()(int64_t r, int64_t c) const { return dout[r * dim + c]; }
};

}  // namespace

void RmsNormForward(float* out, float* rstd, const float* x, const float* w, int64_t rows,
                    int64_t dim, float eps, cudaStream_t stream) {
  if (rows <= 0 || dim <= 0) return;
  PARAPLAN_LAUNCH(RmsNormForwardKernel, RowBlocks(rows), kThreads, 0, stream, out, rstd, x, w, rows,
                  dim, eps);
  PARAPLAN_CUDA_CHECK_LAUNCH();
}

void RmsNormBackward(float* dx, float* dw, const float* dout, const float* x, const float* w,
                     const float* rstd, int64_t rows, int64_t dim, cudaStream_t stream) {
  if (rows <= 0 || dim <= 0) return;
  // Weight gradient first: dx may overwrite dout in place.
  ColumnSum(dw, /*accumulate=*/true, rows, dim, RmsNormWeightGradient{dout, x, rstd, dim}, stream);
  if (dx != nullptr) {
    PARAPLAN_LAUNCH(RmsNormBackwardKernel, RowBlocks(rows), kThreads, 0, stream, dx, dout, x, w,
                    rstd, rows, dim);
    PARAPLAN_CUDA_CHECK_LAUNCH();
  }
}

void LayerNormForward(float* out, float* mean, float* rstd, const float* x, const float* w,
                      const float* b, int64_t rows, int64_t dim, float eps, cudaStream_t stream) {
  if (rows <= 0 || dim <= 0) return;
  PARAPLAN_LAUNCH(LayerNormForwardKernel, RowBlocks(rows), kThreads, 0, stream, out, mean, rstd, x,
                  w, b, rows, dim, eps);
  PARAPLAN_CUDA_CHECK_LAUNCH();
}

void LayerNormBackward(float* dx, float* dw, float* db, const float* dout, const float* x,
                       const float* w, const float* mean, const float* rstd, int64_t rows,
                       int64_t dim, cudaStream_t stream) {
  if (rows <= 0 || dim <= 0) return;
  // Parameter gradients first: dx may overwrite dout in place.
  ColumnSum(dw, true, rows, dim, LayerNormWeightGradient{dout, x, mean, rstd, dim}, stream);
  ColumnSum(db, true, rows, dim, LayerNormBiasGradient{dout, dim}, stream);
  if (dx != nullptr) {
    PARAPLAN_LAUNCH(LayerNormBackwardKernel, RowBlocks(rows), kThreads, 0, stream, dx, dout, x, w,
                    mean, rstd, rows, dim);
    PARAPLAN_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace paraplan::cuda
