// Lowering entry point (see lower.h).
#include "compiler/lower/lower.h"

#include <fmt/format.h>

#include <algorithm>
#include <deque>
#include <map>
#include <set>

#include "compiler/analyze/memory.h"
#include "compiler/analyze/memory_check.h"
#include "compiler/analyze/slot_pool.h"
#include "compiler/lower/body.h"
#include "compiler/lower/memory_plan.h"
#include "compiler/lower/schedule.h"
#include "compiler/lower/schedule_loops.h"
#include "runtime/format/ops.h"
#include "runtime/verify/verify.h"

namespace paraplan::lower {

namespace {

// The schedule the program runs: interleaved_1f1b with one chunk per stage is plain 1F1B
// (P0413 says so; Megatron-Core runs it so).
prog::ScheduleKind ToScheduleKind(Schedule s, int64_t vpp) {
  switch (s) {
    case Schedule::kGpipe:
      return prog::ScheduleKind::Gpipe;
    case Schedule::k1F1B:
      return prog::ScheduleKind::OneFOneB;
    case Schedule::kInterleaved1F1B:
      return vpp < 2 ? prog::ScheduleKind::OneFOneB : prog::ScheduleKind::Interleaved1F1B;
  }
  return prog::ScheduleKind::OneFOneB;
}

prog::Precision ToPrecision(Precision p) {
  switch (p) {
    case Precision::kBf16:
      return prog::Precision::Bf16;
    case Precision::kFp16:
      return prog::Precision::Fp16;
    case Precision::kFp32:
      return prog::Precision::Fp32;
    case Precision::kFp8:
      return prog::Precision::Fp8;
  }
  return prog::Precision::Bf16;
}

// What each pipeline stage holds on the GPU beside its arena, by the arena model: the CUDA context
// and the NCCL communicators. Empty when the plan states no GPU memory (nothing is checked).
std::vector<int64_t> RuntimeReserves(const Plan& plan) {
  std::vector<int64_t> reserves;
  if (plan.cluster.gpu.memory <= 0) return reserves;
  Plan as_planrun = plan;
  as_planrun.framework = Framework::kParaplan;
  const MemoryEstimate est = EstimateMemory(as_planrun);
  if (!est.valid) return reserves;
  for (const StageMemory& s : est.stages)
    reserves.push_back(s.Get(MemoryPart::kRuntimeReserve) + s.Get(MemoryPart::kCommBuffers));
  return reserves;
}

// The role whose arena (`bytes`: the precision arena's peak or the f32 placement), with its
// stage's reserve beside it, is the largest over the GPU's memory; role = nullptr when every role
// fits.
struct StageOver {
  const Role* role = nullptr;
  int64_t total = 0, reserve = 0;
};
StageOver LargestOverCapacity(const Plan& plan, const Program& program,
                              const std::vector<int64_t>& reserves,
                              int64_t prog::mem::Role::*bytes) {
  StageOver worst;
  for (const Role& role : program.roles) {
    const size_t r = static_cast<size_t>(role.pipeline_rank);
    const int64_t reserve = r < reserves.size() ? reserves[r] : 0;
    const int64_t total = role.*bytes + reserve;
    if (total > plan.cluster.gpu.memory && total > worst.total) worst = {&role, total, reserve};
  }
  return worst;
}

// Every role's static arena, with the CUDA context and NCCL communicators beside it, must fit the
// GPU: planrun allocates the arena whole at start. Reports P0701 with the arena's breakdown.
bool ArenaFits(const Plan& plan, const Program& program, const std::vector<int64_t>& reserves,
               DiagnosticSink& sink) {
  const int64_t capacity = plan.cluster.gpu.memory;
  if (capacity <= 0) return true;
  const StageOver over = LargestOverCapacity(plan, program, reserves, &prog::mem::Role::peak_bytes);
  const Role* worst = over.role;
  const int64_t worst_total = over.total, worst_reserve = over.reserve;
  if (!worst) return true;
  const MemoryBreakdown b = MeasureMemory(*worst);
  const std::string gpu =
      plan.cluster.gpu.name.empty() ? std::string("the GPU") : plan.cluster.gpu.name;
  Diag d(DiagKind::kStageOutOfMemory,
         fmt::format("the program of pipeline stage {} needs {} per GPU; `{}` has {}",
                     worst->pipeline_rank, FormatGiB(worst_total), gpu, FormatGiB(capacity)));
  d.At(plan.declaration,
       fmt::format("stage {}'s arena is {}", worst->pipeline_rank, FormatGiB(worst->peak_bytes)));
  d.Value("parameters", FormatGiB(b.params))
      .Value("gradients", FormatGiB(b.grads))
      .Value("optimizer state", FormatGiB(b.optimizer))
      .Value("stashed activations", FormatGiB(b.stash))
      .Value("scratch and transient buckets", FormatGiB(b.body_peak))
      .Value("CUDA context and NCCL", FormatGiB(worst_reserve));
  d.Note(
      "the program lays each rank's static arena out whole in its precision; `planc check` "
      "estimates the same arena (`framework = paraplan`); planrun's backends hold it in f32, "
      "larger still (P0805)");
  if (UsesFp8(plan))
    d.Note(
        "the program lays FP8 plans out in bf16: it stashes every activation in 2 bytes where "
        "Transformer Engine keeps the inputs of its FP8 GEMMs in 1, so this arena is larger than "
        "the plan's own framework needs");
  d.Help("`planc check` with `framework = paraplan` offers the changes that fit");
  sink.Report(std::move(d));
  return false;
}

// planrun's host and CUDA backends keep every floating-point element in f32 (the f32 placement,
// Role.fp32_arena_bytes), about twice the program's precision arena under bf16. Warns (P0805)
// when a stage's f32 arena, with the CUDA context and NCCL beside it, does not fit the GPU: the
// program is valid and fits a backend that stores its precision, but `planrun --backend=cuda`
// cannot allocate it on this GPU.
void WarnF32Arena(const Plan& plan, const Program& program, const std::vector<int64_t>& reserves,
                  DiagnosticSink& sink) {
  if (plan.cluster.gpu.memory <= 0 || plan.precision == Precision::kFp32) return;
  // `planc check` said so already (framework = paraplan: its estimate of the same arena).
  for (const Diagnostic& d : sink.diagnostics())
    if (d.kind == DiagKind::kLowerF32Arena) return;
  const StageOver over =
      LargestOverCapacity(plan, program, reserves, &prog::mem::Role::fp32_arena_bytes);
  const Role* worst = over.role;
  const int64_t worst_total = over.total;
  if (!worst) return;
  sink.Report(
      F32ArenaWarning(plan, worst->pipeline_rank, worst_total,
                      fmt::format("stage {}'s arena is {} in f32, {} in {}", worst->pipeline_rank,
                                  FormatGiB(worst->fp32_arena_bytes), FormatGiB(worst->arena_bytes),
                                  ToString(plan.precision))));
}

// An FP8 plan lowers with its tensors laid out in bf16 (the program's precision record says
// Fp8; planrun's backends run the GEMMs with bf16 operands): P0806 says so, with the recipe.
void NoteFp8AsBf16(const Plan& plan, DiagnosticSink& sink) {
  if (!UsesFp8(plan)) return;
  const MixedPrecisionSpec mp = EffectiveMixedPrecision(plan);
  const OriginKind origin = plan.Origin(fields::kMixedPrecisionFp8).kind;
  const bool stated = origin == OriginKind::kFile || origin == OriginKind::kCommandLine;
  Diag d(DiagKind::kLowerFp8AsBf16,
         "this FP8 plan's program holds its activations and weights in bf16");
  d.At(stated ? plan.Range(fields::kMixedPrecisionFp8) : plan.Range(fields::kPrecision),
       stated ? "the FP8 recipe" : "FP8 training")
      .Note(fmt::format("planrun runs the GEMMs with bf16 operands; the {} scaling recipe does "
                        "not change the program",
                        ToString(mp.fp8)));
  if (mp.fp8_params)
    d.Note(
        "its FP8 parameters (`mixed_precision.fp8_params`) are held in bf16 too: 2 bytes a "
        "weight where Megatron-Core keeps 1");
  d.Note(
      "`planc check` and `planc explain` price the plan as its framework runs FP8 "
      "(`framework`)");
  sink.Report(std::move(d));
}

// Reports P0801 for each feature the plan asks for that lowering does not emit yet.
class UnsupportedFeatures {
 public:
  UnsupportedFeatures(const Plan& plan, DiagnosticSink& sink) : plan_(plan), sink_(sink) {}

  void Report(std::string what, std::string_view path, std::string help) {
    sink_.Report(
        Diag(DiagKind::kLowerUnsupported, fmt::format("lowering does not emit {} yet", what))
            .At(plan_.Range(path), "set here")
            .Note("the program format reserves ops for it (runtime/format/README.md, reserved "
                  "ops); the runtime cannot run it yet")
            .Help(std::move(help)));
    ok_ = false;
  }
  bool ok() const { return ok_; }

