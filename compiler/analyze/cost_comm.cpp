#include "compiler/analyze/cost_comm.h"

#include <algorithm>
#include <array>
#include <cmath>

namespace paraplan {
namespace {

enum Axis { kTp, kCp, kEp, kDp, kPp, kAxes };

// Position of each axis in the order string ("tp-cp-ep-dp-pp"); an order that does not name
// all five falls back to Megatron's default.
std::array<int, kAxes> OrderPositions(std::string_view order) {
  std::array<int, kAxes> pos = {0, 1, 2, 3, 4};
  std::array<int, kAxes> found = {-1, -1, -1, -1, -1};
  int index = 0;
  size_t start = 0;
  while (start <= order.size()) {
    size_t end = order.find('-', start);
    if (end == std::string_view::npos) end = order.size();
    std::string_view token = order.substr(start, end - start);
    int axis = token == "tp"   ? kTp
               : token == "cp" ? kCp
               : token == "ep" ? kEp
               : token == "dp" ? kDp
               : token == "pp" ? kPp
                               : -1;
    if (axis < 0 || found[axis] >= 0) return pos;
    found[axis] = index++;
    start = end + 1;
  }
  for (int a = 0; a < kAxes; ++a)
    if (found[a] < 0) return pos;
  return found;
}

CommGroup Place(int64_t size, int64_t stride, int64_t gpus_per_node) {
  CommGroup g;
  g.size = std::max<int64_t>(1, size);
  stride = std::max<int64_t>(1, stride);
  gpus_per_node = std::max<int64_t>(1, gpus_per_node);
  if (stride >= gpus_per_node) {
    g.per_node = 1;
  } else {
    g.per_node = std::min(g.size, std::max<int64_t>(1, gpus_per_node / stride));
  }
  return g;
}

int64_t StrideOf(int axis, const std::array<int, kAxes>& pos,
                 const std::array<int64_t, kAxes>& sizes) {
  int64_t stride = 1;
  for (int a = 0; a < kAxes; ++a)
    if (pos[a] < pos[axis]) stride *= sizes[a];
  return stride;
}

}  // namespace

CommGroups PlaceGroups(const Plan& plan) {
  const ParallelSpec& par = plan.parallel;
  const int64_t gpn = plan.cluster.gpus_per_node;
  const auto pos = OrderPositions(par.order);
  const std::array<int64_t, kAxes> dense = {par.tp, par.cp, 1, par.dp, par.pp};
  const int64_t world = std::max<int64_t>(1, plan.cluster.nodes * plan.cluster.gpus_per_node);
  const int64_t expert_unit = std::max<int64_t>(1, par.etp * par.ep * par.pp);
  const int64_t edp = std::max<int64_t>(1, world / expert_unit);
  const std::array<int64_t, kAxes> expert = {par.etp, 1, par.ep, edp, par.pp};
  CommGroups c;
  c.tp = Place(par.tp, StrideOf(kTp, pos, dense), gpn);
  c.cp = Place(par.cp, StrideOf(kCp, pos, dense), gpn);
  // DP x CP: the gradient group when cp > 1; contiguous when cp and dp are adjacent in the order.
  const int64_t dp_cp_stride = std::min(StrideOf(kCp, pos, dense), StrideOf(kDp, pos, dense));
  c.dp_cp = Place(par.dp * par.cp, par.cp > 1 ? dp_cp_stride : StrideOf(kDp, pos, dense), gpn);
  c.pp = Place(par.pp, StrideOf(kPp, pos, dense), gpn);
  c.etp = Place(par.etp, StrideOf(kTp, pos, expert), gpn);
  c.ep = Place(par.ep, StrideOf(kEp, pos, expert), gpn);
  c.edp = Place(edp, StrideOf(kDp, pos, expert), gpn);
  c.pp_crosses_nodes = par.pp > 1 && StrideOf(kPp, pos, dense) * 2 > gpn;
  return c;
}

double CollectiveSeconds(Collective kind, double bytes, const CommGroup& g,
                         const ClusterSpec& cluster, const GpuEfficiency& eff) {
  const double n = static_cast<double>(g.size);
  if (bytes <= 0) return 0;
  const double nvl = std::max(1.0, cluster.nvlink_bandwidth * eff.nvlink_bus_fraction);
  const double net = std::max(1.0, cluster.network_bandwidth * eff.network_bus_fraction);
  if (kind == Collective::kPointToPoint) {
    return bytes / (g.CrossesNodes() ? net : nvl) + eff.p2p_latency_s;
  }
  if (g.size <= 1) return 0;
  const double q = static_cast<double>(g.per_node);
  double seconds = 0;
  if (kind == Collective::kAllToAll) {
    // Each rank sends bytes/n to every member: (q-1)/n of it stays on NVLink, (n-q)/n leaves.
    // The two go out at once on their own links (NCCL's point-to-point channels), so the slower
    // sets the time.
    seconds = std::max(bytes * (q - 1) / n / nvl, bytes * (n - q) / n / net);
    return seconds + (n - 1) * eff.collective_latency_s;
  }
  // Reduce-scatter and all-gather move (n-1)/n of the array through every rank; all-reduce twice
  // that. Across nodes NCCL runs q rings side by side, each leaving a node through its own
  // GPU's NIC: a GPU forwards (q-1)/q of its traffic over NVLink and 1/q over the network, the
  // two tiers pipelined, so the slower one sets the time (not their sum, which is what a
  // hierarchical reduce-scatter / all-reduce / all-gather would take).
  double one_pass = 0;
  if (!g.CrossesNodes()) {
    one_pass = (n - 1) / n * bytes / nvl;
  } else {
    one_pass = std::max((q - 1) / q * bytes / nvl, (n - 1) / n * (bytes / q) / net);
  }
  const double passes = kind == Collective::kAllReduce ? 2 : 1;
  return passes * one_pass + passes * (n - 1) * eff.collective_latency_s;
}

// NCCL's own latency model (src/graph/tuning.cc, hwLat) prices a ring step over NVLink at about
// a third of one over the network: 0.47 x 1.8 against 2.7 us for the LL protocol that small
// messages take, 3.4 against 9.6 us for Simple. A ring over n ranks on n / q nodes takes
// n / q - 1 network steps and the rest inside nodes.
double RingStepsLatency(const CommGroup& g, const GpuEfficiency& eff) {
  if (g.size <= 1) return 0;
  const double n = static_cast<double>(g.size);
  const double nodes = std::ceil(n / static_cast<double>(std::max<int64_t>(1, g.per_node)));
  return ((nodes - 1) + (n - nodes) / 3) * eff.collective_latency_s;
}

double DedupAllToAllSeconds(double token_bytes, double topk, double max_nodes, const CommGroup& g,
                            const ClusterSpec& cluster, const GpuEfficiency& eff) {
  if (token_bytes <= 0 || g.size <= 1 || topk <= 0) return 0;
  const double n = static_cast<double>(g.size), q = static_cast<double>(g.per_node);
  const double copies = token_bytes * topk;  // what the all-to-all dispatcher would send
  if (!g.CrossesNodes()) return CollectiveSeconds(Collective::kAllToAll, copies, g, cluster, eff);
  const double nvl = std::max(1.0, cluster.nvlink_bandwidth * eff.nvlink_bus_fraction);
  const double net = std::max(1.0, cluster.network_bandwidth * eff.network_bus_fraction);
  const double nodes = n / q;
  // Each of the k experts is on any of the group's nodes alike: the other nodes a token
  // reaches, (nodes - 1)(1 - (1 - 1/nodes)^k), at most max_nodes - 1 of them.
  double remote = (nodes - 1) * (1 - std::pow(1 - 1 / nodes, topk));
  if (max_nodes >= 1) remote = std::min(remote, max_nodes - 1);
  const double network_bytes = token_bytes * remote;
  // NVLink: the copies for this node's other GPUs, and the copies that arrive from the network
  // for them (forwarded by the receiving GPU).
  const double nvlink_bytes = copies * (q - 1) / n + copies * (n - q) / n * (q - 1) / q;
  return std::max(nvlink_bytes / nvl, network_bytes / net) + (n - 1) * eff.collective_latency_s;
}

}  // namespace paraplan
