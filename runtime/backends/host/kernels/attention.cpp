// Rotary embedding and causal grouped-query attention (flash-style: only the log-sum-exp of
// each query row is saved; backward recomputes the probabilities).
#include <algorithm>
#include <cmath>
#include <vector>

#include "runtime/backends/host/kernels/kernels.h"
#include "runtime/backends/host/kernels/simd.h"

namespace paraplan::host {

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
  return lane < static_cast<int32_t>(n - j0);
}

// Row i of the causal softmax over a row of n8 entries (a multiple of 8): row[0..n) holds raw
// scores; they become probabilities (scaled by `scale`, max-shifted), the rest of the row zeros.
// Returns the log-sum-exp.
PARAPLAN_HOST_CLONES float SoftmaxRow(float* row, int64_t n, int64_t n8, float scale) {
  const V8 minus_inf = simd::Splat(-INFINITY);
  V8 mv = minus_inf;
  for (int64_t j = 0; j < n8; j += kLanes) {
    const V8 x = Below(j, n) ? simd::Load(row + j) * scale : minus_inf;
    simd::Store(row + j, x);
    mv = x > mv ? x : mv;
  }
  const float mx = simd::Max(mv);
  const V8 m = simd::Splat(mx);
  V8 sv{};
  for (int64_t j = 0; j < n8; j += kLanes) {
    const V8 e = simd::Exp(simd::Load(row + j) - m);  // e^-inf = 0 past n
    simd::Store(row + j, e);
    sv += e;
  }
  const float sum = simd::Sum(sv);
  const V8 inv = simd::Splat(1.0f / sum);
  for (int64_t j = 0; j < n8; j += kLanes) simd::Store(row + j, simd::Load(row + j) * inv);
  return mx + std::log(sum);
}

