// Causal grouped-query attention, flash style, on bf16 tensor cores (WMMA 16×16×16, fp32
// accumulation).
//
// A block owns 128 rows (queries in the forward and dQ kernels, keys in the dK/dV kernel) and
// is 8 warps; warp w owns rows 16w .. 16w + 15 and keeps their operand fragments (Q, dO, K or
// V rows) and their fp32 accumulators (O, dQ, dK, dV) in registers for the whole kernel. The
// block streams 64-row tiles of the other side (K and V, or Q, dO and their row statistics)
// through two shared-memory stages. The seq × seq score matrix never exists: the forward keeps
// a running max and sum per query row (online softmax) and saves only the fp32 log-sum-exp per
// row. The backward recomputes the probabilities from the lse in two kernels so that nothing
// is accumulated with atomics (deterministic): one block per 128 keys accumulates dK and dV
// over the query heads of its group and the query tiles at or after it; one block per 128
// queries accumulates dQ over the key tiles at or before it.
//
// Inputs and outputs are fp32 in the backend's layout (rows × heads × head_dim, with the
// TokenLayout's row mapping); tiles are rounded to bf16 when they are written to shared memory.
//
// Why this shape (H100/H200, B = 8, T = 1024, H = 12, D = 64; the previous design used 64-row
// blocks of 4 warps, reloaded Q and dO fragments from shared memory for every product, kept
// the fp32 output rows in shared memory and rescaled them on every key tile, and loaded each
// K/V tile between two barriers with nothing in flight; it ran at about 21 TFLOP/s):
//  - 128 rows per block: every streamed K/V (or Q/dO) tile serves twice the rows, so global/L2
//    traffic and fp32→bf16 conversions per FLOP halve (per forward block and key tile: 32 KiB
//    of fp32 K and V for 2.1 MFLOP instead of 1.05 MFLOP).
//  - Operand fragments in registers (head_dim ≤ 128 forward, ≤ 64 backward): the block's own
//    rows are read from shared memory once per kernel instead of once per product, so a score
//    product loads one fragment (the streamed operand) instead of two.
//  - Output accumulators stay in fragments. The online softmax rescales O only when a row's
//    running max grows by more than kRescaleSlack (P = exp(s − m) then stays ≤ e^8: the same
//    relative precision in bf16 and far from fp32 overflow; lse = m + log l is unchanged); the
//    rescale goes through shared memory but is rare (on real data a row's max settles within a
//    few tiles), instead of a 16 × D fp32 read-modify-write through shared memory per tile.
//  - Software pipelining: the next tile's global loads are issued into registers before the
//    current tile's products (forward and dK/dV at head_dim ≤ 64: 8 float4 per thread) and
//    written to the other stage afterwards: one barrier per tile instead of two, and the load
//    latency overlaps the tensor-core work. The dQ kernel loads after its products (registers
//    kept for occupancy) and relies on its second resident block for the overlap.
//  - Causal skipping: a warp whose 16 rows are all masked against a tile skips it, and a
//    diagonal tile runs only the 16-column fragments that hold unmasked entries. The grid puts
//    tiles in its slowest dimension, so the longest causal blocks start first.
//  - Scores and probabilities are per warp (no block barrier around the softmax), the bf16
//    probabilities overwrite their own fp32 scores in place, and the softmax lanes read
//    interleaved columns (2-way instead of 4-way bank conflicts).
//  - Occupancy (ptxas, sm_90, D = 64): forward and dQ 128 registers, 105 KiB of shared memory,
//    two blocks (16 warps) per SM; dK/dV 228 registers (two accumulators and two operands per
//    row), one block of 8 warps.
// Shared-memory bytes per warp and 64-wide tile (32 HMMA 16×16×16 forward): before, Q and K
// fragments 16 KiB, S written, rewritten and read 12 KiB, P 2 KiB, O rescaled and loaded/stored
// 16 KiB, P and V fragments 16 KiB (≈ 62 KiB); now K fragments 8 KiB, S 4 + 8 KiB, P 2 + 2 KiB,
// V fragments 8 KiB (≈ 32 KiB): about half, and global bytes per FLOP half. The old kernel was
// latency-bound (12 resident warps per SM, a load round trip and two barriers per tile, the O
// round trip in the critical path); the new one keeps 16 warps busy with loads in flight. At the
// measured shape we expect the forward near 90–130 TFLOP/s (about 0.1–0.15 ms per layer, 4–6×),
// dQ 3–4× and dK/dV about 3× faster (same changes, but dK/dV runs 8 warps per SM and dQ waits
// on its loads), the delta kernel unchanged; bench/gpu/attention_bench measures each kernel.
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

constexpr int kBlockRows = 128;                // rows a block owns (queries or keys)
constexpr int kWarps = kBlockRows / 16;        // warp w owns rows 16w .. 16w + 15
constexpr int kAttnThreads = kWarps * 32;      // 256
constexpr int kStep = 64;                      // rows of a streamed tile (keys or queries)
constexpr int kStepFrags = kStep / 16;         // its 16-row fragments
constexpr int kSLd = kStep + 4;                // fp32 warp tile leading dimension
constexpr int kP16Ld = 2 * kSLd;               // bf16 written over a fp32 warp tile, same rows
constexpr int kWarpTileBytes = 16 * kSLd * 4;  // one warp's 16 × 64 fp32 tile
constexpr int kAreaBytes = kWarps * kWarpTileBytes;
constexpr float kRescaleSlack = 8.0f;          // see the notes above
constexpr float kLog2e = 1.4426950408889634f;  // exp(x) = exp2(x · log2 e)

using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major>;
using FragB = wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major>;
using FragBT = wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major>;
using FragC = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

struct AttnShape {
  TokenLayout layout;
  int64_t q_heads;
  int64_t kv_heads;
  float scale;
  int64_t window;  // sliding window in keys (query i sees i - window + 1 .. i), 0 = none
};

__host__ __device__ constexpr int RoundUp128(int bytes) { return (bytes + 127) / 128 * 128; }
__host__ __device__ constexpr int MinInt(int a, int b) { return a < b ? a : b; }
__host__ __device__ constexpr int MaxInt(int a, int b) { return a > b ? a : b; }

// Element (token s of sequence b, head h) of a rows × heads × D tensor.
template <int D>
__device__ __forceinline__ int64_t Offset(const TokenLayout& l, int64_t s, int64_t b, int64_t h,
                                          int64_t heads) {
  return ((s * l.seq_stride + b * l.batch_stride) * heads + h) * D;
}

