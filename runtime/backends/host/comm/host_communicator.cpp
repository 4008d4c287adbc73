#include "runtime/backends/host/comm/host_communicator.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <set>
#include <sstream>

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

struct Post {
  OpKind kind = OpKind::kBarrier;
  int64_t count = 0;
  DType dtype = DType::kF32;
  ReduceOp op = ReduceOp::kSum;
  int root = 0;
  const void* send = nullptr;
  void* recv = nullptr;
};

std::string Describe(const Post& p) {
  std::ostringstream s;
  s << CollectiveKindName(p.kind) << "(count " << p.count << ", " << DTypeName(p.dtype);
  if (p.kind == OpKind::kAllReduce) s << ", " << ReduceOpName(p.op);
  if (p.kind == OpKind::kBroadcast) s << ", root " << p.root;
  s << ")";
  return s.str();
}

std::string MembersText(const std::vector<int>& members) {
  std::ostringstream s;
  s << "[";
  for (size_t i = 0; i < members.size(); ++i) s << (i ? "," : "") << members[i];
  s << "]";
  return s.str();
}

struct Message {
  int64_t count;
  DType dtype;
  std::vector<unsigned char> bytes;
};

}  // namespace

class HostGroup {
 public:
  HostGroup(HostWorld* world, std::vector<int> members)
      : world_(world),
        members_(std::move(members)),
        posts_(members_.size()),
        mailboxes_(members_.size() * members_.size()) {}

  int Size() const { return static_cast<int>(members_.size()); }
  const std::vector<int>& Members() const { return members_; }

  void Wake() {
    std::lock_guard<std::mutex> lock(mutex_);
    cv_.notify_all();
  }

  // Posts `post` for member `me` and waits for every member; the last arrival validates.
  void Arrive(int me, const Post& post) {
    std::unique_lock<std::mutex> lock(mutex_);
    posts_[me] = post;
    ArriveLocked(me, lock, /*validate=*/true, CollectiveKindName(post.kind));
  }

  // A second rendezvous (no new post): everyone finished reading the posted buffers. It never
  // gives up, not even after an abort: between Arrive and Depart a member only copies and adds
  // (no waiting, no throwing), so every member gets here, and a member that left early could
  // unwind and free buffers that a peer is still reading.
  void Depart(int me) {
    std::unique_lock<std::mutex> lock(mutex_);
    const uint64_t generation = depart_generation_;
    if (++departed_ == Size()) {
      departed_ = 0;
      ++depart_generation_;
      cv_.notify_all();
      return;
    }
    cv_.wait(lock, [&] { return depart_generation_ != generation; });
  }

  const Post& PostOf(int member) const { return posts_[member]; }
  std::vector<unsigned char>& Scratch() { return scratch_; }

  void Send(int me, int peer, const void* buf, int64_t count, DType dtype) {
    Message m{count, dtype, {}};
    m.bytes.resize(static_cast<size_t>(count * DTypeBytes(dtype)));
    if (count > 0) std::memcpy(m.bytes.data(), buf, m.bytes.size());
    std::lock_guard<std::mutex> lock(mutex_);
    Mailbox(me, peer).push_back(std::move(m));
    cv_.notify_all();
  }

  void Recv(int me, int peer, void* buf, int64_t count, DType dtype) {
    std::unique_lock<std::mutex> lock(mutex_);
    auto& box = Mailbox(peer, me);
    Wait(
        lock, [&] { return !box.empty(); }, me, "recv");
    Message m = std::move(box.front());
    box.pop_front();
    lock.unlock();
    if (m.count != count || m.dtype != dtype) {
      std::ostringstream s;
      s << "recv on group " << MembersText(members_) << ": rank " << members_[me] << " expected "
        << count << " " << DTypeName(dtype) << " from rank " << members_[peer]
        << " but the matching send carried " << m.count << " " << DTypeName(m.dtype);
      Fail(s.str());
    }
    if (count > 0) std::memcpy(buf, m.bytes.data(), m.bytes.size());
  }

  [[noreturn]] void Fail(const std::string& reason) {
    world_->Abort(reason);
    throw CommError(reason);
  }

 private:
  std::deque<Message>& Mailbox(int from, int to) { return mailboxes_[from * Size() + to]; }

