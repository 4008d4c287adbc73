// planc explain, the text report and the one-rank view.
#include <fmt/format.h>

#include <algorithm>

#include "compiler/analyze/format_util.h"
#include "compiler/driver/explain.h"

namespace paraplan {
namespace {

std::string FlopsText(int64_t flops) {
  const char* units[] = {"FLOP", "kFLOP", "MFLOP", "GFLOP", "TFLOP", "PFLOP"};
  double v = static_cast<double>(flops);
  int u = 0;
  while (v >= 1000 && u < 5) {
    v /= 1000;
    ++u;
  }
  return u == 0 ? fmt::format("{} FLOP", flops) : fmt::format("{:.1f} {}", v, units[u]);
}

std::string LayersText(int64_t first, int64_t end) {
  if (end <= first) return "none (0)";
  if (end - first == 1) return fmt::format("{} (1)", first);
  return fmt::format("{}-{} ({})", first, end - 1, end - first);
}

std::string Holds(bool embedding, bool loss) {
  if (embedding && loss) return "embedding, loss";
  if (embedding) return "embedding";
  if (loss) return "loss";
  return "";
}

std::string PlacementText(const GroupPlacement& p) {
  if (p.group_size <= 1) return "each rank alone";
  if (p.IntraNode()) return "inside a node";
  if (p.crossing_groups == p.group_count) return fmt::format("across {} nodes", p.max_nodes);
  return fmt::format("{} of {} cross nodes", GroupDigits(p.crossing_groups),
                     GroupDigits(p.group_count));
}

std::string GroupText(std::span<const int64_t> g) {
  if (g.size() <= 8) return fmt::format("[{}]", fmt::join(g, ", "));
  bool contiguous = g.back() - g.front() == static_cast<int64_t>(g.size()) - 1;
  if (contiguous) return fmt::format("[{}..{}]", g.front(), g.back());
  return fmt::format("[{}, {}, {}, …, {}]", g[0], g[1], g[2], g.back());
}

// Ranks of one pipeline stage (every rank whose pp coordinate is `stage`), ascending.
std::vector<int64_t> StageRanks(const Layout& layout, int64_t stage) {
  std::vector<int64_t> ranks;
  const GroupList& pp = layout.Groups(GroupKind::kPp);
  ranks.reserve(static_cast<size_t>(pp.group_count()));
  for (int64_t g = 0; g < pp.group_count(); ++g)
    ranks.push_back(pp.Group(g)[static_cast<size_t>(stage)]);
  std::sort(ranks.begin(), ranks.end());
  return ranks;
}

std::vector<int64_t> NodesOf(const std::vector<int64_t>& ranks, int64_t gpus_per_node) {
  std::vector<int64_t> nodes;
  for (int64_t r : ranks) {
    int64_t n = r / gpus_per_node;
    if (nodes.empty() || nodes.back() != n) nodes.push_back(n);
  }
  return nodes;
}

std::string StageLayersText(const PipelineStage& s) {
  std::string out;
  for (const PipelineChunk& c : s.chunks) {
    if (!out.empty()) out += " | ";
    out += LayersText(c.first_layer, c.end_layer);
  }
  return out;
}

}  // namespace

std::string RankSetText(std::span<const int64_t> ranks, size_t max_runs) {
  std::vector<std::pair<int64_t, int64_t>> runs;
  for (int64_t r : ranks) {
    if (!runs.empty() && runs.back().second + 1 == r) {
      runs.back().second = r;
    } else {
      runs.emplace_back(r, r);
    }
  }
  std::string out;
  for (size_t i = 0; i < runs.size() && i < max_runs; ++i) {
    if (i > 0) out += ", ";
    out += runs[i].first == runs[i].second ? std::to_string(runs[i].first)
                                           : fmt::format("{}-{}", runs[i].first, runs[i].second);
  }
  if (runs.size() > max_runs)
    out += fmt::format(", … ({} runs)", GroupDigits(static_cast<int64_t>(runs.size())));
  return out;
}

std::string ExplainText(const ExplainInput& in) {
  const Plan& plan = in.plan;
  const Layout& layout = in.layout;
  const MeshSizes& s = layout.sizes();
  const Partition& part = in.partition;
  std::string out;
  out +=
      fmt::format("plan {}: {} ({} layers) on {} node{} × {} {} = {} ranks\n", plan.name,
                  plan.model.name.empty() ? "model" : plan.model.name, plan.model.layers,
                  GroupDigits(plan.cluster.nodes), plan.cluster.nodes == 1 ? "" : "s",
                  s.gpus_per_node, plan.cluster.gpu.name.empty() ? "GPUs" : plan.cluster.gpu.name,
                  GroupDigits(layout.world_size()));

  out += fmt::format("\nmesh  order \"{}\" (innermost first)\n", s.order);
  out += fmt::format("  dense   tp {} · cp {} · dp {} · pp {} = {}\n", s.tp, s.cp, s.dp, s.pp,
                     GroupDigits(layout.world_size()));
  out += fmt::format("  expert  etp {} · ep {} · edp {} · pp {} = {}\n", s.etp, s.ep, layout.edp(),
                     s.pp, GroupDigits(layout.world_size()));
  out += fmt::format("  vpp {}  sp {}  tp_comm_overlap {}\n", plan.parallel.vpp,
                     plan.parallel.sp && s.tp > 1 ? "on" : "off",
                     plan.parallel.tp_comm_overlap && s.tp > 1 ? "on" : "off");

  constexpr std::string_view kGroupRow = "  {:<9} {:>7} × {:<5}  {:<20} {}\n";
  out += "\ngroups\n";
  out += fmt::format(kGroupRow, "kind", "count", "size", "placement", "first groups");
  std::vector<std::string_view> singletons;
  for (GroupKind kind : AllGroupKinds()) {
    const GroupList& list = layout.Groups(kind);
    const GroupPlacement& p = in.topology.Of(kind);
    if (list.group_size <= 1 && kind != GroupKind::kEmbd && kind != GroupKind::kPosEmbd) {
      singletons.push_back(GroupKindName(kind));
      continue;
    }
    std::string first;
    for (int64_t g = 0; g < std::min<int64_t>(list.group_count(), 2); ++g) {
      first += (g ? " " : "") + GroupText(list.Group(g));
    }
    if (list.group_count() > 2) first += " …";
    out += fmt::format(kGroupRow, GroupKindName(kind), GroupDigits(list.group_count()),
                       list.group_size, PlacementText(p), first);
  }
  if (!singletons.empty())
    out += fmt::format("  size 1 (each rank alone): {}\n", fmt::join(singletons, ", "));

  out += fmt::format("\npipeline  {} layers over pp {}{}, {} split\n", part.layers, part.pp,
                     part.vpp > 1 ? fmt::format(" × vpp {}", part.vpp) : "", ToString(part.method));
  constexpr std::string_view kStageRow = "  {:<6} {:<6} {:<15} {:<16} {:<12} {}\n";
  out += fmt::format(kStageRow, "stage", "chunk", "layers", "holds", "cost/token", "ranks");
  for (const PipelineStage& st : part.stages) {
    std::string ranks = RankSetText(StageRanks(layout, st.pp_rank), 3);
    for (const PipelineChunk& c : st.chunks) {
      out += fmt::format(kStageRow, c.chunk == 0 ? std::to_string(st.pp_rank) : "", c.chunk,
                         LayersText(c.first_layer, c.end_layer), Holds(c.embedding, c.loss),
                         FlopsText(c.cost), c.chunk == 0 ? ranks : "");
    }
  }

  if (layout.world_size() <= kExplainRankRows) {
    constexpr std::string_view kRankRow =
        "  {:<5} {:<9} {:<2} {:<2} {:<2} {:<2}  {:<3} {:<2} {:<3}  {}\n";
    out += "\nranks\n";
    out += fmt::format(kRankRow, "rank", "node:gpu", "tp", "cp", "dp", "pp", "etp", "ep", "edp",
                       "layers");
    for (int64_t r = 0; r < layout.world_size(); ++r) {
      RankCoordinates c = layout.Coordinates(r);
      const PipelineStage& st = part.stages[static_cast<size_t>(c.pp)];
      std::string holds = Holds(st.embedding, st.loss);
      out += fmt::format(kRankRow, r, fmt::format("{}:{}", c.node, c.local), c.tp, c.cp, c.dp, c.pp,
                         c.etp, c.ep, c.edp,
                         StageLayersText(st) + (holds.empty() ? "" : " + " + holds));
    }
  } else {
    out += fmt::format("\nroles  {} ranks, one row per pipeline stage (--rank R shows one rank)\n",
                       GroupDigits(layout.world_size()));
    constexpr std::string_view kRoleRow = "  {:<6} {:<30} {:<21} {}\n";
    out += fmt::format(kRoleRow, "stage", "ranks", "nodes", "layers");
    for (const PipelineStage& st : part.stages) {
      std::vector<int64_t> ranks = StageRanks(layout, st.pp_rank);
      std::string holds = Holds(st.embedding, st.loss);
      out += fmt::format(kRoleRow, st.pp_rank, RankSetText(ranks, 2),
                         RankSetText(NodesOf(ranks, s.gpus_per_node), 2),
                         StageLayersText(st) + (holds.empty() ? "" : " + " + holds));
    }
  }
  out += in.text_sections;
  return out;
}

std::string ExplainRankText(const ExplainInput& in, int64_t rank) {
  const Layout& layout = in.layout;
  RankCoordinates c = layout.Coordinates(rank);
  std::string out = fmt::format("rank {} of {}: node {}, GPU {}\n", rank,
                                GroupDigits(layout.world_size()), c.node, c.local);
  out += fmt::format("  dense   tp {}  cp {}  dp {}  pp {}\n", c.tp, c.cp, c.dp, c.pp);
  out += fmt::format("  expert  etp {}  ep {}  edp {}  pp {}\n", c.etp, c.ep, c.edp, c.pp);
  out += "\ngroups\n";
  for (GroupKind kind : AllGroupKinds()) {
    auto g = layout.GroupOf(kind, rank);
    if (g.empty()) {
      out += fmt::format("  {:<9} (not a member: only the {} pipeline stage{} hold{} it)\n",
                         GroupKindName(kind),
                         kind == GroupKind::kEmbd ? "first and the last" : "first",
                         kind == GroupKind::kEmbd ? "s" : "", kind == GroupKind::kEmbd ? "" : "s");
      continue;
    }
    int64_t first_node = g.front() / layout.sizes().gpus_per_node;
    int64_t last_node = g.back() / layout.sizes().gpus_per_node;
    std::string where = first_node == last_node ? fmt::format("node {}", first_node)
                                                : fmt::format("nodes {}-{}", first_node, last_node);
    out += fmt::format("  {:<9} #{:<6} {:<32} {}\n", GroupKindName(kind),
                       layout.GroupIndexOf(kind, rank), RankSetText(g, 4), where);
  }
  const PipelineStage& st = in.partition.stages[static_cast<size_t>(c.pp)];
  out += fmt::format("\npipeline stage {} of {}", c.pp, in.partition.pp);
  int64_t prev = layout.PrevPipelineRank(rank), next = layout.NextPipelineRank(rank);
  out += fmt::format(" (receives from {}, sends to {})\n", prev < 0 ? "none" : std::to_string(prev),
                     next < 0 ? "none" : std::to_string(next));
  for (const PipelineChunk& ch : st.chunks) {
    std::string holds = Holds(ch.embedding, ch.loss);
    out +=
        fmt::format("  chunk {}  layers {}{}\n", ch.chunk, LayersText(ch.first_layer, ch.end_layer),
                    holds.empty() ? "" : " + " + holds);
  }
  return out;
}

}  // namespace paraplan
