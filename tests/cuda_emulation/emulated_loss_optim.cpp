// runtime/backends/cuda/kernels/loss_optim.cu compiled as C++ against the emulation's CUDA headers.
#include "runtime/backends/cuda/kernels/loss_optim.cu"
