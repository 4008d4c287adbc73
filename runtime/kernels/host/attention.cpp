// Rotary embedding and causal grouped-query attention (flash-style: only the log-sum-exp of
// each query row is saved; backward recomputes the probabilities).
#include <algorithm>
#include <cmath>
#include <vector>

#include "runtime/kernels/host/kernels.h"
#include "runtime/kernels/host/simd.h"

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

// Row i of the causal softmax: row[0..n) holds raw scores; they become probabilities (scaled
// by `scale`, max-shifted), the rest of the row [n, seq) zeros. Returns the log-sum-exp.
PARAPLAN_HOST_CLONES float SoftmaxRow(float* row, int64_t n, int64_t seq, float scale) {
  V8 mv = simd::Splat(-INFINITY);
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    const V8 x = simd::Load(row + j) * scale;
    simd::Store(row + j, x);
    mv = x > mv ? x : mv;
  }
  if (j < n) {
    const V8 x = simd::LoadPart(row + j, n - j, -INFINITY) * scale;
    simd::StorePart(row + j, x, n - j);
    mv = x > mv ? x : mv;
  }
  const float mx = simd::Max(mv);
  const V8 m = simd::Splat(mx);
  V8 sv{};
  for (j = 0; j + kLanes <= n; j += kLanes) {
    const V8 e = simd::Exp(simd::Load(row + j) - m);
    simd::Store(row + j, e);
    sv += e;
  }
  if (j < n) {
    const V8 e = simd::Exp(simd::LoadPart(row + j, n - j, -INFINITY) - m);
    simd::StorePart(row + j, e, n - j);
    sv += e;
  }
  const float sum = simd::Sum(sv);
  const float inv = 1.0f / sum;
  for (j = 0; j < n; ++j) row[j] *= inv;
  for (j = n; j < seq; ++j) row[j] = 0.0f;
  return mx + std::log(sum);
}

// Recomputes row i of the probabilities from raw scores and the saved log-sum-exp:
// row[j] = e^{row[j]·scale - lse} for j < n, zeros after.
PARAPLAN_HOST_CLONES void ProbabilityRow(float* row, int64_t n, int64_t seq, float scale,
                                         float lse) {
  const V8 l = simd::Splat(lse);
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes)
    simd::Store(row + j, simd::Exp(simd::Load(row + j) * scale - l));
  if (j < n) simd::StorePart(row + j, simd::Exp(simd::LoadPart(row + j, n - j) * scale - l), n - j);
  for (j = n; j < seq; ++j) row[j] = 0.0f;
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

}  // namespace

// Per (sequence, KV head) the query heads that share the KV head are stacked, [group × seq, d],
// so the scores of the whole group are one GEMM (all seq × seq entries per head, then the causal
// mask) and their output another. Tensor-parallel shards hold whole KV groups, so a shard runs
// the same GEMMs as the one-rank run on its groups.
void AttentionForward(float* out, float* lse, const float* q, const float* k, const float* v,
                      const TokenLayout& layout, int64_t q_heads, int64_t kv_heads,
                      int64_t head_dim, float scale) {
  const int64_t seq = layout.seq, group = q_heads / kv_heads, hd = head_dim, rows = group * seq;
  std::vector<float> qh(rows * hd), kh(seq * hd), vh(seq * hd), oh(rows * hd), p(rows * seq);
  for (int64_t b = 0; b < layout.batch; ++b) {
    for (int64_t g = 0; g < kv_heads; ++g) {
      GatherHead(kh.data(), k, layout, b, kv_heads, g, hd);
      GatherHead(vh.data(), v, layout, b, kv_heads, g, hd);
      for (int64_t x = 0; x < group; ++x) {
        GatherHead(qh.data() + x * seq * hd, q, layout, b, q_heads, g * group + x, hd);
      }
      Gemm(false, true, rows, seq, hd, qh.data(), kh.data(), 0.0f, p.data());
      for (int64_t x = 0; x < group; ++x) {
        float* l = lse + (b * q_heads + g * group + x) * seq;
        for (int64_t i = 0; i < seq; ++i) {
          l[i] = SoftmaxRow(p.data() + (x * seq + i) * seq, i + 1, seq, scale);
        }
      }
      Gemm(false, false, rows, hd, seq, p.data(), vh.data(), 0.0f, oh.data());
      for (int64_t x = 0; x < group; ++x) {
        ScatterHead(out, oh.data() + x * seq * hd, layout, b, q_heads, g * group + x, hd);
      }
    }
  }
}

void AttentionBackward(float* dq, float* dk, float* dv, const float* dout, const float* out,
                       const float* lse, const float* q, const float* k, const float* v,
                       const TokenLayout& layout, int64_t q_heads, int64_t kv_heads,
                       int64_t head_dim, float scale) {
  const int64_t seq = layout.seq, group = q_heads / kv_heads, hd = head_dim, rows = group * seq;
  std::vector<float> qh(rows * hd), kh(seq * hd), vh(seq * hd), oh(rows * hd), gh(rows * hd),
      dqh(rows * hd), dkh(seq * hd), dvh(seq * hd), p(rows * seq), dp(rows * seq), delta(rows);
  for (int64_t b = 0; b < layout.batch; ++b) {
    for (int64_t g = 0; g < kv_heads; ++g) {
      GatherHead(kh.data(), k, layout, b, kv_heads, g, hd);
      GatherHead(vh.data(), v, layout, b, kv_heads, g, hd);
      for (int64_t x = 0; x < group; ++x) {
        const int64_t h = g * group + x;
        GatherHead(qh.data() + x * seq * hd, q, layout, b, q_heads, h, hd);
        GatherHead(oh.data() + x * seq * hd, out, layout, b, q_heads, h, hd);
        GatherHead(gh.data() + x * seq * hd, dout, layout, b, q_heads, h, hd);
      }
      Gemm(false, true, rows, seq, hd, qh.data(), kh.data(), 0.0f, p.data());
      for (int64_t x = 0; x < group; ++x) {
        const float* l = lse + (b * q_heads + g * group + x) * seq;
        for (int64_t i = 0; i < seq; ++i) {
          const int64_t r = x * seq + i;
          ProbabilityRow(p.data() + r * seq, i + 1, seq, scale, l[i]);
          delta[r] = DotRow(gh.data() + r * hd, oh.data() + r * hd, hd);
        }
      }
      // dV = Pᵀ dO; dP = dO Vᵀ; dS = P (dP - delta) scale; dQ = dS K; dK = dSᵀ Q (the group's
      // heads summed by the GEMMs).
      Gemm(true, false, seq, hd, rows, p.data(), gh.data(), 0.0f, dvh.data());
      Gemm(false, true, rows, seq, hd, gh.data(), vh.data(), 0.0f, dp.data());
      for (int64_t x = 0; x < group; ++x) {
        for (int64_t i = 0; i < seq; ++i) {
          const int64_t r = x * seq + i;
          ScoreGradRow(dp.data() + r * seq, p.data() + r * seq, i + 1, seq, delta[r], scale);
        }
      }
      Gemm(false, false, rows, hd, seq, dp.data(), kh.data(), 0.0f, dqh.data());
      Gemm(true, false, seq, hd, rows, dp.data(), qh.data(), 0.0f, dkh.data());
      for (int64_t x = 0; x < group; ++x) {
        ScatterHead(dq, dqh.data() + x * seq * hd, layout, b, q_heads, g * group + x, hd);
      }
      ScatterHead(dk, dkh.data(), layout, b, kv_heads, g, hd);
      ScatterHead(dv, dvh.data(), layout, b, kv_heads, g, hd);
    }
  }
}

}  // namespace paraplan::host
