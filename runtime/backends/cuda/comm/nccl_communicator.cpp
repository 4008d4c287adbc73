#include "runtime/backends/cuda/comm/nccl_communicator.h"

#include <fmt/format.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <set>

#include "runtime/launch/rendezvous.h"

namespace paraplan::comm {

struct NcclWatch {
  cudaEvent_t event;
  std::chrono::steady_clock::time_point start;
  std::string what;
};

namespace {

using Clock = std::chrono::steady_clock;

ncclComm_t AsComm(void* p) { return static_cast<ncclComm_t>(p); }

void CheckNccl(ncclResult_t r, const char* what, ncclComm_t comm = nullptr) {
  if (r == ncclSuccess) return;
  std::string detail = comm ? ncclGetLastError(comm) : ncclGetLastError(nullptr);
  throw CommError(fmt::format("NCCL call `{}` failed: {}{}{}", what, ncclGetErrorString(r),
                              detail.empty() ? "" : ": ", detail));
}

void CheckCuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw CommError(fmt::format("`{}` failed: {}", what, cudaGetErrorString(e)));
}

ncclDataType_t NcclType(DType d) { return d == DType::kF32 ? ncclFloat32 : ncclBfloat16; }

std::string Members(const std::vector<int>& members) {
  std::string s = "[";
  size_t shown = std::min<size_t>(members.size(), 8);
  for (size_t i = 0; i < shown; ++i) s += (i ? "," : "") + std::to_string(members[i]);
  if (members.size() > shown) s += ",...";
  return s + "]";
}

}  // namespace

NcclWorldOptions NcclWorldOptionsFromEnvironment(const launch::EnvLookup& env) {
  NcclWorldOptions o;
  if (auto t = env("PARAPLAN_NCCL_TIMEOUT"); t && !t->empty()) {
    auto v = launch::ParseIntVariable("PARAPLAN_NCCL_TIMEOUT", *t, 1, int64_t{7} * 24 * 3600);
    if (!v) throw CommError(v.error());
    o.timeout_seconds = *v;
  }
  if (auto t = env("PARAPLAN_RENDEZVOUS_TIMEOUT"); t && !t->empty()) {
    auto v = launch::ParseIntVariable("PARAPLAN_RENDEZVOUS_TIMEOUT", *t, 1, int64_t{24} * 3600);
    if (!v) throw CommError(v.error());
    o.rendezvous_timeout_seconds = *v;
  }
  return o;
}