// Recomputes row i of the probabilities from raw scores and the saved log-sum-exp:
// row[j] = e^{row[j]·scale - lse} for j < n, zeros after, up to n8 (a multiple of 8).
PARAPLAN_HOST_CLONES void ProbabilityRow(float* row, int64_t n, int64_t n8, float scale,
                                         float lse) {
  const V8 l = simd::Splat(lse), zero{};
  for (int64_t j = 0; j < n8; j += kLanes) {
    const V8 e = simd::Exp(simd::Load(row + j) * scale - l);
    simd::Store(row + j, Below(j, n) ? e : zero);
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
constexpr int64_t kBlock = 4;

// sc[r][j] = Σ_d q[r][d] · kt[d][j] for the 4 rows of q (row stride hd) and keys j < n8 (a
// multiple of 8); kt is [hd][ld], sc is [4][ld].
PARAPLAN_HOST_CLONES void ScoreBlock(float* sc, const float* q, const float* kt, int64_t ld,
                                     int64_t hd, int64_t n8) {
  const float *q0 = q, *q1 = q + hd, *q2 = q + 2 * hd, *q3 = q + 3 * hd;
  int64_t j = 0;
  for (; j + 2 * kLanes <= n8; j += 2 * kLanes) {  // 4 rows × 16 keys
    V8 a0{}, a1{}, a2{}, a3{}, b0{}, b1{}, b2{}, b3{};
    const float* kp = kt + j;
    for (int64_t d = 0; d < hd; ++d, kp += ld) {
      const V8 k0 = simd::Load(kp), k1 = simd::Load(kp + kLanes);
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
    simd::Store(sc + j, a0), simd::Store(sc + j + kLanes, b0);
    simd::Store(sc + ld + j, a1), simd::Store(sc + ld + j + kLanes, b1);
    simd::Store(sc + 2 * ld + j, a2), simd::Store(sc + 2 * ld + j + kLanes, b2);
    simd::Store(sc + 3 * ld + j, a3), simd::Store(sc + 3 * ld + j + kLanes, b3);
  }
  for (; j < n8; j += kLanes) {
    V8 a0{}, a1{}, a2{}, a3{};
    const float* kp = kt + j;
    for (int64_t d = 0; d < hd; ++d, kp += ld) {
      const V8 k = simd::Load(kp);
      a0 += q0[d] * k;
      a1 += q1[d] * k;
      a2 += q2[d] * k;
      a3 += q3[d] * k;
    }
    simd::Store(sc + j, a0);
    simd::Store(sc + ld + j, a1);
    simd::Store(sc + 2 * ld + j, a2);
    simd::Store(sc + 3 * ld + j, a3);
  }
}

// out[r][:] = Σ_{j<n} p[r][j] · m[j][:] for the block's first `rows` rows (p is [4][ld], m is
// [n][hd]); out[r] is a row pointer each.
PARAPLAN_HOST_CLONES void BlockTimes(float* const* out, int64_t rows, const float* p, int64_t ld,
                                     const float* m, int64_t n, int64_t hd) {
  int64_t c = 0;
  for (; c + 2 * kLanes <= hd; c += 2 * kLanes) {  // 4 rows × 16 columns
    V8 a0{}, a1{}, a2{}, a3{}, b0{}, b1{}, b2{}, b3{};
    for (int64_t j = 0; j < n; ++j) {
      const V8 v0 = simd::Load(m + j * hd + c), v1 = simd::Load(m + j * hd + c + kLanes);
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
    const V8 lo[kBlock] = {a0, a1, a2, a3}, hi[kBlock] = {b0, b1, b2, b3};
    for (int64_t r = 0; r < rows; ++r) {
      simd::Store(out[r] + c, lo[r]);
      simd::Store(out[r] + c + kLanes, hi[r]);
    }
  }
  for (; c < hd; c += kLanes) {
    const int64_t cnt = std::min<int64_t>(kLanes, hd - c);
    V8 a0{}, a1{}, a2{}, a3{};
    for (int64_t j = 0; j < n; ++j) {
      const V8 v = cnt == kLanes ? simd::Load(m + j * hd + c) : simd::LoadPart(m + j * hd + c, cnt);
      a0 += p[j] * v;
      a1 += p[ld + j] * v;
      a2 += p[2 * ld + j] * v;
      a3 += p[3 * ld + j] * v;
    }
    const V8 acc[kBlock] = {a0, a1, a2, a3};
    for (int64_t r = 0; r < rows; ++r) {
      if (cnt == kLanes)
        simd::Store(out[r] + c, acc[r]);
      else
        simd::StorePart(out[r] + c, acc[r], cnt);
    }
  }
}

// acc[j][:] += Σ_r p[r][j] · m[r][:] for j < n (p is [4][ld], m the block's 4 rows of hd, acc
// [n][hd]); each element adds the 4 rows in order.
PARAPLAN_HOST_CLONES void BlockTransposeTimes(float* acc, const float* p, int64_t ld,
                                              const float* m, int64_t n, int64_t hd) {
  int64_t c = 0;
  for (; c + 2 * kLanes <= hd; c += 2 * kLanes) {  // the block's 4 rows × 16 columns in registers
    const V8 m0 = simd::Load(m + c), n0 = simd::Load(m + c + kLanes);
    const V8 m1 = simd::Load(m + hd + c), n1 = simd::Load(m + hd + c + kLanes);
    const V8 m2 = simd::Load(m + 2 * hd + c), n2 = simd::Load(m + 2 * hd + c + kLanes);
    const V8 m3 = simd::Load(m + 3 * hd + c), n3 = simd::Load(m + 3 * hd + c + kLanes);
    for (int64_t j = 0; j < n; ++j) {
      const float p0 = p[j], p1 = p[ld + j], p2 = p[2 * ld + j], p3 = p[3 * ld + j];
      float* a = acc + j * hd + c;
      V8 x = simd::Load(a), y = simd::Load(a + kLanes);
      x += p0 * m0;
      y += p0 * n0;
      x += p1 * m1;
      y += p1 * n1;
      x += p2 * m2;
      y += p2 * n2;
      x += p3 * m3;
      y += p3 * n3;
      simd::Store(a, x);
      simd::Store(a + kLanes, y);
    }
  }
  for (; c < hd; c += kLanes) {
    const int64_t cnt = std::min<int64_t>(kLanes, hd - c);
    const V8 m0 = simd::LoadPart(m + c, cnt), m1 = simd::LoadPart(m + hd + c, cnt),
             m2 = simd::LoadPart(m + 2 * hd + c, cnt), m3 = simd::LoadPart(m + 3 * hd + c, cnt);
    for (int64_t j = 0; j < n; ++j) {
      float* a = acc + j * hd + c;
      V8 x = simd::LoadPart(a, cnt);
      x += p[j] * m0;
      x += p[ld + j] * m1;
      x += p[2 * ld + j] * m2;
      x += p[3 * ld + j] * m3;
      simd::StorePart(a, x, cnt);
    }
  }
}

// dst[d][s] = src[s][d] for s < seq (dst row stride ld; padding columns stay as they are).
void Transpose(float* dst, const float* src, int64_t seq, int64_t hd, int64_t ld) {
  for (int64_t s = 0; s < seq; ++s)
    for (int64_t d = 0; d < hd; ++d) dst[d * ld + s] = src[s * hd + d];
}

int64_t RoundUp(int64_t x, int64_t to) { return (x + to - 1) / to * to; }

}  // namespace

// Per (sequence, query head): blocks of 4 query rows take their scores against the keys up to
// their last row (the causal lower triangle, rounded up to 8 keys), the softmax, then the
// output, all on 8-lane vectors. A head's result never depends on the other heads, so
// head-sharded (tensor-parallel) runs reproduce the one-rank bits.
void AttentionForward(float* out, float* lse, const float* q, const float* k, const float* v,
                      const TokenLayout& layout, int64_t q_heads, int64_t kv_heads,
                      int64_t head_dim, float scale) {
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
          ScoreBlock(sc.data(), qh.data() + i0 * hd, kt.data(), ld, hd, n8);
          float* dst[kBlock];
          for (int64_t r = 0; r < kBlock; ++r) {
            float* row = sc.data() + r * ld;
            if (r < rows) {
              l[i0 + r] = SoftmaxRow(row, i0 + r + 1, n8, scale);
              dst[r] = out + (layout.Row(i0 + r, b) * q_heads + h) * hd;
            } else {
              std::fill(row, row + n8, 0.0f);
            }
          }
          BlockTimes(dst, rows, sc.data(), ld, vh.data(), n, hd);
        }
      }
    }
  }
}

