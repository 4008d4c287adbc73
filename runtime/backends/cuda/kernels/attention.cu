// Causal grouped-query attention, flash style, on bf16 tensor cores (WMMA 16×16×16, fp32
// accumulation).
//
// Tiles of 64 queries × 64 keys; a block is 4 warps and each warp owns 16 rows of the tile. The
// seq × seq score matrix never exists: the forward keeps a running max and sum per query row
// (online softmax) and rescales its fp32 output rows in shared memory; it saves only the fp32
// log-sum-exp per row. The backward recomputes the probabilities from the lse in two kernels
// so that nothing is accumulated with atomics (deterministic): one block per key tile
// accumulates dK and dV over the query heads of its group and the query tiles at or after it;
// one block per query tile accumulates dQ over the key tiles at or before it.
//
// Inputs and outputs are fp32 in the backend's layout (rows × heads × head_dim, with the
// TokenLayout's row mapping); tiles are rounded to bf16 when loaded into shared memory.
#include <mma.h>

#include <cmath>

#include "runtime/backends/cuda/kernels/common.cuh"
#include "runtime/backends/cuda/kernels/kernels.h"

namespace paraplan::cuda {

// Kernel signatures follow the Backend interface (runtime/exec/backend.h) and the host
// specification: tensors as raw pointers and sizes in the specification's order, several of one
// type side by side; every argument is checked against the reference by the kernel tests.
// Shared-memory and tile offsets (warp * 16 * kLd, row * kLd) are bounded by the tile sizes and
// stay 32-bit on purpose: widening them to 64 bits costs registers in every thread.
// NOLINTBEGIN(bugprone-easily-swappable-parameters,
// bugprone-implicit-widening-of-multiplication-result)
namespace {

using namespace nvcuda;

constexpr int kTile = 64;  // queries and keys per tile
constexpr int kWarps = 4;  // each warp owns 16 rows of a tile
constexpr int kAttnThreads = kWarps * 32;
constexpr int kSLd = kTile + 4;  // fp32 score tile leading dimension
constexpr int kPLd = kTile + 8;  // bf16 probability tile leading dimension

using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major>;
using FragB = wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major>;
using FragBT = wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major>;
using FragC = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

struct AttnShape {
  TokenLayout layout;
  int64_t q_heads;
  int64_t kv_heads;
  float scale;
};

__host__ __device__ constexpr int RoundUp128(int bytes) { return (bytes + 127) / 128 * 128; }

// Element (token s of sequence b, head h) of a rows × heads × D tensor.
template <int D>
__device__ __forceinline__ int64_t Offset(const TokenLayout& l, int64_t s, int64_t b, int64_t h,
                                          int64_t heads) {
  return ((s * l.seq_stride + b * l.batch_stride) * heads + h) * D;
}

// Loads 64 rows (tokens t0..t0+63 of sequence b, head h) of a fp32 tensor into a bf16 tile
// [64][D + 8]; rows past the sequence are zero.
template <int D>
__device__ void LoadTile(__nv_bfloat16* tile, const float* src, const TokenLayout& l, int64_t t0,
                         int64_t b, int64_t h, int64_t heads) {
  constexpr int kLd = D + 8;
  constexpr int kVecPerRow = D / 4;
  for (int idx = threadIdx.x; idx < kTile * kVecPerRow; idx += blockDim.x) {
    const int r = idx / kVecPerRow, c = (idx % kVecPerRow) * 4;
    const int64_t t = t0 + r;
    float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
    if (t < l.seq) v = *reinterpret_cast<const float4*>(src + Offset<D>(l, t, b, h, heads) + c);
    __nv_bfloat162* dst = reinterpret_cast<__nv_bfloat162*>(tile + r * kLd + c);
    dst[0] = __floats2bfloat162_rn(v.x, v.y);
    dst[1] = __floats2bfloat162_rn(v.z, v.w);
  }
}

// ---------------------------------------------------------------------------------------------
// Forward
// ---------------------------------------------------------------------------------------------

template <int D>
struct ForwardSmem {
  static constexpr int kLd = D + 8;   // bf16 tiles
  static constexpr int kOLd = D + 4;  // fp32 output rows
  static constexpr int kQ = 0;
  static constexpr int kK = kQ + RoundUp128(kTile * kLd * 2);
  static constexpr int kV = kK + RoundUp128(kTile * kLd * 2);
  static constexpr int kS = kV + RoundUp128(kTile * kLd * 2);
  static constexpr int kP = kS + RoundUp128(kTile * kSLd * 4);
  static constexpr int kO = kP + RoundUp128(kTile * kPLd * 2);
  static constexpr int kM = kO + RoundUp128(kTile * kOLd * 4);
  static constexpr int kL = kM + RoundUp128(kTile * 4);
  static constexpr int kBytes = kL + RoundUp128(kTile * 4);
};

// The forward kernel's tiles in shared memory (offsets in ForwardSmem).
struct ForwardTiles {
  __nv_bfloat16 *qs, *ks, *vs;  // Q, K and V tiles
  float* ss;                    // the warp rows' scores, fp32
  __nv_bfloat16* ps;            // their probabilities, bf16
  float* os;                    // the unnormalised output rows, fp32
  float *row_m, *row_l;         // running max and sum per query row
};

template <int D>
__device__ __forceinline__ ForwardTiles ForwardTilesAt(unsigned char* smem) {
  using S = ForwardSmem<D>;
  return ForwardTiles{reinterpret_cast<__nv_bfloat16*>(smem + S::kQ),
                      reinterpret_cast<__nv_bfloat16*>(smem + S::kK),
                      reinterpret_cast<__nv_bfloat16*>(smem + S::kV),
                      reinterpret_cast<float*>(smem + S::kS),
                      reinterpret_cast<__nv_bfloat16*>(smem + S::kP),
                      reinterpret_cast<float*>(smem + S::kO),
                      reinterpret_cast<float*>(smem + S::kM),
                      reinterpret_cast<float*>(smem + S::kL)};
}

// dst_w = A_w · Bᵀ (16 × 64, fp32): the warp's 16 rows of the bf16 tile `a` against the 64 rows
// of the bf16 tile `b`, both [64][D + 8].
template <int D>
__device__ __forceinline__ void WarpRowsTimesTileT(float* dst, const __nv_bfloat16* a,
                                                   const __nv_bfloat16* b, int warp) {
  constexpr int kLd = D + 8;
  for (int n = 0; n < kTile / 16; ++n) {
    FragC acc;
    wmma::fill_fragment(acc, 0.0f);
    for (int kk = 0; kk < D / 16; ++kk) {
      FragA fa;
      FragBT bt;
      wmma::load_matrix_sync(fa, a + warp * 16 * kLd + kk * 16, kLd);
      wmma::load_matrix_sync(bt, b + n * 16 * kLd + kk * 16, kLd);
      wmma::mma_sync(acc, fa, bt, acc);
    }
    wmma::store_matrix_sync(dst + warp * 16 * kSLd + n * 16, acc, kSLd, wmma::mem_row_major);
  }
}

// The lane's share of the online softmax: two lanes per row of the warp's 16 (`row` of the
// tile, query `query`), each covering 32 key columns (`half`) of the tile at key k0.
struct SoftmaxLane {
  int row;
  int half;
  int64_t query;
};

// Online softmax of the lane's row over the key tile at k0: masks and scales its scores, writes
// the bf16 probabilities against the new running max, and rescales the output row and the
// running sum by how far the max moved.
template <int D>
__device__ __forceinline__ void OnlineSoftmaxStep(const ForwardTiles& t, const SoftmaxLane& lane,
                                                  int64_t k0, int64_t seq, float scale) {
  float* srow = t.ss + lane.row * kSLd + lane.half * 32;
  float tile_max = -INFINITY;
  for (int j = 0; j < 32; ++j) {
    const int64_t kj = k0 + lane.half * 32 + j;
    const bool valid = kj <= lane.query && kj < seq;
    const float s = valid ? srow[j] * scale : -INFINITY;
    srow[j] = s;
    tile_max = fmaxf(tile_max, s);
  }
  tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
  const float m_old = t.row_m[lane.row];
  const float m_new = fmaxf(m_old, tile_max);
  const float base = m_new == -INFINITY ? 0.0f : m_new;
  float sum = 0.0f;
  __nv_bfloat16* prow = t.ps + lane.row * kPLd + lane.half * 32;
  for (int j = 0; j < 32; ++j) {
    const float p = srow[j] == -INFINITY ? 0.0f : __expf(srow[j] - base);
    sum += p;
    prow[j] = __float2bfloat16_rn(p);
  }
  sum += __shfl_xor_sync(0xffffffffu, sum, 1);
  const float alpha = m_old == -INFINITY ? 0.0f : __expf(m_old - base);
  float* orow = t.os + lane.row * ForwardSmem<D>::kOLd + lane.half * (D / 2);
  for (int c = 0; c < D / 2; ++c) orow[c] *= alpha;
  __syncwarp();
  if (lane.half == 0) {
    t.row_m[lane.row] = m_new;
    t.row_l[lane.row] = t.row_l[lane.row] * alpha + sum;
  }
  __syncwarp();
}

// O_w += P_w · V (16 × D).
template <int D>
__device__ __forceinline__ void AccumulateOutputRows(const ForwardTiles& t, int warp) {
  using S = ForwardSmem<D>;
  for (int n = 0; n < D / 16; ++n) {
    FragC acc;
    wmma::load_matrix_sync(acc, t.os + warp * 16 * S::kOLd + n * 16, S::kOLd, wmma::mem_row_major);
    for (int kk = 0; kk < kTile / 16; ++kk) {
      FragA a;
      FragB bv;
      wmma::load_matrix_sync(a, t.ps + warp * 16 * kPLd + kk * 16, kPLd);
      wmma::load_matrix_sync(bv, t.vs + kk * 16 * S::kLd + n * 16, S::kLd);
      wmma::mma_sync(acc, a, bv, acc);
    }
    wmma::store_matrix_sync(t.os + warp * 16 * S::kOLd + n * 16, acc, S::kOLd, wmma::mem_row_major);
  }
}

// Normalises and writes the rows of the query tile at q0 (sequence b, head h); lse = m + log(l).
template <int D>
__device__ __forceinline__ void WriteForwardRows(float* out, float* lse, const ForwardTiles& t,
                                                 const AttnShape& shape, int64_t q0, int64_t b,
                                                 int64_t h) {
  const TokenLayout& l = shape.layout;
  for (int idx = threadIdx.x; idx < kTile * (D / 4); idx += blockDim.x) {
    const int r = idx / (D / 4), c = (idx % (D / 4)) * 4;
    const int64_t tok = q0 + r;
    if (tok >= l.seq) continue;
    const float inv = 1.0f / t.row_l[r];
    const float* o = t.os + r * ForwardSmem<D>::kOLd + c;
    *reinterpret_cast<float4*>(out + Offset<D>(l, tok, b, h, shape.q_heads) + c) =
        make_float4(o[0] * inv, o[1] * inv, o[2] * inv, o[3] * inv);
  }
  for (int r = threadIdx.x; r < kTile; r += blockDim.x) {
    const int64_t tok = q0 + r;
    if (tok < l.seq) lse[(b * shape.q_heads + h) * l.seq + tok] = t.row_m[r] + logf(t.row_l[r]);
  }
}

// One block per (query tile, q head, sequence); warp w owns queries q0 + 16w .. q0 + 16w + 15.
template <int D>
__global__ void __launch_bounds__(kAttnThreads)
    AttentionForwardKernel(float* out, float* lse, const float* q, const float* k, const float* v,
                           AttnShape shape) {
  PARAPLAN_DYNAMIC_SHARED(smem);
  const ForwardTiles t = ForwardTilesAt<D>(smem);

  const TokenLayout& l = shape.layout;
  const int64_t tiles = (l.seq + kTile - 1) / kTile;
  const int64_t qt = tiles - 1 - blockIdx.x;  // longest tiles first
  const int64_t h = blockIdx.y, b = blockIdx.z;
  const int64_t kvh = h / (shape.q_heads / shape.kv_heads);
  const int64_t q0 = qt * kTile;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  LoadTile<D>(t.qs, q, l, q0, b, h, shape.q_heads);
  for (int i = threadIdx.x; i < kTile * ForwardSmem<D>::kOLd; i += blockDim.x) t.os[i] = 0.0f;
  for (int i = threadIdx.x; i < kTile; i += blockDim.x) {
    t.row_m[i] = -INFINITY;
    t.row_l[i] = 0.0f;
  }

  const int my_row = warp * 16 + lane / 2;
  const SoftmaxLane softmax_lane{my_row, lane % 2, q0 + my_row};
  for (int64_t kt = 0; kt <= qt; ++kt) {
    const int64_t k0 = kt * kTile;
    __syncthreads();  // previous tile fully consumed
    LoadTile<D>(t.ks, k, l, k0, b, kvh, shape.kv_heads);
    LoadTile<D>(t.vs, v, l, k0, b, kvh, shape.kv_heads);
    __syncthreads();
    WarpRowsTimesTileT<D>(t.ss, t.qs, t.ks, warp);  // S_w = Q_w · Kᵀ (16 × 64)
    __syncwarp();
    OnlineSoftmaxStep<D>(t, softmax_lane, k0, l.seq, shape.scale);
    AccumulateOutputRows<D>(t, warp);
  }
  __syncthreads();
  WriteForwardRows<D>(out, lse, t, shape, q0, b, h);
}

// ---------------------------------------------------------------------------------------------
// Backward
// ---------------------------------------------------------------------------------------------

// delta[b, h, s] = Σ_d dout · out (fp32), one warp per (token, head).
template <int D>
__global__ void AttentionDeltaKernel(float* delta, const float* dout, const float* out,
                                     AttnShape shape) {
  const TokenLayout& l = shape.layout;
  const int64_t total = l.seq * l.batch * shape.q_heads;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * blockDim.x / 32;
  const int lane = threadIdx.x % 32;
  for (int64_t item = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / 32;
       item < total; item += warps) {
    const int64_t h = item % shape.q_heads;
    const int64_t s = (item / shape.q_heads) % l.seq;
    const int64_t b = item / (shape.q_heads * l.seq);
    const int64_t off = Offset<D>(l, s, b, h, shape.q_heads);
    float acc = 0.0f;
    for (int c = lane; c < D; c += 32) acc += dout[off + c] * out[off + c];
    acc = WarpSum(acc);
    if (lane == 0) delta[(b * shape.q_heads + h) * l.seq + s] = acc;
  }
}

template <int D>
struct BackwardSmem {
  static constexpr int kLd = D + 8;
  static constexpr int kA = 0;                                       // K (dkdv) or Q (dq)
  static constexpr int kB = kA + RoundUp128(kTile * kLd * 2);        // V (dkdv) or dO (dq)
  static constexpr int kC = kB + RoundUp128(kTile * kLd * 2);        // Q (dkdv) or K (dq)
  static constexpr int kD = kC + RoundUp128(kTile * kLd * 2);        // dO (dkdv) or V (dq)
  static constexpr int kS = kD + RoundUp128(kTile * kLd * 2);        // P, fp32
  static constexpr int kDP = kS + RoundUp128(kTile * kSLd * 4);      // dP, fp32
  static constexpr int kP16 = kDP + RoundUp128(kTile * kSLd * 4);    // P, bf16
  static constexpr int kDS16 = kP16 + RoundUp128(kTile * kPLd * 2);  // dS · scale, bf16
  static constexpr int kLse = kDS16 + RoundUp128(kTile * kPLd * 2);
  static constexpr int kDelta = kLse + RoundUp128(kTile * 4);
  static constexpr int kBytes = kDelta + RoundUp128(kTile * 4);
  // The output staging area (64 × (D + 4) fp32) reuses S and dP, and past D = 128 also the bf16
  // P and dS tiles: the kernels stage their outputs after the tile loop, when all are free.
  static_assert(kTile * (D + 4) * 4 <= (D <= 128 ? kP16 : kLse) - kS, "staging area does not fit");
};

// Loads lse and delta of 64 query rows; rows past the sequence get 0 (their P is masked).
__device__ void LoadRowStats(float* lse_s, float* delta_s, const float* lse, const float* delta,
                             int64_t base, int64_t q0, int64_t seq) {
  for (int r = threadIdx.x; r < kTile; r += blockDim.x) {
    const int64_t t = q0 + r;
    lse_s[r] = t < seq ? lse[base + t] : 0.0f;
    delta_s[r] = t < seq ? delta[base + t] : 0.0f;
  }
}

// Writes 16 rows × D of accumulator fragments (rows row0.. of the tile) through a staging area.
template <int D>
__device__ void StoreRows(float* dst, const TokenLayout& l, int64_t t0, int64_t b, int64_t h,
                          int64_t heads, FragC (&acc)[D / 16], float* staging) {
  constexpr int kLd = D + 4;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float* mine = staging + warp * 16 * kLd;
  for (int n = 0; n < D / 16; ++n) {
    wmma::store_matrix_sync(mine + n * 16, acc[n], kLd, wmma::mem_row_major);
  }
  __syncwarp();
  for (int idx = lane; idx < 16 * (D / 4); idx += 32) {
    const int r = idx / (D / 4), c = (idx % (D / 4)) * 4;
    const int64_t t = t0 + warp * 16 + r;
    if (t >= l.seq) continue;
    const float* s = mine + r * kLd + c;
    *reinterpret_cast<float4*>(dst + Offset<D>(l, t, b, h, heads) + c) =
        make_float4(s[0], s[1], s[2], s[3]);
  }
}

// The backward kernels' tiles in shared memory (offsets in BackwardSmem). The key/value kernel
// holds K, V, Q, dO in a, b, c, d; the query kernel Q, dO, K, V.
struct BackwardTiles {
  __nv_bfloat16 *a, *b, *c, *d;
  float* ps;               // scores, then probabilities, fp32
  float* dps;              // dP, fp32
  __nv_bfloat16* p16;      // P, bf16
  __nv_bfloat16* ds16;     // dS · scale, bf16
  float *lse_s, *delta_s;  // per query row of the tile
};

template <int D>
__device__ __forceinline__ BackwardTiles BackwardTilesAt(unsigned char* smem) {
  using S = BackwardSmem<D>;
  return BackwardTiles{reinterpret_cast<__nv_bfloat16*>(smem + S::kA),
                       reinterpret_cast<__nv_bfloat16*>(smem + S::kB),
                       reinterpret_cast<__nv_bfloat16*>(smem + S::kC),
                       reinterpret_cast<__nv_bfloat16*>(smem + S::kD),
                       reinterpret_cast<float*>(smem + S::kS),
                       reinterpret_cast<float*>(smem + S::kDP),
                       reinterpret_cast<__nv_bfloat16*>(smem + S::kP16),
                       reinterpret_cast<__nv_bfloat16*>(smem + S::kDS16),
                       reinterpret_cast<float*>(smem + S::kLse),
                       reinterpret_cast<float*>(smem + S::kDelta)};
}

// Two 16 × 64 products of the warp's rows at once, into t.ps and t.dps: S_w = A_w · Bᵀ and
// dP_w = C_w · Dᵀ (all four bf16 tiles [64][D + 8]).
template <int D>
__device__ __forceinline__ void WarpScoresAndGrads(const BackwardTiles& t, const __nv_bfloat16* a,
                                                   const __nv_bfloat16* b, const __nv_bfloat16* c,
                                                   const __nv_bfloat16* d, int warp) {
  constexpr int kLd = D + 8;
  for (int n = 0; n < kTile / 16; ++n) {
    FragC s_acc, dp_acc;
    wmma::fill_fragment(s_acc, 0.0f);
    wmma::fill_fragment(dp_acc, 0.0f);
    for (int kk = 0; kk < D / 16; ++kk) {
      FragA fa;
      FragBT bt;
      wmma::load_matrix_sync(fa, a + warp * 16 * kLd + kk * 16, kLd);
      wmma::load_matrix_sync(bt, b + n * 16 * kLd + kk * 16, kLd);
      wmma::mma_sync(s_acc, fa, bt, s_acc);
      wmma::load_matrix_sync(fa, c + warp * 16 * kLd + kk * 16, kLd);
      wmma::load_matrix_sync(bt, d + n * 16 * kLd + kk * 16, kLd);
      wmma::mma_sync(dp_acc, fa, bt, dp_acc);
    }
    wmma::store_matrix_sync(t.ps + warp * 16 * kSLd + n * 16, s_acc, kSLd, wmma::mem_row_major);
    wmma::store_matrix_sync(t.dps + warp * 16 * kSLd + n * 16, dp_acc, kSLd, wmma::mem_row_major);
  }
}

// Pᵀ = exp(scale · Sᵀ − lse) on the causal part; dSᵀ = Pᵀ ∘ (dPᵀ − delta) · scale, for the
// lane's 32 query columns (`half`) of key row `row` (key kj) against the query tile at q0.
__device__ __forceinline__ void KeyRowProbabilitiesAndGrads(const BackwardTiles& t, int row,
                                                            int half, int64_t kj, int64_t q0,
                                                            int64_t seq, float scale) {
  for (int j = 0; j < 32; ++j) {
    const int col = half * 32 + j;
    const int64_t qi = q0 + col;
    const bool valid = kj <= qi && qi < seq && kj < seq;
    const float p = valid ? __expf(t.ps[row * kSLd + col] * scale - t.lse_s[col]) : 0.0f;
    const float ds = p * (t.dps[row * kSLd + col] - t.delta_s[col]) * scale;
    t.p16[row * kPLd + col] = __float2bfloat16_rn(p);
    t.ds16[row * kPLd + col] = __float2bfloat16_rn(ds);
  }
}

// dV_w += Pᵀ_w · dO and dK_w += dSᵀ_w · Q (16 keys × D).
template <int D>
__device__ __forceinline__ void AccumulateKeyValueGrads(const BackwardTiles& t, int warp,
                                                        FragC (&dk_acc)[D / 16],
                                                        FragC (&dv_acc)[D / 16]) {
  constexpr int kLd = D + 8;
  const __nv_bfloat16* qs = t.c;
  const __nv_bfloat16* dos = t.d;
  for (int n = 0; n < D / 16; ++n) {
    for (int kk = 0; kk < kTile / 16; ++kk) {
      FragA a;
      FragB bm;
      wmma::load_matrix_sync(a, t.p16 + warp * 16 * kPLd + kk * 16, kPLd);
      wmma::load_matrix_sync(bm, dos + kk * 16 * kLd + n * 16, kLd);
      wmma::mma_sync(dv_acc[n], a, bm, dv_acc[n]);
      wmma::load_matrix_sync(a, t.ds16 + warp * 16 * kPLd + kk * 16, kPLd);
      wmma::load_matrix_sync(bm, qs + kk * 16 * kLd + n * 16, kLd);
      wmma::mma_sync(dk_acc[n], a, bm, dk_acc[n]);
    }
  }
}

// One block per (key tile, kv head, sequence); warp w owns keys k0 + 16w .. k0 + 16w + 15.
template <int D>
__global__ void __launch_bounds__(kAttnThreads)
    AttentionBackwardKeyValueKernel(float* dk, float* dv, const float* dout, const float* lse,
                                    const float* delta, const float* q, const float* k,
                                    const float* v, AttnShape shape) {
  PARAPLAN_DYNAMIC_SHARED(smem);
  const BackwardTiles t = BackwardTilesAt<D>(smem);
  __nv_bfloat16* ks = t.a;
  __nv_bfloat16* vs = t.b;
  __nv_bfloat16* qs = t.c;
  __nv_bfloat16* dos = t.d;

  const TokenLayout& l = shape.layout;
  const int64_t tiles = (l.seq + kTile - 1) / kTile;
  const int64_t kt = blockIdx.x;  // key tiles near the start see the most queries
  const int64_t kvh = blockIdx.y, b = blockIdx.z;
  const int64_t group = shape.q_heads / shape.kv_heads;
  const int64_t k0 = kt * kTile;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  LoadTile<D>(ks, k, l, k0, b, kvh, shape.kv_heads);
  LoadTile<D>(vs, v, l, k0, b, kvh, shape.kv_heads);

  FragC dk_acc[D / 16], dv_acc[D / 16];
  for (int n = 0; n < D / 16; ++n) {
    wmma::fill_fragment(dk_acc[n], 0.0f);
    wmma::fill_fragment(dv_acc[n], 0.0f);
  }

  // Element lanes: two lanes per key row of the warp's 16, each covering 32 query columns.
  const int my_row = warp * 16 + lane / 2;
  const int half = lane % 2;
  const int64_t kj = k0 + my_row;

  for (int64_t hh = 0; hh < group; ++hh) {
    const int64_t h = kvh * group + hh;
    const int64_t stat_base = (b * shape.q_heads + h) * l.seq;
    for (int64_t qt = kt; qt < tiles; ++qt) {
      const int64_t q0 = qt * kTile;
      __syncthreads();
      LoadTile<D>(qs, q, l, q0, b, h, shape.q_heads);
      LoadTile<D>(dos, dout, l, q0, b, h, shape.q_heads);
      LoadRowStats(t.lse_s, t.delta_s, lse, delta, stat_base, q0, l.seq);
      __syncthreads();
      // Sᵀ_w = K_w · Qᵀ and dPᵀ_w = V_w · dOᵀ (16 keys × 64 queries).
      WarpScoresAndGrads<D>(t, ks, qs, vs, dos, warp);
      __syncwarp();
      KeyRowProbabilitiesAndGrads(t, my_row, half, kj, q0, l.seq, shape.scale);
      __syncwarp();
      AccumulateKeyValueGrads<D>(t, warp, dk_acc, dv_acc);
    }
  }
  __syncthreads();
  float* staging = t.ps;  // S and dP are free now
  StoreRows<D>(dk, l, k0, b, kvh, shape.kv_heads, dk_acc, staging);
  __syncwarp();
  StoreRows<D>(dv, l, k0, b, kvh, shape.kv_heads, dv_acc, staging);
}

// One block per (query tile, q head, sequence); warp w owns queries q0 + 16w .. q0 + 16w + 15.
template <int D>
__global__ void __launch_bounds__(kAttnThreads)
    AttentionBackwardQueryKernel(float* dq, const float* dout, const float* lse, const float* delta,
                                 const float* q, const float* k, const float* v, AttnShape shape) {
  using S = BackwardSmem<D>;
  PARAPLAN_DYNAMIC_SHARED(smem);
  const BackwardTiles t = BackwardTilesAt<D>(smem);
  __nv_bfloat16* qs = t.a;
  __nv_bfloat16* dos = t.b;
  __nv_bfloat16* ks = t.c;
  __nv_bfloat16* vs = t.d;
  float* ps = t.ps;
  float* dps = t.dps;
  __nv_bfloat16* ds16 = t.ds16;
  float* lse_s = t.lse_s;
  float* delta_s = t.delta_s;

  const TokenLayout& l = shape.layout;
  const int64_t tiles = (l.seq + kTile - 1) / kTile;
  const int64_t qt = tiles - 1 - blockIdx.x;
  const int64_t h = blockIdx.y, b = blockIdx.z;
  const int64_t kvh = h / (shape.q_heads / shape.kv_heads);
  const int64_t q0 = qt * kTile;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  LoadTile<D>(qs, q, l, q0, b, h, shape.q_heads);
  LoadTile<D>(dos, dout, l, q0, b, h, shape.q_heads);
  LoadRowStats(lse_s, delta_s, lse, delta, (b * shape.q_heads + h) * l.seq, q0, l.seq);

  FragC dq_acc[D / 16];
  for (int n = 0; n < D / 16; ++n) wmma::fill_fragment(dq_acc[n], 0.0f);

  const int my_row = warp * 16 + lane / 2;
  const int half = lane % 2;
  const int64_t qi = q0 + my_row;

  for (int64_t kt = 0; kt <= qt; ++kt) {
    const int64_t k0 = kt * kTile;
    __syncthreads();
    LoadTile<D>(ks, k, l, k0, b, kvh, shape.kv_heads);
    LoadTile<D>(vs, v, l, k0, b, kvh, shape.kv_heads);
    __syncthreads();

    // S_w = Q_w · Kᵀ and dP_w = dO_w · Vᵀ (16 queries × 64 keys).
    WarpScoresAndGrads<D>(t, qs, ks, dos, vs, warp);
    __syncwarp();

    for (int j = 0; j < 32; ++j) {
      const int col = half * 32 + j;
      const int64_t kj = k0 + col;
      const bool valid = kj <= qi && qi < l.seq && kj < l.seq;
      const float p = valid ? __expf(ps[my_row * kSLd + col] * shape.scale - lse_s[my_row]) : 0.0f;
      const float ds = p * (dps[my_row * kSLd + col] - delta_s[my_row]) * shape.scale;
      ds16[my_row * kPLd + col] = __float2bfloat16_rn(ds);
    }
    __syncwarp();

    // dQ_w += dS_w · K (16 queries × D).
    for (int n = 0; n < D / 16; ++n) {
      for (int kk = 0; kk < kTile / 16; ++kk) {
        FragA a;
        FragB bm;
        wmma::load_matrix_sync(a, ds16 + warp * 16 * kPLd + kk * 16, kPLd);
        wmma::load_matrix_sync(bm, ks + kk * 16 * S::kLd + n * 16, S::kLd);
        wmma::mma_sync(dq_acc[n], a, bm, dq_acc[n]);
      }
    }
  }
  __syncthreads();
  StoreRows<D>(dq, l, q0, b, h, shape.q_heads, dq_acc, ps);
}

void CheckAttentionArguments(const TokenLayout& l, int64_t q_heads, int64_t kv_heads,
                             int64_t head_dim, std::initializer_list<const void*> pointers) {
  if (!AttentionHeadDimSupported(head_dim)) {
    throw CudaError("CUDA attention supports head_dim 16, 32, 64, 128 and 192, not " +
                    std::to_string(head_dim));
  }
  if (q_heads <= 0 || kv_heads <= 0 || q_heads % kv_heads != 0) {
    throw CudaError("CUDA attention: q_heads must be a positive multiple of kv_heads");
  }
  if (l.seq_offset != 0) throw CudaError("CUDA attention: the layout must cover whole sequences");
  if (l.seq > 65535 * static_cast<int64_t>(kTile) || q_heads > 65535 || l.batch > 65535) {
    throw CudaError("CUDA attention: sequence, heads or batch too large for the grid");
  }
  for (const void* p : pointers) {
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) {
      throw CudaError("CUDA attention: tensors must be 16-byte aligned");
    }
  }
}

template <int D, typename Kernel>
void PrepareKernel(Kernel kernel, int bytes) {
  // Opt in to more than 48 KiB of dynamic shared memory (Hopper allows 227 KiB per block).
  PARAPLAN_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
}

template <int D>
void LaunchForward(float* out, float* lse, const float* q, const float* k, const float* v,
                   const AttnShape& shape, cudaStream_t stream) {
  const int bytes = ForwardSmem<D>::kBytes;
  PrepareKernel<D>(AttentionForwardKernel<D>, bytes);
  const int64_t tiles = (shape.layout.seq + kTile - 1) / kTile;
  dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(shape.q_heads),
            static_cast<unsigned>(shape.layout.batch));
  PARAPLAN_LAUNCH(AttentionForwardKernel<D>, grid, kAttnThreads, bytes, stream, out, lse, q, k, v,
                  shape);
  PARAPLAN_CUDA_CHECK_LAUNCH();
}

