#include "runtime/comm/in_process.h"

#include <algorithm>
#include <chrono>
#include <set>
#include <sstream>

namespace paraplan::comm {

std::string DescribePost(const CollectivePost& post) {
  std::ostringstream s;
  s << CollectiveKindName(post.kind) << "(count " << post.count << ", " << DTypeName(post.dtype);
  if (post.kind == CollectiveKind::kAllReduce) s << ", " << ReduceOpName(post.op);
  if (post.kind == CollectiveKind::kBroadcast) s << ", root " << post.root;
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

namespace {

bool SameCall(const CollectivePost& a, const CollectivePost& b) {
  return a.kind == b.kind && a.count == b.count && a.dtype == b.dtype &&
         (a.kind != CollectiveKind::kAllReduce || a.op == b.op) &&
         (a.kind != CollectiveKind::kBroadcast || a.root == b.root);
}

}  // namespace

// ---- InProcessGroup -------------------------------------------------------------------------

InProcessGroup::InProcessGroup(InProcessWorld* world, std::vector<int> members)
    : world_(world),
      members_(std::move(members)),
      posts_(members_.size()),
      mailboxes_(members_.size() * members_.size()) {}

template <typename Pred>
void InProcessGroup::Wait(std::unique_lock<std::mutex>& lock, Pred pred, int me,
                          const std::string& what) {
  const double limit = world_->TimeoutSeconds();
  double waited = 0;
  while (!pred()) {
    world_->ThrowIfAborted();
    const double slice = std::clamp(limit - waited, 1e-3, 0.1);
    const auto t0 = std::chrono::steady_clock::now();
    cv_.wait_for(lock, std::chrono::duration<double>(slice));
    waited += std::min(
        slice, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    if (waited >= limit && !pred()) {
      world_->ThrowIfAborted();
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

void InProcessGroup::Rendezvous(int me, std::unique_lock<std::mutex>& lock, bool validate,
                                const std::string& what) {
  world_->ThrowIfAborted();
  const uint64_t generation = generation_;
  if (++arrived_ < Size()) {
    Wait(
        lock, [&] { return generation_ != generation; }, me, what);
    return;
  }
  arrived_ = 0;
  if (validate) {
    for (int r = 1; r < Size(); ++r) {
      if (!SameCall(posts_[0], posts_[r])) {
        std::ostringstream s;
        s << "collective mismatch on group " << MembersText(members_) << ": rank " << members_[0]
          << " called " << DescribePost(posts_[0]) << " but rank " << members_[r] << " called "
          << DescribePost(posts_[r]);
        lock.unlock();
        Fail(s.str());
      }
    }
    AllArrived(posts_[0]);
  }
  ++generation_;
  cv_.notify_all();
}

void InProcessGroup::Arrive(int me, const CollectivePost& post) {
  std::unique_lock<std::mutex> lock(mutex_);
  posts_[me] = post;
  Rendezvous(me, lock, /*validate=*/true, CollectiveKindName(post.kind));
}

void InProcessGroup::Finish(int me, CollectiveKind kind) {
  std::unique_lock<std::mutex> lock(mutex_);
  Rendezvous(me, lock, /*validate=*/false,
             std::string("the completion of ") + CollectiveKindName(kind));
}

void InProcessGroup::Depart(int me) {
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

void InProcessGroup::Deliver(int from, int to, Parcel parcel) {
  std::lock_guard<std::mutex> lock(mutex_);
  Mailbox(from, to).push_back(std::move(parcel));
  cv_.notify_all();
}

Parcel InProcessGroup::Collect(int from, int to, int64_t count, DType dtype) {
  std::unique_lock<std::mutex> lock(mutex_);
  auto& box = Mailbox(from, to);
  Wait(
      lock, [&] { return !box.empty(); }, to, "recv from rank " + std::to_string(members_[from]));
  Parcel parcel = std::move(box.front());
  box.pop_front();
  lock.unlock();
  if (parcel.count != count || parcel.dtype != dtype) {
    std::ostringstream s;
    s << "recv on group " << MembersText(members_) << ": rank " << members_[to] << " expected "
      << count << " " << DTypeName(dtype) << " from rank " << members_[from]
      << " but the matching send carried " << parcel.count << " " << DTypeName(parcel.dtype);
    Fail(s.str());
  }
  return parcel;
}

void InProcessGroup::AbortWorld(const std::string& reason) { world_->Abort(reason); }

void InProcessGroup::Fail(const std::string& reason) {
  world_->Abort(reason);
  throw CommError(reason);
}

void InProcessGroup::Wake() {
  std::lock_guard<std::mutex> lock(mutex_);
  cv_.notify_all();
}

// ---- InProcessWorld -------------------------------------------------------------------------

InProcessWorld::InProcessWorld(int size, double timeout_seconds, std::string name)
    : size_(size), timeout_seconds_(timeout_seconds), name_(std::move(name)) {
  if (size <= 0) {
    throw CommError("a " + name_ + " needs at least one rank, got " + std::to_string(size));
  }
}

std::pair<std::shared_ptr<InProcessGroup>, int> InProcessWorld::Join(
    const std::vector<int>& members, int world_rank, int tag,
    const std::function<std::shared_ptr<InProcessGroup>()>& make) {
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
  const auto it = std::find(members.begin(), members.end(), world_rank);
  if (it == members.end()) {
    throw CommError("rank " + std::to_string(world_rank) + " is not a member of group " +
                    MembersText(members));
  }
  std::shared_ptr<InProcessGroup> group;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto found = groups_.find({tag, members});
    if (found == groups_.end()) {  // no empty slot is left behind when `make` throws
      group = make();
      groups_.emplace(std::make_pair(tag, members), group);
    } else {
      group = found->second;
    }
  }
  return {group, static_cast<int>(it - members.begin())};
}

void InProcessWorld::Abort(const std::string& reason) {
  std::vector<std::shared_ptr<InProcessGroup>> groups;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!aborted_.load()) {
      abort_reason_ = reason;
      aborted_.store(true);
    }
    for (auto& [key, group] : groups_) groups.push_back(group);
  }
  for (auto& g : groups) g->Wake();
}

std::string InProcessWorld::AbortReason() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return abort_reason_;
}

void InProcessWorld::ThrowIfAborted() const {
  if (Aborted()) throw CommError("aborted: " + AbortReason());
}

}  // namespace paraplan::comm
