// Communicator: the collective and point-to-point interface every runtime backend uses.
//
// One Communicator is one rank's handle on one group of ranks (a TP group, a DP group, the world
// ...). `Rank()` is this rank's index inside the group (0 .. Size()-1), not its world rank; peers
// in Send/Recv and roots in Broadcast are group indices too. Buffers are raw pointers to memory
// of the backend that made the communicator (host memory for the host implementation, device
// memory for NCCL); counts are element counts, never bytes.
//
// Contract for every implementation:
//  - Every member of a group calls the same collectives in the same order with the same count,
//    dtype and op. The host implementation checks this and fails clearly on a mismatch.
//  - Sums are deterministic: the result does not depend on thread or network timing. The host
//    implementation adds the ranks' contributions in group order 0, 1, ..., Size()-1, element by
//    element, in fp32 (bf16 inputs are widened, summed in fp32, rounded to nearest even).
//  - `send` and `recv` may alias for AllReduce (in place); for ReduceScatter, AllGather,
//    AllToAll and AllToAllV they must not overlap.
//  - AllToAllV's counts differ per peer and are known only at run time: members agree on the
//    call and the dtype, and each pair agrees on what passes between them (rank s's
//    send_counts[r] equals rank r's recv_counts[s]; the host implementation checks it).
//  - Send never blocks on the receiver in the host implementation (messages are buffered); a NCCL
//    implementation pairs sends and receives between GroupBegin()/GroupEnd(), which the
//    interpreter always emits around a step's point-to-point operations, so both behave the same.
//  - Errors (a mismatch, an aborted peer, a timeout) are thrown as CommError. After Abort() on any
//    communicator of a world, every blocked or later call on that world throws: a failing rank
//    never leaves the others hanging.
//
// Made by: a backend's world object (HostWorld in host_communicator.h; the NCCL world in the CUDA
// backend). Read by: the interpreter (runtime/exec), kernels that need a group (vocab-parallel
// cross-entropy), tests.
#ifndef PARAPLAN_RUNTIME_COMM_COMMUNICATOR_H_
#define PARAPLAN_RUNTIME_COMM_COMMUNICATOR_H_

#include <cstdint>
#include <stdexcept>
#include <string>

namespace paraplan::comm {

enum class DType : uint8_t { kF32 = 0, kBF16 = 1 };
enum class ReduceOp : uint8_t { kSum = 0, kMax = 1 };

// The collective an in-process group is in, for matching members' calls and naming them in
// errors (host and local-CUDA communicators).
enum class CollectiveKind : uint8_t {
  kAllReduce,
  kReduceScatter,
  kAllGather,
  kBroadcast,
  kAllToAll,
  kBarrier,
  kAllToAllV
};
const char* CollectiveKindName(CollectiveKind kind);  // "all_reduce", ...

// Bytes per element of `dtype`.
int64_t DTypeBytes(DType dtype);
const char* DTypeName(DType dtype);
const char* ReduceOpName(ReduceOp op);

// A failed collective: a mismatch between members, an aborted world, a timeout, bad arguments.
class CommError : public std::runtime_error {
 public:
  explicit CommError(const std::string& what) : std::runtime_error(what) {}
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int Rank() const = 0;
  virtual int Size() const = 0;

  // recv[i] = op over ranks r of send_r[i], for i < count. send may equal recv.
  virtual void AllReduce(const void* send, void* recv, int64_t count, DType dtype,
                         ReduceOp op = ReduceOp::kSum) = 0;
  // send holds Size() * recv_count elements; rank r receives the sum of chunk r of everyone's
  // send, i.e. recv[i] = sum over ranks s of send_s[r * recv_count + i].
  virtual void ReduceScatter(const void* send, void* recv, int64_t recv_count, DType dtype) = 0;
  // recv holds Size() * send_count elements: recv[r * send_count + i] = send_r[i].
  virtual void AllGather(const void* send, void* recv, int64_t send_count, DType dtype) = 0;
  // Every rank's buf becomes root's buf.
  virtual void Broadcast(void* buf, int64_t count, DType dtype, int root) = 0;
  // Point to point, matched in order per (sender, receiver) pair.
  virtual void Send(const void* buf, int64_t count, DType dtype, int peer) = 0;
  virtual void Recv(void* buf, int64_t count, DType dtype, int peer) = 0;
  // send and recv hold Size() * count elements: recv[s * count + i] = send_s[Rank() * count + i].
  virtual void AllToAll(const void* send, void* recv, int64_t count, DType dtype) = 0;
  // Variable counts (expert-parallel token dispatch). send_counts and recv_counts are host
  // arrays of Size() entries. send holds the pieces for peers 0, 1, ..., Size()-1 back to back
  // (send_counts[p] elements for peer p); recv receives the pieces from peers 0, 1, ... back to
  // back (recv_counts[s] elements from peer s, which must equal peer s's send_counts[Rank()]).
  // The piece for Rank() itself is copied.
  virtual void AllToAllV(const void* send, const int64_t* send_counts, void* recv,
                         const int64_t* recv_counts, DType dtype) = 0;
  virtual void Barrier() = 0;

  // Brackets a set of point-to-point calls that must progress together (NCCL group semantics).
  // The host implementation needs neither.
  virtual void GroupBegin() {}
  virtual void GroupEnd() {}

  // Marks the whole world as failed with `reason`; every member of every group wakes and throws.
  virtual void Abort(const std::string& reason) = 0;
};

}  // namespace paraplan::comm

#endif  // PARAPLAN_RUNTIME_COMM_COMMUNICATOR_H_
