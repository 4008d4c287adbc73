#include "compiler/driver/check_file.h"

#include <doctest/doctest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "compiler/driver/commands.h"

namespace paraplan {
namespace {

struct TempFile {
  explicit TempFile(const std::string& text) {
    // The process id keeps concurrent test runs (several checkouts on one machine) apart.
    static int counter = 0;
    path = (std::filesystem::temp_directory_path() /
            ("paraplan_check_file_test_" + std::to_string(::getpid()) + "_" +
             std::to_string(counter++) + ".plan"))
               .string();
    std::ofstream(path) << text;
    const char* root = std::getenv("PARAPLAN_SOURCE_DIR");
    setenv("PARAPLAN_STDLIB", (std::string(root ? root : ".") + "/stdlib").c_str(), 1);
  }
  ~TempFile() { std::remove(path.c_str()); }
  std::string path;
};

constexpr const char* kPlan = R"(import std.clusters
model m { layers = 4  hidden = 512  ffn_hidden = 2048  heads = 8  vocab = 1000  seq_len = 128 }
plan p {
  model = m
  cluster = dgx_h100 { nodes = 1 }
  parallel { tp = 2 }
  batch { global = 8 }
}
)";

TEST_CASE("ParseCheckDump takes ast and plan") {
  CHECK(ParseCheckDump("ast") == CheckDump::kAst);
  CHECK(ParseCheckDump("plan") == CheckDump::kPlan);
  CHECK(!ParseCheckDump("layout"));
  CHECK(!ParseCheckDump(""));
}

TEST_CASE("CheckFile dumps the main file's AST, also when evaluation finds errors") {
  TempFile file(kPlan);
  FrontendOptions o;
  o.file = file.path;
  SourceManager sm;
  DiagnosticSink sink;
  CheckResult r = CheckFile(o, CheckDump::kAst, sm, sink);
  CHECK(r.plan);
  CHECK(r.internal_errors.empty());
  CHECK(r.dump.rfind("module\n  import std.clusters @1:1-1:20\n", 0) == 0);
  CHECK(r.dump.find("  plan p @3:1-8:2\n    assign model = m @4:3-4:12\n") != std::string::npos);
  CHECK(r.dump.find("    amend parallel @6:3-6:22\n      assign tp = 2 @6:14-6:20\n") !=
        std::string::npos);

  // An evaluation error: still a dump of the syntax tree, no plan.
  o.sets = {"parallel.tp=3"};
  SourceManager sm2;
  DiagnosticSink sink2;
  CheckResult bad = CheckFile(o, CheckDump::kAst, sm2, sink2);
  CHECK(!bad.plan);
  CHECK(sink2.has_errors());
  CHECK(bad.dump == r.dump);
}

TEST_CASE("CheckFile dumps the plan only when there are no errors") {
  TempFile file(kPlan);
  FrontendOptions o;
  o.file = file.path;
  SourceManager sm;
  DiagnosticSink sink;
  CheckResult r = CheckFile(o, CheckDump::kPlan, sm, sink);
  REQUIRE(r.plan);
  CHECK(r.dump == PrintPlan(*r.plan));
  CHECK(r.dump.find("  parallel.dp                        = 4 ") != std::string::npos);

  o.sets = {"parallel.tp=3"};
  SourceManager sm2;
  DiagnosticSink sink2;
  CHECK(CheckFile(o, CheckDump::kPlan, sm2, sink2).dump.empty());

  SourceManager sm3;
  DiagnosticSink sink3;
  CHECK(CheckFile(o, CheckDump::kNone, sm3, sink3).dump.empty());
}

TEST_CASE("CheckFile dumps nothing for a file that does not parse") {
  TempFile file("plan p {\n  tp = = 4\n}\n");
  FrontendOptions o;
  o.file = file.path;
  SourceManager sm;
  DiagnosticSink sink;
  CheckResult r = CheckFile(o, CheckDump::kAst, sm, sink);
  CHECK(!r.plan);
  CHECK(r.dump.empty());
  CHECK(sink.has_errors());
}

TEST_CASE("planc check refuses a dump it does not have, and a dump beside machine output") {
  TempFile file(kPlan);
  CHECK(RunCheck({file.path, "--dump=layout"}) == kExitUsage);
  CHECK(RunCheck({file.path, "--dump"}) == kExitUsage);
  CHECK(RunCheck({file.path, "--dump=ast", "--diagnostics=json"}) == kExitUsage);
  CHECK(RunCheck({file.path, "--dump=ast"}) == kExitOk);
  CHECK(RunCheck({file.path, "--dump=plan", "--set", "parallel.tp=3"}) == kExitInputError);
}

}  // namespace
}  // namespace paraplan
