// runtime/kernels/cuda/attention.cu compiled as C++ against the emulation's CUDA headers.
#include "runtime/kernels/cuda/attention.cu"