__device__ __forceinline__ void StoreBf16x4(__nv_bfloat16* dst, float4 v) {
  __nv_bfloat162* d2 = reinterpret_cast<__nv_bfloat162*>(dst);
  d2[0] = __floats2bfloat162_rn(v.x, v.y);
  d2[1] = __floats2bfloat162_rn(v.z, v.w);
}

// Loads 16 rows (tokens t0..t0+15 of sequence b, head h) of a fp32 tensor into a bf16 tile with
// leading dimension ld, by one warp; rows past the sequence are zero.
template <int D>
__device__ void LoadWarpRows(__nv_bfloat16* tile, int ld, const float* src, const TokenLayout& l,
                             int64_t t0, int64_t b, int64_t h, int64_t heads) {
  const int lane = threadIdx.x % 32;
  for (int idx = lane; idx < 16 * (D / 4); idx += 32) {
    const int r = idx / (D / 4), c = (idx % (D / 4)) * 4;
    const int64_t t = t0 + r;
    float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
    if (t < l.seq) v = *reinterpret_cast<const float4*>(src + Offset<D>(l, t, b, h, heads) + c);
    StoreBf16x4(tile + r * ld + c, v);
  }
}

// The A fragments (16 × D, bf16) of a warp's own rows: in registers when kInRegs, else read
// from a shared tile on every use (large head_dim, where registers would spill).
template <int D, bool kInRegs>
struct WarpRowFrags;

template <int D>
struct WarpRowFrags<D, true> {
  FragA f[D / 16];
  __device__ void Init(const __nv_bfloat16* tile, int ld) {
    for (int kk = 0; kk < D / 16; ++kk) wmma::load_matrix_sync(f[kk], tile + kk * 16, ld);
  }
  __device__ const FragA& At(int kk, FragA& /*scratch*/) const { return f[kk]; }
};

template <int D>
struct WarpRowFrags<D, false> {
  const __nv_bfloat16* tile;
  int ld;
  __device__ void Init(const __nv_bfloat16* t, int l) {
    tile = t;
    ld = l;
  }
  __device__ const FragA& At(int kk, FragA& scratch) const {
    wmma::load_matrix_sync(scratch, tile + kk * 16, ld);
    return scratch;
  }
};

// One shared-memory stage of the streamed side: two bf16 tiles [64][D + 8] (K and V, or Q and
// dO) and, for dK/dV, the lse and delta of the 64 query rows.
template <int D>
struct StageLayout {
  static constexpr int kLd = D + 8;
  static constexpr int kTileBytes = RoundUp128(kStep * kLd * 2);
  static constexpr int kA = 0;
  static constexpr int kB = kTileBytes;
  static constexpr int kLse = 2 * kTileBytes;
  static constexpr int kDelta = kLse + kStep * 4;
  static constexpr int kBytes = kLse + RoundUp128(2 * kStep * 4);
  // Two stages where they fit beside the warp areas and resident tiles; one past head_dim 128.
  static constexpr int kStages = D <= 128 ? 2 : 1;
};

struct Stage {
  __nv_bfloat16 *a, *b;
  float *lse, *delta;
};

template <int D>
__device__ __forceinline__ Stage StageAt(unsigned char* base, int index) {
  using L = StageLayout<D>;
  unsigned char* s = base + index * L::kBytes;
  return Stage{reinterpret_cast<__nv_bfloat16*>(s + L::kA),
               reinterpret_cast<__nv_bfloat16*>(s + L::kB), reinterpret_cast<float*>(s + L::kLse),
               reinterpret_cast<float*>(s + L::kDelta)};
}

// Where a streamed tile comes from: rows t0..t0+63 of sequence b, head h of two tensors, and
// optionally their lse and delta (row statistics at stat_base + t).
struct StepSource {
  const float* a;
  const float* b;
  int64_t heads;
  const float* lse;  // nullptr: no statistics
  const float* delta;
};

// Streams 64-row tiles into the stages. Fetch(t0, h) starts the loads of the next tile (into
// registers when kPrefetch); Commit(stage) converts and writes it to shared memory. Every
// thread of the block takes part.
template <int D, bool kPrefetchInRegs>
class StepLoader {
 public:
  static constexpr int kPerTensor = kStep * (D / 4) / kAttnThreads;  // float4 per thread
  static constexpr bool kPrefetch = kPrefetchInRegs;
  static_assert(kStep * (D / 4) % kAttnThreads == 0, "tile does not split over the threads");

  __device__ StepLoader(const StepSource& src, const TokenLayout& l, int64_t b)
      : src_(src), l_(l), batch_(b) {}

  __device__ void Fetch(int64_t t0, int64_t h, int64_t stat_base) {
    t0_ = t0;
    h_ = h;
    stat_base_ = stat_base;
    if constexpr (kPrefetch) {
      for (int i = 0; i < kPerTensor; ++i) {
        a_[i] = Load(src_.a, i);
        b_[i] = Load(src_.b, i);
      }
      stat_ = LoadStat();
    }
  }

  __device__ void Commit(const Stage& st) {
    constexpr int kLd = D + 8;
    for (int i = 0; i < kPerTensor; ++i) {
      const int idx = threadIdx.x + i * kAttnThreads;
      const int r = idx / (D / 4), c = (idx % (D / 4)) * 4;
      if constexpr (kPrefetch) {
        StoreBf16x4(st.a + r * kLd + c, a_[i]);
        StoreBf16x4(st.b + r * kLd + c, b_[i]);
      } else {
        StoreBf16x4(st.a + r * kLd + c, Load(src_.a, i));
        StoreBf16x4(st.b + r * kLd + c, Load(src_.b, i));
      }
    }
    if (src_.lse != nullptr && threadIdx.x < 2 * kStep) {
      const float v = kPrefetch ? stat_ : LoadStat();
      if (threadIdx.x < kStep) {
        st.lse[threadIdx.x] = v;
      } else {
        st.delta[threadIdx.x - kStep] = v;
      }
    }
  }

 private:
  __device__ float4 Load(const float* p, int i) const {
    const int idx = threadIdx.x + i * kAttnThreads;
    const int r = idx / (D / 4), c = (idx % (D / 4)) * 4;
    const int64_t t = t0_ + r;
    if (t >= l_.seq) return make_float4(0.f, 0.f, 0.f, 0.f);
    return *reinterpret_cast<const float4*>(p + Offset<D>(l_, t, batch_, h_, src_.heads) + c);
  }
  // Threads 0..63 read lse, 64..127 delta; rows past the sequence get 0 (their P is masked).
  __device__ float LoadStat() const {
    if (src_.lse == nullptr || threadIdx.x >= 2 * kStep) return 0.0f;
    const int r = threadIdx.x % kStep;
    const int64_t t = t0_ + r;
    if (t >= l_.seq) return 0.0f;
    return (threadIdx.x < kStep ? src_.lse : src_.delta)[stat_base_ + t];
  }

