#include "compiler/search/search.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <optional>

#include "compiler/analyze/cost_framework.h"
#include "compiler/analyze/memory.h"
#include "compiler/analyze/memory_check.h"
#include "compiler/analyze/time.h"
#include "compiler/check/rules.h"
#include "compiler/diagnostics/diagnostic.h"

namespace paraplan {
namespace {

// One axis value, looked up in the plan's field table and parsed once: applying it is a typed
// store (SetFieldValue), with the field's own range check. Lists and "none" keep their text.
struct Setter {
  const FieldInfo* field = nullptr;  // nullptr: not a field of a plan (never applies)
  std::optional<FieldValue> value;   // parsed; nullopt: apply the text
  std::string text;
};

std::string Unquote(std::string_view v) {
  if (v.size() >= 2 && v.front() == '"' && v.back() == '"')
    return std::string(v.substr(1, v.size() - 2));
  return std::string(v);
}

Setter Parse(const std::string& path, const std::string& text) {
  Setter s;
  s.field = FindPlanField(path);
  s.text = text;
  FieldValue value;
  if (s.field && ParseFieldText(*s.field, text, &value).empty()) s.value = std::move(value);
  return s;
}

bool Apply(Plan& plan, const Setter& s) {
  if (!s.field) return false;
  if (s.value) return SetFieldValue(plan, *s.field, *s.value).empty();
  return SetFieldText(plan, s.field->path, s.text).empty();
}

// The setter sets `field` to `value`.
bool Sets(const Setter& s, FieldId field, const FieldValue& value) {
  return s.field && s.field->index == field.index && s.value && *s.value == value;
}

// etp follows tp unless the plan writes it (or it is searched).
bool EtpFollowsTp(const Plan& plan) {
  const OriginKind k = plan.Origin(fields::kParallelEtp).kind;
  return k != OriginKind::kFile && k != OriginKind::kCommandLine;
}

}  // namespace

std::vector<SearchAxis> AxesFromSweeps(const Plan& plan) {
  std::vector<SearchAxis> axes;
  for (const Sweep& s : plan.sweeps) axes.push_back({s.path, s.values});
  return axes;
}

namespace {

// The axes parsed once, and what the derivations after applying them need to know.
struct SearchSpace {
  std::vector<std::vector<Setter>> setters;  // one per axis value
  bool vpp_axis = false, schedule_axis = false, etp_axis = false;
  bool sp_false_searched = false;     // `sp = false` is itself a candidate value
  bool zero0_searched = false;        // `zero = 0` is itself a candidate value
  bool overlap_off_searched = false;  // `tp_comm_overlap = false` is itself a candidate value
  Schedule base_schedule = Schedule::k1F1B;
};

SearchSpace SpaceOf(const Plan& base, const std::vector<SearchAxis>& axes) {
  SearchSpace space;
  space.setters.resize(axes.size());
  for (size_t i = 0; i < axes.size(); ++i) {
    for (const std::string& v : axes[i].values) {
      space.setters[i].push_back(Parse(axes[i].path, v));
      space.sp_false_searched |= Sets(space.setters[i].back(), fields::kParallelSp, false);
      space.zero0_searched |= Sets(space.setters[i].back(), fields::kOptimizerZero, int64_t{0});
      space.overlap_off_searched |=
          Sets(space.setters[i].back(), fields::kParallelTpCommOverlap, false);
    }
    space.vpp_axis |= axes[i].path == fields::kParallelVpp.path;
    space.schedule_axis |= axes[i].path == fields::kPipelineSchedule.path;
    space.etp_axis |= axes[i].path == fields::kParallelEtp.path;
  }
  space.base_schedule = base.pipeline.schedule;
  return space;
}

// The schedule a candidate runs when vpp is searched and the schedule is not.
Schedule DerivedSchedule(const SearchSpace& space, int64_t vpp) {
  return vpp > 1                                             ? Schedule::kInterleaved1F1B
         : space.base_schedule == Schedule::kInterleaved1F1B ? Schedule::k1F1B
                                                             : space.base_schedule;
}

// Candidate `index` as one value per axis (mixed radix, last axis fastest).
void Decode(int64_t index, const std::vector<std::vector<Setter>>& setters,
            std::vector<size_t>* digit) {
  for (size_t i = setters.size(); i-- > 0;) {
    const int64_t n = static_cast<int64_t>(setters[i].size());
    (*digit)[i] = n == 0 ? 0 : static_cast<size_t>(index % n);
    index = n == 0 ? index : index / n;
  }
}

struct Fit {
  int64_t index;
  int64_t peak, peak_stage;
  double step_s, tokens, mfu;
};

// Applies candidate `index` to `plan` (changed in place), derives dp, etp and the schedule, and
// screens it; counts the verdict in `result` and returns the fit when it fits.
std::optional<Fit> Screen(Plan& plan, const SearchSpace& space, int64_t index,
                          const std::vector<size_t>& digit, const CostOptions& cost,
                          DiagnosticSink& sink, SearchResult& result) {
  bool applied = true;
  for (size_t i = 0; i < space.setters.size(); ++i)
    if (!space.setters[i].empty()) applied = applied && Apply(plan, space.setters[i][digit[i]]);
  if (!space.etp_axis && EtpFollowsTp(plan)) plan.parallel.etp = plan.parallel.tp;
  if (space.vpp_axis && !space.schedule_axis) {
    plan.pipeline.schedule = DerivedSchedule(space, plan.parallel.vpp);
  }
  // At TP 1 the tensor-parallel switches change nothing: Megatron turns sequence parallelism
  // off (it splits nothing there) and the TP communication overlap hides nothing (P0316). Such
  // a candidate is its switch-off twin again where that twin is searched: count it once.
  if (applied && plan.parallel.tp == 1 &&
      ((space.sp_false_searched && plan.parallel.sp) ||
       (space.overlap_off_searched && plan.parallel.tp_comm_overlap))) {
    ++result.duplicates;
    return std::nullopt;
  }
  const int64_t unit = plan.parallel.tp * plan.parallel.pp * plan.parallel.cp;
  if (!applied || unit <= 0 || plan.World() % unit != 0) {
    ++result.rejected_rules;
    return std::nullopt;
  }
  plan.parallel.dp = plan.World() / unit;
  // ZeRO over a data-parallel domain of one rank shards nothing (P0504): without offload such
  // a candidate is the zero = 0 one again.
  if (space.zero0_searched && plan.optimizer.zero > 0 && plan.optimizer.offload == Offload::kNone &&
      plan.parallel.dp * plan.parallel.cp == 1 && (!plan.model.IsMoe() || plan.Edp() <= 1)) {
    ++result.duplicates;
    return std::nullopt;
  }
  sink.Clear();
  CheckPlanRules(plan, sink, RuleOptions{.helps = false});  // verdicts only
  if (sink.has_errors()) {
    ++result.rejected_rules;
    return std::nullopt;
  }
  const MemoryEstimate mem = EstimateMemory(plan, cost);
  if (!mem.valid) {
    ++result.rejected_partition;
    return std::nullopt;
  }
  if (mem.peak > mem.capacity) {
    ++result.rejected_memory;
    if (result.smallest_rejected_peak == 0 || mem.peak < result.smallest_rejected_peak)
      result.smallest_rejected_peak = mem.peak;
    return std::nullopt;
  }
  const TimeEstimate time = EstimateTime(plan, cost, mem);
  if (!time.valid) {
    ++result.rejected_partition;
    return std::nullopt;
  }
  return Fit{index, mem.peak, mem.peak_stage, time.step_s, time.tokens_per_s_per_gpu, time.mfu};
}

// A fitting candidate as settings: every axis, then the derived fields, so that it can be
// written back as --set values.
SearchCandidate Describe(const Plan& base, const std::vector<SearchAxis>& axes,
                         const SearchSpace& space, const Fit& f) {
  SearchCandidate c;
  std::vector<size_t> d(axes.size());
  Decode(f.index, space.setters, &d);
  for (size_t i = 0; i < axes.size(); ++i)
    if (!axes[i].values.empty()) c.settings.push_back({axes[i].path, axes[i].values[d[i]]});
  Plan p = base;
  for (size_t i = 0; i < axes.size(); ++i)
    if (!space.setters[i].empty()) Apply(p, space.setters[i][d[i]]);
  if (!space.etp_axis && EtpFollowsTp(p)) p.parallel.etp = p.parallel.tp;
  const int64_t unit = p.parallel.tp * p.parallel.pp * p.parallel.cp;
  c.settings.push_back({std::string(fields::kParallelDp.path), std::to_string(p.World() / unit)});
  if (space.vpp_axis && !space.schedule_axis) {
    const Schedule s = DerivedSchedule(space, p.parallel.vpp);
    c.settings.push_back(
        {std::string(fields::kPipelineSchedule.path), "\"" + std::string(ToString(s)) + "\""});
  }
  c.peak = f.peak;
  c.peak_stage = f.peak_stage;
  c.step_s = f.step_s;
  c.tokens_per_s_per_gpu = f.tokens;
  c.mfu = f.mfu;
  return c;
}

}  // namespace

SearchResult RunSearch(const Plan& base, const std::vector<SearchAxis>& axes,
                       const SearchOptions& options) {
  SearchResult result;
  const FrameworkProfile& prof = PricingProfile(base, options.cost);
  result.framework = prof.stack;
  result.generation = prof.generation;
  result.checked = prof.checked;
  int64_t size = 1;  // saturates at INT64_MAX
  for (const SearchAxis& a : axes) {
    const int64_t n = std::max<int64_t>(1, static_cast<int64_t>(a.values.size()));
    if (__builtin_mul_overflow(size, n, &size)) size = INT64_MAX;
  }
  result.space = size;
  if (size > options.max_candidates) {
    result.too_large = true;
    return result;
  }
  const SearchSpace space = SpaceOf(base, axes);
  Plan plan = base;
  plan.sweeps.clear();
  std::vector<Fit> fits;
  std::vector<size_t> digit(axes.size(), 0);
  DiagnosticSink sink;
  for (int64_t index = 0; index < size; ++index) {
    Decode(index, space.setters, &digit);
    ++result.enumerated;
    if (auto fit = Screen(plan, space, index, digit, options.cost, sink, result)) {
      fits.push_back(*fit);
    }
  }
  result.fitting = static_cast<int64_t>(fits.size());
  std::sort(fits.begin(), fits.end(), [](const Fit& a, const Fit& b) {
    return a.step_s != b.step_s ? a.step_s < b.step_s : a.index < b.index;
  });
  for (const Fit& f : fits) {
    if (static_cast<int64_t>(result.best.size()) >= options.top) break;
    SearchCandidate c = Describe(base, axes, space, f);
    if (options.verify && !options.verify(c.settings)) {
      ++result.rejected_verify;
      continue;
    }
    result.best.push_back(std::move(c));
  }
  return result;
}

namespace {

std::string Short(std::string_view path) {
  const size_t dot = path.rfind('.');
  return std::string(dot == std::string_view::npos ? path : path.substr(dot + 1));
}

std::string JsonString(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) {
      out += fmt::format("\\u{:04x}", static_cast<int>(c));
      continue;
    }
    out += c;
  }
  return out + "\"";
}

}  // namespace

