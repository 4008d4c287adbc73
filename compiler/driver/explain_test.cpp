// planc explain's report functions on hand-built plans: golden text, the one-rank view, JSON
// fields (parsed back), rank-set compression, and the SVG's structure.
#include "compiler/driver/explain.h"

#include <doctest/doctest.h>
#include <llvm/Support/JSON.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include "compiler/analyze/checks.h"
#include "compiler/check/rules.h"
#include "compiler/driver/commands.h"
#include "compiler/driver/frontend.h"

namespace paraplan {
namespace {

Plan DemoPlan() {
  Plan p;
  p.name = std::string("demo");
  p.model.name = std::string("tiny");
  p.model.layers = 8;
  p.model.hidden = 512;
  p.model.ffn_hidden = 1376;
  p.model.heads = 8;
  p.model.kv_heads = 8;
  p.model.head_dim = 64;
  p.model.vocab = 32000;
  p.model.seq_len = 1024;
  p.cluster.name = std::string("dgx_h100");
  p.cluster.gpu.name = std::string("h100_sxm");
  p.cluster.nodes = 2;
  p.cluster.gpus_per_node = 8;
  p.cluster.nvlink_bandwidth = 450e9;
  p.cluster.network_bandwidth = 50e9;
  p.parallel.tp = 2;
  p.parallel.etp = 2;
  p.parallel.pp = 4;
  p.parallel.dp = 2;
  p.cluster.gpu.memory = int64_t{80} << 30;
  p.cluster.gpu.peak_bf16 = 989e12;
  p.cluster.gpu.hbm_bandwidth = 3.35e12;
  p.batch.global = 16;
  p.batch.micro = 1;
  return p;
}

int64_t Int(const llvm::json::Object* o, llvm::StringRef key) {
  return o->getInteger(key).getValueOr(-999);
}
int Bool(const llvm::json::Object* o, llvm::StringRef key) {
  auto b = o->getBoolean(key);
  return b ? (*b ? 1 : 0) : -1;
}

struct Analysed {
  Plan plan;
  Layout layout;
  Topology topology;
  Partition partition;
  ExplainInput Input() const { return ExplainInput{plan, layout, topology, partition}; }
};

Analysed Analyse(const Plan& plan) {
  std::string error;
  auto layout = BuildLayout(plan, &error);
  REQUIRE_MESSAGE(layout.has_value(), error);
  auto partition = BuildPartition(plan, nullptr);
  REQUIRE(partition.has_value());
  Topology t = AnalyzeTopology(*layout);
  return Analysed{plan, *layout, t, *partition};
}

TEST_CASE("golden text report of a 16-rank plan") {
  Analysed a = Analyse(DemoPlan());
  const std::string text = ExplainText(a.Input());
  const char* path = std::getenv("PARAPLAN_SOURCE_DIR");
  REQUIRE(path != nullptr);
  std::string golden_path = std::string(path) + "/compiler/driver/testdata/explain_demo.txt";
  if (std::getenv("PARAPLAN_UPDATE_GOLDEN")) {
    FILE* f = std::fopen(golden_path.c_str(), "w");
    std::fputs(text.c_str(), f);
    std::fclose(f);
  }
  FILE* f = std::fopen(golden_path.c_str(), "r");
  REQUIRE(f != nullptr);
  std::string golden;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) golden.append(buf, n);
  std::fclose(f);
  CHECK(text == golden);
}

TEST_CASE("text report says whether TP communication overlaps the GEMMs") {
  Plan p = DemoPlan();
  REQUIRE(p.parallel.tp > 1);
  CHECK(ExplainText(Analyse(p).Input()).find("tp_comm_overlap off") != std::string::npos);
  p.parallel.tp_comm_overlap = true;
  CHECK(ExplainText(Analyse(p).Input()).find("tp_comm_overlap on") != std::string::npos);
}

TEST_CASE("text report: big worlds get one role row per stage") {
  Plan p = DemoPlan();
  p.cluster.nodes = 32;
  p.parallel.tp = 8;
  p.parallel.etp = 8;
  p.parallel.pp = 4;
  p.parallel.dp = 8;
  Analysed a = Analyse(p);
  std::string text = ExplainText(a.Input());
  CHECK(text.find("roles  256 ranks, one row per pipeline stage") != std::string::npos);
  CHECK(text.find(
            "  0      0-63                           0-7                   0-1 (2) + embedding") !=
        std::string::npos);
  CHECK(text.find("\nranks\n") == std::string::npos);

  p.parallel.order = "tp-cp-ep-pp-dp";
  Analysed b = Analyse(p);
  CHECK(ExplainText(b.Input()).find("0-7, 32-39, … (8 runs)") != std::string::npos);
}

TEST_CASE("one rank: coordinates, groups, stage") {
  Analysed a = Analyse(DemoPlan());
  std::string text = ExplainRankText(a.Input(), 13);
  CHECK(text.find("rank 13 of 16: node 1, GPU 5") == 0);
  CHECK(text.find("dense   tp 1  cp 0  dp 0  pp 3") != std::string::npos);
  CHECK(text.find("  tp        #6      12-13 ") != std::string::npos);
  CHECK(text.find("  pp        #1      1, 5, 9, 13 ") != std::string::npos);
  CHECK(text.find("pos_embd  (not a member: only the first pipeline stage holds it)") !=
        std::string::npos);
  CHECK(text.find("pipeline stage 3 of 4 (receives from 9, sends to none)") != std::string::npos);
  CHECK(text.find("chunk 0  layers 6-7 (2) + loss") != std::string::npos);
}

TEST_CASE("JSON: DESIGN.md's fields, complete groups in Megatron's order, stages with chunks") {
  Plan p = DemoPlan();
  p.model.layers = 16;
  p.parallel.vpp = 2;
  Analysed a = Analyse(p);
  ExplainInput in = a.Input();
  in.json_sections.push_back({"memory", "{\"stages\":[]}"});
  auto parsed = llvm::json::parse(ExplainJson(in, 6));
  REQUIRE_MESSAGE(static_cast<bool>(parsed), llvm::toString(parsed.takeError()));
  const llvm::json::Object* root = parsed->getAsObject();
  REQUIRE(root != nullptr);
  CHECK(Int(root, "version") == kExplainJsonVersion);
  CHECK(Int(root, "world_size") == 16);
  const llvm::json::Object* par = root->getObject("parallel");
  REQUIRE(par != nullptr);
  for (auto [key, want] : std::vector<std::pair<const char*, int64_t>>{{"tp", 2},
                                                                       {"pp", 4},
                                                                       {"vpp", 2},
                                                                       {"cp", 1},
                                                                       {"ep", 1},
                                                                       {"etp", 2},
                                                                       {"dp", 2},
                                                                       {"edp", 2}}) {
    CHECK_MESSAGE(Int(par, key) == want, key);
  }
  const llvm::json::Object* groups = root->getObject("groups");
  REQUIRE(groups != nullptr);
  for (GroupKind kind : AllGroupKinds()) {
    const llvm::json::Array* list = groups->getArray(GroupKindName(kind));
    REQUIRE_MESSAGE(list != nullptr, GroupKindName(kind));
    const GroupList& want = a.layout.Groups(kind);
    REQUIRE(static_cast<int64_t>(list->size()) == want.group_count());
    for (int64_t g = 0; g < want.group_count(); ++g) {
      const llvm::json::Array* members = (*list)[static_cast<size_t>(g)].getAsArray();
      REQUIRE(members != nullptr);
      auto span = want.Group(g);
      REQUIRE(members->size() == span.size());
      for (size_t i = 0; i < span.size(); ++i)
        CHECK((*members)[i].getAsInteger().getValueOr(-1) == span[i]);
    }
  }
  const llvm::json::Array* pp = groups->getArray("pp");
  CHECK((*pp)[1].getAsArray()->front().getAsInteger().getValueOr(-1) == 1);
  const llvm::json::Array* stages = root->getArray("stages");
  REQUIRE(stages != nullptr);
  REQUIRE(stages->size() == 4);
  const llvm::json::Object* s0 = (*stages)[0].getAsObject();
  CHECK(Bool(s0, "embedding") == 1);
  CHECK(Bool(s0, "loss") == 0);
  const llvm::json::Array* chunks = s0->getArray("chunks");
  REQUIRE(chunks->size() == 2);
  CHECK(Int((*chunks)[1].getAsObject(), "first_layer") == 8);
  CHECK(Int((*chunks)[1].getAsObject(), "end_layer") == 10);
  const llvm::json::Object* s3 = (*stages)[3].getAsObject();
  CHECK(Bool(s3, "loss") == 1);
  CHECK(Bool((*s3->getArray("chunks"))[1].getAsObject(), "loss") == 1);
  CHECK(Bool((*s3->getArray("chunks"))[0].getAsObject(), "loss") == 0);
  CHECK(root->getObject("memory") != nullptr);
  const llvm::json::Object* rank = root->getObject("rank");
  REQUIRE(rank != nullptr);
  CHECK(Int(rank, "rank") == 6);
  CHECK(Int(rank->getObject("coordinates"), "pp") == 1);
  CHECK(rank->getObject("groups")->getArray("embd") == nullptr);
}

TEST_CASE("the rules leave a cost-balanced split to the partition: 30 layers on pp 4") {
  Plan p = DemoPlan();
  p.model.layers = 30;
  p.pipeline.balance = Balance::kCost;
  DiagnosticSink sink;
  CheckPlanRules(p, sink);
  for (const Diagnostic& d : sink.diagnostics()) CHECK(d.kind != DiagKind::kLayersNotDivisibleByPp);
  RunAnalysisChecks(p, sink);
  for (const Diagnostic& d : sink.diagnostics()) {
    CHECK_MESSAGE(d.level != DiagLevel::kError, GetDiagKindInfo(d.kind).code, " ", d.message);
  }
  auto part = BuildPartition(p, nullptr);
  REQUIRE(part.has_value());
  CHECK(part->layers == 30);

  p.pipeline.balance = Balance::kEven;
  DiagnosticSink even;
  CheckPlanRules(p, even);
  bool reported = false;
  for (const Diagnostic& d : even.diagnostics())
    reported |= d.kind == DiagKind::kLayersNotDivisibleByPp;
  CHECK(reported);
}

TEST_CASE("planc explain refuses bad usage with exit status 2") {
  CHECK(RunExplain({}) == kExitUsage);
  CHECK(RunExplain({"a.plan", "--format=xml"}) == kExitUsage);
  CHECK(RunExplain({"a.plan", "--rank", "-1"}) == kExitUsage);
  CHECK(RunExplain({"a.plan", "--rank=x"}) == kExitUsage);
  CHECK(RunExplain({"a.plan", "--rank"}) == kExitUsage);
  CHECK(RunExplain({"a.plan", "--svg="}) == kExitUsage);
  CHECK(RunExplain({"a.plan", "--dump=ast"}) == kExitUsage);
  CHECK(RunExplain({"a.plan", "--bogus"}) == kExitUsage);
  CHECK(RunExplain({"a.plan", "--help"}) == kExitOk);
}

// The example's story end to end: Nanotron's split fails with P0602 on the `balance` line; the
// fix it suggests checks clean and explains as [7, 1].
TEST_CASE("examples/nanotron_small_llama.plan") {
  const char* root = std::getenv("PARAPLAN_SOURCE_DIR");
  REQUIRE(root != nullptr);
  FrontendOptions opts;
  opts.file = std::string(root) + "/examples/nanotron_small_llama.plan";
  {
    SourceManager sm;
    DiagnosticSink sink;
    auto plan = LoadPlan(opts, sm, sink);
    REQUIRE(plan.has_value());
    RunAnalysisChecks(*plan, sink);
    REQUIRE(sink.error_count() == 1);
    const Diagnostic* d = nullptr;
    for (const Diagnostic& x : sink.diagnostics()) {
      if (x.level == DiagLevel::kError) d = &x;
    }
    REQUIRE(d != nullptr);
    CHECK(d->kind == DiagKind::kNanotronBalanceEmptyStage);
    CHECK(d->message.find("pipeline stage 1") != std::string::npos);
    CHECK(sm.Slice(d->primary) == "nanotron");
    CHECK(d->helps[0] ==
          "use `balance = cost`: paraplan's cost split keeps a transformer layer on every stage: "
          "[7, 1]");
  }
  opts.sets = {"pipeline.balance=cost"};
  SourceManager sm;
  DiagnosticSink sink;
  auto plan = LoadPlan(opts, sm, sink);
  REQUIRE(plan.has_value());
  RunAnalysisChecks(*plan, sink);
  CHECK_FALSE(sink.has_errors());
  Analysed a = Analyse(*plan);
  CHECK(a.partition.stages[0].layer_count() == 7);
  CHECK(a.partition.stages[1].layer_count() == 1);
  auto parsed = llvm::json::parse(ExplainJson(a.Input(), std::nullopt));
  REQUIRE(static_cast<bool>(parsed));
  const llvm::json::Array* stages = parsed->getAsObject()->getArray("stages");
  REQUIRE(stages != nullptr);
  CHECK(Int((*stages)[1].getAsObject(), "num_layers") == 1);
}

TEST_CASE(
    "planc explain on the example: exit 1 with the error, 0 with the fix, an SVG file, rank "
    "bounds") {
  const char* root = std::getenv("PARAPLAN_SOURCE_DIR");
  REQUIRE(root != nullptr);
  const std::string example = std::string(root) + "/examples/nanotron_small_llama.plan";
  CHECK(RunExplain({example, "--diagnostics=short"}) == kExitInputError);
  const std::string svg = std::string(std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp") +
                          "/paraplan_explain_test_" + std::to_string(::getpid()) + ".svg";
  CHECK(RunExplain({example, "--set", "pipeline.balance=cost", "--format=json", "--rank", "5",
                    "--svg", svg}) == kExitOk);
  FILE* f = std::fopen(svg.c_str(), "r");
  REQUIRE(f != nullptr);
  char head[5] = {};
  CHECK(std::fread(head, 1, 4, f) == 4);
  std::fclose(f);
  CHECK(std::string(head) == "<svg");
  std::remove(svg.c_str());
  std::remove((svg + ".memory.svg").c_str());
  CHECK(RunExplain({example, "--set", "pipeline.balance=cost", "--rank", "8"}) ==
        kExitUsage);  // 8 ranks: 0-7
  CHECK(RunExplain({example, "--set", "pipeline.balance=cost", "--svg",
                    "/nonexistent-dir/x.svg"}) == kExitInputError);
}

TEST_CASE("rank sets compress into runs") {
  std::vector<int64_t> r = {0, 1, 2, 3, 8, 9, 12};
  CHECK(RankSetText(r) == "0-3, 8-9, 12");
  CHECK(RankSetText(r, 2) == "0-3, 8-9, … (3 runs)");
  CHECK(RankSetText(std::vector<int64_t>{}) == "");
}

TEST_CASE("SVG: one cell per GPU coloured by stage, TP and EP outlines, legend") {
  Plan p = DemoPlan();
  p.cluster.nodes = 4;
  p.parallel.dp = 4;
  p.parallel.ep = 4;
  p.parallel.etp = 1;
  p.model.experts = 8;
  p.model.topk = 2;
  Analysed a = Analyse(p);
  std::string svg = ExplainSvg(a.Input());
  CHECK(svg.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\"", 0) == 0);
  CHECK(svg.find("</svg>") != std::string::npos);
  auto count = [&](std::string_view needle) {
    size_t n = 0;
    for (size_t at = svg.find(needle); at != std::string::npos; at = svg.find(needle, at + 1)) ++n;
    return n;
  };
  CHECK(count("<title>rank ") == 32);
  CHECK(count("fill=\"#4e79a7\"><title>") == 8);  // stage 0: 8 GPUs
  CHECK(count(">node ") == 4);
  CHECK(count("stroke=\"#111\" stroke-width=\"2\"/>") == 16 + 1);  // 16 TP groups + legend
  CHECK(count("stroke-dasharray") == 8 + 1);                       // 8 EP groups + legend
  CHECK(svg.find("stage 3: layers 6-7 + loss") != std::string::npos);

  Plan big = DemoPlan();
  big.cluster.nodes = 512;
  big.parallel.tp = 8;
  big.parallel.etp = 8;
  big.parallel.pp = 8;
  big.parallel.dp = 64;
  Analysed b = Analyse(big);
  std::string huge = ExplainSvg(b.Input());
  CHECK(huge.find("showing 128 of 512 nodes") != std::string::npos);
  CHECK(huge.find("<title>rank 3584:") !=
        std::string::npos);  // the last stage (from rank 3584) is drawn too
  CHECK(huge.find("<title>rank 4095:") == std::string::npos);
}

}  // namespace
}  // namespace paraplan
