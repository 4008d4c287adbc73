#include "runtime/backends/cuda/kernels/gemm.h"

#include <cublasLt.h>

#include <algorithm>
#include <string>

#include "runtime/backends/cuda/kernels/cuda_check.h"
#include "runtime/backends/cuda/kernels/kernels.h"

namespace paraplan::cuda {
namespace {

// cuBLASLt's own recommendation for Hopper is 32 MiB (llm.c uses the same).
constexpr int64_t kWorkspaceBytes = 32ll << 20;

void CheckLt(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    // cublasGetStatusString lives in libcublas, which the backend does not otherwise need.
    throw CudaError(std::string("cuBLASLt call `") + what + "` failed with cublasStatus_t " +
                    std::to_string(static_cast<int>(status)));
  }
}

#define PARAPLAN_LT_CHECK(call) CheckLt((call), #call)

}  // namespace

struct GemmEngine::Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  ~Plan() {
    if (desc) cublasLtMatmulDescDestroy(desc);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (c) cublasLtMatrixLayoutDestroy(c);
  }
};

GemmEngine::GemmEngine(cudaStream_t stream, bool cast_each_operand)
    : stream_(stream), cast_each_operand_(cast_each_operand) {
  cublasLtHandle_t handle;
  PARAPLAN_LT_CHECK(cublasLtCreate(&handle));
  handle_ = handle;
  PARAPLAN_CUDA_CHECK(cudaMalloc(&workspace_, kWorkspaceBytes));
  workspace_bytes_ = kWorkspaceBytes;
}

GemmEngine::~GemmEngine() {
  plans_.clear();
  for (void* s : scratch_) {
    if (s) cudaFree(s);
  }
  if (workspace_) cudaFree(workspace_);
  if (handle_) cublasLtDestroy(static_cast<cublasLtHandle_t>(handle_));
}

void* GemmEngine::Scratch(int which, int64_t bytes) {
  if (scratch_bytes_[which] < bytes) {
    // Grows during the first step only; the old buffer may still be read by queued work.
    PARAPLAN_CUDA_CHECK(cudaStreamSynchronize(stream_));
    if (scratch_[which]) PARAPLAN_CUDA_CHECK(cudaFree(scratch_[which]));
    scratch_[which] = nullptr;
    PARAPLAN_CUDA_CHECK(cudaMalloc(&scratch_[which], bytes));
    scratch_bytes_[which] = bytes;
  }
  return scratch_[which];
}

// Row-major C[M,N] = op(A)·op(B) is column-major Cᵀ[N,M] = op(B)ᵀ·op(A)ᵀ: cuBLAS's "A" is our
// B and its "B" is our A, with the same transpose flags, and C has leading dimension N.
const GemmEngine::Plan& GemmEngine::PlanFor(bool trans_a, bool trans_b, int64_t m, int64_t n,
                                            int64_t k, bool beta_one) {
  Key key{trans_a, trans_b, m, n, k, beta_one};
  auto it = plans_.find(key);
  if (it != plans_.end()) return *it->second;

  auto plan = std::make_unique<Plan>();
  PARAPLAN_LT_CHECK(cublasLtMatmulDescCreate(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  cublasOperation_t op_x = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;  // cuBLAS "A" = our B
  cublasOperation_t op_y = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;  // cuBLAS "B" = our A
  PARAPLAN_LT_CHECK(
      cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_x, sizeof op_x));
  PARAPLAN_LT_CHECK(
      cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_y, sizeof op_y));
  // Stored (column-major) shapes before the op.
  const uint64_t x_rows = trans_b ? k : n, x_cols = trans_b ? n : k;
  const uint64_t y_rows = trans_a ? m : k, y_cols = trans_a ? k : m;
  PARAPLAN_LT_CHECK(cublasLtMatrixLayoutCreate(&plan->a, CUDA_R_16BF, x_rows, x_cols, x_rows));
  PARAPLAN_LT_CHECK(cublasLtMatrixLayoutCreate(&plan->b, CUDA_R_16BF, y_rows, y_cols, y_rows));
  PARAPLAN_LT_CHECK(cublasLtMatrixLayoutCreate(&plan->c, CUDA_R_32F, n, m, n));

  cublasLtMatmulPreference_t pref;
  PARAPLAN_LT_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  uint64_t ws = static_cast<uint64_t>(workspace_bytes_);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                       sizeof ws);
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  cublasStatus_t status =
      cublasLtMatmulAlgoGetHeuristic(static_cast<cublasLtHandle_t>(handle_), plan->desc, plan->a,
                                     plan->b, plan->c, plan->c, pref, 1, &result, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (status != CUBLAS_STATUS_SUCCESS || found == 0) {
    throw CudaError("cuBLASLt has no algorithm for a bf16 GEMM of M=" + std::to_string(m) +
                    " N=" + std::to_string(n) + " K=" + std::to_string(k) +
                    (trans_a ? " (A transposed)" : "") + (trans_b ? " (B transposed)" : ""));
  }
  plan->algo = result.algo;
  auto& slot = plans_[key];
  slot = std::move(plan);
  return *slot;
}

