// LocalCudaWorld: several ranks of one program on ONE GPU, as threads of one process, each with
// its own CUDA stream, and collectives done by kernels that read the other ranks' device
// buffers directly. NCCL refuses two ranks on one device ("Duplicate GPU detected"), so this is
// how a multi-rank program (the equivalence plans) runs on a single GPU.
//
// A collective is two host rendezvous (runtime/comm/in_process.h, shared with the host
// backend's HostWorld) around stream-ordered device work, so the host never waits for the GPU: (1)
// every member records an event on its stream and posts its buffers; once all have arrived, each
// member makes its stream wait for everyone's event and launches its share of the result (member r
// reduces element chunk r, adding the members' values in group order 0..n-1 in fp32, so results are
// deterministic and equal to the host backend's order); (2) every member records a completion event
// and waits for everyone's on its stream, so no member reuses a buffer another one still reads.
// Point-to-point sends copy into a stream-ordered staging buffer, so Send never blocks (as the host
// implementation).
//
// Contract: that of comm::Communicator for fp32 buffers (bf16 is refused: the CUDA backend's
// tensors are fp32). Every member must issue the same operation with the same count; a
// mismatch, an Abort() anywhere in the world, or a wait longer than the timeout throws
// CommError on every member. A handle is used by one thread, the one that drives its stream.
//
// Made by MakeLocalCudaRanks (the CUDA backend's local mode) and the GPU tests.
#ifndef PARAPLAN_RUNTIME_BACKENDS_CUDA_COMM_LOCAL_CUDA_COMMUNICATOR_H_
#define PARAPLAN_RUNTIME_BACKENDS_CUDA_COMM_LOCAL_CUDA_COMMUNICATOR_H_

#include <cuda_runtime_api.h>

#include <memory>
#include <string>
#include <vector>

#include "runtime/comm/communicator.h"
#include "runtime/comm/in_process.h"

namespace paraplan::comm {

class LocalCudaWorld {
 public:
  // `streams[r]` is world rank r's stream; all on the current device.
  explicit LocalCudaWorld(std::vector<cudaStream_t> streams, double timeout_seconds = 600.0);
  ~LocalCudaWorld();
  LocalCudaWorld(const LocalCudaWorld&) = delete;
  LocalCudaWorld& operator=(const LocalCudaWorld&) = delete;

  int Size() const { return world_.Size(); }
  // Thread-safe; members are distinct world ranks; their order gives the group ranks. Groups
  // with the same members but different tags (the program's communicator index) are distinct.
  std::unique_ptr<Communicator> Join(const std::vector<int>& members, int world_rank, int tag = 0);
  void Abort(const std::string& reason) { world_.Abort(reason); }
  bool Aborted() const { return world_.Aborted(); }
  std::string AbortReason() const { return world_.AbortReason(); }

 private:
  // The number of ranks; throws CommError unless it is 1 to cuda::kMaxLocalRanks.
  static int RankCount(const std::vector<cudaStream_t>& streams);

  std::vector<cudaStream_t> streams_;
  InProcessWorld world_;
};

}  // namespace paraplan::comm

#endif  // PARAPLAN_RUNTIME_BACKENDS_CUDA_COMM_LOCAL_CUDA_COMMUNICATOR_H_