// ---------------------------------------------------------------------------------------------

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(NcclWorld* world, void* comm, std::vector<int> members, int rank)
      : world_(world), comm_(comm), members_(std::move(members)), rank_(rank) {}

  int Rank() const override { return rank_; }
  int Size() const override { return static_cast<int>(members_.size()); }

  void AllReduce(const void* send, void* recv, int64_t count, DType dtype, ReduceOp op) override {
    Begin();
    if (Single()) return Copy(recv, send, count, dtype);
    CheckNccl(ncclAllReduce(send, recv, count, NcclType(dtype),
                            op == ReduceOp::kSum ? ncclSum : ncclMax, Comm(), world_->stream_),
              "ncclAllReduce", Comm());
    Watch("all_reduce", count);
  }
  void ReduceScatter(const void* send, void* recv, int64_t recv_count, DType dtype) override {
    Begin();
    if (Single()) return Copy(recv, send, recv_count, dtype);
    CheckNccl(ncclReduceScatter(send, recv, recv_count, NcclType(dtype), ncclSum, Comm(),
                                world_->stream_),
              "ncclReduceScatter", Comm());
    Watch("reduce_scatter", recv_count);
  }
  void AllGather(const void* send, void* recv, int64_t send_count, DType dtype) override {
    Begin();
    if (Single()) return Copy(recv, send, send_count, dtype);
    CheckNccl(ncclAllGather(send, recv, send_count, NcclType(dtype), Comm(), world_->stream_),
              "ncclAllGather", Comm());
    Watch("all_gather", send_count);
  }
  void Broadcast(void* buf, int64_t count, DType dtype, int root) override {
    Begin();
    if (root < 0 || root >= Size())
      throw CommError(fmt::format("broadcast root {} is not in the group", root));
    if (Single()) return;
    CheckNccl(ncclBroadcast(buf, buf, count, NcclType(dtype), root, Comm(), world_->stream_),
              "ncclBroadcast", Comm());
    Watch("broadcast", count);
  }
  void Send(const void* buf, int64_t count, DType dtype, int peer) override {
    Begin();
    CheckPeer(peer);
    CheckNccl(ncclSend(buf, count, NcclType(dtype), peer, Comm(), world_->stream_), "ncclSend",
              Comm());
    if (group_depth_ == 0) Watch("send", count);
  }
  void Recv(void* buf, int64_t count, DType dtype, int peer) override {
    Begin();
    CheckPeer(peer);
    CheckNccl(ncclRecv(buf, count, NcclType(dtype), peer, Comm(), world_->stream_), "ncclRecv",
              Comm());
    if (group_depth_ == 0) Watch("recv", count);
  }
  void AllToAll(const void* send, void* recv, int64_t count, DType dtype) override {
    Begin();
    if (Single()) return Copy(recv, send, count, dtype);
    const int64_t bytes = count * DTypeBytes(dtype);
    CheckNccl(ncclGroupStart(), "ncclGroupStart");
    for (int p = 0; p < Size(); ++p) {
      CheckNccl(ncclSend(static_cast<const char*>(send) + p * bytes, count, NcclType(dtype), p,
                         Comm(), world_->stream_),
                "ncclSend", Comm());
      CheckNccl(ncclRecv(static_cast<char*>(recv) + p * bytes, count, NcclType(dtype), p, Comm(),
                         world_->stream_),
                "ncclRecv", Comm());
    }
    CheckNccl(ncclGroupEnd(), "ncclGroupEnd");
    Watch("all_to_all", count);
  }
  void AllToAllV(const void* send, const int64_t* send_counts, void* recv,
                 const int64_t* recv_counts, DType dtype) override {
    Begin();
    if (Single()) return Copy(recv, send, send_counts[0], dtype);
    const int64_t bytes = DTypeBytes(dtype);
    int64_t send_at = 0, recv_at = 0, total = 0;
    CheckNccl(ncclGroupStart(), "ncclGroupStart");
    for (int p = 0; p < Size(); ++p) {
      if (send_counts[p] > 0)
        CheckNccl(ncclSend(static_cast<const char*>(send) + send_at * bytes, send_counts[p],
                           NcclType(dtype), p, Comm(), world_->stream_),
                  "ncclSend", Comm());
      if (recv_counts[p] > 0)
        CheckNccl(ncclRecv(static_cast<char*>(recv) + recv_at * bytes, recv_counts[p],
                           NcclType(dtype), p, Comm(), world_->stream_),
                  "ncclRecv", Comm());
      send_at += send_counts[p];
      recv_at += recv_counts[p];
      total += send_counts[p];
    }
    CheckNccl(ncclGroupEnd(), "ncclGroupEnd");
    Watch("all_to_all_v", total);
  }
  void Barrier() override {
    Begin();
    if (!Single()) {
      float* one = nullptr;
      CheckCuda(cudaMallocAsync(reinterpret_cast<void**>(&one), sizeof(float), world_->stream_),
                "cudaMallocAsync");
      CheckCuda(cudaMemsetAsync(one, 0, sizeof(float), world_->stream_), "cudaMemsetAsync");
      CheckNccl(ncclAllReduce(one, one, 1, ncclFloat32, ncclSum, Comm(), world_->stream_),
                "ncclAllReduce", Comm());
      Watch("barrier", 1);
      CheckCuda(cudaFreeAsync(one, world_->stream_), "cudaFreeAsync");
    }
    CheckCuda(cudaStreamSynchronize(world_->stream_), "cudaStreamSynchronize");
    world_->CheckHealthy();
  }
  void GroupBegin() override {
    Begin();
    CheckNccl(ncclGroupStart(), "ncclGroupStart");
    ++group_depth_;
  }
  void GroupEnd() override {
    if (group_depth_ == 0) throw CommError("GroupEnd without GroupBegin");
    --group_depth_;
    CheckNccl(ncclGroupEnd(), "ncclGroupEnd");
    if (group_depth_ == 0 && !Single()) Watch("send/recv group", 0);
  }
  void Abort(const std::string& reason) override { world_->Abort(reason); }

 private:
  void Begin() const { world_->CheckHealthy(); }
  bool Single() const { return comm_ == nullptr; }
  ncclComm_t Comm() const { return AsComm(comm_); }
  void Copy(void* dst, const void* src, int64_t count, DType dtype) {
    if (dst != src && count > 0) {
      CheckCuda(cudaMemcpyAsync(dst, src, count * DTypeBytes(dtype), cudaMemcpyDeviceToDevice,
                                world_->stream_),
                "cudaMemcpyAsync");
    }
  }
  void CheckPeer(int peer) const {
    if (peer < 0 || peer >= Size() || peer == rank_) {
      throw CommError(
          fmt::format("peer {} is not another member of group {}", peer, Members(members_)));
    }
  }
  void Watch(const char* op, int64_t count) {
    world_->Watch(fmt::format("{} of {} elements on group {}", op, count, Members(members_)));
  }

  NcclWorld* world_;
  void* comm_;
  std::vector<int> members_;
  int rank_;
  int group_depth_ = 0;
};

