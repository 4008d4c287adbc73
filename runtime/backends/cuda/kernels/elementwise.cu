// Elementwise, embedding and activation kernels (memory bound: one pass each, fp32).
#include "runtime/backends/cuda/kernels/common.cuh"
#include "runtime/backends/cuda/kernels/kernels.h"

namespace paraplan::cuda {

// Kernel signatures follow the Backend interface (runtime/exec/backend.h) and the host
// specification: tensors as raw pointers and sizes in the specification's order, several of one
// type side by side; every argument is checked against the reference by the kernel tests.
// NOLINTBEGIN(bugprone-easily-swappable-parameters)
namespace {

// Elementwise maps: element i of the outputs from element i of the inputs, by one functor
// `f(const float (&in)[kIn], float (&out)[kOut])`. Where every pointer is 16-byte aligned a thread
// takes four consecutive elements with one 16-byte load per input and one store per output
// (a quarter of the memory instructions, which an H200 needs to approach its bandwidth), and the
// last n mod 4 elements one at a time; otherwise all one at a time. Each element goes through the
// same f either way, so the results are the same bits on every path. An output may be an input
// (in place): each element is read before it is written, by the same thread. The loops over
// operands and lanes have constant trip counts, which nvcc unrolls into registers.
template <int kIn, int kOut>
struct MapPointers {
  const float* in[kIn];
  float* out[kOut];
};

template <typename F>
__device__ __forceinline__ void MapOne(const MapPointers<F::kIn, F::kOut>& p, int64_t i,
                                       const F& f) {
  constexpr int kIn = F::kIn, kOut = F::kOut;
  float x[kIn], y[kOut];
  for (int k = 0; k < kIn; ++k) x[k] = p.in[k][i];
  f(x, y);
  for (int k = 0; k < kOut; ++k) p.out[k][i] = y[k];
}

// F names its arity (F::kIn, F::kOut), so that a kernel has one template argument.
template <typename F>
__global__ void MapKernel(MapPointers<F::kIn, F::kOut> p, int64_t n, bool by_four, F f) {
  constexpr int kIn = F::kIn, kOut = F::kOut;
  if (!by_four) {
    PARAPLAN_GRID_STRIDE(i, n) MapOne(p, i, f);
    return;
  }
  const int64_t quads = n / 4;
  PARAPLAN_GRID_STRIDE(q, quads) {
    float4 x4[kIn], y4[kOut];
    for (int k = 0; k < kIn; ++k) x4[k] = reinterpret_cast<const float4*>(p.in[k])[q];
    for (int lane = 0; lane < 4; ++lane) {
      float x[kIn], y[kOut];
      for (int k = 0; k < kIn; ++k) x[k] = reinterpret_cast<const float*>(&x4[k])[lane];
      f(x, y);
      for (int k = 0; k < kOut; ++k) reinterpret_cast<float*>(&y4[k])[lane] = y[k];
    }
    for (int k = 0; k < kOut; ++k) reinterpret_cast<float4*>(p.out[k])[q] = y4[k];
  }
  PARAPLAN_GRID_STRIDE(t, n - quads * 4) MapOne(p, quads * 4 + t, f);
}

template <typename F>
void Map(const MapPointers<F::kIn, F::kOut>& p, int64_t n, const F& f, cudaStream_t stream) {
  if (n <= 0) return;
  bool by_four = true;
  for (const float* x : p.in) by_four &= reinterpret_cast<uintptr_t>(x) % 16 == 0;
  for (const float* y : p.out) by_four &= reinterpret_cast<uintptr_t>(y) % 16 == 0;
  PARAPLAN_LAUNCH(MapKernel<F>, GridFor(by_four ? std::max<int64_t>(n / 4, 1) : n), kThreads, 0,
                  stream, p, n, by_four, f);
  PARAPLAN_CUDA_CHECK_LAUNCH();
}

// Fill stores only: 16 bytes per thread where aligned, as the maps.
__global__ void FillKernel(float* x, int64_t n, float value, bool by_four) {
  if (!by_four) {
    PARAPLAN_GRID_STRIDE(i, n) x[i] = value;
    return;
  }
  const int64_t quads = n / 4;
  PARAPLAN_GRID_STRIDE(q, quads) {
    reinterpret_cast<float4*>(x)[q] = make_float4(value, value, value, value);
  }
  PARAPLAN_GRID_STRIDE(t, n - quads * 4) x[quads * 4 + t] = value;
}
struct AddOp {
  static constexpr int kIn = 2, kOut = 1;
  __device__ void operator()(const float (&x)[2], float (&y)[1]) const { y[0] = x[0] + x[1]; }
};
struct ScaleOp {
  static constexpr int kIn = 1, kOut = 1;
  float alpha;
  __device__ void operator()(const float (&x)[1], float (&y)[1]) const { y[0] = x[0] * alpha; }
};

__global__ void CopyColumnsKernel(float* y, const float* x, int64_t rows, ColumnMap map,
                                  bool accumulate) {
  PARAPLAN_GRID_STRIDE(i, rows * map.width) {
    const int64_t r = i / map.width, j = i % map.width;
    const float* from = x + r * map.x_cols + map.x_offset + j;
    float* to = y + r * map.y_cols + map.y_offset + j;
    for (int64_t g = 0; g < map.groups; ++g) {
      const float v = from[g * map.x_stride];
      if (accumulate)
        to[g * map.y_stride] += v;
      else
        to[g * map.y_stride] = v;
    }
  }
}

__global__ void CastToBf16Kernel(__nv_bfloat16* dst, const float* src, int64_t n) {
  // Pairs where possible: a 4-byte store instead of two 2-byte ones.
  const int64_t pairs = n / 2;
  PARAPLAN_GRID_STRIDE(i, pairs) {
    float2 v = reinterpret_cast<const float2*>(src)[i];
    reinterpret_cast<__nv_bfloat162*>(dst)[i] = __floats2bfloat162_rn(v.x, v.y);
  }
  if (n % 2 == 1 && blockIdx.x == 0 && threadIdx.x == 0)
    dst[n - 1] = __float2bfloat16_rn(src[n - 1]);
}

// Four at a time (src 16-byte and dst 8-byte aligned): one 16-byte load and one 8-byte store.
struct Bf16Quad {
  __nv_bfloat162 lo, hi;
};

__global__ void CastToBf16QuadKernel(__nv_bfloat16* dst, const float* src, int64_t n) {
  const int64_t quads = n / 4;
  PARAPLAN_GRID_STRIDE(q, quads) {
    const float4 v = reinterpret_cast<const float4*>(src)[q];
    reinterpret_cast<Bf16Quad*>(dst)[q] =
        Bf16Quad{__floats2bfloat162_rn(v.x, v.y), __floats2bfloat162_rn(v.z, v.w)};
  }
  PARAPLAN_GRID_STRIDE(t, n - quads * 4)
  dst[quads * 4 + t] = __float2bfloat16_rn(src[quads * 4 + t]);
}

__global__ void CastToBf16ScalarKernel(__nv_bfloat16* dst, const float* src, int64_t n) {
  PARAPLAN_GRID_STRIDE(i, n) dst[i] = __float2bfloat16_rn(src[i]);
}

__global__ void AddBiasKernel(float* y, const float* bias, int64_t rows, int64_t cols) {
  PARAPLAN_GRID_STRIDE(i, rows * cols) y[i] += bias[i % cols];
}

struct BiasGradient {
  const float* dy;
  int64_t cols;
  __device__ float operator()(int64_t r, int64_t c) const { return dy[r * cols + c]; }
};

__global__ void EmbeddingForwardKernel(float* out, const int32_t* tokens, const float* table,
                                       int64_t rows, int64_t dim, int64_t vocab_begin,
                                       int64_t vocab_count) {
  PARAPLAN_GRID_STRIDE(i, rows * dim) {
    const int64_t r = i / dim, c = i % dim;
    const int64_t t = static_cast<int64_t>(tokens[r]) - vocab_begin;
    out[i] = (t >= 0 && t < vocab_count) ? table[t * dim + c] : 0.0f;
  }
}

// One block per row r. The block exits unless r is the first row holding its token; the owner
// then adds every row with that token, in increasing row order, into the table row.
__global__ void EmbeddingBackwardKernel(float* dtable, const float* dout, const int32_t* tokens,
                                        int64_t rows, int64_t dim, int64_t vocab_begin,
                                        int64_t vocab_count) {
  __shared__ SharedArray<int64_t, kThreads> matches;
  __shared__ int match_count;
  const int64_t r = blockIdx.x;
  const int32_t token = tokens[r];
  const int64_t t = static_cast<int64_t>(token) - vocab_begin;
  if (t < 0 || t >= vocab_count) return;
  // Is there an earlier row with the same token?
  int earlier = 0;
  for (int64_t j = threadIdx.x; j < r; j += blockDim.x) earlier |= tokens[j] == token;
  if (__syncthreads_or(earlier)) return;
  float* dst = dtable + t * dim;
  for (int64_t chunk = r; chunk < rows; chunk += blockDim.x) {
    if (threadIdx.x == 0) match_count = 0;
    __syncthreads();
    const int64_t j = chunk + threadIdx.x;
    const bool hit = j < rows && tokens[j] == token;
    // Compact the hits of this chunk in row order: warp ballots, then warps in order.
    const unsigned ballot = __ballot_sync(0xffffffffu, hit);
    __shared__ SharedArray<int, kThreads / 32> warp_base;
    if (threadIdx.x % 32 == 0) warp_base[threadIdx.x / 32] = __popc(ballot);
    __syncthreads();
    if (threadIdx.x == 0) {
      int base = 0;
      for (int w = 0; w < static_cast<int>(blockDim.x / 32); ++w) {
        const int c = warp_base[w];
        warp_base[w] = base;
        base += c;
      }
      match_count = base;
    }
    __syncthreads();
    if (hit) {
      const int lane = threadIdx.x % 32;
      matches[warp_base[threadIdx.x / 32] + __popc(ballot & ((1u << lane) - 1u))] = j;
    }
    __syncthreads();
    for (int64_t c = threadIdx.x; c < dim; c += blockDim.x) {
      float acc = dst[c];
      for (int m = 0; m < match_count; ++m) acc += dout[matches[m] * dim + c];
      dst[c] = acc;
    }
    __syncthreads();
  }
}

__global__ void AddPositionKernel(float* y, const float* x, const float* pos, int64_t rows,
                                  int64_t dim, int64_t t0, int64_t seq) {
  PARAPLAN_GRID_STRIDE(i, rows * dim) {
    const int64_t r = i / dim, c = i % dim;
    y[i] = x[i] + pos[((t0 + r) % seq) * dim + c];
  }
}

// One thread per (position p, column c): adds the rows r with (t0 + r) mod seq = p in
// increasing r, as the host does.
__global__ void AddPositionBackwardKernel(float* dpos, const float* dy, int64_t rows, int64_t dim,
                                          int64_t t0, int64_t seq) {
  PARAPLAN_GRID_STRIDE(i, seq * dim) {
    const int64_t p = i / dim, c = i % dim;
    const int64_t first = ((p - t0 % seq) % seq + seq) % seq;
    if (first >= rows) continue;
    float acc = dpos[i];
    for (int64_t r = first; r < rows; r += seq) acc += dy[r * dim + c];
    dpos[i] = acc;
  }
}

__device__ __forceinline__ float Sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

struct SwiGluForwardOp {  // in: gate, up
  static constexpr int kIn = 2, kOut = 1;
  __device__ void operator()(const float (&x)[2], float (&y)[1]) const {
    const float g = x[0];
    y[0] = g * Sigmoid(g) * x[1];
  }
};

struct SwiGluBackwardOp {  // in: dout, gate, up; out: dgate, dup
  static constexpr int kIn = 3, kOut = 2;
  __device__ void operator()(const float (&x)[3], float (&y)[2]) const {
    const float d = x[0], g = x[1], u = x[2], sg = Sigmoid(g);
    y[1] = d * g * sg;
    y[0] = d * u * sg * (1.0f + g * (1.0f - sg));
  }
};

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)

struct GeluForwardOp {
  static constexpr int kIn = 1, kOut = 1;
  __device__ void operator()(const float (&x)[1], float (&y)[1]) const {
    const float v = x[0];
    y[0] = 0.5f * v * (1.0f + tanhf(kGeluScale * (v + 0.044715f * v * v * v)));
  }
};

struct GeluBackwardOp {  // in: dout, x
  static constexpr int kIn = 2, kOut = 1;
  __device__ void operator()(const float (&x)[2], float (&y)[1]) const {
    const float v = x[1];
    const float u = kGeluScale * (v + 0.044715f * v * v * v);
    const float t = tanhf(u);
    const float du = kGeluScale * (1.0f + 3.0f * 0.044715f * v * v);
    y[0] = x[0] * (0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * du);
  }
};

struct SquaredReluForwardOp {
  static constexpr int kIn = 1, kOut = 1;
  __device__ void operator()(const float (&x)[1], float (&y)[1]) const {
    const float r = fmaxf(x[0], 0.0f);
    y[0] = r * r;
  }
};

struct SquaredReluBackwardOp {  // in: dout, x
  static constexpr int kIn = 2, kOut = 1;
  __device__ void operator()(const float (&x)[2], float (&y)[1]) const {
    y[0] = x[0] * (2.0f * fmaxf(x[1], 0.0f));
  }
};

struct RankPointers {
  float* out[kMaxLocalRanks];
  const float* in[kMaxLocalRanks];
};

template <bool kMax>
__global__ void ReduceAcrossRanksKernel(RankPointers p, int out_count, int ranks, int64_t begin,
                                        int64_t end) {
  PARAPLAN_GRID_STRIDE(k, end - begin) {
    const int64_t i = begin + k;
    float acc = p.in[0][i];
    for (int r = 1; r < ranks; ++r) acc = kMax ? fmaxf(acc, p.in[r][i]) : acc + p.in[r][i];
    for (int o = 0; o < out_count; ++o) p.out[o][i] = acc;
  }
}

template <bool kMax>
void ReduceAcrossRanks(float* const* out, int out_count, const float* const* in, int ranks,
                       int64_t begin, int64_t end, cudaStream_t stream) {
  if (ranks < 1 || ranks > kMaxLocalRanks || out_count < 1 || out_count > kMaxLocalRanks) {
    throw CudaError("local collective: rank count out of range");
  }
  if (end <= begin) return;
  RankPointers p{};
  for (int r = 0; r < ranks; ++r) p.in[r] = in[r];
  for (int o = 0; o < out_count; ++o) p.out[o] = out[o];
  PARAPLAN_LAUNCH(ReduceAcrossRanksKernel<kMax>, GridFor(end - begin), kThreads, 0, stream, p,
                  out_count, ranks, begin, end);
  PARAPLAN_CUDA_CHECK_LAUNCH();
}

}  // namespace

