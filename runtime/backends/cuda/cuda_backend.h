// The CUDA backend of the interpreter (runtime/exec/backend.h): one Backend per rank, each
// with its own CUDA stream, cuBLASLt GEMM engine and the kernels of runtime/backends/cuda/kernels,
// plus the communicator world the ranks share. This header has no CUDA types; the library exists
// only when CUDA was found (target paraplan_cuda_backend; planrun guards its use with
// PARAPLAN_HAVE_CUDA).
//
// Two modes:
//  - local: every rank of the program is a thread of this process on ONE device, with the
//    local CUDA communicator (NCCL refuses two ranks on one GPU);
//  - NCCL: one process per rank (torchrun, srun, mpirun), the device chosen from the launch
//    environment, the world communicator bootstrapped through the TCP rendezvous and the
//    program's groups split from it in the canonical order.
//
// Numerics: tensors are fp32 in device memory (backend.h is fp32); GEMMs and attention run on
// bf16 tensor cores with fp32 accumulation; norms, softmax, losses, optimizer and gradient
// reduction are fp32 (the optimizer keeps fp32 master weights). Results match the host
// backend within bf16 tolerance, not bitwise (see docs/running-on-clusters.md).
//
// Made by planrun (--backend=cuda) and the GPU tests.
#ifndef PARAPLAN_RUNTIME_BACKENDS_CUDA_CUDA_BACKEND_H_
#define PARAPLAN_RUNTIME_BACKENDS_CUDA_CUDA_BACKEND_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/exec/backend.h"
#include "runtime/launch/environment.h"

namespace paraplan::cuda {

// Empty when a CUDA device can be used; otherwise why not ("no CUDA device is visible").
std::string CudaUnavailableReason();
int CudaDeviceCount();

struct CudaRanks {
  std::vector<std::unique_ptr<exec::Backend>> backends;  // one per rank this process runs
  std::unique_ptr<exec::CommWorld> world;
};

// Local mode: `ranks` ranks as threads of this process on `device`.
CudaRanks MakeLocalCudaRanks(int ranks, int device, double timeout_seconds = 600.0);

// One communicator of the program (runtime/format: kind value and member world ranks).
struct CommGroup {
  int kind = 0;
  std::vector<int> members;
};

// NCCL mode: this process is rank env.rank of env.world_size on `device`. Every rank passes
// the same `groups` (the program's communicators) and the same job key (of the program file).
// PARAPLAN_NCCL_TIMEOUT / PARAPLAN_RENDEZVOUS_TIMEOUT come from `lookup`.
CudaRanks MakeNcclRank(const launch::LaunchEnvironment& env, int device, uint64_t job_key,
                       const std::vector<CommGroup>& groups, const launch::EnvLookup& lookup);

}  // namespace paraplan::cuda

#endif  // PARAPLAN_RUNTIME_BACKENDS_CUDA_CUDA_BACKEND_H_
