// LocalCudaWorld: several ranks of one program on ONE GPU, as threads of one process, each with
// its own CUDA stream, and collectives done by kernels that read the other ranks' device
// buffers directly. NCCL refuses two ranks on one device ("Duplicate GPU detected"), so this is
// how a multi-rank program (the equivalence plans) runs on a single GPU.
//
// A collective is two host rendezvous around stream-ordered device work, so the host never
// waits for the GPU: (1) every member records an event on its stream and posts its buffers;
// once all have arrived, each member makes its stream wait for everyone's event and launches
// its share of the result (member r reduces element chunk r, adding the members' values in
// group order 0..n-1 in fp32, so results are deterministic and equal to the host backend's
// order); (2) every member records a completion event and waits for everyone's on its stream,
// so no member reuses a buffer another one still reads. Point-to-point sends copy into a
// stream-ordered staging buffer, so Send never blocks (as the host implementation).
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

#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/comm/communicator.h"

namespace paraplan::comm {

class LocalCudaGroup;

class LocalCudaWorld {
 public:
  // `streams[r]` is world rank r's stream; all on the current device.
  LocalCudaWorld(std::vector<cudaStream_t> streams, double timeout_seconds = 600.0);
  ~LocalCudaWorld();
  LocalCudaWorld(const LocalCudaWorld&) = delete;
  LocalCudaWorld& operator=(const LocalCudaWorld&) = delete;

  int Size() const { return static_cast<int>(streams_.size()); }
  // Thread-safe; members are distinct world ranks; their order gives the group ranks. Groups
  // with the same members but different tags (the program's communicator index) are distinct.
  std::unique_ptr<Communicator> Join(const std::vector<int>& members, int world_rank, int tag = 0);
  void Abort(const std::string& reason);
  bool Aborted() const { return aborted_.load(); }
  std::string AbortReason() const;

 private:
  friend class LocalCudaGroup;
  friend class LocalCudaCommunicator;
  std::vector<cudaStream_t> streams_;
  double timeout_seconds_;
  std::atomic<bool> aborted_{false};
  mutable std::mutex mutex_;
  std::condition_variable abort_cv_;
  std::string abort_reason_;
  std::map<std::pair<int, std::vector<int>>, std::shared_ptr<LocalCudaGroup>> groups_;
};

}  // namespace paraplan::comm

#endif  // PARAPLAN_RUNTIME_BACKENDS_CUDA_COMM_LOCAL_CUDA_COMMUNICATOR_H_
