// Elementwise kernels, embeddings, norms and activations.
#include <cmath>
#include <cstring>

#include "runtime/kernels/host/kernels.h"

namespace paraplan::host {

void Fill(float* x, int64_t n, float value) {
  for (int64_t i = 0; i < n; ++i) x[i] = value;
}
void Copy(float* dst, const float* src, int64_t n) {
  if (n > 0 && dst != src) std::memmove(dst, src, static_cast<size_t>(n) * sizeof(float));
}
void Add(float* out, const float* a, const float* b, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}
void Accumulate(float* y, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}
void Scale(float* x, int64_t n, float alpha) {
  for (int64_t i = 0; i < n; ++i) x[i] *= alpha;
}

// ---- Embedding ---------------------------------------------------------------------------

void EmbeddingForward(float* out, const int32_t* tokens, const float* table, int64_t rows,
                      int64_t dim, int64_t vocab_begin, int64_t vocab_count) {
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t t = static_cast<int64_t>(tokens[r]) - vocab_begin;
    if (t >= 0 && t < vocab_count) Copy(out + r * dim, table + t * dim, dim);
    else Fill(out + r * dim, dim, 0.0f);
  }
}

void EmbeddingBackward(float* dtable, const float* dout, const int32_t* tokens, int64_t rows,
                       int64_t dim, int64_t vocab_begin, int64_t vocab_count) {
  // Rows in order: deterministic, no atomics.
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t t = static_cast<int64_t>(tokens[r]) - vocab_begin;
    if (t >= 0 && t < vocab_count) Accumulate(dtable + t * dim, dout + r * dim, dim);
  }
}

void AddPosition(float* y, const float* x, const float* pos, int64_t rows, int64_t dim,
                 int64_t t0, int64_t seq) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* p = pos + ((t0 + r) % seq) * dim;
    for (int64_t i = 0; i < dim; ++i) y[r * dim + i] = x[r * dim + i] + p[i];
  }
}

void AddPositionBackward(float* dpos, const float* dy, int64_t rows, int64_t dim, int64_t t0,
                         int64_t seq) {
  for (int64_t r = 0; r < rows; ++r) Accumulate(dpos + ((t0 + r) % seq) * dim, dy + r * dim, dim);
}

// ---- Norms -------------------------------------------------------------------------------

void RmsNormForward(float* out, float* rstd, const float* x, const float* w, int64_t rows,
                    int64_t dim, float eps) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;
    double ss = 0;
    for (int64_t i = 0; i < dim; ++i) ss += static_cast<double>(xr[i]) * xr[i];
    const float rs = static_cast<float>(1.0 / std::sqrt(ss / dim + eps));
    rstd[r] = rs;
    for (int64_t i = 0; i < dim; ++i) out[r * dim + i] = xr[i] * rs * w[i];
  }
}

void RmsNormBackward(float* dx, float* dw, const float* dout, const float* x, const float* w,
                     const float* rstd, int64_t rows, int64_t dim) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;
    const float* gr = dout + r * dim;
    const float rs = rstd[r];
    // y = x * rs * w; dx = rs * (g*w - xhat * mean(g*w*xhat))
    double dot = 0;
    for (int64_t i = 0; i < dim; ++i) dot += static_cast<double>(gr[i]) * w[i] * xr[i] * rs;
    const float mean_dot = static_cast<float>(dot / dim);
    for (int64_t i = 0; i < dim; ++i) {
      const float xhat = xr[i] * rs;
      if (dw) dw[i] += gr[i] * xhat;
      if (dx) dx[r * dim + i] = rs * (gr[i] * w[i] - xhat * mean_dot);
    }
  }
}

void LayerNormForward(float* out, float* mean, float* rstd, const float* x, const float* w,
                      const float* b, int64_t rows, int64_t dim, float eps) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;
    double s = 0;
    for (int64_t i = 0; i < dim; ++i) s += xr[i];
    const double mu = s / dim;
    double v = 0;
    for (int64_t i = 0; i < dim; ++i) v += (xr[i] - mu) * (xr[i] - mu);
    const float rs = static_cast<float>(1.0 / std::sqrt(v / dim + eps));
    const float m = static_cast<float>(mu);
    mean[r] = m;
    rstd[r] = rs;
    for (int64_t i = 0; i < dim; ++i) out[r * dim + i] = (xr[i] - m) * rs * w[i] + (b ? b[i] : 0.0f);
  }
}

void LayerNormBackward(float* dx, float* dw, float* db, const float* dout, const float* x,
                       const float* w, const float* mean, const float* rstd, int64_t rows,
                       int64_t dim) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;
    const float* gr = dout + r * dim;
    const float m = mean[r], rs = rstd[r];
    double sum_g = 0, sum_gx = 0;
    for (int64_t i = 0; i < dim; ++i) {
      const double gw = static_cast<double>(gr[i]) * w[i];
      sum_g += gw;
      sum_gx += gw * (xr[i] - m) * rs;
    }
    const float mg = static_cast<float>(sum_g / dim), mgx = static_cast<float>(sum_gx / dim);
    for (int64_t i = 0; i < dim; ++i) {
      const float xhat = (xr[i] - m) * rs;
      if (dw) dw[i] += gr[i] * xhat;
      if (db) db[i] += gr[i];
      if (dx) dx[r * dim + i] = rs * (gr[i] * w[i] - mg - xhat * mgx);
    }
  }
}

// ---- Activations -------------------------------------------------------------------------

void SwiGluForward(float* out, const float* gate, const float* up, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

void SwiGluBackward(float* dgate, float* dup, const float* dout, const float* gate,
                    const float* up, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    const float sig = 1.0f / (1.0f + std::exp(-g));
    const float silu = g * sig;
    const float d = dout[i];
    if (dup) dup[i] = d * silu;
    if (dgate) dgate[i] = d * up[i] * sig * (1.0f + g * (1.0f - sig));
  }
}

namespace {
constexpr float kGeluC = 0.7978845608028654f;  // sqrt(2/pi)
}

void GeluForward(float* out, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    const float u = kGeluC * (v + 0.044715f * v * v * v);
    out[i] = 0.5f * v * (1.0f + std::tanh(u));
  }
}

void GeluBackward(float* dx, const float* dout, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    const float u = kGeluC * (v + 0.044715f * v * v * v);
    const float t = std::tanh(u);
    const float du = kGeluC * (1.0f + 3.0f * 0.044715f * v * v);
    dx[i] = dout[i] * (0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * du);
  }
}

}  // namespace paraplan::host