template <int D>
void LaunchBackward(float* dq, float* dk, float* dv, const float* dout, const float* out,
                    const float* lse, const float* q, const float* k, const float* v,
                    const AttnShape& shape, float* delta, cudaStream_t stream) {
  const TokenLayout& l = shape.layout;
  const int64_t items = l.seq * l.batch * shape.q_heads;
  PARAPLAN_LAUNCH(AttentionDeltaKernel<D>, GridFor(items * 32), kThreads, 0, stream, delta, dout,
                  out, shape);
  PARAPLAN_CUDA_CHECK_LAUNCH();
  const int bytes = BackwardSmem<D>::kBytes;
  const int64_t tiles = (l.seq + kTile - 1) / kTile;
  PrepareKernel<D>(AttentionBackwardKeyValueKernel<D>, bytes);
  dim3 kv_grid(static_cast<unsigned>(tiles), static_cast<unsigned>(shape.kv_heads),
               static_cast<unsigned>(l.batch));
  PARAPLAN_LAUNCH(AttentionBackwardKeyValueKernel<D>, kv_grid, kAttnThreads, bytes, stream, dk, dv,
                  dout, lse, delta, q, k, v, shape);
  PARAPLAN_CUDA_CHECK_LAUNCH();
  PrepareKernel<D>(AttentionBackwardQueryKernel<D>, bytes);
  dim3 q_grid(static_cast<unsigned>(tiles), static_cast<unsigned>(shape.q_heads),
              static_cast<unsigned>(l.batch));
  PARAPLAN_LAUNCH(AttentionBackwardQueryKernel<D>, q_grid, kAttnThreads, bytes, stream, dq, dout,
                  lse, delta, q, k, v, shape);
  PARAPLAN_CUDA_CHECK_LAUNCH();
}

}  // namespace

