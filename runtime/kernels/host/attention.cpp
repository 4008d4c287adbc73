// Rotary embedding and causal grouped-query attention (flash-style: only the log-sum-exp of
// each query row is saved; backward recomputes the probabilities).
#include <algorithm>
#include <cmath>
#include <vector>

#include "runtime/kernels/host/kernels.h"

namespace paraplan::host {
namespace {

void Rotate(float* x, const TokenLayout& layout, int64_t heads, int64_t head_dim, float theta,
            float sign) {
  const int64_t half = head_dim / 2;
  std::vector<float> cos_t(half), sin_t(half);
  for (int64_t s = 0; s < layout.seq; ++s) {
    const double pos = static_cast<double>(layout.seq_offset + s);
    for (int64_t i = 0; i < half; ++i) {
      const double freq = std::pow(static_cast<double>(theta), -2.0 * i / head_dim);
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
void GatherHead(float* dst, const float* src, const TokenLayout& layout, int64_t b, int64_t heads,
                int64_t h, int64_t head_dim) {
  for (int64_t s = 0; s < layout.seq; ++s) {
    const float* row = src + (layout.Row(s, b) * heads + h) * head_dim;
    for (int64_t d = 0; d < head_dim; ++d) dst[s * head_dim + d] = row[d];
  }
}

void ScatterHead(float* dst, const float* src, const TokenLayout& layout, int64_t b, int64_t heads,
                 int64_t h, int64_t head_dim) {
  for (int64_t s = 0; s < layout.seq; ++s) {
    float* row = dst + (layout.Row(s, b) * heads + h) * head_dim;
    for (int64_t d = 0; d < head_dim; ++d) row[d] = src[s * head_dim + d];
  }
}

}  // namespace

// Per (sequence, head) the scores are one GEMM (all seq × seq entries, then the causal mask),
// the output another; a head's result never depends on the other heads, so head-sharded
// (tensor-parallel) runs reproduce the one-rank bits.
void AttentionForward(float* out, float* lse, const float* q, const float* k, const float* v,
                      const TokenLayout& layout, int64_t q_heads, int64_t kv_heads,
                      int64_t head_dim, float scale) {
  const int64_t seq = layout.seq, group = q_heads / kv_heads, hd = head_dim;
  std::vector<float> qh(seq * hd), kh(seq * hd), vh(seq * hd), oh(seq * hd), p(seq * seq);
  for (int64_t b = 0; b < layout.batch; ++b) {
    for (int64_t g = 0; g < kv_heads; ++g) {
      GatherHead(kh.data(), k, layout, b, kv_heads, g, hd);
      GatherHead(vh.data(), v, layout, b, kv_heads, g, hd);
      for (int64_t h = g * group; h < (g + 1) * group; ++h) {
        GatherHead(qh.data(), q, layout, b, q_heads, h, hd);
        Gemm(false, true, seq, seq, hd, qh.data(), kh.data(), 0.0f, p.data());
        for (int64_t i = 0; i < seq; ++i) {
          float* row = p.data() + i * seq;
          float mx = -INFINITY;
          for (int64_t j = 0; j <= i; ++j) {
            row[j] *= scale;
            mx = std::max(mx, row[j]);
          }
          float sum = 0;
          for (int64_t j = 0; j <= i; ++j) {
            row[j] = std::exp(row[j] - mx);
            sum += row[j];
          }
          const float inv = 1.0f / sum;
          for (int64_t j = 0; j <= i; ++j) row[j] *= inv;
          for (int64_t j = i + 1; j < seq; ++j) row[j] = 0.0f;
          lse[(b * q_heads + h) * seq + i] = mx + std::log(sum);
        }
        Gemm(false, false, seq, hd, seq, p.data(), vh.data(), 0.0f, oh.data());
        ScatterHead(out, oh.data(), layout, b, q_heads, h, hd);
      }
    }
  }
}

void AttentionBackward(float* dq, float* dk, float* dv, const float* dout, const float* out,
                       const float* lse, const float* q, const float* k, const float* v,
                       const TokenLayout& layout, int64_t q_heads, int64_t kv_heads,
                       int64_t head_dim, float scale) {
  const int64_t seq = layout.seq, group = q_heads / kv_heads, hd = head_dim;
  std::vector<float> qh(seq * hd), kh(seq * hd), vh(seq * hd), oh(seq * hd), gh(seq * hd), dqh(seq * hd),
      dkh(seq * hd), dvh(seq * hd), p(seq * seq), dp(seq * seq), delta(seq);
  for (int64_t b = 0; b < layout.batch; ++b) {
    for (int64_t g = 0; g < kv_heads; ++g) {
      GatherHead(kh.data(), k, layout, b, kv_heads, g, hd);
      GatherHead(vh.data(), v, layout, b, kv_heads, g, hd);
      std::fill(dkh.begin(), dkh.end(), 0.0f);
      std::fill(dvh.begin(), dvh.end(), 0.0f);
      for (int64_t h = g * group; h < (g + 1) * group; ++h) {
        GatherHead(qh.data(), q, layout, b, q_heads, h, hd);
        GatherHead(oh.data(), out, layout, b, q_heads, h, hd);
        GatherHead(gh.data(), dout, layout, b, q_heads, h, hd);
        Gemm(false, true, seq, seq, hd, qh.data(), kh.data(), 0.0f, p.data());
        for (int64_t i = 0; i < seq; ++i) {
          float* row = p.data() + i * seq;
          const float l = lse[(b * q_heads + h) * seq + i];
          for (int64_t j = 0; j <= i; ++j) row[j] = std::exp(row[j] * scale - l);
          for (int64_t j = i + 1; j < seq; ++j) row[j] = 0.0f;
          float d = 0;
          for (int64_t e = 0; e < hd; ++e) d += gh[i * hd + e] * oh[i * hd + e];
          delta[i] = d;
        }
        // dV += Pᵀ dO; dP = dO Vᵀ; dS = P (dP - delta) scale; dQ = dS K; dK += dSᵀ Q.
        Gemm(true, false, seq, hd, seq, p.data(), gh.data(), 1.0f, dvh.data());
        Gemm(false, true, seq, seq, hd, gh.data(), vh.data(), 0.0f, dp.data());
        for (int64_t i = 0; i < seq; ++i) {
          for (int64_t j = 0; j <= i; ++j) dp[i * seq + j] = p[i * seq + j] * (dp[i * seq + j] - delta[i]) * scale;
          for (int64_t j = i + 1; j < seq; ++j) dp[i * seq + j] = 0.0f;
        }
        Gemm(false, false, seq, hd, seq, dp.data(), kh.data(), 0.0f, dqh.data());
        ScatterHead(dq, dqh.data(), layout, b, q_heads, h, hd);
        Gemm(true, false, seq, hd, seq, dp.data(), qh.data(), 1.0f, dkh.data());
      }
      ScatterHead(dk, dkh.data(), layout, b, kv_heads, g, hd);
      ScatterHead(dv, dvh.data(), layout, b, kv_heads, g, hd);
    }
  }
}

}  // namespace paraplan::host
