// 8-lane fp32 vectors for the host kernels (GCC vector extensions, 32 bytes): one AVX2 register,
// two SSE registers on a baseline x86-64 CPU (attention's tiles also have 16-lane AVX-512 paths).
// Functions that use them are compiled twice (PARAPLAN_HOST_CLONES: an AVX2 clone and a baseline
// one, picked at load time). The kernels are built with -ffp-contract=off, so no clone fuses a
// multiply and an add, and a reduction keeps its 8 partial sums in the same lanes on every CPU: the
// clones compute the same bits. (Attention's 16-lane AVX-512 paths fuse them: kernels.h.)
//
// Made by: this folder. Read by: the host kernels only.
#ifndef PARAPLAN_RUNTIME_BACKENDS_HOST_KERNELS_SIMD_H_
#define PARAPLAN_RUNTIME_BACKENDS_HOST_KERNELS_SIMD_H_

#include <cstdint>
#include <cstring>

// GCC on x86-64 only: clang refuses 32-byte vector values in a function's baseline clone, and
// other CPUs have no such clones; there the kernels are compiled once, for the baseline, with
// the same 8-lane arithmetic (so the same bits).
#if defined(__x86_64__) && !defined(__clang__)
#define PARAPLAN_HOST_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define PARAPLAN_HOST_CLONES
#endif
#define PARAPLAN_HOST_INLINE __attribute__((always_inline)) inline

// Functions on 16-lane (64-byte) vectors, for CPUs with AVX-512; called only where VectorWidth()
// is 16. GCC on x86-64 only, like the clones.
#if defined(__x86_64__) && !defined(__clang__)
#define PARAPLAN_HOST_HAVE_AVX512 1
#define PARAPLAN_HOST_AVX512 __attribute__((target("avx512f,avx512vl,avx512bw,avx512dq")))
#else
#define PARAPLAN_HOST_HAVE_AVX512 0
#define PARAPLAN_HOST_AVX512
#endif

namespace paraplan::host::simd {

typedef float V8 __attribute__((vector_size(32), aligned(4)));
typedef int32_t I8 __attribute__((vector_size(32), aligned(4)));
typedef float V4 __attribute__((vector_size(16), aligned(4)));
typedef double D4 __attribute__((vector_size(32), aligned(8)));
constexpr int64_t kLanes = 8;

PARAPLAN_HOST_INLINE V8 Load(const float* p) { return *reinterpret_cast<const V8*>(p); }
PARAPLAN_HOST_INLINE void Store(float* p, V8 v) { *reinterpret_cast<V8*>(p) = v; }
PARAPLAN_HOST_INLINE V8 Splat(float x) { return V8{x, x, x, x, x, x, x, x}; }

// The first n (< 8) elements; the other lanes are `fill`.
PARAPLAN_HOST_INLINE V8 LoadPart(const float* p, int64_t n, float fill = 0.0f) {
  float t[kLanes] = {fill, fill, fill, fill, fill, fill, fill, fill};
  std::memcpy(t, p, static_cast<size_t>(n) * sizeof(float));
  return Load(t);
}
PARAPLAN_HOST_INLINE void StorePart(float* p, V8 v, int64_t n) {
  float t[kLanes];
  Store(t, v);
  std::memcpy(p, t, static_cast<size_t>(n) * sizeof(float));
}

// Lanes 0-3 and 4-7 widened to double.
PARAPLAN_HOST_INLINE D4 Low(V8 v) {
  return __builtin_convertvector(V4{v[0], v[1], v[2], v[3]}, D4);
}
PARAPLAN_HOST_INLINE D4 High(V8 v) {
  return __builtin_convertvector(V4{v[4], v[5], v[6], v[7]}, D4);
}
// Sum of the lanes, in a fixed order.
PARAPLAN_HOST_INLINE double Sum(D4 a) { return (a[0] + a[2]) + (a[1] + a[3]); }
PARAPLAN_HOST_INLINE float Sum(V8 v) {
  return ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7]));
}
PARAPLAN_HOST_INLINE float Max(V8 v) {
  float m = v[0];
  for (int i = 1; i < kLanes; ++i) m = v[i] > m ? v[i] : m;
  return m;
}

// e^x with a relative error of about 2e-7 (a degree-6 polynomial on [-ln2/2, ln2/2] times 2^n,
// after Cephes' expf): 0 below -87 (no subnormal results), +inf above 88, NaN stays NaN. Written
// over the vector type (V floats, I as many int32 lanes), lane by lane.
template <typename V, typename I>
PARAPLAN_HOST_INLINE V ExpT(V x) {
  const V zero{};
  const V lo = zero - 87.0f, hi = zero + 88.0f;
  V c = x < lo ? lo : x;
  c = c > hi ? hi : c;
  // n = round(x / ln 2), by adding and removing 1.5 * 2^23.
  const V magic = zero + 12582912.0f;
  const V fn = (c * 1.44269504088896341f + magic) - magic;
  const V r = (c - fn * 0.693359375f) - fn * -2.12194440e-4f;  // x - n ln2 in two parts
  const V z = r * r;
  V y = zero + 1.9875691500e-4f;
  y = y * r + 1.3981999507e-3f;
  y = y * r + 8.3334519073e-3f;
  y = y * r + 4.1665795894e-2f;
  y = y * r + 1.6666665459e-1f;
  y = y * r + 5.0000001201e-1f;
  y = y * z + r + 1.0f;
  const I n = __builtin_convertvector(fn, I);
  const V scale = reinterpret_cast<V>((n + 127) << 23);
  y = y * scale;
  y = x < lo ? zero : y;
  return x > hi ? zero + __builtin_inff() : y;
}
PARAPLAN_HOST_INLINE V8 Exp(V8 x) { return ExpT<V8, I8>(x); }

}  // namespace paraplan::host::simd

#endif  // PARAPLAN_RUNTIME_BACKENDS_HOST_KERNELS_SIMD_H_
