// Norms (RMSNorm, LayerNorm), forward and backward, on 8-lane vectors (simd.h). Row sums are
// taken in double, in 8 lanes (two 4-lane halves), then the lanes in a fixed order.
#include <cmath>

#include "runtime/backends/host/kernels/kernels.h"
#include "runtime/backends/host/kernels/simd.h"

namespace paraplan::host {

using simd::kLanes;
using simd::V8;

namespace {

// Σ a[i]·b[i] over one row, in double.
PARAPLAN_HOST_INLINE double DotRow(const float* a, const float* b, int64_t n) {
  simd::D4 lo{}, hi{};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    const V8 x = simd::Load(a + i), y = simd::Load(b + i);
    lo += simd::Low(x) * simd::Low(y);
    hi += simd::High(x) * simd::High(y);
  }
  if (i < n) {
    const V8 x = simd::LoadPart(a + i, n - i), y = simd::LoadPart(b + i, n - i);
    lo += simd::Low(x) * simd::Low(y);
    hi += simd::High(x) * simd::High(y);
  }
  return simd::Sum(lo + hi);
}

}  // namespace

PARAPLAN_HOST_CLONES void RmsNormForward(float* out, float* rstd, const float* x, const float* w,
                                         int64_t rows, int64_t dim, float eps) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;
    const double ss = DotRow(xr, xr, dim);
    const float rs = static_cast<float>(1.0 / std::sqrt(ss / dim + eps));
    rstd[r] = rs;
    float* o = out + r * dim;
    for (int64_t i = 0; i < dim; ++i) o[i] = xr[i] * rs * w[i];
  }
}

PARAPLAN_HOST_CLONES void RmsNormBackward(float* dx, float* dw, const float* dout, const float* x,
                                          const float* w, const float* rstd, int64_t rows,
                                          int64_t dim) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;
    const float* gr = dout + r * dim;
    const float rs = rstd[r];
    // y = x * rs * w; dx = rs * (g*w - xhat * mean(g*w*xhat)), mean(g*w*xhat) = rs·Σ(g·w·x)/dim
    simd::D4 lo{}, hi{};
    int64_t i = 0;
    for (; i + kLanes <= dim; i += kLanes) {
      const V8 gw = simd::Load(gr + i) * simd::Load(w + i), xv = simd::Load(xr + i);
      lo += simd::Low(gw) * simd::Low(xv);
      hi += simd::High(gw) * simd::High(xv);
    }
    if (i < dim) {
      const int64_t n = dim - i;
      const V8 gw = simd::LoadPart(gr + i, n) * simd::LoadPart(w + i, n),
               xv = simd::LoadPart(xr + i, n);
      lo += simd::Low(gw) * simd::Low(xv);
      hi += simd::High(gw) * simd::High(xv);
    }
    const float mean_dot = static_cast<float>(simd::Sum(lo + hi) * rs / dim);
    if (dw) {
      for (int64_t j = 0; j < dim; ++j) dw[j] += gr[j] * (xr[j] * rs);
    }
    if (dx) {
      float* d = dx + r * dim;
      for (int64_t j = 0; j < dim; ++j) d[j] = rs * (gr[j] * w[j] - (xr[j] * rs) * mean_dot);
    }
  }
}

PARAPLAN_HOST_CLONES void LayerNormForward(float* out, float* mean, float* rstd, const float* x,
                                           const float* w, const float* b, int64_t rows,
                                           int64_t dim, float eps) {
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
    float* o = out + r * dim;
    if (b) {
      for (int64_t i = 0; i < dim; ++i) o[i] = (xr[i] - m) * rs * w[i] + b[i];
    } else {
      for (int64_t i = 0; i < dim; ++i) o[i] = (xr[i] - m) * rs * w[i] + 0.0f;
    }
  }
}

PARAPLAN_HOST_CLONES void LayerNormBackward(float* dx, float* dw, float* db, const float* dout,
                                            const float* x, const float* w, const float* mean,
                                            const float* rstd, int64_t rows, int64_t dim) {
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
    if (dw) {
      for (int64_t i = 0; i < dim; ++i) dw[i] += gr[i] * ((xr[i] - m) * rs);
    }
    if (db) {
      for (int64_t i = 0; i < dim; ++i) db[i] += gr[i];
    }
    if (dx) {
      float* d = dx + r * dim;
      for (int64_t i = 0; i < dim; ++i) d[i] = rs * (gr[i] * w[i] - mg - ((xr[i] - m) * rs) * mgx);
    }
  }
}

}  // namespace paraplan::host
