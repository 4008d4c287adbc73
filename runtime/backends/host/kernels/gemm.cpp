// GEMM and linear layers.
//
// With OpenBLAS (the default build) every GEMM is one cblas_sgemm call, single-threaded in the
// calling rank thread: the rank threads are the parallelism, and a rank waiting on a collective
// sleeps instead of leaving BLAS worker threads spinning. OpenBLAS picks its kernel at run time
// (AVX2+FMA, AVX-512, ...). The same shapes on the same machine give the same bits from run to
// run; a GEMM cut into column or row shards may differ from the whole one in the last bits
// (blocking and edge kernels depend on the shape), which the equivalence suite's tolerance covers.
//
// Without OpenBLAS the built-in kernel below runs: a 4-row × 16-column tile of C in 32-byte
// vectors while it walks k, each C element summed over k in increasing order with separate
// multiplies and adds (the file is built with -ffp-contract=off), so the AVX2 and baseline
// clones give the same bits and column shards reproduce the whole GEMM exactly.
#include <algorithm>
#include <cstring>
#include <mutex>
#include <vector>

#include "runtime/backends/host/kernels/kernels.h"
#include "runtime/backends/host/kernels/simd.h"

#if PARAPLAN_HAVE_BLAS
#include <cblas.h>
#endif

namespace paraplan::host {
namespace {

#if PARAPLAN_HAVE_BLAS

void BlasGemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const float* a,
              const float* b, float beta, float* c) {
  static std::once_flag once;
  std::call_once(once, [] { openblas_set_num_threads(1); });
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, static_cast<blasint>(m), static_cast<blasint>(n),
              static_cast<blasint>(k), 1.0f, a, static_cast<blasint>(trans_a ? m : k), b,
              static_cast<blasint>(trans_b ? k : n), beta, c, static_cast<blasint>(n));
}

#else

typedef float V8 __attribute__((vector_size(32), aligned(4)));
constexpr int64_t kRows = 4;
constexpr int64_t kCols = 16;

PARAPLAN_HOST_INLINE V8 Load(const float* p) { return *reinterpret_cast<const V8*>(p); }
PARAPLAN_HOST_INLINE void Store(float* p, V8 v) { *reinterpret_cast<V8*>(p) = v; }

// C rows [0, rows) (rows <= 4) of an M-block: ap is the packed A block (ap[k * 4 + r]),
// bp is K × N row-major with leading dimension ldb, c has leading dimension ldc.
PARAPLAN_HOST_CLONES void GemmRowBlock(int64_t rows, int64_t n, int64_t k, const float* ap,
                                       const float* bp, int64_t ldb, float beta, float* c,
                                       int64_t ldc) {
  int64_t j = 0;
  // The 4 × 16 tile lives in eight named vector registers (an array would be kept in memory).
  for (; j + kCols <= n; j += kCols) {
    V8 c00{}, c01{}, c10{}, c11{}, c20{}, c21{}, c30{}, c31{};
    if (beta != 0.0f) {
      c00 = Load(c + j), c01 = Load(c + j + 8);
      if (rows > 1) c10 = Load(c + ldc + j), c11 = Load(c + ldc + j + 8);
      if (rows > 2) c20 = Load(c + 2 * ldc + j), c21 = Load(c + 2 * ldc + j + 8);
      if (rows > 3) c30 = Load(c + 3 * ldc + j), c31 = Load(c + 3 * ldc + j + 8);
    }
    const float* a = ap;
    const float* bk = bp + j;
    for (int64_t kk = 0; kk < k; ++kk, a += kRows, bk += ldb) {
      const V8 b0 = Load(bk), b1 = Load(bk + 8);
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
    Store(c + j, c00), Store(c + j + 8, c01);
    if (rows > 1) Store(c + ldc + j, c10), Store(c + ldc + j + 8, c11);
    if (rows > 2) Store(c + 2 * ldc + j, c20), Store(c + 2 * ldc + j + 8, c21);
    if (rows > 3) Store(c + 3 * ldc + j, c30), Store(c + 3 * ldc + j + 8, c31);
  }
  for (; j < n; ++j) {
    for (int64_t r = 0; r < rows; ++r) {
      float acc = beta != 0.0f ? c[r * ldc + j] : 0.0f;
      for (int64_t kk = 0; kk < k; ++kk) acc += ap[kk * kRows + r] * bp[kk * ldb + j];
      c[r * ldc + j] = acc;
    }
  }
}

void BuiltinGemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const float* a,
                 const float* b, float beta, float* c) {
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
  // One panel of 16 columns of C at a time. With trans_b, B is N × K and the panel's 16 rows of B
  // are packed K-major (panel[kk * 16 + x]), reading each row of B sequentially; otherwise the
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
      GemmRowBlock(std::min(kRows, m - i0), nj, k, ap.data() + bi * k * kRows, bp, ldb, beta,
                   c + i0 * n + j0, n);
    }
  }
}

#endif

}  // namespace

const char* GemmLibrary() {
#if PARAPLAN_HAVE_BLAS
  return "OpenBLAS";
#else
  return "built-in";
#endif
}

void Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const float* a,
          const float* b, float beta, float* c) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0) {
    if (beta == 0.0f) std::fill(c, c + m * n, 0.0f);
    return;
  }
#if PARAPLAN_HAVE_BLAS
  BlasGemm(trans_a, trans_b, m, n, k, a, b, beta, c);
#else
  BuiltinGemm(trans_a, trans_b, m, n, k, a, b, beta, c);
#endif
}

void LinearForward(float* y, const float* x, const float* w, const float* bias, int64_t rows,
                   int64_t in, int64_t out) {
  Gemm(false, true, rows, out, in, x, w, 0.0f, y);
  if (bias) {
    for (int64_t r = 0; r < rows; ++r) Accumulate(y + r * out, bias, out);
  }
}

void LinearBackward(float* dx, float* dw, float* dbias, const float* dy, const float* x,
                    const float* w, int64_t rows, int64_t in, int64_t out, bool accumulate_dx) {
  if (dx) Gemm(false, false, rows, in, out, dy, w, accumulate_dx ? 1.0f : 0.0f, dx);
  if (dw) Gemm(true, false, out, in, rows, dy, x, 1.0f, dw);
  if (dbias) {
    for (int64_t r = 0; r < rows; ++r) Accumulate(dbias, dy + r * out, out);
  }
}

}  // namespace paraplan::host
