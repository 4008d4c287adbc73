// The rendezvous shared by the communicators whose ranks are threads of one process: the host
// backend's HostWorld (collectives on host memory) and the CUDA backend's LocalCudaWorld
// (several ranks on one GPU, collectives as kernels on each rank's stream). They differ only in
// how the data moves; group membership, matching the members' calls, point-to-point mailboxes,
// timeouts and aborts are this file's.
//
// InProcessWorld: the world's size, its timeout and its abort state, and the groups (one per
// member list and tag, shared by every member that joins it). InProcessGroup: one group's
// rendezvous. A collective is
//   Arrive(me, post)  every member posts its call and buffers and waits for all; the last to
//                     arrive checks that everyone asked for the same operation (kind, count,
//                     dtype, reduce op, root), else every member fails with the difference;
//   ... every member reads the others' posts (PostOf) and does its share ...
//   Depart(me)        a second rendezvous: nobody leaves while a peer may still read its
//                     buffers. It never gives up, not even after an abort, so the work between
//                     Arrive and Depart must not wait or throw (host copies and sums);
//   or Finish(me)     the same rendezvous for work that may fail (CUDA calls between the two):
//                     it gives up on an abort or a timeout like Arrive.
// Point-to-point: Deliver(from, to, parcel) never blocks; Collect(from, to, count, dtype)
// waits for the oldest parcel from `from` and checks that it carries what the receiver expects.
//
// Timeouts count the time this process ran, not the time it was stopped (SIGSTOP, a suspended
// job, a paused machine): waits are slices of at most 100 ms, each counted for no more than
// its length. A wait that exceeds the world's timeout aborts the world. After an abort every
// blocked or later call throws CommError, except Depart (above).
//
// Invariants: members are distinct world ranks; a member index (`me`, `from`, `to`) is a group
// rank; a handle (a member) is used by one thread at a time. Made by: HostWorld and
// LocalCudaWorld. Read by: their communicators.
#ifndef PARAPLAN_RUNTIME_COMM_IN_PROCESS_H_
#define PARAPLAN_RUNTIME_COMM_IN_PROCESS_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "runtime/comm/communicator.h"

namespace paraplan::comm {

// One member's call as posted to the rendezvous.
struct CollectivePost {
  CollectiveKind kind = CollectiveKind::kBarrier;
  int64_t count = 0;
  DType dtype = DType::kF32;
  ReduceOp op = ReduceOp::kSum;  // compared for all-reduce only
  int root = 0;                  // compared for broadcast only
  const void* send = nullptr;
  void* recv = nullptr;
  // all_to_all_v: the member's per-peer counts (host arrays of the group's size).
  const int64_t* send_counts = nullptr;
  const int64_t* recv_counts = nullptr;
};

// "all_reduce(count 4, f32, sum)", "broadcast(count 2, bf16, root 1)".
std::string DescribePost(const CollectivePost& post);
// "[0,2,4]".
std::string MembersText(const std::vector<int>& members);

// A point-to-point message: what it carries (checked against the receive) and the payload the
// communicator put there (host bytes, or a device staging buffer and its event).
struct Parcel {
  int64_t count = 0;
  DType dtype = DType::kF32;
  std::shared_ptr<void> payload;
};

class InProcessWorld;

class InProcessGroup {
 public:
  InProcessGroup(InProcessWorld* world, std::vector<int> members);
  virtual ~InProcessGroup() = default;
  InProcessGroup(const InProcessGroup&) = delete;
  InProcessGroup& operator=(const InProcessGroup&) = delete;

  int Size() const { return static_cast<int>(members_.size()); }
  const std::vector<int>& Members() const { return members_; }

  void Arrive(int me, const CollectivePost& post);
  // Valid between Arrive and Depart/Finish of the same collective.
  const CollectivePost& PostOf(int member) const { return posts_[member]; }
  void Depart(int me);
  void Finish(int me, CollectiveKind kind);

  void Deliver(int from, int to, Parcel parcel);
  Parcel Collect(int from, int to, int64_t count, DType dtype);

  // Aborts the world with `reason` (the first reason given stays).
  void AbortWorld(const std::string& reason);
  // Aborts the world with `reason` and throws it as CommError.
  [[noreturn]] void Fail(const std::string& reason);
  // Wakes every waiter (after an abort).
  void Wake();

 protected:
  // Called once per collective, by the last member to arrive, with the group's lock held and
  // after the posts were found to match: the place to size what the members then share.
  virtual void AllArrived(const CollectivePost& post) {}

 private:
  template <typename Pred>
  void Wait(std::unique_lock<std::mutex>& lock, Pred pred, int me, const std::string& what);
  void Rendezvous(int me, std::unique_lock<std::mutex>& lock, bool validate,
                  const std::string& what);
  std::deque<Parcel>& Mailbox(int from, int to) { return mailboxes_[from * Size() + to]; }

  InProcessWorld* world_;
  std::vector<int> members_;
  std::mutex mutex_;
  std::condition_variable cv_;
  int arrived_ = 0, departed_ = 0;
  uint64_t generation_ = 0, depart_generation_ = 0;
  std::vector<CollectivePost> posts_;
  std::vector<std::deque<Parcel>> mailboxes_;  // [from * Size() + to]
};

class InProcessWorld {
 public:
  // `name` opens error messages ("host world", "local CUDA world").
  InProcessWorld(int size, double timeout_seconds, std::string name);
  InProcessWorld(const InProcessWorld&) = delete;
  InProcessWorld& operator=(const InProcessWorld&) = delete;

  int Size() const { return size_; }
  double TimeoutSeconds() const { return timeout_seconds_; }

  // The group of `members` under `tag` (made by `make` on the first join) and world_rank's
  // group rank in it. Thread-safe. Throws CommError if the member list is empty, has
  // duplicates or out-of-range ranks, or does not contain world_rank.
  std::pair<std::shared_ptr<InProcessGroup>, int> Join(
      const std::vector<int>& members, int world_rank, int tag,
      const std::function<std::shared_ptr<InProcessGroup>()>& make);

  void Abort(const std::string& reason);
  bool Aborted() const { return aborted_.load(); }
  std::string AbortReason() const;
  // Throws CommError("aborted: <reason>") once the world is aborted.
  void ThrowIfAborted() const;

 private:
  int size_;
  double timeout_seconds_;
  std::string name_;
  std::atomic<bool> aborted_{false};
  mutable std::mutex mutex_;  // guards groups_ and abort_reason_
  std::string abort_reason_;
  std::map<std::pair<int, std::vector<int>>, std::shared_ptr<InProcessGroup>> groups_;
};

}  // namespace paraplan::comm

#endif  // PARAPLAN_RUNTIME_COMM_IN_PROCESS_H_
