// Where a communication group sits (how many members share a node) and what a collective on
// it costs: ring formulas with NCCL's bus-bandwidth factors, NVLink inside a node and the
// per-GPU network link across nodes (reference cost-models.md 4.1: the in-node share at NVLink
// bus bandwidth, each GPU's 1/q share across nodes on its own NIC; NCCL's rings pipeline the
// two tiers, so the slower one sets the time).
//
// Group placement follows Megatron's RankGenerator: a group kind's members are `stride` ranks
// apart, where stride is the product of the sizes before it in the order string (dense order
// with ep = 1; expert order tp=etp, cp=1, dp=edp). Made per plan by the time and memory models.
#ifndef PARAPLAN_COMPILER_ANALYZE_COST_COMM_H_
#define PARAPLAN_COMPILER_ANALYZE_COST_COMM_H_

#include <cstdint>
#include <string_view>

#include "compiler/analyze/cost_params.h"
#include "compiler/plan/plan.h"

namespace paraplan {

struct CommGroup {
  int64_t size = 1;      // members
  int64_t per_node = 1;  // members inside one node (== size when the group fits a node)
  bool CrossesNodes() const { return per_node < size; }
};

struct CommGroups {
  CommGroup tp, cp, dp_cp, pp, ep, etp, edp;
  bool pp_crosses_nodes = false;  // a pipeline neighbour is on another node
};

CommGroups PlaceGroups(const Plan& plan);

enum class Collective : uint8_t {
  kAllReduce,
  kReduceScatter,
  kAllGather,
  kAllToAll,
  kPointToPoint
};

// Seconds for one collective of `bytes` (all-reduce/reduce-scatter/all-gather: the full array;
// all-to-all: what each rank sends in total; point-to-point: the message) on a group.
double CollectiveSeconds(Collective kind, double bytes, const CommGroup& group,
                         const ClusterSpec& cluster, const GpuEfficiency& eff);

// The latency of a ring's n - 1 steps over `group`: a step that leaves the node costs the
// efficiency set's collective_latency_s, one over NVLink a third of it.
double RingStepsLatency(const CommGroup& group, const GpuEfficiency& eff);

// The dispatch (or combine) of an expert-parallel layer with DeepEP / HybridEP (Megatron's
// flex dispatcher): a token bound for several experts on one remote node crosses the network
// once, to that node, which forwards the copies to its experts over NVLink; the all-to-all
// dispatcher sends one copy per expert. `token_bytes`: the rank's tokens (one copy each);
// `topk`: experts per token; `max_nodes`: the nodes a token may reach (node-limited routing;
// 0: any). Returns the seconds, the NVLink and network tiers running at once.
double DedupAllToAllSeconds(double token_bytes, double topk, double max_nodes, const CommGroup& g,
                            const ClusterSpec& cluster, const GpuEfficiency& eff);

}  // namespace paraplan

#endif  // PARAPLAN_COMPILER_ANALYZE_COST_COMM_H_
