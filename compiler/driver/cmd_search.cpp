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
#include <optional>
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

// What the command line asks of planc search.
struct SearchArgs {
  FrontendOptions opts;
  int64_t top = 10;
  bool json = false;
};

// --top K or --top=K.
std::optional<int> ReadTop(const std::vector<std::string>& rest, size_t& i, int64_t* top) {
  const std::string& a = rest[i];
  std::string value;
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
  *top = k;
  return std::nullopt;
}

// Reads the command line into *out. Returns the exit status when the command is done already
// (help, or bad usage), nullopt to go on.
std::optional<int> ReadSearchArgs(const std::vector<std::string>& args, SearchArgs* out) {
  for (const std::string& a : args) {
    if (a == "-h" || a == "--help") {
      std::fputs(kSearchUsage, stdout);
      return kExitOk;
    }
  }
  std::vector<std::string> rest;
  std::string error;
  if (!ParseFrontendArgs(args, &out->opts, &rest, &error)) return Usage(error);
  out->opts.allow_sweeps = true;
  for (size_t i = 0; i < rest.size(); ++i) {
    std::string a = rest[i];
    if (a == "--top" || a.rfind("--top=", 0) == 0) {
      if (std::optional<int> status = ReadTop(rest, i, &out->top)) return status;
    } else if (a == "--format=json" ||
               (a == "--format" && i + 1 < rest.size() && rest[i + 1] == "json")) {
      out->json = true;
      if (a == "--format") ++i;
    } else if (a == "--format=text" ||
               (a == "--format" && i + 1 < rest.size() && rest[i + 1] == "text")) {
      out->json = false;
      if (a == "--format") ++i;
    } else {
      return Usage("unknown option '" + a + "'");
    }
  }
  return std::nullopt;
}

// The message of the first error in `sink`, or "".
std::string FirstErrorMessage(const DiagnosticSink& sink) {
  for (const Diagnostic& d : sink.diagnostics()) {
    if (d.level == DiagLevel::kError) return d.message;
  }
  return "";
}

// Whether one candidate passes the checks of the whole plan (`require` rules and the analysis
// checks); the first refusal of all is kept in *first_refusal for the no-fit report.
bool VerifyCandidate(PlanVariants& variants, const SearchSettings& settings,
                     std::string* first_refusal) {
  std::vector<std::string> sets;
  for (const auto& [path, value] : settings) sets.push_back(path + "=" + value);
  DiagnosticSink quiet;
  auto parsed = variants.ParseSets(sets, quiet);
  if (!parsed) return false;
  std::optional<Plan> plan = variants.Check(*parsed, quiet);
  if (!plan || quiet.has_errors()) return false;
  RunAnalysisChecks(*plan, quiet);
  if (quiet.has_errors() && first_refusal->empty()) *first_refusal = FirstErrorMessage(quiet);
  return !quiet.has_errors();
}

void LabelSweeps(const Plan& base, Diag& d) {
  for (const Sweep& s : base.sweeps)
    d.Label(s.range, fmt::format("`{}` ranges over {} values", s.path, s.values.size()));
}

Diag SearchSpaceTooLarge(const Plan& base, const std::vector<SearchAxis>& axes,
                         const SearchResult& result, int64_t max_candidates) {
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
             Grouped(max_candidates)));
  d.At(base.declaration);
  LabelSweeps(base, d);
  d.Value("candidates",
          fmt::format("{} = {}", sizes,
                      result.space == INT64_MAX ? std::string("overflow") : Grouped(result.space)));
  d.Note("the search is exhaustive: every combination of the ranged fields is checked");
  d.Help("fix some fields to one value, or give shorter lists instead of `auto`");
  return d;
}

Diag NoCandidateFits(const Plan& base, const SearchResult& result,
                     const std::string& first_refusal) {
  Diag d(DiagKind::kSearchNoCandidateFits,
         fmt::format(
             "none of the {} candidates fits: {} rejected by the rules, {} by the pipeline split, "
             "{} over {} of memory{}",
             result.enumerated, result.rejected_rules, result.rejected_partition,
             result.rejected_memory, FormatGiB(base.cluster.gpu.memory),
             result.rejected_verify > 0
                 ? fmt::format(", {} by the checks of the whole plan", result.rejected_verify)
                 : std::string()));
  d.At(base.declaration);
  LabelSweeps(base, d);
  if (result.smallest_rejected_peak > 0)
    d.Note(fmt::format("the valid candidates need at least {} per GPU",
                       FormatGiB(result.smallest_rejected_peak)));
  if (!first_refusal.empty())
    d.Note(
        fmt::format("the checks of the whole plan refused the first candidate: {}", first_refusal));
  if (result.rejected_verify == 0 ||
      result.rejected_rules + result.rejected_partition + result.rejected_memory > 0)
    d.Help(
        "widen the search: let `parallel.pp`, `recompute` or `optimizer.zero` range too, or add "
        "nodes");
  return d;
}

}  // namespace

int RunSearch(const std::vector<std::string>& args) {
  const auto start = std::chrono::steady_clock::now();
  SearchArgs cmd;
  if (std::optional<int> status = ReadSearchArgs(args, &cmd)) return *status;
  SourceManager sm;
  DiagnosticSink sink;
  RenderOptions render;
  auto finish = [&](int status) {
    std::string out = RenderDiagnostics(sink.diagnostics(), sm, DiagFormat::kText, render);
    std::fwrite(out.data(), 1, out.size(), stderr);
    return status;
  };
  std::unique_ptr<PlanVariants> variants = PlanVariants::Load(cmd.opts, sm, sink);
  if (!variants || sink.has_errors()) return finish(kExitInputError);
  std::optional<Plan> base = variants->Check({}, sink, /*run_rules=*/false);
  if (!base || sink.has_errors()) return finish(kExitInputError);
  const std::vector<SearchAxis> axes = AxesFromSweeps(*base);

  SearchOptions options;
  options.top = cmd.top;
  std::string first_refusal;  // the first error of the whole-plan checks, for the no-fit report
  options.verify = [&](const SearchSettings& settings) {
    return VerifyCandidate(*variants, settings, &first_refusal);
  };
  const SearchResult result = RunSearch(*base, axes, options);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (result.too_large) {
    sink.Report(SearchSpaceTooLarge(*base, axes, result, options.max_candidates));
    return finish(kExitInputError);
  }
  if (result.best.empty()) {
    sink.Report(NoCandidateFits(*base, result, first_refusal));
    if (!cmd.json) return finish(kExitInputError);
  }
  const std::string out = cmd.json ? PrintSearchJson(*base, axes, result, seconds)
                                   : PrintSearchText(*base, axes, result);
  std::fwrite(out.data(), 1, out.size(), stdout);
  std::fflush(stdout);
  return finish(result.best.empty() ? kExitInputError : kExitOk);
}

}  // namespace paraplan
