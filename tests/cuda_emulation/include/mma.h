// The emulated <mma.h>: the WMMA fragment API the attention kernels use (16×16×16 tiles, bf16
// operands, fp32 accumulators). Lane L of the warp holds elements 8L .. 8L+7 of the tile in
// row-major order (the hardware's mapping is unspecified, and no kernel relies on one). Every
// operation is warp-synchronous: all 32 lanes must arrive, with the same pointer and leading
// dimension; tiles inside the block's dynamic shared memory must lie wholly inside it.
// mma_sync multiplies exactly (bf16 products are exact in fp32) and accumulates in fp32 in k
// order; tensor cores add in an unspecified order (documented in docs/runtime.md).
#ifndef PARAPLAN_TESTS_CUDA_EMULATION_INCLUDE_MMA_H_
#define PARAPLAN_TESTS_CUDA_EMULATION_INCLUDE_MMA_H_

// These declarations stand in for the CUDA toolkit's and carry its names (threadIdx,
// __syncthreads, __nv_bfloat16, nvcuda::wmma::fragment ...), which the .cu sources use: the
// naming and reserved-identifier checks do not apply to them.
// NOLINTBEGIN(readability-identifier-naming, bugprone-reserved-identifier)

#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace nvcuda {
namespace wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <typename Use, int M, int N, int K, typename T, typename Layout = void>
struct fragment {
  static_assert(M == 16 && N == 16 && K == 16, "the emulation supports 16x16x16 WMMA tiles");
  static constexpr int num_elements = 8;
  T x[num_elements];
};

namespace detail {

inline float ToFloat(float v) { return v; }
inline float ToFloat(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T>
T FromFloat(float v);
template <>
inline float FromFloat<float>(float v) {
  return v;
}
template <>
inline __nv_bfloat16 FromFloat<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// Element (r, c) of a tile at p with leading dimension ldm.
inline int64_t Index(int r, int c, unsigned ldm, bool row_major) {
  return row_major ? static_cast<int64_t>(r) * ldm + c : static_cast<int64_t>(c) * ldm + r;
}

template <typename T>
void CheckTile(const T* p, unsigned ldm, bool row_major, const char* what) {
  // The hardware's rules: a 256-bit aligned pointer, ldm a multiple of 16 bytes.
  if (reinterpret_cast<uintptr_t>(p) % 32 != 0 || (ldm * sizeof(T)) % 16 != 0) {
    cudaemu::RaiseFault(
        std::string(what) + ": the pointer must be 32-byte aligned and ldm a multiple of " +
        std::to_string(16 / sizeof(T)) + " elements (ldm " + std::to_string(ldm) + ")");
  }
  const T* last = p + Index(15, 15, ldm, row_major);
  const T* far = p + Index(row_major ? 15 : 0, row_major ? 0 : 15, ldm, row_major);
  cudaemu::CheckSharedRange(p, (far > last ? far : last) + 1, what);
}

template <typename Frag, typename T>
void Load(Frag& f, const T* p, unsigned ldm, bool row_major, const char* file, int line) {
  CheckTile(p, ldm, row_major, "wmma::load_matrix_sync");
  const int lane = cudaemu::LaneId();
  for (int e = 0; e < 8; ++e) {
    const int idx = lane * 8 + e;
    f.x[e] = p[Index(idx / 16, idx % 16, ldm, row_major)];
  }
  cudaemu::WarpCollective(cudaemu::WarpOp::kWmmaLoad, 0xffffffffu, reinterpret_cast<uintptr_t>(p),
                          static_cast<int>(ldm), 32, file, line);
}

// d = a * b + c, in the order of CUDA's mma_sync.
template <typename T>
// NOLINTNEXTLINE(bugprone-easily-swappable-parameters)
void MmaCompute(void* const* d, const void* const* a, const void* const* b, const void* const* c) {
  using FragAcc = fragment<accumulator, 16, 16, 16, float>;
  float A[16][16], B[16][16], C[16][16];
  for (int lane = 0; lane < 32; ++lane) {
    for (int e = 0; e < 8; ++e) {
      const int idx = lane * 8 + e;
      A[idx / 16][idx % 16] = ToFloat(static_cast<const T*>(a[lane])[e]);
      B[idx / 16][idx % 16] = ToFloat(static_cast<const T*>(b[lane])[e]);
      C[idx / 16][idx % 16] = static_cast<const FragAcc*>(c[lane])->x[e];
    }
  }
  // D[r][c] = C[r][c] + A[r][0]·B[0][c] + ... + A[r][15]·B[15][c], added in k order.
  for (int r = 0; r < 16; ++r) {
    for (int k = 0; k < 16; ++k) {
      const float x = A[r][k];
      for (int col = 0; col < 16; ++col) C[r][col] += x * B[k][col];
    }
  }
  for (int lane = 0; lane < 32; ++lane) {
    for (int e = 0; e < 8; ++e) {
      const int idx = lane * 8 + e;
      static_cast<FragAcc*>(d[lane])->x[e] = C[idx / 16][idx % 16];
    }
  }
}

}  // namespace detail

template <typename Use, typename T, typename Layout>
void load_matrix_sync(fragment<Use, 16, 16, 16, T, Layout>& f, const T* p, unsigned ldm,
                      const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  static_assert(!std::is_same_v<Use, accumulator>, "accumulator loads take a layout");
  detail::Load(f, p, ldm, std::is_same_v<Layout, row_major>, file, line);
}

inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float>& f, const float* p,
                             unsigned ldm, layout_t layout, const char* file = __builtin_FILE(),
                             int line = __builtin_LINE()) {
  detail::Load(f, p, ldm, layout == mem_row_major, file, line);
}

inline void store_matrix_sync(float* p, const fragment<accumulator, 16, 16, 16, float>& f,
                              unsigned ldm, layout_t layout, const char* file = __builtin_FILE(),
                              int line = __builtin_LINE()) {
  const bool row = layout == mem_row_major;
  detail::CheckTile(p, ldm, row, "wmma::store_matrix_sync");
  const int lane = cudaemu::LaneId();
  for (int e = 0; e < 8; ++e) {
    const int idx = lane * 8 + e;
    p[detail::Index(idx / 16, idx % 16, ldm, row)] = f.x[e];
  }
  cudaemu::WarpCollective(cudaemu::WarpOp::kWmmaStore, 0xffffffffu, reinterpret_cast<uintptr_t>(p),
                          static_cast<int>(ldm), 32, file, line);
}

template <typename Use, typename T, typename Layout>
void fill_fragment(fragment<Use, 16, 16, 16, T, Layout>& f, T value) {
  for (auto& x : f.x) x = value;
}
template <typename Use, typename T, typename Layout>
void fill_fragment(fragment<Use, 16, 16, 16, T, Layout>& f,
                   float value) requires(!std::is_same_v<T, float>) {
  for (auto& x : f.x) x = detail::FromFloat<T>(value);
}

template <typename T, typename LayoutA, typename LayoutB>
void mma_sync(fragment<accumulator, 16, 16, 16, float>& d,
              const fragment<matrix_a, 16, 16, 16, T, LayoutA>& a,
              const fragment<matrix_b, 16, 16, 16, T, LayoutB>& b,
              const fragment<accumulator, 16, 16, 16, float>& c,
              const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  cudaemu::WarpMma(0xffffffffu, &d, &a, &b, &c, &detail::MmaCompute<T>, file, line);
}

}  // namespace wmma
}  // namespace nvcuda

// NOLINTEND(readability-identifier-naming, bugprone-reserved-identifier)
#endif  // PARAPLAN_TESTS_CUDA_EMULATION_INCLUDE_MMA_H_