 private:
  const Plan& plan_;
  DiagnosticSink& sink_;
  bool ok_ = true;
};

// Model layers and parallel dimensions.
void CheckEmittedModel(const Plan& plan, UnsupportedFeatures& unsupported) {
  const ModelSpec& m = plan.model;
  const ParallelSpec& q = plan.parallel;
  // --- mixture of experts: emitted with etp = 1 or etp = tp, each beside ep > 1 (expert
  // parallelism, below) ---
  // --- expert tensor parallelism: each expert split over the Tp group, as the dense MLP ---
  if (m.IsMoe() && q.etp > 1 && q.etp != q.tp)
    unsupported.Report(
        fmt::format("experts split by tensor parallelism over etp = {} ranks, other than tp = {}",
                    q.etp, q.tp),
        "parallel.etp",
        fmt::format("set `parallel.etp = {}` (each expert split as the dense MLP) or "
                    "`parallel.etp = 1` (experts whole on every rank); `planc check` and "
                    "`planc explain` analyse etp = {}",
                    q.tp, q.etp));
  // --- end expert tensor parallelism ---
  // (A capacity factor is emitted beside every layout above: under expert tensor parallelism with
  // sequence parallelism each rank drops past the capacity of its own rows, one segment of the
  // Etp group's gathered rows; body_moe.cpp DropPastCapacity.)
  // --- end mixture of experts ---
  // --- multi-head latent attention: emitted beside tp, sp, pp and cp ---
  if (m.IsMla() && m.position != Position::kRope)
    unsupported.Report("multi-head latent attention without rotary positions", "model.position",
                       "set `model.position = rope` (its decoupled RoPE)");
  if (m.IsMla() && m.v_head_dim > m.qk_nope_head_dim + m.qk_rope_head_dim)
    unsupported.Report(
        fmt::format("multi-head latent attention with v_head_dim = {} > qk_nope_head_dim + "
                    "qk_rope_head_dim = {} (values are padded to the query/key head size)",
                    m.v_head_dim, m.qk_nope_head_dim + m.qk_rope_head_dim),
        "model.v_head_dim", "set `model.v_head_dim` to at most the query/key head size");
  if (m.IsMla() && m.qk_rope_head_dim % 2 != 0)
    unsupported.Report(fmt::format("multi-head latent attention with an odd qk_rope_head_dim = {}",
                                   m.qk_rope_head_dim),
                       "model.qk_rope_head_dim", "RoPE rotates pairs of columns: make it even");
  // --- end multi-head latent attention ---
  // --- expert parallelism: ep > 1 lowers with any ZeRO stage, and beside tp > 1 with sequence
  // parallelism or with the experts split over the Tp group (etp = tp: the group's ranks hold
  // the same rows and each dispatches them to the Ep peers of its Etp index) ---
  if (m.IsMoe() && q.ep > 1 && q.tp > 1 && !q.sp && q.etp != q.tp)
    unsupported.Report(
        fmt::format("expert parallelism (ep = {}) beside tp = {} without sequence parallelism "
                    "(etp = {})",
                    q.ep, q.tp, q.etp),
        "parallel.ep",
        fmt::format("set `parallel.sp = true`: each tensor-parallel rank then routes its own "
                    "rows, as Megatron-Core requires for experts beside tensor parallelism; or "
                    "`parallel.etp = {}` (each expert split over the Tp group)",
                    q.tp));
  if (!m.IsMoe() && q.ep > 1)
    unsupported.Report(
        fmt::format("expert parallelism (ep = {}) for a model without experts", q.ep),
        "parallel.ep", "set `parallel.ep = 1`");
  // --- end expert parallelism ---
  if (m.qk_norm && m.IsMla())
    unsupported.Report("query/key normalisation with multi-head latent attention", "model.qk_norm",
                       "latent attention normalises its latents instead: set `model.qk_norm = "
                       "false`");
  // Multi-token prediction: Megatron-Core's modules look the shifted tokens up in the embedding
  // with its position table; lowering emits them beside rotary positions.
  if (m.mtp_layers > 0 && m.position == Position::kLearned)
    unsupported.Report(
        fmt::format("multi-token prediction ({} modules) beside learned positions", m.mtp_layers),
        "model.mtp_layers", "set `model.mtp_layers = 0`, or `model.position = rope`");
}

// Mixed-precision fields: only what the `precision` shorthand implies.
void CheckEmittedPrecision(const Plan& plan, UnsupportedFeatures& unsupported) {
  const MixedPrecisionSpec mp = EffectiveMixedPrecision(plan);
  // What the shorthand alone implies: no field written, every field at its default.
  const MixedPrecisionSpec shorthand = EffectiveMixedPrecision([&] {
    Plan only = plan;
    only.origins = {};
    only.mixed_precision = MixedPrecisionSpec{};
    return only;
  }());
  // The gradients lower in any 16- or 32-bit type (BodyShape::grad_type). The FP8 recipe and FP8
  // parameters change nothing in the program: it lays an FP8 plan out in bf16 (P0806 says so;
  // without `precision = fp8` they have no effect at all, P0517).
  const bool grads = mp.grads == ElementType::kFp32 || mp.grads == ElementType::kBf16 ||
                     mp.grads == ElementType::kFp16;
  const std::pair<const char*, bool> fields[] = {
      {"mixed_precision.params", mp.params == shorthand.params},
      {"mixed_precision.grads", grads},
      {"mixed_precision.main_params", mp.main_params == shorthand.main_params},
      {"mixed_precision.optimizer_state", mp.optimizer_state == shorthand.optimizer_state}};
  for (const auto& [field, lowered] : fields)
    if (!lowered)
      unsupported.Report(fmt::format("`{}` other than what `precision = {}` implies", field,
                                     ToString(plan.precision)),
                         field, "remove it and keep the `precision` shorthand to compile");
}

// Activation memory options, optimizer offload and sharding.
void CheckEmittedMemoryOptions(const Plan& plan, UnsupportedFeatures& unsupported) {
  // Selective recompute lowers every module Megatron-Core names (RecomputeModuleNames); the
  // activations it keeps stay on the device.
  if (plan.activations.offload_layers > 0)
    unsupported.Report("activation offload (planrun keeps the activations on the device)",
                       "activations.offload_layers",
                       "set `activations.offload_layers = 0`; recompute (`selective` with its "
                       "modules, or `full`) saves the memory instead");
  // planrun keeps the fp32 master weights and Adam moments in the rank's arena: a program
  // compiled from an offloading plan would need the device memory the plan was checked without.
  if (plan.optimizer.offload == Offload::kCpu)
    unsupported.Report(
        "the optimizer offloaded to the host (planrun keeps its state on the device)",
        plan.optimizer.offload_fraction < 1 ? "optimizer.offload_fraction" : "optimizer.offload",
        "set `optimizer.offload = none` to compile; `planc check` and `planc "
        "explain` price the offload as DeepSpeed and Megatron-Core run it");
}

// Tensor shapes lowering must split evenly; reports P0803.
bool CheckLowerableShapes(const Plan& plan, DiagnosticSink& sink) {
  const ModelSpec& m = plan.model;
  const ParallelSpec& q = plan.parallel;
  bool ok = true;
  auto divide = [&](std::string_view what, int64_t value, std::string_view path, int64_t by,
                    std::string_view by_name) {
    if (by > 0 && value % by == 0) return;
    sink.Report(
        Diag(DiagKind::kLowerShape,
             fmt::format("{} = {} is not a multiple of {} = {}", what, value, by_name, by))
            .At(plan.Range(path))
            .Value(fmt::format("{} mod {}", what, by_name),
                   fmt::format("{} mod {} = {}", value, by, by ? value % by : 0))
            .Note(fmt::format(
                "every rank of a tensor-parallel group holds an equal share of the {}", what))
            .Help(fmt::format("choose a tp that divides {}", value)));
    ok = false;
  };
  divide("heads", m.heads, "model.heads", q.tp, "tp");
  divide("kv_heads", m.kv_heads, "model.kv_heads", q.tp, "tp");
  divide("ffn_hidden", m.ffn_hidden, "model.ffn_hidden", q.tp, "tp");
  // --- expert tensor parallelism: each expert's ffn split over etp ---
  if (m.IsMoe() && q.etp > 1)
    divide("moe_ffn_hidden", m.ExpertFfn(),
           m.moe_ffn_hidden > 0 ? "model.moe_ffn_hidden" : "model.ffn_hidden", q.etp, "etp");
  // --- end expert tensor parallelism ---
  if (m.IsMoe() && m.shared_experts > 0)  // mixture of experts: shared experts split like the MLP
    divide("shared_experts · moe_ffn_hidden", m.shared_experts * (m.ExpertFfn()),
           "model.shared_experts", q.tp, "tp");
  // --- expert parallelism: each Ep rank holds experts / ep experts ---
  if (m.IsMoe() && q.ep > 1 && m.experts % q.ep != 0) {
    sink.Report(Diag(DiagKind::kLowerShape,
                     fmt::format("experts = {} is not a multiple of ep = {}", m.experts, q.ep))
                    .At(plan.Range("parallel.ep"))
                    .Value("experts mod ep",
                           fmt::format("{} mod {} = {}", m.experts, q.ep, m.experts % q.ep))
                    .Note("rank r of an expert-parallel group holds experts r·E/ep .. (r+1)·E/ep-1")
                    .Help(fmt::format("choose an ep that divides {}", m.experts)));
    ok = false;
  }
  // --- end expert parallelism ---
  // --- context parallelism: 2·cp equal chunks per sequence ---
  if (q.cp > 1 && m.seq_len % (2 * q.cp) != 0) {
    sink.Report(Diag(DiagKind::kLowerShape,
                     fmt::format("seq_len = {} does not cut into 2 · cp = {} equal chunks",
                                 m.seq_len, 2 * q.cp))
                    .At(plan.Range("parallel.cp"))
                    .Value("seq_len mod 2·cp", fmt::format("{} mod {} = {}", m.seq_len, 2 * q.cp,
                                                           m.seq_len % (2 * q.cp)))
                    .Note("context-parallel rank r holds chunks r and 2·cp-1-r of every sequence")
                    .Help(fmt::format("make seq_len a multiple of {}", 2 * q.cp)));
    ok = false;
  }
  // --- end context parallelism ---
  if (q.sp && q.tp > 1) {
    int64_t tokens = plan.batch.micro * (m.seq_len / std::max<int64_t>(q.cp, 1));
    if (tokens % q.tp != 0) {
      sink.Report(
          Diag(DiagKind::kLowerShape, fmt::format("micro · seq_len = {} · {} = {} tokens do not "
                                                  "split across tp = {} under sequence parallelism",
                                                  plan.batch.micro, m.seq_len, tokens, q.tp))
              .At(plan.Range("parallel.sp"))
              .Note(
                  "with sp each tensor-parallel rank holds tokens / tp rows of the residual stream")
              .Help("make micro · seq_len a multiple of tp, or set `parallel.sp = false`"));
      ok = false;
    }
  }
  if (m.head_dim <= 0 || m.hidden <= 0 || m.seq_len <= 0 || m.vocab <= 0 || m.layers <= 0) {
    sink.Report(Diag(DiagKind::kLowerShape,
                     "the model has a size <= 0 (hidden, head_dim, seq_len, vocab or layers)")
                    .Note("lowering needs every tensor shape")
                    .Help("give the model its full shape"));
    ok = false;
  }
  return ok;
}

// Checks the plan against what lowering emits; reports P0801/P0803 and returns false on errors.
bool CheckLowerable(const Plan& plan, DiagnosticSink& sink) {
  UnsupportedFeatures unsupported(plan, sink);
  CheckEmittedModel(plan, unsupported);
  CheckEmittedPrecision(plan, unsupported);
  CheckEmittedMemoryOptions(plan, unsupported);
  if (!unsupported.ok()) return false;
  return CheckLowerableShapes(plan, sink);
}

// Whether `op` is the last use of its (microbatch, chunk)'s stash slot: its SendGrad, or the
// Backward of the first virtual stage (which sends no gradient).
bool LastSlotUse(const Op& op, const Chunk& chunk) {
  return op.kind == OpKind::SendGrad || (op.kind == OpKind::Backward && chunk.stage == 0);
}

// Slots: a (microbatch, chunk) takes a free slot of its chunk at its first transfer or forward
// (a receive into a landing buffer takes none: its microbatch takes its slot at the forward,
// and the receive names that slot too) and gives it back after its last use (its SendGrad, or
// its Backward on the first stage), once the transfer group that used it has completed. A step
// of few microbatches takes the lowest free slot; with `fifo` (a step of many microbatches,
// whose schedule is held in loop form) the slot freed longest ago, so that the slots of the
// steady state rotate with a fixed stride per period (lowest-free drifts from one period to the
// next). Both use as many slots. `landing`: per chunk, its landing buffer or -1.
void AssignSlots(Role& role, bool fifo, const std::vector<int32_t>& landing) {
  int32_t nc = static_cast<int32_t>(role.chunks.size());
  // Per chunk and slot: 0 free, 1 busy, 2 freed inside the current transfer group (its grad
  // buffer may still be read by a send of this group; its input buffer is free).
  std::vector<std::vector<uint8_t>> state(nc);
  // fifo: per chunk, the free slots in the order they were freed, and those freed inside the
  // current group.
  std::vector<std::deque<int32_t>> free_order(nc), freed_in_group(nc);
  std::map<std::pair<int64_t, int64_t>, int32_t> slot_of;  // (mb, chunk) -> slot
  std::vector<std::pair<int64_t, int32_t>> freed;  // (chunk, slot) set to 2 since the last flush
  int64_t current_group = 0;
  auto flush = [&]() {
    for (auto [c, slot] : freed)
      if (state[c][slot] == 2) state[c][slot] = 0;
    freed.clear();
    for (int32_t c = 0; c < nc; ++c) {
      for (int32_t slot : freed_in_group[c]) free_order[c].push_back(slot);
      freed_in_group[c].clear();
    }
  };
  // Receives into a landing buffer whose microbatch has not taken its slot yet.
  std::map<std::pair<int64_t, int64_t>, size_t> landed;  // (mb, chunk) -> schedule index
  for (size_t oi = 0; oi < role.schedule.size(); ++oi) {
    Op& op = role.schedule[oi];
    bool p2p = IsP2p(op.kind);
    const prog::StepAttrs step = prog::DecodeStepAttrs(op);
    int64_t group = p2p ? step.group : 0;
    if (!p2p || group == 0 || group != current_group) flush();
    current_group = group;
    if (op.kind != OpKind::Forward && op.kind != OpKind::Backward && !p2p) continue;
    int64_t mb = step.microbatch, c = step.chunk;
    auto key = std::make_pair(mb, c);
    if (op.kind == OpKind::RecvActivation && landing[c] >= 0) {
      landed[key] = oi;
      continue;
    }
    auto it = slot_of.find(key);
    int32_t slot;
    if (it == slot_of.end()) {
      auto& v = state[c];
      // A receive of an activation may take a slot freed in its own group; nothing else may.
      bool take_freed = op.kind == OpKind::RecvActivation;
      if (fifo) {
        auto& order = free_order[c];
        auto& in_group = freed_in_group[c];
        if (!order.empty()) {
          slot = order.front();
          order.pop_front();
        } else if (take_freed && !in_group.empty()) {
          slot = in_group.front();
          in_group.pop_front();
        } else {
          slot = static_cast<int32_t>(v.size());
          v.push_back(0);
        }
        v[slot] = 1;
      } else {
        auto free = std::find_if(v.begin(), v.end(),
                                 [&](uint8_t x) { return x == 0 || (take_freed && x == 2); });
        slot = static_cast<int32_t>(free - v.begin());
        if (free == v.end())
          v.push_back(1);
        else
          *free = 1;
      }
      slot_of[key] = slot;
      if (auto l = landed.find(key); l != landed.end()) {
        prog::SetStepSlot(role.schedule[l->second], slot);
        landed.erase(l);
      }
    } else {
      slot = it->second;
    }
    prog::SetStepSlot(op, slot);
    if (LastSlotUse(op, role.chunks[c])) {
      slot_of.erase(key);
      state[c][slot] = 2;
      freed.emplace_back(c, slot);
      if (fifo) freed_in_group[c].push_back(slot);
      if (!p2p || group == 0) flush();
    }
  }
  for (int32_t c = 0; c < nc; ++c)
    role.chunks[c].slots = std::max<int32_t>(1, static_cast<int32_t>(state[c].size()));
}

// Per schedule position, the last position of its transfer group (itself for an op alone).
std::vector<int64_t> GroupEnds(const std::vector<Op>& schedule) {
  std::vector<int64_t> end(schedule.size());
  int64_t next_group = 0;
  for (size_t i = schedule.size(); i-- > 0;) {
    end[i] = static_cast<int64_t>(i);
    const int64_t group = IsP2p(schedule[i].kind) ? prog::DecodeStepAttrs(schedule[i]).group : 0;
    if (group != 0 && group == next_group) end[i] = end[i + 1];
    next_group = group;
  }
  return end;
}

// The slots the role's microbatches hold, as AssignSlots takes and frees them: from the first
// slotted op of a (microbatch, chunk) (not a receive into a landing buffer) through the transfer
// group of its last use.
std::vector<SlotUse> SlotUses(const Role& role, const std::vector<int32_t>& landing) {
  const std::vector<int64_t> ends = GroupEnds(role.schedule);
  std::vector<SlotUse> uses;
  std::map<std::pair<int64_t, int64_t>, size_t> open;  // (mb, chunk) -> its use
  for (size_t oi = 0; oi < role.schedule.size(); ++oi) {
    const Op& op = role.schedule[oi];
    if (op.kind != OpKind::Forward && op.kind != OpKind::Backward && !IsP2p(op.kind)) continue;
    const prog::StepAttrs step = prog::DecodeStepAttrs(op);
    if (op.kind == OpKind::RecvActivation && landing[step.chunk] >= 0) continue;
    const auto key = std::make_pair(step.microbatch, step.chunk);
    auto it = open.find(key);
    if (it == open.end()) {
      SlotUse u;
      u.chunk = static_cast<int32_t>(step.chunk);
      u.microbatch = step.microbatch;
      u.take = static_cast<int64_t>(oi);
      u.recv_take = op.kind == OpKind::RecvActivation;
      it = open.emplace(key, uses.size()).first;
      uses.push_back(u);
    }
    if (LastSlotUse(op, role.chunks[step.chunk])) {
      uses[it->second].free = static_cast<int64_t>(oi);
      uses[it->second].release = ends[oi];
      open.erase(it);
    }
  }
  return uses;
}

// How a role's chunks may pool their slots: the microbatches of one period of the steady state
// (the pool's slots advance by one stride per period; 0: no pool) and each chunk's frame
// (StashFrames of the role whose buffers the schedule's samples do not hold).
struct SlotPooling {
  int32_t period = 0;
  std::vector<int64_t> frames;
};

// The role's chunks in one slot pool where that takes fewer stash bytes than their own slots
// (AssignSlots' counts): the pooled chunks' steps take the pool's slots.
void PoolChunkSlots(Role& role, const std::vector<int32_t>& landing, const SlotPooling& pooling) {
  if (role.chunks.size() < 2 || pooling.period < 1) return;
  const std::vector<SlotUse> uses = SlotUses(role, landing);
  const std::optional<PoolChoice> choice =
      ChooseSlotPool(pooling.frames, prog::mem::ChunkSlots(role),
                     [&](const std::vector<bool>& pooled, int32_t max_slots) {
                       return AssignPoolSlots(PooledUses(uses, pooled), pooling.period, max_slots);
                     });
  if (!choice) return;
  std::map<std::pair<int64_t, int64_t>, int32_t> slot_of;  // the pooled uses, in PooledUses' order
  size_t k = 0;
  for (const SlotUse& u : uses)
    if (choice->pooled[u.chunk]) slot_of[{u.microbatch, u.chunk}] = choice->slots.slot_of[k++];
  for (Op& op : role.schedule) {
    if (op.kind != OpKind::Forward && op.kind != OpKind::Backward && !IsP2p(op.kind)) continue;
    const prog::StepAttrs step = prog::DecodeStepAttrs(op);
    if (choice->pooled[step.chunk])
      prog::SetStepSlot(op, slot_of.at({step.microbatch, step.chunk}));
  }
  for (Chunk& c : role.chunks) {
    if (!choice->pooled[c.index]) continue;
    c.slots = choice->slots.slots;
    c.pool = 0;
  }
}

// AssignSlots, then the chunks' pool (PoolChunkSlots).
void AssignRoleSlots(Role& role, bool fifo, const std::vector<int32_t>& landing,
                     const SlotPooling& pooling) {
  AssignSlots(role, fifo, landing);
  PoolChunkSlots(role, landing, pooling);
}

void BuildSchedule(const std::vector<PipelineStep>& steps, const StepBodies& sb,
                   const ParallelConfig& par, const std::vector<int32_t>& landing, Role& role,
                   const std::vector<int32_t>& grad_landing = {}) {
  namespace attrs = prog::attrs;
  std::vector<Op>& out = role.schedule;
  // A schedule holds every microbatch's ops (hundreds of thousands in a large world): exact
  // capacities keep it from carrying the slack of growth.
  out.reserve(steps.size() + 3);
  out.push_back(prog::MakeOp(attrs::ZeroGrads{.body = sb.zero_grads}, {}, {}));
  for (const PipelineStep& st : steps) {
    const Chunk& c = role.chunks[st.chunk];
    // Slots are assigned afterwards (AssignSlots); transfers name their peer and group.
    switch (st.kind) {
      case OpKind::Forward:
        out.push_back(prog::MakeOp(attrs::Forward{st.microbatch, st.chunk, 0}, {}, {}));
        break;
      case OpKind::Backward:
        out.push_back(prog::MakeOp(attrs::Backward{st.microbatch, st.chunk, 0}, {}, {}));
        break;
      case OpKind::SendActivation:
        out.push_back(
            prog::MakeOp(attrs::SendActivation{st.microbatch, st.chunk, 0, st.peer, st.group},
                         {c.output}, {}, CommKind::Pp));
        break;
      case OpKind::RecvActivation:
        out.push_back(
            prog::MakeOp(attrs::RecvActivation{st.microbatch, st.chunk, 0, st.peer, st.group}, {},
                         {landing[st.chunk] >= 0 ? landing[st.chunk] : c.input}, CommKind::Pp));
        break;
      case OpKind::SendGrad:
        out.push_back(prog::MakeOp(attrs::SendGrad{st.microbatch, st.chunk, 0, st.peer, st.group},
                                   {c.grad}, {}, CommKind::Pp));
        break;
      case OpKind::RecvGrad:
        out.push_back(prog::MakeOp(
            attrs::RecvGrad{st.microbatch, st.chunk, 0, st.peer, st.group}, {},
            {!grad_landing.empty() && grad_landing[st.chunk] >= 0 ? grad_landing[st.chunk]
                                                                  : c.grad},
            CommKind::Pp));
        break;
      default:
        break;
    }
    if (!out.empty()) out.back().ints.shrink_to_fit();
  }
  out.push_back(prog::MakeOp(attrs::ReduceGrads{.body = sb.reduce_grads}, {}, {}));
  out.push_back(prog::MakeOp(attrs::OptimizerStep{.body = sb.optimizer_step}, {}, {}));
  (void)par;
}

// Whether the chunk's steps of kind `first` and `then` alternate, each `then` of the microbatch
// of the `first` before it.
bool Alternate(const std::vector<PipelineStep>& steps, int32_t chunk, OpKind first, OpKind then) {
  int32_t held = -1;
  for (const PipelineStep& st : steps) {
    if (st.chunk != chunk) continue;
    if (st.kind == first) {
      if (held >= 0) return false;
      held = st.microbatch;
    } else if (st.kind == then) {
      if (held != st.microbatch) return false;
      held = -1;
    }
  }
  return true;
}

// Landing buffers: on the first pipeline rank of the interleaved schedule every chunk but the
// first receives its input from the last rank, and in the steady state the transfer placement
// (schedule.cpp) posts that receive in the group before the backward. Received into an input
// slot, it takes a whole stash slot of the chunk (every stashed buffer of a microbatch) before
// the backward gives one back, and where that raises the chunk's slots the receive lands instead
// in a buffer of the received activation's size, which the chunk's forward body copies into the
// input slot first thing: the microbatch takes its slot at its forward, after the backward. The
// copy keeps the program's contract as it was (a forward's context names one slot of every Stash
// buffer of its chunk, the backward reads the stashed input there) for one boundary-sized copy
// per forward. One buffer per chunk is enough: with Megatron's microbatch groups of pp each such
// receive is followed by its forward before the chunk's next receive (ReceivesOneAhead; the
// verifier proves it); a chunk whose receives run further ahead (other group sizes) keeps
// receiving into its slots.
bool ReceivesOneAhead(const std::vector<PipelineStep>& steps, int32_t chunk) {
  return Alternate(steps, chunk, OpKind::RecvActivation, OpKind::Forward);
}

// The chunks of `role` that get a landing buffer, from the pipelines its schedule is built from:
// those whose receives run one ahead and whose slots a landing buffer lowers (their slots counted
// both ways; the chunks' slots do not depend on each other).
std::vector<bool> LandingChunks(const ScheduleShape& shape, int32_t pipeline_rank,
                                const std::vector<const std::vector<PipelineStep>*>& pipelines,
                                const StepBodies& sb, const ParallelConfig& par, const Role& role) {
  const size_t nc = role.chunks.size();
  std::vector<bool> lands(nc, false);
  if (shape.kind != prog::ScheduleKind::Interleaved1F1B || shape.vpp < 2 || shape.pp < 2 ||
      pipeline_rank != 0 || pipelines.empty())
    return lands;
  std::vector<int32_t> none(nc, -1), some(nc, -1);
  for (size_t c = 0; c < nc; ++c) {
    const Chunk& ch = role.chunks[c];
    if (ch.index > 0 && ch.input >= 0 &&
        std::all_of(pipelines.begin(), pipelines.end(),
                    [&](const auto* steps) { return ReceivesOneAhead(*steps, ch.index); }))
      some[c] = ch.input;  // any buffer: the count only asks whether the chunk has one
  }
  auto slots = [&](const std::vector<int32_t>& landing) {
    Role probe;
    probe.chunks = role.chunks;
    BuildSchedule(*pipelines.front(), sb, par, landing, probe);
    AssignSlots(probe, false, landing);
    return probe.chunks;
  };
  const std::vector<Chunk> without = slots(none), with = slots(some);
  for (size_t c = 0; c < nc; ++c) lands[c] = some[c] >= 0 && with[c].slots < without[c].slots;
  return lands;
}

// Boundary buffers kept once per chunk (runtime/format/README.md, "Boundary buffers"). Megatron
// frees a stage's output once it is sent and holds a gradient only while its backward runs;
// kept as Stash, both would take a slot of every microbatch in flight. A chunk's `output` is one
// buffer where its backward does not read it and, in every pipeline, each forward's
// SendActivation comes before the chunk's next forward (the send is in the group right after
// the forward; the next forward starts once that group has completed). Its `grad` is one buffer
// where each microbatch's gradient is received, used by the backward and sent before the next
// one arrives; a chunk that both receives and sends gradients receives them into a landing
// buffer that its backward copies in first (the cool-down posts the next receive in the group
// of the previous send).
struct BoundaryBuffers {
  std::vector<bool> output, grad;  // per chunk
};

// Whether a chunk with one `grad` receives its gradients into a landing buffer: a middle
// virtual stage, which both receives and sends them.
bool HasGradLanding(const Chunk& c) { return !c.has_loss && c.stage > 0; }

// A Persistent buffer shaped as `target`, copied into it by the first op of `body`: a landing
// buffer for the receives of `target`. Returns its index.
int32_t AddLanding(std::string name, int32_t target, int32_t body, Role& role) {
  Buffer buf;
  buf.name = std::move(name);
  buf.kind = BufferKind::Persistent;
  buf.dtype = role.buffers[target].dtype;
  buf.shape = role.buffers[target].shape;
  role.buffers.push_back(std::move(buf));
  const auto index = static_cast<int32_t>(role.buffers.size() - 1);
  std::vector<Op>& ops = role.bodies[body].ops;
  ops.insert(ops.begin(), prog::MakeOp(prog::attrs::Copy{}, {index}, {target}));
  return index;
}

// The grad rule above for one chunk that receives (`receives`) and sends (`sends`) gradients,
// with a landing buffer where it does both (HasGradLanding).
bool GradOneAtATime(const std::vector<PipelineStep>& steps, int32_t chunk, bool receives,
                    bool sends) {
  const bool landing = receives && sends;
  int32_t landed = -1, received = -1, computed = -1;
  for (const PipelineStep& st : steps) {
    if (st.chunk != chunk) continue;
    const int32_t mb = st.microbatch;
    if (st.kind == OpKind::RecvGrad) {
      int32_t& into = landing ? landed : received;
      if (into >= 0 || (!landing && computed >= 0)) return false;
      into = mb;
    } else if (st.kind == OpKind::Backward) {
      if (landing && landed != mb) return false;
      if (!landing && receives && received != mb) return false;
      if (computed >= 0) return false;
      landed = received = -1;
      computed = sends ? mb : -1;
    } else if (st.kind == OpKind::SendGrad) {
      if (computed != mb) return false;
      computed = -1;
    }
  }
  return true;
}

BoundaryBuffers BoundaryBuffersOf(const std::vector<const std::vector<PipelineStep>*>& pipelines,
                                  const Role& role) {
  BoundaryBuffers b;
  for (const Chunk& c : role.chunks) {
    bool backward_reads_output = false;
    for (const Op& op : role.bodies[c.backward].ops)
      for (const auto* list : {&op.inputs, &op.outputs})
        backward_reads_output =
            backward_reads_output || std::find(list->begin(), list->end(), c.output) != list->end();
    const bool receives = !c.has_loss, sends = c.stage > 0;
    bool output = c.output >= 0 && !backward_reads_output, grad = c.grad >= 0;
    for (const auto* steps : pipelines) {
      output = output && Alternate(*steps, c.index, OpKind::Forward, OpKind::SendActivation);
      grad = grad && GradOneAtATime(*steps, c.index, receives, sends);
    }
    b.output.push_back(output);
    b.grad.push_back(grad);
  }
  return b;
}

// Makes the boundary buffers `b` names one buffer each (Persistent) and adds the grad landing
// buffers with their copy at the front of the chunk's backward body; returns per chunk its grad
// landing buffer or -1.
std::vector<int32_t> ApplyBoundaryBuffers(const BoundaryBuffers& b, Role& role) {
  std::vector<int32_t> landing(role.chunks.size(), -1);
  for (const Chunk& c : role.chunks) {
    if (b.output[c.index]) role.buffers[c.output].kind = BufferKind::Persistent;
    if (!b.grad[c.index]) continue;
    role.buffers[c.grad].kind = BufferKind::Persistent;
    if (HasGradLanding(c))
      landing[c.index] =
          AddLanding(fmt::format("chunk{}.grad_landing", c.index), c.grad, c.backward, role);
  }
  return landing;
}

// Adds a landing buffer to each chunk that `lands` names, and the copy into its input slot to
// the front of the chunk's forward body.
void AddLandingBuffers(const std::vector<bool>& lands, Role& role) {
  for (const Chunk& c : role.chunks)
    if (lands[c.index])
      (void)AddLanding(fmt::format("chunk{}.landing", c.index), c.input, c.forward, role);
}

// Whether the bodies hold the experts in buckets of their own, split over Ep and reduced over
// Edp (compiler/lower/body_internal.h, ExpertsOverEdp): with ep > 1, and with ep = 1 and
// etp = 1 beside tp > 1 under sequence parallelism and ZeRO 0 or 1. Only then do the ranks
// need the Ep and Edp communicators.
bool HasExpertBuckets(const Program& p) {
  for (const Role& role : p.roles)
    for (const Param& prm : role.params)
      if (prm.split_comm == CommKind::Ep) return true;
  return false;
}

// Hybrid sharding (ParallelConfig::replicate > 1): each data-parallel group (DpCp with cp > 1)
// in rank order splits into `replicate` runs of consecutive members, the Shard groups (one
// replica's ZeRO group, as torchtitan's dp_shard · cp mesh dimension nests inside
// dp_replicate), and the members at one position of every run form a Replicate group.
void AddHybridShardComms(const Layout& layout, Program& p) {
  const int64_t replicas = p.parallel.replicate;
  if (replicas <= 1) return;
  const GroupList& list = layout.Groups(p.parallel.cp > 1 ? GroupKind::kDpCp : GroupKind::kDp);
  auto add = [&](CommKind kind, std::vector<int32_t> members) {
    if (members.size() <= 1) return;
    const auto index = static_cast<int32_t>(p.communicators.size());
    for (int32_t m : members) p.ranks[m].comms[static_cast<int>(kind)] = index;
    p.communicators.push_back({kind, std::move(members)});
  };
  for (int64_t g = 0; g < list.group_count(); ++g) {
    std::vector<int32_t> members;
    for (int64_t m : list.Group(g)) members.push_back(static_cast<int32_t>(m));
    std::sort(members.begin(), members.end());
    const int64_t shard = static_cast<int64_t>(members.size()) / replicas;
    for (int64_t r = 0; r < replicas; ++r)
      add(CommKind::Shard,
          std::vector<int32_t>(members.begin() + r * shard, members.begin() + (r + 1) * shard));
    for (int64_t s = 0; s < shard; ++s) {
      std::vector<int32_t> replica;
      for (int64_t r = 0; r < replicas; ++r) replica.push_back(members[r * shard + s]);
      add(CommKind::Replicate, std::move(replica));
    }
  }
}

// Communicators from the layout: a kind is listed when its groups have more than one member
// (World always). Returns the index of each rank's communicator per kind.
void BuildWorld(const Layout& layout, bool tied_pp, bool experts, Program& p) {
  const int64_t world = layout.world_size();
  p.ranks.assign(world, Rank());
  struct KindMap {
    CommKind kind;
    GroupKind group;
  };
  const KindMap kinds[] = {
      {CommKind::Tp, GroupKind::kTp},          {CommKind::Pp, GroupKind::kPp},
      {CommKind::Dp, GroupKind::kDp},          {CommKind::Cp, GroupKind::kCp},
      {CommKind::DpCp, GroupKind::kDpCp},      {CommKind::Mp, GroupKind::kTpPp},
      {CommKind::Embedding, GroupKind::kEmbd}, {CommKind::Ep, GroupKind::kEp},
      {CommKind::Edp, GroupKind::kEdp}};
  // World first.
  Communicator all;
  all.kind = CommKind::World;
  for (int64_t r = 0; r < world; ++r) all.members.push_back(static_cast<int32_t>(r));
  p.communicators.push_back(std::move(all));
  for (int64_t r = 0; r < world; ++r) p.ranks[r].comms[static_cast<int>(CommKind::World)] = 0;
  std::vector<std::pair<CommKind, GroupKind>> ordered;
  for (const KindMap& k : kinds) ordered.push_back({k.kind, k.group});
  std::sort(ordered.begin(), ordered.end(), [](auto a, auto b) { return a.first < b.first; });
  for (auto [kind, group] : ordered) {
    const GroupList& list = layout.Groups(group);
    if (list.group_size <= 1) continue;
    if (kind == CommKind::DpCp && layout.sizes().cp == 1) continue;  // equal to Dp
    if (kind == CommKind::Embedding && !tied_pp) continue;
    if ((kind == CommKind::Ep || kind == CommKind::Edp) && !experts) continue;  // dense model
    for (int64_t g = 0; g < list.group_count(); ++g) {
      Communicator c;
      c.kind = kind;
      for (int64_t m : list.Group(g)) c.members.push_back(static_cast<int32_t>(m));
      int32_t index = static_cast<int32_t>(p.communicators.size());
      for (int32_t m : c.members) p.ranks[m].comms[static_cast<int>(kind)] = index;
      p.communicators.push_back(std::move(c));
    }
  }
  AddHybridShardComms(layout, p);
  for (int64_t r = 0; r < world; ++r) {
    RankCoordinates rc = layout.Coordinates(r);
    Rank& rank = p.ranks[r];
    rank.role = static_cast<int32_t>(rc.pp);
    rank.coords = {static_cast<int32_t>(rc.tp), static_cast<int32_t>(rc.cp),
                   static_cast<int32_t>(rc.ep), static_cast<int32_t>(rc.dp),
                   static_cast<int32_t>(rc.pp)};
  }
}

// --- expert tensor parallelism ---------------------------------------------------------------
// Whether the plan's MoE layers split their experts over an Etp group (etp > 1; lowered with
// etp = tp, beside any ep).
bool SplitsExperts(const Plan& plan) { return plan.model.IsMoe() && plan.parallel.etp > 1; }

// The groups of `kind`, each in its member order, in a canonical order of groups.
std::set<std::vector<int64_t>> GroupSet(const Layout& layout, GroupKind kind, bool sort_members) {
  std::set<std::vector<int64_t>> out;
  const GroupList& list = layout.Groups(kind);
  for (int64_t g = 0; g < list.group_count(); ++g) {
    std::vector<int64_t> members(list.Group(g).begin(), list.Group(g).end());
    if (sort_members) std::sort(members.begin(), members.end());
    out.insert(std::move(members));
  }
  return out;
}

// Whether every Ep group's members hold the same position in their Etp groups.
bool EpGroupsShareEtpIndex(const Layout& layout) {
  std::map<int64_t, int64_t> etp_index;
  const GroupList& etp = layout.Groups(GroupKind::kEtp);
  for (int64_t g = 0; g < etp.group_count(); ++g) {
    int64_t i = 0;
    for (int64_t m : etp.Group(g)) etp_index[m] = i++;
  }
  const GroupList& ep = layout.Groups(GroupKind::kEp);
  for (int64_t g = 0; g < ep.group_count(); ++g) {
    std::set<int64_t> seen;
    for (int64_t m : ep.Group(g)) seen.insert(etp_index[m]);
    if (seen.size() > 1) return false;
  }
  return true;
}

// The experts' tensor-parallel groups must be the Tp groups, member for member (an Etp rank holds
// the same sequence-parallel rows as its Tp rank). With ep = 1 the experts' data-parallel groups
// must be the ranks that reduce the dense gradients (DpCp; Dp without context parallelism): the
// lowering then reduces every gradient over one data-parallel group. With ep > 1 each Ep group
// must join ranks of one Etp index (the ranks holding the same slice of their experts), as
// Megatron-Core's expert mesh does; the experts' gradients then reduce over Edp.
// Reports P0801 at `parallel.order` when the order lays them out otherwise.
bool CheckExpertTensorGroups(const Plan& plan, const Layout& layout, DiagnosticSink& sink) {
  if (!SplitsExperts(plan)) return true;
  const GroupKind dense_dp = plan.parallel.cp > 1 ? GroupKind::kDpCp : GroupKind::kDp;
  std::string_view differs;
  if (GroupSet(layout, GroupKind::kEtp, false) != GroupSet(layout, GroupKind::kTp, false))
    differs = "the expert-tensor-parallel groups differ from the tensor-parallel groups";
  else if (plan.parallel.ep <= 1 &&
           GroupSet(layout, GroupKind::kEdp, true) != GroupSet(layout, dense_dp, true))
    differs = "the expert-data-parallel groups differ from the data-parallel groups";
  else if (plan.parallel.ep > 1 && !EpGroupsShareEtpIndex(layout))
    differs = "an expert-parallel group joins ranks of different expert-tensor-parallel index";
  if (differs.empty()) return true;
  sink.Report(
      Diag(DiagKind::kLowerUnsupported,
           fmt::format("lowering does not emit experts split by tensor parallelism (etp = {}) "
                       "under the order `{}` yet: {}",
                       plan.parallel.etp, plan.parallel.order, differs))
          .At(plan.Range("parallel.order"), "set here")
          .Note("the lowering splits each expert over the ranks of a Tp group, which hold the "
                "same tokens, and reduces the experts' gradients with the dense ones")
          .Help("use an order with `tp` first (the default `tp-cp-ep-dp-pp`), or `parallel.etp "
                "= 1`"));
  return false;
}

// The Etp communicators of the layout (members in Megatron's order), after those BuildWorld
// lists; only when the MoE layers split their experts.
void AddExpertTensorComms(const Plan& plan, const Layout& layout, Program& p) {
  if (!SplitsExperts(plan)) return;
  const GroupList& list = layout.Groups(GroupKind::kEtp);
  if (list.group_size <= 1) return;
  for (int64_t g = 0; g < list.group_count(); ++g) {
    Communicator c;
    c.kind = CommKind::Etp;
    for (int64_t m : list.Group(g)) c.members.push_back(static_cast<int32_t>(m));
    const int32_t index = static_cast<int32_t>(p.communicators.size());
    for (int32_t m : c.members) p.ranks[m].comms[static_cast<int>(CommKind::Etp)] = index;
    p.communicators.push_back(std::move(c));
  }
}
// --- end expert tensor parallelism -----------------------------------------------------------

ModelConfig ModelConfigOf(const Plan& plan) {
  const ModelSpec& m = plan.model;
  const int64_t pad = 128 * plan.parallel.tp;
  return {m.name,
          static_cast<int32_t>(m.layers),
          m.hidden,
          m.ffn_hidden,
          m.heads,
          m.kv_heads,
          m.head_dim,
          m.vocab,
          (m.vocab + pad - 1) / pad * pad,
          m.seq_len,
          plan.batch.micro,
          m.norm == Norm::kLayerNorm ? prog::NormKind::LayerNorm : prog::NormKind::RmsNorm,
          m.activation == Activation::kGelu          ? prog::ActivationKind::Gelu
          : m.activation == Activation::kSquaredRelu ? prog::ActivationKind::SquaredRelu
                                                     : prog::ActivationKind::SwiGlu,
          m.position == Position::kLearned ? prog::PositionKind::Learned : prog::PositionKind::Rope,
          m.tied_embeddings,
          1e-5,
          10000.0,
          m.activation == Activation::kGelu,
          m.q_lora_rank,
          m.kv_lora_rank,
          m.qk_nope_head_dim,
          m.qk_rope_head_dim,
          m.v_head_dim,
          m.qk_norm,
          m.window,
          static_cast<int32_t>(m.mtp_layers),
          m.mtp_loss_scale};
}

// Hybrid sharding (fsdp.replicate or fsdp.shard): the replicas of the ZeRO shard group, dp · cp /
// ShardGroup; 1 without ZeRO or when the shard group is the whole dp · cp.
int32_t HybridReplicas(const Plan& plan) {
  const int64_t dp_cp = int64_t{plan.parallel.dp} * plan.parallel.cp;
  const int64_t shard = ShardGroup(plan);
  if (plan.optimizer.zero <= 0 || shard <= 0 || shard >= dp_cp || dp_cp % shard != 0) return 1;
  return static_cast<int32_t>(dp_cp / shard);
}

ParallelConfig ParallelConfigOf(const Plan& plan) {
  const ParallelSpec& q = plan.parallel;
  return {static_cast<int32_t>(q.tp),
          static_cast<int32_t>(q.pp),
          static_cast<int32_t>(q.vpp),
          static_cast<int32_t>(q.cp),
          static_cast<int32_t>(q.ep),
          static_cast<int32_t>(q.dp),
          q.sp && q.tp > 1,
          static_cast<int32_t>(plan.optimizer.zero),
          ToScheduleKind(plan.pipeline.schedule, q.vpp),
          q.order,
          HybridReplicas(plan)};
}

TrainConfig TrainConfigOf(const Plan& plan) {
  const OptimizerSpec& o = plan.optimizer;
  return {plan.train.steps,
          plan.train.seed,
          plan.batch.global,
          plan.Microbatches(),
          ToPrecision(plan.precision),
          o.lr,
          o.min_lr,
          o.warmup_steps,
          o.weight_decay,
          o.beta1,
          o.beta2,
          o.eps,
          o.clip_grad,
          o.type == OptimizerType::kSgd ? "sgd" : "adamw",
          plan.train.data,
          plan.train.checkpoint_dir,
          plan.train.checkpoint_every};
}

// Whether the step's schedule can be built: the number of microbatches, the schedule's shape
// and the partition's stages. Reports P0802 and returns false when not.
bool CheckSchedulable(const Plan& plan, const TrainConfig& train, const ScheduleShape& shape,
                      const Partition& partition, DiagnosticSink& sink) {
  const ParallelSpec& q = plan.parallel;
  // Every microbatch of a step is spelled out in the schedule: past this many the program would
  // take gigabytes and minutes to write (a global batch of 10^9 sequences).
  constexpr int64_t kMaxMicrobatches = int64_t{1} << 16;
  if (train.microbatches > kMaxMicrobatches) {
    sink.Report(
        Diag(DiagKind::kLowerSchedule,
             fmt::format(
                 "global batch {} gives {} microbatches per step on each data-parallel rank; "
                 "programs hold at most {}",
                 plan.batch.global, train.microbatches, kMaxMicrobatches))
            .At(plan.Range("batch.global"))
            .Note("microbatches = global / (micro · dp); the schedule lists every one of them")
            .Help(fmt::format(
                "a larger `batch.micro`, or a global batch of at most {} = {} · {} · {}",
                kMaxMicrobatches * plan.batch.micro * q.dp, kMaxMicrobatches, plan.batch.micro,
                q.dp)));
    return false;
  }
  if (train.microbatches < 1) {
    sink.Report(
        Diag(DiagKind::kLowerSchedule, fmt::format("global batch {} does not give a whole number "
                                                   "of microbatches of {} sequences on dp = {}",
                                                   plan.batch.global, plan.batch.micro, q.dp))
            .At(plan.Range("batch.global"))
            .Note("microbatches = global / (micro · dp)")
            .Help(fmt::format("use a global batch that is a multiple of micro · dp = {}",
                              plan.batch.micro * q.dp)));
    return false;
  }
  if (std::string why = CheckScheduleShape(shape); !why.empty()) {
    sink.Report(
        Diag(DiagKind::kLowerSchedule, fmt::format("the {} schedule cannot be built: {}",
                                                   ToString(plan.pipeline.schedule), why))
            .At(plan.Range("pipeline.schedule"))
            .Note("paraplan builds Megatron-Core's orders and accepts what Megatron-Core accepts")
            .Help(fmt::format("use a number of microbatches that is a multiple of pp = {}", q.pp)));
    return false;
  }
  if (static_cast<int64_t>(partition.stages.size()) != q.pp) {
    sink.Report(Diag(DiagKind::kLowerSchedule,
                     fmt::format("the pipeline partition has {} stages for pp = {}",
                                 partition.stages.size(), q.pp)));
    return false;
  }
  return true;
}

BodyShape BodyShapeOf(const Plan& plan, const Program& p) {
  BodyShape bs;
  bs.model = p.model;
  bs.parallel = p.parallel;
  bs.microbatches = p.train.microbatches;
  bs.precision = p.train.precision;
  switch (EffectiveMixedPrecision(plan).grads) {
    case ElementType::kBf16:
      bs.grad_type = prog::DType::Bf16;
      break;
    case ElementType::kFp16:
      bs.grad_type = prog::DType::F16;
      break;
    default:
      bs.grad_type = prog::DType::F32;
  }
  bs.sgd = p.train.optimizer == "sgd";
  // --- mixture of experts ---
  const ModelSpec& m = plan.model;
  if (m.IsMoe()) {
    bs.moe.experts = m.experts;
    bs.moe.topk = std::max<int64_t>(1, m.topk);
    bs.moe.ffn = m.ExpertFfn();
    bs.moe.shared_ffn = m.shared_experts * bs.moe.ffn;
    bs.moe.dense_layers = m.dense_layers;
    bs.moe.layer_freq = m.moe_layer_freq;
    bs.moe.score = m.router_score == RouterScore::kSigmoid ? 1 : 0;
    bs.moe.normalize = m.router_topk_norm;
    bs.moe.aux_coeff = m.router_aux_coeff;
    bs.moe.bias_rate = m.router_bias_rate;
    bs.moe.router_groups = m.router_groups;
    bs.moe.router_group_topk = m.router_group_topk;
    bs.moe.router_scale = m.router_scale;
    bs.moe.capacity_factor = plan.moe.capacity_factor;
    bs.moe.drop_by_position = plan.moe.drop_policy == DropPolicy::kPosition;
    bs.moe.etp = std::max<int64_t>(1, plan.parallel.etp);  // expert tensor parallelism
    bs.moe.imbalance = StatedMoeImbalance(plan);           // 0: the worst routing
  }
  // --- end mixture of experts ---
  bs.recompute = plan.recompute == Recompute::kFull        ? ActivationRecompute::kFull
                 : plan.recompute == Recompute::kSelective ? ActivationRecompute::kSelective
                                                           : ActivationRecompute::kNone;
  if (plan.recompute == Recompute::kSelective) {
    const uint32_t modules = LoweredRecomputeModules(plan);
    bs.recompute_core_attention = (modules & kRecomputeCoreAttn) != 0;
    bs.recompute_moe_act = (modules & kRecomputeMoeAct) != 0;
    bs.recompute_mlp = (modules & kRecomputeMlp) != 0;
    bs.recompute_shared_experts = (modules & kRecomputeSharedExperts) != 0;
    bs.recompute_layernorm = (modules & kRecomputeLayernorm) != 0;
    bs.recompute_moe = (modules & kRecomputeMoe) != 0;
    bs.recompute_mla_up_proj = (modules & kRecomputeMlaUpProj) != 0;
  }
  if (plan.recompute == Recompute::kFull && plan.activations.recompute_layers > 0) {
    bs.recompute_layers.block = plan.activations.recompute_method == RecomputeMethod::kBlock;
    bs.recompute_layers.layers = static_cast<int32_t>(
        std::min<int64_t>(plan.activations.recompute_layers, plan.model.layers));
  }
  return bs;
}

// Moves the role's schedule into its compact form (Role::steps). Every op the lowering emits
// has one; an op without one keeps the whole schedule as ops.
void CompactSchedule(Role& role) {
  std::vector<prog::ScheduleStep> steps(role.schedule.size());
  for (size_t i = 0; i < role.schedule.size(); ++i)
    if (!prog::mem::ToScheduleStep(role.schedule[i], &steps[i])) return;
  role.steps = std::move(steps);
  std::vector<Op>().swap(role.schedule);
}

// The saving a loop must bring when a step of many microbatches is listed (its samples did not
// extend).
constexpr int64_t kManyLoopMinSaving = 1024;

// The role's schedule steps in loop form (Role::loops) when its loops save at least
// `min_saving` steps.
void FindLoops(Role& role, int64_t min_saving) {
  if (role.steps.empty()) return;
  LoopForm form = FindScheduleLoops(role.steps, prog::mem::ChunkSlots(role), min_saving);
  if (form.loops.empty()) return;
  role.steps = std::move(form.steps);
  role.loops = std::move(form.loops);
}

// A role's schedule built from a few microbatches and extended to the step's: the schedules at
// m1, m1 + D and m1 + 2D microbatches (the same warm-up, D more microbatches in the steady state
// each, the cool-down's microbatches D later) in loop form give the form at m1 + kD
// (ExtrapolateLoops) without listing the step's microbatches. Sampling is worth it past a few
// periods of the steady state: m1 >= `Threshold`, D the microbatches of one period (a group of
// the interleaved schedule, else pp).
struct ScheduleSampling {
  int32_t m1 = 0, d = 0;
  int64_t k = 0;
  std::vector<std::vector<PipelineStep>> pipelines[3];

