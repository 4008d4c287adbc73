// HostWorld: ranks as threads of one process, with in-process collectives.
//
// A HostWorld of N ranks is shared by N threads (one per rank). Each thread joins the groups it
// belongs to with Join(members, world_rank); all members of a group must pass the same member
// list (world ranks, distinct; their order defines the group ranks) and get handles on one
// shared group state. Collectives rendezvous on that state (runtime/comm/in_process.h): each
// member posts its buffers, the last to arrive checks that every member asked for the same
// operation, and every member then computes its share of the result reading the others'
// buffers directly (no staging copy except the in-place all-reduce scratch). Reductions add
// contributions in group order, so results are bitwise reproducible and independent of thread
// timing.
//
// Abort(reason) (from any communicator or the world) wakes every waiter of every group, which
// then throws CommError; so does a wait longer than the world's timeout. Invariants: a group's
// members are valid world ranks, distinct; a handle is used by one thread at a time.
//
// Made by: planrun's host backend and tests. Read by: the interpreter through Communicator.
#ifndef PARAPLAN_RUNTIME_BACKENDS_HOST_COMM_HOST_COMMUNICATOR_H_
#define PARAPLAN_RUNTIME_BACKENDS_HOST_COMM_HOST_COMMUNICATOR_H_

#include <memory>
#include <string>
#include <vector>

#include "runtime/comm/communicator.h"
#include "runtime/comm/in_process.h"

namespace paraplan::comm {

struct HostWorldOptions {
  // A rank that waits longer than this in one call gives up and aborts the world.
  double timeout_seconds = 600.0;
};

class HostWorld {
 public:
  explicit HostWorld(int size, HostWorldOptions options = {});
  ~HostWorld();
  HostWorld(const HostWorld&) = delete;
  HostWorld& operator=(const HostWorld&) = delete;

  int Size() const { return world_.Size(); }

  // The handle of `world_rank` on the group of `members`. Thread-safe. Throws CommError if the
  // member list is empty, has duplicates or out-of-range ranks, or does not contain world_rank.
  // Groups with the same members but different `tag`s are independent (two communicator kinds
  // that happen to cover the same ranks never share a rendezvous).
  std::unique_ptr<Communicator> Join(const std::vector<int>& members, int world_rank, int tag = 0);

  void Abort(const std::string& reason) { world_.Abort(reason); }
  bool Aborted() const { return world_.Aborted(); }
  std::string AbortReason() const { return world_.AbortReason(); }

 private:
  InProcessWorld world_;
};

}  // namespace paraplan::comm

#endif  // PARAPLAN_RUNTIME_BACKENDS_HOST_COMM_HOST_COMMUNICATOR_H_
