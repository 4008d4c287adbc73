#include "compiler/search/search.h"

#include <doctest/doctest.h>

#include "compiler/analyze/cost_test_plans.h"
#include "compiler/analyze/memory.h"
#include "compiler/check/rules.h"

namespace paraplan {
namespace {

Plan Llama64() {
  Plan plan = testing::MakePlan(testing::Llama3Of70B(), testing::DgxH100(8), 8, 1, 512, 1);
  plan.name = "llama3_70b";
  plan.optimizer.zero = 1;
  plan.recompute = Recompute::kSelective;
  plan.parallel.sp = true;
  return plan;
}

std::vector<SearchAxis> Axes() {
  return {{"parallel.tp", {"1", "2", "4", "8"}}, {"parallel.pp", {"1", "2", "4", "8"}},
          {"parallel.vpp", {"1", "2"}},          {"batch.micro", {"1", "2"}},
          {"optimizer.zero", {"0", "1"}},        {"recompute", {"selective", "full"}},
          {"parallel.sp", {"false", "true"}}};
}

TEST_CASE("search enumerates every candidate, prunes by the rules and memory, ranks by step time") {
  const Plan base = Llama64();
  DiagnosticSink base_sink;
  CheckPlanRules(base, base_sink);
  REQUIRE_FALSE(base_sink.has_errors());
  SearchOptions options;
  options.top = 5;
  const SearchResult r = RunSearch(base, Axes(), options);
  CHECK(r.space == 4 * 4 * 2 * 2 * 2 * 2 * 2);
  CHECK(r.enumerated == r.space);
  CHECK(r.enumerated ==
        r.duplicates + r.rejected_rules + r.rejected_partition + r.rejected_memory + r.fitting);
  // sp = true at tp = 1: one per combination of the other axes (pp, vpp, micro, zero, recompute);
  // zero = 1 over one data-parallel rank (tp 8 · pp 8 = 64): vpp, micro, recompute, sp.
  CHECK(r.duplicates == 4 * 2 * 2 * 2 * 2 + 2 * 2 * 2 * 2);
  CHECK(r.rejected_rules > 0);   // e.g. vpp = 2 with pp = 1
  CHECK(r.rejected_memory > 0);  // e.g. tp = 1, pp = 1: 70B parameters on one GPU
  REQUIRE(r.best.size() == 5);
  for (size_t i = 1; i < r.best.size(); ++i) CHECK(r.best[i - 1].step_s <= r.best[i].step_s);
  for (const SearchCandidate& c : r.best) {
    CHECK(c.peak <= base.cluster.gpu.memory);
    CHECK(c.mfu > 0);
    // Each reported candidate re-checks clean and re-estimates to the same peak.
    Plan p = base;
    for (const auto& [path, value] : c.settings) REQUIRE(SetFieldText(p, path, value).empty());
    p.parallel.etp = p.parallel.tp;
    DiagnosticSink sink;
    CheckPlanRules(p, sink);
    CHECK_FALSE(sink.has_errors());
    CHECK(EstimateMemory(p).peak == c.peak);
  }
  CHECK(r.best.front().settings.back().first == "pipeline.schedule");
}

// The value a reported candidate takes for `path` ("" when it has none).
std::string SettingOf(const SearchCandidate& c, std::string_view path) {
  for (const auto& [p, value] : c.settings)
    if (p == path) return value;
  return "";
}

TEST_CASE("sp = true at tp = 1 is the sp = false candidate: reported once, as sp = false") {
  SearchOptions options;
  options.top = 1000;
  const SearchResult r = RunSearch(Llama64(), Axes(), options);
  REQUIRE(r.duplicates > 0);
  for (const SearchCandidate& c : r.best)
    if (SettingOf(c, "parallel.tp") == "1") CHECK(SettingOf(c, "parallel.sp") == "false");
  // Without sp = false among the values, sp = true at tp = 1 stays a candidate of its own (the
  // remaining duplicates are zero = 1 over one data-parallel rank).
  std::vector<SearchAxis> axes = Axes();
  axes.back().values = {"true"};
  const SearchResult only_true = RunSearch(Llama64(), axes, options);
  CHECK(only_true.duplicates == 2 * 2 * 2);
}

TEST_CASE("tp_comm_overlap = true at tp = 1 is the overlap-off candidate: reported once") {
  SearchOptions options;
  options.top = 100000;
  std::vector<SearchAxis> axes = {{"parallel.tp", {"1", "2", "4", "8"}},
                                  {"parallel.tp_comm_overlap", {"false", "true"}}};
  Plan base = Llama64();
  base.parallel.sp = true;  // the overlap's precondition at tp > 1 (P0317)
  const SearchResult r = RunSearch(base, axes, options);
  // sp = true at tp = 1 is not a duplicate here (sp is not searched); the overlap at tp = 1 is.
  CHECK(r.duplicates == 1);
  for (const SearchCandidate& c : r.best)
    if (SettingOf(c, "parallel.tp") == "1")
      CHECK(SettingOf(c, "parallel.tp_comm_overlap") == "false");
  // Without `false` among the values, the overlap at tp = 1 stays a candidate of its own.
  axes.back().values = {"true"};
  const SearchResult only_on = RunSearch(base, axes, options);
  CHECK(only_on.duplicates == 0);
}

TEST_CASE("zero > 0 over one data-parallel rank is the zero = 0 candidate: reported once") {
  SearchOptions options;
  options.top = 100000;
  const SearchResult r = RunSearch(Llama64(), Axes(), options);
  for (const SearchCandidate& c : r.best)
    if (SettingOf(c, "parallel.dp") == "1") CHECK(SettingOf(c, "optimizer.zero") == "0");
  // Without zero = 0 among the values, zero = 1 over one rank stays a candidate.
  std::vector<SearchAxis> axes = Axes();
  axes[4].values = {"1"};
  REQUIRE(axes[4].path == "optimizer.zero");
  const SearchResult only_one = RunSearch(Llama64(), axes, options);
  CHECK(only_one.duplicates == 4 * 2 * 2 * 2);  // only sp = true at tp = 1
}

TEST_CASE("the verifier removes reported candidates and the next ones move up") {
  SearchOptions options;
  options.top = 3;
  const SearchResult all = RunSearch(Llama64(), Axes(), options);
  options.verify = [&](const SearchSettings& s) { return s != all.best.front().settings; };
  const SearchResult filtered = RunSearch(Llama64(), Axes(), options);
  CHECK(filtered.rejected_verify == 1);
  REQUIRE(filtered.best.size() == 3);
  CHECK(filtered.best[0].settings == all.best[1].settings);
}

TEST_CASE("a space above the limit is refused before enumerating") {
  SearchOptions options;
  options.max_candidates = 100;
  const SearchResult r = RunSearch(Llama64(), Axes(), options);
  CHECK(r.too_large);
  CHECK(r.enumerated == 0);
}

TEST_CASE("text and JSON outputs carry the settings, memory, step time and MFU") {
  SearchOptions options;
  options.top = 2;
  const Plan base = Llama64();
  const SearchResult r = RunSearch(base, Axes(), options);
  const std::string text = PrintSearchText(base, Axes(), r);
  CHECK(text.find("tokens/s/GPU") != std::string::npos);
  CHECK(text.find("MFU") != std::string::npos);
  const std::string json = PrintSearchJson(base, Axes(), r, 0.5);
  CHECK(json.find("\"version\": 1") != std::string::npos);
  CHECK(json.find("\"parallel.tp\": \"") != std::string::npos);
  CHECK(json.find("\"peak_memory_bytes\": ") != std::string::npos);
  CHECK(json.find("\"step_seconds\": ") != std::string::npos);
  CHECK(json.find("\"mfu\": ") != std::string::npos);
}

TEST_CASE(
    "each reported plan says how far it is behind the best, and the table says which ones "
    "lie within the profile's median error of it") {
  SearchResult r;
  r.framework = "megatron_core";
  r.generation = "hopper";
  r.checked = {"megatron_core", 19, 5.0, 20.0};
  for (const double step : {10.0, 10.2, 10.49, 10.5, 12.0}) {
    SearchCandidate c;
    c.settings = {{"parallel.tp", "8"}};
    c.peak = int64_t{40} << 30;
    c.step_s = step;
    c.tokens_per_s_per_gpu = 1000 / step;
    c.mfu = 0.4;
    r.best.push_back(c);
  }
  CHECK(StepOverBest(r.best[1], r.best[0]) == doctest::Approx(0.02));
  // 10.49 is 4.9% behind, under the 5.0% median error; 10.5 is not.
  CHECK(TiesWithBest(r) == 3);
  const std::string text = PrintSearchText(Llama64(), Axes(), r);
  CHECK(text.find("vs best") != std::string::npos);
  CHECK(text.find("+0.0%") != std::string::npos);
  CHECK(text.find("+2.0%") != std::string::npos);
  CHECK(text.find("+20.0%") != std::string::npos);
  CHECK(text.find("note: plans 1 to 3 differ from the best by less than this profile's median "
                  "error on published runs (5.0%)") != std::string::npos);
  // Columns are as wide as their header or widest value: the one-character tp column does not
  // pad to a fixed width.
  CHECK(text.find("rank  tp  peak memory") != std::string::npos);
  const std::string json = PrintSearchJson(Llama64(), Axes(), r, 0.1);
  CHECK(json.find("\"within_median_error_of_best\": 3") != std::string::npos);
  CHECK(json.find("\"step_over_best\": 0.02") != std::string::npos);

  // A profile without published runs of its stack states no band, and the note is left out.
  r.checked = {};
  CHECK(TiesWithBest(r) == 0);
  CHECK(PrintSearchText(Llama64(), Axes(), r).find("note: plans") == std::string::npos);
  // Nor is it printed when only the best lies in the band.
  r.checked = {"megatron_core", 19, 1.0, 20.0};
  CHECK(TiesWithBest(r) == 1);
  CHECK(PrintSearchText(Llama64(), Axes(), r).find("note: plans") == std::string::npos);
}

}  // namespace
}  // namespace paraplan
