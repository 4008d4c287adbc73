// paraplan_filetest: runs file tests, golden renders, the diagnostic coverage check and the
// examples check. Paths are relative to --root (the repository), so renders never contain
// machine-specific paths; the stdlib is read from <root>/stdlib.
//
//   paraplan_filetest --root DIR [--verify] FILE...      expectations in comments
//   paraplan_filetest --root DIR --golden [--update] FILE...   FILE's text render == FILE.expected
//   paraplan_filetest --root DIR --coverage              every kind: a page and a test
//   paraplan_filetest --root DIR --examples-readme        examples/README.md matches the examples
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "compiler/diagnostics/render.h"
#include "tests/filetest/filetest.h"

namespace fs = std::filesystem;
using namespace paraplan;
using namespace paraplan::filetest;

namespace {

bool ReadFile(const std::string& path, std::string* text) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::ostringstream ss;
  ss << in.rdbuf();
  *text = ss.str();
  return true;
}

std::string Render(const CheckRun& run) {
  RenderOptions o;
  return RenderDiagnostics(run.diagnostics, run.sources, DiagFormat::kText, o);
}

int VerifyFiles(const std::vector<std::string>& files) {
  int failed = 0;
  for (const std::string& file : files) {
    std::string text;
    if (!ReadFile(file, &text)) {
      std::printf("FAIL %s: cannot read\n", file.c_str());
      ++failed;
      continue;
    }
    TestFile test = ParseTestFile(text);
    CheckRun run;
    RunCheck(file, test.args, run);
    std::vector<std::string> problems = Verify(file, test, run);
    if (problems.empty()) {
      std::printf("ok   %s (%zu expected)\n", file.c_str(), test.expectations.size());
      continue;
    }
    ++failed;
    std::printf("FAIL %s\n", file.c_str());
    for (const std::string& p : problems) std::printf("  %s\n", p.c_str());
    std::printf("--- what planc check prints for it:\n%s---\n", Render(run).c_str());
  }
  return failed == 0 ? 0 : 1;
}

int Golden(const std::vector<std::string>& files, bool update) {
  int failed = 0;
  for (const std::string& file : files) {
    std::string text;
    if (!ReadFile(file, &text)) {
      std::printf("FAIL %s: cannot read\n", file.c_str());
      ++failed;
      continue;
    }
    TestFile test = ParseTestFile(text);
    CheckRun run;
    RunCheck(file, test.args, run);
    std::string actual =
        run.usage_error.empty() ? run.dump + Render(run) : "usage error: " + run.usage_error + "\n";
    std::string expected_path = fs::path(file).replace_extension(".expected").string();
    std::string expected;
    bool have = ReadFile(expected_path, &expected);
    if (update) {
      if (!have || expected != actual) {
        std::ofstream(expected_path, std::ios::binary) << actual;
        std::printf("updated %s\n", expected_path.c_str());
      }
      continue;
    }
    if (have && expected == actual) {
      std::printf("ok   %s\n", file.c_str());
      continue;
    }
    ++failed;
    std::printf("FAIL %s: the render differs from %s (scripts/update-golden rewrites it)\n",
                file.c_str(), expected_path.c_str());
    std::istringstream a(actual), e(expected);
    std::string la, le;
    for (int n = 1;; ++n) {
      bool ga = bool(std::getline(a, la)), ge = bool(std::getline(e, le));
      if (!ga && !ge) break;
      if (!ga || !ge || la != le) {
        std::printf("  first difference at line %d\n  expected: %s\n  actual:   %s\n", n,
                    ge ? le.c_str() : "<end>", ga ? la.c_str() : "<end>");
        break;
      }
    }
    std::printf("--- actual render:\n%s---\n", actual.c_str());
  }
  return failed == 0 ? 0 : 1;
}

