#include "compiler/analyze/topology.h"

#include <fmt/format.h>

#include "compiler/analyze/format_util.h"
#include "compiler/base/checked.h"

namespace paraplan {

Topology AnalyzeTopology(const Layout& layout) {
  Topology t;
  t.gpus_per_node = layout.sizes().gpus_per_node;
  t.nodes = layout.nodes();
  for (GroupKind kind : AllGroupKinds()) {
    const GroupList& list = layout.Groups(kind);
    GroupPlacement& p = t.kinds[static_cast<size_t>(kind)];
    p.kind = kind;
    p.group_count = list.group_count();
    p.group_size = list.group_size;
    for (int64_t g = 0; g < list.group_count(); ++g) {
      auto members = list.Group(g);
      // Members ascend, so counting node changes counts the nodes.
      int64_t nodes = 1;
      for (size_t i = 1; i < members.size(); ++i) {
        if (members[i] / t.gpus_per_node != members[i - 1] / t.gpus_per_node) ++nodes;
      }
      if (nodes > 1) ++p.crossing_groups;
      p.max_nodes = std::max(p.max_nodes, nodes);
    }
  }
  return t;
}

namespace {

struct AxisWarning {
  GroupKind kind;
  FieldId path;           // the field to point at
  std::string_view what;  // "tensor-parallel"
  std::string_view traffic;
};

std::string CostInWords(const ClusterSpec& cluster) {
  if (cluster.nvlink_bandwidth > 0 && cluster.network_bandwidth > 0) {
    return fmt::format("the network's {} per GPU instead of NVLink's {}, about {} slower",
                       BandwidthText(cluster.network_bandwidth),
                       BandwidthText(cluster.nvlink_bandwidth),
                       RatioText(cluster.nvlink_bandwidth / cluster.network_bandwidth));
  }
  return "the network instead of NVLink (the cluster gives no bandwidths to compare)";
}

// The largest divisor of the node size `gpn` that is at most `limit` (>= 1).
int64_t LargestDivisorAtMost(int64_t gpn, int64_t limit) {
  int64_t best = 1;
  for (int64_t v : Divisors(gpn)) {
    if (v <= limit) best = v;
  }
  return best;
}

// The axes whose groups should stay inside a node, with the traffic each one carries.
std::vector<AxisWarning> AxesToKeepInNode(const Plan& plan, const MeshSizes& s) {
  const bool sp = plan.parallel.sp && s.tp > 1;
  std::vector<AxisWarning> axes = {
      {GroupKind::kTp, fields::kParallelTp,
       sp ? "tensor- and sequence-parallel" : "tensor-parallel",
       sp ? "every layer's all-gathers and reduce-scatters of activations (two forward, two "
            "backward)"
          : "every layer's all-reduces of activations (two forward, two backward)"},
      {GroupKind::kCp, fields::kParallelCp, "context-parallel",
       "every attention layer's exchange of key/value blocks around the ring"},
  };
  // Megatron-Core with DeepEP's dispatcher (moe.dispatcher = flex) is built for expert
  // parallelism across nodes: it overlaps the all-to-alls with computation, so an ep group that
  // spans nodes is the user's choice, not news.
  const bool ep_overlaps =
      plan.framework == Framework::kMegatronCore && plan.moe.dispatcher == Dispatcher::kFlex;
  if ((plan.model.IsMoe() || s.ep > 1) && !ep_overlaps) {
    axes.push_back(
        {GroupKind::kEp, fields::kParallelEp, "expert-parallel",
         "every MoE layer's token dispatch and combine (two all-to-alls forward, two backward)"});
  }
  if (plan.model.IsMoe() || s.ep > 1) {
    if (s.etp != s.tp) {  // with etp == tp the groups are the tp groups, reported once
      axes.push_back({GroupKind::kEtp, fields::kParallelEtp, "expert-tensor-parallel",
                      "every expert layer's tensor-parallel collectives"});
    }
  }
  return axes;
}

// Fixes for a cp group that spans nodes: the group must fit a node with its tp inside it.
void AddCpHelps(const MeshSizes& s, int64_t gpn, std::vector<std::string>& helps) {
  const int64_t room = gpn / std::max<int64_t>(s.tp, 1);
  if (room >= 2) {
    helps.push_back(fmt::format("keep tp · cp within a node: `cp = {}` with tp = {}",
                                LargestDivisorAtMost(gpn, room), s.tp));
  } else if (s.cp <= gpn && gpn % s.cp == 0 && gpn / s.cp >= 1) {
    helps.push_back(fmt::format("`tp = {}` with `cp = {}` keeps tp · cp = {} within a node",
                                gpn / s.cp, s.cp, gpn));
  }
  helps.push_back(
      "keep it if the sequences are long: a ring over nodes is common when it overlaps with "
      "attention compute");
}

// Fixes for an ep group that spans nodes: the group must fit a node with its etp inside it.
void AddEpHelps(const MeshSizes& s, int64_t gpn, std::vector<std::string>& helps) {
  const int64_t room = gpn / std::max<int64_t>(s.etp, 1);
  if (room >= 2) {
    helps.push_back(fmt::format("keep etp · ep within a node: `ep = {}` with etp = {}",
                                LargestDivisorAtMost(gpn, room), s.etp));
  }
  if (s.etp > 1) {
    const int64_t e1 = LargestDivisorAtMost(gpn, s.ep);
    helps.push_back(
        e1 == s.ep
            ? fmt::format("`etp = 1` keeps each expert-parallel group of {} on one node", s.ep)
            : fmt::format("`etp = 1` with `ep = {}` puts each expert-parallel group on one node",
                          e1));
  }
  if (s.ep > gpn) {
    helps.push_back(fmt::format(
        "keep `ep = {}` if the all-to-alls overlap with compute: large MoE runs often spread "
        "experts over nodes on purpose",
        s.ep));
  }
}

// Fixes: the group must fit a node and be adjacent ranks.
std::vector<std::string> KeepInNodeHelps(const AxisWarning& axis, const GroupPlacement& p,
                                         const MeshSizes& s, int64_t gpn) {
  const std::string name(GroupKindName(axis.kind));
  // With the inner axes first, a group spans the product of its axis and the axes inside it.
  const int64_t span = axis.kind == GroupKind::kCp   ? s.tp * s.cp
                       : axis.kind == GroupKind::kEp ? s.etp * s.ep
                                                     : p.group_size;
  const bool fits = span <= gpn && gpn % span == 0;
  std::vector<std::string> helps;
  if (axis.kind == GroupKind::kTp || axis.kind == GroupKind::kEtp) {
    if (p.group_size > gpn || gpn % p.group_size != 0) {
      helps.push_back(fmt::format(
          "keep {} inside a node: `{} = {}`{}", name, name, LargestDivisorAtMost(gpn, p.group_size),
          axis.kind == GroupKind::kTp ? " and spread the rest over pp or dp" : ""));
    }
  } else if (axis.kind == GroupKind::kCp && !fits) {
    AddCpHelps(s, gpn, helps);
  } else if (axis.kind == GroupKind::kEp && !fits) {
    AddEpHelps(s, gpn, helps);
  }
  if (fits) {
    helps.push_back(fmt::format(
        "{} fits a node, but the order \"{}\" spreads its groups; put the inner axes first, "
        "e.g. `parallel.order = \"tp-cp-ep-dp-pp\"`",
        name, s.order));
  }
  return helps;
}

}  // namespace

void RunTopologyChecks(const Plan& plan, const Layout& layout, const Topology& topology,
                       DiagnosticSink& sink) {
  const int64_t gpn = topology.gpus_per_node;
  const MeshSizes& s = layout.sizes();
  for (const AxisWarning& axis : AxesToKeepInNode(plan, s)) {
    const GroupPlacement& p = topology.Of(axis.kind);
    if (p.group_size <= 1 || p.IntraNode()) continue;
    const std::string name(GroupKindName(axis.kind));
    Diag d(
        DiagKind::kParallelGroupCrossesNetwork,
        fmt::format(
            "{} groups cross node boundaries: {} of {} `{}` groups of {} GPUs span up to {} nodes",
            axis.what, GroupDigits(p.crossing_groups), GroupDigits(p.group_count), name,
            p.group_size, p.max_nodes));
    d.At(plan.Range(axis.path),
         fmt::format("{} = {} spans {} nodes of {} GPUs", name, p.group_size, p.max_nodes, gpn));
    if (plan.Range(fields::kClusterGpusPerNode).IsValid()) {
      d.Label(plan.Range(fields::kClusterGpusPerNode),
              fmt::format("{} GPUs per node share NVLink", gpn));
    }
    d.Value(fmt::format("`{}` group size", name), std::to_string(p.group_size));
    d.Value("GPUs per node", std::to_string(gpn));
    d.Note(fmt::format("{} then runs over {}", axis.traffic, CostInWords(plan.cluster)));
    const std::vector<std::string> helps = KeepInNodeHelps(axis, p, s, gpn);
    for (size_t i = 0; i < helps.size(); ++i) d.Help(i == 0 ? helps[i] : "or " + helps[i]);
    sink.Report(std::move(d));
  }
}

}  // namespace paraplan
