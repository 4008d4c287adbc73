#include "compiler/analyze/memory_check.h"

#include <fmt/format.h>

#include <algorithm>
#include <utility>

#include "compiler/analyze/time.h"

namespace paraplan {
namespace {

struct Change {
  std::vector<std::pair<std::string, std::string>> sets;  // path = value, applied in order
};

bool IsSizeFieldSetByUser(const Plan& plan, FieldId field) {
  const OriginKind k = plan.Origin(field).kind;
  return k == OriginKind::kFile || k == OriginKind::kStdlib || k == OriginKind::kCommandLine;
}

std::vector<Change> CandidateChanges(const Plan& plan) {
  const ParallelSpec& par = plan.parallel;
  std::vector<Change> out;
  auto one = [&](FieldId field, std::string value) {  // a literal path is checked while compiling
    out.push_back({{{std::string(field.path), std::move(value)}}});
  };
  if (par.tp > 1 && !par.sp) one("parallel.sp", "true");
  if (plan.recompute == Recompute::kNone) one("recompute", "selective");
  // What production runs reach for before full recompute: the MLP recomputed with the attention
  // core, and (frameworks that have them; planrun keeps fp32 moments) bf16 Adam moments.
  if (plan.recompute != Recompute::kFull && !(EffectiveRecomputeModules(plan) & kRecomputeMlp))
    out.push_back(
        {{{"recompute", "selective"}, {"activations.recompute_modules", "\"core_attn, mlp\""}}});
  if (plan.framework != Framework::kParaplan && plan.optimizer.type == OptimizerType::kAdamW &&
      EffectiveMixedPrecision(plan).optimizer_state == ElementType::kFp32)
    one("mixed_precision.optimizer_state", "bf16");
  if (plan.recompute != Recompute::kFull) one("recompute", "full");
  // DeepSpeed's pipeline engine refuses ZeRO 2 and 3 (P0503): offered there only without it.
  for (int64_t z = plan.optimizer.zero + 1; z <= 3; ++z)
    if (z <= 1 || par.pp == 1 || plan.framework != Framework::kDeepSpeed)
      one("optimizer.zero", std::to_string(z));
  if (plan.batch.micro > 1) one("batch.micro", std::to_string(plan.batch.micro / 2));
  if (par.vpp > 1) out.push_back({{{"parallel.vpp", "1"}, {"pipeline.schedule", "\"1f1b\""}}});
  if (par.tp * 2 <= plan.cluster.gpus_per_node) {
    Change c{{{"parallel.tp", std::to_string(par.tp * 2)}}};
    if (!par.sp) c.sets.push_back({"parallel.sp", "true"});
    out.push_back(std::move(c));
  }
  one("parallel.pp", std::to_string(par.pp * 2));
  if (plan.model.seq_len >= 8192) one("parallel.cp", std::to_string(par.cp * 2));
  // planrun sizes its expert-parallel receive buffers for the worst routing unless the plan states
  // the imbalance its run may reach (a step that routes more stops, saying by how much).
  if (plan.framework == Framework::kParaplan && plan.model.IsMoe() && par.ep > 1 &&
      StatedMoeImbalance(plan) <= 0 && plan.moe.capacity_factor <= 0)
    one("moe.imbalance", "1.5");
  if (plan.model.IsMoe()) one("parallel.ep", std::to_string(par.ep * 2));
  if (plan.model.IsMoe() && par.etp > 1) one("parallel.etp", "1");
  if (plan.optimizer.offload == Offload::kNone && plan.optimizer.type == OptimizerType::kAdamW)
    one("optimizer.offload", "cpu");
  one("cluster.nodes", std::to_string(plan.cluster.nodes * 2));
  return out;
}

std::string Describe(const Change& c) {
  std::string s;
  for (const auto& [path, value] : c.sets) {
    if (!s.empty()) s += " and ";
    s += fmt::format("`{} = {}`", path, value);
  }
  return s;
}

}  // namespace

bool RederiveSizes(Plan& plan) {
  ParallelSpec& par = plan.parallel;
  if (!IsSizeFieldSetByUser(plan, fields::kParallelEtp)) par.etp = par.tp;
  const int64_t unit = par.tp * par.pp * par.cp;
  if (unit <= 0 || plan.World() % unit != 0) return false;
  par.dp = plan.World() / unit;
  return par.dp >= 1;
}

bool PassesBasicRules(const Plan& plan) {
  const ModelSpec& m = plan.model;
  const ParallelSpec& par = plan.parallel;
  if (par.tp < 1 || par.pp < 1 || par.cp < 1 || par.dp < 1 || par.ep < 1 || par.etp < 1 ||
      par.vpp < 1)
    return false;
  if (plan.World() != par.tp * par.pp * par.cp * par.dp) return false;
  if (m.heads % par.tp != 0) return false;
  const int64_t kv = m.kv_heads > 0 ? m.kv_heads : m.heads;
  if (kv % par.tp != 0 && par.tp % kv != 0) return false;
  if (par.sp && par.tp == 1) return false;
  if (par.cp > 1 && m.seq_len % (2 * par.cp) != 0) return false;
  if (m.IsMoe()) {
    if (m.experts % par.ep != 0) return false;
    if (plan.World() % (par.etp * par.ep * par.pp) != 0) return false;
  } else if (par.ep != 1) {
    return false;
  }
  if (plan.batch.micro < 1 || plan.batch.global % (plan.batch.micro * par.dp) != 0) return false;
  const int64_t mb = plan.batch.global / (plan.batch.micro * par.dp);
  if (par.vpp > 1 && mb % par.pp != 0) return false;
  if (par.vpp > 1 && plan.pipeline.schedule != Schedule::kInterleaved1F1B) return false;
  return true;
}

std::vector<MemoryFix> ProposeMemoryFixes(const Plan& plan, int64_t limit,
                                          const CostOptions& options, size_t max_fixes) {
  std::vector<MemoryFix> fixes;
  auto evaluate = [&](const Change& change) {
    Plan variant = plan;
    for (const auto& [path, value] : change.sets) {
      if (!SetFieldText(variant, path, value).empty()) return;
      // Set as --set would: a stated value (moe.imbalance sizes planrun's buffers only so).
      if (FieldOrigin* origin = variant.origins.Mutable(path))
        origin->kind = OriginKind::kCommandLine;
    }
    if (!RederiveSizes(variant) || !PassesBasicRules(variant)) return;
    const MemoryEstimate mem = EstimateMemory(variant, options);
    if (!mem.valid || mem.peak > limit) return;
    const TimeEstimate time = EstimateTime(variant, options);
    if (!time.valid) return;
    MemoryFix fix;
    fix.sets = change.sets;
    fix.path = change.sets.front().first;
    fix.value = change.sets.front().second;
    fix.description = Describe(change);
    if (variant.parallel.dp != plan.parallel.dp)
      fix.description += fmt::format(" (dp becomes {})", variant.parallel.dp);
    fix.peak = mem.peak;
    fix.peak_stage = mem.peak_stage;
    fix.step_s = time.step_s;
    fix.gpu_seconds = time.step_s * static_cast<double>(variant.World());
    fixes.push_back(std::move(fix));
  };
  const std::vector<Change> singles = CandidateChanges(plan);
  for (const Change& change : singles) evaluate(change);
  // Too few single changes fit: try two of them together (different fields).
  if (fixes.size() < max_fixes) {
    for (size_t i = 0; i < singles.size(); ++i) {
      for (size_t j = i + 1; j < singles.size(); ++j) {
        if (singles[i].sets.front().first == singles[j].sets.front().first) continue;
        if (singles[i].sets.front().first == "cluster.nodes" ||
            singles[j].sets.front().first == "cluster.nodes")
          continue;
        Change both = singles[i];
        both.sets.insert(both.sets.end(), singles[j].sets.begin(), singles[j].sets.end());
        evaluate(both);
      }
    }
  }
  std::stable_sort(fixes.begin(), fixes.end(), [](const MemoryFix& a, const MemoryFix& b) {
    if (a.sets.size() != b.sets.size()) return a.sets.size() < b.sets.size();  // one change first
    return a.gpu_seconds < b.gpu_seconds;
  });
  if (fixes.size() > max_fixes) fixes.resize(max_fixes);
  return fixes;
}

namespace {

// framework = paraplan: planrun's backends hold the program's f32 placement (every element in
// f32), which is the arena of the same plan in fp32. Warns (P0805, as `planc compile` does) when
// the plan fits in its precision but not so.
void CheckF32Arena(const Plan& plan, DiagnosticSink& sink, const CostOptions& options) {
  if (!ArenaModelApplies(plan) || plan.precision == Precision::kFp32) return;
  Plan f32 = plan;
  f32.precision = Precision::kFp32;
  f32.mixed_precision.params = ElementType::kFp32;
  f32.mixed_precision.grads = ElementType::kFp32;
  const MemoryEstimate mem = EstimateMemory(f32, options);
  if (!mem.valid || mem.peak <= plan.cluster.gpu.memory) return;
  const StageMemory& s = mem.stages[static_cast<size_t>(mem.peak_stage)];
  sink.Report(F32ArenaWarning(plan, s.stage, s.total,
                              fmt::format("stage {}'s arena is {} in f32", s.stage,
                                          FormatGiB(s.arena > 0 ? s.arena : s.total))));
}

}  // namespace

Diag F32ArenaWarning(const Plan& plan, int64_t stage, int64_t total, std::string arena) {
  const std::string gpu =
      plan.cluster.gpu.name.empty() ? std::string("the GPU") : plan.cluster.gpu.name;
  Diag d(
      DiagKind::kLowerF32Arena,
      fmt::format("planrun's backends hold pipeline stage {}'s program in {} per GPU; `{}` has {}",
                  stage, FormatGiB(total), gpu, FormatGiB(plan.cluster.gpu.memory)));
  d.At(plan.declaration, std::move(arena))
      .Note(
          "planrun's host and CUDA backends keep every floating-point element in f32 (the "
          "program's f32 placement) and round GEMM operands to bf16; the program itself fits "
          "the GPU in its precision")
      .Help(
          "`planrun --backend=cuda` cannot allocate this arena on this GPU; more tensor or "
          "pipeline parallel ranks, recompute or ZeRO shrink it");
  return d;
}

void CheckMemory(const Plan& plan, DiagnosticSink& sink, const CostOptions& options) {
  const int64_t capacity = plan.cluster.gpu.memory;
  if (capacity <= 0) return;
  for (FieldId field :
       {fields::kParallelTp, fields::kParallelPp, fields::kParallelCp, fields::kParallelDp,
        fields::kBatchMicro, fields::kBatchGlobal, fields::kModelLayers, fields::kClusterGpuMemory})
    if (plan.IsPoisoned(field)) return;
  const MemoryEstimate mem = EstimateMemory(plan, options);
  if (!mem.valid) return;
  // The near-limit threshold: the torchtitan runs with measured peaks (calibration_runs.json) ran
  // at up to 84.9 of 95 GiB reserved, about 90.5% with the CUDA context and NCCL beside it; a
  // warning at 90% would flag runs that ran. 93% leaves the model's stated error band (within 10%
  // of measured peaks, most rows within 5%) between the warning and the limit.
  const int64_t near = capacity / 100 * kNearLimitPercent;
  const bool oom = mem.peak > capacity;
  if (!oom) CheckF32Arena(plan, sink, options);
  if (mem.peak <= near) return;
  const StageMemory& s = mem.stages[static_cast<size_t>(mem.peak_stage)];
  const std::string& gpu =
      plan.cluster.gpu.name.empty() ? std::string("the GPU") : plan.cluster.gpu.name;
  std::string message;
  if (oom) {
    message = fmt::format("pipeline stage {} needs {} per GPU; `{}` has {}", s.stage,
                          FormatGiB(s.total), gpu, FormatGiB(capacity));
  } else {
    message = fmt::format("pipeline stage {} needs {} per GPU, {:.1f}% of the {} of `{}`", s.stage,
                          FormatGiB(s.total),
                          100.0 * static_cast<double>(s.total) / static_cast<double>(capacity),
                          FormatGiB(capacity), gpu);
  }
  Diag d(oom ? DiagKind::kStageOutOfMemory : DiagKind::kStageMemoryNearLimit, std::move(message));
  d.At(plan.declaration, fmt::format("stage {} needs {}", s.stage, FormatGiB(s.total)));
  if (plan.Range(fields::kClusterGpuMemory).IsValid())
    d.Label(plan.Range(fields::kClusterGpuMemory), fmt::format("{} per GPU", FormatGiB(capacity)));
  auto label = [&](FieldId field, std::string text) {
    if (plan.Range(field).IsValid()) d.Label(plan.Range(field), std::move(text));
  };
  label(fields::kBatchMicro,
        fmt::format("micro batch {} of {} tokens", plan.batch.micro, plan.model.seq_len));
  label(fields::kRecompute, fmt::format("recompute = {}", ToString(plan.recompute)));
  label(fields::kParallelPp,
        fmt::format("pp = {}: stage {} holds {} layers, {} microbatch(es) in flight",
                    plan.parallel.pp, s.stage, s.layers, s.in_flight));
  label(fields::kOptimizerZero, fmt::format("zero = {}", plan.optimizer.zero));
  for (size_t i = 0; i < kMemoryPartCount; ++i) {
    if (s.bytes[i] == 0) continue;
    d.Value(std::string(MemoryPartTitle(static_cast<MemoryPart>(i))), FormatGiB(s.bytes[i]));
  }
  d.Value(fmt::format("stage {} total", s.stage),
          fmt::format("{} {} {}", FormatGiB(s.total), oom ? ">" : "<=", FormatGiB(capacity)));
  int64_t over = 0;
  for (const StageMemory& st : mem.stages) over += st.total > (oom ? capacity : near) ? 1 : 0;
  if (mem.stages.size() > 1)
    d.Note(fmt::format(
        "{} of {} pipeline stages are {}; every stage is estimated, stage {} is the largest", over,
        mem.stages.size(), oom ? "over the limit" : fmt::format("above {}%", kNearLimitPercent),
        s.stage));
  d.Note(fmt::format(
      "per GPU: parameters, main gradients and optimizer state by precision and ZeRO stage, the "
      "activations of the {} microbatch(es) in flight under {}, communication buffers, {} "
      "of CUDA context and workspaces, and {}",
      s.in_flight, ToString(plan.pipeline.schedule), FormatGiB(s.Get(MemoryPart::kRuntimeReserve)),
      s.arena > 0 ? std::string("no allocator margin (planrun allocates its arena whole)")
                  : fmt::format("a {}% allocator margin", options.allocator_margin_percent)));
  const std::vector<MemoryFix> fixes = ProposeMemoryFixes(plan, oom ? capacity : near, options);
  for (const MemoryFix& fix : fixes) {
    d.Help(fmt::format("{} {} the largest stage ({}) to {}; predicted step {:.2f} s",
                       fix.description, fix.sets.size() > 1 ? "bring" : "brings", fix.peak_stage,
                       FormatGiB(fix.peak), fix.step_s));
  }
  if (fixes.empty())
    d.Help(
        "no single change of sp, recompute, zero, micro batch, tp, pp, cp, ep, offload or node "
        "count fits; combine them, or use a GPU with more memory");
  sink.Report(std::move(d));
}

}  // namespace paraplan
