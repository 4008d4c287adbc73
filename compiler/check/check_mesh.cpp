// World and meshes: the dense mesh tp·pp·cp·dp, the expert mesh etp·ep·edp·pp, and how heads,
// KV heads, MLP widths, experts and the sequence split over them (Megatron-Core's rules; see
// docs/diagnostics/P03xx.md).
#include <algorithm>
#include <array>
#include <string>

#include "compiler/base/checked.h"
#include "compiler/check/rule_support.h"

namespace paraplan::rules {
namespace {

// Axes among `paths` whose value is > 1, for choosing the primary range.
std::vector<FieldId> Larger(std::initializer_list<std::pair<FieldId, int64_t>> axes) {
  std::vector<FieldId> out;
  for (const auto& [path, value] : axes) {
    if (value > 1) out.push_back(path);
  }
  for (const auto& [path, value] : axes) {
    if (value <= 1) out.push_back(path);
  }
  return out;
}

// The nearest node counts below and above the current one that make `kind` go away. Only
// counts whose world is a multiple of `multiple_of` are tried (a cheap filter).
std::vector<int64_t> NodesThatFit(RuleContext& ctx, DiagKind kind, int64_t multiple_of) {
  const Plan& p = ctx.plan();
  std::vector<int64_t> out;
  if (multiple_of <= 0) return out;
  auto fits = [&](int64_t n) {
    auto w = CheckedMul(n, p.cluster.gpus_per_node);
    return w && *w % multiple_of == 0 && ctx.Fixes({{fields::kClusterNodes, n}}, kind);
  };
  for (int64_t n = p.cluster.nodes - 1; n >= 1 && n >= p.cluster.nodes - 4096; --n) {
    if (fits(n)) {
      out.push_back(n);
      break;
    }
  }
  for (int64_t n = p.cluster.nodes + 1; n <= p.cluster.nodes + 4096; ++n) {
    if (fits(n)) {
      out.push_back(n);
      break;
    }
  }
  return out;
}

std::string NodesHelp(const Plan& p, const std::vector<int64_t>& nodes, const std::string& keeps) {
  std::string s;
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (i > 0) s += " or ";
    s += "`nodes = " + std::to_string(nodes[i]) + "` (" +
         std::to_string(nodes[i] * p.cluster.gpus_per_node) + " GPUs)";
  }
  return s + " keeps " + keeps;
}

// parallel.dp is an output of the dense mesh rule when not written: the evaluator poisons an
// `auto` dp that does not divide and leaves the report to this rule.
bool CheckDenseMeshWorld(RuleContext& ctx) {
  const Plan& p = ctx.plan();
  const ParallelSpec& par = p.parallel;
  auto world = WorldSize(p);
  auto model = CheckedProduct({par.tp, par.pp, par.cp});
  if (!world || !model || *model <= 0 || Explicit(p, fields::kParallelDp)) return false;
  if (*world % *model == 0) return false;
  RuleDiag d(ctx, DiagKind::kDenseMeshWorld,
             "the " + std::to_string(*world) +
                 " GPUs do not split into whole data-parallel replicas of `tp · pp · cp` = " +
                 std::to_string(*model) + " GPUs");
  d.At(Larger({{fields::kParallelCp, par.cp},
               {fields::kParallelPp, par.pp},
               {fields::kParallelTp, par.tp}}),
       "needs a multiple of " + std::to_string(*model) + " GPUs");
  d.Field(fields::kParallelTp, par.tp)
      .Field(fields::kParallelPp, par.pp)
      .Field(fields::kParallelCp, par.cp)
      .World();
  d.Value("tp · pp · cp", Dot({par.tp, par.pp, par.cp}) + " = " + std::to_string(*model));
  d.Value("world = nodes · gpus_per_node",
          Dot({p.cluster.nodes, p.cluster.gpus_per_node}) + " = " + std::to_string(*world));
  d.Value("dp = world / (tp · pp · cp)", std::to_string(*world) + " / " + std::to_string(*model) +
                                             " = " + Ratio(*world, *model) +
                                             ", not a whole number");
  d.Note(
      "Megatron-Core derives dp = world / (tp · pp · cp), so tp · pp · cp must divide the world "
      "size; Megatron-LM stops with \"world size (" +
      std::to_string(*world) +
      ") is not divisible by total_model_size (total_model_size=" + std::to_string(*model) + ")\"");
  if (ctx.helps()) {
    for (auto [field, value] :
         std::array<std::pair<FieldId, int64_t>, 3>{{{fields::kParallelPp, par.pp},
                                                     {fields::kParallelTp, par.tp},
                                                     {fields::kParallelCp, par.cp}}}) {
      if (value <= 1 && field != fields::kParallelPp) continue;
      auto ok = ctx.WorkingValues(field, AxisCandidates(p), DiagKind::kDenseMeshWorld, 6);
      if (!ok.empty()) {
        d.Help("values of `" + std::string(ShortName(field)) + "` that fit " +
               std::to_string(*world) + " GPUs with the other axes unchanged: " + List(ok));
      }
    }
    auto nodes = NodesThatFit(ctx, DiagKind::kDenseMeshWorld, *model);
    if (!nodes.empty()) {
      d.Help(NodesHelp(p, nodes,
                       "tp = " + std::to_string(par.tp) + ", pp = " + std::to_string(par.pp) +
                           ", cp = " + std::to_string(par.cp)));
    }
  }
  d.Report();
  return true;
}

bool CheckDenseMeshMismatch(RuleContext& ctx) {
  const Plan& p = ctx.plan();
  const ParallelSpec& par = p.parallel;
  auto world = WorldSize(p);
  auto model = CheckedProduct({par.tp, par.pp, par.cp});
  if (!world || !model || *model <= 0 || !Explicit(p, fields::kParallelDp)) return false;
  auto total = CheckedMul(*model, par.dp);
  if (total && *total == *world) return false;
  RuleDiag d(
      ctx, DiagKind::kDenseMeshMismatch,
      "`tp · pp · cp · dp` = " + (total ? std::to_string(*total) : std::string("(overflow)")) +
          " GPUs, but the cluster has " + std::to_string(*world));
  d.At({fields::kParallelDp},
       total ? (*total > *world ? "needs " + std::to_string(*total) + " GPUs"
                                : "uses only " + std::to_string(*total) + " GPUs")
             : std::string("too large"));
  d.Field(fields::kParallelTp, par.tp)
      .Field(fields::kParallelPp, par.pp)
      .Field(fields::kParallelCp, par.cp);
  d.Field(fields::kParallelDp, par.dp).World();
  d.Value("tp · pp · cp · dp", Dot({par.tp, par.pp, par.cp, par.dp}) + " = " +
                                   (total ? std::to_string(*total) : std::string("overflow")));
  d.Value("world = nodes · gpus_per_node",
          Dot({p.cluster.nodes, p.cluster.gpus_per_node}) + " = " + std::to_string(*world));
  d.Note(
      "every GPU holds exactly one position in the dense mesh, so tp · pp · cp · dp must equal "
      "the world size (Megatron-Core computes dp = world / (tp · pp · cp) instead of taking it)");
  if (ctx.helps()) {
    if (*world % *model == 0) {
      d.Help("write `dp = auto`, or `dp = " + std::to_string(*world / *model) + "`");
    } else {
      d.Help("tp · pp · cp = " + std::to_string(*model) + " does not divide " +
             std::to_string(*world) +
             " GPUs either: change `tp`, `pp` or `cp`, or the number of nodes");
    }
    if (total && *total % p.cluster.gpus_per_node == 0 &&
        *total / p.cluster.gpus_per_node != p.cluster.nodes &&
        ctx.Fixes({{fields::kClusterNodes, *total / p.cluster.gpus_per_node}},
                  DiagKind::kDenseMeshMismatch)) {
      d.Help("or `nodes = " + std::to_string(*total / p.cluster.gpus_per_node) + "` (" +
             std::to_string(*total) + " GPUs) for this mesh");
    }
  }
  d.Report();
  return true;
}

bool CheckExpertParallelDense(RuleContext& ctx) {
  const Plan& p = ctx.plan();
  const ModelSpec& m = p.model;
  if (p.parallel.ep <= 1 || m.IsMoe()) return false;
  RuleDiag d(
      ctx, DiagKind::kExpertParallelDense,
      "`ep = " + std::to_string(p.parallel.ep) + "` on `" + m.name + "`, a model without experts");
  d.At({fields::kParallelEp}, "expert parallelism needs experts to split");
  d.Field(fields::kModelExperts, m.experts);
  d.Note(
      "expert parallelism places different experts of an MoE layer on different GPUs; a dense "
      "model has none (Megatron-LM: \"num_experts must be non None to use expert model "
      "parallelism\")");
  d.Help("remove `ep` (or set `ep = 1`); to split a dense model further use `tp`, `pp` or `cp`");
  d.Report();
  return true;
}

bool CheckExpertsNotDivisibleByEp(RuleContext& ctx) {
  const Plan& p = ctx.plan();
  const ParallelSpec& par = p.parallel;
  const ModelSpec& m = p.model;
  if (!m.IsMoe() || par.ep <= 0 || m.experts % par.ep == 0) return false;
  RuleDiag d(ctx, DiagKind::kExpertsNotDivisibleByEp,
             "`ep = " + std::to_string(par.ep) + "` does not divide the " +
                 std::to_string(m.experts) + " experts");
  d.At({fields::kParallelEp}, std::to_string(m.experts) + " experts do not split over " +
                                  std::to_string(par.ep) + " ranks");
  d.Field(fields::kModelExperts, m.experts);
  d.Value("experts / ep", std::to_string(m.experts) + " / " + std::to_string(par.ep) + " = " +
                              Ratio(m.experts, par.ep) + ", not a whole number");
  d.Note(
      "every expert-parallel rank holds experts / ep whole experts (Megatron-LM: \"Number of "
      "experts should be a multiple of expert model parallel_size.\")");
  if (ctx.helps()) {
    auto ok = ctx.WorkingValues(fields::kParallelEp, Divisors(m.experts),
                                DiagKind::kExpertsNotDivisibleByEp, 6);
    if (!ok.empty())
      d.Help("values of `ep` that divide " + std::to_string(m.experts) + " experts: " + List(ok));
  }
  d.Report();
  return true;
}

// The helps of kExpertMeshWorld: etp = 1, other ep values, more nodes.
void ExpertMeshHelps(RuleContext& ctx, RuleDiag& d, int64_t world, std::optional<int64_t> mesh) {
  const Plan& p = ctx.plan();
  const ParallelSpec& par = p.parallel;
  if (par.etp != 1 && ctx.Fixes({{fields::kParallelEtp, int64_t{1}}}, DiagKind::kExpertMeshWorld)) {
    d.Help("set `etp = 1` (experts without tensor parallelism): etp · ep · pp = " +
           Dot({1, par.ep, par.pp}) + " = " + std::to_string(par.ep * par.pp) + " divides " +
           std::to_string(world));
  }
  auto ok =
      ctx.WorkingValues(fields::kParallelEp, AxisCandidates(p), DiagKind::kExpertMeshWorld, 6);
  if (!ok.empty()) {
    d.Help("values of `ep` that fit " + std::to_string(world) + " GPUs with etp = " +
           std::to_string(par.etp) + " and pp = " + std::to_string(par.pp) + ": " + List(ok));
  }
  if (mesh) {
    auto nodes = NodesThatFit(ctx, DiagKind::kExpertMeshWorld, *mesh);
    if (!nodes.empty() && nodes.back() > p.cluster.nodes) {
      d.Help(NodesHelp(p, {nodes.back()},
                       "tp = " + std::to_string(par.tp) + ", ep = " + std::to_string(par.ep) +
                           ", pp = " + std::to_string(par.pp)));
    }
  }
}

bool CheckExpertMeshWorld(RuleContext& ctx) {
  const Plan& p = ctx.plan();
  const ParallelSpec& par = p.parallel;
  // Without expert parallelism and with etp = tp the dense mesh check covers tp · pp.
  if (!p.model.IsMoe() || (par.ep == 1 && par.etp == par.tp)) return false;
  auto world = WorldSize(p);
  auto mesh = CheckedProduct({par.etp, par.ep, par.pp});
  if (!world || (mesh && *mesh > 0 && *world % *mesh == 0)) return false;
  std::string mesh_text = mesh ? std::to_string(*mesh) : std::string("(overflow)");
  const bool too_large = mesh && *mesh > *world;
  RuleDiag d(
      ctx, DiagKind::kExpertMeshWorld,
      too_large ? "the expert mesh `etp · ep · pp` needs " + mesh_text +
                      " GPUs but the cluster has " + std::to_string(*world)
                : "the " + std::to_string(*world) +
                      " GPUs do not split into whole copies of the expert mesh `etp · ep · pp` = " +
                      mesh_text + " GPUs");
  d.At({fields::kParallelEp, fields::kParallelEtp, fields::kParallelPp},
       too_large ? "expert mesh needs " + mesh_text + " GPUs"
                 : "expert mesh of " + mesh_text + " GPUs");
  if (Explicit(p, fields::kParallelEtp)) {
    d.Field(fields::kParallelEtp, par.etp);
  } else {
    d.Field(fields::kParallelTp, par.tp);
    d.Note("`etp` is not set, so it defaults to `tp` = " + std::to_string(par.tp) +
           " (Megatron-Core's default)");
  }
  d.Field(fields::kParallelPp, par.pp).World();
  d.Value("etp · ep · pp", Dot({par.etp, par.ep, par.pp}) + " = " + mesh_text +
                               (too_large ? " > " + std::to_string(*world) + " GPUs"
                                          : ", and " + std::to_string(*world) + " / " + mesh_text +
                                                " = " + Ratio(*world, mesh.value_or(1))));
  d.Value("world = nodes · gpus_per_node",
          Dot({p.cluster.nodes, p.cluster.gpus_per_node}) + " = " + std::to_string(*world));
  d.Note(
      "Megatron-Core lays the expert layers on their own mesh etp × ep × edp × pp over the same "
      "GPUs, so etp · ep · pp must divide the world size (Megatron-Core: \"world_size (" +
      std::to_string(*world) +
      ") is not divisible by expert_tensor_model_pipeline_parallel size (" + mesh_text + ")\")");
  if (ctx.helps()) ExpertMeshHelps(ctx, d, *world, mesh);
  d.Report();
  return true;
}

// A width that tp (or etp) must divide because Megatron splits that dimension over the group.
bool CheckWidthSplit(RuleContext& ctx, DiagKind kind, FieldId width_field, int64_t width,
                     FieldId axis_field, int64_t axis, const std::string& what,
                     const std::string& note) {
  if (axis <= 1 || width <= 0 || width % axis == 0) return false;
  std::string axis_name(ShortName(axis_field));
  std::string width_name(ShortName(width_field));
  RuleDiag d(ctx, kind,
             "`" + axis_name + " = " + std::to_string(axis) + "` does not divide " + what);
  d.At({axis_field},
       std::to_string(width) + " / " + std::to_string(axis) + " is not a whole number");
  d.Field(width_field, width).Field(axis_field, axis);
  d.Value(width_name + " / " + axis_name,
          std::to_string(width) + " / " + std::to_string(axis) + " = " + Ratio(width, axis));
  d.Note(note);
  if (ctx.helps()) {
    auto ok = ctx.WorkingValues(axis_field, AxisCandidates(ctx.plan()), kind, 6);
    if (!ok.empty())
      d.Help("values of `" + axis_name + "` that divide " + std::to_string(width) + ": " +
             List(ok));
  }
  d.Report();
  return true;
}

bool CheckHeadsNotDivisibleByTp(RuleContext& ctx) {
  const ModelSpec& m = ctx.plan().model;
  const int64_t tp = ctx.plan().parallel.tp;
  return CheckWidthSplit(
      ctx, DiagKind::kHeadsNotDivisibleByTp, fields::kModelHeads, m.heads, fields::kParallelTp, tp,
      "the " + std::to_string(m.heads) + " attention heads",
      "tensor parallelism gives each rank heads / tp whole attention heads (Megatron-Core: "
      "\"num_attention_heads (" +
          std::to_string(m.heads) + ") must be a multiple of tensor_model_parallel_size (" +
          std::to_string(tp) + ").\")");
}

bool CheckKvHeadsVsTp(RuleContext& ctx) {
  const Plan& p = ctx.plan();
  const ParallelSpec& par = p.parallel;
  const ModelSpec& m = p.model;
  const bool heads_ok = m.heads > 0 && par.tp > 0 && m.heads % par.tp == 0;
  if (!heads_ok || m.kv_heads <= 0 || m.kv_heads == m.heads || m.kv_heads % par.tp == 0 ||
      par.tp % m.kv_heads == 0) {
    return false;
  }
  RuleDiag d(ctx, DiagKind::kKvHeadsVsTp,
             "`tp = " + std::to_string(par.tp) + "` is neither a multiple nor a divisor of the " +
                 std::to_string(m.kv_heads) + " KV heads");
  d.At({fields::kParallelTp}, "splits " + std::to_string(m.kv_heads) + " KV heads unevenly");
  d.Field(fields::kModelKvHeads, m.kv_heads).Field(fields::kParallelTp, par.tp);
  d.Value("kv_heads / tp", std::to_string(m.kv_heads) + " / " + std::to_string(par.tp) + " = " +
                               Ratio(m.kv_heads, par.tp));
  d.Note(
      "with grouped-query attention each rank holds kv_heads / tp KV heads, or, when tp > "
      "kv_heads, "
      "each KV head is copied to tp / kv_heads ranks; either must be whole (Megatron-Core: "
      "\"num_query_groups (" +
      std::to_string(m.kv_heads) +
      ") must be a multiple or divisor of tensor_model_parallel_size (" + std::to_string(par.tp) +
      ").\")");
  if (ctx.helps()) {
    auto ok = ctx.WorkingValues(fields::kParallelTp, AxisCandidates(p), DiagKind::kKvHeadsVsTp, 6);
    if (!ok.empty())
      d.Help("values of `tp` that fit " + std::to_string(m.kv_heads) + " KV heads: " + List(ok));
  }
  d.Report();
  return true;
}

bool CheckFfnNotDivisibleByTp(RuleContext& ctx) {
  const ModelSpec& m = ctx.plan().model;
  const int64_t tp = ctx.plan().parallel.tp;
  if (m.IsMoe() && m.dense_layers <= 0) return false;  // no dense MLP
  return CheckWidthSplit(
      ctx, DiagKind::kFfnNotDivisibleByTp, fields::kModelFfnHidden, m.ffn_hidden,
      fields::kParallelTp, tp, "`ffn_hidden = " + std::to_string(m.ffn_hidden) + "`",
      "the MLP's first linear layer is split by columns and its second by rows over tp, so "
      "tp must divide ffn_hidden (Megatron-Core: \"" +
          std::to_string(m.ffn_hidden) + " is not divisible by " + std::to_string(tp) + "\")");
}

bool CheckMoeFfnNotDivisibleByEtp(RuleContext& ctx) {
  const ModelSpec& m = ctx.plan().model;
  const int64_t etp = ctx.plan().parallel.etp;
  if (!m.IsMoe()) return false;
  // Not set, the experts are ffn_hidden wide (ModelSpec::ExpertFfn).
  const bool own = m.moe_ffn_hidden > 0;
  const int64_t width = m.ExpertFfn();
  return CheckWidthSplit(
      ctx, DiagKind::kMoeFfnNotDivisibleByEtp,
      own ? fields::kModelMoeFfnHidden : fields::kModelFfnHidden, width, fields::kParallelEtp, etp,
      own ? "`moe_ffn_hidden = " + std::to_string(width) + "`"
          : "`ffn_hidden = " + std::to_string(width) +
                "` (the experts' width: moe_ffn_hidden is "
                "not set)",
      "each expert's MLP is split over the expert tensor-parallel group, so etp must divide "
      "moe_ffn_hidden (Megatron-Core: \"" +
          std::to_string(width) + " is not divisible by " + std::to_string(etp) + "\")");
}

bool CheckSequenceParallelWithoutTp(RuleContext& ctx) {
  const ParallelSpec& par = ctx.plan().parallel;
  if (!par.sp || par.tp != 1) return false;
  RuleDiag d(ctx, DiagKind::kSequenceParallelWithoutTp,
             "`sp = true` with `tp = 1`: sequence parallelism has no tensor-parallel group to "
             "split over");
  d.At({fields::kParallelSp}, "has no effect");
  d.Field(fields::kParallelTp, par.tp);
  d.Note(
      "sequence parallelism splits the layer-norm and dropout activations over the "
      "tensor-parallel "
      "group; Megatron-LM turns it off (\"Disabling sequence parallelism because tensor model "
      "parallelism is disabled\") and Megatron-Core used directly refuses it (\"Cannot use "
      "sequence "
      "parallelism without tensor parallelism\")");
  d.Help("remove `sp = true`, or use `tp` > 1");
  d.Report();
  return true;
}

bool CheckTpCommOverlapWithoutTp(RuleContext& ctx) {
  const ParallelSpec& par = ctx.plan().parallel;
  if (!par.tp_comm_overlap || par.tp != 1) return false;
  RuleDiag d(ctx, DiagKind::kTpCommOverlapWithoutTp,
             "`tp_comm_overlap = true` with `tp = 1`: there are no tensor-parallel collectives "
             "to overlap");
  d.At({fields::kParallelTpCommOverlap}, "has no effect");
  d.Field(fields::kParallelTp, par.tp);
  d.Note(
      "the overlap hides the all-gathers and reduce-scatters of the tensor-parallel group behind "
      "the linear GEMMs (Megatron-LM's --tp-comm-overlap, torchtitan's async tensor "
      "parallelism); with one rank there are none");
  d.Help("remove `tp_comm_overlap = true`, or use `tp` > 1");
  d.Report();
  return true;
}

bool CheckTpCommOverlapWithoutSp(RuleContext& ctx) {
  const ParallelSpec& par = ctx.plan().parallel;
  if (!par.tp_comm_overlap || par.tp <= 1 || par.sp) return false;
  RuleDiag d(
      ctx, DiagKind::kTpCommOverlapWithoutSp,
      "`tp_comm_overlap = true` without sequence parallelism: Megatron-LM refuses the overlap");
  d.At({fields::kParallelTpCommOverlap}, "needs `sp = true`");
  d.Field(fields::kParallelSp, std::string("false"));
  d.Note(
      "Megatron-LM overlaps the all-gather before and the reduce-scatter after the linear GEMMs "
      "of sequence parallelism (\"Tensor parallel communication/GEMM overlap can happen only "
      "when sequence parallelism is enabled\"); the time model still prices the overlap as "
      "written");
  d.Help("set `sp = true`, or remove `tp_comm_overlap = true`");
  d.Report();
  return true;
}

// Context parallelism cuts each sequence into 2 · cp chunks.
bool SeqLenSplitsOverCp(const Plan& p) {
  return p.parallel.cp <= 1 || p.model.seq_len <= 0 || p.model.seq_len % (2 * p.parallel.cp) == 0;
}

bool CheckSeqLenVsCp(RuleContext& ctx) {
  const Plan& p = ctx.plan();
  const ParallelSpec& par = p.parallel;
  const ModelSpec& m = p.model;
  if (SeqLenSplitsOverCp(p)) return false;
  RuleDiag d(ctx, DiagKind::kSeqLenVsCp,
             "`seq_len = " + std::to_string(m.seq_len) +
                 "` is not a multiple of 2 · cp = " + std::to_string(2 * par.cp));
  d.At({fields::kParallelCp}, "cuts each sequence into " + std::to_string(2 * par.cp) + " chunks");
  d.Field(fields::kModelSeqLen, m.seq_len).Field(fields::kParallelCp, par.cp);
  d.Value("seq_len % (2 · cp)", std::to_string(m.seq_len) + " % " + std::to_string(2 * par.cp) +
                                    " = " + std::to_string(m.seq_len % (2 * par.cp)));
  d.Note(
      "context parallelism balances causal attention by cutting every sequence into 2 · cp equal "
      "chunks, two per rank (Megatron-LM: \"seq-length should be a multiple of 2 * "
      "context-parallel-size if context-parallel-size > 1.\")");
  if (ctx.helps()) {
    std::vector<int64_t> cands;
    for (int64_t c : AxisCandidates(p)) {
      if (m.seq_len % (2 * c) == 0 || c == 1) cands.push_back(c);
    }
    auto ok = ctx.WorkingValues(fields::kParallelCp, cands, DiagKind::kSeqLenVsCp, 6);
    if (!ok.empty()) d.Help("values of `cp` that divide the sequence: " + List(ok));
    int64_t step = 2 * par.cp;
    int64_t down = m.seq_len / step * step;
    std::vector<int64_t> lens;
    if (down > 0) lens.push_back(down);
    lens.push_back(down + step);
    auto ok_len = ctx.WorkingValues(fields::kModelSeqLen, lens, DiagKind::kSeqLenVsCp, 2);
    if (!ok_len.empty()) d.Help("or a sequence length that splits: " + Choices("seq_len", ok_len));
  }
  d.Report();
  return true;
}

bool CheckSeqLenVsTpSp(RuleContext& ctx) {
  const Plan& p = ctx.plan();
  const ParallelSpec& par = p.parallel;
  const ModelSpec& m = p.model;
  // One sequence problem at a time: the cp split first (kSeqLenVsCp).
  if (!par.sp || par.tp <= 1 || m.seq_len <= 0 || par.cp <= 0 || !SeqLenSplitsOverCp(p) ||
      m.seq_len % par.cp != 0 || (m.seq_len / par.cp) % par.tp == 0) {
    return false;
  }
  int64_t local = m.seq_len / par.cp;
  RuleDiag d(ctx, DiagKind::kSeqLenVsTpSp,
             "with `sp = true` each rank's " + std::to_string(local) +
                 " tokens do not split over `tp = " + std::to_string(par.tp) + "`");
  d.At({fields::kParallelTp, fields::kParallelSp}, "scatters the sequence over tp");
  d.Field(fields::kModelSeqLen, m.seq_len).Field(fields::kParallelTp, par.tp);
  if (par.cp > 1) d.Field(fields::kParallelCp, par.cp);
  d.Value("(seq_len / cp) % tp", "(" + std::to_string(m.seq_len) + " / " + std::to_string(par.cp) +
                                     ") % " + std::to_string(par.tp) + " = " +
                                     std::to_string(local % par.tp));
  d.Note(
      "sequence parallelism scatters the sequence dimension over the tensor-parallel group; "
      "Megatron-Core fails at the first forward step with \"First dimension of the tensor should "
      "be divisible by tensor parallel size\"");
  if (ctx.helps()) {
    auto ok = ctx.WorkingValues(fields::kParallelTp, AxisCandidates(p), DiagKind::kSeqLenVsTpSp, 6);
    if (!ok.empty())
      d.Help("values of `tp` that divide " + std::to_string(local) + ": " + List(ok));
  }
  d.Report();
  return true;
}

bool CheckExpertTpWithoutSp(RuleContext& ctx) {
  const Plan& p = ctx.plan();
  const ParallelSpec& par = p.parallel;
  if (par.ep <= 1 || par.tp <= 1 || par.sp || !p.model.IsMoe()) return false;
  RuleDiag d(ctx, DiagKind::kExpertTpWithoutSp,
             "expert parallelism (`ep = " + std::to_string(par.ep) +
                 "`) with `tp = " + std::to_string(par.tp) + "` but without sequence parallelism");
  d.At({fields::kParallelSp, fields::kParallelEp}, "sequence parallelism is off");
  d.Field(fields::kParallelEp, par.ep).Field(fields::kParallelTp, par.tp);
  d.Note(
      "the MoE token dispatcher expects the sequence split over the tensor-parallel group; "
      "Megatron-Core warns \"When using expert parallelism and tensor parallelism for training, "
      "sequence parallelism must be used\" (an error up to v0.14)");
  d.Help("set `sp = true`");
  d.Report();
  return true;
}

constexpr std::array<std::string_view, 5> kOrderAxes = {"tp", "cp", "ep", "dp", "pp"};

// What is wrong with parallel.order (empty when nothing), and its last axis.
std::string OrderProblem(const Plan& p, std::string* last) {
  const ParallelSpec& par = p.parallel;
  std::string_view order = par.order;
  std::array<int, 5> seen{};
  std::string problem;
  size_t pos = 0;
  while (pos <= order.size()) {
    size_t dash = order.find('-', pos);
    std::string_view token =
        order.substr(pos, dash == std::string_view::npos ? std::string_view::npos : dash - pos);
    auto it = std::find(kOrderAxes.begin(), kOrderAxes.end(), token);
    if (it == kOrderAxes.end()) {
      if (problem.empty()) problem = "`" + std::string(token) + "` is not an axis";
    } else if (++seen[it - kOrderAxes.begin()] == 2 && problem.empty()) {
      problem = "`" + std::string(token) + "` appears twice";
    }
    *last = std::string(token);
    if (dash == std::string_view::npos) break;
    pos = dash + 1;
  }
  const int64_t edp = p.Edp();
  std::array<int64_t, 5> sizes = {std::max(par.tp, par.etp), par.cp, par.ep, std::max(par.dp, edp),
                                  par.pp};
  if (problem.empty()) {
    for (size_t i = 0; i < kOrderAxes.size(); ++i) {
      if (seen[i] == 0 && sizes[i] > 1) {
        return "`" + std::string(kOrderAxes[i]) + "` (size " + std::to_string(sizes[i]) +
               ") is missing";
      }
    }
  }
  return problem;
}

bool CheckOrderInvalid(RuleContext& ctx) {
  const Plan& p = ctx.plan();
  std::string last;
  const std::string problem = OrderProblem(p, &last);
  if (problem.empty()) return false;
  RuleDiag d(ctx, DiagKind::kOrderInvalid, "`order = \"" + p.parallel.order + "\"`: " + problem);
  d.At({fields::kParallelOrder}, problem);
  d.Note(
      "the order lists the mesh axes from fastest- to slowest-varying rank; it may name each of "
      "tp, cp, ep, dp and pp once and must name every axis larger than 1 (Megatron-Core's "
      "RankGenerator: \"The size of (...) is (...), but you haven't specified the order\")");
  d.Help("Megatron-LM offers \"tp-cp-ep-dp-pp\" (the default) and \"tp-cp-ep-pp-dp\"");
  d.Report();
  return true;
}

bool CheckEdpDiffersFromDp(RuleContext& ctx) {
  const Plan& p = ctx.plan();
  const ParallelSpec& par = p.parallel;
  std::string last;
  if (!OrderProblem(p, &last).empty()) return false;  // kOrderInvalid
  const int64_t edp = p.Edp();
  if (last == "pp" || par.pp <= 1 || edp == 0 || edp == par.dp) return false;
  RuleDiag d(ctx, DiagKind::kEdpDiffersFromDp,
             "`order = \"" + par.order +
                 "\"` does not end in `pp`, and dp = " + std::to_string(par.dp) +
                 " differs from the expert data-parallel size edp = " + std::to_string(edp));
  d.At({fields::kParallelOrder}, "pipeline is not the outermost axis");
  d.Field(fields::kParallelPp, par.pp)
      .Field(fields::kParallelEp, par.ep)
      .Field(fields::kParallelEtp, par.etp)
      .Field(fields::kParallelDp, par.dp);
  d.Value("edp = world / (etp · ep · pp)", std::to_string(p.World()) + " / " +
                                               Dot({par.etp, par.ep, par.pp}) + " = " +
                                               std::to_string(edp));
  d.Note(
      "with pp inside dp, the dense and the expert mesh give the pipeline axis different strides "
      "unless dp == edp, and their pipeline groups would differ (Megatron-Core: \"When not using "
      "pp-last rank ordering, the data parallel size of the attention and moe layers must be the "
      "same\")");
  d.Help("use an order that ends in pp, e.g. \"tp-cp-ep-dp-pp\"");
  d.Report();
  return true;
}

}  // namespace

