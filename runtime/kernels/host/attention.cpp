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

float Dot(const float* a, const float* b, int64_t n) {
  float s = 0;
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
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

void AttentionForward(float* out, float* lse, const float* q, const float* k, const float* v,
                      const TokenLayout& layout, int64_t q_heads, int64_t kv_heads,
                      int64_t head_dim, float scale) {
  const int64_t seq = layout.seq, group = q_heads / kv_heads;
  std::vector<float> p(seq);
  for (int64_t b = 0; b < layout.batch; ++b) {
    for (int64_t h = 0; h < q_heads; ++h) {
      const int64_t kh = h / group;
      for (int64_t i = 0; i < seq; ++i) {
        const float* qi = q + (layout.Row(i, b) * q_heads + h) * head_dim;
        float mx = -INFINITY;
        for (int64_t j = 0; j <= i; ++j) {
          p[j] = scale * Dot(qi, k + (layout.Row(j, b) * kv_heads + kh) * head_dim, head_dim);
          mx = std::max(mx, p[j]);
        }
        float sum = 0;
        for (int64_t j = 0; j <= i; ++j) {
          p[j] = std::exp(p[j] - mx);
          sum += p[j];
        }
        const float inv = 1.0f / sum;
        float* oi = out + (layout.Row(i, b) * q_heads + h) * head_dim;
        for (int64_t d = 0; d < head_dim; ++d) oi[d] = 0.0f;
        for (int64_t j = 0; j <= i; ++j) {
          const float w = p[j] * inv;
          const float* vj = v + (layout.Row(j, b) * kv_heads + kh) * head_dim;
          for (int64_t d = 0; d < head_dim; ++d) oi[d] += w * vj[d];
        }
        lse[(b * q_heads + h) * seq + i] = mx + std::log(sum);
      }
    }
  }
}

void AttentionBackward(float* dq, float* dk, float* dv, const float* dout, const float* out,
                       const float* lse, const float* q, const float* k, const float* v,
                       const TokenLayout& layout, int64_t q_heads, int64_t kv_heads,
                       int64_t head_dim, float scale) {
  const int64_t seq = layout.seq, group = q_heads / kv_heads;
  for (int64_t b = 0; b < layout.batch; ++b) {
    for (int64_t s = 0; s < seq; ++s) {
      const int64_t row = layout.Row(s, b);
      std::fill(dq + row * q_heads * head_dim, dq + (row + 1) * q_heads * head_dim, 0.0f);
      std::fill(dk + row * kv_heads * head_dim, dk + (row + 1) * kv_heads * head_dim, 0.0f);
      std::fill(dv + row * kv_heads * head_dim, dv + (row + 1) * kv_heads * head_dim, 0.0f);
    }
  }
  for (int64_t b = 0; b < layout.batch; ++b) {
    for (int64_t h = 0; h < q_heads; ++h) {
      const int64_t kh = h / group;
      for (int64_t i = 0; i < seq; ++i) {
        const int64_t ri = layout.Row(i, b);
        const float* qi = q + (ri * q_heads + h) * head_dim;
        const float* gi = dout + (ri * q_heads + h) * head_dim;
        const float delta = Dot(gi, out + (ri * q_heads + h) * head_dim, head_dim);
        const float l = lse[(b * q_heads + h) * seq + i];
        float* dqi = dq + (ri * q_heads + h) * head_dim;
        for (int64_t j = 0; j <= i; ++j) {
          const int64_t rj = layout.Row(j, b);
          const float* kj = k + (rj * kv_heads + kh) * head_dim;
          const float* vj = v + (rj * kv_heads + kh) * head_dim;
          const float p = std::exp(scale * Dot(qi, kj, head_dim) - l);
          const float ds = p * (Dot(gi, vj, head_dim) - delta) * scale;
          float* dkj = dk + (rj * kv_heads + kh) * head_dim;
          float* dvj = dv + (rj * kv_heads + kh) * head_dim;
          for (int64_t d = 0; d < head_dim; ++d) {
            dvj[d] += p * gi[d];
            dqi[d] += ds * kj[d];
            dkj[d] += ds * qi[d];
          }
        }
      }
    }
  }
}

}  // namespace paraplan::host
