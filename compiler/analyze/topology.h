// Topology: how the rank layout falls onto nodes. For every group kind, how many of its
// groups stay inside one node (NVLink) and how many span several (network).
//
// Ranks map to nodes in order: node = rank / gpus_per_node (torchrun / Slurm block placement,
// as Megatron assumes). Made by AnalyzeTopology from a Layout; read by the topology check
// (P0605: tensor, sequence, context or expert parallel traffic over the network) and by
// `planc explain`.
#ifndef PARAPLAN_COMPILER_ANALYZE_TOPOLOGY_H_
#define PARAPLAN_COMPILER_ANALYZE_TOPOLOGY_H_

#include <array>
#include <cstdint>

#include "compiler/analyze/layout.h"
#include "compiler/diagnostics/diagnostic.h"
#include "compiler/plan/plan.h"

namespace paraplan {

struct GroupPlacement {
  GroupKind kind = GroupKind::kTp;
  int64_t group_count = 0;
  int64_t group_size = 0;
  int64_t crossing_groups = 0;  // groups whose members sit on more than one node
  int64_t max_nodes = 0;        // the most nodes one group spans (1 = inside a node)

  bool IntraNode() const { return crossing_groups == 0; }
};

struct Topology {
  int64_t nodes = 0;
  int64_t gpus_per_node = 0;
  std::array<GroupPlacement, kGroupKindCount> kinds;

  const GroupPlacement& Of(GroupKind kind) const { return kinds[static_cast<size_t>(kind)]; }
};

Topology AnalyzeTopology(const Layout& layout);

// Warns (P0605) for every tp (with sp), cp, ep and etp group kind that crosses nodes, with the
// cost in words from the cluster's NVLink and network bandwidth, and concrete fixes.
void RunTopologyChecks(const Plan& plan, const Layout& layout, const Topology& topology,
                       DiagnosticSink& sink);

}  // namespace paraplan

#endif  // PARAPLAN_COMPILER_ANALYZE_TOPOLOGY_H_
