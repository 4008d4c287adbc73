// Unit tests of the plan rules on Plans built in C++ (the file tests in tests/filetest/ run
// the same rules through the language).
#include "compiler/check/rules.h"

#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>
#include <vector>

#include "compiler/check/rule_support.h"
#include "compiler/diagnostics/render.h"

namespace paraplan {
namespace {

// A plan whose written fields ("path = value" lines) get origins in a real buffer, the way
// the evaluator records them: dp is solved like `auto` and etp defaults to tp unless written.
struct TestPlan {
  SourceManager sm;
  Plan plan;

  explicit TestPlan(const std::vector<std::string>& lines) {
    std::vector<std::pair<std::string, std::string>> base = {
        {"model.layers", "32"},         {"model.hidden", "4096"},  {"model.ffn_hidden", "14336"},
        {"model.heads", "32"},          {"model.kv_heads", "8"},   {"model.head_dim", "128"},
        {"model.vocab", "128000"},      {"model.seq_len", "8192"}, {"cluster.nodes", "1"},
        {"cluster.gpus_per_node", "8"}, {"parallel.tp", "1"},      {"parallel.pp", "1"},
        {"batch.global", "64"},         {"batch.micro", "1"},
    };
    plan.name = "t";
    plan.model.name = "test_model";
    plan.cluster.name = "test_cluster";
    plan.cluster.gpu.name = "h100_sxm";
    plan.cluster.gpu.peak_bf16 = 989e12;
    plan.cluster.gpu.peak_fp8 = 1979e12;
    for (auto& [path, value] : base) REQUIRE(SetFieldText(plan, path, value).empty());
    std::string text = "plan t {\n";
    std::vector<std::tuple<std::string, uint32_t, uint32_t>> spans;
    for (const std::string& line : lines) {
      size_t eq = line.find(" = ");
      REQUIRE(eq != std::string::npos);
      std::string path = line.substr(0, eq);
      std::string value = line.substr(eq + 3);
      text += "  " + path + " = ";
      uint32_t begin = static_cast<uint32_t>(text.size());
      text += value;
      spans.emplace_back(path, begin, static_cast<uint32_t>(text.size()));
      text += "\n";
      if (value != "auto") REQUIRE_MESSAGE(SetFieldText(plan, path, value).empty(), line);
    }
    text += "}\n";
    uint32_t buffer = sm.AddBuffer("t.plan", text, BufferKind::kFile);
    plan.declaration = {buffer, 0, 6};
    bool dp_written = false, etp_written = false;
    for (auto& span : spans) {
      auto& path = std::get<0>(span);  // not a binding: doctest captures it
      auto& begin = std::get<1>(span);
      auto& end = std::get<2>(span);
      REQUIRE_MESSAGE(plan.origins.Mutable(path), path);
      FieldOrigin& o = *plan.origins.Mutable(path);
      o.kind = OriginKind::kFile;
      o.range = {buffer, begin, end};
      if (path == "parallel.dp") {
        dp_written = sm.Slice(o.range) != "auto";
        if (!dp_written) o.kind = OriginKind::kAuto;
      }
      if (path == "parallel.etp") etp_written = true;
    }
    if (!etp_written) {
      plan.parallel.etp = plan.parallel.tp;
      FieldOrigin& o = plan.origins["parallel.etp"];
      o.kind = OriginKind::kDerived;
      o.derived_from = {"parallel.tp"};
    }
    if (!dp_written) {
      int64_t model = plan.parallel.tp * plan.parallel.pp * plan.parallel.cp;
      int64_t world = plan.World();
      plan.parallel.dp = world % model == 0 ? world / model : 1;
      FieldOrigin& o = plan.origins["parallel.dp"];
      if (o.kind != OriginKind::kAuto) o.kind = OriginKind::kDerived;
      o.derived_from = {"cluster.nodes", "cluster.gpus_per_node", "parallel.tp", "parallel.pp",
                        "parallel.cp"};
      o.derivation = "dp = world / (tp · pp · cp) = " + std::to_string(world) + " / " +
                     std::to_string(model) + " = " + std::to_string(plan.parallel.dp);
    }
  }