bool AttentionHeadDimSupported(int64_t head_dim) {
  // 192: multi-head latent attention's query/key heads (DeepSeek-V2/V3: 128 + 64).
  return head_dim == 16 || head_dim == 32 || head_dim == 64 || head_dim == 128 || head_dim == 192;
}

void AttentionForward(float* out, float* lse, const float* q, const float* k, const float* v,
                      const TokenLayout& layout, int64_t q_heads, int64_t kv_heads,
                      int64_t head_dim, float scale, cudaStream_t stream) {
  if (layout.seq <= 0 || layout.batch <= 0) return;
  CheckAttentionArguments(layout, q_heads, kv_heads, head_dim, {out, q, k, v});
  AttnShape shape{layout, q_heads, kv_heads, scale};
  switch (head_dim) {
    case 16:
      LaunchForward<16>(out, lse, q, k, v, shape, stream);
      break;
    case 32:
      LaunchForward<32>(out, lse, q, k, v, shape, stream);
      break;
    case 64:
      LaunchForward<64>(out, lse, q, k, v, shape, stream);
      break;
    case 192:
      LaunchForward<192>(out, lse, q, k, v, shape, stream);
      break;
    default:
      LaunchForward<128>(out, lse, q, k, v, shape, stream);
      break;
  }
}

