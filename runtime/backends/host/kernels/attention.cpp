// Rotary embedding and causal grouped-query attention (flash-style: only the log-sum-exp of
// each query row is saved; backward recomputes the probabilities).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <vector>

#include "runtime/backends/host/kernels/kernels.h"
#include "runtime/backends/host/kernels/simd.h"

namespace paraplan::host {

namespace simd {
namespace {
bool CpuHasAvx512() {
#if PARAPLAN_HOST_HAVE_AVX512
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
         __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq");
#else
  return false;
#endif
}
std::atomic<int>& Width() {
  static std::atomic<int> width{CpuHasAvx512() ? 16 : 8};
  return width;
}
}  // namespace

int VectorWidth() { return Width().load(std::memory_order_relaxed); }
void SetVectorWidth(int lanes) { Width().store(lanes == 16 && CpuHasAvx512() ? 16 : 8); }
}  // namespace simd

// Kernel signatures follow the Backend interface (runtime/exec/backend.h) and the host
// specification: tensors as raw pointers and sizes in the specification's order, several of one
// type side by side; every argument is checked against the reference by the kernel tests.
// NOLINTBEGIN(bugprone-easily-swappable-parameters)

using simd::kLanes;
using simd::V8;

namespace {

PARAPLAN_HOST_CLONES void Rotate(float* x, const TokenLayout& layout, int64_t heads,
                                 int64_t head_dim, float theta, float sign) {
  const int64_t half = head_dim / 2;
  std::vector<float> cos_t(half), sin_t(half);
  std::vector<double> freqs(half);
  for (int64_t i = 0; i < half; ++i)
    freqs[i] = std::pow(static_cast<double>(theta), -2.0 * i / head_dim);
  for (int64_t s = 0; s < layout.seq; ++s) {
    const double pos = static_cast<double>(layout.seq_offset + s);
    for (int64_t i = 0; i < half; ++i) {
      const double freq = freqs[i];
      cos_t[i] = static_cast<float>(std::cos(pos * freq));
      sin_t[i] = sign * static_cast<float>(std::sin(pos * freq));
    }
    for (int64_t b = 0; b < layout.batch; ++b) {
      float* row = x + layout.Row(s, b) * heads * head_dim;
      for (int64_t h = 0; h < heads; ++h) {
        float* v = row + h * head_dim;
        for (int64_t i = 0; i < half; ++i) {
          const float a = v[i], c = v[i + half];
          v[i] = a * cos_t[i] - c * sin_t[i];
          v[i + half] = a * sin_t[i] + c * cos_t[i];
        }
      }
    }
  }
}

}  // namespace

void RopeForward(float* x, const TokenLayout& layout, int64_t heads, int64_t head_dim,
                 float theta) {
  Rotate(x, layout, heads, head_dim, theta, 1.0f);
}

void RopeBackward(float* dx, const TokenLayout& layout, int64_t heads, int64_t head_dim,
                  float theta) {
  Rotate(dx, layout, heads, head_dim, theta, -1.0f);
}

namespace {

// Copies head `h` of every position of sequence `b` into a contiguous [seq, head_dim] block.
// (Rows of a head are short: a loop beats a memcpy call.)
PARAPLAN_HOST_CLONES void GatherHead(float* dst, const float* src, const TokenLayout& layout,
                                     int64_t b, int64_t heads, int64_t h, int64_t head_dim) {
  for (int64_t s = 0; s < layout.seq; ++s) {
    const float* row = src + (layout.Row(s, b) * heads + h) * head_dim;
    float* to = dst + s * head_dim;
    for (int64_t d = 0; d < head_dim; ++d) to[d] = row[d];
  }
}

PARAPLAN_HOST_CLONES void ScatterHead(float* dst, const float* src, const TokenLayout& layout,
                                      int64_t b, int64_t heads, int64_t h, int64_t head_dim) {
  for (int64_t s = 0; s < layout.seq; ++s) {
    float* row = dst + (layout.Row(s, b) * heads + h) * head_dim;
    const float* from = src + s * head_dim;
    for (int64_t d = 0; d < head_dim; ++d) row[d] = from[d];
  }
}

// Lanes j0 + [0, 8) that are below n.
PARAPLAN_HOST_INLINE simd::I8 Below(int64_t j0, int64_t n) {
  const simd::I8 lane = {0, 1, 2, 3, 4, 5, 6, 7};
  return lane < static_cast<int32_t>(std::clamp<int64_t>(n - j0, -1, kLanes + 1));
}

// Lanes j0 + [0, 8) in [lo, n): the keys a query sees (lo = the first key of its sliding window).
PARAPLAN_HOST_INLINE simd::I8 Inside(int64_t j0, int64_t lo, int64_t n) {
  return Below(j0, n) & ~Below(j0, lo);
}

// The first key query i sees: i - window + 1 under a sliding window of `window` keys, else 0.
int64_t FirstKey(int64_t i, int64_t window) {
  return window > 0 ? std::max<int64_t>(0, i - window + 1) : 0;
}

constexpr int64_t kBlock = 4;  // query rows per block

// row r of sc (stride ld) becomes e^{row - m[r]} over [0, n8); sv[r] adds them up in 8 lanes,
// lane l taking j = l, l + 8, l + 16, ... in order.
PARAPLAN_HOST_CLONES void ExpBlock8(float* sc, int64_t ld, int64_t n8, const V8* m, V8* sv) {
  for (int64_t j = 0; j < n8; j += kLanes) {
    for (int64_t r = 0; r < kBlock; ++r) {
      float* row = sc + r * ld;
      const V8 e = simd::Exp(simd::Load(row + j) - m[r]);  // e^-inf = 0 past the row's keys
      simd::Store(row + j, e);
      sv[r] += e;
    }
  }
}

#if PARAPLAN_HOST_HAVE_AVX512
// The 16-lane paths fuse multiplies and adds (the file is otherwise built without contraction).
#define PARAPLAN_HOST_FUSED __attribute__((optimize("fp-contract=fast")))

typedef float V16f __attribute__((vector_size(64), aligned(4)));
typedef int32_t I16 __attribute__((vector_size(64), aligned(4)));

// ExpBlock8 on 16 lanes where it can (fused multiply-adds in the polynomial); each 16 adds its low
// then its high half to the 8 partial sums, the order ExpBlock8 adds them in.
PARAPLAN_HOST_AVX512 PARAPLAN_HOST_FUSED void ExpBlock16(float* sc, int64_t ld, int64_t n8,
                                                         const V8* m, V8* sv) {
  int64_t j = 0;
  for (; j + 16 <= n8; j += 16) {
    for (int64_t r = 0; r < kBlock; ++r) {
      float* row = sc + r * ld;
      const V16f mr = V16f{} + m[r][0];
      V16f x;
      __builtin_memcpy(&x, row + j, sizeof(x));
      const V16f e = simd::ExpT<V16f, I16>(x - mr);
      __builtin_memcpy(row + j, &e, sizeof(e));
      sv[r] += __builtin_shufflevector(e, e, 0, 1, 2, 3, 4, 5, 6, 7);
      sv[r] += __builtin_shufflevector(e, e, 8, 9, 10, 11, 12, 13, 14, 15);
    }
  }
  for (; j < n8; j += kLanes) {
    for (int64_t r = 0; r < kBlock; ++r) {
      float* row = sc + r * ld;
      const V8 e = simd::Exp(simd::Load(row + j) - m[r]);
      simd::Store(row + j, e);
      sv[r] += e;
    }
  }
}
#endif

void ExpBlock(float* sc, int64_t ld, int64_t n8, const V8* m, V8* sv) {
#if PARAPLAN_HOST_HAVE_AVX512
  if (simd::VectorWidth() == 16) return ExpBlock16(sc, ld, n8, m, sv);
#endif
  ExpBlock8(sc, ld, n8, m, sv);
}

// The causal softmax of a block's 4 rows at once: row r of sc (stride ld) holds raw scores of keys
// < i0 + r + 1, padded to n8 (a multiple of 8); they become probabilities (scaled by `scale`,
// max-shifted; zeros past the row's keys) and lse[r] the row's log-sum-exp. Under a sliding
// window (window > 0) row r sees only the keys from i0 + r - window + 1 (zeros before them). Each
// row's result is the same whatever the other rows hold. Rows past the block's end (r >= rows)
// hold scores of zero-padded queries; they are computed too and then zeroed. Interleaving the 4
// rows gives the CPU independent exponentials to overlap (a single row of a short sequence is one
// long chain).
PARAPLAN_HOST_CLONES void SoftmaxBlock(float* sc, int64_t ld, int64_t rows, int64_t i0, int64_t n8,
                                       float scale, float* lse, int64_t window) {
  const V8 minus_inf = simd::Splat(-INFINITY);
  V8 mv[kBlock] = {minus_inf, minus_inf, minus_inf, minus_inf};
  const int64_t lo = window > 0 ? i0 - window + 1 : -kLanes;  // row 0's first key
  for (int64_t j = 0; j < n8; j += kLanes) {
    for (int64_t r = 0; r < kBlock; ++r) {
      float* row = sc + r * ld;
      const V8 x = Inside(j, lo + r, i0 + r + 1) ? simd::Load(row + j) * scale : minus_inf;
      simd::Store(row + j, x);
      mv[r] = x > mv[r] ? x : mv[r];
    }
  }
  float mx[kBlock];
  V8 m[kBlock], sv[kBlock] = {};
  for (int64_t r = 0; r < kBlock; ++r) mx[r] = simd::Max(mv[r]), m[r] = simd::Splat(mx[r]);
  ExpBlock(sc, ld, n8, m, sv);
  V8 inv[kBlock];
  for (int64_t r = 0; r < kBlock; ++r) {
    const float sum = simd::Sum(sv[r]);
    inv[r] = simd::Splat(1.0f / sum);
    if (r < rows) lse[r] = mx[r] + std::log(sum);
  }
  for (int64_t j = 0; j < n8; j += kLanes) {
    for (int64_t r = 0; r < kBlock; ++r) {
      float* row = sc + r * ld;
      simd::Store(row + j, r < rows ? simd::Load(row + j) * inv[r] : V8{});
    }
  }
}

// Recomputes row i of the probabilities from raw scores and the saved log-sum-exp:
// row[j] = e^{row[j]·scale - lse} for lo <= j < n, zeros elsewhere up to n8 (a multiple of 8).
PARAPLAN_HOST_CLONES void ProbabilityRow(float* row, int64_t lo, int64_t n, int64_t n8, float scale,
                                         float lse) {
  const V8 l = simd::Splat(lse), zero{};
  for (int64_t j = 0; j < n8; j += kLanes) {
    const V8 e = simd::Exp(simd::Load(row + j) * scale - l);
    simd::Store(row + j, Inside(j, lo, n) ? e : zero);
  }
}

// dS = P ∘ (dP - delta) · scale over [0, n), zeros after; returns nothing.
PARAPLAN_HOST_CLONES void ScoreGradRow(float* dp, const float* p, int64_t n, int64_t seq,
                                       float delta, float scale) {
  for (int64_t j = 0; j < n; ++j) dp[j] = p[j] * (dp[j] - delta) * scale;
  for (int64_t j = n; j < seq; ++j) dp[j] = 0.0f;
}

PARAPLAN_HOST_CLONES float DotRow(const float* a, const float* b, int64_t n) {
  V8 acc{};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) acc += simd::Load(a + i) * simd::Load(b + i);
  if (i < n) acc += simd::LoadPart(a + i, n - i) * simd::LoadPart(b + i, n - i);
  return simd::Sum(acc);
}

// Blocks of 4 query rows against the keys, on 8-lane vectors: the causal mask is applied by
// never computing a block's scores past its last row, so only the lower triangle (rounded up to
// 8 keys) is computed. Rows of a block are padded with zeros to 4; key columns to 8.

// The three tiles below are written once over the vector width W (8 or 16 lanes) and compiled
// twice: on 8-lane vectors in the AVX2 and baseline clones, and on 16-lane vectors for CPUs with
// AVX-512, where the main loops run on 64-byte registers and the leftovers on 8 lanes. Each
// element is summed over d (or j) in the same order at either width; the 16-lane paths fuse each
// multiply and add (PARAPLAN_HOST_FUSED), so they round differently from the 8-lane ones, the same
// way on every run.
typedef float V16 __attribute__((vector_size(64), aligned(4)));

// Unaligned loads and stores of either width (a template argument drops the typedefs' aligned(4),
// so they go through memcpy, which compiles to one unaligned move).
template <typename V>
PARAPLAN_HOST_INLINE V LoadW(const float* p) {
  V v;
  __builtin_memcpy(&v, p, sizeof(V));
  return v;
}
template <typename V>
PARAPLAN_HOST_INLINE void StoreW(float* p, V v) {
  __builtin_memcpy(p, &v, sizeof(V));
}

// sc[r][j0, j0 + W) for the 4 rows of q (row stride hd); kt is [hd][ld], sc is [4][ld].
template <typename V>
PARAPLAN_HOST_INLINE void ScoreColumns(float* sc, const float* q, const float* kt, int64_t ld,
                                       int64_t hd, int64_t j0) {
  const float *q0 = q, *q1 = q + hd, *q2 = q + 2 * hd, *q3 = q + 3 * hd;
  V a0{}, a1{}, a2{}, a3{};
  const float* kp = kt + j0;
  for (int64_t d = 0; d < hd; ++d, kp += ld) {
    const V k = LoadW<V>(kp);
    a0 += q0[d] * k;
    a1 += q1[d] * k;
    a2 += q2[d] * k;
    a3 += q3[d] * k;
  }
  StoreW(sc + j0, a0);
  StoreW(sc + ld + j0, a1);
  StoreW(sc + 2 * ld + j0, a2);
  StoreW(sc + 3 * ld + j0, a3);
}

// sc[r][j] = Σ_d q[r][d] · kt[d][j] for the 4 rows of q (row stride hd) and keys j < n8 (a
// multiple of 8); kt is [hd][ld], sc is [4][ld].
template <typename V>
PARAPLAN_HOST_INLINE void ScoreBlockW(float* sc, const float* q, const float* kt, int64_t ld,
                                      int64_t hd, int64_t n8) {
  constexpr int64_t kW = sizeof(V) / sizeof(float);
  const float *q0 = q, *q1 = q + hd, *q2 = q + 2 * hd, *q3 = q + 3 * hd;
  int64_t j = 0;
  for (; j + 2 * kW <= n8; j += 2 * kW) {  // 4 rows × 2W keys
    V a0{}, a1{}, a2{}, a3{}, b0{}, b1{}, b2{}, b3{};
    const float* kp = kt + j;
    for (int64_t d = 0; d < hd; ++d, kp += ld) {
      const V k0 = LoadW<V>(kp), k1 = LoadW<V>(kp + kW);
      const float x0 = q0[d], x1 = q1[d], x2 = q2[d], x3 = q3[d];
      a0 += x0 * k0;
      b0 += x0 * k1;
      a1 += x1 * k0;
      b1 += x1 * k1;
      a2 += x2 * k0;
      b2 += x2 * k1;
      a3 += x3 * k0;
      b3 += x3 * k1;
    }
    StoreW(sc + j, a0), StoreW(sc + j + kW, b0);
    StoreW(sc + ld + j, a1), StoreW(sc + ld + j + kW, b1);
    StoreW(sc + 2 * ld + j, a2), StoreW(sc + 2 * ld + j + kW, b2);
    StoreW(sc + 3 * ld + j, a3), StoreW(sc + 3 * ld + j + kW, b3);
  }
  for (; j + kW <= n8; j += kW) ScoreColumns<V>(sc, q, kt, ld, hd, j);
  for (; j < n8; j += kLanes) ScoreColumns<V8>(sc, q, kt, ld, hd, j);
}

// out[r][c0, c0 + W) = Σ_{j<n} p[r][j] · m[j][c0, c0 + W) for the block's rows (cnt < W columns
// when `part`, on 8 lanes only).
template <typename V, bool kPart = false>
PARAPLAN_HOST_INLINE void TimesColumns(float* const* out, int64_t rows, const float* p, int64_t ld,
                                       const float* m, int64_t n, int64_t hd, int64_t c,
                                       int64_t cnt) {
  V a0{}, a1{}, a2{}, a3{};
  for (int64_t j = 0; j < n; ++j) {
    V v;
    if constexpr (kPart)
      v = simd::LoadPart(m + j * hd + c, cnt);
    else
      v = LoadW<V>(m + j * hd + c);
    a0 += p[j] * v;
    a1 += p[ld + j] * v;
    a2 += p[2 * ld + j] * v;
    a3 += p[3 * ld + j] * v;
  }
  const V acc[kBlock] = {a0, a1, a2, a3};
  for (int64_t r = 0; r < rows; ++r) {
    if constexpr (kPart)
      simd::StorePart(out[r] + c, acc[r], cnt);
    else
      StoreW(out[r] + c, acc[r]);
  }
}

// out[r][:] = Σ_{j<n} p[r][j] · m[j][:] for the block's first `rows` rows (p is [4][ld], m is
// [n][hd]); out[r] is a row pointer each.
template <typename V>
PARAPLAN_HOST_INLINE void BlockTimesW(float* const* out, int64_t rows, const float* p, int64_t ld,
                                      const float* m, int64_t n, int64_t hd) {
  constexpr int64_t kW = sizeof(V) / sizeof(float);
  int64_t c = 0;
  for (; c + 2 * kW <= hd; c += 2 * kW) {  // 4 rows × 2W columns
    V a0{}, a1{}, a2{}, a3{}, b0{}, b1{}, b2{}, b3{};
    for (int64_t j = 0; j < n; ++j) {
      const V v0 = LoadW<V>(m + j * hd + c), v1 = LoadW<V>(m + j * hd + c + kW);
      const float x0 = p[j], x1 = p[ld + j], x2 = p[2 * ld + j], x3 = p[3 * ld + j];
      a0 += x0 * v0;
      b0 += x0 * v1;
      a1 += x1 * v0;
      b1 += x1 * v1;
      a2 += x2 * v0;
      b2 += x2 * v1;
      a3 += x3 * v0;
      b3 += x3 * v1;
    }
    const V lo[kBlock] = {a0, a1, a2, a3}, hi[kBlock] = {b0, b1, b2, b3};
    for (int64_t r = 0; r < rows; ++r) {
      StoreW(out[r] + c, lo[r]);
      StoreW(out[r] + c + kW, hi[r]);
    }
  }
  for (; c + kW <= hd; c += kW) TimesColumns<V>(out, rows, p, ld, m, n, hd, c, kW);
  for (; c + kLanes <= hd; c += kLanes) TimesColumns<V8>(out, rows, p, ld, m, n, hd, c, kLanes);
  if (c < hd) TimesColumns<V8, true>(out, rows, p, ld, m, n, hd, c, hd - c);
}

// acc[j][c0, c0 + W) += Σ_r p[r][j] · m[r][c0, c0 + W) for j < n (cnt < 8 columns when kPart).
template <typename V, bool kPart = false>
PARAPLAN_HOST_INLINE void TransposeTimesColumns(float* acc, const float* p, int64_t ld,
                                                const float* m, int64_t n, int64_t hd, int64_t c,
                                                int64_t cnt) {
  V m0, m1, m2, m3;
  if constexpr (kPart) {
    m0 = simd::LoadPart(m + c, cnt), m1 = simd::LoadPart(m + hd + c, cnt);
    m2 = simd::LoadPart(m + 2 * hd + c, cnt), m3 = simd::LoadPart(m + 3 * hd + c, cnt);
  } else {
    m0 = LoadW<V>(m + c), m1 = LoadW<V>(m + hd + c);
    m2 = LoadW<V>(m + 2 * hd + c), m3 = LoadW<V>(m + 3 * hd + c);
  }
  for (int64_t j = 0; j < n; ++j) {
    float* a = acc + j * hd + c;
    V x;
    if constexpr (kPart)
      x = simd::LoadPart(a, cnt);
    else
      x = LoadW<V>(a);
    x += p[j] * m0;
    x += p[ld + j] * m1;
    x += p[2 * ld + j] * m2;
    x += p[3 * ld + j] * m3;
    if constexpr (kPart)
      simd::StorePart(a, x, cnt);
    else
      StoreW(a, x);
  }
}

// acc[j][:] += Σ_r p[r][j] · m[r][:] for j < n (p is [4][ld], m the block's 4 rows of hd, acc
// [n][hd]); each element adds the 4 rows in order.
template <typename V>
PARAPLAN_HOST_INLINE void BlockTransposeTimesW(float* acc, const float* p, int64_t ld,
                                               const float* m, int64_t n, int64_t hd) {
  constexpr int64_t kW = sizeof(V) / sizeof(float);
  int64_t c = 0;
  for (; c + 2 * kW <= hd; c += 2 * kW) {  // the block's 4 rows × 2W columns in registers
    const V m0 = LoadW<V>(m + c), n0 = LoadW<V>(m + c + kW);
    const V m1 = LoadW<V>(m + hd + c), n1 = LoadW<V>(m + hd + c + kW);
    const V m2 = LoadW<V>(m + 2 * hd + c), n2 = LoadW<V>(m + 2 * hd + c + kW);
    const V m3 = LoadW<V>(m + 3 * hd + c), n3 = LoadW<V>(m + 3 * hd + c + kW);
    for (int64_t j = 0; j < n; ++j) {
      const float p0 = p[j], p1 = p[ld + j], p2 = p[2 * ld + j], p3 = p[3 * ld + j];
      float* a = acc + j * hd + c;
      V x = LoadW<V>(a), y = LoadW<V>(a + kW);
      x += p0 * m0;
      y += p0 * n0;
      x += p1 * m1;
      y += p1 * n1;
      x += p2 * m2;
      y += p2 * n2;
      x += p3 * m3;
      y += p3 * n3;
      StoreW(a, x);
      StoreW(a + kW, y);
    }
  }
  for (; c + kW <= hd; c += kW) TransposeTimesColumns<V>(acc, p, ld, m, n, hd, c, kW);
  for (; c + kLanes <= hd; c += kLanes) TransposeTimesColumns<V8>(acc, p, ld, m, n, hd, c, kLanes);
  if (c < hd) TransposeTimesColumns<V8, true>(acc, p, ld, m, n, hd, c, hd - c);
}

PARAPLAN_HOST_CLONES void ScoreBlock8(float* sc, const float* q, const float* kt, int64_t ld,
                                      int64_t hd, int64_t n8) {
  ScoreBlockW<V8>(sc, q, kt, ld, hd, n8);
}
PARAPLAN_HOST_CLONES void BlockTimes8(float* const* out, int64_t rows, const float* p, int64_t ld,
                                      const float* m, int64_t n, int64_t hd) {
  BlockTimesW<V8>(out, rows, p, ld, m, n, hd);
}
PARAPLAN_HOST_CLONES void BlockTransposeTimes8(float* acc, const float* p, int64_t ld,
                                               const float* m, int64_t n, int64_t hd) {
  BlockTransposeTimesW<V8>(acc, p, ld, m, n, hd);
}

#if PARAPLAN_HOST_HAVE_AVX512
PARAPLAN_HOST_AVX512 PARAPLAN_HOST_FUSED void ScoreBlock16(float* sc, const float* q,
                                                           const float* kt, int64_t ld, int64_t hd,
                                                           int64_t n8) {
  ScoreBlockW<V16>(sc, q, kt, ld, hd, n8);
}
PARAPLAN_HOST_AVX512 PARAPLAN_HOST_FUSED void BlockTimes16(float* const* out, int64_t rows,
                                                           const float* p, int64_t ld,
                                                           const float* m, int64_t n, int64_t hd) {
  BlockTimesW<V16>(out, rows, p, ld, m, n, hd);
}
PARAPLAN_HOST_AVX512 PARAPLAN_HOST_FUSED void BlockTransposeTimes16(float* acc, const float* p,
                                                                    int64_t ld, const float* m,
                                                                    int64_t n, int64_t hd) {
  BlockTransposeTimesW<V16>(acc, p, ld, m, n, hd);
}
#endif

// The tile set for this CPU: 16 lanes where AVX-512 is there (unless a test turned it off), else 8.
struct Tiles {
  void (*score)(float*, const float*, const float*, int64_t, int64_t, int64_t) = ScoreBlock8;
  void (*times)(float* const*, int64_t, const float*, int64_t, const float*, int64_t,
                int64_t) = BlockTimes8;
  void (*transpose_times)(float*, const float*, int64_t, const float*, int64_t,
                          int64_t) = BlockTransposeTimes8;
};

Tiles TilesFor(int lanes) {
  Tiles t;
#if PARAPLAN_HOST_HAVE_AVX512
  if (lanes == 16) {
    t.score = ScoreBlock16;
    t.times = BlockTimes16;
    t.transpose_times = BlockTransposeTimes16;
  }
#else
  (void)lanes;
#endif
  return t;
}

const Tiles& TilesForCpu() {
  static const Tiles kWide = TilesFor(16), kNarrow = TilesFor(8);
  return simd::VectorWidth() == 16 ? kWide : kNarrow;
}

void ScoreBlock(float* sc, const float* q, const float* kt, int64_t ld, int64_t hd, int64_t n8) {
  TilesForCpu().score(sc, q, kt, ld, hd, n8);
}
void BlockTimes(float* const* out, int64_t rows, const float* p, int64_t ld, const float* m,
                int64_t n, int64_t hd) {
  TilesForCpu().times(out, rows, p, ld, m, n, hd);
}
void BlockTransposeTimes(float* acc, const float* p, int64_t ld, const float* m, int64_t n,
                         int64_t hd) {
  TilesForCpu().transpose_times(acc, p, ld, m, n, hd);
}

// dst[d][s] = src[s][d] for s < seq (dst row stride ld; padding columns stay as they are).
void Transpose(float* dst, const float* src, int64_t seq, int64_t hd, int64_t ld) {
  for (int64_t s = 0; s < seq; ++s)
    for (int64_t d = 0; d < hd; ++d) dst[d * ld + s] = src[s * hd + d];
}

int64_t RoundUp(int64_t x, int64_t to) { return (x + to - 1) / to * to; }

}  // namespace