double StepOverBest(const SearchCandidate& c, const SearchCandidate& best) {
  return best.step_s > 0 ? c.step_s / best.step_s - 1 : 0;
}

size_t TiesWithBest(const SearchResult& r) {
  if (r.best.empty() || r.checked.runs <= 0 || r.checked.median_pct <= 0) return 0;
  size_t ties = 0;
  while (ties < r.best.size() &&
         StepOverBest(r.best[ties], r.best.front()) < r.checked.median_pct / 100)
    ++ties;
  return ties;
}

std::string PrintSearchText(const Plan& base, const std::vector<SearchAxis>& axes,
                            const SearchResult& r) {
  std::string out = fmt::format(
      "search {}: {} candidates; {} duplicates (sp = true or tp_comm_overlap = true at tp = 1, "
      "zero > 0 over one data-parallel rank), {} rejected by the rules, {} by the pipeline "
      "split, {} over {} of memory; {} fit\n",
      base.name, r.enumerated, r.duplicates, r.rejected_rules, r.rejected_partition,
      r.rejected_memory, FormatGiB(base.cluster.gpu.memory), r.fitting);
  for (const Sweep& s : base.sweeps) {
    if (s.repeats > 0) {
      out += fmt::format(
          "note: `{}` lists the same value more than once ({} repeat{}); each value is searched "
          "once\n",
          s.path, s.repeats, s.repeats == 1 ? "" : "s");
    }
  }
  if (r.best.empty()) return out;
  // Each column as wide as its header or its widest value, whichever is wider.
  const SearchCandidate& best = r.best.front();
  std::vector<std::string> headers = {"rank"};
  for (const auto& [path, value] : best.settings) headers.push_back(Short(path));
  for (const char* h : {"peak memory", "step (s)", "vs best", "tokens/s/GPU", "MFU"})
    headers.emplace_back(h);
  std::vector<std::vector<std::string>> rows;
  int rank = 1;
  for (const SearchCandidate& c : r.best) {
    std::vector<std::string> row = {std::to_string(rank++)};
    for (const auto& [path, value] : c.settings) row.push_back(Unquote(value));
    row.push_back(FormatGiB(c.peak));
    row.push_back(fmt::format("{:.3f}", c.step_s));
    row.push_back(fmt::format("{:+.1f}%", 100 * StepOverBest(c, best)));
    row.push_back(fmt::format("{:.1f}", c.tokens_per_s_per_gpu));
    row.push_back(fmt::format("{:.1f}%", 100 * c.mfu));
    rows.push_back(std::move(row));
  }
  std::vector<size_t> width(headers.size());
  for (size_t i = 0; i < headers.size(); ++i) {
    width[i] = headers[i].size();
    for (const auto& row : rows) width[i] = std::max(width[i], row[i].size());
  }
  auto line = [&](const std::vector<std::string>& cells) {
    std::string text;
    for (size_t i = 0; i < cells.size(); ++i)
      text += fmt::format("{}{:>{}}", i ? "  " : "", cells[i], width[i]);
    return text + "\n";
  };
  out += line(headers);
  for (const auto& row : rows) out += line(row);
  if (r.framework.empty()) return out;
  out += fmt::format("priced as framework {} on {}; {}\n", r.framework, r.generation,
                     DescribeCheck(r.checked));
  // Plans closer to the best than the profile's median error on published runs are not told
  // apart by the model with any confidence: say so rather than let the ranks read as a measured
  // order.
  const size_t ties = TiesWithBest(r);
  if (ties > 1)
    out += fmt::format(
        "note: plans 1 to {} differ from the best by less than this profile's median error on "
        "published runs ({:.1f}%): time the first few before choosing\n",
        ties, r.checked.median_pct);
  return out;
}

