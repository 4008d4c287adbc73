#include "runtime/backends/cuda/comm/local_cuda_communicator.h"

#include <fmt/format.h>

#include <chrono>
#include <set>
#include <utility>

#include "runtime/backends/cuda/kernels/cuda_check.h"
#include "runtime/backends/cuda/kernels/kernels.h"

namespace paraplan::comm {
namespace {

using OpKind = CollectiveKind;

struct Post {
  OpKind op = OpKind::kBarrier;
  int64_t count = 0;
  DType dtype = DType::kF32;
  int root = 0;
  ReduceOp reduce = ReduceOp::kSum;
  const float* send = nullptr;
  float* recv = nullptr;
  cudaEvent_t event = nullptr;
};

struct Message {
  float* staging;
  int64_t count;
  DType dtype;
  cudaEvent_t ready;
};

void Check(cudaError_t err, const char* what) {
  if (err != cudaSuccess)
    throw CommError(
        fmt::format("local CUDA collective: {} failed: {}", what, cudaGetErrorString(err)));
}

std::string Members(const std::vector<int>& members) {
  std::string s = "[";
  for (size_t i = 0; i < members.size(); ++i) s += (i ? "," : "") + std::to_string(members[i]);
  return s + "]";
}

}  // namespace

class LocalCudaGroup {
 public:
  LocalCudaGroup(LocalCudaWorld* world, std::vector<int> members)
      : world_(world), members_(std::move(members)), posts_(members_.size()) {
    // The group owns every member's events: a member that returns from the last collective and
    // destroys its handle must not destroy an event another member is about to wait on.
    for (size_t i = 0; i < 2 * members_.size(); ++i) {
      cudaEvent_t e = nullptr;
      Check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
      events_.push_back(e);
    }
  }
  ~LocalCudaGroup() {
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
  }
  cudaEvent_t ReadyEvent(int rank) const { return events_[2 * rank]; }
  cudaEvent_t DoneEvent(int rank) const { return events_[2 * rank + 1]; }

  // Posts `post` for group rank `me`, waits for every member, returns everyone's posts.
  std::vector<Post> Rendezvous(int me, const Post& post) {
    std::unique_lock<std::mutex> lock(mutex_);
    const int64_t gen = generation_;
    posts_[me] = post;
    if (++arrived_ == static_cast<int>(members_.size())) {
      arrived_ = 0;
      snapshot_ = posts_;
      mismatch_.clear();
      for (size_t r = 1; r < snapshot_.size(); ++r) {
        const Post& a = snapshot_[0];
        const Post& b = snapshot_[r];
        if (a.op != b.op || a.count != b.count || a.dtype != b.dtype || a.root != b.root ||
            a.reduce != b.reduce) {
          mismatch_ = fmt::format(
              "members of group {} disagree: group rank 0 called {} of {} elements, group rank {} "
              "called {} of {} elements",
              Members(members_), CollectiveKindName(a.op), a.count, r, CollectiveKindName(b.op),
              b.count);
          break;
        }
      }
      ++generation_;
      cv_.notify_all();
    } else {
      const auto deadline = std::chrono::steady_clock::now() +
                            std::chrono::duration<double>(world_->timeout_seconds_);
      while (generation_ == gen && !world_->Aborted()) {
        if (cv_.wait_until(lock, deadline) == std::cv_status::timeout && generation_ == gen) {
          lock.unlock();
          const std::string why = fmt::format(
              "world rank {} waited {:.0f} s in {} on group {} and not every member arrived; a "
              "rank stalled or failed",
              members_[me], world_->timeout_seconds_, CollectiveKindName(post.op),
              Members(members_));
          world_->Abort(why);
          throw CommError(why);
        }
      }
    }
    if (world_->Aborted() && generation_ == gen) {
      throw CommError("the local CUDA world was aborted: " + world_->AbortReason());
    }
    if (!mismatch_.empty()) {
      const std::string why = mismatch_;
      lock.unlock();
      world_->Abort(why);
      throw CommError(why);
    }
    return snapshot_;
  }

  void Deliver(int from, int to, Message message) {
    std::lock_guard<std::mutex> lock(mutex_);
    mailboxes_[{from, to}].push_back(message);
    cv_.notify_all();
  }

  Message Collect(int from, int to) {
    std::unique_lock<std::mutex> lock(mutex_);
    auto& box = mailboxes_[{from, to}];
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::duration<double>(world_->timeout_seconds_);
    while (box.empty() && !world_->Aborted()) {
      if (cv_.wait_until(lock, deadline) == std::cv_status::timeout && box.empty()) {
        lock.unlock();
        const std::string why = fmt::format(
            "world rank {} waited {:.0f} s for a message from world rank {} that never came",
            members_[to], world_->timeout_seconds_, members_[from]);
        world_->Abort(why);
        throw CommError(why);
      }
    }
    if (box.empty()) throw CommError("the local CUDA world was aborted: " + world_->AbortReason());
    Message m = box.front();
    box.pop_front();
    return m;
  }

