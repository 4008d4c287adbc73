// runtime/backends/cuda/kernels/moe.cu compiled as C++ against the emulation's CUDA headers.
#include "runtime/backends/cuda/kernels/moe.cu"