  // The microbatches of one period and the fewest sampled.
  static int32_t Period(const ScheduleShape& shape) {
    return shape.kind == prog::ScheduleKind::Interleaved1F1B ? shape.Group()
                                                             : std::max(shape.pp, 1);
  }
  static int32_t Threshold(const ScheduleShape& shape) {
    return shape.kind == prog::ScheduleKind::Interleaved1F1B ? 6 * shape.Group() : 4 * shape.pp + 8;
  }
  // Whether the step has enough microbatches to be sampled: a few periods, and at least
  // `min_computations` forwards per rank (LowerOptions::loop_min_microbatches); its slots are
  // then assigned first-freed-first (AssignSlots), whatever form the schedule is held in.
  static bool Many(const ScheduleShape& shape, int64_t min_computations) {
    return shape.microbatches >= Threshold(shape) + 3 * Period(shape) &&
           int64_t{shape.microbatches} * shape.vpp >= min_computations;
  }

  static ScheduleSampling For(const ScheduleShape& shape, int64_t min_computations) {
    ScheduleSampling s;
    s.d = Period(shape);
    const int32_t threshold = Threshold(shape);
    if (!Many(shape, min_computations)) return s;
    s.m1 = threshold + (shape.microbatches - threshold) % s.d;
    s.k = (shape.microbatches - s.m1) / s.d;
    for (int i = 0; i < 3; ++i) {
      ScheduleShape sample = shape;
      sample.microbatches = s.m1 + i * s.d;
      if (!CheckScheduleShape(sample).empty()) return ScheduleSampling{};
      s.pipelines[i] = PipelinePrograms(sample);
    }
    return s;
  }
  bool active() const { return m1 > 0; }
};

// The role's schedule by sampling (ScheduleSampling); false (role untouched but for its
// scratch) when the samples do not extend by constant amounts.
bool BuildSampledSchedule(ScheduleSampling& sampling, int32_t r, const StepBodies& sb,
                          const ParallelConfig& par, const std::vector<int32_t>& landing,
                          const std::vector<int32_t>& grad_landing, const SlotPooling& pooling,
                          Role& role) {
  LoopForm forms[3];
  std::vector<Chunk> chunks;
  for (int i = 0; i < 3; ++i) {
    Role sample;
    sample.chunks = role.chunks;
    BuildSchedule(sampling.pipelines[i][r], sb, par, landing, sample, grad_landing);
    AssignRoleSlots(sample, true, landing, pooling);
    if (i == 0) {
      chunks = sample.chunks;
    } else {
      for (size_t c = 0; c < chunks.size(); ++c)
        if (chunks[c].slots != sample.chunks[c].slots || chunks[c].pool != sample.chunks[c].pool)
          return false;
    }
    CompactSchedule(sample);
    if (sample.steps.empty()) return false;
    forms[i] = FindScheduleLoops(sample.steps, prog::mem::ChunkSlots(sample), 1);
  }
  std::vector<int32_t> slots;
  for (const Chunk& c : chunks) slots.push_back(c.slots);
  std::optional<LoopForm> form = ExtrapolateLoops(forms[0], forms[1], forms[2], sampling.k, slots);
  if (!form || form->loops.empty()) return false;
  // The memory plan of the first sample: the steady state holds the most microbatches in flight,
  // and every sample has it.
  BuildSchedule(sampling.pipelines[0][r], sb, par, landing, role, grad_landing);
  AssignRoleSlots(role, true, landing, pooling);
  PlanMemory(role);
  std::vector<Op>().swap(role.schedule);
  for (auto& pipelines : sampling.pipelines) std::vector<PipelineStep>().swap(pipelines[r]);
  role.steps = std::move(form->steps);
  role.loops = std::move(form->loops);
  return true;
}

// One role per pipeline rank: bodies, schedule, slots and memory plan.
void BuildRoles(const Partition& partition, const ScheduleShape& shape, const BodyShape& bs,
                const LowerOptions& options, Program& p) {
  const bool loops = options.compact_schedule && options.schedule_loops;
  const bool many = ScheduleSampling::Many(shape, options.loop_min_microbatches);
  ScheduleSampling sampling =
      loops ? ScheduleSampling::For(shape, options.loop_min_microbatches) : ScheduleSampling{};
  const int32_t pool_period = options.slot_pools ? ScheduleSampling::Period(shape) : 0;
  std::vector<std::vector<PipelineStep>> pipeline;  // every microbatch listed, when needed
  for (int32_t r = 0; r < p.parallel.pp; ++r) {
    std::vector<ChunkLayers> chunks;
    for (const PipelineChunk& c : partition.stages[r].chunks)
      chunks.push_back({static_cast<int32_t>(c.first_layer), static_cast<int32_t>(c.layer_count()),
                        c.embedding, c.loss});
    Role role;
    StepBodies sb = BuildRoleBodies(bs, r, chunks, role);
    // The pipelines the schedule is built from: the samples, or every microbatch listed.
    std::vector<const std::vector<PipelineStep>*> built_from;
    if (sampling.active()) {
      for (const auto& sample : sampling.pipelines) built_from.push_back(&sample[r]);
    } else {
      if (pipeline.empty()) pipeline = PipelinePrograms(shape);
      built_from.push_back(&pipeline[r]);
    }
    if (options.landing_buffers)
      AddLandingBuffers(LandingChunks(shape, r, built_from, sb, p.parallel, role), role);
    std::vector<int32_t> landing;  // per chunk, its landing buffer or -1
    for (const Chunk& c : role.chunks) landing.push_back(LandingBuffer(role, c));
    std::vector<int32_t> grad_landing;  // per chunk, its grad landing buffer or -1
    if (options.boundary_buffers)
      grad_landing = ApplyBoundaryBuffers(BoundaryBuffersOf(built_from, role), role);
    const SlotPooling pooling{pool_period, StashFrames(role)};
    if (!sampling.active() ||
        !BuildSampledSchedule(sampling, r, sb, p.parallel, landing, grad_landing, pooling, role)) {
      if (pipeline.empty()) pipeline = PipelinePrograms(shape);
      BuildSchedule(pipeline[r], sb, p.parallel, landing, role, grad_landing);
      std::vector<PipelineStep>().swap(pipeline[r]);  // in the schedule now
      AssignRoleSlots(role, many, landing, pooling);
      PlanMemory(role);
      if (options.compact_schedule) CompactSchedule(role);
      // Listed schedules keep their files as they were unless asked (tests); a step of many
      // microbatches whose samples did not extend is searched for loops all the same.
      if (loops)
        FindLoops(role, many ? std::min<int64_t>(options.loop_min_saving, kManyLoopMinSaving)
                             : options.loop_min_saving);
    }
    p.roles.push_back(std::move(role));
  }
  for (const Role& role : p.roles)
    if (!role.loops.empty()) p.format_version = prog::kLoopFormatVersion;
}

// Whole-world verification; reports P0804 with every error found.
bool VerifyLowered(const Program& p, DiagnosticSink& sink) {
  VerifyStats stats;
  std::vector<std::string> errors = VerifyWorld(p, &stats);
  if (errors.empty()) return true;
  Diag d(DiagKind::kLowerVerify,
         fmt::format("the lowered programs fail whole-world verification: {}", errors[0]));
  for (size_t i = 1; i < errors.size(); ++i) d.Note(errors[i]);
  d.Note("this is a bug in planc; the program was not written");
  sink.Report(std::move(d));
  return false;
}

}  // namespace

std::optional<Program> Lower(const Plan& plan, const Layout& layout, const Partition& partition,
                             const LowerOptions& options, DiagnosticSink& sink) {
  if (!CheckLowerable(plan, sink)) return std::nullopt;
  if (!CheckExpertTensorGroups(plan, layout, sink)) return std::nullopt;
  Program p;
  p.producer = options.producer;
  p.plan_name = plan.name;
  p.world_size = static_cast<int32_t>(layout.world_size());
  p.model = ModelConfigOf(plan);
  p.parallel = ParallelConfigOf(plan);
  p.train = TrainConfigOf(plan);
  ScheduleShape shape{p.parallel.schedule, p.parallel.pp, p.parallel.vpp,
                      static_cast<int32_t>(p.train.microbatches), options.microbatch_group};
  if (!CheckSchedulable(plan, p.train, shape, partition, sink)) return std::nullopt;
  BuildRoles(partition, shape, BodyShapeOf(plan, p), options, p);
  const std::vector<int64_t> reserves = RuntimeReserves(plan);
  if (!ArenaFits(plan, p, reserves, sink)) return std::nullopt;
  WarnF32Arena(plan, p, reserves, sink);
  NoteFp8AsBf16(plan, sink);
  // The Embedding groups join the first and last stages' copies of the word embedding: the tied
  // output layer's, or the one multi-token prediction reads.
  const bool shared_embedding = plan.model.tied_embeddings || plan.model.mtp_layers > 0;
  BuildWorld(layout, shared_embedding && plan.parallel.pp > 1, HasExpertBuckets(p), p);
  AddExpertTensorComms(plan, layout, p);

  if (options.before_verify) options.before_verify(p);
  if (options.verify && !VerifyLowered(p, sink)) return std::nullopt;
  return p;
}

std::optional<Program> LowerPlan(const Plan& plan, const LowerOptions& options,
                                 DiagnosticSink& sink) {
  std::string error;
  std::optional<Layout> layout = BuildLayout(plan, &error);
  if (!layout) {
    sink.Report(
        Diag(DiagKind::kLowerSchedule, fmt::format("the rank layout cannot be built: {}", error)));
    return std::nullopt;
  }
  std::optional<Partition> partition = BuildPartition(plan, &sink);
  if (!partition) {
    if (!sink.has_errors())
      sink.Report(
          Diag(DiagKind::kLowerSchedule, "the pipeline partition cannot be built for this plan"));
    return std::nullopt;
  }
  return Lower(plan, *layout, *partition, options, sink);
}

}  // namespace paraplan::lower
