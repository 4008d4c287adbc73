// The chunk-pair pieces of ring attention (context parallelism), fp32: one query chunk against
// one K/V chunk with the causal mask (and a sliding window's) on global positions (online softmax),
// the log-sum-exp merge of partial results, and the pair's backward from the final output. One warp
// per query row and head (forward, dQ) or per key row and KV head (dK, dV): lanes split head_dim,
// dot products are warp sums in a fixed order, and nothing is accumulated with atomics
// (deterministic).
#include <cmath>
#include <string>

#include "runtime/backends/cuda/kernels/common.cuh"
#include "runtime/backends/cuda/kernels/kernels.h"

namespace paraplan::cuda {

// NOLINTBEGIN(bugprone-easily-swappable-parameters)
namespace {

constexpr int kRingWarps = 4;
constexpr int kRingThreads = kRingWarps * 32;
constexpr int kPerLane = 8;                              // head_dim <= 32 · kPerLane
constexpr int64_t kMaxHeadDim = int64_t{32} * kPerLane;  // 256

struct RingShape {
  TokenLayout q, kv;
  int64_t q_heads, kv_heads, head_dim;
  float scale;
  int64_t window;  // sliding window in keys, 0 = none
};

__device__ __forceinline__ int64_t Row(const TokenLayout& l, int64_t s, int64_t b) {
  return s * l.seq_stride + b * l.batch_stride;
}

// Σ_d a[d] · b[d] over the warp (every lane gets it).
__device__ __forceinline__ float WarpDot(const float* a, const float* b, int64_t n, int lane) {
  float s = 0.0f;
  for (int64_t d = lane; d < n; d += 32) s += a[d] * b[d];
  return WarpSum(s);
}

__device__ __forceinline__ int64_t Clamp(int64_t x, int64_t lo, int64_t hi) {
  return x < lo ? lo : (x > hi ? hi : x);
}

// Keys of the K/V chunk that a query at global position `pos` sees: local [lo, n) (lo > 0 only
// under a sliding window, which starts at pos - window + 1).
struct KeyRange {
  int64_t lo, n;
};
__device__ __forceinline__ KeyRange VisibleKeys(int64_t pos, const TokenLayout& kv,
                                                int64_t window) {
  const int64_t n = Clamp(pos - kv.seq_offset + 1, 0, kv.seq);
  return {window > 0 ? Clamp(pos - window + 1 - kv.seq_offset, 0, n) : 0, n};
}

__global__ void __launch_bounds__(kRingThreads)
    AttentionBlockForwardKernel(float* out, float* lse, const float* q, const float* k,
                                const float* v, RingShape s) {
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kRingWarps;
  const int64_t items = s.q.batch * s.q.seq * s.q_heads, hd = s.head_dim;
  const int64_t group = s.q_heads / s.kv_heads;
  for (int64_t w = blockIdx.x * int64_t{kRingWarps} + threadIdx.x / 32; w < items; w += warps) {
    const int64_t h = w % s.q_heads, t = (w / s.q_heads) % s.q.seq, b = w / s.q_heads / s.q.seq;
    const int64_t i = Row(s.q, t, b) * s.q_heads + h, g = h / group;
    const auto [lo, n] = VisibleKeys(s.q.seq_offset + t, s.kv, s.window);
    const float* qr = q + i * hd;
    float acc[kPerLane] = {};
    float m = -INFINITY, sum = 0.0f;
    for (int64_t j = lo; j < n; ++j) {
      const int64_t kv_i = Row(s.kv, j, b) * s.kv_heads + g;
      const float x = WarpDot(qr, k + kv_i * hd, hd, lane) * s.scale;
      const float m_new = fmaxf(m, x);
      const float keep = expf(m - m_new), p = expf(x - m_new);
      sum = sum * keep + p;
      const float* vr = v + kv_i * hd;
      for (int c = 0; c < kPerLane; ++c) {
        const int64_t d = lane + 32 * c;
        if (d < hd) acc[c] = acc[c] * keep + p * vr[d];
      }
      m = m_new;
    }
    float* o = out + i * hd;
    for (int c = 0; c < kPerLane; ++c) {
      const int64_t d = lane + 32 * c;
      if (d < hd) o[d] = lo == n ? 0.0f : acc[c] / sum;
    }
    if (lane == 0) lse[i] = lo == n ? -INFINITY : m + logf(sum);
  }
}

__global__ void AttentionMergeBlocksKernel(float* out, float* lse, const float* block_out,
                                           const float* block_lse, TokenLayout l, int64_t q_heads,
                                           int64_t head_dim) {
  PARAPLAN_GRID_STRIDE(w, l.batch * l.seq * q_heads) {
    const int64_t h = w % q_heads, t = (w / q_heads) % l.seq, b = w / q_heads / l.seq;
    const int64_t i = Row(l, t, b) * q_heads + h;
    const float a = lse[i], c = block_lse[i];
    if (c == -INFINITY) continue;
    float* o = out + i * head_dim;
    const float* bo = block_out + i * head_dim;
    if (a == -INFINITY) {
      for (int64_t d = 0; d < head_dim; ++d) o[d] = bo[d];
      lse[i] = c;
      continue;
    }
    const float m = fmaxf(a, c);
    const float merged = m + logf(expf(a - m) + expf(c - m));
    const float wa = expf(a - merged), wc = expf(c - merged);
    for (int64_t d = 0; d < head_dim; ++d) o[d] = wa * o[d] + wc * bo[d];
    lse[i] = merged;
  }
}

__global__ void __launch_bounds__(kRingThreads)
    AttentionBlockBackwardQueryKernel(float* dq, const float* dout, const float* out,
                                      const float* lse, const float* q, const float* k,
                                      const float* v, RingShape s) {
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kRingWarps;
  const int64_t items = s.q.batch * s.q.seq * s.q_heads, hd = s.head_dim;
  const int64_t group = s.q_heads / s.kv_heads;
  for (int64_t w = blockIdx.x * int64_t{kRingWarps} + threadIdx.x / 32; w < items; w += warps) {
    const int64_t h = w % s.q_heads, t = (w / s.q_heads) % s.q.seq, b = w / s.q_heads / s.q.seq;
    const int64_t i = Row(s.q, t, b) * s.q_heads + h, g = h / group;
    const auto [lo, n] = VisibleKeys(s.q.seq_offset + t, s.kv, s.window);
    if (lo == n) continue;
    const float* qr = q + i * hd;
    const float* gr = dout + i * hd;
    const float delta = WarpDot(gr, out + i * hd, hd, lane), l = lse[i];
    float acc[kPerLane] = {};
    for (int64_t j = lo; j < n; ++j) {
      const int64_t kv_i = Row(s.kv, j, b) * s.kv_heads + g;
      const float* kr = k + kv_i * hd;
      const float p = expf(WarpDot(qr, kr, hd, lane) * s.scale - l);
      const float ds = p * (WarpDot(gr, v + kv_i * hd, hd, lane) - delta) * s.scale;
      for (int c = 0; c < kPerLane; ++c) {
        const int64_t d = lane + 32 * c;
        if (d < hd) acc[c] += ds * kr[d];
      }
    }
    float* dqr = dq + i * hd;
    for (int c = 0; c < kPerLane; ++c) {
      const int64_t d = lane + 32 * c;
      if (d < hd) dqr[d] += acc[c];
    }
  }
}

__global__ void __launch_bounds__(kRingThreads)
    AttentionBlockBackwardKeyValueKernel(float* dk, float* dv, const float* dout, const float* out,
                                         const float* lse, const float* q, const float* k,
                                         const float* v, RingShape s) {
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kRingWarps;
  const int64_t items = s.kv.batch * s.kv.seq * s.kv_heads, hd = s.head_dim;
  const int64_t group = s.q_heads / s.kv_heads;
  for (int64_t w = blockIdx.x * int64_t{kRingWarps} + threadIdx.x / 32; w < items; w += warps) {
    const int64_t g = w % s.kv_heads, j = (w / s.kv_heads) % s.kv.seq,
                  b = w / s.kv_heads / s.kv.seq;
    const int64_t kv_i = Row(s.kv, j, b) * s.kv_heads + g;
    const float* kr = k + kv_i * hd;
    const float* vr = v + kv_i * hd;
    // Queries at global positions >= this key's (and, under a sliding window, before this key's
    // + window): local [first, last).
    const int64_t from = s.kv.seq_offset + j - s.q.seq_offset;
    const int64_t first = Clamp(from, 0, s.q.seq);
    const int64_t last = s.window > 0 ? Clamp(from + s.window, first, s.q.seq) : s.q.seq;
    float dk_acc[kPerLane] = {}, dv_acc[kPerLane] = {};
    for (int64_t h = g * group; h < (g + 1) * group; ++h) {
      for (int64_t t = first; t < last; ++t) {
        const int64_t i = Row(s.q, t, b) * s.q_heads + h;
        const float* qr = q + i * hd;
        const float* gr = dout + i * hd;
        const float delta = WarpDot(gr, out + i * hd, hd, lane);
        const float p = expf(WarpDot(qr, kr, hd, lane) * s.scale - lse[i]);
        const float ds = p * (WarpDot(gr, vr, hd, lane) - delta) * s.scale;
        for (int c = 0; c < kPerLane; ++c) {
          const int64_t d = lane + 32 * c;
          if (d < hd) {
            dk_acc[c] += ds * qr[d];
            dv_acc[c] += p * gr[d];
          }
        }
      }
    }
    for (int c = 0; c < kPerLane; ++c) {
      const int64_t d = lane + 32 * c;
      if (d < hd) {
        dk[kv_i * hd + d] += dk_acc[c];
        dv[kv_i * hd + d] += dv_acc[c];
      }
    }
  }
}

void CheckRingArguments(const TokenLayout& q, const TokenLayout& kv, int64_t q_heads,
                        int64_t kv_heads, int64_t head_dim) {
  if (head_dim <= 0 || head_dim > kMaxHeadDim) {
    throw CudaError("CUDA ring attention supports head_dim 1 to " + std::to_string(kMaxHeadDim) +
                    ", not " + std::to_string(head_dim));
  }
  if (q_heads <= 0 || kv_heads <= 0 || q_heads % kv_heads != 0)
    throw CudaError("CUDA ring attention: q_heads must be a positive multiple of kv_heads");
  if (q.batch != kv.batch)
    throw CudaError("CUDA ring attention: query and key chunks cover different batches");
}

unsigned WarpGrid(int64_t items) { return GridFor(items * 32, kRingThreads); }

}  // namespace

void AttentionBlockForward(float* out, float* lse, const float* q, const float* k, const float* v,
                           const TokenLayout& q_layout, const TokenLayout& kv_layout,
                           int64_t q_heads, int64_t kv_heads, int64_t head_dim, float scale,
                           int64_t window, cudaStream_t stream) {
  CheckRingArguments(q_layout, kv_layout, q_heads, kv_heads, head_dim);
  const RingShape shape{q_layout, kv_layout, q_heads, kv_heads, head_dim, scale, window};
  const int64_t items = q_layout.batch * q_layout.seq * q_heads;
  if (items == 0) return;
  PARAPLAN_LAUNCH(AttentionBlockForwardKernel, WarpGrid(items), kRingThreads, 0, stream, out, lse,
                  q, k, v, shape);
  PARAPLAN_CUDA_CHECK_LAUNCH();
}

void AttentionMergeBlocks(float* out, float* lse, const float* block_out, const float* block_lse,
                          const TokenLayout& layout, int64_t q_heads, int64_t head_dim,
                          cudaStream_t stream) {
  const int64_t items = layout.batch * layout.seq * q_heads;
  if (items == 0) return;
  PARAPLAN_LAUNCH(AttentionMergeBlocksKernel, GridFor(items), kThreads, 0, stream, out, lse,
                  block_out, block_lse, layout, q_heads, head_dim);
  PARAPLAN_CUDA_CHECK_LAUNCH();
}

void AttentionBlockBackward(float* dq, float* dk, float* dv, const float* dout, const float* out,
                            const float* lse, const float* q, const float* k, const float* v,
                            const TokenLayout& q_layout, const TokenLayout& kv_layout,
                            int64_t q_heads, int64_t kv_heads, int64_t head_dim, float scale,
                            int64_t window, cudaStream_t stream) {
  CheckRingArguments(q_layout, kv_layout, q_heads, kv_heads, head_dim);
  const RingShape shape{q_layout, kv_layout, q_heads, kv_heads, head_dim, scale, window};
  const int64_t q_items = q_layout.batch * q_layout.seq * q_heads;
  const int64_t kv_items = kv_layout.batch * kv_layout.seq * kv_heads;
  if (q_items > 0) {
    PARAPLAN_LAUNCH(AttentionBlockBackwardQueryKernel, WarpGrid(q_items), kRingThreads, 0, stream,
                    dq, dout, out, lse, q, k, v, shape);
    PARAPLAN_CUDA_CHECK_LAUNCH();
  }
  if (kv_items > 0) {
    PARAPLAN_LAUNCH(AttentionBlockBackwardKeyValueKernel, WarpGrid(kv_items), kRingThreads, 0,
                    stream, dk, dv, dout, out, lse, q, k, v, shape);
    PARAPLAN_CUDA_CHECK_LAUNCH();
  }
}

// NOLINTEND(bugprone-easily-swappable-parameters)

}  // namespace paraplan::cuda
