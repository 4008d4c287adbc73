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

bool Explicit(const Plan& plan, std::string_view path) {
  OriginKind k = plan.Origin(path).kind;
  return k == OriginKind::kFile || k == OriginKind::kCommandLine || k == OriginKind::kStdlib;
}

// Axes among `paths` whose value is > 1, for choosing the primary range.
std::vector<std::string_view> Larger(
    const Plan& plan, std::initializer_list<std::pair<std::string_view, int64_t>> axes) {
  std::vector<std::string_view> out;
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
    return w && *w % multiple_of == 0 && ctx.Fixes({{"cluster.nodes", n}}, kind);
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

void CheckDenseMesh(RuleContext& ctx) {
  const Plan& p = ctx.plan();
  const ParallelSpec& par = p.parallel;
  // parallel.dp is an output here: the evaluator poisons an `auto` dp that does not divide and
  // leaves the report to this rule.
  if (ctx.Poisoned({"cluster.nodes", "cluster.gpus_per_node", "parallel.tp", "parallel.pp",
                    "parallel.cp"})) {
    return;
  }
  auto world = WorldSize(p);
  auto model = CheckedProduct({par.tp, par.pp, par.cp});
  if (!world || !model || *model <= 0) return;
  bool explicit_dp = Explicit(p, "parallel.dp");
  if (!explicit_dp) {
    if (*world % *model == 0) return;
    RuleDiag d(ctx, DiagKind::kDenseMeshWorld,
               "the " + std::to_string(*world) +
                   " GPUs do not split into whole data-parallel replicas of `tp · pp · cp` = " +
                   std::to_string(*model) + " GPUs");
    d.At(Larger(p, {{"parallel.cp", par.cp}, {"parallel.pp", par.pp}, {"parallel.tp", par.tp}}),
         "needs a multiple of " + std::to_string(*model) + " GPUs");
    d.Field("parallel.tp", par.tp)
        .Field("parallel.pp", par.pp)
        .Field("parallel.cp", par.cp)
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
        std::to_string(*world) + ") is not divisible by total_model_size (total_model_size=" +
        std::to_string(*model) + ")\"");
    if (ctx.helps()) {
      for (auto [path, value] : std::array<std::pair<std::string_view, int64_t>, 3>{
               {{"parallel.pp", par.pp}, {"parallel.tp", par.tp}, {"parallel.cp", par.cp}}}) {
        if (value <= 1 && path != "parallel.pp") continue;
        auto ok = ctx.WorkingValues(path, AxisCandidates(p), DiagKind::kDenseMeshWorld, 6);
        if (!ok.empty()) {
          d.Help("values of `" + std::string(ShortName(path)) + "` that fit " +
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
    return;
  }
  if (ctx.Poisoned({"parallel.dp"})) return;
  auto total = CheckedMul(*model, par.dp);
  if (total && *total == *world) return;
  RuleDiag d(
      ctx, DiagKind::kDenseMeshMismatch,
      "`tp · pp · cp · dp` = " + (total ? std::to_string(*total) : std::string("(overflow)")) +
          " GPUs, but the cluster has " + std::to_string(*world));
  d.At({"parallel.dp"}, total ? (*total > *world ? "needs " + std::to_string(*total) + " GPUs"
                                                 : "uses only " + std::to_string(*total) + " GPUs")
                              : std::string("too large"));
  d.Field("parallel.tp", par.tp).Field("parallel.pp", par.pp).Field("parallel.cp", par.cp);
  d.Field("parallel.dp", par.dp).World();
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
        ctx.Fixes({{"cluster.nodes", *total / p.cluster.gpus_per_node}},
                  DiagKind::kDenseMeshMismatch)) {
      d.Help("or `nodes = " + std::to_string(*total / p.cluster.gpus_per_node) + "` (" +
             std::to_string(*total) + " GPUs) for this mesh");
    }
  }
  d.Report();
}

void CheckExpertMesh(RuleContext& ctx) {
  const Plan& p = ctx.plan();
  const ParallelSpec& par = p.parallel;
  const ModelSpec& m = p.model;
  if (ctx.Poisoned({"parallel.ep"})) return;
  if (par.ep > 1 && !m.IsMoe() && !ctx.Poisoned({"model.experts"})) {
    RuleDiag d(
        ctx, DiagKind::kExpertParallelDense,
        "`ep = " + std::to_string(par.ep) + "` on `" + m.name + "`, a model without experts");
    d.At({"parallel.ep"}, "expert parallelism needs experts to split");
    d.Field("model.experts", m.experts);
    d.Note(
        "expert parallelism places different experts of an MoE layer on different GPUs; a dense "
        "model has none (Megatron-LM: \"num_experts must be non None to use expert model "
        "parallelism\")");
    d.Help("remove `ep` (or set `ep = 1`); to split a dense model further use `tp`, `pp` or `cp`");
    d.Report();
    return;
  }
  if (!m.IsMoe()) return;
  if (!ctx.Poisoned({"model.experts"}) && m.experts % par.ep != 0) {
    RuleDiag d(ctx, DiagKind::kExpertsNotDivisibleByEp,
               "`ep = " + std::to_string(par.ep) + "` does not divide the " +
                   std::to_string(m.experts) + " experts");
    d.At({"parallel.ep"}, std::to_string(m.experts) + " experts do not split over " +
                              std::to_string(par.ep) + " ranks");
    d.Field("model.experts", m.experts);
    d.Value("experts / ep", std::to_string(m.experts) + " / " + std::to_string(par.ep) + " = " +
                                Ratio(m.experts, par.ep) + ", not a whole number");
    d.Note(
        "every expert-parallel rank holds experts / ep whole experts (Megatron-LM: \"Number of "
        "experts should be a multiple of expert model parallel_size.\")");
    if (ctx.helps()) {
      auto ok = ctx.WorkingValues("parallel.ep", Divisors(m.experts),
                                  DiagKind::kExpertsNotDivisibleByEp, 6);
      if (!ok.empty())
        d.Help("values of `ep` that divide " + std::to_string(m.experts) + " experts: " + List(ok));
    }
    d.Report();
  }
  if (ctx.Poisoned(
          {"cluster.nodes", "cluster.gpus_per_node", "parallel.etp", "parallel.pp", "parallel.tp"}))
    return;
  if (par.ep == 1 && par.etp == par.tp) return;  // the dense mesh check covers tp · pp
  auto world = WorldSize(p);
  auto mesh = CheckedProduct({par.etp, par.ep, par.pp});
  if (!world) return;
  if (mesh && *mesh > 0 && *world % *mesh == 0) return;
  std::string mesh_text = mesh ? std::to_string(*mesh) : std::string("(overflow)");
  RuleDiag d(
      ctx, DiagKind::kExpertMeshWorld,
      mesh && *mesh > *world
          ? "the expert mesh `etp · ep · pp` needs " + mesh_text + " GPUs but the cluster has " +
                std::to_string(*world)
          : "the " + std::to_string(*world) +
                " GPUs do not split into whole copies of the expert mesh `etp · ep · pp` = " +
                mesh_text + " GPUs");
  d.At({"parallel.ep", "parallel.etp", "parallel.pp"},
       mesh && *mesh > *world ? "expert mesh needs " + mesh_text + " GPUs"
                              : "expert mesh of " + mesh_text + " GPUs");
  if (Explicit(p, "parallel.etp")) {
    d.Field("parallel.etp", par.etp);
  } else {
    d.Field("parallel.tp", par.tp);
    d.Note("`etp` is not set, so it defaults to `tp` = " + std::to_string(par.tp) +
           " (Megatron-Core's default)");
  }
  d.Field("parallel.pp", par.pp).World();
  d.Value("etp · ep · pp",
          Dot({par.etp, par.ep, par.pp}) + " = " + mesh_text +
              (mesh && *mesh > *world ? " > " + std::to_string(*world) + " GPUs"
                                      : ", and " + std::to_string(*world) + " / " + mesh_text +
                                            " = " + Ratio(*world, mesh.value_or(1))));
  d.Value("world = nodes · gpus_per_node",
          Dot({p.cluster.nodes, p.cluster.gpus_per_node}) + " = " + std::to_string(*world));
  d.Note(
      "Megatron-Core lays the expert layers on their own mesh etp × ep × edp × pp over the same "
      "GPUs, so etp · ep · pp must divide the world size (Megatron-Core: \"world_size (" +
      std::to_string(*world) +
      ") is not divisible by expert_tensor_model_pipeline_parallel size (" + mesh_text + ")\")");
  if (ctx.helps()) {
    if (par.etp != 1 && ctx.Fixes({{"parallel.etp", int64_t{1}}}, DiagKind::kExpertMeshWorld)) {
      d.Help("set `etp = 1` (experts without tensor parallelism): etp · ep · pp = " +
             Dot({1, par.ep, par.pp}) + " = " + std::to_string(par.ep * par.pp) + " divides " +
             std::to_string(*world));
    }
    auto ok = ctx.WorkingValues("parallel.ep", AxisCandidates(p), DiagKind::kExpertMeshWorld, 6);
    if (!ok.empty()) {
      d.Help("values of `ep` that fit " + std::to_string(*world) + " GPUs with etp = " +
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
  d.Report();
}

// A width that tp (or etp) must divide because Megatron splits that dimension over the group.
void CheckWidthSplit(RuleContext& ctx, DiagKind kind, std::string_view width_path, int64_t width,
                     std::string_view axis_path, int64_t axis, const std::string& what,
                     const std::string& note) {
  if (axis <= 1 || width <= 0 || width % axis == 0 || ctx.Poisoned({width_path, axis_path})) return;
  std::string axis_name(ShortName(axis_path));
  std::string width_name(ShortName(width_path));
  RuleDiag d(ctx, kind,
             "`" + axis_name + " = " + std::to_string(axis) + "` does not divide " + what);
  d.At({axis_path},
       std::to_string(width) + " / " + std::to_string(axis) + " is not a whole number");
  d.Field(width_path, width).Field(axis_path, axis);
  d.Value(width_name + " / " + axis_name,
          std::to_string(width) + " / " + std::to_string(axis) + " = " + Ratio(width, axis));
  d.Note(note);
  if (ctx.helps()) {
    auto ok = ctx.WorkingValues(axis_path, AxisCandidates(ctx.plan()), kind, 6);
    if (!ok.empty())
      d.Help("values of `" + axis_name + "` that divide " + std::to_string(width) + ": " +
             List(ok));
  }
  d.Report();
}

void CheckHeadsAndWidths(RuleContext& ctx) {
  const Plan& p = ctx.plan();
  const ParallelSpec& par = p.parallel;
  const ModelSpec& m = p.model;
  if (ctx.Poisoned({"parallel.tp"})) return;
  CheckWidthSplit(
      ctx, DiagKind::kHeadsNotDivisibleByTp, "model.heads", m.heads, "parallel.tp", par.tp,
      "the " + std::to_string(m.heads) + " attention heads",
      "tensor parallelism gives each rank heads / tp whole attention heads (Megatron-Core: "
      "\"num_attention_heads (" +
          std::to_string(m.heads) + ") must be a multiple of tensor_model_parallel_size (" +
          std::to_string(par.tp) + ").\")");
  bool heads_ok = m.heads > 0 && m.heads % par.tp == 0;
  if (heads_ok && m.kv_heads > 0 && m.kv_heads != m.heads && m.kv_heads % par.tp != 0 &&
      par.tp % m.kv_heads != 0 && !ctx.Poisoned({"model.kv_heads"})) {
    RuleDiag d(ctx, DiagKind::kKvHeadsVsTp,
               "`tp = " + std::to_string(par.tp) + "` is neither a multiple nor a divisor of the " +
                   std::to_string(m.kv_heads) + " KV heads");
    d.At({"parallel.tp"}, "splits " + std::to_string(m.kv_heads) + " KV heads unevenly");
    d.Field("model.kv_heads", m.kv_heads).Field("parallel.tp", par.tp);
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
      auto ok = ctx.WorkingValues("parallel.tp", AxisCandidates(p), DiagKind::kKvHeadsVsTp, 6);
      if (!ok.empty())
        d.Help("values of `tp` that fit " + std::to_string(m.kv_heads) + " KV heads: " + List(ok));
    }
    d.Report();
  }
  if (!m.IsMoe() || m.dense_layers > 0) {
    CheckWidthSplit(
        ctx, DiagKind::kFfnNotDivisibleByTp, "model.ffn_hidden", m.ffn_hidden, "parallel.tp",
        par.tp, "`ffn_hidden = " + std::to_string(m.ffn_hidden) + "`",
        "the MLP's first linear layer is split by columns and its second by rows over tp, so "
        "tp must divide ffn_hidden (Megatron-Core: \"" +
            std::to_string(m.ffn_hidden) + " is not divisible by " + std::to_string(par.tp) +
            "\")");
  }
  if (m.IsMoe() && m.moe_ffn_hidden > 0 && !ctx.Poisoned({"parallel.etp"})) {
    CheckWidthSplit(
        ctx, DiagKind::kMoeFfnNotDivisibleByEtp, "model.moe_ffn_hidden", m.moe_ffn_hidden,
        "parallel.etp", par.etp, "`moe_ffn_hidden = " + std::to_string(m.moe_ffn_hidden) + "`",
        "each expert's MLP is split over the expert tensor-parallel group, so etp must divide "
        "moe_ffn_hidden (Megatron-Core: \"" +
            std::to_string(m.moe_ffn_hidden) + " is not divisible by " + std::to_string(par.etp) +
            "\")");
  }
}

void CheckSequence(RuleContext& ctx) {
  const Plan& p = ctx.plan();
  const ParallelSpec& par = p.parallel;
  const ModelSpec& m = p.model;
  if (par.sp && par.tp == 1 && !ctx.Poisoned({"parallel.sp", "parallel.tp"})) {
    RuleDiag d(ctx, DiagKind::kSequenceParallelWithoutTp,
               "`sp = true` with `tp = 1`: sequence parallelism has no tensor-parallel group to "
               "split over");
    d.At({"parallel.sp"}, "has no effect");
    d.Field("parallel.tp", par.tp);
    d.Note(
        "sequence parallelism splits the layer-norm and dropout activations over the "
        "tensor-parallel "
        "group; Megatron-LM turns it off (\"Disabling sequence parallelism because tensor model "
        "parallelism is disabled\") and Megatron-Core used directly refuses it (\"Cannot use "
        "sequence "
        "parallelism without tensor parallelism\")");
    d.Help("remove `sp = true`, or use `tp` > 1");
    d.Report();
  }
  if (par.tp_comm_overlap && par.tp == 1 &&
      !ctx.Poisoned({"parallel.tp_comm_overlap", "parallel.tp"})) {
    RuleDiag d(ctx, DiagKind::kTpCommOverlapWithoutTp,
               "`tp_comm_overlap = true` with `tp = 1`: there are no tensor-parallel collectives "
               "to overlap");
    d.At({"parallel.tp_comm_overlap"}, "has no effect");
    d.Field("parallel.tp", par.tp);
    d.Note(
        "the overlap hides the all-gathers and reduce-scatters of the tensor-parallel group behind "
        "the linear GEMMs (Megatron-LM's --tp-comm-overlap, torchtitan's async tensor "
        "parallelism); with one rank there are none");
    d.Help("remove `tp_comm_overlap = true`, or use `tp` > 1");
    d.Report();
  } else if (par.tp_comm_overlap && par.tp > 1 && !par.sp &&
             !ctx.Poisoned({"parallel.tp_comm_overlap", "parallel.tp", "parallel.sp"})) {
    RuleDiag d(
        ctx, DiagKind::kTpCommOverlapWithoutSp,
        "`tp_comm_overlap = true` without sequence parallelism: Megatron-LM refuses the overlap");
    d.At({"parallel.tp_comm_overlap"}, "needs `sp = true`");
    d.Field("parallel.sp", std::string("false"));
    d.Note(
        "Megatron-LM overlaps the all-gather before and the reduce-scatter after the linear GEMMs "
        "of sequence parallelism (\"Tensor parallel communication/GEMM overlap can happen only "
        "when sequence parallelism is enabled\"); the time model still prices the overlap as "
        "written");
    d.Help("set `sp = true`, or remove `tp_comm_overlap = true`");
    d.Report();
  }
  if (par.cp > 1 && m.seq_len > 0 && !ctx.Poisoned({"parallel.cp", "model.seq_len"}) &&
      m.seq_len % (2 * par.cp) != 0) {
    RuleDiag d(ctx, DiagKind::kSeqLenVsCp,
               "`seq_len = " + std::to_string(m.seq_len) +
                   "` is not a multiple of 2 · cp = " + std::to_string(2 * par.cp));
    d.At({"parallel.cp"}, "cuts each sequence into " + std::to_string(2 * par.cp) + " chunks");
    d.Field("model.seq_len", m.seq_len).Field("parallel.cp", par.cp);
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
      auto ok = ctx.WorkingValues("parallel.cp", cands, DiagKind::kSeqLenVsCp, 6);
      if (!ok.empty()) d.Help("values of `cp` that divide the sequence: " + List(ok));
      int64_t step = 2 * par.cp;
      int64_t down = m.seq_len / step * step;
      std::vector<int64_t> lens;
      if (down > 0) lens.push_back(down);
      lens.push_back(down + step);
      auto ok_len = ctx.WorkingValues("model.seq_len", lens, DiagKind::kSeqLenVsCp, 2);
      if (!ok_len.empty())
        d.Help("or a sequence length that splits: " + Choices("seq_len", ok_len));
    }
    d.Report();
  } else if (par.sp && par.tp > 1 && m.seq_len > 0 && m.seq_len % par.cp == 0 &&
             !ctx.Poisoned({"parallel.tp", "parallel.cp", "parallel.sp", "model.seq_len"}) &&
             (m.seq_len / par.cp) % par.tp != 0) {
    int64_t local = m.seq_len / par.cp;
    RuleDiag d(ctx, DiagKind::kSeqLenVsTpSp,
               "with `sp = true` each rank's " + std::to_string(local) +
                   " tokens do not split over `tp = " + std::to_string(par.tp) + "`");
    d.At({"parallel.tp", "parallel.sp"}, "scatters the sequence over tp");
    d.Field("model.seq_len", m.seq_len).Field("parallel.tp", par.tp);
    if (par.cp > 1) d.Field("parallel.cp", par.cp);
    d.Value("(seq_len / cp) % tp", "(" + std::to_string(m.seq_len) + " / " +
                                       std::to_string(par.cp) + ") % " + std::to_string(par.tp) +
                                       " = " + std::to_string(local % par.tp));
    d.Note(
        "sequence parallelism scatters the sequence dimension over the tensor-parallel group; "
        "Megatron-Core fails at the first forward step with \"First dimension of the tensor should "
        "be divisible by tensor parallel size\"");
    if (ctx.helps()) {
      auto ok = ctx.WorkingValues("parallel.tp", AxisCandidates(p), DiagKind::kSeqLenVsTpSp, 6);
      if (!ok.empty())
        d.Help("values of `tp` that divide " + std::to_string(local) + ": " + List(ok));
    }
    d.Report();
  }
  if (par.ep > 1 && par.tp > 1 && !par.sp && m.IsMoe() &&
      !ctx.Poisoned({"parallel.ep", "parallel.tp", "parallel.sp"})) {
    RuleDiag d(ctx, DiagKind::kExpertTpWithoutSp,
               "expert parallelism (`ep = " + std::to_string(par.ep) + "`) with `tp = " +
                   std::to_string(par.tp) + "` but without sequence parallelism");
    d.At({"parallel.sp", "parallel.ep"}, "sequence parallelism is off");
    d.Field("parallel.ep", par.ep).Field("parallel.tp", par.tp);
    d.Note(
        "the MoE token dispatcher expects the sequence split over the tensor-parallel group; "
        "Megatron-Core warns \"When using expert parallelism and tensor parallelism for training, "
        "sequence parallelism must be used\" (an error up to v0.14)");
    d.Help("set `sp = true`");
    d.Report();
  }
}

constexpr std::array<std::string_view, 5> kOrderAxes = {"tp", "cp", "ep", "dp", "pp"};

void CheckOrder(RuleContext& ctx) {
  const Plan& p = ctx.plan();
  const ParallelSpec& par = p.parallel;
  if (ctx.Poisoned({"parallel.order"})) return;
  std::string_view order = par.order;
  std::array<int, 5> seen{};
  std::string problem;
  std::string last;
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
    last = std::string(token);
    if (dash == std::string_view::npos) break;
    pos = dash + 1;
  }
  int64_t edp = p.Edp();
  std::array<int64_t, 5> sizes = {std::max(par.tp, par.etp), par.cp, par.ep, std::max(par.dp, edp),
                                  par.pp};
  if (problem.empty()) {
    for (size_t i = 0; i < kOrderAxes.size(); ++i) {
      if (seen[i] == 0 && sizes[i] > 1) {
        problem = "`" + std::string(kOrderAxes[i]) + "` (size " + std::to_string(sizes[i]) +
                  ") is missing";
        break;
      }
    }
  }
  if (!problem.empty()) {
    RuleDiag d(ctx, DiagKind::kOrderInvalid,
               "`order = \"" + std::string(order) + "\"`: " + problem);
    d.At({"parallel.order"}, problem);
    d.Note(
        "the order lists the mesh axes from fastest- to slowest-varying rank; it may name each of "
        "tp, cp, ep, dp and pp once and must name every axis larger than 1 (Megatron-Core's "
        "RankGenerator: \"The size of (...) is (...), but you haven't specified the order\")");
    d.Help("Megatron-LM offers \"tp-cp-ep-dp-pp\" (the default) and \"tp-cp-ep-pp-dp\"");
    d.Report();
    return;
  }
  if (last == "pp" || par.pp <= 1 || edp == 0 || edp == par.dp ||
      ctx.Poisoned({"parallel.pp", "parallel.dp", "parallel.ep", "parallel.etp"})) {
    return;
  }
  RuleDiag d(ctx, DiagKind::kEdpDiffersFromDp,
             "`order = \"" + std::string(order) +
                 "\"` does not end in `pp`, and dp = " + std::to_string(par.dp) +
                 " differs from the expert data-parallel size edp = " + std::to_string(edp));
  d.At({"parallel.order"}, "pipeline is not the outermost axis");
  d.Field("parallel.pp", par.pp)
      .Field("parallel.ep", par.ep)
      .Field("parallel.etp", par.etp)
      .Field("parallel.dp", par.dp);
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
}

}  // namespace

void CheckMesh(RuleContext& ctx) {
  CheckDenseMesh(ctx);
  CheckExpertMesh(ctx);
  CheckHeadsAndWidths(ctx);
  CheckSequence(ctx);
  CheckOrder(ctx);
}

}  // namespace paraplan::rules
