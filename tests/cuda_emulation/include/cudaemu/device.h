// Device built-ins of the CUDA emulation: the thread coordinates, block barriers, warp
// shuffles and votes, atomics, the fast-math intrinsics the kernels use, bounds-checked shared
// arrays, and the kernel launcher behind PARAPLAN_LAUNCH.
//
// Execution model (emulator.cpp): a launch runs its blocks one after another; the threads of a
// block are cooperative fibers on one OS thread. A fiber runs until it reaches a barrier, a
// warp-synchronous operation or its end, so `__syncthreads` and `__syncwarp` really order
// memory between threads, and a missing one shows as a wrong result. What hardware would punish
// is a fault of the launch (reported by the next synchronising call, as on a GPU, with a
// message naming the kernel, block, thread and source line):
//  - a `__syncthreads` that some thread of the block does not reach (it exited, or waits at
//    another `__syncthreads`);
//  - a warp operation (shuffle, vote, `__syncwarp`, WMMA) whose mask names a lane that exited,
//    does not exist, or waits at a different operation; a mask without the calling lane;
//  - shared-array indexing out of bounds (SharedArray), WMMA tiles outside the block's dynamic
//    shared memory, a block that can never finish (deadlock).
#ifndef PARAPLAN_TESTS_CUDA_EMULATION_INCLUDE_CUDAEMU_DEVICE_H_
#define PARAPLAN_TESTS_CUDA_EMULATION_INCLUDE_CUDAEMU_DEVICE_H_

// These declarations stand in for the CUDA toolkit's and carry its names (threadIdx,
// __syncthreads, __nv_bfloat16, nvcuda::wmma::fragment ...), which the .cu sources use: the
// naming and reserved-identifier checks do not apply to them.
// NOLINTBEGIN(readability-identifier-naming, bugprone-reserved-identifier)

#include <cuda_runtime_api.h>
#include <vector_functions.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

// ---- Thread coordinates (set by the scheduler whenever it switches fibers) --------------------
extern __thread uint3 threadIdx;
extern __thread uint3 blockIdx;
extern __thread uint3 blockDim;
extern __thread uint3 gridDim;
constexpr int warpSize = 32;

namespace cudaemu {

// A launch fault: what the hardware would punish. Thrown inside a fiber; ends the launch.
class Fault : public std::exception {
 public:
  explicit Fault(std::string what) : what_(std::move(what)) {}
  const char* what() const noexcept override { return what_.c_str(); }

