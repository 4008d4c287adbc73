#include "runtime/backends/cuda/comm/local_cuda_communicator.h"

#include <fmt/format.h>

#include <algorithm>
#include <utility>

#include "runtime/backends/cuda/kernels/cuda_check.h"
#include "runtime/backends/cuda/kernels/kernels.h"

namespace paraplan::comm {
namespace {

using OpKind = CollectiveKind;

void Check(cudaError_t err, const char* what) {
  if (err != cudaSuccess)
    throw CommError(
        fmt::format("local CUDA collective: {} failed: {}", what, cudaGetErrorString(err)));
}

// A point-to-point message in flight: a stream-ordered copy of the sent buffer and the event
// that marks it complete on the sender's stream.
struct StagedMessage {
  float* staging = nullptr;
  cudaEvent_t ready = nullptr;
};

// The shared rendezvous plus every member's two events. The group owns them: a member that
// returns from the last collective and destroys its handle must not destroy an event another
// member is about to wait on.
class LocalCudaGroup final : public InProcessGroup {
 public:
  LocalCudaGroup(InProcessWorld* world, std::vector<int> members)
      : InProcessGroup(world, std::move(members)) {
    for (int i = 0; i < 2 * Size(); ++i) {
      cudaEvent_t e = nullptr;
      Check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
      events_.push_back(e);
    }
  }
  ~LocalCudaGroup() override {
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
  }
  LocalCudaGroup(const LocalCudaGroup&) = delete;
  LocalCudaGroup& operator=(const LocalCudaGroup&) = delete;

  // Recorded by member `rank` before it posts (its inputs are ready) and before it finishes
  // (its share of the work is enqueued).
  cudaEvent_t ReadyEvent(int rank) const { return events_[2 * static_cast<size_t>(rank)]; }
  cudaEvent_t DoneEvent(int rank) const { return events_[2 * static_cast<size_t>(rank) + 1]; }

 private:
  std::vector<cudaEvent_t> events_;
};

class LocalCudaCommunicator final : public Communicator {
 public:
  LocalCudaCommunicator(std::shared_ptr<LocalCudaGroup> group, int rank, cudaStream_t stream)
      : group_(std::move(group)),
        rank_(rank),
        stream_(stream),
        ready_(group_->ReadyEvent(rank)),
        done_(group_->DoneEvent(rank)) {}

  int Rank() const override { return rank_; }
  int Size() const override { return group_->Size(); }

  void AllReduce(const void* send, void* recv, int64_t count, DType dtype, ReduceOp op) override {
    Collective({OpKind::kAllReduce, count, dtype, op, 0, send, recv}, [&] {
      auto [begin, end] = Chunk(count);
      std::vector<float*> outs;
      std::vector<const float*> ins;
      for (int r = 0; r < Size(); ++r) {
        outs.push_back(PostedRecv(r));
        ins.push_back(PostedSend(r));
      }
      if (op == ReduceOp::kSum) {
        cuda::SumAcrossRanks(outs.data(), Size(), ins.data(), Size(), begin, end, stream_);
      } else {
        cuda::MaxAcrossRanks(outs.data(), Size(), ins.data(), Size(), begin, end, stream_);
      }
    });
  }

  void ReduceScatter(const void* send, void* recv, int64_t recv_count, DType dtype) override {
    Collective({OpKind::kReduceScatter, recv_count, dtype, ReduceOp::kSum, 0, send, recv}, [&] {
      float* out = static_cast<float*>(recv);
      std::vector<const float*> ins;
      for (int r = 0; r < Size(); ++r) ins.push_back(PostedSend(r) + rank_ * recv_count);
      cuda::SumAcrossRanks(&out, 1, ins.data(), Size(), 0, recv_count, stream_);
    });
  }

  void AllGather(const void* send, void* recv, int64_t send_count, DType dtype) override {
    Collective({OpKind::kAllGather, send_count, dtype, ReduceOp::kSum, 0, send, recv}, [&] {
      for (int r = 0; r < Size(); ++r) {
        Check(cudaMemcpyAsync(PostedRecv(r) + rank_ * send_count, send, send_count * 4,
                              cudaMemcpyDeviceToDevice, stream_),
              "cudaMemcpyAsync");
      }
    });
  }