void Fill(float* x, int64_t n, float value, cudaStream_t stream) {
  if (n <= 0) return;
  const bool by_four = reinterpret_cast<uintptr_t>(x) % 16 == 0;
  PARAPLAN_LAUNCH(FillKernel, GridFor(by_four ? std::max<int64_t>(n / 4, 1) : n), kThreads, 0,
                  stream, x, n, value, by_four);
  PARAPLAN_CUDA_CHECK_LAUNCH();
}

void Copy(float* dst, const float* src, int64_t n, cudaStream_t stream) {
  if (n <= 0 || dst == src) return;
  PARAPLAN_CUDA_CHECK(
      cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice, stream));
}

void CopyColumns(float* y, const float* x, int64_t rows, const ColumnMap& map, bool accumulate,
                 cudaStream_t stream) {
  if (rows <= 0 || map.width <= 0 || map.groups <= 0) return;
  PARAPLAN_LAUNCH(CopyColumnsKernel, GridFor(rows * map.width), kThreads, 0, stream, y, x, rows,
                  map, accumulate);
  PARAPLAN_CUDA_CHECK_LAUNCH();
}

void Add(float* out, const float* a, const float* b, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  Map({{a, b}, {out}}, n, AddOp{}, stream);
}

void Accumulate(float* y, const float* x, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  Map({{y, x}, {y}}, n, AddOp{}, stream);
}