 private:
  std::string what_;
};

[[noreturn]] void RaiseFault(const std::string& what);

// Warp and block operations (emulator.cpp). Every lane named in `mask` must arrive at the same
// operation; the last one to arrive computes everyone's result.
enum class WarpOp : int {
  kSync = 1,
  kShfl,
  kShflXor,
  kShflUp,
  kShflDown,
  kBallot,
  kAll,
  kAny,
  kWmmaLoad,
  kWmmaStore,
  kWmmaMma
};
uint64_t WarpCollective(WarpOp op, unsigned mask, uint64_t value, int arg, int width,
                        const char* file, int line);
// WMMA: registers this lane's fragments; the last lane to arrive computes every lane's result.
using MmaCompute = void (*)(void* const* d, const void* const* a, const void* const* b,
                            const void* const* c);
void WarpMma(unsigned mask, void* d, const void* a, const void* b, const void* c,
             MmaCompute compute, const char* file, int line);
enum class BlockOp : int { kSync = 0, kOr, kAnd, kCount };
int BlockBarrier(BlockOp op, int predicate, const char* file, int line);
int LaneId();
// The block's dynamic shared memory (PARAPLAN_DYNAMIC_SHARED) and its size.
unsigned char* DynamicShared();
size_t DynamicSharedBytes();
// Throws a fault if [p, p + bytes) overlaps the block's dynamic shared memory without lying in it.
void CheckSharedRange(const void* lo, const void* hi_exclusive, const char* what);

// Kernel launches (runtime_api.cpp): queued on the stream like any other operation.
struct KernelLaunch {
  const char* name;
  const void* func;
  dim3 grid;
  dim3 block;
  size_t shared_bytes;
  cudaStream_t stream;
  std::function<void()> body;  // calls the kernel with the parameters copied at launch
};
void EnqueueKernel(KernelLaunch launch);

template <typename... P, typename... A>
void Launch(const char* name, void (*kernel)(P...), dim3 grid, dim3 block, size_t shared_bytes,
            cudaStream_t stream, A&&... args) {
  static_assert(sizeof...(P) == sizeof...(A), "a kernel launch passes one argument per parameter");
  // Kernel parameters are copied at launch, as CUDA copies them into constant memory.
  auto params = std::make_shared<std::tuple<std::decay_t<P>...>>(std::forward<A>(args)...);
  EnqueueKernel(KernelLaunch{name, reinterpret_cast<const void*>(kernel), grid, block, shared_bytes,
                             stream, [kernel, params] { std::apply(kernel, *params); }});
}

// A bounds-checked shared-memory array (what SharedArray<T, N...> is under the emulation).
template <typename T, int N, int... M>
struct SharedArray {
  using Row = SharedArray<T, M...>;
  Row rows[N];
  Row& operator[](int64_t i) {
    if (i < 0 || i >= N) OutOfBounds(i);
    return rows[i];
  }
  [[noreturn]] static void OutOfBounds(int64_t i) {
    RaiseFault("shared array index " + std::to_string(i) + " is out of bounds [0, " +
               std::to_string(N) + ")");
  }
};
template <typename T, int N>
struct SharedArray<T, N> {
  T data[N];
  T& operator[](int64_t i) {
    if (i < 0 || i >= N) SharedArray<T, N, 1>::OutOfBounds(i);
    return data[i];
  }
};

}  // namespace cudaemu

// ---- Barriers, shuffles, votes ---------------------------------------------------------------
inline void __syncthreads(const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  cudaemu::BlockBarrier(cudaemu::BlockOp::kSync, 0, file, line);
}
inline int __syncthreads_or(int p, const char* file = __builtin_FILE(),
                            int line = __builtin_LINE()) {
  return cudaemu::BlockBarrier(cudaemu::BlockOp::kOr, p, file, line);
}
inline int __syncthreads_and(int p, const char* file = __builtin_FILE(),
                             int line = __builtin_LINE()) {
  return cudaemu::BlockBarrier(cudaemu::BlockOp::kAnd, p, file, line);
}
inline int __syncthreads_count(int p, const char* file = __builtin_FILE(),
                               int line = __builtin_LINE()) {
  return cudaemu::BlockBarrier(cudaemu::BlockOp::kCount, p, file, line);
}
inline void __syncwarp(unsigned mask = 0xffffffffu, const char* file = __builtin_FILE(),
                       int line = __builtin_LINE()) {
  cudaemu::WarpCollective(cudaemu::WarpOp::kSync, mask, 0, 0, 32, file, line);
}

namespace cudaemu {
template <typename T>
uint64_t ToBits(T v) {
  static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= 8,
                "shuffled values are at most 8 bytes");
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  return bits;
}
template <typename T>
T FromBits(uint64_t bits) {
  T v;
  std::memcpy(&v, &bits, sizeof(T));
  return v;
}
}  // namespace cudaemu