  StepSource src_;
  TokenLayout l_;
  int64_t batch_;
  int64_t t0_ = 0, h_ = 0, stat_base_ = 0;
  float4 a_[kPrefetch ? kPerTensor : 1];
  float4 b_[kPrefetch ? kPerTensor : 1];
  float stat_ = 0.0f;
};

// Writes a warp's 16 rows × D of accumulator fragments (rows t0.. of sequence b, head h) through
// its fp32 warp tile, 64 columns at a time, each row multiplied by `row_scale` (lane 2r holds
// row r's factor).
template <int D>
__device__ void StoreWarpRows(float* dst, const TokenLayout& l, int64_t t0, int64_t b, int64_t h,
                              int64_t heads, const FragC (&acc)[D / 16], float* tile,
                              float row_scale) {
  constexpr int kChunk = MinInt(kStepFrags, D / 16);  // fragments per pass
  const int lane = threadIdx.x % 32;
  for (int n0 = 0; n0 < D / 16; n0 += kChunk) {
    __syncwarp();
    for (int n = 0; n < kChunk; ++n) {
      wmma::store_matrix_sync(tile + n * 16, acc[n0 + n], kSLd, wmma::mem_row_major);
    }
    __syncwarp();
    constexpr int kVecPerRow = kChunk * 4;
    for (int idx = lane; idx < 16 * kVecPerRow; idx += 32) {
      const int r = idx / kVecPerRow, c = (idx % kVecPerRow) * 4;
      const float f = __shfl_sync(0xffffffffu, row_scale, 2 * r);
      const int64_t t = t0 + r;
      if (t >= l.seq) continue;
      const float* s = tile + r * kSLd + c;
      *reinterpret_cast<float4*>(dst + Offset<D>(l, t, b, h, heads) + n0 * 16 + c) =
          make_float4(s[0] * f, s[1] * f, s[2] * f, s[3] * f);
    }
  }
}

// The streaming loop shared by the three kernels: tiles 0..count-1, where `locate(i, t0, h,
// stat_base)` names tile i's source and `step(stage)` runs the warps' work on a resident tile.
// The next tile is fetched before the current one's products and committed after them; one
// barrier per tile (two with a single stage).
template <int D, typename Loader, typename Locate, typename Step>
__device__ void StreamTiles(unsigned char* stages, Loader& loader, int64_t count, Locate locate,
                            Step step) {
  constexpr int kStages = StageLayout<D>::kStages;
  int64_t t0 = 0, h = 0, stat_base = 0;
  locate(0, t0, h, stat_base);
  loader.Fetch(t0, h, stat_base);
  loader.Commit(StageAt<D>(stages, 0));
  __syncthreads();
  for (int64_t i = 0; i < count; ++i) {
    const bool more = i + 1 < count;
    if (more) {
      locate(i + 1, t0, h, stat_base);
      loader.Fetch(t0, h, stat_base);
    }
    step(StageAt<D>(stages, static_cast<int>(i % kStages)), i);
    if (more) {
      if constexpr (kStages == 1) __syncthreads();
      loader.Commit(StageAt<D>(stages, static_cast<int>((i + 1) % kStages)));
    }
    __syncthreads();
  }
}

// The softmax lanes: two per row of the warp's 16 (row lane / 2); lane half h covers the
// interleaved columns 2j + h of a 64-column tile (fewer shared-memory bank conflicts than two
// contiguous halves).
// min(max(bound, 0), limit): how many of the columns 0..limit-1 lie below `bound`.
__device__ __forceinline__ int ColumnsBelow(int64_t bound, int limit) {
  return bound <= 0 ? 0 : (bound < limit ? static_cast<int>(bound) : limit);
}

// Whether the key tile k0 .. k0 + kStep - 1 lies wholly before the sliding window of every query
// of the warp from w0 (the earliest window starts at w0 - window + 1).
__device__ __forceinline__ bool BeforeWindow(int64_t k0, int64_t w0, int64_t window) {
  return window > 0 && k0 + kStep - 1 < w0 - window + 1;
}

__device__ __forceinline__ int LaneRow() { return (threadIdx.x % 32) / 2; }
__device__ __forceinline__ int LaneCol(int j) { return 2 * j + threadIdx.x % 2; }

// ---------------------------------------------------------------------------------------------
// Forward
// ---------------------------------------------------------------------------------------------

template <int D>
struct ForwardSmem {
  static constexpr bool kQInRegs = D <= 128;
  static constexpr int kScores = 0;          // per warp: scores, then probabilities
  static constexpr int kSpare = kAreaBytes;  // per warp: O rescaling and output staging
  static constexpr int kStages = 2 * kAreaBytes;
  static constexpr int kQ = kStages + StageLayout<D>::kStages * StageLayout<D>::kBytes;
  static constexpr int kBytes = kQ + (kQInRegs ? 0 : RoundUp128(kBlockRows * (D + 8) * 2));
};

// The lane's online-softmax state for its row: running max (lazily raised) and sum.
struct RowState {
  float m = -INFINITY;
  float l = 0.0f;
};