void Scale(float* x, int64_t n, float alpha, cudaStream_t stream) {
  if (n <= 0) return;
  Map({{x}, {x}}, n, ScaleOp{alpha}, stream);
}

void CastToBf16(void* dst_bf16, const float* src, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  auto* dst = static_cast<__nv_bfloat16*>(dst_bf16);
  const bool aligned =
      reinterpret_cast<uintptr_t>(src) % 8 == 0 && reinterpret_cast<uintptr_t>(dst) % 4 == 0;
  if (reinterpret_cast<uintptr_t>(src) % 16 == 0 && reinterpret_cast<uintptr_t>(dst) % 8 == 0) {
    PARAPLAN_LAUNCH(CastToBf16QuadKernel, GridFor(std::max<int64_t>(n / 4, 1)), kThreads, 0, stream,
                    dst, src, n);
  } else if (aligned) {
    PARAPLAN_LAUNCH(CastToBf16Kernel, GridFor(std::max<int64_t>(n / 2, 1)), kThreads, 0, stream,
                    dst, src, n);
  } else {
    PARAPLAN_LAUNCH(CastToBf16ScalarKernel, GridFor(n), kThreads, 0, stream, dst, src, n);
  }
  PARAPLAN_CUDA_CHECK_LAUNCH();
}

