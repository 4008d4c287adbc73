// Elementwise kernels, embeddings and activations, on 8-lane vectors (simd.h). Every
// element is computed by the same vector code whatever its position (the last partial vector
// is padded), so a shard computes each element exactly as the whole call does.
#include <cmath>
#include <cstring>

#include "runtime/backends/host/kernels/kernels.h"
#include "runtime/backends/host/kernels/simd.h"

namespace paraplan::host {

// Kernel signatures follow the Backend interface (runtime/exec/backend.h) and the host
// specification: tensors as raw pointers and sizes in the specification's order, several of one
// type side by side; every argument is checked against the reference by the kernel tests.
// NOLINTBEGIN(bugprone-easily-swappable-parameters)

using simd::kLanes;
using simd::V8;

PARAPLAN_HOST_CLONES void Fill(float* x, int64_t n, float value) {
  for (int64_t i = 0; i < n; ++i) x[i] = value;
}
void Copy(float* dst, const float* src, int64_t n) {
  if (n > 0 && dst != src) std::memmove(dst, src, static_cast<size_t>(n) * sizeof(float));
}
void CopyColumns(float* y, const float* x, int64_t rows, const ColumnMap& map, bool accumulate) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * map.x_cols + map.x_offset;
    float* yr = y + r * map.y_cols + map.y_offset;
    for (int64_t g = 0; g < map.groups; ++g) {
      const float* from = xr + g * map.x_stride;
      float* to = yr + g * map.y_stride;
      if (accumulate)
        for (int64_t j = 0; j < map.width; ++j) to[j] += from[j];
      else
        for (int64_t j = 0; j < map.width; ++j) to[j] = from[j];
    }
  }
}

PARAPLAN_HOST_CLONES void Add(float* out, const float* a, const float* b, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}
PARAPLAN_HOST_CLONES void Accumulate(float* y, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}
PARAPLAN_HOST_CLONES void Scale(float* x, int64_t n, float alpha) {
  for (int64_t i = 0; i < n; ++i) x[i] *= alpha;
}

// ---- Embedding ---------------------------------------------------------------------------

void EmbeddingForward(float* out, const int32_t* tokens, const float* table, int64_t rows,
                      int64_t dim, int64_t vocab_begin, int64_t vocab_count) {
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t t = static_cast<int64_t>(tokens[r]) - vocab_begin;
    if (t >= 0 && t < vocab_count)
      Copy(out + r * dim, table + t * dim, dim);
    else
      Fill(out + r * dim, dim, 0.0f);
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

void AddPosition(float* y, const float* x, const float* pos, int64_t rows, int64_t dim, int64_t t0,
                 int64_t seq) {
  for (int64_t r = 0; r < rows; ++r)
    Add(y + r * dim, x + r * dim, pos + ((t0 + r) % seq) * dim, dim);
}

void AddPositionBackward(float* dpos, const float* dy, int64_t rows, int64_t dim, int64_t t0,
                         int64_t seq) {
  for (int64_t r = 0; r < rows; ++r) Accumulate(dpos + ((t0 + r) % seq) * dim, dy + r * dim, dim);
}

// ---- Activations -------------------------------------------------------------------------

namespace {

PARAPLAN_HOST_INLINE V8 Sigmoid(V8 g) { return 1.0f / (1.0f + simd::Exp(-g)); }

constexpr float kGeluC = 0.7978845608028654f;  // sqrt(2/pi)

// tanh(u) = 1 - 2 / (e^{2u} + 1).
PARAPLAN_HOST_INLINE V8 Tanh(V8 u) { return 1.0f - 2.0f / (simd::Exp(u + u) + 1.0f); }

PARAPLAN_HOST_INLINE V8 Gelu(V8 v) {
  const V8 u = kGeluC * (v + 0.044715f * v * v * v);
  return 0.5f * v * (1.0f + Tanh(u));
}

PARAPLAN_HOST_INLINE V8 GeluGrad(V8 v, V8 g) {
  const V8 u = kGeluC * (v + 0.044715f * v * v * v);
  const V8 t = Tanh(u);
  const V8 du = kGeluC * (1.0f + 3.0f * 0.044715f * v * v);
  return g * (0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * du);
}

// Elements [i, i + count) of the SwiGLU backward, count <= 8.
PARAPLAN_HOST_INLINE void SwiGluBackwardLanes(float* dgate, float* dup, const float* dout,
                                              const float* gate, const float* up, int64_t i,
                                              int64_t count) {
  const bool whole = count == kLanes;
  const V8 g = whole ? simd::Load(gate + i) : simd::LoadPart(gate + i, count);
  const V8 d = whole ? simd::Load(dout + i) : simd::LoadPart(dout + i, count);
  const V8 u = whole ? simd::Load(up + i) : simd::LoadPart(up + i, count);
  const V8 sig = Sigmoid(g);
  const V8 du = d * (g * sig), dg = d * u * sig * (1.0f + g * (1.0f - sig));
  if (whole) {
    if (dup) simd::Store(dup + i, du);
    if (dgate) simd::Store(dgate + i, dg);
  } else {
    if (dup) simd::StorePart(dup + i, du, count);
    if (dgate) simd::StorePart(dgate + i, dg, count);
  }
}

}  // namespace

PARAPLAN_HOST_CLONES void SwiGluForward(float* out, const float* gate, const float* up, int64_t n) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    const V8 g = simd::Load(gate + i);
    simd::Store(out + i, g * Sigmoid(g) * simd::Load(up + i));
  }
  if (i < n) {
    const V8 g = simd::LoadPart(gate + i, n - i);
    simd::StorePart(out + i, g * Sigmoid(g) * simd::LoadPart(up + i, n - i), n - i);
  }
}

PARAPLAN_HOST_CLONES void SwiGluBackward(float* dgate, float* dup, const float* dout,
                                         const float* gate, const float* up, int64_t n) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) SwiGluBackwardLanes(dgate, dup, dout, gate, up, i, kLanes);
  if (i < n) SwiGluBackwardLanes(dgate, dup, dout, gate, up, i, n - i);
}

PARAPLAN_HOST_CLONES void GeluForward(float* out, const float* x, int64_t n) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) simd::Store(out + i, Gelu(simd::Load(x + i)));
  if (i < n) simd::StorePart(out + i, Gelu(simd::LoadPart(x + i, n - i)), n - i);
}

PARAPLAN_HOST_CLONES void GeluBackward(float* dx, const float* dout, const float* x, int64_t n) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    simd::Store(dx + i, GeluGrad(simd::Load(x + i), simd::Load(dout + i)));
  }
  if (i < n) {
    simd::StorePart(dx + i, GeluGrad(simd::LoadPart(x + i, n - i), simd::LoadPart(dout + i, n - i)),
                    n - i);
  }
}

PARAPLAN_HOST_CLONES void SquaredReluForward(float* out, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float r = x[i] > 0.0f ? x[i] : 0.0f;
    out[i] = r * r;
  }
}

PARAPLAN_HOST_CLONES void SquaredReluBackward(float* dx, const float* dout, const float* x,
                                              int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float r = x[i] > 0.0f ? x[i] : 0.0f;
    dx[i] = dout[i] * (2.0f * r);
  }
}

// NOLINTEND(bugprone-easily-swappable-parameters)

}  // namespace paraplan::host