// One key tile for a warp: S = Q_w · Kᵀ over the `nf` key fragments that hold unmasked entries,
// online softmax with lazy rescaling, O_w += P · V.
template <int D, typename QFrags>
__device__ __forceinline__ void ForwardWarpStep(float* scores, float* spare, const Stage& st,
                                                const QFrags& qf, FragC (&o)[D / 16], RowState& row,
                                                int nf, int64_t k0, int64_t query, int64_t seq,
                                                float scale, int64_t window) {
  constexpr int kLd = D + 8;
  for (int n = 0; n < kStepFrags; ++n) {
    if (n >= nf) break;
    FragC acc;
    wmma::fill_fragment(acc, 0.0f);
    for (int kk = 0; kk < D / 16; ++kk) {
      FragA scratch;
      FragBT bt;
      wmma::load_matrix_sync(bt, st.a + n * 16 * kLd + kk * 16, kLd);
      wmma::mma_sync(acc, qf.At(kk, scratch), bt, acc);
    }
    wmma::store_matrix_sync(scores + n * 16, acc, kSLd, wmma::mem_row_major);
  }
  __syncwarp();

  const int r = LaneRow();
  const float* srow = scores + r * kSLd;
  // Unmasked columns: key k0 + col at or before the query, inside the sequence and the fragments
  // (and, under a sliding window, after query - window).
  const int hi = ColumnsBelow(query - k0 + 1 < seq - k0 ? query - k0 + 1 : seq - k0, nf * 16);
  const int lo = window > 0 ? ColumnsBelow(query - window + 1 - k0, nf * 16) : 0;
  auto valid = [&](int col) { return col >= lo && col < hi; };
  float tile_max = -INFINITY;
  for (int j = 0; j < kStep / 2; ++j) {
    const int col = LaneCol(j);
    if (valid(col)) tile_max = fmaxf(tile_max, srow[col] * scale);
  }
  tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
  // Raise the max only when it moved by more than the slack; O needs rescaling only then and
  // only if it holds anything (a row whose max was -inf has O = 0 and l = 0).
  const bool raise = tile_max > row.m + kRescaleSlack;
  const bool rescale = raise && row.m != -INFINITY;
  const float alpha = rescale ? __expf(row.m - tile_max) : 1.0f;
  if (raise) row.m = tile_max;
  const float base = row.m == -INFINITY ? 0.0f : row.m;
  // exp(s · scale − base) as one FMA and a base-2 exponential.
  const float scale2 = scale * kLog2e, base2 = base * kLog2e;

  // P overwrites S in place (bf16 row r at the bytes of fp32 row r): columns 0..31 are written
  // only after every lane has read them, and columns 32..63 land on the bytes of columns 16..31.
  __nv_bfloat16* prow = reinterpret_cast<__nv_bfloat16*>(scores) + r * kP16Ld;
  float sum = 0.0f;
  for (int half = 0; half < 2; ++half) {
    float p[kStep / 4];
    for (int j = 0; j < kStep / 4; ++j) {
      const int col = half * (kStep / 2) + LaneCol(j);
      p[j] = valid(col) ? exp2f(fmaf(srow[col], scale2, -base2)) : 0.0f;
      sum += p[j];
    }
    if (half == 0) __syncwarp();
    for (int j = 0; j < kStep / 4; ++j) {
      prow[half * (kStep / 2) + LaneCol(j)] = __float2bfloat16_rn(p[j]);
    }
  }
  sum += __shfl_xor_sync(0xffffffffu, sum, 1);
  row.l = row.l * alpha + sum;

  if (__any_sync(0xffffffffu, rescale)) {
    constexpr int kChunk = MinInt(kStepFrags, D / 16);
    for (int n0 = 0; n0 < D / 16; n0 += kChunk) {
      for (int n = 0; n < kChunk; ++n) {
        wmma::store_matrix_sync(spare + n * 16, o[n0 + n], kSLd, wmma::mem_row_major);
      }
      __syncwarp();
      for (int j = 0; j < kChunk * 8; ++j) spare[r * kSLd + LaneCol(j)] *= alpha;
      __syncwarp();
      for (int n = 0; n < kChunk; ++n) {
        wmma::load_matrix_sync(o[n0 + n], spare + n * 16, kSLd, wmma::mem_row_major);
      }
      __syncwarp();
    }
  }
  __syncwarp();

  for (int kk = 0; kk < kStepFrags; ++kk) {
    if (kk >= nf) break;
    FragA a;
    wmma::load_matrix_sync(a, reinterpret_cast<const __nv_bfloat16*>(scores) + kk * 16, kP16Ld);
    for (int n = 0; n < D / 16; ++n) {
      FragB bv;
      wmma::load_matrix_sync(bv, st.b + kk * 16 * kLd + n * 16, kLd);
      wmma::mma_sync(o[n], a, bv, o[n]);
    }
  }
}

// One block per (128-query tile, q head, sequence); warp w owns queries q0 + 16w .. q0 + 16w + 15.
template <int D>
__global__ void __launch_bounds__(kAttnThreads, D <= 64 ? 2 : 1)
    AttentionForwardKernel(float* out, float* lse, const float* q, const float* k, const float* v,
                           AttnShape shape) {
  using S = ForwardSmem<D>;
  PARAPLAN_DYNAMIC_SHARED(smem);
  const TokenLayout& l = shape.layout;
  const int64_t tiles = (l.seq + kBlockRows - 1) / kBlockRows;
  const int64_t q0 = (tiles - 1 - blockIdx.z) * kBlockRows;  // longest tiles first
  const int64_t h = blockIdx.x, b = blockIdx.y;
  const int64_t kvh = h / (shape.q_heads / shape.kv_heads);
  const int warp = threadIdx.x / 32;
  float* scores = reinterpret_cast<float*>(smem + S::kScores) + warp * 16 * kSLd;
  float* spare = reinterpret_cast<float*>(smem + S::kSpare) + warp * 16 * kSLd;
  const int64_t w0 = q0 + warp * 16;  // the warp's first query
  const int64_t query = w0 + LaneRow();

  // The warp's Q rows: staged in its score tile and held in registers, or resident.
  WarpRowFrags<D, S::kQInRegs> qf;
  {
    constexpr int kLd = D + 8;
    __nv_bfloat16* staging = S::kQInRegs
                                 ? reinterpret_cast<__nv_bfloat16*>(scores)
                                 : reinterpret_cast<__nv_bfloat16*>(smem + S::kQ) + warp * 16 * kLd;
    LoadWarpRows<D>(staging, kLd, q, l, w0, b, h, shape.q_heads);
    __syncwarp();
    qf.Init(staging, kLd);
    __syncwarp();
  }
  FragC o[D / 16];
  for (int n = 0; n < D / 16; ++n) wmma::fill_fragment(o[n], 0.0f);
  RowState row;

  const int64_t last_key = (q0 + kBlockRows < l.seq ? q0 + kBlockRows : l.seq) - 1;
  StepLoader<D, (D <= 64)> loader(StepSource{k, v, shape.kv_heads, nullptr, nullptr}, l, b);
  StreamTiles<D>(
      smem + S::kStages, loader, last_key / kStep + 1,
      [&](int64_t i, int64_t& t0, int64_t& hh, int64_t& /*stat_base*/) {
        t0 = i * kStep;
        hh = kvh;
      },
      [&](const Stage& st, int64_t i) {
        const int64_t k0 = i * kStep;
        if (w0 >= l.seq || k0 > w0 + 15) return;  // every row of the warp masked
        if (BeforeWindow(k0, w0, shape.window)) return;
        const int64_t keys = (w0 + 16 < l.seq ? w0 + 16 : l.seq) - k0;
        const int nf = static_cast<int>(keys < kStep ? (keys + 15) / 16 : kStepFrags);
        ForwardWarpStep<D>(scores, spare, st, qf, o, row, nf, k0, query, l.seq, shape.scale,
                           shape.window);
      });

  if (query < l.seq && threadIdx.x % 2 == 0) {
    lse[(b * shape.q_heads + h) * l.seq + query] = row.m + logf(row.l);
  }
  StoreWarpRows<D>(out, l, w0, b, h, shape.q_heads, o, spare, 1.0f / row.l);
}