  template <typename Pred>
  void Wait(std::unique_lock<std::mutex>& lock, Pred pred, int me, const char* what) {
    // The timeout counts time this process was running, not time it was stopped (SIGSTOP, a
    // suspended job, a paused machine): it waits in slices of at most 100 ms and counts no more
    // than the slice for each, however late the wake-up came.
    const double limit = world_->options_.timeout_seconds;
    double waited = 0;
    while (!pred()) {
      if (world_->Aborted()) throw CommError("aborted: " + world_->AbortReason());
      const double slice = std::clamp(limit - waited, 1e-3, 0.1);
      const auto t0 = std::chrono::steady_clock::now();
      cv_.wait_for(lock, std::chrono::duration<double>(slice));
      waited += std::min(
          slice, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      if (waited >= limit && !pred()) {
        if (world_->Aborted()) throw CommError("aborted: " + world_->AbortReason());
        std::ostringstream s;
        s << "rank " << members_[me] << " waited more than " << limit << " s in " << what
          << " on group " << MembersText(members_) << ": a member never arrived";
        lock.unlock();
        Fail(s.str());
      }
    }
    // Once the condition holds the operation has happened for every member (a rendezvous
    // completed, a message arrived): an abort is noticed at the next call instead, so that no
    // member leaves a collective whose peers read its buffers.
  }

  void ArriveLocked(int me, std::unique_lock<std::mutex>& lock, bool validate, const char* what) {
    if (world_->Aborted()) throw CommError("aborted: " + world_->AbortReason());
    uint64_t generation = generation_;
    if (++arrived_ == Size()) {
      arrived_ = 0;
      if (validate) {
        for (int r = 1; r < Size(); ++r) {
          const Post& a = posts_[0];
          const Post& b = posts_[r];
          if (a.kind != b.kind || a.count != b.count || a.dtype != b.dtype ||
              (a.kind == OpKind::kAllReduce && a.op != b.op) ||
              (a.kind == OpKind::kBroadcast && a.root != b.root)) {
            std::ostringstream s;
            s << "collective mismatch on group " << MembersText(members_) << ": rank "
              << members_[0] << " called " << Describe(a) << " but rank " << members_[r]
              << " called " << Describe(b);
            lock.unlock();
            Fail(s.str());
          }
        }
      }
      if (validate && posts_[0].kind == OpKind::kAllReduce) {
        size_t need = static_cast<size_t>(posts_[0].count * DTypeBytes(posts_[0].dtype));
        if (scratch_.size() < need) scratch_.resize(need);
      }
      ++generation_;
      cv_.notify_all();
      return;
    }
    Wait(
        lock, [&] { return generation_ != generation; }, me, what);
  }

  HostWorld* world_;
  std::vector<int> members_;
  std::mutex mutex_;
  std::condition_variable cv_;
  int arrived_ = 0, departed_ = 0;
  uint64_t generation_ = 0, depart_generation_ = 0;
  std::vector<Post> posts_;
  std::vector<unsigned char> scratch_;
  std::vector<std::deque<Message>> mailboxes_;
};

namespace {

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
    Post p{OpKind::kAllReduce, count, dtype, op, 0, send, recv};
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
    group_->Arrive(me_,
                   Post{OpKind::kReduceScatter, recv_count, dtype, ReduceOp::kSum, 0, send, recv});
    ReduceRange(*group_, me_ * recv_count, 0, recv_count, dtype, ReduceOp::kSum, recv);
    group_->Depart(me_);
  }

  void AllGather(const void* send, void* recv, int64_t send_count, DType dtype) override {
    Check(send_count, "all_gather");
    group_->Arrive(me_, Post{OpKind::kAllGather, send_count, dtype, ReduceOp::kSum, 0, send, recv});
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
    group_->Arrive(me_, Post{OpKind::kBroadcast, count, dtype, ReduceOp::kSum, root, buf, buf});
    if (me_ != root && count > 0) {
      std::memcpy(buf, group_->PostOf(root).send, static_cast<size_t>(count * DTypeBytes(dtype)));
    }
    group_->Depart(me_);
  }

  void Send(const void* buf, int64_t count, DType dtype, int peer) override {
    Check(count, "send");
    CheckPeer(peer, "send");
    group_->Send(me_, peer, buf, count, dtype);
  }

  void Recv(void* buf, int64_t count, DType dtype, int peer) override {
    Check(count, "recv");
    CheckPeer(peer, "recv");
    group_->Recv(me_, peer, buf, count, dtype);
  }

  void AllToAll(const void* send, void* recv, int64_t count, DType dtype) override {
    Check(count, "all_to_all");
    group_->Arrive(me_, Post{OpKind::kAllToAll, count, dtype, ReduceOp::kSum, 0, send, recv});
    const int64_t bytes = count * DTypeBytes(dtype);
    for (int s = 0; s < Size(); ++s) {
      if (bytes > 0) {
        std::memcpy(static_cast<unsigned char*>(recv) + s * bytes,
                    static_cast<const unsigned char*>(group_->PostOf(s).send) + me_ * bytes, bytes);
      }
    }
    group_->Depart(me_);
  }

  void Barrier() override { group_->Arrive(me_, Post{}); }

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

HostWorld::HostWorld(int size, HostWorldOptions options) : size_(size), options_(options) {
  if (size <= 0)
    throw CommError("a host world needs at least one rank, got " + std::to_string(size));
}

HostWorld::~HostWorld() = default;

std::unique_ptr<Communicator> HostWorld::Join(const std::vector<int>& members, int world_rank,
                                              int tag) {
  if (members.empty()) throw CommError("a group needs at least one member");
  std::set<int> seen;
  for (int m : members) {
    if (m < 0 || m >= size_) {
      throw CommError("group " + MembersText(members) + " names rank " + std::to_string(m) +
                      " outside the world of " + std::to_string(size_));
    }
    if (!seen.insert(m).second) {
      throw CommError("group " + MembersText(members) + " names rank " + std::to_string(m) +
                      " twice");
    }
  }
  auto it = std::find(members.begin(), members.end(), world_rank);
  if (it == members.end()) {
    throw CommError("rank " + std::to_string(world_rank) + " is not a member of group " +
                    MembersText(members));
  }
  std::shared_ptr<HostGroup> group;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it_group = groups_.find({tag, members});
    if (it_group == groups_.end()) {  // no empty slot is left behind when this allocation fails
      group = std::make_shared<HostGroup>(this, members);
      groups_.emplace(std::make_pair(tag, members), group);
    } else {
      group = it_group->second;
    }
  }
  return std::make_unique<HostCommunicator>(group, static_cast<int>(it - members.begin()));
}

void HostWorld::Abort(const std::string& reason) {
  std::vector<std::shared_ptr<HostGroup>> groups;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!aborted_.load()) {
      abort_reason_ = reason;
      aborted_.store(true);
    }
    for (auto& [members, g] : groups_) {
      if (g) groups.push_back(g);
    }
  }
  for (auto& g : groups) g->Wake();
}

std::string HostWorld::AbortReason() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return abort_reason_;
}

}  // namespace paraplan::comm