void GemmEngine::GemmBf16(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                          const void* a_bf16, const void* b_bf16, float beta, float* c) {
  if (m <= 0 || n <= 0) return;
  if (beta != 0.0f && beta != 1.0f) throw CudaError("GEMM beta must be 0 or 1");
  if (k <= 0) {
    if (beta == 0.0f) PARAPLAN_CUDA_CHECK(cudaMemsetAsync(c, 0, m * n * sizeof(float), stream_));
    return;
  }
  const Plan& plan = PlanFor(trans_a, trans_b, m, n, k, beta == 1.0f);
  const float alpha = 1.0f;
  PARAPLAN_LT_CHECK(cublasLtMatmul(static_cast<cublasLtHandle_t>(handle_), plan.desc, &alpha,
                                   b_bf16, plan.a, a_bf16, plan.b, &beta, c, plan.c, c, plan.c,
                                   &plan.algo, workspace_, workspace_bytes_, stream_));
}

void GemmEngine::Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const float* a,
                      const float* b, float beta, float* c) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0) {
    GemmBf16(trans_a, trans_b, m, n, k, nullptr, nullptr, beta, c);
    return;
  }
  void* a16 = Scratch(0, m * k * 2);
  void* b16 = Scratch(1, k * n * 2);
  CastToBf16(a16, a, m * k, stream_);
  CastToBf16(b16, b, k * n, stream_);
  GemmBf16(trans_a, trans_b, m, n, k, a16, b16, beta, c);
}

void GemmEngine::LinearForward(float* y, const float* x, const float* w, const float* bias,
                               int64_t rows, int64_t in, int64_t out) {
  Gemm(false, true, rows, out, in, x, w, 0.0f, y);
  if (bias != nullptr) AddBias(y, bias, rows, out, stream_);
}

void GemmEngine::LinearBackward(float* dx, float* dw, float* dbias, const float* dy, const float* x,
                                const float* w, int64_t rows, int64_t in, int64_t out,
                                bool accumulate_dx) {
  const float dx_beta = accumulate_dx ? 1.0f : 0.0f;
  if (dx != nullptr && dw != nullptr && !cast_each_operand_ && rows > 0 && in > 0 && out > 0) {
    // dy in bf16 serves both products; scratch 1 holds w, then x (stream order keeps the dx
    // product's reads of w before the cast of x overwrites it).
    void* dy16 = Scratch(0, rows * out * 2);
    void* w16 = Scratch(1, std::max(out, rows) * in * 2);  // sized for x too: no regrowth between
    CastToBf16(dy16, dy, rows * out, stream_);
    CastToBf16(w16, w, out * in, stream_);
    GemmBf16(false, false, rows, in, out, dy16, w16, dx_beta, dx);
    void* x16 = w16;
    CastToBf16(x16, x, rows * in, stream_);
    GemmBf16(true, false, out, in, rows, dy16, x16, 1.0f, dw);
  } else {
    if (dx != nullptr) Gemm(false, false, rows, in, out, dy, w, dx_beta, dx);
    if (dw != nullptr) Gemm(true, false, out, in, rows, dy, x, 1.0f, dw);
  }
  if (dbias != nullptr) BiasBackward(dbias, dy, rows, out, stream_);
}

}  // namespace paraplan::cuda