  void WakeAll() {
    std::lock_guard<std::mutex> lock(mutex_);
    cv_.notify_all();
  }

  const std::vector<int>& members() const { return members_; }

 private:
  LocalCudaWorld* world_;
  std::vector<int> members_;
  std::mutex mutex_;
  std::condition_variable cv_;
  int64_t generation_ = 0;
  int arrived_ = 0;
  std::vector<Post> posts_;
  std::vector<Post> snapshot_;
  std::string mismatch_;
  std::map<std::pair<int, int>, std::deque<Message>> mailboxes_;
  std::vector<cudaEvent_t> events_;
};

class LocalCudaCommunicator final : public Communicator {
 public:
  LocalCudaCommunicator(LocalCudaWorld* world, std::shared_ptr<LocalCudaGroup> group, int rank,
                        cudaStream_t stream)
      : world_(world),
        group_(std::move(group)),
        rank_(rank),
        stream_(stream),
        ready_(group_->ReadyEvent(rank)),
        done_(group_->DoneEvent(rank)) {}

  int Rank() const override { return rank_; }
  int Size() const override { return static_cast<int>(group_->members().size()); }

  void AllReduce(const void* send, void* recv, int64_t count, DType dtype, ReduceOp op) override {
    Collective(
        OpKind::kAllReduce, send, recv, count, dtype, 0, op, [&](const std::vector<Post>& posts) {
          auto [begin, end] = Chunk(count);
          std::vector<float*> outs;
          std::vector<const float*> ins;
          for (const Post& p : posts) {
            outs.push_back(p.recv);
            ins.push_back(p.send);
          }
          if (op == ReduceOp::kSum) {
            cuda::SumAcrossRanks(outs.data(), Size(), ins.data(), Size(), begin, end, stream_);
          } else {
            cuda::MaxAcrossRanks(outs.data(), Size(), ins.data(), Size(), begin, end, stream_);
          }
        });
  }

  void ReduceScatter(const void* send, void* recv, int64_t recv_count, DType dtype) override {
    Collective(OpKind::kReduceScatter, send, recv, recv_count, dtype, 0, ReduceOp::kSum,
               [&](const std::vector<Post>& posts) {
                 float* out = static_cast<float*>(recv);
                 std::vector<const float*> ins;
                 for (const Post& p : posts) ins.push_back(p.send + rank_ * recv_count);
                 cuda::SumAcrossRanks(&out, 1, ins.data(), Size(), 0, recv_count, stream_);
               });
  }

  void AllGather(const void* send, void* recv, int64_t send_count, DType dtype) override {
    Collective(OpKind::kAllGather, send, recv, send_count, dtype, 0, ReduceOp::kSum,
               [&](const std::vector<Post>& posts) {
                 for (const Post& p : posts) {
                   Check(cudaMemcpyAsync(p.recv + rank_ * send_count, send, send_count * 4,
                                         cudaMemcpyDeviceToDevice, stream_),
                         "cudaMemcpyAsync");
                 }
               });
  }

  void Broadcast(void* buf, int64_t count, DType dtype, int root) override {
    if (root < 0 || root >= Size())
      throw CommError(fmt::format("broadcast root {} is not in the group", root));
    Collective(OpKind::kBroadcast, buf, buf, count, dtype, root, ReduceOp::kSum,
               [&](const std::vector<Post>& posts) {
                 if (rank_ == root) return;
                 Check(cudaMemcpyAsync(buf, posts[root].send, count * 4, cudaMemcpyDeviceToDevice,
                                       stream_),
                       "cudaMemcpyAsync");
               });
  }

  void AllToAll(const void* send, void* recv, int64_t count, DType dtype) override {
    Collective(OpKind::kAllToAll, send, recv, count, dtype, 0, ReduceOp::kSum,
               [&](const std::vector<Post>& posts) {
                 for (int s = 0; s < Size(); ++s) {
                   Check(cudaMemcpyAsync(static_cast<float*>(recv) + s * count,
                                         posts[s].send + rank_ * count, count * 4,
                                         cudaMemcpyDeviceToDevice, stream_),
                         "cudaMemcpyAsync");
                 }
               });
  }

  void Send(const void* buf, int64_t count, DType dtype, int peer) override {
    CheckArgs(count, dtype);
    CheckPeer(peer);
    Message m{nullptr, count, dtype, nullptr};
    Check(cudaMallocAsync(reinterpret_cast<void**>(&m.staging), std::max<int64_t>(count, 1) * 4,
                          stream_),
          "cudaMallocAsync");
    Check(cudaMemcpyAsync(m.staging, buf, count * 4, cudaMemcpyDeviceToDevice, stream_),
          "cudaMemcpyAsync");
    Check(cudaEventCreateWithFlags(&m.ready, cudaEventDisableTiming), "cudaEventCreate");
    Check(cudaEventRecord(m.ready, stream_), "cudaEventRecord");
    group_->Deliver(rank_, peer, m);
  }

