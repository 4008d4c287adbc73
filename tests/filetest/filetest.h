// File tests: plans that carry their expected diagnostics in comments (-verify style), golden
// text renders, the diagnostic coverage check and the examples check. One runner,
// paraplan_filetest, drives them all (see tests/filetest/README.md for the conventions).
//
// Expectation comments, anywhere in a .plan file (`#` or `//` comments):
//   # expect-error: P0303                 on this line (use it as a trailing comment)
//   # expect-error@+1: P0303 needs 512    on the next line; the text after the code must occur
//                                         in the message (optional)
//   # expect-warning@-2: P0411            two lines up
//   # expect-note@*: P0502                anywhere, also outside this file (stdlib, --set)
//   # args: --set parallel.tp=8 --plan b  command-line arguments for this file (split on spaces;
//                                         'single quotes' group, double quotes stay in the value)
//   # ignore: P07                         drop diagnostics whose code starts with P07
//   # args: --dump=ast                    golden renders: the dump (planc's stdout) comes first
// A file passes when the diagnostics `planc check` would print are exactly the expected ones.
#ifndef PARAPLAN_TESTS_FILETEST_FILETEST_H_
#define PARAPLAN_TESTS_FILETEST_FILETEST_H_

#include <string>
#include <string_view>
#include <vector>

#include "compiler/diagnostics/diagnostic.h"
#include "compiler/source/source.h"

namespace paraplan::filetest {

struct Expectation {
  DiagLevel level = DiagLevel::kError;
  std::string code;           // "P0303"
  uint32_t line = 0;          // expected line of the primary range; 0 with any_location
  bool any_location = false;  // @*
  std::string text;           // substring of the message; may be empty
  uint32_t written_at = 0;    // line of the comment
};

struct TestFile {
  std::vector<Expectation> expectations;
  std::vector<std::string> args;
  std::vector<std::string> ignore_prefixes;
  std::vector<std::string> problems;  // malformed expectation comments
};

TestFile ParseTestFile(std::string_view text);

// What `planc check FILE args...` reports, and its source manager.
struct CheckRun {
  SourceManager sources;
  std::vector<Diagnostic> diagnostics;
  std::string dump;         // what --dump=ast|plan writes to stdout
  std::string usage_error;  // non-empty when the arguments were refused
};
void RunCheck(const std::string& file, const std::vector<std::string>& args, CheckRun& run);

// Compares; returns the mismatches as lines ("unexpected ...", "missing ...").
std::vector<std::string> Verify(const std::string& file, const TestFile& test, const CheckRun& run);

}  // namespace paraplan::filetest

#endif  // PARAPLAN_TESTS_FILETEST_FILETEST_H_