  void Broadcast(void* buf, int64_t count, DType dtype, int root) override {
    if (root < 0 || root >= Size())
      throw CommError(fmt::format("broadcast root {} is not in the group", root));
    Collective({OpKind::kBroadcast, count, dtype, ReduceOp::kSum, root, buf, buf}, [&] {
      if (rank_ == root) return;
      Check(cudaMemcpyAsync(buf, PostedSend(root), count * 4, cudaMemcpyDeviceToDevice, stream_),
            "cudaMemcpyAsync");
    });
  }

  void AllToAll(const void* send, void* recv, int64_t count, DType dtype) override {
    Collective({OpKind::kAllToAll, count, dtype, ReduceOp::kSum, 0, send, recv}, [&] {
      for (int s = 0; s < Size(); ++s) {
        Check(cudaMemcpyAsync(static_cast<float*>(recv) + s * count, PostedSend(s) + rank_ * count,
                              count * 4, cudaMemcpyDeviceToDevice, stream_),
              "cudaMemcpyAsync");
      }
    });
  }

  void AllToAllV(const void* send, const int64_t* send_counts, void* recv,
                 const int64_t* recv_counts, DType dtype) override {
    for (int p = 0; p < Size(); ++p)
      if (send_counts[p] < 0 || recv_counts[p] < 0) throw CommError("negative element count");
    CollectivePost post{OpKind::kAllToAllV, Size(), dtype, ReduceOp::kSum, 0, send, recv};
    post.send_counts = send_counts;
    post.recv_counts = recv_counts;
    int mismatch = -1;
    int64_t sent = 0;
    Collective(post, [&] {
      int64_t at = 0;
      for (int s = 0; s < Size(); ++s) {
        const CollectivePost& from = group_->PostOf(s);
        int64_t offset = 0;
        for (int p = 0; p < rank_; ++p) offset += from.send_counts[p];
        const int64_t n = from.send_counts[rank_];
        if (n != recv_counts[s]) {
          if (mismatch < 0) mismatch = s, sent = n;
        } else if (n > 0) {
          Check(cudaMemcpyAsync(static_cast<float*>(recv) + at, PostedSend(s) + offset, n * 4,
                                cudaMemcpyDeviceToDevice, stream_),
                "cudaMemcpyAsync");
        }
        at += recv_counts[s];
      }
    });
    if (mismatch >= 0) {
      throw CommError(
          fmt::format("all_to_all_v expects {} elements from group rank {}, which sends {}",
                      recv_counts[mismatch], mismatch, sent));
    }
  }

  void Send(const void* buf, int64_t count, DType dtype, int peer) override {
    CheckArgs(count, dtype);
    CheckPeer(peer);
    auto message = std::make_shared<StagedMessage>();
    Check(cudaMallocAsync(reinterpret_cast<void**>(&message->staging),
                          std::max<int64_t>(count, 1) * 4, stream_),
          "cudaMallocAsync");
    Check(cudaMemcpyAsync(message->staging, buf, count * 4, cudaMemcpyDeviceToDevice, stream_),
          "cudaMemcpyAsync");
    Check(cudaEventCreateWithFlags(&message->ready, cudaEventDisableTiming), "cudaEventCreate");
    Check(cudaEventRecord(message->ready, stream_), "cudaEventRecord");
    group_->Deliver(rank_, peer, Parcel{count, dtype, std::move(message)});
  }

  void Recv(void* buf, int64_t count, DType dtype, int peer) override {
    CheckArgs(count, dtype);
    CheckPeer(peer);
    const Parcel parcel = group_->Collect(peer, rank_, count, dtype);
    const auto& message = *static_cast<const StagedMessage*>(parcel.payload.get());
    Check(cudaStreamWaitEvent(stream_, message.ready, 0), "cudaStreamWaitEvent");
    Check(cudaMemcpyAsync(buf, message.staging, count * 4, cudaMemcpyDeviceToDevice, stream_),
          "cudaMemcpyAsync");
    Check(cudaFreeAsync(message.staging, stream_), "cudaFreeAsync");
    cudaEventDestroy(message.ready);
  }