template <typename T>
T __shfl_sync(unsigned mask, T v, int src, int width = 32, const char* file = __builtin_FILE(),
              int line = __builtin_LINE()) {
  return cudaemu::FromBits<T>(cudaemu::WarpCollective(cudaemu::WarpOp::kShfl, mask,
                                                      cudaemu::ToBits(v), src, width, file, line));
}
template <typename T>
T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32,
                  const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  return cudaemu::FromBits<T>(cudaemu::WarpCollective(
      cudaemu::WarpOp::kShflXor, mask, cudaemu::ToBits(v), lane_mask, width, file, line));
}
template <typename T>
T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32,
                 const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  return cudaemu::FromBits<T>(cudaemu::WarpCollective(cudaemu::WarpOp::kShflUp, mask,
                                                      cudaemu::ToBits(v), static_cast<int>(delta),
                                                      width, file, line));
}
template <typename T>
T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32,
                   const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  return cudaemu::FromBits<T>(cudaemu::WarpCollective(cudaemu::WarpOp::kShflDown, mask,
                                                      cudaemu::ToBits(v), static_cast<int>(delta),
                                                      width, file, line));
}
inline unsigned __ballot_sync(unsigned mask, int p, const char* file = __builtin_FILE(),
                              int line = __builtin_LINE()) {
  return static_cast<unsigned>(
      cudaemu::WarpCollective(cudaemu::WarpOp::kBallot, mask, p != 0, 0, 32, file, line));
}
inline int __all_sync(unsigned mask, int p, const char* file = __builtin_FILE(),
                      int line = __builtin_LINE()) {
  return static_cast<int>(
      cudaemu::WarpCollective(cudaemu::WarpOp::kAll, mask, p != 0, 0, 32, file, line));
}
inline int __any_sync(unsigned mask, int p, const char* file = __builtin_FILE(),
                      int line = __builtin_LINE()) {
  return static_cast<int>(
      cudaemu::WarpCollective(cudaemu::WarpOp::kAny, mask, p != 0, 0, 32, file, line));
}

// ---- Integer and math intrinsics -------------------------------------------------------------
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz(static_cast<unsigned>(x)); }
// The GPU's fast intrinsics are approximations (a few ulp); the emulation computes them exactly
// in fp32, one of the documented differences from hardware.
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline double rsqrt(double x) { return 1.0 / std::sqrt(x); }
inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float __saturatef(float x) { return x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x); }

// ---- Atomics (device memory is host memory; blocks may run on several OS threads) -------------
template <typename T>
T atomicAdd(T* address, T v) {
  if constexpr (std::is_integral_v<T>) {
    return __atomic_fetch_add(address, v, __ATOMIC_RELAXED);
  } else {
    T old;
    __atomic_load(address, &old, __ATOMIC_RELAXED);
    T desired;
    do {
      desired = old + v;
    } while (!__atomic_compare_exchange(address, &old, &desired, false, __ATOMIC_RELAXED,
                                        __ATOMIC_RELAXED));
    return old;
  }
}
template <typename T>
T atomicSub(T* address, T v) {
  return __atomic_fetch_sub(address, v, __ATOMIC_RELAXED);
}
template <typename T>
T atomicExch(T* address, T v) {
  T old;
  __atomic_exchange(address, &v, &old, __ATOMIC_RELAXED);
  return old;
}
template <typename T>
T atomicCAS(T* address, T compare, T v) {
  __atomic_compare_exchange(address, &compare, &v, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
  return compare;
}
template <typename T>
T atomicMax(T* address, T v) {
  T old;
  __atomic_load(address, &old, __ATOMIC_RELAXED);
  while (old < v &&
         !__atomic_compare_exchange(address, &old, &v, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
  }
  return old;
}
template <typename T>
T atomicMin(T* address, T v) {
  T old;
  __atomic_load(address, &old, __ATOMIC_RELAXED);
  while (v < old &&
         !__atomic_compare_exchange(address, &old, &v, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
  }
  return old;
}
inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_block() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

// ---- The host API's kernel-pointer templates (cuda_runtime.h declares them for nvcc) ----------
template <typename T>
cudaError_t cudaFuncSetAttribute(T* entry, cudaFuncAttribute attr, int value) {
  return ::cudaFuncSetAttribute(reinterpret_cast<const void*>(entry), attr, value);
}

// NOLINTEND(readability-identifier-naming, bugprone-reserved-identifier)
#endif  // PARAPLAN_TESTS_CUDA_EMULATION_INCLUDE_CUDAEMU_DEVICE_H_