// ---------------------------------------------------------------------------------------------

NcclWorld::NcclWorld(int rank, int world_size, cudaStream_t stream, NcclWorldOptions options)
    : rank_(rank), world_size_(world_size), stream_(stream), options_(options) {}

std::unique_ptr<NcclWorld> NcclWorld::Create(const launch::LaunchEnvironment& env,
                                             cudaStream_t stream, uint64_t job_key,
                                             const NcclWorldOptions& options) {
  std::unique_ptr<NcclWorld> world(new NcclWorld(env.rank, env.world_size, stream, options));
  ncclUniqueId id;
  std::memset(&id, 0, sizeof id);
  if (env.world_size > 1) {
    std::vector<uint8_t> payload;
    if (env.rank == 0) {
      CheckNccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
      payload.assign(reinterpret_cast<uint8_t*>(&id), reinterpret_cast<uint8_t*>(&id) + sizeof id);
    }
    launch::RendezvousOptions ro;
    ro.host = env.master_addr;
    ro.port = env.master_port;
    ro.rank = env.rank;
    ro.world_size = env.world_size;
    ro.job_key = job_key;
    ro.timeout =
        std::chrono::milliseconds(static_cast<int64_t>(options.rendezvous_timeout_seconds * 1000));
    auto got = launch::ExchangeRootPayload(ro, payload);
    if (!got) throw CommError(got.error());
    if (got->size() != sizeof id) throw CommError("the rendezvous delivered a malformed NCCL id");
    std::memcpy(&id, got->data(), sizeof id);
  } else {
    CheckNccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
  }
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 1;
  std::string name = fmt::format("paraplan-world-rank{}", env.rank);
  config.commName = name.c_str();
  ncclComm_t comm;
  CheckNccl(ncclCommInitRankConfig(&comm, env.world_size, id, env.rank, &config),
            "ncclCommInitRankConfig");
  world->world_comm_ = comm;
  world->watchdog_ = std::thread([w = world.get()] { w->WatchdogLoop(); });
  return world;
}

NcclWorld::~NcclWorld() {
  stop_.store(true);
  if (watchdog_.joinable()) watchdog_.join();
  std::set<void*> comms;
  if (world_comm_ != nullptr) comms.insert(world_comm_);
  for (auto& [tag, c] : group_comms_) {
    if (c) comms.insert(c);
  }
  for (void* c : comms) {
    if (aborted_.load()) {
      ncclCommAbort(AsComm(c));
    } else {
      ncclCommDestroy(AsComm(c));
    }
  }
  for (auto& w : watches_) cudaEventDestroy(w->event);
  for (cudaEvent_t e : spare_events_) cudaEventDestroy(e);
}

void NcclWorld::CreateGroups(const std::vector<NcclGroupSpec>& groups) {
  CheckHealthy();
  // Group indices per kind, kinds in increasing value; stable inside a kind.
  std::vector<size_t> order(groups.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return groups[a].kind < groups[b].kind; });
  size_t i = 0;
  while (i < order.size()) {
    const int kind = groups[order[i]].kind;
    int color = NCCL_SPLIT_NOCOLOR, key = 0;
    const std::vector<int>* mine = nullptr;
    int mine_tag = -1;
    size_t j = i;
    for (; j < order.size() && groups[order[j]].kind == kind; ++j) {
      const auto& members = groups[order[j]].members;
      auto it = std::find(members.begin(), members.end(), rank_);
      if (it == members.end()) continue;
      if (mine != nullptr) {
        throw CommError(fmt::format("rank {} is in two communicators of kind {}", rank_, kind));
      }
      mine = &members;
      mine_tag = static_cast<int>(order[j]);
      key = static_cast<int>(it - members.begin());
      // Size-1 groups and the world itself need no new NCCL communicator.
      if (members.size() > 1 && static_cast<int>(members.size()) < world_size_) {
        color = static_cast<int>(order[j]);
      }
    }
    // Every rank makes the split call for every kind (NCCL requires it), with NOCOLOR if unused.
    ncclComm_t child = nullptr;
    CheckNccl(ncclCommSplit(AsComm(world_comm_), color, key, &child, nullptr), "ncclCommSplit",
              AsComm(world_comm_));
    if (mine != nullptr) {
      std::lock_guard<std::mutex> lock(mutex_);
      group_members_[mine_tag] = *mine;
      if (mine->size() == 1) {
        group_comms_[mine_tag] = nullptr;
      } else if (static_cast<int>(mine->size()) == world_size_) {
        group_comms_[mine_tag] = world_comm_;
      } else {
        group_comms_[mine_tag] = child;
      }
    }
    i = j;
  }
}