// ---------------------------------------------------------------------------------------------
// Backward
// ---------------------------------------------------------------------------------------------

// delta[b, h, s] = Σ_d dout · out (fp32). A group of kDeltaLanes lanes per (token, head) reads
// the row with 16-byte loads (a warp covers 32 / kDeltaLanes adjacent heads, contiguous in
// memory) and adds its partial sums with shuffles in a fixed order (deterministic).
template <int D>
constexpr int kDeltaLanes = D / 4 < 16 ? D / 4 : 16;

template <int D>
__global__ void AttentionDeltaKernel(float* delta, const float* dout, const float* out,
                                     AttnShape shape) {
  constexpr int kLanes = kDeltaLanes<D>;
  constexpr int kRowsPerWarp = 32 / kLanes;
  const TokenLayout& l = shape.layout;
  const int64_t total = l.seq * l.batch * shape.q_heads;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * blockDim.x / 32;
  const int lane = threadIdx.x % 32;
  const int sub = lane % kLanes;
  // The warp's loop is uniform (every lane shuffles); items past the end add zeros.
  for (int64_t first =
           (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / 32 * kRowsPerWarp;
       first < total; first += warps * kRowsPerWarp) {
    const int64_t item = first + lane / kLanes;
    const int64_t h = item % shape.q_heads;
    const int64_t s = (item / shape.q_heads) % l.seq;
    const int64_t b = item / (shape.q_heads * l.seq);
    float acc = 0.0f;
    if (item < total) {
      const int64_t off = Offset<D>(l, s, b, h, shape.q_heads);
      for (int c = sub * 4; c < D; c += kLanes * 4) {
        const float4 x = *reinterpret_cast<const float4*>(dout + off + c);
        const float4 y = *reinterpret_cast<const float4*>(out + off + c);
        acc += x.x * y.x + x.y * y.y + x.z * y.z + x.w * y.w;
      }
    }
    for (int offset = kLanes / 2; offset > 0; offset >>= 1) {
      acc += __shfl_xor_sync(0xffffffffu, acc, offset);
    }
    if (sub == 0 && item < total) delta[(b * shape.q_heads + h) * l.seq + s] = acc;
  }
}

// Both backward kernels: per warp two fp32 16 × 64 tiles (scores and dP, overwritten in place by
// bf16 P and dS), the stages, and the block's two resident operand tiles past head_dim 64 (at or
// below it the warps hold their rows' fragments in registers, staged through their own tiles).
template <int D>
struct BackwardSmem {
  static constexpr bool kInRegs = D <= 64;
  static constexpr int kScores = 0;
  static constexpr int kGrads = kAreaBytes;
  static constexpr int kStages = 2 * kAreaBytes;
  static constexpr int kResident = kStages + StageLayout<D>::kStages * StageLayout<D>::kBytes;
  static constexpr int kResidentTile = RoundUp128(kBlockRows * (D + 8) * 2);
  static constexpr int kBytes = kResident + (kInRegs ? 0 : 2 * kResidentTile);
  static_assert(kBytes <= 227 * 1024, "attention backward does not fit in shared memory");
};

// A warp's own-row fragments of two tensors (Q and dO, or K and V), rows w0..w0+15.
template <int D>
struct WarpOperands {
  WarpRowFrags<D, BackwardSmem<D>::kInRegs> x, y;
};

template <int D>
__device__ void LoadWarpOperands(WarpOperands<D>& ops, unsigned char* smem, float* scores,
                                 float* grads, const float* x, const float* y, const TokenLayout& l,
                                 int64_t w0, int64_t b, int64_t h, int64_t heads) {
  using S = BackwardSmem<D>;
  constexpr int kLd = D + 8;
  const int warp = threadIdx.x / 32;
  __nv_bfloat16* xs = reinterpret_cast<__nv_bfloat16*>(scores);
  __nv_bfloat16* ys = reinterpret_cast<__nv_bfloat16*>(grads);
  if constexpr (!S::kInRegs) {
    xs = reinterpret_cast<__nv_bfloat16*>(smem + S::kResident) + warp * 16 * kLd;
    ys = reinterpret_cast<__nv_bfloat16*>(smem + S::kResident + S::kResidentTile) + warp * 16 * kLd;
  }
  LoadWarpRows<D>(xs, kLd, x, l, w0, b, h, heads);
  LoadWarpRows<D>(ys, kLd, y, l, w0, b, h, heads);
  __syncwarp();
  ops.x.Init(xs, kLd);
  ops.y.Init(ys, kLd);
  __syncwarp();
}

// The two score products of a warp over the streamed fragments [n_lo, n_hi): scores = X_w · Aᵀ
// and grads = Y_w · Bᵀ (16 × 64 fp32, the streamed tiles' rows as columns).
template <int D>
__device__ __forceinline__ void WarpScorePair(float* scores, float* grads,
                                              const WarpOperands<D>& ops, const __nv_bfloat16* a,
                                              const __nv_bfloat16* bt_src, int n_lo, int n_hi) {
  constexpr int kLd = D + 8;
  for (int n = 0; n < kStepFrags; ++n) {
    if (n < n_lo || n >= n_hi) continue;
    FragC s_acc, g_acc;
    wmma::fill_fragment(s_acc, 0.0f);
    wmma::fill_fragment(g_acc, 0.0f);
    for (int kk = 0; kk < D / 16; ++kk) {
      FragA scratch;
      FragBT bt;
      wmma::load_matrix_sync(bt, a + n * 16 * kLd + kk * 16, kLd);
      wmma::mma_sync(s_acc, ops.x.At(kk, scratch), bt, s_acc);
      wmma::load_matrix_sync(bt, bt_src + n * 16 * kLd + kk * 16, kLd);
      wmma::mma_sync(g_acc, ops.y.At(kk, scratch), bt, g_acc);
    }
    wmma::store_matrix_sync(scores + n * 16, s_acc, kSLd, wmma::mem_row_major);
    wmma::store_matrix_sync(grads + n * 16, g_acc, kSLd, wmma::mem_row_major);
  }
  __syncwarp();
}

// Probabilities and score gradients of the lane's row, in place: for each valid entry
// p = exp(scale · s − lse) and ds = p · (dp − delta) · scale; invalid entries are 0. Writes bf16
// P over the scores (when `keep_p`) and bf16 dS over the grads. `stats(col, lse, delta)` gives
// the entry's statistics and `valid(col)` its mask.
template <typename Valid, typename Stats>
__device__ __forceinline__ void ProbabilitiesAndGrads(float* scores, float* grads, bool keep_p,
                                                      float scale, Valid valid, Stats stats) {
  const int r = LaneRow();
  const float* srow = scores + r * kSLd;
  const float* grow = grads + r * kSLd;
  __nv_bfloat16* prow = reinterpret_cast<__nv_bfloat16*>(scores) + r * kP16Ld;
  __nv_bfloat16* dsrow = reinterpret_cast<__nv_bfloat16*>(grads) + r * kP16Ld;
  for (int half = 0; half < 2; ++half) {
    float p[kStep / 4], ds[kStep / 4];
    for (int j = 0; j < kStep / 4; ++j) {
      const int col = half * (kStep / 2) + LaneCol(j);
      p[j] = 0.0f;
      ds[j] = 0.0f;
      if (valid(col)) {
        float lse_v, delta_v;
        stats(col, lse_v, delta_v);
        p[j] = exp2f(fmaf(srow[col], scale * kLog2e, -lse_v * kLog2e));
        ds[j] = p[j] * (grow[col] - delta_v) * scale;
      }
    }
    if (half == 0) __syncwarp();  // see ForwardWarpStep: in-place bf16 over fp32
    for (int j = 0; j < kStep / 4; ++j) {
      const int col = half * (kStep / 2) + LaneCol(j);
      if (keep_p) prow[col] = __float2bfloat16_rn(p[j]);
      dsrow[col] = __float2bfloat16_rn(ds[j]);
    }
  }
  __syncwarp();
}

// One block per (128-key tile, kv head, sequence); warp w owns keys k0 + 16w .. k0 + 16w + 15.
template <int D>
__global__ void __launch_bounds__(kAttnThreads)
    AttentionBackwardKeyValueKernel(float* dk, float* dv, const float* dout, const float* lse,
                                    const float* delta, const float* q, const float* k,
                                    const float* v, AttnShape shape) {
  using S = BackwardSmem<D>;
  constexpr int kLd = D + 8;
  PARAPLAN_DYNAMIC_SHARED(smem);
  const TokenLayout& l = shape.layout;
  const int64_t k0 = static_cast<int64_t>(blockIdx.z) * kBlockRows;  // early keys: most queries
  const int64_t kvh = blockIdx.x, b = blockIdx.y;
  const int64_t group = shape.q_heads / shape.kv_heads;
  const int warp = threadIdx.x / 32;
  float* scores = reinterpret_cast<float*>(smem + S::kScores) + warp * 16 * kSLd;
  float* grads = reinterpret_cast<float*>(smem + S::kGrads) + warp * 16 * kSLd;
  const int64_t w0 = k0 + warp * 16;  // the warp's first key
  const int64_t key = w0 + LaneRow();

  WarpOperands<D> kv;
  LoadWarpOperands<D>(kv, smem, scores, grads, k, v, l, w0, b, kvh, shape.kv_heads);
  FragC dk_acc[D / 16], dv_acc[D / 16];
  for (int n = 0; n < D / 16; ++n) {
    wmma::fill_fragment(dk_acc[n], 0.0f);
    wmma::fill_fragment(dv_acc[n], 0.0f);
  }

  // Query tiles at or after the block's first key, for each q head of the group.
  const int64_t first = k0 / kStep;
  const int64_t per_head = (l.seq + kStep - 1) / kStep - first;
  StepLoader<D, (D <= 64)> loader(StepSource{q, dout, shape.q_heads, lse, delta}, l, b);
  StreamTiles<D>(
      smem + S::kStages, loader, group * per_head,
      [&](int64_t i, int64_t& t0, int64_t& h, int64_t& stat_base) {
        h = kvh * group + i / per_head;
        t0 = (first + i % per_head) * kStep;
        stat_base = (b * shape.q_heads + h) * l.seq;
      },
      [&](const Stage& st, int64_t i) {
        const int64_t q0 = (first + i % per_head) * kStep;
        if (w0 >= l.seq || q0 + kStep - 1 < w0) return;  // every query before the warp's keys
        // Every query past the sliding window of the warp's last key.
        if (shape.window > 0 && q0 > w0 + 15 + shape.window - 1) return;
        const int n_lo = w0 > q0 ? static_cast<int>((w0 - q0) / 16) : 0;
        const int64_t rows = l.seq - q0;
        const int n_hi = rows < kStep ? static_cast<int>((rows + 15) / 16) : kStepFrags;
        // Sᵀ_w = K_w · Qᵀ and dPᵀ_w = V_w · dOᵀ (16 keys × 64 queries).
        WarpScorePair<D>(scores, grads, kv, st.a, st.b, n_lo, n_hi);
        // Unmasked columns: query q0 + col at or after the key, inside the sequence and the
        // computed fragments (and, under a sliding window, before key + window).
        const int lo = MaxInt(n_lo * 16, static_cast<int>(key - q0 < kStep ? key - q0 : kStep));
        const int64_t end =
            shape.window > 0 && key + shape.window < l.seq ? key + shape.window : l.seq;
        const int hi = key < l.seq ? ColumnsBelow(end - q0, n_hi * 16) : 0;
        ProbabilitiesAndGrads(
            scores, grads, true, shape.scale, [&](int col) { return col >= lo && col < hi; },
            [&](int col, float& lse_v, float& delta_v) {
              lse_v = st.lse[col];
              delta_v = st.delta[col];
            });
        // dV_w += Pᵀ_w · dO and dK_w += dSᵀ_w · Q (16 keys × D).
        for (int kk = 0; kk < kStepFrags; ++kk) {
          if (kk < n_lo || kk >= n_hi) continue;
          FragA pa, dsa;
          wmma::load_matrix_sync(pa, reinterpret_cast<const __nv_bfloat16*>(scores) + kk * 16,
                                 kP16Ld);
          wmma::load_matrix_sync(dsa, reinterpret_cast<const __nv_bfloat16*>(grads) + kk * 16,
                                 kP16Ld);
          for (int n = 0; n < D / 16; ++n) {
            FragB bm;
            wmma::load_matrix_sync(bm, st.b + kk * 16 * kLd + n * 16, kLd);
            wmma::mma_sync(dv_acc[n], pa, bm, dv_acc[n]);
            wmma::load_matrix_sync(bm, st.a + kk * 16 * kLd + n * 16, kLd);
            wmma::mma_sync(dk_acc[n], dsa, bm, dk_acc[n]);
          }
        }
      });

  StoreWarpRows<D>(dk, l, w0, b, kvh, shape.kv_heads, dk_acc, scores, 1.0f);
  StoreWarpRows<D>(dv, l, w0, b, kvh, shape.kv_heads, dv_acc, grads, 1.0f);
}

// One block per (128-query tile, q head, sequence); warp w owns queries q0 + 16w .. q0 + 16w + 15.
template <int D>
__global__ void __launch_bounds__(kAttnThreads, D <= 64 ? 2 : 1)
    AttentionBackwardQueryKernel(float* dq, const float* dout, const float* lse, const float* delta,
                                 const float* q, const float* k, const float* v, AttnShape shape) {
  using S = BackwardSmem<D>;
  constexpr int kLd = D + 8;
  PARAPLAN_DYNAMIC_SHARED(smem);
  const TokenLayout& l = shape.layout;
  const int64_t tiles = (l.seq + kBlockRows - 1) / kBlockRows;
  const int64_t q0 = (tiles - 1 - blockIdx.z) * kBlockRows;  // longest tiles first
  const int64_t h = blockIdx.x, b = blockIdx.y;
  const int64_t kvh = h / (shape.q_heads / shape.kv_heads);
  const int warp = threadIdx.x / 32;
  float* scores = reinterpret_cast<float*>(smem + S::kScores) + warp * 16 * kSLd;
  float* grads = reinterpret_cast<float*>(smem + S::kGrads) + warp * 16 * kSLd;
  const int64_t w0 = q0 + warp * 16;  // the warp's first query
  const int64_t query = w0 + LaneRow();

  WarpOperands<D> qdo;
  LoadWarpOperands<D>(qdo, smem, scores, grads, q, dout, l, w0, b, h, shape.q_heads);
  const int64_t stat = (b * shape.q_heads + h) * l.seq + query;
  const float lse_row = query < l.seq ? lse[stat] : 0.0f;
  const float delta_row = query < l.seq ? delta[stat] : 0.0f;
  FragC dq_acc[D / 16];
  for (int n = 0; n < D / 16; ++n) wmma::fill_fragment(dq_acc[n], 0.0f);

  const int64_t last_key = (q0 + kBlockRows < l.seq ? q0 + kBlockRows : l.seq) - 1;
  StepLoader<D, false> loader(StepSource{k, v, shape.kv_heads, nullptr, nullptr}, l, b);
  StreamTiles<D>(
      smem + S::kStages, loader, last_key / kStep + 1,
      [&](int64_t i, int64_t& t0, int64_t& hh, int64_t& /*stat_base*/) {
        t0 = i * kStep;
        hh = kvh;
      },
      [&](const Stage& st, int64_t i) {
        const int64_t k0 = i * kStep;
        if (w0 >= l.seq || k0 > w0 + 15) return;  // every row of the warp masked
        if (BeforeWindow(k0, w0, shape.window)) return;
        const int64_t keys = (w0 + 16 < l.seq ? w0 + 16 : l.seq) - k0;
        const int nf = static_cast<int>(keys < kStep ? (keys + 15) / 16 : kStepFrags);
        // S_w = Q_w · Kᵀ and dP_w = dO_w · Vᵀ (16 queries × 64 keys).
        WarpScorePair<D>(scores, grads, qdo, st.a, st.b, 0, nf);
        // Unmasked columns: key k0 + col at or before the query, inside the sequence and the
        // computed fragments.
        const int64_t bound = query - k0 + 1 < l.seq - k0 ? query - k0 + 1 : l.seq - k0;
        const int hi = query < l.seq ? ColumnsBelow(bound, nf * 16) : 0;
        const int lo = shape.window > 0 ? ColumnsBelow(query - shape.window + 1 - k0, nf * 16) : 0;
        ProbabilitiesAndGrads(
            scores, grads, false, shape.scale, [&](int col) { return col >= lo && col < hi; },
            [&](int /*col*/, float& lse_v, float& delta_v) {
              lse_v = lse_row;
              delta_v = delta_row;
            });
        // dQ_w += dS_w · K (16 queries × D).
        for (int kk = 0; kk < kStepFrags; ++kk) {
          if (kk >= nf) break;
          FragA dsa;
          wmma::load_matrix_sync(dsa, reinterpret_cast<const __nv_bfloat16*>(grads) + kk * 16,
                                 kP16Ld);
          for (int n = 0; n < D / 16; ++n) {
            FragB bm;
            wmma::load_matrix_sync(bm, st.a + kk * 16 * kLd + n * 16, kLd);
            wmma::mma_sync(dq_acc[n], dsa, bm, dq_acc[n]);
          }
        }
      });

  StoreWarpRows<D>(dq, l, w0, b, h, shape.q_heads, dq_acc, scores, 1.0f);
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
  if (l.seq > 65535 * static_cast<int64_t>(kBlockRows) || q_heads > 65535 || l.batch > 65535) {
    throw CudaError("CUDA attention: sequence, heads or batch too large for the grid");
  }
  for (const void* p : pointers) {
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) {
      throw CudaError("CUDA attention: tensors must be 16-byte aligned");
    }
  }
}

