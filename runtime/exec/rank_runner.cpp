#include "runtime/exec/rank_runner.h"

#include <time.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <exception>
#include <system_error>
#include <thread>

#include "runtime/backends/host/kernels/kernels.h"

namespace paraplan::exec {
namespace {

std::string OpName(OpKind k) { return prog::EnumNameOpKind(k); }

// Below this many elements a parameter is initialised on the calling thread alone: starting
// threads would cost more than the ~40 ns per element they share.
constexpr int64_t kMinElementsPerInitThread = int64_t{1} << 15;

// Calls fn(begin, end) on contiguous ranges covering [0, n): up to `threads` ranges of at least
// kMinElementsPerInitThread elements, the first on the calling thread and the others on their
// own threads. A thread that cannot be started leaves its range to the calling thread; the
// first exception fn throws is rethrown after every thread has joined.
template <typename Fn>
void ForRanges(int64_t n, int threads, const Fn& fn) {
  const int64_t parts = std::clamp<int64_t>(n / kMinElementsPerInitThread, 1, std::max(threads, 1));
  if (parts == 1) {
    if (n > 0) fn(int64_t{0}, n);
    return;
  }
  std::vector<std::exception_ptr> errors(static_cast<size_t>(parts));
  auto run = [&](int64_t part) {
    try {
      fn(n * part / parts, n * (part + 1) / parts);
    } catch (...) {
      errors[static_cast<size_t>(part)] = std::current_exception();
    }
  };
  std::vector<std::thread> workers;
  std::vector<int64_t> left;  // ranges whose thread could not be started
  for (int64_t part = 1; part < parts; ++part) {
    try {
      workers.emplace_back(run, part);
    } catch (const std::system_error&) {
      left.push_back(part);
    }
  }
  run(0);
  for (int64_t part : left) run(part);
  for (auto& w : workers) w.join();
  for (const auto& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace

void InitNormalBlock(float* dst, uint64_t seed, int64_t key, double std, const InitBlock& block,
                     int threads) {
  const InitBlock& b = block;
  const int64_t local = b.outer * b.n_local * b.inner;
  // Each value depends on its global index only, so threads may take any ranges of local
  // elements.
  ForRanges(local, threads, [&](int64_t begin, int64_t end) {
    const int64_t row = begin / b.inner;
    int64_t i = begin % b.inner, j = row % b.n_local, o = row / b.n_local;
    for (int64_t li = begin; li < end; ++li) {
      dst[li] = InitValue(seed, key, (o * b.n_global + b.part * b.n_local + j) * b.inner + i, std);
      if (++i == b.inner) {
        i = 0;
        if (++j == b.n_local) {
          j = 0;
          ++o;
        }
      }
    }
  });
}

RankRunner::RankRunner(const ProgramImage& program, int rank, CommWorld& world, Backend& backend,
                       const data::TokenStream& tokens, const RunOptions& options, int init_threads)
    : program_(program),
      role_(program.roles[program.ranks[rank].role]),
      expanded_(role_.loops.empty() ? std::vector<prog::mem::Op>{} : prog::mem::ScheduleOps(role_)),
      schedule_(role_.loops.empty() ? role_.schedule : expanded_),
      rank_(rank),
      world_(world),
      backend_(backend),
      tokens_(tokens),
      options_(options),
      init_threads_(std::max(init_threads, 1)) {}

RankRunner::~RankRunner() {
  for (void* p : allocations_) backend_.Free(p);
  for (float* p : scratch_)
    if (p) backend_.Free(p);
}

float* RankRunner::Scratch(int which, int64_t elements) {
  if (scratch_elements_[which] < elements) {
    if (scratch_[which]) backend_.Free(scratch_[which]);
    scratch_[which] = static_cast<float*>(backend_.Allocate(elements * 4));
    scratch_elements_[which] = elements;
  }
  return scratch_[which];
}

double RankRunner::Now() const {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

float* RankRunner::F(int32_t buffer, const Context& ctx) const {
  if (buffer < 0) return nullptr;
  return reinterpret_cast<float*>(base_[buffer] + ctx.slot * slot_stride_[buffer]);
}

int RankRunner::IndexIn(CommKind kind) const { return comms_[static_cast<int>(kind)].index; }

const RankRunner::Comm& RankRunner::CommOf(CommKind kind, const char* what) const {
  const Comm& c = comms_[static_cast<int>(kind)];
  if (!c.comm) {
    throw RunError(std::string(what) + " on rank " + std::to_string(rank_) + " needs a " +
                   prog::EnumNameCommKind(kind) + " communicator, which the rank does not have");
  }
  return c;
}

// ZeRO shards over the ranks holding the same weights: Dp, or DpCp with context parallelism.
int64_t RankRunner::ShardIndex() const {
  if (program_.parallel.zero < 1) return 0;
  if (program_.parallel.replicate > 1) return IndexIn(CommKind::Shard);  // hybrid sharding
  return IndexIn(program_.parallel.cp > 1 ? CommKind::DpCp : CommKind::Dp);
}

// Expert parallelism: the ranks holding the same experts are the Edp group.
int64_t RankRunner::BucketShardIndex(size_t b) const {
  if (program_.parallel.zero < 1) return 0;
  const bool experts =
      !ranges_[b].empty() && role_.params[ranges_[b].front().param].split_comm == CommKind::Ep;
  return experts ? IndexIn(CommKind::Edp) : ShardIndex();
}

void RankRunner::Setup() {
  const prog::mem::Rank& me = RankInfo();
  for (int k = 1; k < prog::kCommKinds; ++k) {
    const int32_t c = me.comms[k];
    if (c < 0) continue;
    const auto& members = program_.communicators[c].members;
    Comm& slot = comms_[k];
    slot.size = static_cast<int>(members.size());
    slot.index =
        static_cast<int>(std::find(members.begin(), members.end(), rank_) - members.begin());
    slot.comm = world_.Join(std::vector<int>(members.begin(), members.end()), rank_, c);
  }
  // Memory: the planned f32 arena, or one allocation per non-view buffer.
  const size_t n = role_.buffers.size();
  base_.assign(n, nullptr);
  slot_stride_.assign(n, 0);
  char* arena = nullptr;
  if (!options_.separate_buffers) {
    try {
      arena = static_cast<char*>(backend_.Allocate(role_.fp32_arena_bytes));
    } catch (const std::exception& e) {
      // The backend's message, with what the arena is: planc compile warned (P0805) when it
      // knew the device.
      throw RunError(role_.name + " cannot allocate its arena of " +
                     FormatBytes(role_.fp32_arena_bytes) +
                     ": planrun keeps every element in f32 (" + FormatBytes(role_.arena_bytes) +
                     " in the program's precision): " + e.what());
    }
    allocations_.push_back(arena);
  }
  for (size_t b = 0; b < n; ++b) {
    const auto& buf = role_.buffers[b];
    if (buf.view_of >= 0) continue;
    const int64_t stride = buf.slots > 1 ? buf.fp32_slot_stride : 0;
    if (arena) {
      base_[b] = arena + buf.fp32_offset;
    } else {
      void* p = backend_.Allocate(std::max<int64_t>(4, buf.Elements() * 4 * buf.slots));
      allocations_.push_back(p);
      base_[b] = static_cast<char*>(p);
    }
    // Only Stash buffers have slots; every other buffer is the same memory in every context.
    slot_stride_[b] = arena ? stride : (buf.slots > 1 ? buf.Elements() * 4 : 0);
  }
  for (size_t b = 0; b < n; ++b) {  // views (possibly of views)
    int32_t target = static_cast<int32_t>(b);
    int64_t offset = 0;
    for (int hops = 0; role_.buffers[target].view_of >= 0; ++hops) {
      if (hops > 8) throw RunError("buffer `" + role_.buffers[b].name + "` is a cycle of views");
      offset += role_.buffers[target].view_offset;
      target = role_.buffers[target].view_of;
    }
    if (target != static_cast<int32_t>(b)) {
      base_[b] = base_[target] + offset * 4;
      slot_stride_[b] = slot_stride_[target];
    }
  }
  // Parameter ranges inside each bucket.
  ranges_.assign(role_.buckets.size(), {});
  for (size_t bi = 0; bi < role_.buckets.size(); ++bi) {
    const auto& bucket = role_.buckets[bi];
    for (size_t p = 0; p < role_.params.size(); ++p) {
      const auto& buf = role_.buffers[role_.params[p].buffer];
      if (buf.view_of != bucket.params) continue;
      ranges_[bi].push_back(
          {buf.view_offset, buf.view_offset + buf.Elements(), static_cast<int32_t>(p)});
    }
    std::sort(ranges_[bi].begin(), ranges_[bi].end(),
              [](const Range& a, const Range& b) { return a.begin < b.begin; });
  }
  for (const auto& body : role_.bodies) {
    for (const auto& op : body.ops) {
      if (op.kind == OpKind::CrossEntropyLoss) {
        // The model's loss is the first loss buffer the bodies write; a second is multi-token
        // prediction's.
        const int32_t out = op.outputs[0];
        if (loss_buffer_ < 0)
          loss_buffer_ = out;
        else if (out != loss_buffer_ && mtp_loss_buffer_ < 0)
          mtp_loss_buffer_ = out;
      }
      if (op.kind == OpKind::GradNormSquare && norm_buffer_ < 0) norm_buffer_ = op.outputs[0];
    }
  }
  const auto& m = program_.model;
  sampler_ = std::make_unique<data::Sampler>(
      tokens_,
      data::BatchShape{m.seq_len, program_.train.global_batch, m.micro_batch, program_.parallel.dp},
      static_cast<uint64_t>(program_.train.seed));
  InitParams();
}

int64_t RankRunner::GlobalIndex(const prog::mem::Param& p, int64_t local) const {
  if (p.split_dim < 0) return local;
  if (p.split2_dim >= 0) {
    // Two split dimensions: the local coordinates, offset by this rank's slice on each.
    const size_t n = p.global_shape.size();
    std::vector<int64_t> parts(n, 1), index(n, 0);
    for (auto [dim, comm] : {std::pair{p.split_dim, p.split_comm}, {p.split2_dim, p.split2_comm}}) {
      const Comm& c = comms_[static_cast<int>(comm)];
      parts[dim] = c.size;
      index[dim] = c.index;
    }
    int64_t rest = local, global = 0, stride = 1;
    for (size_t d = n; d-- > 0;) {
      const int64_t n_local = p.global_shape[d] / parts[d];
      global += (index[d] * n_local + rest % n_local) * stride;
      rest /= n_local;
      stride *= p.global_shape[d];
    }
    return global;
  }
  int64_t inner = 1;
  for (size_t d = p.split_dim + 1; d < p.global_shape.size(); ++d) inner *= p.global_shape[d];
  const Comm& c = comms_[static_cast<int>(p.split_comm)];
  const int64_t n_global = p.global_shape[p.split_dim], n_local = n_global / c.size;
  const int64_t i = local % inner, j = (local / inner) % n_local, o = local / inner / n_local;
  return (o * n_global + c.index * n_local + j) * inner + i;
}

void RankRunner::InitParams() {
  const uint64_t seed = static_cast<uint64_t>(program_.train.seed);
  std::vector<float> dst;
  // Bucket by bucket: the params of a bucket, then its shards. Transient buckets (ZeRO-3
  // gathered params) of different chunks share arena bytes, so a bucket's shards are taken
  // before the next bucket's params overwrite it.
  std::vector<uint8_t> done(role_.params.size(), 0);
  auto init_param = [&](const prog::mem::Param& p) {
    const int64_t local = Elements(p.buffer);
    dst.assign(static_cast<size_t>(local), 0.0f);
    int64_t global = 1;
    for (int64_t d : p.global_shape) global *= d;
    int64_t outer = 1, inner = 1, n_global = 1, parts = 1, part = 0;
    if (p.split2_dim >= 0) {
      // Experts split twice (over Ep and Etp): element by element through GlobalIndex.
      const int64_t ways = int64_t{comms_[static_cast<int>(p.split_comm)].size} *
                           comms_[static_cast<int>(p.split2_comm)].size;
      if (global / ways != local)
        throw RunError("param `" + p.name + "`: the local buffer holds " + std::to_string(local) +
                       " elements, but its global tensor of " + std::to_string(global) + " split " +
                       std::to_string(ways) + " ways gives " + std::to_string(global / ways));
      ForRanges(local, init_threads_, [&](int64_t begin, int64_t end) {
        for (int64_t li = begin; li < end; ++li) {
          const int64_t gi = GlobalIndex(p, li);
          dst[li] = p.init == prog::InitKind::Normal ? InitValue(seed, p.key, gi, p.init_std)
                    : p.init == prog::InitKind::Ones ? 1.0f
                                                     : 0.0f;
        }
      });
      backend_.CopyToDevice(F(p.buffer, {}), dst.data(), local * 4);
      return;
    }
    if (p.split_dim >= 0) {
      for (int32_t d = 0; d < p.split_dim; ++d) outer *= p.global_shape[d];
      for (size_t d = p.split_dim + 1; d < p.global_shape.size(); ++d) inner *= p.global_shape[d];
      n_global = p.global_shape[p.split_dim];
      const Comm& c = comms_[static_cast<int>(p.split_comm)];
      parts = c.size;
      part = c.index;
    } else {
      inner = global;
    }
    if (n_global % parts != 0 || global / parts != local) {
      throw RunError("param `" + p.name + "`: the local buffer holds " + std::to_string(local) +
                     " elements, but its global tensor of " + std::to_string(global) + " split " +
                     std::to_string(parts) + " ways gives " + std::to_string(global / parts));
    }
    const int64_t n_local = n_global / parts;
    switch (p.init) {
      case prog::InitKind::Zeros:
        break;  // dst starts zeroed
      case prog::InitKind::Ones:
        std::fill(dst.begin(), dst.end(), 1.0f);
        break;
      case prog::InitKind::Normal:
        InitNormalBlock(dst.data(), seed, p.key, p.init_std,
                        {outer, n_global, n_local, part, inner}, init_threads_);
        break;
    }
    backend_.CopyToDevice(F(p.buffer, {}), dst.data(), local * 4);
  };
  for (const auto& bucket : role_.buckets) {
    backend_.Fill(F(bucket.params, {}), bucket.elements, 0.0f);  // padding
    for (size_t i = 0; i < role_.params.size(); ++i) {
      if (role_.buffers[role_.params[i].buffer].view_of != bucket.params) continue;
      init_param(role_.params[i]);
      done[i] = 1;
    }
    const float* params = F(bucket.params, {});
    const int64_t shard = BucketShardIndex(static_cast<size_t>(&bucket - role_.buckets.data()));
    const int64_t begin =
        (bucket.master >= 0 || bucket.param_shard >= 0) ? shard * bucket.shard_elements : 0;
    if (bucket.master >= 0)
      backend_.Copy(F(bucket.master, {}), params + begin, bucket.shard_elements);
    if (bucket.param_shard >= 0)
      backend_.Copy(F(bucket.param_shard, {}), params + begin, bucket.shard_elements);
  }
  for (size_t i = 0; i < role_.params.size(); ++i)
    if (!done[i]) init_param(role_.params[i]);
  for (size_t b = 0; b < role_.buffers.size(); ++b)  // model state the optimizer does not train
    if (role_.buffers[b].kind == prog::BufferKind::State)
      backend_.Fill(F(static_cast<int32_t>(b), {}), Elements(static_cast<int32_t>(b)), 0.0f);
}

std::vector<StateTensor> RankRunner::State() {
  std::vector<StateTensor> out;
  for (size_t b = 0; b < role_.buckets.size(); ++b) {
    const auto& bucket = role_.buckets[b];
    const std::string prefix = "bucket" + std::to_string(b) + ".";
    // ZeRO-3: the gathered bucket is transient (its bytes are shared); the shards are the state.
    if (bucket.param_shard < 0)
      out.push_back({prefix + "params", F(bucket.params, {}), bucket.elements});
    if (bucket.master >= 0)
      out.push_back({prefix + "master", F(bucket.master, {}), Elements(bucket.master)});
    if (bucket.exp_avg >= 0)
      out.push_back({prefix + "exp_avg", F(bucket.exp_avg, {}), Elements(bucket.exp_avg)});
    if (bucket.exp_avg_sq >= 0)
      out.push_back({prefix + "exp_avg_sq", F(bucket.exp_avg_sq, {}), Elements(bucket.exp_avg_sq)});
    if (bucket.param_shard >= 0)
      out.push_back(
          {prefix + "param_shard", F(bucket.param_shard, {}), Elements(bucket.param_shard)});
  }
  for (size_t b = 0; b < role_.buffers.size(); ++b) {
    const auto& buf = role_.buffers[b];
    if (buf.kind == prog::BufferKind::State)
      out.push_back({buf.name, F(static_cast<int32_t>(b), {}), Elements(static_cast<int32_t>(b))});
  }
  return out;
}

float RankRunner::Loss() const {
  float v = 0.0f;
  if (loss_buffer_ >= 0) backend_.CopyToHost(&v, F(loss_buffer_, {}), 4);
  return v;
}

float RankRunner::MtpLoss() const {
  float v = std::nanf("");
  if (mtp_loss_buffer_ >= 0) backend_.CopyToHost(&v, F(mtp_loss_buffer_, {}), 4);
  return v;
}

float RankRunner::GradNormSquare() const {
  float v = 0.0f;
  if (norm_buffer_ >= 0) backend_.CopyToHost(&v, F(norm_buffer_, {}), 4);
  return v;
}

void RankRunner::RunStep(int64_t step) {
  step_ = step;
  const double t0 = options_.profile ? Now() : 0;
  RunSchedule(step);
  backend_.Synchronize();
  if (options_.profile) cpu_seconds += Now() - t0;
}

namespace {

bool IsTransfer(OpKind k) {
  return k == OpKind::SendActivation || k == OpKind::RecvActivation || k == OpKind::SendGrad ||
         k == OpKind::RecvGrad;
}

bool IsSend(OpKind k) { return k == OpKind::SendActivation || k == OpKind::SendGrad; }

}  // namespace

void RankRunner::RunSchedule(int64_t step) {
  const auto& sched = schedule_;
  const Context step_context{step, 0, 0};
  for (size_t i = 0; i < sched.size(); ++i) {
    const prog::mem::Op& op = sched[i];
    switch (op.kind) {
      case OpKind::Forward: {
        const auto a = prog::DecodeAttrs<prog::attrs::Forward>(op);
        RunBody(role_.chunks[a.chunk].forward,
                Context{step, a.microbatch, static_cast<int32_t>(a.slot)});
        break;
      }
      case OpKind::Backward: {
        const auto a = prog::DecodeAttrs<prog::attrs::Backward>(op);
        RunBody(role_.chunks[a.chunk].backward,
                Context{step, a.microbatch, static_cast<int32_t>(a.slot)});
        break;
      }
      case OpKind::SendActivation:
      case OpKind::RecvActivation:
      case OpKind::SendGrad:
      case OpKind::RecvGrad: {
        // A group posts every send before any receive (buffered sends never block).
        size_t j = i + 1;
        const int64_t group = prog::DecodeStepAttrs(op).group;
        if (group != 0) {
          while (j < sched.size() && IsTransfer(sched[j].kind) &&
                 prog::DecodeStepAttrs(sched[j]).group == group)
            ++j;
        }
        for (size_t k = i; k < j; ++k)
          if (IsSend(sched[k].kind)) Transfer(sched[k], true);
        for (size_t k = i; k < j; ++k)
          if (!IsSend(sched[k].kind)) Transfer(sched[k], false);
        i = j - 1;
        break;
      }
      case OpKind::ZeroGrads:
      case OpKind::ReduceGrads:
      case OpKind::OptimizerStep:
      case OpKind::GatherParams:
        RunBody(static_cast<int32_t>(prog::StepBody(op)), step_context);
        break;
      case OpKind::ReleaseParams:
        break;  // host memory stays; nothing reads a released bucket before the next gather
      default:
        throw RunError("schedule op " + OpName(op.kind) + " is not a schedule op");
    }
  }
}

void RankRunner::Transfer(const prog::mem::Op& op, bool send) {
  const Comm& c = CommOf(CommKind::Pp, "a pipeline transfer");
  const prog::StepAttrs a = prog::DecodeStepAttrs(op);
  const int32_t buffer = send ? op.inputs[0] : op.outputs[0];
  const Context ctx{step_, a.microbatch, static_cast<int32_t>(a.slot)};
  const double t0 = options_.profile ? Now() : 0;
  if (send)
    c.comm->Send(F(buffer, ctx), Elements(buffer), comm::DType::kF32, static_cast<int>(a.peer));
  else
    c.comm->Recv(F(buffer, ctx), Elements(buffer), comm::DType::kF32, static_cast<int>(a.peer));
  if (options_.profile) comm_seconds += Now() - t0;
}

void RankRunner::RunBody(int32_t body, const Context& ctx) {
  const prog::mem::Body& b = role_.bodies[body];
  for (const prog::mem::Op& op : b.ops) {
    const double t0 = options_.profile ? Now() : 0;
    const Handler handler = HandlerOf(op.kind);
    if (!handler) {
      throw RunError(OpName(op.kind) + " in body `" + b.name + "` of role `" + role_.name +
                     "`: not supported by this runtime");
    }
    (this->*handler)(OpCall(*this, op, ctx, b.name));
    if (options_.profile) {
      const double dt = Now() - t0;
      const prog::OpInfo* info = prog::FindOp(op.kind);
      if (info && info->op_class == prog::OpClass::kCollective)
        comm_seconds += dt;
      else
        kernel_seconds += dt;
    }
  }
}

const prog::mem::Bucket& RankRunner::BucketByBuffer(int32_t buffer, bool grads) const {
  for (const auto& b : role_.buckets) {
    if (grads ? (b.grads == buffer || b.grad_shard == buffer)
              : (b.params == buffer || b.param_shard == buffer))
      return b;
  }
  throw RunError("buffer `" + role_.buffers[buffer].name + "` is not a " +
                 (grads ? "gradient" : "parameter") + " bucket");
}

// ---- collectives ----------------------------------------------------------------------------

namespace {

comm::ReduceOp ToReduceOp(prog::ReduceOp op) {
  return op == prog::ReduceOp::kMax ? comm::ReduceOp::kMax : comm::ReduceOp::kSum;
}

}  // namespace

void RankRunner::RunAllReduce(const OpCall& call) {
  float* x = call.In(0);
  float* y = call.Out(0);
  const int64_t nx = call.InN(0), ny = call.OutN(0);
  const Comm& c = CommOf(call.op.comm, "AllReduce");
  if (nx != ny)
    throw call.Fail("from " + std::to_string(nx) + " into " + std::to_string(ny) + " elements");
  const prog::ReduceOp rop = call.Attrs<prog::attrs::AllReduce>().reduce_op;
  if (c.size == 1) {
    if (x != y) backend_.Copy(y, x, nx);
    return;
  }
  c.comm->AllReduce(x, y, nx, comm::DType::kF32, ToReduceOp(rop));
  if (rop == prog::ReduceOp::kAvg) backend_.Scale(y, ny, 1.0f / static_cast<float>(c.size));
}

void RankRunner::RunReduceScatter(const OpCall& call) {
  float* x = call.In(0);
  float* y = call.Out(0);
  const int64_t nx = call.InN(0), ny = call.OutN(0);
  const Comm& c = CommOf(call.op.comm, "ReduceScatter");
  const auto a = call.Attrs<prog::attrs::ReduceScatter>();
  const float avg = a.reduce_op == prog::ReduceOp::kAvg ? 1.0f / static_cast<float>(c.size) : 1.0f;
  const int64_t piece = nx / c.size;
  if (nx % c.size != 0 || (x != y && ny != piece)) {
    throw call.Fail("of " + std::to_string(nx) + " elements over " + std::to_string(c.size) +
                    " ranks into " + std::to_string(ny));
  }
  float* dst = x == y ? x + c.index * piece : y;
  if (a.accumulate && x != y) {  // y += piece (ZeRO-2/3 grad shards)
    float* tmp = Scratch(0, piece);
    if (c.size == 1)
      backend_.Copy(tmp, x, piece);
    else
      c.comm->ReduceScatter(x, tmp, piece, comm::DType::kF32);
    if (avg != 1.0f) backend_.Scale(tmp, piece, avg);
    backend_.Accumulate(dst, tmp, piece);
    return;
  }
  if (c.size == 1) {
    if (dst != x) backend_.Copy(dst, x, piece);
    return;
  }
  if (x == y) {
    float* tmp = Scratch(0, piece);
    c.comm->ReduceScatter(x, tmp, piece, comm::DType::kF32);
    backend_.Copy(dst, tmp, piece);
  } else {
    c.comm->ReduceScatter(x, y, piece, comm::DType::kF32);
  }
  if (avg != 1.0f) backend_.Scale(dst, piece, avg);
}

void RankRunner::RunAllGather(const OpCall& call) {
  float* x = call.In(0);
  float* y = call.Out(0);
  const int64_t nx = call.InN(0), ny = call.OutN(0);
  const Comm& c = CommOf(call.op.comm, "AllGather");
  const int64_t piece = x == y ? ny / c.size : nx;
  if (ny != piece * c.size) {
    throw call.Fail("of " + std::to_string(nx) + " elements over " + std::to_string(c.size) +
                    " ranks into " + std::to_string(ny));
  }
  if (c.size == 1) {
    if (x != y) backend_.Copy(y, x, nx);
    return;
  }
  if (x == y) {
    float* tmp = Scratch(0, piece);
    backend_.Copy(tmp, x + c.index * piece, piece);
    c.comm->AllGather(tmp, y, piece, comm::DType::kF32);
  } else {
    c.comm->AllGather(x, y, piece, comm::DType::kF32);
  }
}

void RankRunner::RunBroadcast(const OpCall& call) {
  float* x = call.In(0);
  float* y = call.Out(0);
  const int64_t nx = call.InN(0), ny = call.OutN(0);
  const Comm& c = CommOf(call.op.comm, "Broadcast");
  const int64_t root = call.Attrs<prog::attrs::Broadcast>().root;
  if (nx != ny)
    throw call.Fail("from " + std::to_string(nx) + " into " + std::to_string(ny) + " elements");
  call.Need(root < c.size,
            "root " + std::to_string(root) + " of a group of " + std::to_string(c.size));
  if (x != y) backend_.Copy(y, x, nx);
  if (c.size > 1) c.comm->Broadcast(y, ny, comm::DType::kF32, static_cast<int>(root));
}

// ---- optimizer ------------------------------------------------------------------------------

void RankRunner::RunGradNormSquare(const OpCall& call) {
  const bool tp_leader = IndexIn(CommKind::Tp) == 0;
  // count_once (expert parallelism): a param counts on one rank of those holding it, the
  // program sums over the world: experts on the first rank of their Edp group, the rest on the
  // first of their data-parallel (Dp or DpCp) group. Where ZeRO shards a bucket the owned shards
  // already partition it over the ranks holding it (a ZeRO group of one rank, as hybrid
  // sharding's shard of one, leaves it whole).
  const bool count_once = call.Attrs<prog::attrs::GradNormSquare>().count_once;
  const bool edp_leader = IndexIn(CommKind::Edp) == 0;
  const bool dp_leader = IndexIn(program_.parallel.cp > 1 ? CommKind::DpCp : CommKind::Dp) == 0;
  call.Output(0, 1);
  std::vector<ConstTensor> pieces;
  for (int32_t in : call.op.inputs) {
    const prog::mem::Bucket& bucket = BucketByBuffer(in, true);
    const size_t bi = &bucket - role_.buckets.data();
    const int64_t shard = BucketShardIndex(bi);
    const bool sharded = program_.parallel.zero >= 1 && bucket.shard_elements < bucket.elements;
    const int64_t begin = program_.parallel.zero >= 1 ? shard * bucket.shard_elements : 0;
    const int64_t end =
        program_.parallel.zero >= 1 ? begin + bucket.shard_elements : bucket.elements;
    const float* g = F(in, call.ctx);
    const int64_t base = in == bucket.grad_shard ? begin : 0;  // a grad shard holds [begin, end)
    call.Need(Elements(in) >= end - base, "gradient `" + role_.buffers[in].name + "` holds " +
                                              std::to_string(Elements(in)) +
                                              " elements, fewer than the shard it sums");
    for (const Range& r : ranges_[bi]) {
      const prog::mem::Param& p = role_.params[r.param];
      if (!p.counts_in_norm || (p.tp_replicated && !tp_leader)) continue;
      if (count_once && !sharded && !(p.split_comm == CommKind::Ep ? edp_leader : dp_leader))
        continue;
      const int64_t lo = std::max(begin, r.begin), hi = std::min(end, r.end);
      if (lo < hi) pieces.push_back({g + (lo - base), hi - lo});
    }
  }
  // The pieces' sums added in the same order as they were listed (one device wait for all).
  double sum = 0;
  for (double piece : backend_.SumOfSquaresEach(pieces)) sum += piece;
  const float value = static_cast<float>(sum);
  backend_.CopyToDevice(call.Out(0), &value, 4);
}

void RankRunner::RunAdamW(const OpCall& call) { RunOptimizerUpdate(call, true); }
void RankRunner::RunSgd(const OpCall& call) { RunOptimizerUpdate(call, false); }

// AdamW / Sgd: [params bucket, grads bucket, master, exp_avg, exp_avg_sq, nsq].
void RankRunner::RunOptimizerUpdate(const OpCall& call, bool adamw) {
  const auto& train = program_.train;
  const auto& in = call.op.inputs;
  // Operands from the program file: present, and as large as the shard the update touches.
  auto at_least = [&](int32_t buffer, int64_t n, const char* what) {
    if (buffer < 0 || Elements(buffer) < n) {
      throw call.Fail(std::string(what) + " " +
                      (buffer < 0
                           ? std::string("is missing")
                           : "`" + role_.buffers[buffer].name + "` holds " +
                                 std::to_string(Elements(buffer)) + " elements, fewer than the " +
                                 std::to_string(n) + " it updates"));
    }
  };
  const prog::mem::Bucket& bucket = BucketByBuffer(in[0], false);
  const int64_t updated = bucket.shard_elements;
  at_least(in[1], in[1] == bucket.grad_shard ? updated : bucket.elements, "the gradient bucket");
  at_least(in[2], updated, "the master copy");
  if (adamw) {
    at_least(in[3], updated, "exp_avg");
    at_least(in[4], updated, "exp_avg_sq");
  }
  if (in[0] == bucket.param_shard) at_least(bucket.param_shard, updated, "the parameter shard");
  const size_t bi = &bucket - role_.buckets.data();
  const int64_t shard = BucketShardIndex(bi);
  float nsq = 0.0f;
  if (in[5] >= 0) backend_.CopyToHost(&nsq, F(in[5], call.ctx), 4);
  const float clip = train.clip_grad > 0
                         ? static_cast<float>(std::min(
                               1.0, train.clip_grad / (std::sqrt(static_cast<double>(nsq)) + 1e-6)))
                         : 1.0f;
  const int64_t step = call.ctx.step;
  const double lr =
      host::WarmupCosineLr(step, train.warmup_steps, train.steps, train.lr, train.min_lr);
  const int64_t begin = shard * bucket.shard_elements, n = bucket.shard_elements;
  // inputs[0] is the params bucket, or the ZeRO-3 param shard; inputs[1] the grads bucket, or
  // the ZeRO-2/3 grad shard (then element `lo` of the bucket is element `lo - begin` of it).
  float* params = in[0] == bucket.param_shard ? nullptr : F(in[0], call.ctx);
  const int64_t grad_base = in[1] == bucket.grad_shard ? begin : 0;
  const float* grads = F(in[1], call.ctx);
  float* master = F(in[2], call.ctx);
  float* m = F(in[3], call.ctx);
  float* v = F(in[4], call.ctx);
  float* dest = bucket.param_shard >= 0 && program_.parallel.zero >= 3
                    ? F(bucket.param_shard, call.ctx)
                    : params + begin;
  if (!dest) throw call.Fail("optimizer step on a param shard of a bucket that has none");
  std::vector<AdamWTensor> updates;  // AdamW: every param of the shard in one backend call
  for (const Range& r : ranges_[bi]) {
    const int64_t lo = std::max(begin, r.begin), hi = std::min(begin + n, r.end);
    if (lo >= hi) continue;
    const prog::mem::Param& p = role_.params[r.param];
    const float wd = p.decay ? static_cast<float>(train.weight_decay) : 0.0f;
    float* ms = master + (lo - begin);
    if (adamw) {
      updates.push_back({ms, grads + (lo - grad_base), m + (lo - begin), v + (lo - begin), hi - lo,
                         wd, dest + (lo - begin)});
    } else {
      backend_.Sgd(ms, grads + (lo - grad_base), hi - lo, static_cast<float>(lr), wd, clip);
      backend_.Copy(dest + (lo - begin), ms, hi - lo);
    }
  }
  if (!updates.empty()) {
    const host::AdamWConfig cfg{static_cast<float>(lr), static_cast<float>(train.beta1),
                                static_cast<float>(train.beta2), static_cast<float>(train.eps),
                                0.0f};
    backend_.AdamWEach(updates, cfg, step + 1, clip);
  }
}

}  // namespace paraplan::exec
