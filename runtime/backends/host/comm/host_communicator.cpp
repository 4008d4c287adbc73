#include "runtime/backends/host/comm/host_communicator.h"

#include <algorithm>
#include <cstring>

namespace paraplan::comm {
namespace {

float Bf16ToFloat(uint16_t v) {
  uint32_t bits = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t FloatToBf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7f800000u) == 0x7f800000u && (bits & 0x007fffffu) != 0) return 0x7fc0;  // NaN
  uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

using OpKind = CollectiveKind;

// The host's group: the shared rendezvous plus the all-reduce scratch its members reduce into.
class HostGroup final : public InProcessGroup {
 public:
  using InProcessGroup::InProcessGroup;
  std::vector<unsigned char>& Scratch() { return scratch_; }

 protected:
  void AllArrived(const CollectivePost& post) override {
    if (post.kind != OpKind::kAllReduce) return;
    const auto need = static_cast<size_t>(post.count * DTypeBytes(post.dtype));
    if (scratch_.size() < need) scratch_.resize(need);
  }

 private:
  std::vector<unsigned char> scratch_;
};

// Reduces elements [begin, end) of every member's send into out (group order, fp32).
void ReduceRange(const HostGroup& g, int64_t src_offset, int64_t begin, int64_t end, DType dtype,
                 ReduceOp op, void* out) {
  const int n = g.Size();
  if (dtype == DType::kF32) {
    float* o = static_cast<float*>(out);
    const float* s0 = static_cast<const float*>(g.PostOf(0).send) + src_offset;
    for (int64_t i = begin; i < end; ++i) o[i - begin] = s0[i];
    for (int r = 1; r < n; ++r) {
      const float* s = static_cast<const float*>(g.PostOf(r).send) + src_offset;
      if (op == ReduceOp::kSum) {
        for (int64_t i = begin; i < end; ++i) o[i - begin] += s[i];
      } else {
        for (int64_t i = begin; i < end; ++i) o[i - begin] = std::max(o[i - begin], s[i]);
      }
    }
    return;
  }
  uint16_t* o = static_cast<uint16_t*>(out);
  for (int64_t i = begin; i < end; ++i) {
    float acc = 0;
    for (int r = 0; r < n; ++r) {
      float v = Bf16ToFloat(static_cast<const uint16_t*>(g.PostOf(r).send)[src_offset + i]);
      acc = r == 0 ? v : (op == ReduceOp::kSum ? acc + v : std::max(acc, v));
    }
    o[i - begin] = FloatToBf16(acc);
  }
}

class HostCommunicator final : public Communicator {
 public:
  HostCommunicator(std::shared_ptr<HostGroup> group, int me) : group_(std::move(group)), me_(me) {}

  int Rank() const override { return me_; }
  int Size() const override { return group_->Size(); }

  void AllReduce(const void* send, void* recv, int64_t count, DType dtype, ReduceOp op) override {
    Check(count, "all_reduce");
    CollectivePost p{OpKind::kAllReduce, count, dtype, op, 0, send, recv};
    group_->Arrive(me_, p);
    const int64_t bytes = DTypeBytes(dtype);
    // The last member to arrive sized the shared scratch; every member now reduces a contiguous
    // share of the elements into it, and after the second rendezvous copies all of it out.
    auto& scratch = group_->Scratch();
    const int n = Size();
    const int64_t begin = count * me_ / n, end = count * (me_ + 1) / n;
    ReduceRange(*group_, 0, begin, end, dtype, op, scratch.data() + begin * bytes);
    group_->Depart(me_);
    if (count > 0) std::memcpy(recv, scratch.data(), static_cast<size_t>(count * bytes));
  }

  void ReduceScatter(const void* send, void* recv, int64_t recv_count, DType dtype) override {
    Check(recv_count, "reduce_scatter");
    group_->Arrive(me_, CollectivePost{OpKind::kReduceScatter, recv_count, dtype, ReduceOp::kSum, 0,
                                       send, recv});
    ReduceRange(*group_, me_ * recv_count, 0, recv_count, dtype, ReduceOp::kSum, recv);
    group_->Depart(me_);
  }

  void AllGather(const void* send, void* recv, int64_t send_count, DType dtype) override {
    Check(send_count, "all_gather");
    group_->Arrive(
        me_, CollectivePost{OpKind::kAllGather, send_count, dtype, ReduceOp::kSum, 0, send, recv});
    const int64_t bytes = send_count * DTypeBytes(dtype);
    for (int r = 0; r < Size(); ++r) {
      if (bytes > 0)
        std::memcpy(static_cast<unsigned char*>(recv) + r * bytes, group_->PostOf(r).send, bytes);
    }
    group_->Depart(me_);
  }

  void Broadcast(void* buf, int64_t count, DType dtype, int root) override {
    Check(count, "broadcast");
    if (root < 0 || root >= Size()) BadArgument("broadcast root " + std::to_string(root));
    group_->Arrive(
        me_, CollectivePost{OpKind::kBroadcast, count, dtype, ReduceOp::kSum, root, buf, buf});
    if (me_ != root && count > 0) {
      std::memcpy(buf, group_->PostOf(root).send, static_cast<size_t>(count * DTypeBytes(dtype)));
    }
    group_->Depart(me_);
  }

