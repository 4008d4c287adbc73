// runtime/kernels/cuda/norm.cu compiled as C++ against the emulation's CUDA headers.
#include "runtime/kernels/cuda/norm.cu"