  std::vector<Diagnostic> Check() const {
    DiagnosticSink sink;
    CheckPlanRules(plan, sink);
    return sink.diagnostics();
  }
  // The codes produced, in order, separated by spaces.
  std::string Codes() const {
    std::string out;
    for (const Diagnostic& d : Check()) {
      if (!out.empty()) out += " ";
      out += GetDiagKindInfo(d.kind).code;
    }
    return out;
  }
  std::string Text() const { return RenderDiagnostics(Check(), sm, DiagFormat::kText); }
};

using Codes = std::string;

const std::vector<std::string> kDeepSeekV2 = {
    "model.layers = 60",           "model.hidden = 5120",      "model.ffn_hidden = 12288",
    "model.heads = 128",           "model.kv_heads = 128",     "model.vocab = 102400",
    "model.seq_len = 4096",        "model.experts = 160",      "model.topk = 6",
    "model.moe_ffn_hidden = 1536", "model.shared_experts = 2", "model.dense_layers = 1",
    "model.q_lora_rank = 1536",    "model.kv_lora_rank = 512", "model.qk_nope_head_dim = 128",
    "model.qk_rope_head_dim = 64", "model.v_head_dim = 128",   "model.head_dim = 192",
};

std::vector<std::string> With(std::vector<std::string> base, const std::vector<std::string>& more) {
  base.insert(base.end(), more.begin(), more.end());
  return base;
}

bool HasHelp(const std::vector<Diagnostic>& ds, std::string_view code, std::string_view text) {
  for (const Diagnostic& d : ds) {
    if (GetDiagKindInfo(d.kind).code != code) continue;
    for (const std::string& h : d.helps) {
      if (h.find(text) != std::string::npos) return true;
    }
  }
  return false;
}

TEST_CASE("a consistent plan passes silently") {
  TestPlan t({"parallel.tp = 4", "parallel.pp = 2", "model.vocab = 131072"});
  CHECK(t.Codes() == Codes{});
}

TEST_CASE("P0303: DeepSeek-V2 on 16 nodes with tp 4, pp 4, ep 32") {
  TestPlan t(With(kDeepSeekV2, {"cluster.nodes = 16", "parallel.tp = 4", "parallel.pp = 4",
                                "parallel.ep = 32", "parallel.sp = true", "batch.global = 1024"}));
  auto ds = t.Check();
  CHECK(t.Codes() == Codes{"P0303"});
  REQUIRE(ds.size() == 1);
  CHECK(ds[0].message == "the expert mesh `etp · ep · pp` needs 512 GPUs but the cluster has 128");
  CHECK(ds[0].values[0].second == "4 · 32 · 4 = 512 > 128 GPUs");
  CHECK(HasHelp(ds, "P0303", "set `etp = 1`"));
  CHECK(HasHelp(ds, "P0303", "with etp = 4 and pp = 4: 1, 2, 4, 8"));
  CHECK(HasHelp(ds, "P0303", "`nodes = 64` (512 GPUs)"));
  std::string text = t.Text();
  CHECK(text.find("`etp` is not set, so it defaults to `tp` = 4") != std::string::npos);
  CHECK(text.find("`tp = 4` set here") != std::string::npos);
}

TEST_CASE(
    "P0401 offers Megatron-Core's accounting and first/last stage counts, and a help under vpp") {
  TestPlan t({"model.layers = 126", "cluster.nodes = 8", "parallel.pp = 8", "parallel.tp = 8",
              "batch.global = 64"});
  auto ds = t.Check();
  CHECK(t.Codes() == Codes{"P0401"});
  CHECK(HasHelp(
      ds, "P0401",
      "`account_for_embedding = true` and `account_for_loss = true`: 128 / 8 = 16 per stage"));
  CHECK(HasHelp(
      ds, "P0401",
      "`first_stage_layers = 15` and `last_stage_layers = 15` (16 on each of the other 6)"));
  TestPlan v({"model.layers = 126", "cluster.nodes = 8", "parallel.pp = 8", "parallel.tp = 8",
              "parallel.vpp = 2", "pipeline.schedule = interleaved_1f1b", "batch.global = 64"});
  auto vs = v.Check();
  CHECK(HasHelp(vs, "P0401", "with `vpp = 2` every stage's layers must also split into 2 chunks"));
}

TEST_CASE("P0401 with embedding and loss accounting: 60 + 2 layers over pp 4") {
  TestPlan t(With(kDeepSeekV2, {"cluster.nodes = 16", "parallel.tp = 1", "parallel.pp = 4",
                                "parallel.ep = 32", "pipeline.account_for_embedding = true",
                                "pipeline.account_for_loss = true", "batch.global = 1024"}));
  auto ds = t.Check();
  CHECK(t.Codes() == Codes{"P0401"});
  CHECK(ds[0].message ==
        "the 60 layers plus embedding and loss (62) do not split evenly over `pp = 4` stages");
  CHECK(HasHelp(ds, "P0401", "values of `pp`"));
  CHECK(HasHelp(ds, "P0401", "without both accounting flags: 60 / 4 = 15 per stage"));
  CHECK(HasHelp(ds, "P0401", "stage_layers = ["));
}

TEST_CASE("P0409: interleaving cannot chunk 15 layers per stage into 2") {
  TestPlan t(With(kDeepSeekV2, {"cluster.nodes = 16", "parallel.tp = 1", "parallel.pp = 4",
                                "parallel.ep = 32", "parallel.vpp = 2",
                                "pipeline.schedule = interleaved_1f1b", "batch.global = 1024"}));
  auto ds = t.Check();
  CHECK(t.Codes() == Codes{"P0409"});
  CHECK(HasHelp(ds, "P0409", "values of `vpp` that divide 15: 3, 5, 15"));
}

TEST_CASE("DeepSeek-V2 on 32 nodes with tp 8, pp 1, ep 32 and sp is clean") {
  TestPlan t(With(kDeepSeekV2, {"cluster.nodes = 32", "parallel.tp = 8", "parallel.ep = 32",
                                "parallel.sp = true", "batch.global = 1024"}));
  CHECK(t.Codes() == Codes{});
}

TEST_CASE("mesh rules") {
  CHECK(TestPlan({"parallel.tp = 8", "parallel.pp = 3", "model.layers = 33"}).Codes() ==
        Codes{"P0301"});
  CHECK(TestPlan({"parallel.tp = 2", "parallel.dp = 2"}).Codes() == Codes{"P0302"});
  CHECK(TestPlan({"parallel.ep = 2"}).Codes() == Codes{"P0304"});
  CHECK(TestPlan({"model.experts = 6", "model.topk = 2", "model.moe_ffn_hidden = 1024",
                  "parallel.ep = 4"})
            .Codes() == Codes{"P0305"});
  CHECK(TestPlan(
            {"model.heads = 12", "model.kv_heads = 12", "model.hidden = 3072", "parallel.tp = 8"})
            .Codes() == Codes{"P0306"});
  CHECK(TestPlan(
            {"model.heads = 24", "model.kv_heads = 12", "model.hidden = 3072", "parallel.tp = 8"})
            .Codes() == Codes{"P0307"});
  CHECK(
      TestPlan({"model.heads = 48", "model.kv_heads = 6", "model.hidden = 3072", "parallel.tp = 4"})
          .Codes() == Codes{"P0307"});
  CHECK(TestPlan({"model.ffn_hidden = 11006", "parallel.tp = 4"}).Codes() == Codes{"P0308"});
  CHECK(TestPlan({"model.experts = 8", "model.topk = 2", "model.moe_ffn_hidden = 1000",
                  "parallel.tp = 2", "parallel.ep = 2", "parallel.etp = 16", "parallel.sp = true",
                  "cluster.nodes = 4"})
            .Codes() == Codes{"P0309"});
  CHECK(TestPlan({"parallel.sp = true"}).Codes() == Codes{"P0310"});
  CHECK(TestPlan({"parallel.tp_comm_overlap = true"}).Codes() == Codes{"P0316"});
  CHECK(TestPlan({"parallel.tp = 8", "parallel.tp_comm_overlap = true"}).Codes() == Codes{"P0317"});
  CHECK(TestPlan({"parallel.tp = 8", "parallel.sp = true", "parallel.tp_comm_overlap = true"})
            .Codes()
            .empty());
  CHECK(TestPlan({"parallel.cp = 4", "model.seq_len = 4100", "batch.global = 8"}).Codes() ==
        Codes{"P0311"});
  CHECK(TestPlan({"parallel.tp = 8", "parallel.sp = true", "model.seq_len = 4100",
                  "model.vocab = 131072"})
            .Codes() == Codes{"P0312"});
  CHECK(TestPlan({"model.experts = 8", "model.topk = 2", "model.moe_ffn_hidden = 1024",
                  "parallel.tp = 2", "parallel.ep = 4", "model.vocab = 131072"})
            .Codes() == Codes{"P0313"});
  CHECK(TestPlan({"model.experts = 8", "model.topk = 2", "model.moe_ffn_hidden = 1024",
                  "parallel.pp = 2", "parallel.ep = 4", "cluster.nodes = 2",
                  "parallel.order = \"tp-cp-ep-pp-dp\""})
            .Codes() == Codes{"P0314"});
  CHECK(TestPlan({"parallel.tp = 2", "parallel.order = \"tp-xp-dp-pp\""}).Codes() ==
        Codes{"P0315"});
  CHECK(TestPlan({"parallel.tp = 2", "parallel.order = \"cp-dp-pp\""}).Codes() == Codes{"P0315"});
}

TEST_CASE("pipeline rules") {
  CHECK(TestPlan({"parallel.pp = 8", "model.layers = 30"}).Codes() == Codes{"P0401"});
  CHECK(TestPlan({"parallel.pp = 4", "pipeline.first_stage_layers = 0"}).Codes() == Codes{"P0402"});
  CHECK(TestPlan({"parallel.pp = 4", "pipeline.first_stage_layers = 7"}).Codes() == Codes{"P0403"});
  CHECK(TestPlan({"parallel.pp = 4", "pipeline.first_stage_layers = 7",
                  "pipeline.account_for_loss = true"})
            .Codes() == Codes{"P0404"});
  CHECK(TestPlan({"parallel.pp = 4", "pipeline.stage_layers = [8, 8, 16]"}).Codes() ==
        Codes{"P0405"});
  CHECK(TestPlan({"parallel.pp = 4", "pipeline.stage_layers = [8, 8, 8, 7]"}).Codes() ==
        Codes{"P0406"});
  CHECK(TestPlan({"parallel.pp = 4", "pipeline.stage_layers = [8, 8, 8, 8]",
                  "pipeline.account_for_loss = true"})
            .Codes() == Codes{"P0407"});
  CHECK(TestPlan({"parallel.vpp = 2", "pipeline.schedule = interleaved_1f1b"}).Codes() ==
        Codes{"P0408"});
  CHECK(TestPlan({"parallel.pp = 4", "parallel.vpp = 3", "pipeline.schedule = interleaved_1f1b",
                  "batch.global = 8"})
            .Codes() == Codes{"P0409"});
  CHECK(TestPlan({"parallel.pp = 4", "parallel.vpp = 2", "pipeline.schedule = interleaved_1f1b",
                  "batch.global = 6"})
            .Codes() == Codes{"P0410"});
  CHECK(TestPlan({"parallel.pp = 4", "batch.global = 6"}).Codes() == Codes{"P0411"});
  CHECK(TestPlan({"parallel.pp = 4", "parallel.vpp = 2", "batch.global = 8"}).Codes() ==
        Codes{"P0412"});
  CHECK(TestPlan({"parallel.pp = 4", "pipeline.schedule = interleaved_1f1b"}).Codes() ==
        Codes{"P0413"});
}

TEST_CASE("training and model-shape rules") {
  CHECK(TestPlan({"batch.global = 100", "batch.micro = 2"}).Codes() == Codes{"P0501"});
  CHECK(TestPlan({"model.vocab = 50257"}).Codes() == Codes{"P0502"});
  CHECK(TestPlan(
            {"parallel.pp = 2", "optimizer.zero = 3", "batch.global = 8", "framework = deepspeed"})
            .Codes() == Codes{"P0503"});
  CHECK(TestPlan(
            {"parallel.pp = 2", "optimizer.zero = 3", "batch.global = 8", "framework = torchtitan"})
            .Codes() == Codes{});
  CHECK(TestPlan({"model.vocab = 50257", "model.vocab_divisor = 64"}).Codes() == Codes{});
  // Stacks that do not pad the vocabulary get no padding note.
  CHECK(TestPlan({"model.vocab = 50257", "framework = torchtitan"}).Codes() == Codes{});
  CHECK(TestPlan({"model.vocab = 50257", "framework = llm_foundry"}).Codes() == Codes{});
  CHECK(TestPlan({"model.vocab = 50257", "framework = megatron_core"}).Codes() == Codes{"P0502"});
  CHECK(TestPlan({"parallel.tp = 8", "optimizer.zero = 1", "model.vocab = 131072"}).Codes() ==
        Codes{"P0504"});
  CHECK(TestPlan({"model.experts = 8", "model.topk = 2", "model.moe_ffn_hidden = 1024",
                  "parallel.ep = 8", "precision = fp16"})
            .Codes() == Codes{"P0505"});
  {
    TestPlan t({"precision = fp8"});
    t.plan.cluster.gpu.name = "a100_80gb";
    t.plan.cluster.gpu.peak_fp8 = 0;
    CHECK(t.Codes() == Codes{"P0506"});
  }
  CHECK(TestPlan({"optimizer.offload = cpu"}).Codes() == Codes{"P0507"});
  CHECK(TestPlan({"model.experts = 4", "model.topk = 6", "model.moe_ffn_hidden = 1024"}).Codes() ==
        Codes{"P0508"});
  CHECK(TestPlan({"model.experts = 4", "model.topk = 2", "model.moe_ffn_hidden = 1024",
                  "model.dense_layers = 40"})
            .Codes() == Codes{"P0509"});
  // Group-limited routing: groups divide the experts, the kept groups exist, each gives at least
  // one score, and together they hold the top k.
  const std::vector<std::string> moe = {"model.experts = 16", "model.topk = 4",
                                        "model.moe_ffn_hidden = 1024"};
  auto with = [&](std::initializer_list<std::string> more) {
    std::vector<std::string> lines = moe;
    lines.insert(lines.end(), more);
    return TestPlan(lines).Codes();
  };
  CHECK(with({"model.router_groups = 4", "model.router_group_topk = 2"}) == Codes{});
  CHECK(with({"model.router_groups = 16", "model.router_group_topk = 4"}) == Codes{});
  CHECK(with({"model.router_groups = 3", "model.router_group_topk = 2"}) == Codes{"P0515"});
  CHECK(with({"model.router_groups = 4", "model.router_group_topk = 5"}) == Codes{"P0515"});
  CHECK(with({"model.router_groups = 8", "model.router_group_topk = 6"}) == Codes{"P0515"});
  CHECK(with({"model.router_groups = 8", "model.router_group_topk = 1"}) == Codes{"P0515"});
  CHECK(with({"model.router_group_topk = 2"}) == Codes{"P0515"});  // more than the 1 group
  // A dense model's router settings are not looked at.
  CHECK(TestPlan({"model.router_groups = 3"}).Codes() == Codes{});
  {
    TestPlan t({"model.hidden = 4100"});
    CHECK(t.Codes() == Codes{"P0510"});
  }
  CHECK(TestPlan({"model.kv_heads = 12"}).Codes() == Codes{"P0511"});
  CHECK(TestPlan({"model.kv_lora_rank = 512", "model.kv_heads = 32"}).Codes() == Codes{"P0512"});
  CHECK(TestPlan({"model.kv_lora_rank = 512", "model.qk_nope_head_dim = 128",
                  "model.qk_rope_head_dim = 64", "model.v_head_dim = 128"})
            .Codes() == Codes{"P0513"});
}

TEST_CASE("an `auto` dp the evaluator poisoned is still reported by the mesh rule, once") {
  TestPlan t({"parallel.tp = 8", "parallel.pp = 3", "model.layers = 33", "parallel.dp = auto"});
  t.plan.poisoned.insert(fields::kParallelDp);
  CHECK(t.Codes() == Codes{"P0301"});
}

TEST_CASE("without helps the verdicts are the same and no fix is searched") {
  TestPlan t(With(kDeepSeekV2, {"cluster.nodes = 16", "parallel.tp = 4", "parallel.pp = 4",
                                "parallel.ep = 32", "parallel.sp = true", "batch.global = 1024"}));
  DiagnosticSink sink;
  CheckPlanRules(t.plan, sink, RuleOptions{.helps = false});
  REQUIRE(sink.diagnostics().size() == 1);
  CHECK(sink.diagnostics()[0].kind == DiagKind::kExpertMeshWorld);
  CHECK(sink.diagnostics()[0].helps.empty());
}

TEST_CASE("poisoned inputs keep their rules quiet") {
  TestPlan t({"parallel.tp = 8", "parallel.pp = 3", "model.layers = 33"});
  t.plan.poisoned.insert(fields::kParallelPp);
  CHECK(t.Codes() == Codes{});
}

TEST_CASE("fixes offered by helps are re-checked") {
  TestPlan t({"model.heads = 12", "model.kv_heads = 12", "model.hidden = 3072", "parallel.tp = 8"});
  auto ds = t.Check();
  REQUIRE(ds.size() == 1);
  // 12 heads: of the tp values that divide 12 (1, 2, 3, 4, 6, 12) only 1, 2 and 4 fit 8 GPUs.
  CHECK(HasHelp(ds, "P0306", "values of `tp` that divide 12: 1, 2, 4"));
}

TEST_CASE("one rule per diagnostic kind, each with the fields it reads") {
  const std::vector<rules::Rule>& all = rules::AllRules();
  REQUIRE(all.size() ==
          rules::MeshRules().size() + rules::PipelineRules().size() + rules::TrainRules().size());
  std::set<DiagKind> kinds;
  for (const rules::Rule& r : all) {
    CAPTURE(GetDiagKindInfo(r.kind).code);
    CHECK(kinds.insert(r.kind).second);
    CHECK(static_cast<bool>(r.check));
    CHECK(!r.inputs.empty());
    for (FieldId f : r.inputs) CHECK(!f.IsRecord());
  }
}

TEST_CASE("the runner skips a rule whose input is poisoned, and only that rule") {
  // 12 heads over tp = 8 (P0306), and a global batch of 3 over dp = 2 (P0501), a rule that
  // reads neither the heads nor tp.
  const std::vector<std::string> lines = {"model.heads = 12",    "model.kv_heads = 12",
                                          "model.hidden = 3072", "parallel.tp = 8",
                                          "cluster.nodes = 2",   "batch.global = 3"};
  TestPlan t(lines);
  const std::string both = t.Codes();
  REQUIRE(both.find("P0306") != std::string::npos);
  REQUIRE(both.find("P0501") != std::string::npos);
  t.plan.poisoned.insert(fields::kModelHeads);
  CHECK(t.Codes().find("P0306") == std::string::npos);
  CHECK(t.Codes().find("P0501") != std::string::npos);
  // Every rule reading tp goes quiet with it; the batch rule does not read tp.
  TestPlan u(lines);
  u.plan.poisoned.insert(fields::kParallelTp);
  CHECK(u.Codes() == Codes{"P0501"});
}

TEST_CASE("the pipeline split reports its first problem only") {
  // vpp without pp (P0408) ends the split chain: the conflicting split options (P0407) are not
  // reported on top; the schedule rule is not part of the chain (P0412).
  TestPlan t({"parallel.vpp = 2", "pipeline.stage_layers = [16, 16]",
              "pipeline.account_for_embedding = true"});
  CHECK(t.Codes() == Codes{"P0408 P0412"});
  // The same split options with pp = 2: now the conflict is the first problem.
  TestPlan u({"parallel.pp = 2", "pipeline.stage_layers = [16, 16]",
              "pipeline.account_for_embedding = true"});
  CHECK(u.Codes() == Codes{"P0407"});
}

TEST_CASE("P0403: the help moves the override the plan gives") {
  // 32 layers, pp = 4: the first stage's 7 leave 25 for 3 middle stages; 8 leaves 24.
  TestPlan first({"parallel.pp = 4", "pipeline.first_stage_layers = 7"});
  CHECK(first.Codes() == Codes{"P0403"});
  CHECK(HasHelp(first.Check(), "P0403", "`first_stage_layers = 8` splits the rest evenly"));
  // Only the last stage given: the last stage moves.
  TestPlan last({"parallel.pp = 4", "pipeline.last_stage_layers = 7"});
  CHECK(last.Codes() == Codes{"P0403"});
  CHECK(HasHelp(last.Check(), "P0403", "`last_stage_layers = 8` splits the rest evenly"));
  // Both given: the first moves and the last keeps its value (7 + 6 leave 19 for 2 stages).
  TestPlan both(
      {"parallel.pp = 4", "pipeline.first_stage_layers = 7", "pipeline.last_stage_layers = 6"});
  CHECK(both.Codes() == Codes{"P0403"});
  CHECK(HasHelp(both.Check(), "P0403", "`first_stage_layers = 6` splits the rest evenly"));
}

TEST_CASE("sizes near 2^63 are checked in milliseconds, with fixes") {
  // Divisors of 2^62 + 1 and of INT64_MAX come from their factorisation: a square-root scan took
  // minutes for every fix the rules tried.
  const TestPlan heads({"model.heads = 4611686018427387905", "parallel.tp = 8"});
  CHECK(heads.Codes().find("P0306") != std::string::npos);
  const TestPlan experts(
      {"model.experts = 9223372036854775807", "model.topk = 2", "parallel.ep = 8"});
  CHECK(experts.Codes().find("P0305") != std::string::npos);
}

}  // namespace
}  // namespace paraplan