  void Barrier() override {
    Check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    Collective({OpKind::kBarrier, 0, DType::kF32, ReduceOp::kSum, 0, nullptr, nullptr}, [] {});
  }

  void Abort(const std::string& reason) override { group_->AbortWorld(reason); }

 private:
  // Member r's posted buffers, valid inside a collective's work.
  const float* PostedSend(int r) const { return static_cast<const float*>(group_->PostOf(r).send); }
  float* PostedRecv(int r) const { return static_cast<float*>(group_->PostOf(r).recv); }

  // Phase 1: every member's inputs are ready (its event, waited for on this stream); this
  // member enqueues its share. Phase 2: nobody reuses its buffers until everyone's share is
  // done (everyone's done event, waited for on this stream).
  template <typename Work>
  void Collective(const CollectivePost& post, Work work) {
    CheckArgs(post.count, post.dtype);
    Check(cudaEventRecord(ready_, stream_), "cudaEventRecord");
    group_->Arrive(rank_, post);
    for (int r = 0; r < Size(); ++r) {
      if (r != rank_) {
        Check(cudaStreamWaitEvent(stream_, group_->ReadyEvent(r), 0), "cudaStreamWaitEvent");
      }
    }
    if (post.count > 0) work();
    Check(cudaEventRecord(done_, stream_), "cudaEventRecord");
    group_->Finish(rank_, post.kind);
    for (int r = 0; r < Size(); ++r) {
      if (r != rank_) {
        Check(cudaStreamWaitEvent(stream_, group_->DoneEvent(r), 0), "cudaStreamWaitEvent");
      }
    }
  }

  std::pair<int64_t, int64_t> Chunk(int64_t count) const {
    const int64_t per = (count + Size() - 1) / Size();
    const int64_t begin = std::min<int64_t>(count, per * rank_);
    return {begin, std::min<int64_t>(count, begin + per)};
  }

  void CheckArgs(int64_t count, DType dtype) const {
    if (count < 0) throw CommError("negative element count");
    if (dtype != DType::kF32) {
      throw CommError(
          "the local CUDA communicator moves fp32 tensors only (the CUDA backend keeps "
          "its tensors in fp32)");
    }
  }
  void CheckPeer(int peer) const {
    if (peer < 0 || peer >= Size() || peer == rank_) {
      throw CommError(fmt::format("peer {} is not another member of a group of {}", peer, Size()));
    }
  }

  std::shared_ptr<LocalCudaGroup> group_;
  int rank_;
  cudaStream_t stream_;
  cudaEvent_t ready_ = nullptr;
  cudaEvent_t done_ = nullptr;
};

}  // namespace

int LocalCudaWorld::RankCount(const std::vector<cudaStream_t>& streams) {
  if (streams.empty() || static_cast<int>(streams.size()) > cuda::kMaxLocalRanks) {
    throw CommError(fmt::format("the local CUDA mode runs 1 to {} ranks, not {}",
                                cuda::kMaxLocalRanks, streams.size()));
  }
  return static_cast<int>(streams.size());
}

LocalCudaWorld::LocalCudaWorld(std::vector<cudaStream_t> streams, double timeout_seconds)
    : streams_(std::move(streams)),
      world_(RankCount(streams_), timeout_seconds, "local CUDA world") {}

LocalCudaWorld::~LocalCudaWorld() = default;

std::unique_ptr<Communicator> LocalCudaWorld::Join(const std::vector<int>& members, int world_rank,
                                                   int tag) {
  auto [group, index] =
      world_.Join(members, world_rank, tag, [&]() -> std::shared_ptr<InProcessGroup> {
        return std::make_shared<LocalCudaGroup>(&world_, members);
      });
  return std::make_unique<LocalCudaCommunicator>(std::static_pointer_cast<LocalCudaGroup>(group),
                                                 index, streams_[world_rank]);
}

}  // namespace paraplan::comm
