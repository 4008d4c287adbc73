// planc import --from=megatron|torchtitan|deepspeed|nemo FILE [--nodes N] [--gpus-per-node G]
//              [--gpu NAME] [--plan NAME] [-o OUT.plan] [--diagnostics=...]
//
// Reads a framework's configuration and writes it as a plan (stdout, or OUT.plan). Diagnostics
// (settings not imported, values that do not convert) point into FILE and go to stderr. Exit
// status: 0 written (notes allowed), 1 the file has errors, 2 bad usage.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include "compiler/diagnostics/render.h"
#include "compiler/driver/commands.h"
#include "compiler/driver/frontend.h"
#include "compiler/driver/import_args.h"
#include "compiler/driver/output_file.h"

namespace paraplan {
namespace {

constexpr const char* kImportUsage =
    "usage: planc import --from=megatron|torchtitan|deepspeed|nemo FILE [--nodes N]\n"
    "                    [--gpus-per-node G] [--gpu NAME] [--plan NAME] [-o OUT.plan]\n"
    "                    [--diagnostics=text|short|json|sarif]\n";

int Usage(const std::string& error) {
  std::fprintf(stderr, "planc import: %s\n%s", error.c_str(), kImportUsage);
  return kExitUsage;
}

}  // namespace

int RunImport(const std::vector<std::string>& args) {
  std::string file, out_path, error;
  ImportArgs import;
  DiagFormat format = DiagFormat::kText;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "-h" || a == "--help") {
      std::fputs(kImportUsage, stdout);
      return kExitOk;
    }
    int taken = TakeImportArg(args, i, &import, &error);
    if (taken < 0) return Usage(error);
    if (taken > 0) continue;
    if (a == "-o") {
      if (i + 1 >= args.size()) return Usage("-o needs a file");
      out_path = args[++i];
      if (out_path == "-") out_path.clear();  // `-o -`: standard output, as without -o
    } else if (a.rfind("--plan=", 0) == 0) {
      import.options.plan_name = a.substr(7);
    } else if (a == "--plan") {
      if (i + 1 >= args.size()) return Usage("--plan needs a name");
      import.options.plan_name = args[++i];
    } else if (a.rfind("--diagnostics=", 0) == 0) {
      auto f = ParseDiagFormat(a.substr(14));
      if (!f) return Usage("--diagnostics takes text, short, json or sarif");
      format = *f;
    } else if (a.empty() && file.empty()) {
      return Usage("the configuration file path is empty");
    } else if (!a.empty() && a[0] != '-' && file.empty()) {
      file = a;
    } else {
      return Usage("unknown option '" + a + "'");
    }
  }
  if (!import.kind) return Usage("--from=megatron|torchtitan|deepspeed|nemo is required");
  if (file.empty()) return Usage("no configuration file given");
  import.options.stdlib_dir = StdlibDir();

  SourceManager sm;
  DiagnosticSink sink;
  auto imported = ImportConfig(*import.kind, file, import.options, sm, sink);
  RenderOptions render;
  const char* no_color = std::getenv("NO_COLOR");
  render.color = format == DiagFormat::kText && isatty(STDERR_FILENO) && !(no_color && *no_color);
  std::string rendered = RenderDiagnostics(sink.diagnostics(), sm, format, render);
  std::fwrite(rendered.data(), 1, rendered.size(), stderr);
  if (!imported) return kExitInputError;
  if (out_path.empty()) {
    std::fwrite(imported->text.data(), 1, imported->text.size(), stdout);
    return kExitOk;
  }
  if (SameFile(out_path, file))
    return Usage("-o " + out_path + " would overwrite the file it imports");
  if (!WriteOutputFile(out_path, imported->text, &error)) {
    std::fprintf(stderr, "planc import: %s\n", error.c_str());
    return kExitInputError;
  }
  return kExitOk;
}

}  // namespace paraplan
