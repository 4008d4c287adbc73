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

}  // namespace

int RunExplain(const std::vector<std::string>& args) {
  for (const std::string& a : args) {
    if (a == "-h" || a == "--help") {
      std::fputs(kExplainUsage, stdout);
      return kExitOk;
    }
  }
  FrontendOptions opts;
  std::vector<std::string> rest;
  std::string error;
  if (!ParseFrontendArgs(args, &opts, &rest, &error)) return Usage(error);
  bool json = false;
  std::optional<int64_t> rank;
  std::string svg_path;
  DiagFormat diag_format = DiagFormat::kText;
  bool dump_layout = false;
  for (size_t i = 0; i < rest.size(); ++i) {
    bool missing = false;
    if (auto v = OptionValue(rest, i, "--format", &missing)) {
      if (*v == "json")
        json = true;
      else if (*v == "text")
        json = false;
      else
        return Usage("--format takes text or json, not '" + *v + "'");
    } else if (auto r = OptionValue(rest, i, "--rank", &missing)) {
      int64_t value = -1;
      auto [end, ec] = std::from_chars(r->data(), r->data() + r->size(), value);
      if (ec != std::errc() || end != r->data() + r->size() || value < 0) {
        return Usage("--rank takes a rank number (0, 1, ...), not '" + *r + "'");
      }
      rank = value;
    } else if (auto o = OptionValue(rest, i, "--svg", &missing)) {
      if (o->empty()) return Usage("--svg needs an output file");
      svg_path = *o;
    } else if (auto d = OptionValue(rest, i, "--diagnostics", &missing)) {
      auto f = ParseDiagFormat(*d);
      if (!f) return Usage("--diagnostics takes text, short, json or sarif, not '" + *d + "'");
      diag_format = *f;
    } else if (auto dump = OptionValue(rest, i, "--dump", &missing)) {
      if (*dump != "layout") return Usage("explain dumps only the layout: --dump=layout");
      dump_layout = true;
    } else if (missing) {
      return Usage(rest[i] + " needs a value");
    } else {
      return Usage("unknown option '" + rest[i] + "'");
    }
  }

  SourceManager sm;
  DiagnosticSink sink;
  std::optional<Plan> plan = LoadPlan(opts, sm, sink);
  if (!svg_path.empty()) {
    if (std::string input = SourceFileAt(sm, svg_path); !input.empty()) {
      return Usage("--svg '" + svg_path + "' is the source file '" + input +
                   "'; writing there would destroy it");
    }
  }
  if (plan) RunAnalysisChecks(*plan, sink);
  RenderOptions render;
  render.color = diag_format == DiagFormat::kText && isatty(fileno(stderr));
  // A plan whose only errors are out-of-memory stages (P0701) is well formed: explain it anyway,
  // so the per-stage memory table and chart show where the memory goes, and exit 1.
  bool only_memory_errors = plan.has_value();
  for (const Diagnostic& d : sink.diagnostics())
    if (d.level == DiagLevel::kError && d.kind != DiagKind::kStageOutOfMemory)
      only_memory_errors = false;
  const int status = sink.has_errors() ? kExitInputError : kExitOk;
  if (!plan || (sink.has_errors() && !only_memory_errors)) {
    std::fputs(RenderDiagnostics(sink.diagnostics(), sm, diag_format, render).c_str(), stderr);
    return kExitInputError;
  }
  if (!sink.diagnostics().empty()) {
    std::fputs(RenderDiagnostics(sink.diagnostics(), sm, diag_format, render).c_str(), stderr);
  }
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
  if (rank && *rank >= layout->world_size()) {
    return Usage("--rank " + std::to_string(*rank) + " is outside the plan's " +
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
  if (!svg_path.empty()) {
    // The per-stage memory chart beside it: OUT.svg -> OUT.memory.svg.
    std::string chart_path = svg_path;
    if (chart_path.size() > 4 && chart_path.compare(chart_path.size() - 4, 4, ".svg") == 0)
      chart_path.resize(chart_path.size() - 4);
    chart_path += ".memory.svg";
    if (std::string input = SourceFileAt(sm, chart_path); !input.empty()) {
      return Usage("the memory chart '" + chart_path + "' would overwrite the source file '" +
                   input + "'");
    }
    if (!WriteOutputFile(svg_path, ExplainSvg(in), &error) ||
        !WriteOutputFile(chart_path, MemoryChartSvg(memory), &error)) {
      std::fprintf(stderr, "planc explain: %s\n", error.c_str());
      return kExitInputError;
    }
  }
  std::string report;
  if (dump_layout) {
    report = layout->Print() + partition->Print();
  } else if (json) {
    report = ExplainJson(in, rank);
  } else if (rank) {
    report = ExplainRankText(in, *rank);
  } else {
    report = ExplainText(in);
  }
  std::fwrite(report.data(), 1, report.size(), stdout);
  return status;
}

}  // namespace paraplan
