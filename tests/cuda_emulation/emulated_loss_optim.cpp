// runtime/kernels/cuda/loss_optim.cu compiled as C++ against the emulation's CUDA headers.
#include "runtime/kernels/cuda/loss_optim.cu"
