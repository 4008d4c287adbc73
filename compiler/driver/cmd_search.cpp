// planc search FILE [--plan NAME] [--set PATH=VALUE]... [-I DIR] [--top K] [--format=text|json]
//
// Fields written as lists or `auto` (tp, pp, vpp, cp, ep, micro batch, zero, recompute, sp, ...)
// are enumerated exhaustively (compiler/search); candidates are pruned by the checks of
// `planc check` and by the memory model, and ranked by predicted step time. The reported ones
// are re-checked through the full front end (`require` rules included). The table or JSON goes
// to stdout, diagnostics to stderr. Exit status: 0 at least one candidate fits, 1 none does (or
// the input has errors), 2 bad usage.
#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "compiler/analyze/checks.h"
#include "compiler/analyze/memory.h"
#include "compiler/diagnostics/render.h"
#include "compiler/driver/commands.h"
#include "compiler/driver/frontend.h"
#include "compiler/search/search.h"

namespace paraplan {
namespace {

constexpr const char* kSearchUsage =
    "usage: planc search FILE [--plan NAME] [--set PATH=VALUE]... [-I DIR] [--top K] "
    "[--format=text|json]\n";

// 7392000 -> "7,392,000"
std::string Grouped(int64_t n) {
  std::string digits = std::to_string(n), out;
  const size_t lead = digits.size() % 3 == 0 ? 3 : digits.size() % 3;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i >= lead && (i - lead) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

int Usage(const std::string& error) {
  std::fprintf(stderr, "planc search: %s\n%s", error.c_str(), kSearchUsage);
  return kExitUsage;
}

}  // namespace

int RunSearch(const std::vector<std::string>& args) {
  const auto start = std::chrono::steady_clock::now();
  for (const std::string& a : args) {
    if (a == "-h" || a == "--help") {
      std::fputs(kSearchUsage, stdout);
      return kExitOk;
    }
  }
  FrontendOptions opts;
  std::vector<std::string> rest;
  std::string error;
  if (!ParseFrontendArgs(args, &opts, &rest, &error)) return Usage(error);
  opts.allow_sweeps = true;
  int64_t top = 10;
  bool json = false;
  for (size_t i = 0; i < rest.size(); ++i) {
    std::string a = rest[i];
    std::string value;
    if (a == "--top" || a.rfind("--top=", 0) == 0) {
      if (a == "--top") {
        if (i + 1 >= rest.size()) return Usage("--top needs a number");
        value = rest[++i];
      } else {
        value = a.substr(6);
      }
      char* end = nullptr;
      const long long k = std::strtoll(value.c_str(), &end, 10);
      if (value.empty() || *end != '\0' || k < 1 || k > 100000)
        return Usage("--top takes a number from 1 to 100000, got '" + value + "'");
      top = k;
    } else if (a == "--format=json" ||
               (a == "--format" && i + 1 < rest.size() && rest[i + 1] == "json")) {
      json = true;
      if (a == "--format") ++i;
    } else if (a == "--format=text" ||
               (a == "--format" && i + 1 < rest.size() && rest[i + 1] == "text")) {
      json = false;
      if (a == "--format") ++i;
    } else {
      return Usage("unknown option '" + a + "'");
    }
  }
  SourceManager sm;
  DiagnosticSink sink;
  RenderOptions render;
  auto finish = [&](int status) {
    std::string out = RenderDiagnostics(sink.diagnostics(), sm, DiagFormat::kText, render);
    std::fwrite(out.data(), 1, out.size(), stderr);
    return status;
  };
  std::unique_ptr<PlanVariants> variants = PlanVariants::Load(opts, sm, sink);
  if (!variants || sink.has_errors()) return finish(kExitInputError);
  std::optional<Plan> base = variants->Check({}, sink, /*run_rules=*/false);
  if (!base || sink.has_errors()) return finish(kExitInputError);
  const std::vector<SearchAxis> axes = AxesFromSweeps(*base);

  SearchOptions options;
  options.top = top;
  std::string first_refusal;  // the first error of the whole-plan checks, for the no-fit report
  options.verify = [&](const SearchSettings& settings) {
    std::vector<std::string> sets;
    for (const auto& [path, value] : settings) sets.push_back(path + "=" + value);
    DiagnosticSink quiet;
    auto parsed = variants->ParseSets(sets, quiet);
    if (!parsed) return false;
    std::optional<Plan> plan = variants->Check(*parsed, quiet);
    if (!plan || quiet.has_errors()) return false;
    RunAnalysisChecks(*plan, quiet);
    if (quiet.has_errors() && first_refusal.empty()) {
      for (const Diagnostic& d : quiet.diagnostics()) {
        if (d.level == DiagLevel::kError) {
          first_refusal = d.message;
          break;
        }
      }
    }
    return !quiet.has_errors();
  };
  const SearchResult result = RunSearch(*base, axes, options);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (result.too_large) {
    std::string sizes;
    for (const SearchAxis& a : axes) {
      const size_t dot = a.path.rfind('.');
      sizes +=
          fmt::format("{}{} {}", sizes.empty() ? "" : " · ",
                      dot == std::string::npos ? a.path : a.path.substr(dot + 1), a.values.size());
    }
    Diag d(DiagKind::kSearchSpaceTooLarge,
           fmt::format(
               "the search space has {} candidates, more than the {} that planc search enumerates",
               result.space == INT64_MAX ? std::string("more than 9,223,372,036,854,775,807")
                                         : Grouped(result.space),
               Grouped(options.max_candidates)));
    d.At(base->declaration);
    for (const Sweep& s : base->sweeps)
      d.Label(s.range, fmt::format("`{}` ranges over {} values", s.path, s.values.size()));
    d.Value("candidates", fmt::format("{} = {}", sizes,
                                      result.space == INT64_MAX ? std::string("overflow")
                                                                : Grouped(result.space)));
    d.Note("the search is exhaustive: every combination of the ranged fields is checked");
    d.Help("fix some fields to one value, or give shorter lists instead of `auto`");
    sink.Report(std::move(d));
    return finish(kExitInputError);
  }
  if (result.best.empty()) {
    Diag d(
        DiagKind::kSearchNoCandidateFits,
        fmt::format(
            "none of the {} candidates fits: {} rejected by the rules, {} by the pipeline split, "
            "{} over {} of memory{}",
            result.enumerated, result.rejected_rules, result.rejected_partition,
            result.rejected_memory, FormatGiB(base->cluster.gpu.memory),
            result.rejected_verify > 0
                ? fmt::format(", {} by the checks of the whole plan", result.rejected_verify)
                : std::string()));
    d.At(base->declaration);
    for (const Sweep& s : base->sweeps)
      d.Label(s.range, fmt::format("`{}` ranges over {} values", s.path, s.values.size()));
    if (result.smallest_rejected_peak > 0)
      d.Note(fmt::format("the valid candidates need at least {} per GPU",
                         FormatGiB(result.smallest_rejected_peak)));
    if (!first_refusal.empty())
      d.Note(fmt::format("the checks of the whole plan refused the first candidate: {}",
                         first_refusal));
    if (result.rejected_verify == 0 ||
        result.rejected_rules + result.rejected_partition + result.rejected_memory > 0)
      d.Help(
          "widen the search: let `parallel.pp`, `recompute` or `optimizer.zero` range too, or add "
          "nodes");
    sink.Report(std::move(d));
    if (!json) return finish(kExitInputError);
  }
  const std::string out =
      json ? PrintSearchJson(*base, axes, result, seconds) : PrintSearchText(*base, axes, result);
  std::fwrite(out.data(), 1, out.size(), stdout);
  std::fflush(stdout);
  return finish(result.best.empty() ? kExitInputError : kExitOk);
}

}  // namespace paraplan
