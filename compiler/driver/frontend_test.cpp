#include "compiler/driver/frontend.h"

#include <doctest/doctest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

namespace paraplan {
namespace {

TEST_CASE("ParseFrontendArgs takes FILE, --plan, --set and -I and keeps the rest in order") {
  FrontendOptions o;
  std::vector<std::string> rest;
  std::string error;
  REQUIRE(ParseFrontendArgs({"--diagnostics=json", "a.plan", "--set", "parallel.tp=4", "--plan=x",
                             "--set=cluster.nodes=2", "-I", "inc", "-Iother", "--top", "3"},
                            &o, &rest, &error));
  CHECK(o.file == "a.plan");
  CHECK(o.plan_name == "x");
  CHECK(o.sets == std::vector<std::string>{"parallel.tp=4", "cluster.nodes=2"});
  CHECK(o.include_dirs == std::vector<std::string>{"inc", "other"});
  CHECK(rest == std::vector<std::string>{"--diagnostics=json", "--top", "3"});

  FrontendOptions o2;
  rest.clear();
  CHECK(!ParseFrontendArgs({"a.plan", "--set", "parallel.tp"}, &o2, &rest, &error));
  CHECK(error == "--set takes PATH=VALUE (e.g. --set parallel.tp=4), got 'parallel.tp'");
  FrontendOptions o3;
  CHECK(!ParseFrontendArgs({"--plan", "x"}, &o3, &rest, &error));
  CHECK(error == "no plan file given");
  FrontendOptions o4;
  CHECK(!ParseFrontendArgs({"a.plan", "--set"}, &o4, &rest, &error));
  CHECK(error == "--set needs a value");
}

struct TempPlan {
  explicit TempPlan(const std::string& text) {
    // The process id keeps concurrent test runs (several checkouts on one machine) apart.
    static int counter = 0;
    path = (std::filesystem::temp_directory_path() /
            ("paraplan_frontend_test_" + std::to_string(::getpid()) + "_" +
             std::to_string(counter++) + ".plan"))
               .string();
    std::ofstream(path) << text;
    const char* root = std::getenv("PARAPLAN_SOURCE_DIR");
    setenv("PARAPLAN_STDLIB", (std::string(root ? root : ".") + "/stdlib").c_str(), 1);
  }
  ~TempPlan() { std::remove(path.c_str()); }
  std::string path;
};

constexpr const char* kPlan = R"(import std.models.llama
import std.clusters
plan small {
  model = llama3_8b
  cluster = dgx_h100 { nodes = 2 }
  parallel { tp = 4  pp = 2 }
  batch { global = 64  micro = 1 }
  require parallel.tp <= cluster.gpus_per_node : "keep TP inside NVLink"
}
)";

TEST_CASE("LoadPlan reads, evaluates and checks a plan file") {
  TempPlan file(kPlan);
  FrontendOptions o;
  o.file = file.path;
  o.sets = {"parallel.pp=4"};
  SourceManager sm;
  DiagnosticSink sink;
  auto plan = LoadPlan(o, sm, sink);
  REQUIRE(plan);
  CHECK(!sink.has_errors());
  CHECK(plan->parallel.pp == 4);
  CHECK(plan->parallel.dp == 1);

  o.sets = {"parallel.tp=16"};
  DiagnosticSink sink2;
  CHECK(!LoadPlan(o, sm, sink2));
  bool require_failed = false;
  for (const Diagnostic& d : sink2.diagnostics())
    require_failed |= d.kind == DiagKind::kRequireFailed;
  CHECK(require_failed);

  o.file = file.path + ".missing";
  DiagnosticSink sink3;
  CHECK(!LoadPlan(o, sm, sink3));
  REQUIRE(sink3.diagnostics().size() == 1);
  CHECK(sink3.diagnostics()[0].kind == DiagKind::kFileNotReadable);
}

TEST_CASE("PlanVariants checks many variants from one parse") {
  TempPlan file(kPlan);
  FrontendOptions o;
  o.file = file.path;
  SourceManager sm;
  DiagnosticSink sink;
  auto variants = PlanVariants::Load(o, sm, sink);
  REQUIRE(variants);
  int ok = 0;
  for (int tp : {1, 2, 4, 8}) {
    for (int pp : {1, 2, 4}) {
      auto sets = variants->ParseSets(
          {"parallel.tp=" + std::to_string(tp), "parallel.pp=" + std::to_string(pp)}, sink);
      REQUIRE(sets);
      DiagnosticSink vs;
      auto plan = variants->Check(*sets, vs, /*run_rules=*/false);
      REQUIRE(plan);
      if (tp * pp <= 16) {
        CHECK(plan->parallel.dp * tp * pp == 16);
      } else {
        CHECK(
            plan->IsPoisoned("parallel.dp"));  // 16 GPUs do not hold tp · pp; the mesh rule says so
      }
      ++ok;
    }
  }
  CHECK(ok == 12);
  DiagnosticSink bad;
  CHECK(!variants->ParseSets({"parallel.tp=="}, bad));
  CHECK(bad.diagnostics().at(0).kind == DiagKind::kSyntaxError);
}

}  // namespace
}  // namespace paraplan