// One block per (head, sequence, 128-row tile). Heads vary fastest and tiles slowest, so that
// blocks start in order of their tile: the causal work per tile is uneven, and the kernels map
// the first tiles to the longest work, which the GPU then schedules first (longest first keeps
// the last wave short).
dim3 AttentionGrid(const TokenLayout& l, int64_t heads) {
  const int64_t tiles = (l.seq + kBlockRows - 1) / kBlockRows;
  return dim3(static_cast<unsigned>(heads), static_cast<unsigned>(l.batch),
              static_cast<unsigned>(tiles));
}

template <int D, typename Kernel>
void PrepareKernel(Kernel kernel, int bytes) {
  // Opt in to more than 48 KiB of dynamic shared memory (Hopper allows 227 KiB per block).
  PARAPLAN_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  // All of the SM's unified L1/shared storage as shared memory: two 105 KiB blocks per SM at
  // head_dim 64 need it, and the kernels stream their global reads once (little L1 reuse).
  PARAPLAN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                           cudaSharedmemCarveoutMaxShared));
}

template <int D>
void LaunchForward(float* out, float* lse, const float* q, const float* k, const float* v,
                   const AttnShape& shape, cudaStream_t stream) {
  const int bytes = ForwardSmem<D>::kBytes;
  PrepareKernel<D>(AttentionForwardKernel<D>, bytes);
  PARAPLAN_LAUNCH(AttentionForwardKernel<D>, AttentionGrid(shape.layout, shape.q_heads),
                  kAttnThreads, bytes, stream, out, lse, q, k, v, shape);
  PARAPLAN_CUDA_CHECK_LAUNCH();
}

