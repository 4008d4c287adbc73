// GEMM and linear layers.
//
// With OpenBLAS (the default build) every GEMM is one cblas_sgemm call, single-threaded in the
// calling rank thread: the rank threads are the parallelism, and a rank waiting on a collective
// sleeps instead of leaving BLAS worker threads spinning. The same shapes on the same machine
// give the same bits from run to run; a GEMM cut into column or row shards may differ from the
// whole one in the last bits (blocking and edge kernels depend on the shape), which the
// equivalence suite's tolerance covers.
//
// OpenBLAS is loaded at process start with dlopen rather than linked, so that its kernel can be
// chosen first. A DYNAMIC_ARCH build (Debian's) picks its kernel when it is loaded, from a table
// of CPU models, and a model newer than its table falls back to the Prescott (SSE3) kernel:
// Debian 12's 0.3.21 on an Emerald Rapids Xeon (family 6, model 207) runs sgemm at 34 GFLOP/s
// where its SkylakeX kernel reaches 130-180. So unless the user set OPENBLAS_CORETYPE, it is set
// from the CPU's features before the load: AVX-512 (F, BW, DQ, VL) takes SkylakeX, AVX2 with FMA
// Haswell (Zen on AMD); older CPUs are left to OpenBLAS. A linked OpenBLAS would have chosen
// before any code of ours runs (its constructor precedes the executable's, and libc resets the
// environment after .preinit_array).
//
// When OpenBLAS is not in the build, or cannot be loaded, the built-in kernel below runs: a
// 4-row × 16-column tile of C in 32-byte vectors while it walks k, each C element summed over k
// in increasing order with separate multiplies and adds (the file is built with
// -ffp-contract=off), so the AVX2 and baseline clones give the same bits and column shards
// reproduce the whole GEMM exactly.

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "runtime/backends/host/kernels/kernels.h"
#include "runtime/backends/host/kernels/simd.h"

#if PARAPLAN_HAVE_BLAS
#include <cblas.h>
#include <dlfcn.h>
#endif

namespace paraplan::host {
namespace {

#if PARAPLAN_HAVE_BLAS

// The OpenBLAS kernel for this CPU by its features, or nullptr to leave the choice to OpenBLAS.
const char* BlasCoreForCpu() {
#if defined(__x86_64__) && defined(__GNUC__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl")) {
    return "SkylakeX";
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    return __builtin_cpu_is("amd") ? "Zen" : "Haswell";
  }
#endif
  return nullptr;
}

struct BlasLibrary {
  decltype(&cblas_sgemm) sgemm = nullptr;
  std::string description;  // "OpenBLAS 0.3.21, SkylakeX kernel", or why the built-in runs
};

template <typename F>
F Symbol(void* handle, const char* name) {
  return reinterpret_cast<F>(dlsym(handle, name));
}

BlasLibrary LoadBlas() {
  BlasLibrary blas;
  if (std::getenv("OPENBLAS_CORETYPE") == nullptr) {
    if (const char* core = BlasCoreForCpu()) setenv("OPENBLAS_CORETYPE", core, 0);
  }
  void* handle = nullptr;
  for (const char* name : {"libopenblas.so.0", "libopenblas.so"}) {
    handle = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (handle != nullptr) break;
  }
  if (handle == nullptr) {
    blas.description = std::string("built-in (OpenBLAS not loaded: ") + dlerror() + ")";
    return blas;
  }
  auto sgemm = Symbol<decltype(&cblas_sgemm)>(handle, "cblas_sgemm");
  auto threads = Symbol<decltype(&openblas_set_num_threads)>(handle, "openblas_set_num_threads");
  auto core = Symbol<decltype(&openblas_get_corename)>(handle, "openblas_get_corename");
  auto config = Symbol<decltype(&openblas_get_config)>(handle, "openblas_get_config");
  if (sgemm == nullptr || threads == nullptr || core == nullptr || config == nullptr) {
    blas.description = "built-in (the loaded libopenblas lacks cblas_sgemm or its controls)";
    return blas;
  }
  threads(1);                      // the rank threads are the parallelism
  std::string version = config();  // "OpenBLAS 0.3.21 NO_LAPACKE DYNAMIC_ARCH ..."
  const size_t space = version.find(' ', version.find(' ') + 1);
  if (space != std::string::npos) version.resize(space);
  blas.sgemm = sgemm;
  blas.description = version + ", " + core() + " kernel";
  return blas;
}

const BlasLibrary& Blas() {
  static const BlasLibrary kBlas = LoadBlas();
  return kBlas;
}

// Loads OpenBLAS while the process is still single-threaded (setenv is not thread-safe).
__attribute__((constructor)) void LoadBlasAtStart() { Blas(); }

void BlasGemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const float* a,
              const float* b, float beta, float* c) {
  Blas().sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
               trans_b ? CblasTrans : CblasNoTrans, static_cast<blasint>(m),
               static_cast<blasint>(n), static_cast<blasint>(k), 1.0f, a,
               static_cast<blasint>(trans_a ? m : k), b, static_cast<blasint>(trans_b ? k : n),
               beta, c, static_cast<blasint>(n));
}

#endif

typedef float V8 __attribute__((vector_size(32), aligned(4)));
constexpr int64_t kRows = 4;
constexpr int64_t kCols = 16;

PARAPLAN_HOST_INLINE V8 Load(const float* p) { return *reinterpret_cast<const V8*>(p); }
PARAPLAN_HOST_INLINE void Store(float* p, V8 v) { *reinterpret_cast<V8*>(p) = v; }

// C rows [0, rows) (rows <= 4) of an M-block: ap is the packed A block (ap[k * 4 + r]),
// bp is K × N row-major with leading dimension ldb, c has leading dimension ldc.
// (rows, n, k: a BLAS's order of sizes.)
// NOLINTNEXTLINE(bugprone-easily-swappable-parameters)
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

}  // namespace

const char* GemmLibrary() {
#if PARAPLAN_HAVE_BLAS
  return Blas().description.c_str();
#else
  return "built-in (OpenBLAS not in the build)";
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
  if (Blas().sgemm != nullptr) {
    BlasGemm(trans_a, trans_b, m, n, k, a, b, beta, c);
    return;
  }
#endif
  BuiltinGemm(trans_a, trans_b, m, n, k, a, b, beta, c);
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
