// GEMM and linear layers. The inner kernel works on a 4-row × 32-column tile of C held in
// vector registers while it walks k, so each C element is still summed over k in increasing
// order (the same bits whatever the tile, the ISA clone or the number of columns a call covers:
// column-sharded tensor-parallel GEMMs reproduce the one-rank run exactly).
#include <algorithm>
#include <cstring>
#include <vector>

#include "runtime/kernels/host/kernels.h"

namespace paraplan::host {
namespace {

typedef float V16 __attribute__((vector_size(64), aligned(4)));
constexpr int64_t kRows = 4;
constexpr int64_t kCols = 32;

// C rows [0, rows) (rows <= 4) of an M-block: ap is the packed A block (ap[k * 4 + r]),
// bp is K × N row-major with leading dimension ldb, c has leading dimension ldc.
__attribute__((target_clones("avx512f", "avx2", "default")))
void GemmRowBlock(int64_t rows, int64_t n, int64_t k, const float* ap, const float* bp,
                  int64_t ldb, float beta, float* c, int64_t ldc) {
  int64_t j = 0;
  // The 4 × 32 tile lives in eight named vector registers (an array would be kept in memory).
  for (; j + kCols <= n; j += kCols) {
    V16 c00{}, c01{}, c10{}, c11{}, c20{}, c21{}, c30{}, c31{};
    auto load = [&](int64_t r, int64_t off) { return *reinterpret_cast<const V16*>(c + r * ldc + j + off); };
    if (beta != 0.0f) {
      c00 = load(0, 0), c01 = load(0, 16);
      if (rows > 1) c10 = load(1, 0), c11 = load(1, 16);
      if (rows > 2) c20 = load(2, 0), c21 = load(2, 16);
      if (rows > 3) c30 = load(3, 0), c31 = load(3, 16);
    }
    const float* a = ap;
    const float* bk = bp + j;
    for (int64_t kk = 0; kk < k; ++kk, a += kRows, bk += ldb) {
      const V16 b0 = *reinterpret_cast<const V16*>(bk);
      const V16 b1 = *reinterpret_cast<const V16*>(bk + 16);
      const float a0 = a[0], a1 = a[1], a2 = a[2], a3 = a[3];
      c00 += a0 * b0;
      c01 += a0 * b1;
      c10 += a1 * b0;
      c11 += a1 * b1;
      c20 += a2 * b0;
      c21 += a2 * b1;
      c30 += a3 * b0;
      c31 += a3 * b1;
    }
    auto store = [&](int64_t r, int64_t off, const V16& v) { *reinterpret_cast<V16*>(c + r * ldc + j + off) = v; };
    store(0, 0, c00), store(0, 16, c01);
    if (rows > 1) store(1, 0, c10), store(1, 16, c11);
    if (rows > 2) store(2, 0, c20), store(2, 16, c21);
    if (rows > 3) store(3, 0, c30), store(3, 16, c31);
  }
  for (; j < n; ++j) {
    for (int64_t r = 0; r < rows; ++r) {
      float acc = beta != 0.0f ? c[r * ldc + j] : 0.0f;
      for (int64_t kk = 0; kk < k; ++kk) acc += ap[kk * kRows + r] * bp[kk * ldb + j];
      c[r * ldc + j] = acc;
    }
  }
}

}  // namespace

void Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const float* a,
          const float* b, float beta, float* c) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0) {
    if (beta == 0.0f) std::fill(c, c + m * n, 0.0f);
    return;
  }
  // op(B) as K × N row-major.
  std::vector<float> b_packed;
  const float* bp = b;
  if (trans_b) {
    b_packed.resize(static_cast<size_t>(k * n));
    constexpr int64_t kT = 32;
    for (int64_t j0 = 0; j0 < n; j0 += kT)
      for (int64_t k0 = 0; k0 < k; k0 += kT)
        for (int64_t j = j0; j < std::min(n, j0 + kT); ++j)
          for (int64_t kk = k0; kk < std::min(k, k0 + kT); ++kk) b_packed[kk * n + j] = b[j * k + kk];
    bp = b_packed.data();
  }
  std::vector<float> ap(static_cast<size_t>(k * kRows));
  // Column panels keep the B panel in cache across row blocks.
  constexpr int64_t kPanel = 256;
  for (int64_t j0 = 0; j0 < n; j0 += kPanel) {
    const int64_t nj = std::min(kPanel, n - j0);
    for (int64_t i0 = 0; i0 < m; i0 += kRows) {
      const int64_t rows = std::min(kRows, m - i0);
      for (int64_t kk = 0; kk < k; ++kk) {
        for (int64_t r = 0; r < kRows; ++r) {
          float v = 0.0f;
          if (r < rows) v = trans_a ? a[kk * m + i0 + r] : a[(i0 + r) * k + kk];
          ap[kk * kRows + r] = v;
        }
      }
      GemmRowBlock(rows, nj, k, ap.data(), bp + j0, n, beta, c + i0 * n + j0, n);
    }
  }
}

void LinearForward(float* y, const float* x, const float* w, const float* bias, int64_t rows,
                   int64_t in, int64_t out) {
  Gemm(false, true, rows, out, in, x, w, 0.0f, y);
  if (bias) {
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t o = 0; o < out; ++o) y[r * out + o] += bias[o];
  }
}

void LinearBackward(float* dx, float* dw, float* dbias, const float* dy, const float* x,
                    const float* w, int64_t rows, int64_t in, int64_t out, bool accumulate_dx) {
  if (dx) Gemm(false, false, rows, in, out, dy, w, accumulate_dx ? 1.0f : 0.0f, dx);
  if (dw) Gemm(true, false, out, in, rows, dy, x, 1.0f, dw);
  if (dbias) {
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t o = 0; o < out; ++o) dbias[o] += dy[r * out + o];
  }
}

}  // namespace paraplan::host
