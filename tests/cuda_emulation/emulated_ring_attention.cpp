// runtime/backends/cuda/kernels/ring_attention.cu compiled as C++ against the emulation's CUDA
// headers.
#include "runtime/backends/cuda/kernels/ring_attention.cu"
