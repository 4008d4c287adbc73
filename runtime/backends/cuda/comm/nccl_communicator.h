// NcclWorld: one process = one rank = one GPU; the world communicator and every group of the
// program as NCCL communicators, and a watchdog that turns a hang into an error.
//
// Bring-up (Create): cudaSetDevice has happened (the caller chose the device from the launch
// environment); rank 0 makes the ncclUniqueId and hands it to every rank over the TCP
// rendezvous (runtime/launch/rendezvous.h), which also checks that all ranks agree on the
// world size and the program; then ncclCommInitRankConfig. CreateGroups splits the world once
// per communicator kind, kinds in increasing value, with color = the index of this rank's
// group of that kind (NCCL_SPLIT_NOCOLOR when it has none, or when its group has one member)
// and key = its index in the group: the canonical order of runtime/format/README.md, the same
// on every rank, before any traffic. Groups of one member get a communicator that only copies.
//
// Watchdog: every collective or group of point-to-point calls records a CUDA event after it on
// the rank's stream; a thread polls those events and every communicator's asynchronous error
// (ncclCommGetAsyncError). When an operation has not completed within the timeout
// (PARAPLAN_NCCL_TIMEOUT seconds, default 600), or NCCL reports an error (a peer died, a network
// failure), it calls ncclCommAbort on every communicator of the world, so the kernels return
// instead of spinning forever, and records a message that names the operation, its group and
// how long it waited. Every later call, and CheckHealthy(), then throws CommError with it.
//
// Contract: comm::Communicator. Sums of fp32 gradients are NCCL fp32 sums (NCCL picks the
// algorithm, so bits may differ from the host backend's order; see docs). All NCCL calls of
// one world are made by the one thread that drives the rank's stream.
//
// Made by the CUDA backend's multi-process mode (MakeNcclRank); read by the interpreter.
#ifndef PARAPLAN_RUNTIME_BACKENDS_CUDA_COMM_NCCL_COMMUNICATOR_H_
#define PARAPLAN_RUNTIME_BACKENDS_CUDA_COMM_NCCL_COMMUNICATOR_H_

#include <cuda_runtime_api.h>

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "runtime/comm/communicator.h"
#include "runtime/launch/environment.h"

namespace paraplan::comm {

struct NcclGroupSpec {
  int kind = 0;              // the program's CommKind value; splits go in increasing kind
  std::vector<int> members;  // world ranks; index = rank in the group
};

struct NcclWorldOptions {
  double timeout_seconds = 600.0;  // watchdog: longest wait for one operation
  double rendezvous_timeout_seconds = 300.0;
};

// Reads PARAPLAN_NCCL_TIMEOUT and PARAPLAN_RENDEZVOUS_TIMEOUT (seconds); throws CommError on a
// malformed value.
NcclWorldOptions NcclWorldOptionsFromEnvironment(const launch::EnvLookup& env);

class NcclCommunicator;
struct NcclWatch;

class NcclWorld {
 public:
  static std::unique_ptr<NcclWorld> Create(const launch::LaunchEnvironment& env,
                                           cudaStream_t stream, uint64_t job_key,
                                           const NcclWorldOptions& options);
  ~NcclWorld();
  NcclWorld(const NcclWorld&) = delete;
  NcclWorld& operator=(const NcclWorld&) = delete;

  int Size() const { return world_size_; }
  int Rank() const { return rank_; }

  // Collective over all ranks: every rank passes the same list (the program's communicators,
  // in program order: a group's index in the list is its tag).
  void CreateGroups(const std::vector<NcclGroupSpec>& groups);
  // This rank's handle on the group of `members`: the communicator CreateGroups made for tag
  // `tag`; a group of every rank (any tag, including the runtime's own -1) uses the world
  // communicator, a group of one member needs none.
  std::unique_ptr<Communicator> Join(const std::vector<int>& members, int world_rank, int tag);

  void Abort(const std::string& reason);
  bool Aborted() const { return aborted_.load(); }
  std::string AbortReason() const;
  // Throws CommError when the watchdog or a peer aborted the world.
  void CheckHealthy() const;

 private:
  friend class NcclCommunicator;
  NcclWorld(int rank, int world_size, cudaStream_t stream, NcclWorldOptions options);
  void Watch(const std::string& what);  // records an event after the last enqueued operation
  void WatchdogLoop();

  int rank_;
  int world_size_;
  cudaStream_t stream_;
  NcclWorldOptions options_;
  void* world_comm_ = nullptr;        // ncclComm_t
  std::map<int, void*> group_comms_;  // by tag: ncclComm_t, nullptr for one-member groups
  std::map<int, std::vector<int>> group_members_;  // by tag
  std::atomic<bool> aborted_{false};
  mutable std::mutex mutex_;  // guards watches_, abort_reason_, the comm list for aborting
  std::string abort_reason_;
  std::vector<std::unique_ptr<NcclWatch>> watches_;
  std::vector<cudaEvent_t> spare_events_;
  std::atomic<bool> stop_{false};
  std::thread watchdog_;
};

}  // namespace paraplan::comm

#endif  // PARAPLAN_RUNTIME_BACKENDS_CUDA_COMM_NCCL_COMMUNICATOR_H_
