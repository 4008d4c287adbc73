#include "tests/filetest/filetest.h"

#include <cctype>
#include <cstdlib>
#include <optional>

#include "compiler/driver/check_file.h"
#include "compiler/driver/frontend.h"

namespace paraplan::filetest {
namespace {

std::string_view Trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

// The text of the comment on a line, if the line has one ("#" or "//" outside a string).
std::optional<std::string_view> CommentOf(std::string_view line) {
  bool in_string = false;
  for (size_t i = 0; i < line.size(); ++i) {
    char c = line[i];
    if (in_string) {
      if (c == '\\')
        ++i;
      else if (c == '"')
        in_string = false;
      continue;
    }
    if (c == '"')
      in_string = true;
    else if (c == '#')
      return line.substr(i + 1);
    else if (c == '/' && i + 1 < line.size() && line[i + 1] == '/')
      return line.substr(i + 2);
  }
  return std::nullopt;
}

// Splits `--set a=1 --plan "x y"` on spaces, with double quotes grouping.
std::vector<std::string> SplitArgs(std::string_view s) {
  std::vector<std::string> out;
  std::string cur;
  bool quoted = false, have = false;
  for (char c : s) {
    if (c == '\'') {
      quoted = !quoted;
      have = true;
      continue;
    }
    if (!quoted && std::isspace(static_cast<unsigned char>(c))) {
      if (have) out.push_back(cur);
      cur.clear();
      have = false;
      continue;
    }
    cur += c;
    have = true;
  }
  if (have) out.push_back(cur);
  return out;
}

}  // namespace

TestFile ParseTestFile(std::string_view text) {
  TestFile t;
  uint32_t line_no = 0;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t nl = text.find('\n', pos);
    std::string_view line =
        text.substr(pos, nl == std::string_view::npos ? std::string_view::npos : nl - pos);
    ++line_no;
    if (auto comment = CommentOf(line)) {
      std::string_view c = Trim(*comment);
      if (c.rfind("args:", 0) == 0) {
        for (std::string& a : SplitArgs(c.substr(5))) t.args.push_back(std::move(a));
      } else if (c.rfind("ignore:", 0) == 0) {
        for (std::string& a : SplitArgs(c.substr(7))) t.ignore_prefixes.push_back(std::move(a));
      } else if (c.rfind("expect-", 0) == 0) {
        Expectation e;
        e.written_at = line_no;
        std::string_view rest = c.substr(7);
        if (rest.rfind("error", 0) == 0) {
          e.level = DiagLevel::kError;
          rest.remove_prefix(5);
        } else if (rest.rfind("warning", 0) == 0) {
          e.level = DiagLevel::kWarning;
          rest.remove_prefix(7);
        } else if (rest.rfind("note", 0) == 0) {
          e.level = DiagLevel::kNote;
          rest.remove_prefix(4);
        } else {
          t.problems.push_back("line " + std::to_string(line_no) +
                               ": expect-error, expect-warning or expect-note");
          goto next;
        }
        e.line = line_no;
        if (!rest.empty() && rest.front() == '@') {
          size_t colon = rest.find(':');
          std::string_view where =
              rest.substr(1, colon == std::string_view::npos ? std::string_view::npos : colon - 1);
          if (where == "*") {
            e.any_location = true;
            e.line = 0;
          } else if (where.size() >= 2 && (where[0] == '+' || where[0] == '-')) {
            int64_t delta = std::strtoll(std::string(where.substr(1)).c_str(), nullptr, 10);
            int64_t target =
                where[0] == '+' ? line_no + delta : static_cast<int64_t>(line_no) - delta;
            if (target < 1) {
              t.problems.push_back("line " + std::to_string(line_no) + ": @" + std::string(where) +
                                   " points before the file");
              goto next;
            }
            e.line = static_cast<uint32_t>(target);
          } else {
            t.problems.push_back("line " + std::to_string(line_no) +
                                 ": location must be @+N, @-N or @*");
            goto next;
          }
          rest = colon == std::string_view::npos ? std::string_view() : rest.substr(colon);
        }
        if (rest.empty() || rest.front() != ':') {
          t.problems.push_back("line " + std::to_string(line_no) +
                               ": expected ':' and a code after expect-...");
          goto next;
        }
        rest = Trim(rest.substr(1));
        {
          size_t end = 0;
          while (end < rest.size() && !std::isspace(static_cast<unsigned char>(rest[end]))) ++end;
          e.code = std::string(rest.substr(0, end));
          e.text = std::string(Trim(rest.substr(end)));
        }
        if (e.code.size() != 5 || e.code[0] != 'P' || !FindDiagKind(e.code)) {
          t.problems.push_back("line " + std::to_string(line_no) + ": `" + e.code +
                               "` is not a registered diagnostic code");
          goto next;
        }
        t.expectations.push_back(std::move(e));
      }
    }
  next:
    if (nl == std::string_view::npos) break;
    pos = nl + 1;
  }
  return t;
}

