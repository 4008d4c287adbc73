// The one way the backend's kernels are launched and declare shared memory, so that the same
// lines compile under nvcc and under the CPU emulation of the tests (tests/cuda_emulation, which
// defines PARAPLAN_CUDA_EMULATION and supplies its own <cuda_runtime.h>):
//
//   PARAPLAN_LAUNCH(Kernel, grid, block, shared_bytes, stream, args...)
//       nvcc: Kernel<<<grid, block, shared_bytes, stream>>>(args...), nothing more;
//       emulation: queues the kernel on the emulated stream (blocks of fibers on the CPU).
//   __shared__ SharedArray<T, N, M...> name;
//       nvcc: the plain array T name[N][M]...; emulation: the same, with bounds checks.
//   PARAPLAN_DYNAMIC_SHARED(name);
//       the block's dynamic shared memory as `unsigned char* name`, 128-byte aligned.
//
// Kernel templates are named with their arguments (Kernel<F>), as a function pointer needs.
// Included only by .cu files (through common.cuh).
#ifndef PARAPLAN_RUNTIME_BACKENDS_CUDA_KERNELS_LAUNCH_CUH_
#define PARAPLAN_RUNTIME_BACKENDS_CUDA_KERNELS_LAUNCH_CUH_

#include <cuda_runtime.h>

namespace paraplan::cuda {

#ifdef PARAPLAN_CUDA_EMULATION

#define PARAPLAN_LAUNCH(kernel, grid, block, shared_bytes, stream, ...) \
  ::cudaemu::Launch(#kernel, kernel, grid, block, shared_bytes, stream, __VA_ARGS__)
#define PARAPLAN_DYNAMIC_SHARED(name) unsigned char* const name = ::cudaemu::DynamicShared()
template <typename T, int... N>
using SharedArray = ::cudaemu::SharedArray<T, N...>;

#else

#define PARAPLAN_LAUNCH(kernel, grid, block, shared_bytes, stream, ...) \
  kernel<<<grid, block, shared_bytes, stream>>>(__VA_ARGS__)
#define PARAPLAN_DYNAMIC_SHARED(name) extern __shared__ __align__(128) unsigned char name[]
template <typename T, int... N>
struct SharedArrayOf;
template <typename T>
struct SharedArrayOf<T> {
  using type = T;
};
template <typename T, int N, int... M>
struct SharedArrayOf<T, N, M...> {
  using type = typename SharedArrayOf<T, M...>::type[N];
};
template <typename T, int... N>
using SharedArray = typename SharedArrayOf<T, N...>::type;

#endif

}  // namespace paraplan::cuda

#endif  // PARAPLAN_RUNTIME_BACKENDS_CUDA_KERNELS_LAUNCH_CUH_