template <int D>
void LaunchBackward(float* dq, float* dk, float* dv, const float* dout, const float* out,
                    const float* lse, const float* q, const float* k, const float* v,
                    const AttnShape& shape, float* delta, cudaStream_t stream) {
  const TokenLayout& l = shape.layout;
  const int64_t items = l.seq * l.batch * shape.q_heads;
  PARAPLAN_LAUNCH(AttentionDeltaKernel<D>, GridFor(items * kDeltaLanes<D>), kThreads, 0, stream,
                  delta, dout, out, shape);
  PARAPLAN_CUDA_CHECK_LAUNCH();
  const int bytes = BackwardSmem<D>::kBytes;
  PrepareKernel<D>(AttentionBackwardKeyValueKernel<D>, bytes);
  PARAPLAN_LAUNCH(AttentionBackwardKeyValueKernel<D>, AttentionGrid(l, shape.kv_heads),
                  kAttnThreads, bytes, stream, dk, dv, dout, lse, delta, q, k, v, shape);
  PARAPLAN_CUDA_CHECK_LAUNCH();
  PrepareKernel<D>(AttentionBackwardQueryKernel<D>, bytes);
  PARAPLAN_LAUNCH(AttentionBackwardQueryKernel<D>, AttentionGrid(l, shape.q_heads), kAttnThreads,
                  bytes, stream, dq, dout, lse, delta, q, k, v, shape);
  PARAPLAN_CUDA_CHECK_LAUNCH();
}

}  // namespace