const std::vector<Rule>& MeshRules() {
  using namespace fields;  // NOLINT(google-build-using-namespace): the table reads as paths
  using K = DiagKind;
  static const std::vector<Rule> kRules = {
      {K::kDenseMeshWorld,
       CheckDenseMeshWorld,
       {kClusterNodes, kClusterGpusPerNode, kParallelTp, kParallelPp, kParallelCp}},
      {K::kDenseMeshMismatch,
       CheckDenseMeshMismatch,
       {kClusterNodes, kClusterGpusPerNode, kParallelTp, kParallelPp, kParallelCp, kParallelDp}},
      {K::kExpertParallelDense, CheckExpertParallelDense, {kParallelEp, kModelExperts}},
      {K::kExpertsNotDivisibleByEp, CheckExpertsNotDivisibleByEp, {kParallelEp, kModelExperts}},
      {K::kExpertMeshWorld,
       CheckExpertMeshWorld,
       {kParallelEp, kClusterNodes, kClusterGpusPerNode, kParallelEtp, kParallelPp, kParallelTp}},
      {K::kHeadsNotDivisibleByTp, CheckHeadsNotDivisibleByTp, {kParallelTp, kModelHeads}},
      {K::kKvHeadsVsTp, CheckKvHeadsVsTp, {kParallelTp, kModelKvHeads}},
      {K::kFfnNotDivisibleByTp, CheckFfnNotDivisibleByTp, {kParallelTp, kModelFfnHidden}},
      {K::kMoeFfnNotDivisibleByEtp,
       CheckMoeFfnNotDivisibleByEtp,
       {kParallelTp, kParallelEtp, kModelMoeFfnHidden}},
      {K::kSequenceParallelWithoutTp, CheckSequenceParallelWithoutTp, {kParallelSp, kParallelTp}},
      {K::kTpCommOverlapWithoutTp,
       CheckTpCommOverlapWithoutTp,
       {kParallelTpCommOverlap, kParallelTp}},
      {K::kTpCommOverlapWithoutSp,
       CheckTpCommOverlapWithoutSp,
       {kParallelTpCommOverlap, kParallelTp, kParallelSp}},
      {K::kSeqLenVsCp, CheckSeqLenVsCp, {kParallelCp, kModelSeqLen}},
      {K::kSeqLenVsTpSp, CheckSeqLenVsTpSp, {kParallelTp, kParallelCp, kParallelSp, kModelSeqLen}},
      {K::kExpertTpWithoutSp, CheckExpertTpWithoutSp, {kParallelEp, kParallelTp, kParallelSp}},
      {K::kOrderInvalid, CheckOrderInvalid, {kParallelOrder}},
      {K::kEdpDiffersFromDp,
       CheckEdpDiffersFromDp,
       {kParallelOrder, kParallelPp, kParallelDp, kParallelEp, kParallelEtp}},
  };
  return kRules;
}

}  // namespace paraplan::rules
