// RankRunner: one rank's state and its op interpreter.
//
// It owns the rank's Backend allocation (the f32 arena, or one allocation per buffer), its
// communicators (one per CommKind the rank uses), its data sampler, and executes the role's
// schedule and bodies exactly as runtime/format/README.md says. One RankRunner per rank thread;
// nothing in it is shared with other ranks except through communicators. Buffers live in the
// backend's memory (device memory on CUDA): the runner reads or writes them from the host only
// through the backend's copies.
//
// Made by: the interpreter (interpreter.cpp). Read by: the interpreter and checkpoints.
#ifndef PARAPLAN_RUNTIME_EXEC_RANK_RUNNER_H_
#define PARAPLAN_RUNTIME_EXEC_RANK_RUNNER_H_

#include <array>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "runtime/data/token_data.h"
#include "runtime/exec/backend.h"
#include "runtime/exec/interpreter.h"
#include "runtime/exec/program_image.h"
#include "runtime/exec/ring_attention.h"
#include "runtime/format/ops.h"

namespace paraplan::exec {

// A persistent tensor of the rank's training state (what a checkpoint holds).
struct StateTensor {
  std::string name;
  float* data = nullptr;
  int64_t elements = 0;
};

// The local block of a parameter split along one dimension: `outer` × (n_global split into
// parts of n_local, this rank's being `part`) × `inner`, row-major. Local element
// li = (o·n_local + j)·inner + i is global element (o·n_global + part·n_local + j)·inner + i.
struct InitBlock {
  int64_t outer = 1, n_global = 1, n_local = 1, part = 0, inner = 1;
};
// Writes InitValue(seed, key, global index, std) for every local element of `block` into dst,
// on up to `threads` threads; the values do not depend on the thread count.
void InitNormalBlock(float* dst, uint64_t seed, int64_t key, double std, const InitBlock& block,
                     int threads);

class RankRunner {
 public:
  // `init_threads`: threads that may initialise this rank's parameters (values do not depend
  // on it).
  RankRunner(const ProgramImage& program, int rank, CommWorld& world, Backend& backend,
             const data::TokenStream& tokens, const RunOptions& options, int init_threads = 1);
  ~RankRunner();
  // It owns its arena and refers to its own members (schedule_): neither copied nor moved.
  RankRunner(const RankRunner&) = delete;
  RankRunner& operator=(const RankRunner&) = delete;

  // Allocates, joins communicators, initialises parameters and optimizer masters.
  void Setup();
  // Runs the schedule once for training step `step` (from 0).
  void RunStep(int64_t step);

  bool HoldsLoss() const { return loss_buffer_ >= 0; }
  float Loss() const;
  // The mean multi-token-prediction loss of the step (NaN when the role computes none).
  float MtpLoss() const;
  float GradNormSquare() const;  // 0 when the program has no GradNormSquare
  int Rank() const { return rank_; }
  const prog::mem::Rank& RankInfo() const { return program_.ranks[rank_]; }
  const prog::mem::Role& Role() const { return role_; }

  // The persistent training state: per bucket the params bucket, the optimizer buffers and the
  // ZeRO-3 param shard (backend pointers). Checkpoints save and restore exactly these.
  std::vector<StateTensor> State();
  Backend& backend() { return backend_; }
  // Calls fn(param, global_index, value) for every element of every parameter this rank owns
  // in its fp32 master shard.
  template <typename Fn>
  void ForEachMasterElement(Fn fn);
  // The row-major index in the unsharded tensor of element `local` of this rank's shard of p.
  int64_t GlobalIndex(const prog::mem::Param& p, int64_t local) const;

  double cpu_seconds = 0, kernel_seconds = 0, comm_seconds = 0;

 private:
  struct Comm {
    std::unique_ptr<comm::Communicator> comm;
    int index = 0, size = 1;
  };
  struct Range {
    int64_t begin, end;  // elements in the bucket
    int32_t param;
  };
  struct Context {
    int64_t step = 0, microbatch = 0;
    int32_t slot = 0;
  };

