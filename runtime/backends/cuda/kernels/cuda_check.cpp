#include "runtime/backends/cuda/kernels/cuda_check.h"

#include <string>

namespace paraplan::cuda {

void ThrowCudaError(const char* call, const char* file, int line, const std::string& why) {
  throw CudaError(std::string("CUDA call `") + call + "` failed at " + file + ":" +
                  std::to_string(line) + ": " + why);
}

int VisibleDeviceCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free error so later calls start clean
    return 0;
  }
  return count;
}

std::string NoDeviceReason() {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return std::string("no usable CUDA device: ") + cudaGetErrorString(err);
  }
  if (count == 0) return "no CUDA device is visible";
  return "";
}

}  // namespace paraplan::cuda