void AddBias(float* y, const float* bias, int64_t rows, int64_t cols, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0 || bias == nullptr) return;
  PARAPLAN_LAUNCH(AddBiasKernel, GridFor(rows * cols), kThreads, 0, stream, y, bias, rows, cols);
  PARAPLAN_CUDA_CHECK_LAUNCH();
}

void BiasBackward(float* dbias, const float* dy, int64_t rows, int64_t cols, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0 || dbias == nullptr) return;
  ColumnSum(dbias, /*accumulate=*/true, rows, cols, BiasGradient{dy, cols}, stream);
}

void EmbeddingForward(float* out, const int32_t* tokens, const float* table, int64_t rows,
                      int64_t dim, int64_t vocab_begin, int64_t vocab_count, cudaStream_t stream) {
  if (rows <= 0 || dim <= 0) return;
  PARAPLAN_LAUNCH(EmbeddingForwardKernel, GridFor(rows * dim), kThreads, 0, stream, out, tokens,
                  table, rows, dim, vocab_begin, vocab_count);
  PARAPLAN_CUDA_CHECK_LAUNCH();
}

void EmbeddingBackward(float* dtable, const float* dout, const int32_t* tokens, int64_t rows,
                       int64_t dim, int64_t vocab_begin, int64_t vocab_count, cudaStream_t stream) {
  if (rows <= 0 || dim <= 0) return;
  if (rows > 0x7fffffff) throw CudaError("EmbeddingBackward: more than 2^31 rows");
  PARAPLAN_LAUNCH(EmbeddingBackwardKernel, static_cast<unsigned>(rows), kThreads, 0, stream, dtable,
                  dout, tokens, rows, dim, vocab_begin, vocab_count);
  PARAPLAN_CUDA_CHECK_LAUNCH();
}

