// planc check FILE [--plan NAME] [--set PATH=VALUE]... [-I DIR]
//                  [--diagnostics=text|short|json|sarif] [--color=auto|always|never] [--ascii]
//                  [--dump=ast|plan]
//
// Loads the plan (parse, evaluate, plan rules), runs the analysis checks when the plan has no
// errors, and renders every diagnostic. Text and short forms go to stderr; json and sarif go
// to stdout and nothing else is written there. --dump writes a stable text dump to stdout:
// `ast` the main file's syntax tree (also when evaluation then finds errors), `plan` the
// checked plan (only when there are no errors); see check_file.h. Exit status: 0 no errors
// (warnings and notes allowed), 1 errors, 2 bad usage, 70 internal error.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "compiler/diagnostics/render.h"
#include "compiler/driver/check_file.h"
#include "compiler/driver/commands.h"

#ifndef PARAPLAN_VERSION
#define PARAPLAN_VERSION "0.1.0"
#endif

namespace paraplan {
namespace {

constexpr const char* kCheckUsage =
    "usage: planc check FILE [--plan NAME] [--set PATH=VALUE]... [-I DIR]\n"
    "                   [--diagnostics=text|short|json|sarif] [--color=auto|always|never] "
    "[--ascii]\n"
    "                   [--dump=ast|plan]\n";

int Usage(const std::string& error) {
  std::fprintf(stderr, "planc check: %s\n%s", error.c_str(), kCheckUsage);
  return kExitUsage;
}

// Takes "--name=value" or "--name value"; false when `arg` is not this option.
bool OptionValue(const std::vector<std::string>& args, size_t& i, std::string_view name,
                 std::string* value, bool* missing) {
  const std::string& a = args[i];
  if (a.compare(0, name.size(), name) != 0) return false;
  if (a.size() == name.size()) {
    if (i + 1 >= args.size()) {
      *missing = true;
      return true;
    }
    *value = args[++i];
    return true;
  }
  if (a[name.size()] != '=') return false;
  *value = a.substr(name.size() + 1);
  return true;
}

}  // namespace

int RunCheck(const std::vector<std::string>& args) {
  for (const std::string& a : args) {
    if (a == "-h" || a == "--help") {
      std::fputs(kCheckUsage, stdout);
      return kExitOk;
    }
  }
  FrontendOptions opts;
  std::vector<std::string> rest;
  std::string error;
  if (!ParseFrontendArgs(args, &opts, &rest, &error)) return Usage(error);

  DiagFormat format = DiagFormat::kText;
  std::string color = "auto";
  CheckDump dump = CheckDump::kNone;
  RenderOptions render;
  render.tool_version = PARAPLAN_VERSION;
  for (size_t i = 0; i < rest.size(); ++i) {
    std::string value;
    bool missing = false;
    if (OptionValue(rest, i, "--diagnostics", &value, &missing)) {
      if (missing) return Usage("--diagnostics needs a value: text, short, json or sarif");
      auto f = ParseDiagFormat(value);
      if (!f) return Usage("--diagnostics takes text, short, json or sarif, got '" + value + "'");
      format = *f;
    } else if (OptionValue(rest, i, "--color", &value, &missing)) {
      if (missing || (value != "auto" && value != "always" && value != "never")) {
        return Usage("--color takes auto, always or never");
      }
      color = value;
    } else if (OptionValue(rest, i, "--dump", &value, &missing)) {
      auto d = ParseCheckDump(value);
      if (missing || !d) return Usage("--dump takes ast or plan");
      dump = *d;
    } else if (rest[i] == "--ascii") {
      render.ascii = true;
    } else {
      return Usage("unknown option '" + rest[i] + "'");
    }
  }
  const bool machine = format == DiagFormat::kJson || format == DiagFormat::kSarif;
  if (machine && dump != CheckDump::kNone) {
    return Usage("--dump writes to stdout, where --diagnostics=" +
                 std::string(format == DiagFormat::kJson ? "json" : "sarif") + " goes; use one");
  }
  const char* no_color = std::getenv("NO_COLOR");
  render.color = color == "always" ||
                 (color == "auto" && !machine && isatty(STDERR_FILENO) && !(no_color && *no_color));

  SourceManager sm;
  DiagnosticSink sink;
  CheckResult result = CheckFile(opts, dump, sm, sink);
  if (!result.internal_errors.empty()) {
    std::fprintf(stderr, "planc check: internal error: the %s of '%s' fails its verifier:\n",
                 dump == CheckDump::kAst ? "syntax tree" : "plan", opts.file.c_str());
    for (const std::string& p : result.internal_errors) std::fprintf(stderr, "  %s\n", p.c_str());
    return kExitInternal;
  }
  if (!result.plan && !sink.has_errors()) {
    std::fprintf(
        stderr,
        "planc check: internal error: '%s' could not be loaded and no diagnostic says why\n",
        opts.file.c_str());
    return kExitInternal;
  }
  std::fwrite(result.dump.data(), 1, result.dump.size(), stdout);
  std::fflush(stdout);  // the dump comes before the diagnostics on a terminal
  std::string out = RenderDiagnostics(sink.diagnostics(), sm, format, render);
  std::fwrite(out.data(), 1, out.size(), machine ? stdout : stderr);
  std::fflush(stdout);
  return sink.has_errors() ? kExitInputError : kExitOk;
}

}  // namespace paraplan
