// Internal interface between the emulator (emulator.cpp: blocks as fibers) and the emulated CUDA
// runtime (runtime_api.cpp: streams, memory, launches).
#ifndef PARAPLAN_TESTS_CUDA_EMULATION_EMULATOR_H_
#define PARAPLAN_TESTS_CUDA_EMULATION_EMULATOR_H_

#include <string>

#include "tests/cuda_emulation/include/cudaemu/device.h"

namespace cudaemu {

// Runs every block of the launch; returns "" or the fault that ended it.
std::string RunKernel(const KernelLaunch& launch);

// The most dynamic shared memory one block may use without opting in, and with it (sm_90).
constexpr size_t kDefaultDynamicShared = size_t{48} * 1024;
constexpr size_t kMaxDynamicShared = size_t{227} * 1024;

}  // namespace cudaemu

#endif  // PARAPLAN_TESTS_CUDA_EMULATION_EMULATOR_H_

#include <functional>

namespace cudaemu {
// Queues host work on a stream (cuBLASLt's matmuls), in stream order like a kernel.
void EnqueueWork(cudaStream_t stream, std::function<void()> work);
// True when [p, p + bytes) lies inside one live device allocation.
bool IsDeviceRange(const void* p, size_t bytes);
}  // namespace cudaemu
