// Error checks for CUDA runtime, cuBLAS(Lt) and NCCL calls: a failed call throws CudaError with
// the call, the file and line, and the library's own message, so planrun can report it and
// abort its communicators instead of continuing on a broken device.
//
// Made and read by every file of the CUDA backend (kernels, GEMM, communicators).
#ifndef PARAPLAN_RUNTIME_BACKENDS_CUDA_KERNELS_CUDA_CHECK_H_
#define PARAPLAN_RUNTIME_BACKENDS_CUDA_KERNELS_CUDA_CHECK_H_

#include <cuda_runtime_api.h>

#include <stdexcept>
#include <string>

namespace paraplan::cuda {

class CudaError : public std::runtime_error {
 public:
  explicit CudaError(const std::string& what) : std::runtime_error(what) {}
};

[[noreturn]] void ThrowCudaError(const char* call, const char* file, int line,
                                 const std::string& why);

// The number of CUDA devices this process can see; 0 when there is no driver or no device
// (the call never throws: CPU-only machines build and test the CUDA backend too).
int VisibleDeviceCount();

// A one-line reason why no GPU can be used ("no CUDA driver", "0 devices"), for test skips.
std::string NoDeviceReason();

}  // namespace paraplan::cuda

#define PARAPLAN_CUDA_CHECK(call)                                          \
  do {                                                                     \
    cudaError_t paraplan_err_ = (call);                                    \
    if (paraplan_err_ != cudaSuccess) {                                    \
      ::paraplan::cuda::ThrowCudaError(#call, __FILE__, __LINE__,          \
                                       cudaGetErrorString(paraplan_err_)); \
    }                                                                      \
  } while (0)

// After a kernel launch: a bad configuration shows here, a fault at the next synchronisation.
#define PARAPLAN_CUDA_CHECK_LAUNCH() PARAPLAN_CUDA_CHECK(cudaGetLastError())

#endif  // PARAPLAN_RUNTIME_BACKENDS_CUDA_KERNELS_CUDA_CHECK_H_
