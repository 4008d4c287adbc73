#include "compiler/check/evaluate.h"

#include <doctest/doctest.h>

#include <cstdlib>

namespace paraplan {
namespace {

std::string StdlibDir() {
  const char* root = std::getenv("PARAPLAN_SOURCE_DIR");
  return std::string(root ? root : ".") + "/stdlib";
}

struct Run {
  SourceManager sm;
  DiagnosticSink sink;
  std::unique_ptr<PlanSource> source;
  std::optional<Plan> plan;

  const Diagnostic* Find(DiagKind k) const {
    for (const Diagnostic& d : sink.diagnostics()) {
      if (d.kind == k) return &d;
    }
    return nullptr;
  }
  std::string Slice(SourceRange r) const { return std::string(sm.Slice(r)); }
  std::string Codes() const {
    std::string out;
    for (const Diagnostic& d : sink.diagnostics()) {
      out += std::string(GetDiagKindInfo(d.kind).code) + " " + d.message + "\n";
    }
    return out;
  }
};

constexpr const char* kPrelude = "import std.models.llama\nimport std.clusters\n";

std::unique_ptr<Run> Eval(const std::string& text, std::vector<std::string> sets = {},
                          bool sweeps = false, std::string plan_name = "") {
  auto run = std::make_unique<Run>();
  LoadOptions load;
  load.stdlib_dir = StdlibDir();
  run->source = PlanSource::FromText("test.plan", text, load, run->sm, run->sink);
  if (!run->source) return run;
  std::vector<SetOverride> overrides;
  for (const std::string& s : sets) {
    auto o = run->source->ParseSet(s, run->sm, run->sink);
    if (o) overrides.push_back(*o);
  }
  EvalOptions options;
  options.allow_sweeps = sweeps;
  run->plan = run->source->Evaluate(plan_name, overrides, options, run->sink);
  return run;
}

std::string Plan70b(const std::string& extra = "") {
  return std::string(kPrelude) + R"(
plan p {
  model = llama3_70b
  cluster = dgx_h100 { nodes = 8 }
  parallel { tp = 8  pp = 4  sp = true }
  batch { global = 1024  micro = 1 }
)" + extra +
         "\n}\n";
}

TEST_CASE("a stdlib-based plan evaluates with origins for every canonical path") {
  auto r = Eval(Plan70b());
  INFO(r->Codes());
  REQUIRE(r->plan);
  CHECK(r->sink.diagnostics().empty());
  const Plan& p = *r->plan;
  CHECK(p.name == "p");
  CHECK(p.model.name == "llama3_70b");
  CHECK(p.cluster.name == "dgx_h100");
  CHECK(p.cluster.gpu.name == "h100_sxm");
  CHECK(p.model.layers == 80);
  CHECK(p.model.kv_heads == 8);
  CHECK(p.model.head_dim == 128);
  CHECK(p.cluster.nodes == 8);
  CHECK(p.cluster.gpu.memory == 80LL << 30);
  CHECK(p.cluster.network_bandwidth == doctest::Approx(50e9));
  CHECK(p.cluster.nvlink_bandwidth == doctest::Approx(450e9));
  CHECK(p.cluster.gpu.peak_bf16 == doctest::Approx(989e12));
  CHECK(p.parallel.tp == 8);
  CHECK(p.parallel.etp == 8);
  CHECK(p.parallel.dp == 2);
  CHECK(p.parallel.sp);
  CHECK(p.Microbatches() == 512);
  CHECK(p.poisoned.empty());
  for (const FieldInfo& f : PlanFields()) CHECK_MESSAGE(p.origins.count(f.id()) == 1, f.path);
  CHECK(p.Origin("model.layers").kind == OriginKind::kStdlib);
  CHECK(r->Slice(p.Range("model.layers")) == "80");
  CHECK(p.Origin("parallel.tp").kind == OriginKind::kFile);
  CHECK(r->Slice(p.Range("parallel.tp")) == "8");
  CHECK(p.Origin("cluster.nodes").kind == OriginKind::kFile);
  CHECK(p.Origin("parallel.cp").kind == OriginKind::kDefault);
  const FieldOrigin& dp = p.Origin("parallel.dp");
  CHECK(dp.kind == OriginKind::kAuto);
  CHECK(dp.derivation == "dp = world / (tp·pp·cp) = 64 / (8·4·1) = 2");
  CHECK(dp.derived_from == std::vector<std::string>{"cluster.nodes", "cluster.gpus_per_node",
                                                    "parallel.tp", "parallel.pp", "parallel.cp"});
  const FieldOrigin& etp = p.Origin("parallel.etp");
  CHECK(etp.kind == OriginKind::kDerived);
  CHECK(etp.derived_from == std::vector<std::string>{"parallel.tp"});
  CHECK(r->Slice(etp.range) == "8");
  CHECK(p.Origin("model").kind == OriginKind::kFile);
  CHECK(VerifyPlan(p).empty());
}

TEST_CASE("--set overrides act as if written at the end of the plan") {
  auto r = Eval(Plan70b(), {"parallel.tp=4", "cluster.nodes=16", "pipeline.schedule=\"1f1b\"",
                            "parallel.order=\"tp-cp-ep-pp-dp\"", "model=llama3_8b",
                            "pipeline.account_for_loss=true", "optimizer.lr=2 * 1e-4"});
  INFO(r->Codes());
  REQUIRE(r->plan);
  CHECK(r->sink.diagnostics().empty());
  const Plan& p = *r->plan;
  CHECK(p.parallel.tp == 4);
  CHECK(p.parallel.etp == 4);
  CHECK(p.cluster.nodes == 16);
  CHECK(p.parallel.dp == 128 / 16);
  CHECK(p.model.name == "llama3_8b");
  CHECK(p.model.layers == 32);
  CHECK(p.parallel.order == "tp-cp-ep-pp-dp");
  CHECK(p.pipeline.account_for_loss);
  CHECK(p.optimizer.lr == doctest::Approx(2e-4));
  CHECK(p.Origin("parallel.tp").kind == OriginKind::kCommandLine);
  CHECK(r->sm.Kind(p.Range("parallel.tp").buffer) == BufferKind::kCommandLine);
  CHECK(r->Slice(p.Range("parallel.tp")) == "4");
  CHECK(p.Origin("model").kind == OriginKind::kCommandLine);
  CHECK(p.Origin("model.layers").kind == OriginKind::kStdlib);
}

TEST_CASE("derivation binds late, extends chains plans, lets and units compute") {
  auto r = Eval(std::string(kPrelude) + R"(
let big = dgx_h100 { nodes = 2 * 2 }
model tiny {
  layers = 4  hidden = 64  heads = 4  vocab = 256  seq_len = 128
  ffn_hidden = 4 * hidden
}
gpu fake { memory = 2 * 40 GiB  peak_bf16 = 100 TFLOPS  hbm_bandwidth = (1 TB) / (1 s) }
plan base {
  model = tiny { hidden = 128 }
  cluster = big { gpu = fake  network_bandwidth = 800 Gb/s }
  let half = cluster.gpus_per_node / 2
  parallel { tp = half  pp = min(2, 4) }
  pipeline.first_stage_layers = ceil_div(3, 2)
  batch { global = 64 }
}
plan variant extends base {
  parallel.pp = 1
  pipeline.stage_layers = [1, 3]
}
)");
  INFO(r->Codes());
  REQUIRE(r->plan);
  CHECK(r->sink.diagnostics().empty());
  const Plan& p = *r->plan;
  CHECK(p.name == "variant");
  CHECK(p.model.hidden == 128);
  CHECK(p.model.ffn_hidden == 512);  // late binding: 4 * the overridden hidden
  CHECK(p.model.head_dim == 32);
  CHECK(p.model.kv_heads == 4);
  CHECK(p.Origin("model.head_dim").kind == OriginKind::kDerived);
  CHECK(p.cluster.nodes == 4);
  CHECK(p.cluster.gpu.name == "fake");
  CHECK(p.cluster.gpu.memory == 80LL << 30);
  CHECK(p.cluster.gpu.peak_fp16 == doctest::Approx(100e12));
  CHECK(p.cluster.gpu.hbm_bandwidth == doctest::Approx(1e12));
  CHECK(p.cluster.network_bandwidth == doctest::Approx(100e9));
  CHECK(p.parallel.tp == 4);
  CHECK(p.parallel.pp == 1);
  CHECK(p.parallel.dp == 8);
  CHECK(p.pipeline.first_stage_layers == 2);
  CHECK(p.pipeline.stage_layers == std::vector<int64_t>{1, 3});
  CHECK(r->source->PlanNames() == std::vector<std::string>{"base", "variant"});
}

TEST_CASE("a plan named like its model still finds the imported model") {
  auto r =
      Eval(std::string(kPrelude) + "plan llama3_70b { model = llama3_70b  cluster = dgx_h100 }");
  INFO(r->Codes());
  REQUIRE(r->plan);
  CHECK(r->sink.diagnostics().empty());
  CHECK(r->plan->model.layers == 80);
}

TEST_CASE("auto dp that does not divide is poisoned quietly for the mesh rule") {
  auto r = Eval(Plan70b("parallel.pp = 3"));
  REQUIRE(r->plan);
  CHECK(r->sink.diagnostics().empty());
  CHECK(r->plan->IsPoisoned("parallel.dp"));
  CHECK(r->plan->Origin("parallel.dp").derivation ==
        "dp = world / (tp·pp·cp) = 64 / (8·3·1) = 64 / 24 is not whole");
}

TEST_CASE("sweeps become Plan::sweeps in search mode and an error otherwise") {
  auto r = Eval(Plan70b("parallel { tp = [2, 4, 8]  pp = auto }"), {}, true);
  INFO(r->Codes());
  REQUIRE(r->plan);
  CHECK(r->sink.diagnostics().empty());
  REQUIRE(r->plan->sweeps.size() == 2);
  CHECK(r->plan->sweeps[0].path == "parallel.tp");
  CHECK(r->plan->sweeps[0].values == std::vector<std::string>{"2", "4", "8"});
  CHECK(r->plan->sweeps[1].path == "parallel.pp");
  CHECK(r->plan->sweeps[1].values.size() == 7);  // divisors of 64
  CHECK(r->plan->parallel.tp == 2);

  r = Eval(Plan70b("parallel { tp = [2, 4, 8] }"));
  const Diagnostic* d = r->Find(DiagKind::kSweepOutsideSearch);
  REQUIRE(d);
  CHECK(d->message == "`parallel.tp` ranges over 3 values; checking needs one");
  CHECK(d->helps.at(0) ==
        "check one candidate with `--set parallel.tp=2`, or search them all with `planc search`");
  CHECK(r->plan->IsPoisoned("parallel.tp"));

  r = Eval(Plan70b("parallel { pp = auto }"));
  d = r->Find(DiagKind::kAutoUnsupported);
  REQUIRE(d);
  CHECK(d->message == "`parallel.pp` cannot be `auto` here");
  r = Eval(Plan70b("model = llama3_70b { layers = auto }"));
  CHECK(r->Find(DiagKind::kAutoUnsupported));
}

TEST_CASE("`1f1b` is the schedule value unquoted, in a plan and in --set, and a name elsewhere") {
  // It lexes as the number 1 with the unit `f1b`; written as one word it is the enum value.
  auto r = Eval(Plan70b("pipeline { schedule = 1f1b }"));
  REQUIRE(r->plan);
  CHECK(r->sink.error_count() == 0);
  CHECK(r->plan->pipeline.schedule == Schedule::k1F1B);

  r = Eval(Plan70b("pipeline { schedule = interleaved_1f1b }"), {"pipeline.schedule=1f1b"});
  REQUIRE(r->plan);
  CHECK(r->sink.error_count() == 0);
  CHECK(r->plan->pipeline.schedule == Schedule::k1F1B);

  // Outside an enum field it names nothing; a unit that is not one stays a unit error.
  r = Eval(Plan70b(), {"parallel.tp=1f1b"});
  const Diagnostic* d = r->Find(DiagKind::kUnknownName);
  REQUIRE(d);
  CHECK(d->message == "unknown name `1f1b`");
  r = Eval(Plan70b(), {"parallel.tp=8parsecs"});
  d = r->Find(DiagKind::kUnknownUnit);
  REQUIRE(d);
  CHECK(d->message == "`parsecs` is not a unit");
  // With a space it is a number and a unit, as written.
  r = Eval(Plan70b("pipeline { schedule = 1 f1b }"));
  CHECK(r->Find(DiagKind::kUnknownUnit));
}

TEST_CASE("names, fields and enum values suggest the closest spelling") {
  auto r = Eval(Plan70b("model = llama3_7b"));
  const Diagnostic* d = r->Find(DiagKind::kUnknownName);
  REQUIRE(d);
  CHECK(d->message == "unknown name `llama3_7b`");
  CHECK(d->helps.at(0).find("did you mean `llama3_") == 0);
  CHECK(r->plan->IsPoisoned("model.layers"));
  CHECK(r->sink.error_count() == 1);  // no cascade from the poisoned model

  r = Eval(Plan70b("parallel { tpp = 4 }"));
  d = r->Find(DiagKind::kUnknownField);
  REQUIRE(d);
  CHECK(d->message == "`parallel` has no field `tpp`");
  CHECK(d->helps.at(0) == "did you mean `parallel.tp`?");

  r = Eval(Plan70b("ep = 4"));
  d = r->Find(DiagKind::kUnknownField);
  REQUIRE(d);
  CHECK(d->helps.at(0) == "did you mean `parallel.ep`?");

  r = Eval(Plan70b(), {"parallel.tpp=4"});
  d = r->Find(DiagKind::kUnknownField);
  REQUIRE(d);
  CHECK(d->message == "unknown field `parallel.tpp` in `--set`");
  CHECK(r->sm.Kind(d->primary.buffer) == BufferKind::kCommandLine);
  CHECK(r->Slice(d->primary) == "tpp");

  r = Eval(Plan70b("pipeline { schedule = interleaved }"));
  d = r->Find(DiagKind::kUnknownEnumValue);
  REQUIRE(d);
  CHECK(d->message == "`interleaved` is not a value of `pipeline.schedule`");

  r = Eval(Plan70b("recompute = \"selectve\""));
  d = r->Find(DiagKind::kUnknownEnumValue);
  REQUIRE(d);
  CHECK(d->helps.at(0) == "did you mean `selective`?");

  r = Eval(Plan70b("parallel.tp.x = 1"));
  d = r->Find(DiagKind::kUnknownField);
  REQUIRE(d);
  CHECK(d->message == "`parallel.tp` is a value, not a record with fields");
}

TEST_CASE("types, units, overflow and division are checked") {
  auto r = Eval(Plan70b("parallel { tp = \"four\" }"));
  const Diagnostic* d = r->Find(DiagKind::kTypeMismatch);
  REQUIRE(d);
  CHECK(d->message == "`parallel.tp` expects an integer, got a string");

  r = Eval(Plan70b("cluster = llama3_8b"));
  d = r->Find(DiagKind::kTypeMismatch);
  REQUIRE(d);
  CHECK(d->message == "`cluster` must be a `cluster` record, not a `model` record");

  r = Eval(Plan70b("cluster.gpu.memory = 80 GB/s"));
  d = r->Find(DiagKind::kUnitMismatch);
  REQUIRE(d);
  CHECK(d->message == "`cluster.gpu.memory` expects bytes, got a bandwidth");

  r = Eval(Plan70b("let x = 1 GB + 1 s\nrequire x > 0 GB : \"never\""));
  d = r->Find(DiagKind::kUnitMismatch);
  REQUIRE(d);
  CHECK(d->message == "`1 GB + 1 s` mixes a size in bytes and a time");

  r = Eval(Plan70b("batch.global = 9223372036854775807 * 2"));
  d = r->Find(DiagKind::kIntegerOverflow);
  REQUIRE(d);
  CHECK(d->message == "integer overflow in `9223372036854775807 * 2`");

  // INT64_MIN / -1 and INT64_MIN % -1 do not fit: reported as overflow, never a trap.
  for (const char* expr : {"(-9223372036854775807 - 1) / -1", "(-9223372036854775807 - 1) % -1",
                           "ceil_div(-9223372036854775807 - 1, -1)"}) {
    r = Eval(Plan70b(std::string("batch.global = ") + expr));
    d = r->Find(DiagKind::kIntegerOverflow);
    REQUIRE_MESSAGE(d, expr);
    CHECK(d->message == std::string("integer overflow in `") + expr + "`");
  }

  r = Eval(Plan70b(), {"batch.global=(-9223372036854775807 - 1) / -1"});  // the same from --set
  d = r->Find(DiagKind::kIntegerOverflow);
  REQUIRE(d);
  CHECK(d->message == "integer overflow in `(-9223372036854775807 - 1) / -1`");

  r = Eval(Plan70b("batch.global = 4 / 0"));
  REQUIRE(r->Find(DiagKind::kDivisionByZero));

  r = Eval(Plan70b("batch.global = 10 / 4"));
  d = r->Find(DiagKind::kTypeMismatch);
  REQUIRE(d);
  CHECK(d->message == "`batch.global` expects an integer, got a real number");

  r = Eval(Plan70b("parallel.tp = 0"));
  d = r->Find(DiagKind::kValueOutOfRange);
  REQUIRE(d);
  CHECK(d->message == "`parallel.tp` must be at least 1, got 0");
  CHECK(r->plan->IsPoisoned("parallel.tp"));

  r = Eval(Plan70b("optimizer.zero = 4"));
  d = r->Find(DiagKind::kValueOutOfRange);
  REQUIRE(d);
  CHECK(d->message == "`optimizer.zero` must be between 0 and 3, got 4");
}

TEST_CASE("require reports the user's message with the evaluated operands") {
  auto r =
      Eval(Plan70b("require parallel.tp * 2 <= cluster.gpus_per_node : \"keep TP inside NVLink\""),
           {"parallel.tp=8"});
  const Diagnostic* d = r->Find(DiagKind::kRequireFailed);
  REQUIRE(d);
  CHECK(d->message == "requirement failed: keep TP inside NVLink");
  CHECK(d->primary_label == "16 <= 8 is false");
  REQUIRE(d->values.size() == 2);
  CHECK(d->values[0] == std::pair<std::string, std::string>{"parallel.tp * 2", "16"});
  CHECK(d->values[1] == std::pair<std::string, std::string>{"cluster.gpus_per_node", "8"});
  bool stdlib_label = false;
  for (const DiagLabel& l : d->labels)
    stdlib_label |= l.message.find("from the stdlib") != std::string::npos;
  CHECK(stdlib_label);

  r = Eval(Plan70b("require parallel.tp <= 4"));
  d = r->Find(DiagKind::kRequireFailed);
  REQUIRE(d);
  CHECK(d->message == "requirement `parallel.tp <= 4` does not hold");
  bool file_label = false;
  for (const DiagLabel& l : d->labels) file_label |= l.message == "`parallel.tp` = 8 set here";
  CHECK(file_label);

  r = Eval(Plan70b("require pipeline.schedule == gpipe or parallel.pp == 4 : \"ok\""));
  CHECK(r->sink.diagnostics().empty());
}

TEST_CASE("missing fields, cycles, duplicates, imports and plan selection") {
  auto r = Eval(std::string(kPrelude) +
                "model m { layers = 2  heads = 4  vocab = 8  seq_len = 8 }\n"
                "plan p { model = m  cluster = dgx_h100 }");
  const Diagnostic* d = r->Find(DiagKind::kMissingField);
  REQUIRE(d);
  CHECK(d->message == "`model.hidden` is not set");
  CHECK(r->Slice(d->primary) == "m");

  r = Eval(std::string(kPrelude) + "plan p { cluster = dgx_h100 }");
  d = r->Find(DiagKind::kMissingField);
  REQUIRE(d);
  CHECK(d->message == "`model` is not set");

  r = Eval(std::string(kPrelude) +
           "model m { layers = 2  hidden = ffn_hidden  ffn_hidden = hidden  heads = 1  vocab = 8  "
           "seq_len = 8 }\n"
           "plan p { model = m  cluster = dgx_h100 }");
  d = r->Find(DiagKind::kCyclicDefinition);
  REQUIRE(d);
  CHECK(d->message.find("depends on itself") != std::string::npos);

  r = Eval(Plan70b("let a = b\nlet b = a\nbatch.micro = a"));
  REQUIRE(r->Find(DiagKind::kCyclicDefinition));

  r = Eval(Plan70b() + "plan p { }\n");
  d = r->Find(DiagKind::kDuplicateDefinition);
  REQUIRE(d);
  CHECK(d->message == "`p` is declared twice in this file");
  CHECK(d->labels.size() == 1);

  r = Eval("import std.models.lama\nplan p { }");
  d = r->Find(DiagKind::kImportNotFound);
  REQUIRE(d);
  CHECK(d->message == "cannot find `std.models.lama` to import");
  CHECK(d->helps.at(0) == "did you mean `import std.models.llama`?");
  CHECK(!r->source);

  r = Eval(Plan70b(), {}, false, "q");
  d = r->Find(DiagKind::kPlanNotFound);
  REQUIRE(d);
  CHECK(d->message == "no plan named `q` in `test.plan`");
  CHECK(!r->plan);

  r = Eval(kPrelude);
  REQUIRE(r->Find(DiagKind::kPlanNotFound));
}

TEST_CASE("checking goes on after an error and reports each independent one") {
  auto r = Eval(Plan70b("parallel.tp = \"x\"\noptimizer.zero = 7\nrecompute = most"));
  CHECK(r->Find(DiagKind::kTypeMismatch));
  CHECK(r->Find(DiagKind::kValueOutOfRange));
  CHECK(r->Find(DiagKind::kUnknownEnumValue));
  CHECK(r->sink.error_count() == 3);
  REQUIRE(r->plan);
  CHECK(r->plan->IsPoisoned("parallel.tp"));
  CHECK(r->plan->IsPoisoned("parallel.dp"));  // depends on tp: poisoned, not reported
  CHECK(r->plan->model.layers == 80);
}

TEST_CASE("every stdlib record evaluates cleanly with its published numbers") {
  auto r = Eval(R"(import std.gpus
import std.clusters
import std.models.gpt
import std.models.llama
import std.models.mixtral
import std.models.deepseek
import std.models.qwen
import std.models.nemotron
import std.models.gpt_oss
plan all { model = deepseek_v3  cluster = dgx_h200 { nodes = 4 } }
)");
  INFO(r->Codes());
  REQUIRE(r->source);
  DiagnosticSink sink;
  int count = EvaluateAllRecords(*r->source, sink);
  for (const Diagnostic& d : sink.diagnostics()) INFO(d.message);
  CHECK(sink.diagnostics().empty());
  CHECK(count == 40);  // 39 records and the plan
  REQUIRE(r->plan);
  CHECK(r->plan->model.layers == 61);
  CHECK(r->plan->model.dense_layers == 3);
  CHECK(r->plan->model.experts == 256);
  CHECK(r->plan->model.head_dim == 192);
  CHECK(r->plan->cluster.gpu.memory == 141000000000LL);

  auto check_model = [](const std::string& name, int64_t layers, int64_t hidden, int64_t heads,
                        int64_t kv, int64_t vocab) {
    auto m = Eval(
        std::string("import std.models.gpt\nimport std.models.llama\nimport std.models.mixtral\n"
                    "import std.models.qwen\nimport std.clusters\nplan p { model = ") +
        name + "  cluster = dgx_h100 }");
    REQUIRE(m->plan);
    CHECK(m->sink.diagnostics().empty());
    CHECK(m->plan->model.layers == layers);
    CHECK(m->plan->model.hidden == hidden);
    CHECK(m->plan->model.heads == heads);
    CHECK(m->plan->model.kv_heads == kv);
    CHECK(m->plan->model.vocab == vocab);
  };
  check_model("gpt2_small", 12, 768, 12, 12, 50257);
  check_model("gpt2_xl", 48, 1600, 25, 25, 50257);
  check_model("gpt3_175b", 96, 12288, 96, 96, 50257);
  check_model("llama2_70b", 80, 8192, 64, 8, 32000);
  check_model("llama3_405b", 126, 16384, 128, 8, 128256);
  check_model("mixtral_8x7b", 32, 4096, 32, 8, 32000);
  check_model("qwen3_30b_a3b", 48, 2048, 32, 4, 151936);
}

}  // namespace
}  // namespace paraplan