void RunCheck(const std::string& file, const std::vector<std::string>& args, CheckRun& run) {
  FrontendOptions opts;
  std::vector<std::string> all = args;
  all.push_back(file);
  std::vector<std::string> rest;
  std::string error;
  if (!ParseFrontendArgs(all, &opts, &rest, &error)) {
    run.usage_error = error;
    return;
  }
  CheckDump dump = CheckDump::kNone;
  for (const std::string& a : rest) {
    std::optional<CheckDump> d;
    if (a.rfind("--dump=", 0) == 0) d = ParseCheckDump(a.substr(7));
    if (!d) {
      run.usage_error = "unknown argument '" + a + "'";
      return;
    }
    dump = *d;
  }
  DiagnosticSink sink;
  CheckResult result = CheckFile(opts, dump, run.sources, sink);
  run.diagnostics = sink.diagnostics();
  run.dump = std::move(result.dump);
  for (const std::string& p : result.internal_errors) run.dump += "verifier: " + p + "\n";
}

std::vector<std::string> Verify(const std::string& file, const TestFile& test,
                                const CheckRun& run) {
  std::vector<std::string> out = test.problems;
  if (!run.usage_error.empty()) {
    out.push_back("the arguments were refused: " + run.usage_error);
    return out;
  }
  std::vector<bool> used(test.expectations.size(), false);
  for (const Diagnostic& d : run.diagnostics) {
    const DiagKindInfo& info = GetDiagKindInfo(d.kind);
    bool ignored = false;
    for (const std::string& prefix : test.ignore_prefixes) {
      if (info.code.substr(0, prefix.size()) == prefix) ignored = true;
    }
    if (ignored) continue;
    uint32_t line = 0;
    bool in_file = d.primary.IsValid() && run.sources.Name(d.primary.buffer) == file;
    if (in_file) line = run.sources.Position(d.primary.buffer, d.primary.begin).line;
    bool matched = false;
    for (size_t i = 0; i < test.expectations.size() && !matched; ++i) {
      const Expectation& e = test.expectations[i];
      if (used[i] || e.level != d.level || e.code != info.code) continue;
      if (!e.any_location && (!in_file || e.line != line)) continue;
      if (!e.text.empty() && d.message.find(e.text) == std::string::npos) continue;
      used[i] = true;
      matched = true;
    }
    if (!matched) {
      std::string where = in_file               ? "line " + std::to_string(line)
                          : d.primary.IsValid() ? std::string(run.sources.Name(d.primary.buffer))
                                                : std::string("no location");
      out.push_back("unexpected " + std::string(LevelName(d.level)) + "[" + std::string(info.code) +
                    "] at " + where + ": " + d.message);
    }
  }
  for (size_t i = 0; i < test.expectations.size(); ++i) {
    if (used[i]) continue;
    const Expectation& e = test.expectations[i];
    out.push_back(
        "missing " + std::string(LevelName(e.level)) + "[" + e.code + "]" +
        (e.any_location ? std::string(" anywhere") : " at line " + std::to_string(e.line)) +
        (e.text.empty() ? std::string() : " containing \"" + e.text + "\"") +
        " (expected on line " + std::to_string(e.written_at) + ")");
  }
  return out;
}

}  // namespace paraplan::filetest
