// Topology: which group kinds stay inside a node, and the P0605 / P0604 diagnostics through
// RunAnalysisChecks.
#include "compiler/analyze/topology.h"

#include <doctest/doctest.h>

#include "compiler/analyze/checks.h"

namespace paraplan {
namespace {

Plan MeshPlan(int64_t nodes, int64_t tp, int64_t dp, int64_t pp) {
  Plan p;
  p.model.layers = 8;
  p.model.hidden = 512;
  p.model.ffn_hidden = 1376;
  p.model.heads = 8;
  p.model.kv_heads = 8;
  p.model.vocab = 32000;
  p.model.seq_len = 1024;
  p.cluster.nodes = nodes;
  p.cluster.gpus_per_node = 8;
  p.cluster.nvlink_bandwidth = 450e9;
  p.cluster.network_bandwidth = 50e9;
  p.parallel.tp = tp;
  p.parallel.etp = tp;
  p.parallel.dp = dp;
  p.parallel.pp = pp;
  return p;
}

std::vector<const Diagnostic*> OfKind(const DiagnosticSink& sink, DiagKind kind) {
  std::vector<const Diagnostic*> out;
  for (const Diagnostic& d : sink.diagnostics()) {
    if (d.kind == kind) out.push_back(&d);
  }
  return out;
}

TEST_CASE("placement per kind: tp inside nodes, dp and pp across") {
  std::string error;
  auto layout = BuildLayout(MeshPlan(4, 8, 2, 2), &error);
  REQUIRE(layout.has_value());
  Topology t = AnalyzeTopology(*layout);
  CHECK(t.nodes == 4);
  CHECK(t.Of(GroupKind::kTp).IntraNode());
  CHECK(t.Of(GroupKind::kTp).group_count == 4);
  CHECK_FALSE(t.Of(GroupKind::kDp).IntraNode());
  CHECK(t.Of(GroupKind::kDp).crossing_groups == 16);
  CHECK(t.Of(GroupKind::kPp).max_nodes == 2);
  CHECK(t.Of(GroupKind::kTpDp).max_nodes == 2);
}

TEST_CASE("tp larger than a node warns with the bandwidth ratio and tp = 8") {
  Plan plan = MeshPlan(4, 16, 2, 1);
  DiagnosticSink sink;
  RunAnalysisChecks(plan, sink);
  auto found = OfKind(sink, DiagKind::kParallelGroupCrossesNetwork);
  REQUIRE(found.size() == 1);
  const Diagnostic& d = *found[0];
  CHECK(d.level == DiagLevel::kWarning);
  CHECK(d.message ==
        "tensor-parallel groups cross node boundaries: 2 of 2 `tp` groups of 16 GPUs span up to 2 "
        "nodes");
  CHECK(d.notes[0].find("50 GB/s per GPU instead of NVLink's 450 GB/s, about 9x slower") !=
        std::string::npos);
  REQUIRE(!d.helps.empty());
  CHECK(d.helps[0] == "keep tp inside a node: `tp = 8` and spread the rest over pp or dp");

  plan.parallel.sp = true;
  DiagnosticSink with_sp;
  RunAnalysisChecks(plan, with_sp);
  REQUIRE(OfKind(with_sp, DiagKind::kParallelGroupCrossesNetwork).size() == 1);
  CHECK(OfKind(with_sp, DiagKind::kParallelGroupCrossesNetwork)[0]->message.find(
            "tensor- and sequence-parallel") == 0);
}

TEST_CASE("tp that fits a node but is spread by the order") {
  Plan plan = MeshPlan(2, 2, 8, 1);
  plan.parallel.order = "dp-tp-cp-ep-pp";
  DiagnosticSink sink;
  RunAnalysisChecks(plan, sink);
  auto found = OfKind(sink, DiagKind::kParallelGroupCrossesNetwork);
  REQUIRE(found.size() == 1);
  CHECK(found[0]->helps.back().find("order \"dp-tp-cp-ep-pp\" spreads its groups") !=
        std::string::npos);

  DiagnosticSink clean;
  RunAnalysisChecks(MeshPlan(2, 8, 2, 1), clean);
  CHECK(clean.diagnostics().empty());
}

TEST_CASE("expert parallel over the network: ep = 16 with etp = 1 on 8-GPU nodes") {
  Plan plan = MeshPlan(4, 2, 16, 1);
  plan.model.experts = 64;
  plan.model.topk = 2;
  plan.model.moe_ffn_hidden = 512;
  plan.parallel.ep = 16;
  plan.parallel.etp = 1;
  DiagnosticSink sink;
  RunAnalysisChecks(plan, sink);
  auto found = OfKind(sink, DiagKind::kParallelGroupCrossesNetwork);
  REQUIRE(found.size() == 1);
  CHECK(found[0]->message.find("expert-parallel groups cross node boundaries") == 0);
  CHECK(found[0]->helps[0] == "keep etp · ep within a node: `ep = 8` with etp = 1");
}

TEST_CASE("a bad order reaches the user as P0604") {
  Plan plan = MeshPlan(1, 2, 4, 1);
  plan.parallel.order = "tp-pp";
  DiagnosticSink sink;
  RunAnalysisChecks(plan, sink);
  auto found = OfKind(sink, DiagKind::kRankLayoutInvalid);
  REQUIRE(found.size() == 1);
  CHECK(found[0]->message == "the size of `dp` is 4, but the order \"tp-pp\" does not name it");
}

}  // namespace
}  // namespace paraplan