  void Send(const void* buf, int64_t count, DType dtype, int peer) override {
    Check(count, "send");
    CheckPeer(peer, "send");
    auto bytes = std::make_shared<std::vector<unsigned char>>(
        static_cast<size_t>(count * DTypeBytes(dtype)));
    if (count > 0) std::memcpy(bytes->data(), buf, bytes->size());
    group_->Deliver(me_, peer, Parcel{count, dtype, std::move(bytes)});
  }

  void Recv(void* buf, int64_t count, DType dtype, int peer) override {
    Check(count, "recv");
    CheckPeer(peer, "recv");
    const Parcel parcel = group_->Collect(peer, me_, count, dtype);
    const auto& bytes = *static_cast<const std::vector<unsigned char>*>(parcel.payload.get());
    if (count > 0) std::memcpy(buf, bytes.data(), bytes.size());
  }

  void AllToAll(const void* send, void* recv, int64_t count, DType dtype) override {
    Check(count, "all_to_all");
    group_->Arrive(me_,
                   CollectivePost{OpKind::kAllToAll, count, dtype, ReduceOp::kSum, 0, send, recv});
    const int64_t bytes = count * DTypeBytes(dtype);
    for (int s = 0; s < Size(); ++s) {
      if (bytes > 0) {
        std::memcpy(static_cast<unsigned char*>(recv) + s * bytes,
                    static_cast<const unsigned char*>(group_->PostOf(s).send) + me_ * bytes, bytes);
      }
    }
    group_->Depart(me_);
  }

  void AllToAllV(const void* send, const int64_t* send_counts, void* recv,
                 const int64_t* recv_counts, DType dtype) override {
    for (int p = 0; p < Size(); ++p) {
      Check(send_counts[p], "all_to_all_v send");
      Check(recv_counts[p], "all_to_all_v receive");
    }
    CollectivePost post{OpKind::kAllToAllV, 0, dtype, ReduceOp::kSum, 0, send, recv};
    post.send_counts = send_counts;
    post.recv_counts = recv_counts;
    group_->Arrive(me_, post);
    // Copies only between Arrive and Depart (no throw there); a pair whose counts disagree is
    // reported after the second rendezvous, by the receiver.
    const int64_t bytes = DTypeBytes(dtype);
    int64_t at = 0;
    int mismatch = -1;
    for (int s = 0; s < Size(); ++s) {
      const CollectivePost& from = group_->PostOf(s);
      int64_t offset = 0;
      for (int p = 0; p < me_; ++p) offset += from.send_counts[p];
      const int64_t n = from.send_counts[me_];
      if (n != recv_counts[s]) {
        if (mismatch < 0) mismatch = s;
      } else if (n > 0) {
        std::memcpy(static_cast<unsigned char*>(recv) + at * bytes,
                    static_cast<const unsigned char*>(from.send) + offset * bytes,
                    static_cast<size_t>(n * bytes));
      }
      at += recv_counts[s];
    }
    const int64_t sent = mismatch >= 0 ? group_->PostOf(mismatch).send_counts[me_] : 0;
    group_->Depart(me_);
    if (mismatch >= 0) {
      BadArgument("all_to_all_v expects " + std::to_string(recv_counts[mismatch]) +
                  " elements from group rank " + std::to_string(mismatch) + ", which sends " +
                  std::to_string(sent));
    }
  }

  void Barrier() override { group_->Arrive(me_, CollectivePost{}); }

  void Abort(const std::string& reason) override { group_->Fail(reason); }

 private:
  void Check(int64_t count, const char* what) {
    if (count < 0) BadArgument(std::string(what) + " with negative count " + std::to_string(count));
  }
  void CheckPeer(int peer, const char* what) {
    if (peer < 0 || peer >= Size() || peer == me_) {
      BadArgument(std::string(what) + " to peer " + std::to_string(peer) + " in a group of " +
                  std::to_string(Size()) + " from group rank " + std::to_string(me_));
    }
  }
  [[noreturn]] void BadArgument(const std::string& what) {
    group_->Fail("rank " + std::to_string(group_->Members()[me_]) + ": " + what);
  }

  std::shared_ptr<HostGroup> group_;
  int me_;
};

}  // namespace

HostWorld::HostWorld(int size, HostWorldOptions options)
    : world_(size, options.timeout_seconds, "host world") {}

HostWorld::~HostWorld() = default;

std::unique_ptr<Communicator> HostWorld::Join(const std::vector<int>& members, int world_rank,
                                              int tag) {
  auto [group, me] =
      world_.Join(members, world_rank, tag, [&]() -> std::shared_ptr<InProcessGroup> {
        return std::make_shared<HostGroup>(&world_, members);
      });
  return std::make_unique<HostCommunicator>(std::static_pointer_cast<HostGroup>(group), me);
}

}  // namespace paraplan::comm