std::vector<std::string> FilesUnder(const std::string& dir,
                                    const std::vector<std::string>& suffixes) {
  std::vector<std::string> out;
  std::error_code ec;
  if (!fs::exists(dir, ec)) return out;
  for (auto it = fs::recursive_directory_iterator(dir, ec);
       it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (ec) break;
    if (!it->is_regular_file(ec)) continue;
    std::string p = it->path().string();
    if (p.find("/build") != std::string::npos) continue;
    for (const std::string& s : suffixes) {
      if (p.size() >= s.size() && p.compare(p.size() - s.size(), s.size(), s) == 0)
        out.push_back(p);
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

// Every registered kind has docs/diagnostics/<CODE>.md and is produced by some test: an
// expectation in a .plan under tests/ or examples/, a golden render, or its code in quotes
// (or DiagKind::kName) in a *_test.cpp. tests/filetest/coverage_pending.txt lists kinds allowed to
// lack a test for now; a listed kind that is covered is reported too, so the list only shrinks.
int Coverage() {
  std::set<std::string> tested;
  std::set<std::string> codes;
  for (const DiagKindInfo& k : AllDiagKinds()) codes.insert(std::string(k.code));
  auto note_codes = [&](const std::string& text, const std::regex& re) {
    for (auto it = std::sregex_iterator(text.begin(), text.end(), re); it != std::sregex_iterator();
         ++it) {
      tested.insert((*it)[1].str());
    }
  };
  const std::regex expect_re(R"(expect-(?:error|warning|note)(?:@[^:\s]*)?:\s*(P\d{4}))");
  const std::regex quoted_re(R"re("(P\d{4})")re");
  const std::regex golden_re(R"(\[(P\d{4})\])");
  const std::regex enum_re(R"(DiagKind::(k[A-Za-z0-9]+))");
  std::map<std::string, std::string> code_of_id;
  for (const DiagKindInfo& k : AllDiagKinds()) code_of_id[std::string(k.id)] = std::string(k.code);
  for (const char* dir : {"tests", "examples"}) {
    for (const std::string& f : FilesUnder(dir, {".plan"})) {
      std::string text;
      if (ReadFile(f, &text)) note_codes(text, expect_re);
    }
  }
  for (const std::string& f : FilesUnder("tests/golden", {".expected"})) {
    std::string text;
    if (ReadFile(f, &text)) note_codes(text, golden_re);
  }
  for (const char* dir : {"compiler", "tests", "runtime", "bench"}) {
    for (const std::string& f : FilesUnder(dir, {"_test.cpp"})) {
      std::string text;
      if (!ReadFile(f, &text)) continue;
      note_codes(text, quoted_re);
      for (auto it = std::sregex_iterator(text.begin(), text.end(), enum_re);
           it != std::sregex_iterator(); ++it) {
        auto c = code_of_id.find((*it)[1].str());
        if (c != code_of_id.end()) tested.insert(c->second);
      }
    }
  }
  std::map<std::string, std::string> pending;
  {
    std::string text;
    ReadFile("tests/filetest/coverage_pending.txt", &text);
    std::istringstream in(text);
    std::string line;
    while (std::getline(in, line)) {
      if (line.empty() || line[0] == '#') continue;
      std::string code = line.substr(0, line.find_first_of(" \t"));
      pending[code] = line;
    }
  }
  std::string index;
  ReadFile("docs/diagnostics/README.md", &index);
  std::vector<std::string> no_page, not_indexed, no_test, stale;
  for (const DiagKindInfo& k : AllDiagKinds()) {
    std::string code(k.code);
    if (!fs::exists("docs/diagnostics/" + code + ".md"))
      no_page.push_back(code + " " + std::string(k.name));
    if (index.find("[" + code + "](" + code + ".md)") == std::string::npos) {
      not_indexed.push_back(code + " " + std::string(k.name));
    }
    bool has_test = tested.count(code) > 0;
    if (!has_test && !pending.count(code)) no_test.push_back(code + " " + std::string(k.name));
    if (has_test && pending.count(code)) stale.push_back(code + " " + std::string(k.name));
  }
  for (const auto& [code, line] : pending) {
    if (!codes.count(code)) stale.push_back(code + " (not a registered kind)");
  }
  std::printf("%zu kinds, %zu with a test\n", codes.size(), tested.size());
  auto list = [](const char* what, const std::vector<std::string>& v) {
    if (v.empty()) return;
    std::printf("%s:\n", what);
    for (const std::string& s : v) std::printf("  %s\n", s.c_str());
  };
  list("kinds without a page docs/diagnostics/<CODE>.md", no_page);
  list("kinds missing from the index docs/diagnostics/README.md (a row `| [CODE](CODE.md) | ...`)",
       not_indexed);
  list(
      "kinds no test produces (add a file test, or name the code in quotes or DiagKind::kName in a "
      "*_test.cpp)",
      no_test);
  list("kinds listed in tests/filetest/coverage_pending.txt that are covered now (remove them)",
       stale);
  return no_page.empty() && not_indexed.empty() && no_test.empty() && stale.empty() ? 0 : 1;
}

// examples/README.md has a table row per example: | `name.plan` | what it shows | reports |.
// The codes in the last cell (or "clean") must be exactly the codes the example expects.
int ExamplesReadme() {
  std::string readme;
  if (!ReadFile("examples/README.md", &readme)) {
    std::printf("FAIL cannot read examples/README.md\n");
    return 1;
  }
  std::map<std::string, std::set<std::string>> said;
  std::istringstream in(readme);
  std::string line;
  const std::regex row_re(R"(^\|\s*`([A-Za-z0-9_]+\.plan)`\s*\|.*\|([^|]*)\|\s*$)");
  const std::regex code_re(R"(P\d{4})");
  while (std::getline(in, line)) {
    std::smatch m;
    if (!std::regex_match(line, m, row_re)) continue;
    std::string cell = m[2].str();
    std::set<std::string> codes;
    for (auto it = std::sregex_iterator(cell.begin(), cell.end(), code_re);
         it != std::sregex_iterator(); ++it) {
      codes.insert(it->str());
    }
    said[m[1].str()] = codes;
  }
  int failed = 0;
  std::set<std::string> seen;
  for (const std::string& f : FilesUnder("examples", {".plan"})) {
    std::string name = fs::path(f).filename().string();
    seen.insert(name);
    std::string text;
    ReadFile(f, &text);
    TestFile test = ParseTestFile(text);
    std::set<std::string> expected;
    for (const Expectation& e : test.expectations) expected.insert(e.code);
    auto it = said.find(name);
    if (it == said.end()) {
      std::printf("FAIL %s is not in the table of examples/README.md\n", name.c_str());
      ++failed;
    } else if (it->second != expected) {
      std::printf("FAIL %s: README says", name.c_str());
      for (const std::string& c : it->second) std::printf(" %s", c.c_str());
      std::printf("; the example expects");
      for (const std::string& c : expected) std::printf(" %s", c.c_str());
      std::printf("\n");
      ++failed;
    } else {
      std::printf("ok   %s\n", name.c_str());
    }
  }
  for (const auto& [name, codes] : said) {
    if (!seen.count(name)) {
      std::printf("FAIL examples/README.md lists %s, which is not in examples/\n", name.c_str());
      ++failed;
    }
  }
  return failed == 0 ? 0 : 1;
}

// The command line, then the verification or golden run. Returns the exit status.
int Run(int argc, char** argv) {
  std::string root = ".";
  std::string mode = "verify";
  bool update = false;
  std::vector<std::string> files;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--root" && i + 1 < argc) {
      root = argv[++i];
    } else if (a == "--verify" || a == "--golden" || a == "--coverage" ||
               a == "--examples-readme") {
      mode = a.substr(2);
    } else if (a == "--update") {
      update = true;
    } else if (!a.empty() && a[0] == '-') {
      std::fprintf(stderr, "paraplan_filetest: unknown option %s\n", a.c_str());
      return 2;
    } else {
      files.push_back(a);
    }
  }
  for (std::string& f : files) {
    std::error_code ec;
    fs::path abs = fs::absolute(f, ec);
    if (!ec) f = abs.string();
  }
  if (chdir(root.c_str()) != 0) {
    std::fprintf(stderr, "paraplan_filetest: cannot enter %s\n", root.c_str());
    return 2;
  }
  setenv("PARAPLAN_STDLIB", "stdlib", 1);
  for (std::string& f : files) {
    std::error_code ec;
    fs::path rel = fs::relative(f, fs::current_path(), ec);
    if (!ec && !rel.empty() && rel.string().rfind("..", 0) != 0) f = rel.string();
  }
  if (mode == "coverage") return Coverage();
  if (mode == "examples-readme") return ExamplesReadme();
  if (files.empty()) {
    std::fprintf(stderr, "paraplan_filetest: no files\n");
    return 2;
  }
  if (mode == "golden") return Golden(files, update);
  return VerifyFiles(files);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return Run(argc, argv);
  } catch (const std::exception& e) {  // an unreadable file, a bad regex in a directive, ...
    std::fprintf(stderr, "paraplan_filetest: error: %s\n", e.what());
    return 2;
  }
}