void AttentionBackward(float* dq, float* dk, float* dv, const float* dout, const float* out,
                       const float* lse, const float* q, const float* k, const float* v,
                       const TokenLayout& layout, int64_t q_heads, int64_t kv_heads,
                       int64_t head_dim, float scale) {
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
          // P recomputed from the saved log-sum-exp; dP = dO Vᵀ; dS = P (dP - delta) scale.
          ScoreBlock(p.data(), qh.data() + i0 * hd, kt.data(), ld, hd, n8);
          ScoreBlock(dp.data(), gh.data() + i0 * hd, vt.data(), ld, hd, n8);
          float* dst[kBlock];
          for (int64_t r = 0; r < kBlock; ++r) {
            float* pr = p.data() + r * ld;
            float* dr = dp.data() + r * ld;
            if (r < rows) {
              const int64_t i = i0 + r;
              ProbabilityRow(pr, i + 1, n8, scale, l[i]);
              const float delta = DotRow(gh.data() + i * hd, oh.data() + i * hd, hd);
              ScoreGradRow(dr, pr, i + 1, n8, delta, scale);
              dst[r] = dq + (layout.Row(i, b) * q_heads + h) * hd;
            } else {
              std::fill(pr, pr + n8, 0.0f);
              std::fill(dr, dr + n8, 0.0f);
            }
          }
          // dQ = dS K (written); dV += Pᵀ dO; dK += dSᵀ Q.
          BlockTimes(dst, rows, dp.data(), ld, kh.data(), n, hd);
          BlockTransposeTimes(dvh.data(), p.data(), ld, gh.data() + i0 * hd, n, hd);
          BlockTransposeTimes(dkh.data(), dp.data(), ld, qh.data() + i0 * hd, n, hd);
        }
      }
      ScatterHead(dk, dkh.data(), layout, b, kv_heads, g, hd);
      ScatterHead(dv, dvh.data(), layout, b, kv_heads, g, hd);
    }
  }
}

}  // namespace paraplan::host