void AttentionBackward(float* dq, float* dk, float* dv, const float* dout, const float* out,
                       const float* lse, const float* q, const float* k, const float* v,
                       const TokenLayout& layout, int64_t q_heads, int64_t kv_heads,
                       int64_t head_dim, float scale, float* scratch, cudaStream_t stream) {
  if (layout.seq <= 0 || layout.batch <= 0) return;
  CheckAttentionArguments(layout, q_heads, kv_heads, head_dim, {dq, dk, dv, dout, out, q, k, v});
  AttnShape shape{layout, q_heads, kv_heads, scale};
  switch (head_dim) {
    case 16:
      LaunchBackward<16>(dq, dk, dv, dout, out, lse, q, k, v, shape, scratch, stream);
      break;
    case 32:
      LaunchBackward<32>(dq, dk, dv, dout, out, lse, q, k, v, shape, scratch, stream);
      break;
    case 64:
      LaunchBackward<64>(dq, dk, dv, dout, out, lse, q, k, v, shape, scratch, stream);
      break;
    case 192:
      LaunchBackward<192>(dq, dk, dv, dout, out, lse, q, k, v, shape, scratch, stream);
      break;
    default:
      LaunchBackward<128>(dq, dk, dv, dout, out, lse, q, k, v, shape, scratch, stream);
      break;
  }
}

