#include "compiler/plan/plan.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <set>
#include <utility>

namespace paraplan {
namespace {

TEST_CASE("every canonical path is listed once and found by path") {
  std::set<std::string_view> seen;
  for (const FieldInfo& f : PlanFields()) {
    CHECK(seen.insert(f.path).second);
    const FieldInfo* found = FindPlanField(f.path);
    REQUIRE(found != nullptr);
    CHECK(found->path == f.path);
    CHECK(&PlanFields()[f.index] == found);
    CHECK(!f.doc.empty());
  }
  for (const char* p :
       {"model.layers", "model.v_head_dim", "cluster.gpu.memory", "cluster.gpu.hbm_bandwidth",
        "cluster.nodes", "precision", "recompute", "parallel.etp", "parallel.order",
        "pipeline.stage_layers", "optimizer.clip_grad", "batch.micro", "train.checkpoint_every"}) {
    CHECK_MESSAGE(FindPlanField(p) != nullptr, p);
  }
  CHECK(FindPlanField("parallel.tpp") == nullptr);
  CHECK(FindPlanField("model") == nullptr);
  CHECK(IsRecordPath("cluster.gpu"));
}

TEST_CASE("text round trip through GetFieldText and SetFieldText for every field") {
  Plan a;
  a.model.name = "m";
  a.cluster.name = "c";
  for (const FieldInfo& f : PlanFields()) {
    if (f.type == FieldType::kInt && f.min == 1) REQUIRE(SetFieldText(a, f.path, "3") == "");
  }
  REQUIRE(SetFieldText(a, "cluster.gpu.memory", "80 GiB") == "");
  REQUIRE(SetFieldText(a, "cluster.gpu.peak_bf16", "989.5 TFLOPS") == "");
  REQUIRE(SetFieldText(a, "pipeline.stage_layers", "[1, 2]") == "");
  REQUIRE(SetFieldText(a, "train.data", "\"a \\\"quoted\\\" path\"") == "");
  CHECK(a.train.data == "a \"quoted\" path");
  for (const FieldInfo& f : PlanFields()) {
    auto text = GetFieldText(a, f.path);
    REQUIRE(text.has_value());
    Plan b;
    CHECK_MESSAGE(SetFieldText(b, f.path, *text) == "", f.path);
    CHECK(GetFieldText(b, f.path) == text);
  }
}

TEST_CASE("framework names the software that runs the plan") {
  Plan p;
  CHECK(p.framework == Framework::kParaplan);
  CHECK(GetFieldText(p, "framework") == "paraplan");
  const std::pair<const char*, Framework> spellings[] = {
      {"megatron_core", Framework::kMegatronCore},
      {"torchtitan", Framework::kTorchtitan},
      {"deepspeed", Framework::kDeepSpeed},
      {"llm_foundry", Framework::kLlmFoundry},
      {"megatron_lm_2021", Framework::kMegatronLm2021},
      {"paraplan", Framework::kParaplan}};
  for (const auto& [text, value] : spellings) {
    CHECK(SetFieldText(p, "framework", text) == "");
    CHECK(p.framework == value);
    CHECK(ToString(p.framework) == text);
  }
  CHECK(SetFieldText(p, "framework", "nemo") ==
        "expects `paraplan`, `megatron_core`, `torchtitan`, `deepspeed`, `llm_foundry` or "
        "`megatron_lm_2021`, got `nemo`");
  CHECK(p.framework == Framework::kParaplan);
  CHECK(PrintPlan(p).find("framework                          = paraplan") != std::string::npos);
}

TEST_CASE(
    "the precision record follows the `precision` shorthand where the plan does not write it") {
  Plan p;
  MixedPrecisionSpec mp = EffectiveMixedPrecision(p);
  CHECK(mp.params == ElementType::kBf16);
  CHECK(mp.grads == ElementType::kFp32);
  CHECK(mp.main_params);
  CHECK(mp.fp8 == Fp8Recipe::kNone);
  CHECK(!UsesFp8(p));
  REQUIRE(SetFieldText(p, "precision", "fp8") == "");
  CHECK(EffectiveMixedPrecision(p).fp8 == Fp8Recipe::kDelayed);
  CHECK(UsesFp8(p));
  REQUIRE(SetFieldText(p, "precision", "fp16") == "");
  CHECK(EffectiveMixedPrecision(p).params == ElementType::kFp16);
  CHECK(EffectiveMixedPrecision(p).grads == ElementType::kFp16);
  REQUIRE(SetFieldText(p, "precision", "fp32") == "");
  CHECK(!EffectiveMixedPrecision(p).main_params);
  // A written field is kept whatever the shorthand says.
  REQUIRE(SetFieldText(p, "precision", "bf16") == "");
  REQUIRE(SetFieldText(p, "mixed_precision.grads", "bf16") == "");
  p.origins["mixed_precision.grads"].kind = OriginKind::kFile;
  REQUIRE(SetFieldText(p, "mixed_precision.fp8", "blockwise") == "");
  p.origins["mixed_precision.fp8"].kind = OriginKind::kCommandLine;
  mp = EffectiveMixedPrecision(p);
  CHECK(mp.grads == ElementType::kBf16);
  CHECK(mp.fp8 == Fp8Recipe::kBlockwise);
  // A recipe alone does not turn FP8 on (P0517): the precision does.
  CHECK(!UsesFp8(p));
  REQUIRE(SetFieldText(p, "precision", "fp8") == "");
  CHECK(EffectiveMixedPrecision(p).fp8 == Fp8Recipe::kBlockwise);
  CHECK(UsesFp8(p));
  CHECK(SetFieldText(p, "mixed_precision.optimizer_state", "fp8") == "");
  CHECK(SetFieldText(p, "mixed_precision.params", "fp8") ==
        "expects `fp32`, `bf16` or `fp16`, got `fp8`");
}

TEST_CASE("recompute modules, shard groups and MoE layer frequency") {
  std::string bad;
  CHECK(ParseRecomputeModules("core_attn, mlp moe_act") ==
        (kRecomputeCoreAttn | kRecomputeMlp | kRecomputeMoeAct));
  CHECK(ParseRecomputeModules("") == 0u);
  CHECK(!ParseRecomputeModules("core_attn, attn", &bad));
  CHECK(bad == "attn");
  Plan p;
  CHECK(EffectiveRecomputeModules(p) == 0u);  // recompute = none
  REQUIRE(SetFieldText(p, "recompute", "selective") == "");
  CHECK(EffectiveRecomputeModules(p) == kRecomputeCoreAttn);
  REQUIRE(SetFieldText(p, "activations.recompute_modules", "\"mlp, layernorm\"") == "");
  CHECK(EffectiveRecomputeModules(p) == (kRecomputeMlp | kRecomputeLayernorm));
  p.parallel.dp = 16;
  p.parallel.cp = 2;
  CHECK(ShardGroup(p) == 32);
  p.fsdp.replicate = 4;
  CHECK(ShardGroup(p) == 8);
  p.fsdp.shard = 16;
  CHECK(ShardGroup(p) == 16);
  ModelSpec m;
  m.layers = 10;
  m.experts = 8;
  m.dense_layers = 1;
  m.moe_layer_freq = 2;
  std::string kinds;
  for (int64_t i = 0; i < m.layers; ++i) kinds += IsMoeLayer(m, i) ? 'E' : 'D';
  CHECK(kinds == "DEDEDEDEDE");
}

TEST_CASE("SetFieldText parses each type and says what is wrong") {
  Plan p;
  CHECK(SetFieldText(p, "parallel.tp", "4") == "");
  CHECK(p.parallel.tp == 4);
  CHECK(SetFieldText(p, "parallel.tp", "0") == "must be at least 1, got 0");
  CHECK(p.parallel.tp == 4);
  CHECK(SetFieldText(p, "parallel.tp", "four") == "expects an integer, got `four`");
  CHECK(SetFieldText(p, "parallel.tp", "99999999999999999999") ==
        "expects an integer, got `99999999999999999999`");
  CHECK(SetFieldText(p, "optimizer.zero", "4") == "must be at most 3, got 4");
  CHECK(SetFieldText(p, "parallel.sp", "true") == "");
  CHECK(p.parallel.sp);
  CHECK(SetFieldText(p, "parallel.sp", "1") == "expects `true` or `false`, got `1`");
  CHECK(SetFieldText(p, "pipeline.schedule", "interleaved_1f1b") == "");
  CHECK(p.pipeline.schedule == Schedule::kInterleaved1F1B);
  CHECK(SetFieldText(p, "pipeline.schedule", "\"1f1b\"") == "");
  CHECK(p.pipeline.schedule == Schedule::k1F1B);
  CHECK(SetFieldText(p, "recompute", "partial") ==
        "expects `none`, `selective` or `full`, got `partial`");
  CHECK(SetFieldText(p, "parallel.order", "\"tp-cp-ep-pp-dp\"") == "");
  CHECK(p.parallel.order == "tp-cp-ep-pp-dp");
  CHECK(GetFieldText(p, "parallel.order") == "\"tp-cp-ep-pp-dp\"");
  CHECK(SetFieldText(p, "pipeline.stage_layers", "[3, 4, 5]") == "");
  CHECK(p.pipeline.stage_layers == std::vector<int64_t>{3, 4, 5});
  CHECK(SetFieldText(p, "pipeline.stage_layers", "[]") == "");
  CHECK(p.pipeline.stage_layers.empty());
  CHECK(SetFieldText(p, "pipeline.first_stage_layers", "3") == "");
  CHECK(p.pipeline.first_stage_layers == 3);
  CHECK(SetFieldText(p, "pipeline.first_stage_layers", "none") == "");
  CHECK(!p.pipeline.first_stage_layers.has_value());
  CHECK(SetFieldText(p, "optimizer.lr", "1e-4") == "");
  CHECK(p.optimizer.lr == doctest::Approx(1e-4));
  CHECK(SetFieldText(p, "parallel.bogus", "1") == "`parallel.bogus` is not a field of a plan");
  CHECK(SetFieldText(p, "model", "llama") != "");
}

TEST_CASE("units in SetFieldText are checked by dimension") {
  Plan p;
  CHECK(SetFieldText(p, "cluster.gpu.memory", "80 GiB") == "");
  CHECK(p.cluster.gpu.memory == 80LL * 1024 * 1024 * 1024);
  CHECK(SetFieldText(p, "cluster.gpu.memory", "141GB") == "");
  CHECK(p.cluster.gpu.memory == 141000000000LL);
  CHECK(SetFieldText(p, "cluster.network_bandwidth", "400 Gb/s") == "");
  CHECK(p.cluster.network_bandwidth == doctest::Approx(50e9));
  CHECK(SetFieldText(p, "cluster.gpu.peak_bf16", "989 TFLOPS") == "");
  CHECK(p.cluster.gpu.peak_bf16 == doctest::Approx(989e12));
  CHECK(SetFieldText(p, "cluster.gpu.memory", "80 GB/s") ==
        "expects a size in bytes, got a bandwidth (`GB/s`)");
  CHECK(SetFieldText(p, "cluster.gpu.memory", "80 parsecs") == "`parsecs` is not a unit");
  CHECK(SetFieldText(p, "cluster.gpu.memory", "0.5 B") ==
        "expects a whole number of bytes, got `0.5 B`");
  REQUIRE(FindUnit("GiB") != nullptr);
  CHECK(FindUnit("GiB")->dimension == UnitDimension::kBytes);
  CHECK(FindUnit("us")->scale == doctest::Approx(1e-6));
  CHECK(FindUnit("GiB/s")->dimension == UnitDimension::kBandwidth);
  CHECK(FindUnit("gib") == nullptr);
}

TEST_CASE("typed setters check types and ranges") {
  Plan p;
  const FieldInfo& tp = *FindPlanField("parallel.tp");
  CHECK(SetFieldValue(p, tp, int64_t{8}) == "");
  CHECK(p.parallel.tp == 8);
  CHECK(SetFieldValue(p, tp, 2.0) == "");
  CHECK(p.parallel.tp == 2);
  CHECK(SetFieldValue(p, tp, 2.5) == "expects an integer, got 2.5");
  CHECK(SetFieldValue(p, tp, true) == "expects an integer, got a boolean");
  CHECK(SetFieldValue(p, tp, std::string("x")) == "expects an integer, got a string");
  const FieldInfo& sched = *FindPlanField("pipeline.schedule");
  CHECK(SetFieldValue(p, sched, std::string("gpipe")) == "");
  CHECK(p.pipeline.schedule == Schedule::kGpipe);
  CHECK(std::get<std::string>(GetFieldValue(p, sched)) == "gpipe");
  const FieldInfo& stages = *FindPlanField("pipeline.stage_layers");
  CHECK(SetFieldList(p, stages, {1, -1}) == "every element must be at least 0, got -1");
  CHECK(SetFieldList(p, tp, {1}) == "expects an integer, got a list");
}

TEST_CASE("Edp, Microbatches and World") {
  Plan p;
  p.cluster.nodes = 16;
  p.cluster.gpus_per_node = 8;
  p.parallel.tp = 4;
  p.parallel.etp = 4;
  p.parallel.ep = 32;
  p.parallel.pp = 4;
  CHECK(p.World() == 128);
  CHECK(p.Edp() == 0);  // 512 does not divide 128
  p.parallel.etp = 1;
  CHECK(p.Edp() == 1);
  p.batch.global = 1536;
  p.batch.micro = 2;
  p.parallel.dp = 8;
  CHECK(p.Microbatches() == 96);
  p.parallel.dp = 7;
  CHECK(p.Microbatches() == 0);
}

TEST_CASE("origins default to no location") {
  Plan p;
  CHECK(p.Origin("parallel.tp").kind == OriginKind::kDefault);
  CHECK(!p.Range("parallel.tp").IsValid());
  p.origins[fields::kParallelTp] = FieldOrigin{OriginKind::kFile, SourceRange{1, 2, 3}, {}, {}};
  CHECK(p.Origin("parallel.tp").kind == OriginKind::kFile);
  CHECK(p.Range("parallel.tp") == SourceRange{1, 2, 3});
  CHECK(ToString(OriginKind::kCommandLine) == "command line");
}

TEST_CASE("PlanOrigins: by handle, by field or by path, record paths too") {
  PlanOrigins o;
  CHECK(o.size() == 0);
  CHECK(!o.Find(fields::kParallelTp));
  CHECK(o.count(fields::kModel) == 0);
  const FieldInfo& pp = *FindPlanField("parallel.pp");
  o[pp].kind = OriginKind::kCommandLine;
  o[fields::kParallelTp] = FieldOrigin{OriginKind::kFile, SourceRange{1, 2, 3}, {}, {}};
  o[fields::kClusterGpu].kind = OriginKind::kStdlib;
  REQUIRE(o.Mutable("model"));
  o.Mutable("model")->kind = OriginKind::kFile;
  CHECK(o.size() == 4);
  REQUIRE(o.Find(fields::kParallelPp));
  CHECK(o.Find(fields::kParallelPp)->kind == OriginKind::kCommandLine);
  CHECK(o.FindPath("parallel.tp")->range == SourceRange{1, 2, 3});
  CHECK(o.Find(fields::kClusterGpu)->kind == OriginKind::kStdlib);
  CHECK(o.count(fields::kModel) == 1);
  CHECK(o.count(fields::kCluster) == 0);
  CHECK(o.count(fields::kParallelDp) == 0);
  // Copies are independent.
  PlanOrigins copy = o;
  copy[fields::kParallelTp].kind = OriginKind::kAuto;
  CHECK(o.Find(fields::kParallelTp)->kind == OriginKind::kFile);
  CHECK(copy.Find(fields::kParallelTp)->kind == OriginKind::kAuto);
}

TEST_CASE("an unknown path is an error, never a new slot") {
  Plan p;
  // Where a path comes from outside (--set, an importer's table) it is looked up.
  CHECK(!FindPlanPath("parallel.tpp"));
  CHECK(!FindPlanField("parallel.tpp"));
  CHECK(SetFieldText(p, "parallel.tpp", "4") == "`parallel.tpp` is not a field of a plan");
  CHECK(SetFieldText(p, "cluster", "x") ==
        "`cluster` names a record; set its fields (`cluster.…`) or derive it in the plan");
  CHECK(p.origins.Mutable("parallel.tpp") == nullptr);
  CHECK(p.origins.FindPath("parallel.tpp") == nullptr);
  CHECK(p.origins.size() == 0);
  CHECK(!p.Range(std::string_view("parallel.tpp")).IsValid());
  // In code a path is a handle; a literal where a handle is expected is checked while compiling
  // (`p.Origin("parallel.tpp")` does not compile), and is the same handle.
  CHECK(FieldId("parallel.tp") == fields::kParallelTp);
  CHECK(FindPlanPath("cluster.gpu") == fields::kClusterGpu);
  CHECK(FindPlanPath("cluster.gpu")->IsRecord());
}

TEST_CASE("the handles and the field table come from one list") {
  REQUIRE(PlanFields().size() == fields::kFieldCount);
  for (const FieldInfo& f : PlanFields()) {
    CHECK_MESSAGE(fields::kPaths[f.index] == f.path, f.path);
    CHECK(FindPlanPath(f.path) == f.id());
    CHECK(!f.id().IsRecord());
    CHECK(&f.id().info() == &f);
  }
  CHECK(fields::kParallelTp.path == "parallel.tp");
  CHECK(fields::kClusterGpuMemory.path == "cluster.gpu.memory");
  CHECK(fields::kPrecision.path == "precision");
  // The accessor reads and writes the member the path names.
  Plan p;
  fields::kParallelTp.Get(p) = 8;
  CHECK(p.parallel.tp == 8);
  CHECK(GetFieldText(p, fields::kParallelTp.path) == "8");
  fields::kPipelineSchedule.Get(p) = Schedule::kGpipe;
  CHECK(GetFieldText(p, "pipeline.schedule") == "gpipe");
  p.pipeline.first_stage_layers = 3;
  CHECK(fields::kPipelineFirstStageLayers.Get(std::as_const(p)) == 3);
}

TEST_CASE("ParseFieldText reads a value as --set writes it, without setting it") {
  FieldValue v;
  CHECK(ParseFieldText(fields::kParallelTp.info(), "4", &v).empty());
  CHECK(v == FieldValue(int64_t{4}));
  CHECK(ParseFieldText(fields::kPipelineSchedule.info(), "\"1f1b\"", &v).empty());
  CHECK(v == FieldValue(std::string("1f1b")));
  CHECK(ParseFieldText(fields::kClusterGpuMemory.info(), "80 GiB", &v).empty());
  CHECK(v == FieldValue(int64_t{80} << 30));
  CHECK(ParseFieldText(fields::kParallelSp.info(), "yes", &v) ==
        "expects `true` or `false`, got `yes`");
  CHECK(ParseFieldText(fields::kParallelTp.info(), "", &v) == "expects an integer, got nothing");
  Plan p;
  CHECK(SetFieldText(p, "parallel.tp", "four") == "expects an integer, got `four`");
  CHECK(SetFieldText(p, "parallel.tp", "0") == "must be at least 1, got 0");
  CHECK(SetFieldText(p, "pipeline.first_stage_layers", "none").empty());
  CHECK(SetFieldText(p, "pipeline.stage_layers", "[2, 3]").empty());
  CHECK(p.pipeline.stage_layers == std::vector<int64_t>{2, 3});
}

TEST_CASE("PrintPlan is one line per field in a stable order") {
  Plan p;
  p.name = "demo";
  p.model.name = "tiny";
  p.cluster.name = "box";
  p.parallel.dp = 8;
  p.origins["parallel.dp"] =
      FieldOrigin{OriginKind::kAuto, {}, {"cluster.nodes"}, "dp = 8 / 1 = 8"};
  std::string dump = PrintPlan(p);
  CHECK(dump.rfind("plan demo\n", 0) == 0);
  CHECK(dump.find("  parallel.dp                        = 8                        # auto: dp = 8 "
                  "/ 1 = 8\n") != std::string::npos);
  CHECK(dump.find("model.layers") < dump.find("parallel.tp"));
  CHECK(dump == PrintPlan(p));
  CHECK(ToString(Schedule::kInterleaved1F1B) == "interleaved_1f1b");
  CHECK(ToString(Precision::kFp8) == "fp8");
}

TEST_CASE("VerifyPlan reports sizes below range and missing records") {
  Plan p;
  auto problems = VerifyPlan(p);
  CHECK(std::find(problems.begin(), problems.end(), "the plan has no model") != problems.end());
  CHECK(std::find(problems.begin(), problems.end(), "`model.layers` must be at least 1, got 0") !=
        problems.end());
  p.poisoned.insert("model.layers");
  problems = VerifyPlan(p);
  CHECK(std::find(problems.begin(), problems.end(), "`model.layers` must be at least 1, got 0") ==
        problems.end());
}

}  // namespace
TEST_CASE("ExpertCapacity is Megatron's get_capacity, held at the rows an expert can receive") {
  CHECK(ExpertCapacity(4096, 2, 64, 1.0) == 128);
  CHECK(ExpertCapacity(4096, 2, 64, 1.25) == 160);
  CHECK(ExpertCapacity(4096, 2, 64, 0) == 0);
  // A token reaches an expert once: past `rows` a capacity drops nothing.
  CHECK(ExpertCapacity(4096, 2, 64, 32) == 4096);
  CHECK(ExpertCapacity(4096, 2, 64, 1e12) == 4096);
  CHECK(ExpertCapacity(4096, 2, 64, 1e300) == 4096);
}

}  // namespace paraplan
