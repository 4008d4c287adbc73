// The cuBLASLt entry points the GEMM engine calls, as a reference implementation with the
// documented semantics: column-major matrices with leading dimensions, D = alpha · op(A) · op(B)
// + beta · C (C not read when beta is 0; C may be D), op = transpose or not per descriptor,
// bf16 or fp32 operands and fp32 or bf16 C/D, fp32 compute and scale type, the DEFAULT, BIAS,
// RELU and GELU epilogues (bias of length m, added per row), and the work queued on the stream
// in order. Every product is exact and the sum runs in fp32 in k order; the library's kernels
// add in other orders (split-K, tensor-core trees): docs/runtime.md lists the difference.
#include <cublasLt.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "tests/cuda_emulation/emulator.h"

struct cublasLtContext {
  uint64_t magic = 0x4c74;
};

namespace cudaemu {
namespace {

constexpr uint64_t kDescMagic = 0x6465736321ull, kLayoutMagic = 0x6c61796f7521ull,
                   kPrefMagic = 0x7072656621ull;

struct MatmulDesc {
  uint64_t magic = kDescMagic;
  cublasComputeType_t compute;
  cudaDataType_t scale;
  cublasOperation_t trans_a = CUBLAS_OP_N, trans_b = CUBLAS_OP_N;
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;
  cudaDataType_t bias_type = CUDA_R_32F;
  bool bias_type_set = false;
  cublasLtPointerMode_t pointer_mode = CUBLASLT_POINTER_MODE_HOST;
};

struct Layout {
  uint64_t magic = kLayoutMagic;
  cudaDataType type;
  uint64_t rows, cols;
  int64_t ld;
  int32_t order = CUBLASLT_ORDER_COL;
  int32_t batch = 1;
};

struct Preference {
  uint64_t magic = kPrefMagic;
  uint64_t max_workspace = 0;
};

MatmulDesc* D(cublasLtMatmulDesc_t d) {
  auto* p = reinterpret_cast<MatmulDesc*>(d);
  return p != nullptr && p->magic == kDescMagic ? p : nullptr;
}
Layout* L(cublasLtMatrixLayout_t l) {
  auto* p = reinterpret_cast<Layout*>(l);
  return p != nullptr && p->magic == kLayoutMagic ? p : nullptr;
}

bool SupportedType(cudaDataType t) { return t == CUDA_R_16BF || t == CUDA_R_32F; }
size_t Bytes(cudaDataType t) { return t == CUDA_R_16BF ? 2 : 4; }

float Read(const void* base, cudaDataType t, int64_t index) {
  if (t == CUDA_R_32F) return static_cast<const float*>(base)[index];
  uint16_t h;
  std::memcpy(&h, static_cast<const char*>(base) + 2 * index, 2);
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

void Write(void* base, cudaDataType t, int64_t index, float v) {
  if (t == CUDA_R_32F) {
    static_cast<float*>(base)[index] = v;
    return;
  }
  uint32_t u;
  std::memcpy(&u, &v, 4);
  uint16_t h = (u & 0x7fffffffu) > 0x7f800000u
                   ? 0x7fff
                   : static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  std::memcpy(static_cast<char*>(base) + 2 * index, &h, 2);
}

// Shapes of op(A) (m × k), op(B) (k × n), C and D (m × n); checks the layouts agree.
cublasStatus_t Shape(const MatmulDesc& d, const Layout& a, const Layout& b, const Layout& c,
                     const Layout& dl, uint64_t& m, uint64_t& n, uint64_t& k) {
  for (const Layout* l : {&a, &b, &c, &dl}) {
    if (l->order != CUBLASLT_ORDER_COL || l->batch != 1) return CUBLAS_STATUS_NOT_SUPPORTED;
    if (!SupportedType(l->type)) return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  if (d.compute != CUBLAS_COMPUTE_32F || d.scale != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (a.type != b.type) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (d.pointer_mode != CUBLASLT_POINTER_MODE_HOST) return CUBLAS_STATUS_NOT_SUPPORTED;
  const bool ta = d.trans_a == CUBLAS_OP_T, tb = d.trans_b == CUBLAS_OP_T;
  m = ta ? a.cols : a.rows;
  k = ta ? a.rows : a.cols;
  const uint64_t kb = tb ? b.cols : b.rows;
  n = tb ? b.rows : b.cols;
  if (kb != k || c.rows != m || c.cols != n || dl.rows != m || dl.cols != n || c.type != dl.type) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  switch (d.epilogue) {
    case CUBLASLT_EPILOGUE_DEFAULT:
    case CUBLASLT_EPILOGUE_RELU:
    case CUBLASLT_EPILOGUE_GELU:
      break;
    case CUBLASLT_EPILOGUE_BIAS:
    case CUBLASLT_EPILOGUE_RELU_BIAS:
    case CUBLASLT_EPILOGUE_GELU_BIAS:
      if (d.bias == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
      break;
    default:
      return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  return CUBLAS_STATUS_SUCCESS;
}

}  // namespace
}  // namespace cudaemu

using namespace cudaemu;

extern "C" {

cublasStatus_t cublasLtCreate(cublasLtHandle_t* handle) {
  if (handle == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *handle = new cublasLtContext;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* desc, cublasComputeType_t compute,
                                        cudaDataType_t scale) {
  auto* d = new MatmulDesc;
  d->compute = compute;
  d->scale = scale;
  *desc = reinterpret_cast<cublasLtMatmulDesc_t>(d);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
  MatmulDesc* d = D(desc);
  if (d == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  d->magic = 0;
  delete d;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc,
                                              cublasLtMatmulDescAttributes_t attr, const void* buf,
                                              size_t size) {
  MatmulDesc* d = D(desc);
  if (d == nullptr || buf == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  auto get = [&](auto& field) {
    if (size != sizeof field) return CUBLAS_STATUS_INVALID_VALUE;
    std::memcpy(&field, buf, size);
    return CUBLAS_STATUS_SUCCESS;
  };
  switch (attr) {
    case CUBLASLT_MATMUL_DESC_TRANSA:
      return get(d->trans_a);
    case CUBLASLT_MATMUL_DESC_TRANSB:
      return get(d->trans_b);
    case CUBLASLT_MATMUL_DESC_EPILOGUE:
      return get(d->epilogue);
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER:
      return get(d->bias);
    case CUBLASLT_MATMUL_DESC_POINTER_MODE:
      return get(d->pointer_mode);
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE:
      d->bias_type_set = true;
      return get(d->bias_type);
    case CUBLASLT_MATMUL_DESC_COMPUTE_TYPE:
      return get(d->compute);
    case CUBLASLT_MATMUL_DESC_SCALE_TYPE:
      return get(d->scale);
    default:
      return CUBLAS_STATUS_NOT_SUPPORTED;
  }
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* layout, cudaDataType type,
                                          uint64_t rows, uint64_t cols, int64_t ld) {
  // Column-major: a column is `ld` elements apart, so ld must cover the rows.
  if (layout == nullptr || ld < 0 || (rows > 0 && static_cast<uint64_t>(ld) < rows))
    return CUBLAS_STATUS_INVALID_VALUE;
  auto* l = new Layout;
  l->type = type;
  l->rows = rows;
  l->cols = cols;
  l->ld = ld;
  *layout = reinterpret_cast<cublasLtMatrixLayout_t>(l);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
  Layout* l = L(layout);
  if (l == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  l->magic = 0;
  delete l;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
  *pref = reinterpret_cast<cublasLtMatmulPreference_t>(new Preference);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
  delete reinterpret_cast<Preference*>(pref);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr,
                                                    const void* buf, size_t size) {
  auto* p = reinterpret_cast<Preference*>(pref);
  if (p == nullptr || p->magic != kPrefMagic) return CUBLAS_STATUS_INVALID_VALUE;
  if (attr == CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES) {
    if (size != sizeof(uint64_t)) return CUBLAS_STATUS_INVALID_VALUE;
    std::memcpy(&p->max_workspace, buf, size);
  }
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                                              cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                              cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                              cublasLtMatmulPreference_t pref, int requested,
                                              cublasLtMatmulHeuristicResult_t results[],
                                              int* count) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (D(desc) == nullptr || !L(a) || !L(b) || !L(c) || !L(d) || requested < 1 || count == nullptr) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  uint64_t m, n, k;
  *count = 0;
  const cublasStatus_t status = Shape(*D(desc), *L(a), *L(b), *L(c), *L(d), m, n, k);
  if (status == CUBLAS_STATUS_NOT_SUPPORTED) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (status != CUBLAS_STATUS_SUCCESS) return status;
  std::memset(&results[0], 0, sizeof results[0]);
  results[0].algo.data[0] = 0x656d75;  // the one algorithm: the reference loop
  results[0].workspaceSize = 0;
  results[0].state = CUBLAS_STATUS_SUCCESS;
  results[0].wavesCount = 1.0f;
  *count = 1;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, const void* alpha,
                              const void* A, cublasLtMatrixLayout_t adesc, const void* B,
                              cublasLtMatrixLayout_t bdesc, const void* beta, const void* C,
                              cublasLtMatrixLayout_t cdesc, void* Dp, cublasLtMatrixLayout_t ddesc,
                              const cublasLtMatmulAlgo_t* algo, void* workspace,
                              size_t workspace_bytes, cudaStream_t stream) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  MatmulDesc* d = D(desc);
  Layout *la = L(adesc), *lb = L(bdesc), *lc = L(cdesc), *ld = L(ddesc);
  if (d == nullptr || !la || !lb || !lc || !ld || alpha == nullptr || beta == nullptr)
    return CUBLAS_STATUS_INVALID_VALUE;
  uint64_t m, n, k;
  if (cublasStatus_t s = Shape(*d, *la, *lb, *lc, *ld, m, n, k); s != CUBLAS_STATUS_SUCCESS)
    return s;
  if (m == 0 || n == 0) return CUBLAS_STATUS_SUCCESS;
  const float al = *static_cast<const float*>(alpha), be = *static_cast<const float*>(beta);
  // Every operand must lie in device memory, column j starting at j · ld.
  auto extent = [](const Layout& l) { return ((l.cols - 1) * l.ld + l.rows) * Bytes(l.type); };
  if ((k > 0 && (!IsDeviceRange(A, extent(*la)) || !IsDeviceRange(B, extent(*lb)))) ||
      !IsDeviceRange(Dp, extent(*ld)) || (be != 0.0f && !IsDeviceRange(C, extent(*lc))) ||
      (workspace_bytes > 0 && !IsDeviceRange(workspace, workspace_bytes))) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  const MatmulDesc desc_copy = *d;
  const Layout a = *la, b = *lb, c = *lc, dl = *ld;
  EnqueueWork(stream, [=] {
    const bool ta = desc_copy.trans_a == CUBLAS_OP_T, tb = desc_copy.trans_b == CUBLAS_OP_T;
    // op(A) as m rows of k, op(B) as n columns of k, both fp32 (bf16 widens exactly).
    std::vector<float> arow(m * k), bcol(n * k);
    for (uint64_t i = 0; i < m; ++i) {
      for (uint64_t p = 0; p < k; ++p)
        arow[i * k + p] = Read(A, a.type, ta ? i * a.ld + p : p * a.ld + i);
    }
    for (uint64_t j = 0; j < n; ++j) {
      for (uint64_t p = 0; p < k; ++p)
        bcol[j * k + p] = Read(B, b.type, tb ? p * b.ld + j : j * b.ld + p);
    }
    const cudaDataType bias_type = desc_copy.bias_type_set ? desc_copy.bias_type : dl.type;
    const int ep = desc_copy.epilogue;
    for (uint64_t j = 0; j < n; ++j) {
      for (uint64_t i = 0; i < m; ++i) {
        float acc = 0.0f;
        const float* x = &arow[i * k];
        const float* y = &bcol[j * k];
        for (uint64_t p = 0; p < k; ++p) acc += x[p] * y[p];
        float v = al * acc;
        if (be != 0.0f) v += be * Read(C, c.type, j * c.ld + i);
        if (ep & CUBLASLT_EPILOGUE_BIAS) v += Read(desc_copy.bias, bias_type, i);
        if (ep & CUBLASLT_EPILOGUE_RELU) v = v > 0.0f ? v : 0.0f;
        if (ep & CUBLASLT_EPILOGUE_GELU) {
          v = 0.5f * v * (1.0f + std::tanh(0.7978845608028654f * (v + 0.044715f * v * v * v)));
        }
        Write(Dp, dl.type, j * dl.ld + i, v);
      }
    }
  });
  return CUBLAS_STATUS_SUCCESS;
}

}  // extern "C"