  void Recv(void* buf, int64_t count, DType dtype, int peer) override {
    CheckArgs(count, dtype);
    CheckPeer(peer);
    Message m = group_->Collect(peer, rank_);
    if (m.count != count || m.dtype != dtype) {
      const std::string why =
          fmt::format("group rank {} expected {} elements from group rank {} but {} were sent",
                      rank_, count, peer, m.count);
      world_->Abort(why);
      throw CommError(why);
    }
    Check(cudaStreamWaitEvent(stream_, m.ready, 0), "cudaStreamWaitEvent");
    Check(cudaMemcpyAsync(buf, m.staging, count * 4, cudaMemcpyDeviceToDevice, stream_),
          "cudaMemcpyAsync");
    Check(cudaFreeAsync(m.staging, stream_), "cudaFreeAsync");
    cudaEventDestroy(m.ready);
  }

  void Barrier() override {
    Check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    Collective(OpKind::kBarrier, nullptr, nullptr, 0, DType::kF32, 0, ReduceOp::kSum,
               [](const std::vector<Post>&) {});
  }

  void Abort(const std::string& reason) override { world_->Abort(reason); }

 private:
  template <typename Work>
  void Collective(OpKind op, const void* send, void* recv, int64_t count, DType dtype, int root,
                  ReduceOp reduce, Work work) {
    CheckArgs(count, dtype);
    if (world_->Aborted())
      throw CommError("the local CUDA world was aborted: " + world_->AbortReason());
    Post post{op,
              count,
              dtype,
              root,
              reduce,
              static_cast<const float*>(send),
              static_cast<float*>(recv),
              ready_};
    Check(cudaEventRecord(ready_, stream_), "cudaEventRecord");
    std::vector<Post> posts = group_->Rendezvous(rank_, post);
    for (int r = 0; r < Size(); ++r) {
      if (r != rank_) Check(cudaStreamWaitEvent(stream_, posts[r].event, 0), "cudaStreamWaitEvent");
    }
    if (count > 0) work(posts);
    // Second phase: nobody reuses its buffers until everyone's share is done.
    Post done = post;
    done.event = done_;
    Check(cudaEventRecord(done_, stream_), "cudaEventRecord");
    std::vector<Post> finished = group_->Rendezvous(rank_, done);
    for (int r = 0; r < Size(); ++r) {
      if (r != rank_)
        Check(cudaStreamWaitEvent(stream_, finished[r].event, 0), "cudaStreamWaitEvent");
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

  LocalCudaWorld* world_;
  std::shared_ptr<LocalCudaGroup> group_;
  int rank_;
  cudaStream_t stream_;
  cudaEvent_t ready_ = nullptr;
  cudaEvent_t done_ = nullptr;
};

LocalCudaWorld::LocalCudaWorld(std::vector<cudaStream_t> streams, double timeout_seconds)
    : streams_(std::move(streams)), timeout_seconds_(timeout_seconds) {
  if (streams_.empty() || static_cast<int>(streams_.size()) > cuda::kMaxLocalRanks) {
    throw CommError(fmt::format("the local CUDA mode runs 1 to {} ranks, not {}",
                                cuda::kMaxLocalRanks, streams_.size()));
  }
}

LocalCudaWorld::~LocalCudaWorld() = default;

std::unique_ptr<Communicator> LocalCudaWorld::Join(const std::vector<int>& members, int world_rank,
                                                   int tag) {
  std::set<int> seen;
  int index = -1;
  for (size_t i = 0; i < members.size(); ++i) {
    if (members[i] < 0 || members[i] >= Size() || !seen.insert(members[i]).second) {
      throw CommError(
          fmt::format("group {} has an invalid or repeated world rank for a world of {}",
                      Members(members), Size()));
    }
    if (members[i] == world_rank) index = static_cast<int>(i);
  }
  if (index < 0) {
    throw CommError(
        fmt::format("world rank {} is not a member of group {}", world_rank, Members(members)));
  }
  std::shared_ptr<LocalCudaGroup> group;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto& slot = groups_[{tag, members}];
    if (!slot) slot = std::make_shared<LocalCudaGroup>(this, members);
    group = slot;
  }
  return std::make_unique<LocalCudaCommunicator>(this, group, index, streams_[world_rank]);
}

void LocalCudaWorld::Abort(const std::string& reason) {
  std::vector<std::shared_ptr<LocalCudaGroup>> groups;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!aborted_.load()) abort_reason_ = reason;
    aborted_.store(true);
    for (auto& [key, group] : groups_) groups.push_back(group);
  }
  for (auto& g : groups) g->WakeAll();
}

std::string LocalCudaWorld::AbortReason() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return abort_reason_;
}

}  // namespace paraplan::comm