  float* F(int32_t buffer, const Context& ctx) const;
  int32_t* I(int32_t buffer, const Context& ctx) const {
    return reinterpret_cast<int32_t*>(F(buffer, ctx));
  }
  int64_t Elements(int32_t buffer) const { return role_.buffers[buffer].Elements(); }
  const Comm& CommOf(CommKind kind, const char* what) const;
  int IndexIn(CommKind kind) const;
  int64_t ShardIndex() const;
  // The shard of bucket `b` this rank owns under ZeRO: ShardIndex(), or for a bucket of
  // expert-parallel params (split over Ep) the rank's index in Edp; 0 without ZeRO.
  int64_t BucketShardIndex(size_t b) const;

  void RunSchedule(int64_t step);
  void RunBody(int32_t body, const Context& ctx);
  void Transfer(const prog::mem::Op& op, bool send);

  // One body op being run: its operands as backend pointers and the checks every handler needs
  // (rank_ops.cpp). The loader's CheckOp (runtime/format/ops.h) guarantees the operand counts of
  // the registry and that every operand names a buffer, or -1 where the registry allows none;
  // sizes, which depend on the buffers' shapes and the model, are checked here.
  class OpCall {
   public:
    OpCall(RankRunner& runner, const prog::mem::Op& op, const Context& ctx, const std::string& body)
        : op(op), ctx(ctx), runner_(runner), body_(body) {}
    const prog::mem::Op& op;
    const Context& ctx;

    template <typename A>
    A Attrs() const {
      return prog::DecodeAttrs<A>(op);
    }
    float* In(size_t i) const { return runner_.F(op.inputs[i], ctx); }
    int32_t* Ids(size_t i) const { return runner_.I(op.inputs[i], ctx); }
    int32_t* OutIds(size_t i) const { return runner_.I(op.outputs[i], ctx); }
    // Output i; nullptr when the op has no such output or it names no buffer (-1).
    float* Out(size_t i) const;
    int64_t InN(size_t i) const { return runner_.Elements(op.inputs[i]); }
    int64_t OutN(size_t i) const { return runner_.Elements(op.outputs[i]); }
    const prog::mem::Buffer& InBuf(size_t i) const;
    const prog::mem::Buffer& OutBuf(size_t i) const;
    RunError Fail(const std::string& what) const;
    void Need(bool ok, const std::string& what) const;
    // Products of sizes from the file, checked for overflow; a divisor must be positive.
    int64_t Mul(std::initializer_list<int64_t> factors) const;
    int64_t Div(int64_t a, int64_t b) const;
    // Operand i holds at least n elements (-1 is accepted for an output when `optional`).
    void Input(size_t i, int64_t n) const;
    void Output(size_t i, int64_t n, bool optional = false) const;
    // Row offset of op.comm for a buffer with `rows` rows (0 without a communicator).
    int64_t RowOffset(int64_t rows) const;