void AddPosition(float* y, const float* x, const float* pos, int64_t rows, int64_t dim, int64_t t0,
                 int64_t seq, cudaStream_t stream) {
  if (rows <= 0 || dim <= 0) return;
  if (seq <= 0 || t0 < 0) throw CudaError("AddPosition: seq must be positive and t0 non-negative");
  PARAPLAN_LAUNCH(AddPositionKernel, GridFor(rows * dim), kThreads, 0, stream, y, x, pos, rows, dim,
                  t0, seq);
  PARAPLAN_CUDA_CHECK_LAUNCH();
}

void AddPositionBackward(float* dpos, const float* dy, int64_t rows, int64_t dim, int64_t t0,
                         int64_t seq, cudaStream_t stream) {
  if (rows <= 0 || dim <= 0) return;
  if (seq <= 0 || t0 < 0)
    throw CudaError("AddPositionBackward: seq must be positive and t0 non-negative");
  PARAPLAN_LAUNCH(AddPositionBackwardKernel, GridFor(seq * dim), kThreads, 0, stream, dpos, dy,
                  rows, dim, t0, seq);
  PARAPLAN_CUDA_CHECK_LAUNCH();
}

void SwiGluForward(float* out, const float* gate, const float* up, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  Map({{gate, up}, {out}}, n, SwiGluForwardOp{}, stream);
}

void SwiGluBackward(float* dgate, float* dup, const float* dout, const float* gate, const float* up,
                    int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  Map({{dout, gate, up}, {dgate, dup}}, n, SwiGluBackwardOp{}, stream);
}

void GeluForward(float* out, const float* x, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  Map({{x}, {out}}, n, GeluForwardOp{}, stream);
}

void GeluBackward(float* dx, const float* dout, const float* x, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  Map({{dout, x}, {dx}}, n, GeluBackwardOp{}, stream);
}

void SquaredReluForward(float* out, const float* x, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  Map({{x}, {out}}, n, SquaredReluForwardOp{}, stream);
}

void SquaredReluBackward(float* dx, const float* dout, const float* x, int64_t n,
                         cudaStream_t stream) {
  if (n <= 0) return;
  Map({{dout, x}, {dx}}, n, SquaredReluBackwardOp{}, stream);
}

void SumAcrossRanks(float* const* out, int out_count, const float* const* in, int ranks,
                    int64_t begin, int64_t end, cudaStream_t stream) {
  ReduceAcrossRanks<false>(out, out_count, in, ranks, begin, end, stream);
}

void MaxAcrossRanks(float* const* out, int out_count, const float* const* in, int ranks,
                    int64_t begin, int64_t end, cudaStream_t stream) {
  ReduceAcrossRanks<true>(out, out_count, in, ranks, begin, end, stream);
}

// NOLINTEND(bugprone-easily-swappable-parameters)

}  // namespace paraplan::cuda
