// planc explain FILE [--plan NAME] [--set PATH=VALUE]... [--rank R] [--format=text|json]
//                    [--svg OUT.svg] [--diagnostics=text|short|json|sarif] [--dump=layout]
//
// --dump=layout prints the stable dumps of the layout (every group of every kind) and the
// pipeline partition instead of the report.
//
// Checks the plan like `planc check` (rules, then the analysis checks); on errors it renders
// them and exits 1. Otherwise it prints warnings to stderr and the report to stdout. A plan
// whose only errors are out-of-memory stages (P0701) is still explained (the report shows
// every stage's memory), and the exit status is 1.
#include <unistd.h>

#include <charconv>
#include <cstdio>
#include <fstream>
#include <optional>
#include <string>

#include "compiler/analyze/checks.h"
#include "compiler/analyze/cost_report.h"
#include "compiler/diagnostics/render.h"
#include "compiler/driver/commands.h"
#include "compiler/driver/explain.h"
#include "compiler/driver/frontend.h"
#include "compiler/driver/output_file.h"

namespace paraplan {
namespace {

constexpr const char* kExplainUsage =
    "usage: planc explain FILE [--plan NAME] [--set PATH=VALUE]... [-I DIR]\n"
    "                          [--rank R] [--format=text|json] [--svg OUT.svg]\n"
    "                          [--diagnostics=text|short|json|sarif] [--dump=layout]\n";

int Usage(const std::string& message) {
  std::fprintf(stderr, "planc explain: %s\n%s", message.c_str(), kExplainUsage);
  return kExitUsage;
}

// "--name=value" or "--name value"; advances i past a separate value.
std::optional<std::string> OptionValue(const std::vector<std::string>& rest, size_t& i,
                                       std::string_view name, bool* missing) {
  const std::string& a = rest[i];
  std::string prefix = std::string(name) + "=";
  if (a.rfind(prefix, 0) == 0) return a.substr(prefix.size());
  if (a == name) {
    if (i + 1 >= rest.size()) {
      *missing = true;
      return std::nullopt;
    }
    return rest[++i];
  }
  return std::nullopt;
}

// What the command line asks of planc explain.
struct ExplainArgs {
  FrontendOptions opts;
  bool json = false;
  std::optional<int64_t> rank;
  std::string svg_path;
  DiagFormat diag_format = DiagFormat::kText;
  bool dump_layout = false;
};

// Reads the command line into *out. Returns the exit status when the command is done already
// (help, or bad usage), nullopt to go on.
std::optional<int> ReadExplainArgs(const std::vector<std::string>& args, ExplainArgs* out) {
  for (const std::string& a : args) {
    if (a == "-h" || a == "--help") {
      std::fputs(kExplainUsage, stdout);
      return kExitOk;
    }
  }
  std::vector<std::string> rest;
  std::string error;
  if (!ParseFrontendArgs(args, &out->opts, &rest, &error)) return Usage(error);
  for (size_t i = 0; i < rest.size(); ++i) {
    bool missing = false;
    if (auto v = OptionValue(rest, i, "--format", &missing)) {
      if (*v == "json")
        out->json = true;
      else if (*v == "text")
        out->json = false;
      else
        return Usage("--format takes text or json, not '" + *v + "'");
    } else if (auto r = OptionValue(rest, i, "--rank", &missing)) {
      int64_t value = -1;
      auto [end, ec] = std::from_chars(r->data(), r->data() + r->size(), value);
      if (ec != std::errc() || end != r->data() + r->size() || value < 0) {
        return Usage("--rank takes a rank number (0, 1, ...), not '" + *r + "'");
      }
      out->rank = value;
    } else if (auto o = OptionValue(rest, i, "--svg", &missing)) {
      if (o->empty()) return Usage("--svg needs an output file");
      out->svg_path = *o;
    } else if (auto d = OptionValue(rest, i, "--diagnostics", &missing)) {
      auto f = ParseDiagFormat(*d);
      if (!f) return Usage("--diagnostics takes text, short, json or sarif, not '" + *d + "'");
      out->diag_format = *f;
    } else if (auto dump = OptionValue(rest, i, "--dump", &missing)) {
      if (*dump != "layout") return Usage("explain dumps only the layout: --dump=layout");
      out->dump_layout = true;
    } else if (missing) {
      return Usage(rest[i] + " needs a value");
    } else {
      return Usage("unknown option '" + rest[i] + "'");
    }
  }
  return std::nullopt;
}

// Renders the diagnostics to stderr. Returns the exit status when the plan cannot be explained;
// nullopt to go on. A plan whose only errors are out-of-memory stages (P0701) is well formed: it
// is explained anyway, so the per-stage memory table and chart show where the memory goes.
std::optional<int> ReportPlanDiagnostics(const std::optional<Plan>& plan, const SourceManager& sm,
                                         const DiagnosticSink& sink, DiagFormat diag_format) {
  RenderOptions render;
  render.color = diag_format == DiagFormat::kText && isatty(fileno(stderr));
  bool only_memory_errors = plan.has_value();
  for (const Diagnostic& d : sink.diagnostics())
    if (d.level == DiagLevel::kError && d.kind != DiagKind::kStageOutOfMemory)
      only_memory_errors = false;
  if (!plan || (sink.has_errors() && !only_memory_errors)) {
    std::fputs(RenderDiagnostics(sink.diagnostics(), sm, diag_format, render).c_str(), stderr);
    return kExitInputError;
  }
  if (!sink.diagnostics().empty()) {
    std::fputs(RenderDiagnostics(sink.diagnostics(), sm, diag_format, render).c_str(), stderr);
  }
  return std::nullopt;
}

// Writes the cluster picture to `svg_path` and the per-stage memory chart beside it
// (OUT.svg -> OUT.memory.svg). Returns the exit status on failure, nullopt when both are written.
std::optional<int> WritePictures(const ExplainInput& in, const MemoryEstimate& memory,
                                 const SourceManager& sm, const std::string& svg_path) {
  std::string chart_path = svg_path;
  if (chart_path.size() > 4 && chart_path.compare(chart_path.size() - 4, 4, ".svg") == 0)
    chart_path.resize(chart_path.size() - 4);
  chart_path += ".memory.svg";
  if (std::string input = SourceFileAt(sm, chart_path); !input.empty()) {
    return Usage("the memory chart '" + chart_path + "' would overwrite the source file '" + input +
                 "'");
  }
  std::string error;
  if (!WriteOutputFile(svg_path, ExplainSvg(in), &error) ||
      !WriteOutputFile(chart_path, MemoryChartSvg(memory), &error)) {
    std::fprintf(stderr, "planc explain: %s\n", error.c_str());
    return kExitInputError;
  }
  return std::nullopt;
}

// The report on stdout: the layout dumps, the JSON document, one rank, or the whole text.
void PrintReport(const ExplainInput& in, const ExplainArgs& cmd) {
  std::string report;
  if (cmd.dump_layout) {
    report = in.layout.Print() + in.partition.Print();
  } else if (cmd.json) {
    report = ExplainJson(in, cmd.rank);
  } else if (cmd.rank) {
    report = ExplainRankText(in, *cmd.rank);
  } else {
    report = ExplainText(in);
  }
  std::fwrite(report.data(), 1, report.size(), stdout);
}

}  // namespace

int RunExplain(const std::vector<std::string>& args) {
  ExplainArgs cmd;
  if (std::optional<int> status = ReadExplainArgs(args, &cmd)) return *status;
  SourceManager sm;
  DiagnosticSink sink;
  std::optional<Plan> plan = LoadPlan(cmd.opts, sm, sink);
  if (!cmd.svg_path.empty()) {
    if (std::string input = SourceFileAt(sm, cmd.svg_path); !input.empty()) {
      return Usage("--svg '" + cmd.svg_path + "' is the source file '" + input +
                   "'; writing there would destroy it");
    }
  }
  if (plan) RunAnalysisChecks(*plan, sink);
  const int status = sink.has_errors() ? kExitInputError : kExitOk;
  if (std::optional<int> refused = ReportPlanDiagnostics(plan, sm, sink, cmd.diag_format))
    return *refused;
  std::string error;
  auto layout = BuildLayout(*plan, &error);
  if (!layout) {
    std::fprintf(stderr, "planc explain: internal error: the checked plan has no layout: %s\n",
                 error.c_str());
    return kExitInternal;
  }
  auto partition = BuildPartition(*plan, nullptr);
  if (!partition) {
    std::fputs("planc explain: internal error: the checked plan has no pipeline partition\n",
               stderr);
    return kExitInternal;
  }
  if (cmd.rank && *cmd.rank >= layout->world_size()) {
    return Usage("--rank " + std::to_string(*cmd.rank) + " is outside the plan's " +
                 std::to_string(layout->world_size()) + " ranks (0-" +
                 std::to_string(layout->world_size() - 1) + ")");
  }
  Topology topology = AnalyzeTopology(*layout);
  ExplainInput in{*plan, *layout, topology, *partition};
  // The cost model's sections: memory per stage and time (compiler/analyze/cost_report.h).
  const MemoryEstimate memory = EstimateMemory(*plan);
  const TimeEstimate time = EstimateTime(*plan, {}, memory);
  in.json_sections = {{"memory", MemoryJson(memory)}, {"time", TimeJson(time)}};
  in.text_sections = CostText(memory, time);
  if (!cmd.svg_path.empty()) {
    if (std::optional<int> failed = WritePictures(in, memory, sm, cmd.svg_path)) return *failed;
  }
  PrintReport(in, cmd);
  return status;
}

}  // namespace paraplan
