// planc export FILE [--plan NAME] [--set PATH=VALUE]... [-I DIR] [--from=KIND ...]
//              --to=megatron|torchtitan|deepspeed|nemo [-o OUT] [--diagnostics=...]
//
// Checks the plan as `planc check` does and writes what runs it on the target framework: a
// pretrain_gpt.py launch script, a torchtitan job TOML, a Megatron-DeepSpeed launch script with
// its ds_config.json (written beside OUT, so -o is needed), or a NeMo YAML. A plan with errors,
// or with a setting the target cannot express (P0905), writes nothing. With --from, FILE is
// itself a framework's configuration: export converts it. Exit status: 0 written, 1 errors,
// 2 bad usage.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "compiler/diagnostics/render.h"
#include "compiler/driver/check_file.h"
#include "compiler/driver/commands.h"
#include "compiler/driver/output_file.h"
#include "compiler/interop/interop.h"

namespace paraplan {
namespace {

constexpr const char* kExportUsage =
    "usage: planc export FILE [--plan NAME] [--set PATH=VALUE]... [-I DIR]\n"
    "                    --to=megatron|torchtitan|deepspeed|nemo [-o OUT]\n"
    "                    [--diagnostics=text|short|json|sarif]\n";

int Usage(const std::string& error) {
  std::fprintf(stderr, "planc export: %s\n%s", error.c_str(), kExportUsage);
  return kExitUsage;
}

}  // namespace

int RunExport(const std::vector<std::string>& args) {
  for (const std::string& a : args) {
    if (a == "-h" || a == "--help") {
      std::fputs(kExportUsage, stdout);
      return kExitOk;
    }
  }
  FrontendOptions opts;
  std::vector<std::string> rest;
  std::string error;
  if (!ParseFrontendArgs(args, &opts, &rest, &error)) return Usage(error);
  std::optional<ConfigKind> to;
  std::string out_path;
  DiagFormat format = DiagFormat::kText;
  for (size_t i = 0; i < rest.size(); ++i) {
    const std::string& a = rest[i];
    if (a == "--to" || a.rfind("--to=", 0) == 0) {
      std::string v;
      if (a == "--to") {
        if (i + 1 >= rest.size()) return Usage("--to needs a framework");
        v = rest[++i];
      } else {
        v = a.substr(5);
      }
      to = ParseConfigKind(v);
      if (!to) return Usage("--to takes megatron, torchtitan, deepspeed or nemo, got '" + v + "'");
    } else if (a == "-o") {
      if (i + 1 >= rest.size()) return Usage("-o needs a file");
      out_path = rest[++i];
      if (out_path == "-") out_path.clear();  // `-o -`: standard output, as without -o
    } else if (a.rfind("--diagnostics=", 0) == 0) {
      auto f = ParseDiagFormat(a.substr(14));
      if (!f) return Usage("--diagnostics takes text, short, json or sarif");
      format = *f;
    } else {
      return Usage("unknown option '" + a + "'");
    }
  }
  if (!to) return Usage("--to=megatron|torchtitan|deepspeed|nemo is required");
  if (*to == ConfigKind::kDeepSpeed && out_path.empty()) {
    return Usage("--to=deepspeed writes a launch script and its ds_config.json: give -o OUT.sh");
  }

  SourceManager sm;
  DiagnosticSink sink;
  CheckResult checked = CheckFile(opts, CheckDump::kNone, sm, sink);
  ExportResult result;
  if (checked.plan && !sink.has_errors()) result = ExportPlan(*to, *checked.plan, sink);
  RenderOptions render;
  const char* no_color = std::getenv("NO_COLOR");
  render.color = format == DiagFormat::kText && isatty(STDERR_FILENO) && !(no_color && *no_color);
  std::string rendered = RenderDiagnostics(sink.diagnostics(), sm, format, render);
  std::fwrite(rendered.data(), 1, rendered.size(), stderr);
  if (sink.has_errors() || result.text.empty()) {
    if (!sink.has_errors()) {
      std::fprintf(stderr,
                   "planc export: internal error: nothing written and no diagnostic says why\n");
      return kExitInternal;
    }
    return kExitInputError;
  }
  if (out_path.empty()) {
    std::fwrite(result.text.data(), 1, result.text.size(), stdout);
    return kExitOk;
  }
  std::string companion;
  if (!result.companion_name.empty()) {
    companion = (std::filesystem::path(out_path).parent_path() / result.companion_name).string();
  }
  for (const std::string& path : {out_path, companion}) {
    if (path.empty()) continue;
    if (std::string source = SourceFileAt(sm, path); !source.empty()) {
      return Usage("writing '" + path + "' would overwrite '" + source + "', which it reads");
    }
  }
  if (!WriteOutputFile(out_path, result.text, &error) ||
      (!companion.empty() && !WriteOutputFile(companion, result.companion_text, &error))) {
    std::fprintf(stderr, "planc export: %s\n", error.c_str());
    return kExitInputError;
  }
  return kExitOk;
}

}  // namespace paraplan
