// Device helpers shared by the .cu files of the CUDA backend: launch sizes, warp and block
// reductions. Included only by .cu files.
#ifndef PARAPLAN_RUNTIME_BACKENDS_CUDA_KERNELS_COMMON_CUH_
#define PARAPLAN_RUNTIME_BACKENDS_CUDA_KERNELS_COMMON_CUH_

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "runtime/backends/cuda/kernels/cuda_check.h"
#include "runtime/backends/cuda/kernels/launch.cuh"

namespace paraplan::cuda {

constexpr int kThreads = 256;

// Blocks for a grid-stride loop over n elements: enough to fill the GPU, never more than n needs.
inline unsigned GridFor(int64_t n, int threads = kThreads) {
  int64_t blocks = (n + threads - 1) / threads;
  return static_cast<unsigned>(std::clamp<int64_t>(blocks, 1, 65535 * 8));
}

__device__ __forceinline__ float WarpSum(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

__device__ __forceinline__ float WarpMax(float v) {
  for (int offset = 16; offset > 0; offset >>= 1)
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
// The order is fixed by the thread layout, so the result is deterministic.
// `shared32` is a __shared__ SharedArray<float, 32>.
template <typename Shared32>
__device__ __forceinline__ float BlockSum(float v, Shared32& shared32) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  v = WarpSum(v);
  __syncthreads();  // shared32 may still be read by a previous call
  if (lane == 0) shared32[warp] = v;
  __syncthreads();
  float total = lane < warps ? shared32[lane] : 0.0f;
  return WarpSum(total);
}

template <typename Shared32>
__device__ __forceinline__ float BlockMax(float v, Shared32& shared32) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  v = WarpMax(v);
  __syncthreads();
  if (lane == 0) shared32[warp] = v;
  __syncthreads();
  float total = lane < warps ? shared32[lane] : -INFINITY;
  return WarpMax(total);
}

// Stream-ordered scratch memory from the device's pool (cudaMallocAsync): cheap after the first
// step because the backend raises the pool's release threshold. Freed in stream order.
class StreamScratch {
 public:
  StreamScratch(int64_t bytes, cudaStream_t stream) : stream_(stream) {
    PARAPLAN_CUDA_CHECK(
        cudaMallocAsync(&ptr_, static_cast<size_t>(std::max<int64_t>(bytes, 16)), stream));
  }
  ~StreamScratch() { cudaFreeAsync(ptr_, stream_); }
  StreamScratch(const StreamScratch&) = delete;
  StreamScratch& operator=(const StreamScratch&) = delete;
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }

 private:
  void* ptr_ = nullptr;
  cudaStream_t stream_;
};

// Deterministic column sums: out[c] (+)= Σ_r f(r, c) over rows in fixed chunks. Each
// (32-column tile, row chunk) block adds its rows in a fixed lane order into partials; a second
// kernel adds the chunks in chunk order. No atomics, so the bits never depend on timing.
template <typename F>
__global__ void ColumnPartialKernel(float* partials, int64_t rows, int64_t cols,
                                    int64_t rows_per_chunk, F f) {
  __shared__ SharedArray<float, 8, 33> lanes;
  const int64_t col = blockIdx.x * 32 + threadIdx.x;
  const int64_t r0 = blockIdx.y * rows_per_chunk;
  const int64_t r1 = r0 + rows_per_chunk < rows ? r0 + rows_per_chunk : rows;
  float sum = 0.0f;
  if (col < cols) {
    for (int64_t r = r0 + threadIdx.y; r < r1; r += 8) sum += f(r, col);
  }
  lanes[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y == 0 && col < cols) {
    float total = 0.0f;
    for (int j = 0; j < 8; ++j) total += lanes[j][threadIdx.x];
    partials[blockIdx.y * cols + col] = total;
  }
}

// A template so that every .cu file has its own copy (no relocatable device code needed).
template <int kUnused = 0>
__global__ void ColumnFinishKernel(float* out, const float* partials, int chunks, int64_t cols,
                                   bool accumulate) {
  const int64_t col = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (col >= cols) return;
  float total = 0.0f;
  for (int ch = 0; ch < chunks; ++ch) total += partials[ch * cols + col];
  out[col] = accumulate ? out[col] + total : total;
}

template <typename F>
void ColumnSum(float* out, bool accumulate, int64_t rows, int64_t cols, F f, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0 || out == nullptr) return;
  const int64_t tiles = (cols + 31) / 32;
  // Enough blocks to fill the GPU (about 2 waves of 132 SMs), at least 64 rows each.
  int64_t chunks = std::clamp<int64_t>((264 + tiles - 1) / tiles, 1, (rows + 63) / 64);
  chunks = std::min<int64_t>(chunks, 65535);
  const int64_t per_chunk = (rows + chunks - 1) / chunks;
  chunks = (rows + per_chunk - 1) / per_chunk;
  StreamScratch partials(chunks * cols * static_cast<int64_t>(sizeof(float)), stream);
  PARAPLAN_LAUNCH(ColumnPartialKernel<F>,
                  dim3(static_cast<unsigned>(tiles), static_cast<unsigned>(chunks)), dim3(32, 8), 0,
                  stream, partials.as<float>(), rows, cols, per_chunk, f);
  PARAPLAN_CUDA_CHECK(cudaGetLastError());
  PARAPLAN_LAUNCH(ColumnFinishKernel<0>, static_cast<unsigned>((cols + 255) / 256), 256, 0, stream,
                  out, partials.as<float>(), static_cast<int>(chunks), cols, accumulate);
  PARAPLAN_CUDA_CHECK(cudaGetLastError());
}

#define PARAPLAN_GRID_STRIDE(i, n)                                                       \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)

}  // namespace paraplan::cuda

#endif  // PARAPLAN_RUNTIME_BACKENDS_CUDA_KERNELS_COMMON_CUH_
