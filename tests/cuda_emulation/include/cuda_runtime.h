// The emulated <cuda_runtime.h>: CUDA's host API (the toolkit's own cuda_runtime_api.h, whose
// entry points the emulation defines, see runtime_api.cpp) plus the device built-ins a kernel
// uses, so that the backend's .cu files compile as C++ and run on the CPU.
//
// Only test targets put this folder on their include path (before the toolkit's), with
// PARAPLAN_CUDA_EMULATION defined; planrun and the GPU build never see it.
#ifndef PARAPLAN_TESTS_CUDA_EMULATION_INCLUDE_CUDA_RUNTIME_H_
#define PARAPLAN_TESTS_CUDA_EMULATION_INCLUDE_CUDA_RUNTIME_H_

// These declarations stand in for the CUDA toolkit's and carry its names (threadIdx,
// __syncthreads, __nv_bfloat16, nvcuda::wmma::fragment ...), which the .cu sources use: the
// naming and reserved-identifier checks do not apply to them.
// NOLINTBEGIN(readability-identifier-naming, bugprone-reserved-identifier)

#include <cuda_runtime_api.h>
#include <vector_functions.h>

// The toolkit spells these as attributes the host compiler does not know. Shared variables are
// per OS thread, and a block runs on one OS thread: thread_local statics are the block's.
#undef __global__
#undef __shared__
#define __global__
#define __shared__ static thread_local
#undef __device__
#undef __host__
#undef __forceinline__
#undef __launch_bounds__
#undef __noinline__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __launch_bounds__(...)

#include "cudaemu/device.h"

// NOLINTEND(readability-identifier-naming, bugprone-reserved-identifier)
#endif  // PARAPLAN_TESTS_CUDA_EMULATION_INCLUDE_CUDA_RUNTIME_H_