std::string PrintSearchJson(const Plan& base, const std::vector<SearchAxis>& axes,
                            const SearchResult& r, double seconds) {
  std::string out = "{\n  \"version\": 1,\n";
  out += fmt::format("  \"plan\": {},\n", JsonString(base.name));
  out += "  \"axes\": {";
  for (size_t i = 0; i < axes.size(); ++i) {
    out += fmt::format("{}{}: [", i ? ", " : "", JsonString(axes[i].path));
    for (size_t j = 0; j < axes[i].values.size(); ++j)
      out += fmt::format("{}{}", j ? ", " : "", JsonString(Unquote(axes[i].values[j])));
    out += "]";
  }
  out += "},\n";
  out += fmt::format(
      "  \"enumerated\": {},\n  \"duplicates\": {},\n"
      "  \"rejected\": {{\"rules\": {}, \"partition\": {}, \"memory\": {}, \"verify\": {}}},\n"
      "  \"fitting\": {},\n  \"seconds\": {:.6f},\n",
      r.enumerated, r.duplicates, r.rejected_rules, r.rejected_partition, r.rejected_memory,
      r.rejected_verify, r.fitting, seconds);
  out +=
      fmt::format("  \"framework\": {{\"stack\": {}, \"generation\": {}, {}}},",
                  JsonString(r.framework), JsonString(r.generation), CheckJsonMembers(r.checked));
  out +=
      fmt::format("\n  \"within_median_error_of_best\": {},\n  \"candidates\": [", TiesWithBest(r));
  for (size_t i = 0; i < r.best.size(); ++i) {
    const SearchCandidate& c = r.best[i];
    out += i ? ",\n    {" : "\n    {";
    out += fmt::format("\"rank\": {}, \"settings\": {{", i + 1);
    for (size_t j = 0; j < c.settings.size(); ++j)
      out += fmt::format("{}{}: {}", j ? ", " : "", JsonString(c.settings[j].first),
                         JsonString(Unquote(c.settings[j].second)));
    out += fmt::format(
        "}}, \"peak_memory_bytes\": {}, \"peak_stage\": {}, \"step_seconds\": {:.6g}, "
        "\"step_over_best\": {:.6g}, \"tokens_per_s_per_gpu\": {:.6g}, \"mfu\": {:.6g}}}",
        c.peak, c.peak_stage, c.step_s, StepOverBest(c, r.best.front()), c.tokens_per_s_per_gpu,
        c.mfu);
  }
  out += r.best.empty() ? "]\n}\n" : "\n  ]\n}\n";
  return out;
}

}  // namespace paraplan