std::unique_ptr<Communicator> NcclWorld::Join(const std::vector<int>& members, int world_rank,
                                              int tag) {
  CheckHealthy();
  if (world_rank != rank_) {
    throw CommError(fmt::format("this process is world rank {}, not {}", rank_, world_rank));
  }
  auto index_of_me = [&]() -> int {
    auto it = std::find(members.begin(), members.end(), rank_);
    if (it == members.end()) {
      throw CommError(
          fmt::format("world rank {} is not a member of group {}", rank_, Members(members)));
    }
    return static_cast<int>(it - members.begin());
  };
  std::lock_guard<std::mutex> lock(mutex_);
  if (static_cast<int>(members.size()) == world_size_) {
    return std::make_unique<NcclCommunicator>(this, world_comm_, members, index_of_me());
  }
  if (members.size() == 1)
    return std::make_unique<NcclCommunicator>(this, nullptr, members, index_of_me());
  auto it = group_comms_.find(tag);
  if (it == group_comms_.end() || group_members_[tag] != members) {
    throw CommError(fmt::format("group {} (communicator {}) was not created by CreateGroups",
                                Members(members), tag));
  }
  return std::make_unique<NcclCommunicator>(this, it->second, members, index_of_me());
}

void NcclWorld::Watch(const std::string& what) {
  std::lock_guard<std::mutex> lock(mutex_);
  cudaEvent_t e;
  if (!spare_events_.empty()) {
    e = spare_events_.back();
    spare_events_.pop_back();
  } else {
    CheckCuda(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
  }
  CheckCuda(cudaEventRecord(e, stream_), "cudaEventRecord");
  watches_.push_back(std::make_unique<NcclWatch>(NcclWatch{e, Clock::now(), what}));
}

void NcclWorld::WatchdogLoop() {
  while (!stop_.load()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (aborted_.load()) continue;
    std::string reason;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      // Completed operations leave in order; the oldest pending one decides the timeout.
      while (!watches_.empty() && cudaEventQuery(watches_.front()->event) == cudaSuccess) {
        spare_events_.push_back(watches_.front()->event);
        watches_.erase(watches_.begin());
      }
      if (!watches_.empty()) {
        const double waited =
            std::chrono::duration<double>(Clock::now() - watches_.front()->start).count();
        if (waited > options_.timeout_seconds) {
          reason = fmt::format(
              "rank {}: {} did not complete within {:.0f} s; a peer died or stalled (set "
              "PARAPLAN_NCCL_TIMEOUT to wait longer)",
              rank_, watches_.front()->what, options_.timeout_seconds);
        }
      }
      if (reason.empty()) {
        std::set<void*> comms;
        if (world_comm_ != nullptr) comms.insert(world_comm_);
        for (auto& [tag, c] : group_comms_) {
          if (c) comms.insert(c);
        }
        for (void* c : comms) {
          ncclResult_t async = ncclSuccess;
          if (ncclCommGetAsyncError(AsComm(c), &async) == ncclSuccess && async != ncclSuccess &&
              async != ncclInProgress) {
            reason = fmt::format("rank {}: NCCL reported an asynchronous error: {}: {}", rank_,
                                 ncclGetErrorString(async), ncclGetLastError(AsComm(c)));
            break;
          }
        }
      }
    }
    if (!reason.empty()) Abort(reason);
  }
}

void NcclWorld::Abort(const std::string& reason) {
  std::set<void*> comms;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (aborted_.exchange(true)) return;
    abort_reason_ = reason;
    if (world_comm_ != nullptr) comms.insert(world_comm_);
    for (auto& [tag, c] : group_comms_) {
      if (c) comms.insert(c);
    }
  }
  // Aborting makes NCCL kernels stuck on a dead peer return, so the stream can drain.
  for (void* c : comms) ncclCommAbort(AsComm(c));
  std::lock_guard<std::mutex> lock(mutex_);
  group_comms_.clear();
  world_comm_ = nullptr;
}

std::string NcclWorld::AbortReason() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return abort_reason_;
}

void NcclWorld::CheckHealthy() const {
  if (aborted_.load()) throw CommError("the NCCL world was aborted: " + AbortReason());
}

}  // namespace paraplan::comm