// Per (sequence, query head): blocks of 4 query rows take their scores against the keys up to
// their last row (the causal lower triangle, rounded up to 8 keys; under a sliding window from
// the block's first row's first key, rounded down to 8), the softmax, then the output, all on
// 8-lane vectors. A head's result never depends on the other heads, so head-sharded
// (tensor-parallel) runs reproduce the one-rank bits.
void AttentionForward(float* out, float* lse, const float* q, const float* k, const float* v,
                      const TokenLayout& layout, int64_t q_heads, int64_t kv_heads,
                      int64_t head_dim, float scale, int64_t window) {
  const int64_t seq = layout.seq, group = q_heads / kv_heads, hd = head_dim;
  const int64_t ld = RoundUp(seq, kLanes), rows4 = RoundUp(seq, kBlock);
  std::vector<float> qh(rows4 * hd, 0.0f), kh(seq * hd), vh(seq * hd), kt(hd * ld, 0.0f),
      sc(kBlock * ld);
  for (int64_t b = 0; b < layout.batch; ++b) {
    for (int64_t g = 0; g < kv_heads; ++g) {
      GatherHead(kh.data(), k, layout, b, kv_heads, g, hd);
      GatherHead(vh.data(), v, layout, b, kv_heads, g, hd);
      Transpose(kt.data(), kh.data(), seq, hd, ld);
      for (int64_t h = g * group; h < (g + 1) * group; ++h) {
        GatherHead(qh.data(), q, layout, b, q_heads, h, hd);
        float* l = lse + (b * q_heads + h) * seq;
        for (int64_t i0 = 0; i0 < seq; i0 += kBlock) {
          const int64_t rows = std::min(kBlock, seq - i0), n = i0 + rows, n8 = RoundUp(n, kLanes);
          const int64_t j0 = FirstKey(i0, window) / kLanes * kLanes;  // the block's first key
          ScoreBlock(sc.data() + j0, qh.data() + i0 * hd, kt.data() + j0, ld, hd, n8 - j0);
          SoftmaxBlock(sc.data() + j0, ld, rows, i0 - j0, n8 - j0, scale, l + i0, window);
          float* dst[kBlock];
          for (int64_t r = 0; r < rows; ++r)
            dst[r] = out + (layout.Row(i0 + r, b) * q_heads + h) * hd;
          BlockTimes(dst, rows, sc.data() + j0, ld, vh.data() + j0 * hd, n - j0, hd);
        }
      }
    }
  }
}