// ---- Rotary position embedding (applied to q and k before attention) ----

namespace {

// One thread per (row, head, pair). Angles in double, as the host computes them.
__global__ void RopeKernel(float* x, TokenLayout layout, int64_t heads, int64_t head_dim,
                           double theta, float sign) {
  const int64_t half = head_dim / 2;
  PARAPLAN_GRID_STRIDE(idx, layout.seq * layout.batch * heads * half) {
    const int64_t i = idx % half;
    int64_t rest = idx / half;
    const int64_t h = rest % heads;
    rest /= heads;
    const int64_t b = rest % layout.batch, s = rest / layout.batch;
    const double pos = static_cast<double>(layout.seq_offset + s);
    const double freq = pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(head_dim));
    double sn, cs;
    sincos(pos * freq, &sn, &cs);
    const float c = static_cast<float>(cs), sgn = sign * static_cast<float>(sn);
    float* v = x + ((s * layout.seq_stride + b * layout.batch_stride) * heads + h) * head_dim;
    const float a = v[i], z = v[i + half];
    v[i] = a * c - z * sgn;
    v[i + half] = a * sgn + z * c;
  }
}

}  // namespace

void RopeForward(float* x, const TokenLayout& layout, int64_t heads, int64_t head_dim, float theta,
                 cudaStream_t stream) {
  const int64_t n = layout.seq * layout.batch * heads * (head_dim / 2);
  if (n <= 0) return;
  PARAPLAN_LAUNCH(RopeKernel, GridFor(n), kThreads, 0, stream, x, layout, heads, head_dim, theta,
                  1.0f);
  PARAPLAN_CUDA_CHECK_LAUNCH();
}

void RopeBackward(float* dx, const TokenLayout& layout, int64_t heads, int64_t head_dim,
                  float theta, cudaStream_t stream) {
  const int64_t n = layout.seq * layout.batch * heads * (head_dim / 2);
  if (n <= 0) return;
  PARAPLAN_LAUNCH(RopeKernel, GridFor(n), kThreads, 0, stream, dx, layout, heads, head_dim, theta,
                  -1.0f);
  PARAPLAN_CUDA_CHECK_LAUNCH();
}

// NOLINTEND(bugprone-easily-swappable-parameters,
// bugprone-implicit-widening-of-multiplication-result)

}  // namespace paraplan::cuda