   private:
    RankRunner& runner_;
    const std::string& body_;
  };
  // The handler of every body op the registry lets the runtime run (runtime/format/ops.def):
  // collectives and optimizer ops in rank_runner.cpp, the others in rank_ops.cpp.
  using Handler = void (RankRunner::*)(const OpCall& call);
  static Handler HandlerOf(OpKind kind);
#define PARAPLAN_DECLARE_kEmitted(cls, Kind) PARAPLAN_DECLARE_##cls(Kind)
#define PARAPLAN_DECLARE_kRuntimeOnly(cls, Kind) PARAPLAN_DECLARE_##cls(Kind)
#define PARAPLAN_DECLARE_kReserved(cls, Kind)
#define PARAPLAN_DECLARE_kSchedule(Kind)
#define PARAPLAN_DECLARE_kCollective(Kind) void Run##Kind(const OpCall& call);
#define PARAPLAN_DECLARE_kCompute(Kind) void Run##Kind(const OpCall& call);
#define PARAPLAN_OP(Kind, cls, status, in, out, comms, backend, fields) \
  PARAPLAN_DECLARE_##status(cls, Kind)
#include "runtime/format/ops.def"
#undef PARAPLAN_OP
#undef PARAPLAN_DECLARE_kEmitted
#undef PARAPLAN_DECLARE_kRuntimeOnly
#undef PARAPLAN_DECLARE_kReserved
#undef PARAPLAN_DECLARE_kSchedule
#undef PARAPLAN_DECLARE_kCollective
#undef PARAPLAN_DECLARE_kCompute
  // Shared by the handlers of similar ops.
  void RunOptimizerUpdate(const OpCall& call, bool adamw);
  void RunRopeOp(const OpCall& call, const prog::attrs::Rope& a, bool forward);
  // --- context parallelism: the learned positions of the rank's rows (rank_ops.cpp) ---
  template <typename Fn>
  void ForEachCpPositionRun(const OpCall& call, int64_t rows, int64_t seq, const Fn& fn) const;
  void RunAttentionOp(const OpCall& call, const prog::attrs::Attention& a, bool forward);
  void RunRingAttentionOp(const OpCall& call, const RingAttentionShape& s, bool forward);
  // Backward ops with dx_accumulate: compute into scratch, then add.
  float* GradTarget(float* dx, int64_t n, bool accumulate);
  void GradFinish(float* dx, int64_t n, bool accumulate);
  void InitParams();
  const prog::mem::Bucket& BucketByBuffer(int32_t buffer, bool grads) const;
  double Now() const;

  const ProgramImage& program_;
  const prog::mem::Role& role_;
  // A schedule in loop form, expanded for this rank alone (empty when the role lists its ops).
  std::vector<prog::mem::Op> expanded_;
  // The schedule this rank runs: the role's ops, or expanded_.
  const std::vector<prog::mem::Op>& schedule_;
  int rank_;
  CommWorld& world_;
  Backend& backend_;
  const data::TokenStream& tokens_;
  const RunOptions& options_;
  int init_threads_;
  std::unique_ptr<data::Sampler> sampler_;
  std::array<Comm, prog::kCommKinds> comms_;
  std::vector<void*> allocations_;
  std::vector<char*> base_;                 // per buffer: slot 0
  std::vector<int64_t> slot_stride_;        // per buffer: bytes between slots (0 unless Stash)
  std::vector<std::vector<Range>> ranges_;  // per bucket: its params, by element range
  // Device scratch (backend memory) for in-place collectives and accumulated gradients.
  float* Scratch(int which, int64_t elements);
  std::array<float*, 2> scratch_{};
  std::array<int64_t, 2> scratch_elements_{};
  std::vector<int32_t> tokens_in_, tokens_out_;  // host staging of a microbatch
  int32_t loss_buffer_ = -1, norm_buffer_ = -1;
  int32_t mtp_loss_buffer_ = -1;  // the second cross-entropy loss buffer (multi-token prediction)
  int64_t step_ = 0;
};

template <typename Fn>
void RankRunner::ForEachMasterElement(Fn fn) {
  for (size_t b = 0; b < role_.buckets.size(); ++b) {
    const auto& bucket = role_.buckets[b];
    const int64_t shard = BucketShardIndex(b);
    const int64_t begin = bucket.master >= 0 ? shard * bucket.shard_elements : 0;
    const int64_t end = bucket.master >= 0 ? begin + bucket.shard_elements : bucket.elements;
    std::vector<float> host(static_cast<size_t>(end - begin));
    backend_.CopyToHost(host.data(),
                        bucket.master >= 0 ? F(bucket.master, {}) : F(bucket.params, {}),
                        (end - begin) * 4);
    const float* master = host.data();
    for (const Range& r : ranges_[b]) {
      for (int64_t e = std::max(begin, r.begin); e < std::min(end, r.end); ++e) {
        fn(role_.params[r.param], e - r.begin, master[e - begin]);
      }
    }
  }
}

}  // namespace paraplan::exec

#endif  // PARAPLAN_RUNTIME_EXEC_RANK_RUNNER_H_