void AttentionBackward(float* dq, float* dk, float* dv, const float* dout, const float* out,
                       const float* lse, const float* q, const float* k, const float* v,
                       const TokenLayout& layout, int64_t q_heads, int64_t kv_heads,
                       int64_t head_dim, float scale, int64_t window) {
  const int64_t seq = layout.seq, group = q_heads / kv_heads, hd = head_dim;
  const int64_t ld = RoundUp(seq, kLanes), rows4 = RoundUp(seq, kBlock);
  std::vector<float> qh(rows4 * hd, 0.0f), oh(rows4 * hd, 0.0f), gh(rows4 * hd, 0.0f), kh(seq * hd),
      vh(seq * hd), kt(hd * ld, 0.0f), vt(hd * ld, 0.0f), dkh(seq * hd), dvh(seq * hd),
      p(kBlock * ld), dp(kBlock * ld);
  for (int64_t b = 0; b < layout.batch; ++b) {
    for (int64_t g = 0; g < kv_heads; ++g) {
      GatherHead(kh.data(), k, layout, b, kv_heads, g, hd);
      GatherHead(vh.data(), v, layout, b, kv_heads, g, hd);
      Transpose(kt.data(), kh.data(), seq, hd, ld);
      Transpose(vt.data(), vh.data(), seq, hd, ld);
      std::fill(dkh.begin(), dkh.end(), 0.0f);
      std::fill(dvh.begin(), dvh.end(), 0.0f);
      for (int64_t h = g * group; h < (g + 1) * group; ++h) {
        GatherHead(qh.data(), q, layout, b, q_heads, h, hd);
        GatherHead(oh.data(), out, layout, b, q_heads, h, hd);
        GatherHead(gh.data(), dout, layout, b, q_heads, h, hd);
        const float* l = lse + (b * q_heads + h) * seq;
        for (int64_t i0 = 0; i0 < seq; i0 += kBlock) {
          const int64_t rows = std::min(kBlock, seq - i0), n = i0 + rows, n8 = RoundUp(n, kLanes);
          // Columns from the block's first key j0 (0 without a sliding window), as forward.
          const int64_t j0 = FirstKey(i0, window) / kLanes * kLanes, w8 = n8 - j0;
          // P recomputed from the saved log-sum-exp; dP = dO Vᵀ; dS = P (dP - delta) scale.
          ScoreBlock(p.data() + j0, qh.data() + i0 * hd, kt.data() + j0, ld, hd, w8);
          ScoreBlock(dp.data() + j0, gh.data() + i0 * hd, vt.data() + j0, ld, hd, w8);
          float* dst[kBlock];
          for (int64_t r = 0; r < kBlock; ++r) {
            float* pr = p.data() + r * ld + j0;
            float* dr = dp.data() + r * ld + j0;
            if (r < rows) {
              const int64_t i = i0 + r;
              ProbabilityRow(pr, FirstKey(i, window) - j0, i + 1 - j0, w8, scale, l[i]);
              const float delta = DotRow(gh.data() + i * hd, oh.data() + i * hd, hd);
              ScoreGradRow(dr, pr, i + 1 - j0, w8, delta, scale);
              dst[r] = dq + (layout.Row(i, b) * q_heads + h) * hd;
            } else {
              std::fill(pr, pr + w8, 0.0f);
              std::fill(dr, dr + w8, 0.0f);
            }
          }
          // dQ = dS K (written); dV += Pᵀ dO; dK += dSᵀ Q.
          BlockTimes(dst, rows, dp.data() + j0, ld, kh.data() + j0 * hd, n - j0, hd);
          BlockTransposeTimes(dvh.data() + j0 * hd, p.data() + j0, ld, gh.data() + i0 * hd, n - j0,
                              hd);
          BlockTransposeTimes(dkh.data() + j0 * hd, dp.data() + j0, ld, qh.data() + i0 * hd, n - j0,
                              hd);
        }
      }
      ScatterHead(dk, dkh.data(), layout, b, kv_heads, g, hd);
      ScatterHead(dv, dvh.data(), layout, b, kv_heads, g, hd);
    }
  }
}

// NOLINTEND(bugprone-easily-swappable-parameters)

}  // namespace paraplan::host
