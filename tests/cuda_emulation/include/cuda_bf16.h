// The emulated <cuda_bf16.h>: bfloat16 storage types and the conversions the kernels use, with
// CUDA's rounding (round to nearest even; NaN becomes the canonical quiet NaN 0x7FFF).
#ifndef PARAPLAN_TESTS_CUDA_EMULATION_INCLUDE_CUDA_BF16_H_
#define PARAPLAN_TESTS_CUDA_EMULATION_INCLUDE_CUDA_BF16_H_

// These declarations stand in for the CUDA toolkit's and carry its names (threadIdx,
// __syncthreads, __nv_bfloat16, nvcuda::wmma::fragment ...), which the .cu sources use: the
// naming and reserved-identifier checks do not apply to them.
// NOLINTBEGIN(readability-identifier-naming, bugprone-reserved-identifier)

#include <vector_types.h>

#include <cstdint>
#include <cstring>

namespace cudaemu {

inline uint16_t FloatToBf16Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fff;
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

inline float Bf16BitsToFloat(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

}  // namespace cudaemu

struct alignas(2) __nv_bfloat16 {
  uint16_t __x;
  __nv_bfloat16() = default;
  __nv_bfloat16(float f) : __x(cudaemu::FloatToBf16Bits(f)) {}  // NOLINT: CUDA converts implicitly
  operator float() const { return cudaemu::Bf16BitsToFloat(__x); }
};

struct alignas(4) __nv_bfloat162 {
  __nv_bfloat16 x;
  __nv_bfloat16 y;
};

static_assert(sizeof(__nv_bfloat16) == 2 && sizeof(__nv_bfloat162) == 4);

inline __nv_bfloat16 __float2bfloat16_rn(float f) {
  __nv_bfloat16 h;
  h.__x = cudaemu::FloatToBf16Bits(f);
  return h;
}
inline __nv_bfloat16 __float2bfloat16(float f) { return __float2bfloat16_rn(f); }
inline float __bfloat162float(__nv_bfloat16 h) { return cudaemu::Bf16BitsToFloat(h.__x); }
inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) {
  return __nv_bfloat162{__float2bfloat16_rn(a), __float2bfloat16_rn(b)};
}
inline __nv_bfloat162 __float22bfloat162_rn(float2 v) { return __floats2bfloat162_rn(v.x, v.y); }
inline float2 __bfloat1622float2(__nv_bfloat162 v) {
  return float2{__bfloat162float(v.x), __bfloat162float(v.y)};
}

// NOLINTEND(readability-identifier-naming, bugprone-reserved-identifier)
#endif  // PARAPLAN_TESTS_CUDA_EMULATION_INCLUDE_CUDA_BF16_H_
