#include "tests/filetest/filetest.h"

#include <doctest/doctest.h>

namespace paraplan::filetest {
namespace {

TEST_CASE("expectation comments") {
  TestFile t = ParseTestFile(
      "# args: --set parallel.tp=8 --set 'parallel.order=\"tp-cp-ep-pp-dp\"'\n"
      "# ignore: P07\n"
      "plan p {\n"
      "  parallel { ep = 32 }  # expect-error: P0303 needs 512\n"
      "  // expect-warning@+1: P0411\n"
      "  batch { global = 6 }\n"
      "  name = \"# expect-error: P0301 inside a string is not a comment\"\n"
      "}\n"
      "# expect-note@*: P0502\n"
      "# expect-error@-8: P0305\n");
  CHECK(t.problems.empty());
  REQUIRE(t.args.size() == 4);
  CHECK(t.args[1] == "parallel.tp=8");
  CHECK(t.args[3] == "parallel.order=\"tp-cp-ep-pp-dp\"");
  CHECK(t.ignore_prefixes == std::vector<std::string>{"P07"});
  REQUIRE(t.expectations.size() == 4);
  CHECK(t.expectations[0].code == "P0303");
  CHECK(t.expectations[0].line == 4);
  CHECK(t.expectations[0].text == "needs 512");
  CHECK(t.expectations[1].level == DiagLevel::kWarning);
  CHECK(t.expectations[1].line == 6);
  CHECK(t.expectations[2].any_location);
  CHECK(t.expectations[2].level == DiagLevel::kNote);
  CHECK(t.expectations[3].line == 2);
}

TEST_CASE("malformed expectations are reported, not ignored") {
  TestFile t = ParseTestFile(
      "# expect-eror: P0303\n"
      "# expect-error: P9999\n"
      "# expect-error@x: P0303\n"
      "# expect-error@-5: P0303\n"
      "# expect-error P0303\n");
  CHECK(t.expectations.empty());
  CHECK(t.problems.size() == 5);
}

TEST_CASE("verify matches code, level, line and text exactly once") {
  CheckRun run;
  uint32_t b = run.sources.AddBuffer("f.plan", "a\nbb\nccc\n", BufferKind::kFile);
  run.diagnostics.push_back(Diag(DiagKind::kExpertMeshWorld, "needs 512 GPUs").At({b, 2, 3}).Get());
  run.diagnostics.push_back(Diag(DiagKind::kVocabPadded, "padded").At({b, 5, 6}).Get());
  TestFile t = ParseTestFile("# expect-error@+1: P0303 512\n# expect-note@*: P0502\n");
  CHECK(Verify("f.plan", t, run).empty());
  TestFile wrong_line = ParseTestFile("# expect-error@+2: P0303\n# expect-note@*: P0502\n");
  CHECK(Verify("f.plan", wrong_line, run).size() == 2);
  TestFile missing =
      ParseTestFile("# expect-error@+1: P0303\n# expect-note@*: P0502\n# expect-note@*: P0502\n");
  auto problems = Verify("f.plan", missing, run);
  REQUIRE(problems.size() == 1);
  CHECK(problems[0].find("missing note[P0502]") == 0);
  TestFile ignoring = ParseTestFile("# expect-error@+1: P0303\n# ignore: P05\n");
  CHECK(Verify("f.plan", ignoring, run).empty());
}

}  // namespace
}  // namespace paraplan::filetest
