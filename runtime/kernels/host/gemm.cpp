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
    if (beta != 0.0f) {
      const V16* c0 = reinterpret_cast<const V16*>(c + j);
      c00 = c0[0], c01 = c0[1];
      if (rows > 1) c10 = *reinterpret_cast<const V16*>(c + ldc + j), c11 = *reinterpret_cast<const V16*>(c + ldc + j + 16);
      if (rows > 2) c20 = *reinterpret_cast<const V16*>(c + 2 * ldc + j), c21 = *reinterpret_cast<const V16*>(c + 2 * ldc + j + 16);
      if (rows > 3) c30 = *reinterpret_cast<const V16*>(c + 3 * ldc + j), c31 = *reinterpret_cast<const V16*>(c + 3 * ldc + j + 16);
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
  // op(A) packed once, in blocks of 4 rows: block b holds ap[b][kk * 4 + r] = op(A)[4b + r][kk]
  // (zeros past the last row).
  const int64_t blocks = (m + kRows - 1) / kRows;
  std::vector<float> ap(static_cast<size_t>(blocks * k * kRows), 0.0f);
  for (int64_t bi = 0; bi < blocks; ++bi) {
    float* dst = ap.data() + bi * k * kRows;
    const int64_t rows = std::min(kRows, m - bi * kRows);
    if (trans_a) {  // A is K × M: the block's 4 values of each kk are contiguous
      const float* col = a + bi * kRows;
      for (int64_t kk = 0; kk < k; ++kk) {
        for (int64_t r = 0; r < rows; ++r) dst[kk * kRows + r] = col[kk * m + r];
      }
    } else {
      for (int64_t r = 0; r < rows; ++r) {
        const float* row = a + (bi * kRows + r) * k;
        for (int64_t kk = 0; kk < k; ++kk) dst[kk * kRows + r] = row[kk];
      }
    }
  }
  // One panel of 32 columns of C at a time. With trans_b, B is N × K and the panel's 32 rows of B
  // are packed K-major (panel[kk * 32 + x]), reading each row of B sequentially; otherwise the
  // microkernel reads B (K × N) in place.
  std::vector<float> panel(trans_b ? static_cast<size_t>(k * kCols) : 0);
  for (int64_t j0 = 0; j0 < n; j0 += kCols) {
    const int64_t nj = std::min(kCols, n - j0);
    const float* bp = b + j0;
    int64_t ldb = n;
    if (trans_b) {
      for (int64_t x = 0; x < nj; ++x) {
        const float* row = b + (j0 + x) * k;
        for (int64_t kk = 0; kk < k; ++kk) panel[kk * kCols + x] = row[kk];
      }
      bp = panel.data();
      ldb = kCols;
    }
    for (int64_t bi = 0; bi < blocks; ++bi) {
      const int64_t i0 = bi * kRows;
      GemmRowBlock(std::min(kRows, m - i0), nj, k, ap.data() + bi * k * kRows, bp, ldb, beta, c + i0 * n + j0, n);
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
