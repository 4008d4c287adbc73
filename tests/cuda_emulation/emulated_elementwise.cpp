// runtime/kernels/cuda/elementwise.cu compiled as C++ against the emulation's CUDA headers.
#include "runtime/kernels/cuda/elementwise.cu"