bool AttentionHeadDimSupported(int64_t head_dim) {
  // 192: multi-head latent attention's query/key heads (DeepSeek-V2/V3: 128 + 64).
  return head_dim == 16 || head_dim == 32 || head_dim == 64 || head_dim == 128 || head_dim == 192;
}

void AttentionForward(float* out, float* lse, const float* q, const float* k, const float* v,
                      const TokenLayout& layout, int64_t q_heads, int64_t kv_heads,
                      int64_t head_dim, float scale, int64_t window, cudaStream_t stream) {
  if (layout.seq <= 0 || layout.batch <= 0) return;
  CheckAttentionArguments(layout, q_heads, kv_heads, head_dim, {out, q, k, v});
  AttnShape shape{layout, q_heads, kv_heads, scale, window};
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
                       int64_t head_dim, float scale, int64_t window, float* scratch,
                       cudaStream_t stream) {
  if (layout.seq <= 0 || layout.batch <= 0) return;
  CheckAttentionArguments(layout, q_heads, kv_heads, head_dim, {dq, dk, dv, dout, out, q, k, v});
  AttnShape shape{layout, q_heads, kv_heads, scale, window};
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

// Angles in double, as the host computes them, once per (token, pair).
__global__ void RopeKernel(float* x, TokenLayout layout, int64_t heads, int64_t head_dim,
                           double theta, float sign) {
  // One block per token at a time: the cos and sin of its head_dim / 2 angles once, in double
  // as the host computes them, then every head's pairs (the rotation is the same per head).
  PARAPLAN_DYNAMIC_SHARED(smem);
  const int64_t half = head_dim / 2;
  float* const cos_of = reinterpret_cast<float*>(smem);
  float* const sin_of = cos_of + half;
  const int64_t tokens = layout.seq * layout.batch;
  for (int64_t t = blockIdx.x; t < tokens; t += gridDim.x) {
    const int64_t b = t % layout.batch, s = t / layout.batch;
    __syncthreads();  // the previous token's table is no longer read
    for (int64_t i = threadIdx.x; i < half; i += blockDim.x) {
      const double pos = static_cast<double>(layout.seq_offset + s);
      const double freq = pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(head_dim));
      double sn, cs;
      sincos(pos * freq, &sn, &cs);
      cos_of[i] = static_cast<float>(cs);
      sin_of[i] = sign * static_cast<float>(sn);
    }
    __syncthreads();
    float* const row = x + (s * layout.seq_stride + b * layout.batch_stride) * heads * head_dim;
    for (int64_t j = threadIdx.x; j < heads * half; j += blockDim.x) {
      const int64_t h = j / half, i = j % half;
      float* v = row + h * head_dim;
      const float a = v[i], z = v[i + half], c = cos_of[i], sgn = sin_of[i];
      v[i] = a * c - z * sgn;
      v[i + half] = a * sgn + z * c;
    }
  }
}

unsigned RopeGrid(const TokenLayout& layout) {
  return static_cast<unsigned>(std::min<int64_t>(layout.seq * layout.batch, 65535));
}

}  // namespace

void RopeForward(float* x, const TokenLayout& layout, int64_t heads, int64_t head_dim, float theta,
                 cudaStream_t stream) {
  const int64_t n = layout.seq * layout.batch * heads * (head_dim / 2);
  if (n <= 0) return;
  PARAPLAN_LAUNCH(RopeKernel, RopeGrid(layout), kThreads, head_dim * sizeof(float), stream, x,
                  layout, heads, head_dim, theta, 1.0f);
  PARAPLAN_CUDA_CHECK_LAUNCH();
}

void RopeBackward(float* dx, const TokenLayout& layout, int64_t heads, int64_t head_dim,
                  float theta, cudaStream_t stream) {
  const int64_t n = layout.seq * layout.batch * heads * (head_dim / 2);
  if (n <= 0) return;
  PARAPLAN_LAUNCH(RopeKernel, RopeGrid(layout), kThreads, head_dim * sizeof(float), stream, dx,
                  layout, heads, head_dim, theta, -1.0f);
  PARAPLAN_CUDA_CHECK_LAUNCH();
}

// NOLINTEND(bugprone-easily-swappable-parameters,
// bugprone-implicit-widening-of-multiplication-result)

}  // namespace paraplan::cuda
