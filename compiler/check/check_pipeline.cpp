// The pipeline split: layers over pp stages (even, with embedding/loss accounting, with first
// and last stage overrides, or an explicit list), virtual chunks, the schedule, and the
// microbatch count the schedule needs (Megatron-Core's rules; see docs/diagnostics/P04xx.md).
#include <algorithm>
#include <numeric>
#include <string>

#include "compiler/base/checked.h"
#include "compiler/check/rule_support.h"

namespace paraplan::rules {
namespace {

std::string ListText(const std::vector<int64_t>& v) { return "[" + List(v) + "]"; }

// `units` split as evenly as possible over `stages`, larger shares first.
std::vector<int64_t> EvenSplit(int64_t units, int64_t stages) {
  std::vector<int64_t> out;
  if (stages <= 0 || stages > 4096) return out;
  for (int64_t s = 0; s < stages; ++s) out.push_back(units / stages + (s < units % stages ? 1 : 0));
  return out;
}

// An explicit split of the layers that keeps the spirit of the accounting flags (the first
// stage carries the embedding, the last the loss); nullopt when none fits.
std::optional<std::vector<int64_t>> AccountedSplit(int64_t layers, int64_t pp, bool e, bool l) {
  std::vector<int64_t> split = EvenSplit(layers + e + l, pp);
  if (split.empty()) return std::nullopt;
  // Put the lighter shares at the ends, where the embedding and the loss sit.
  std::sort(split.begin(), split.end());
  std::vector<int64_t> arranged(split.size());
  size_t lo = 0, hi = split.size();
  for (size_t i = 0; i < split.size(); ++i) {
    if (i % 2 == 0) {
      arranged[lo++] = split[i];
    } else {
      arranged[--hi] = split[i];
    }
  }
  // arranged: ascending from both ends toward the middle.
  arranged.front() -= e;
  arranged.back() -= l;
  for (int64_t v : arranged) {
    if (v < 0) return std::nullopt;
  }
  return arranged;
}

// How the plan splits its layers, read once by each split rule. The split rules form one chain
// (RuleChain::kPipelineSplit): the first that reports ends it, as Megatron stops at the first.
struct SplitShape {
  int64_t layers, pp, vpp;
  bool embedding, loss;  // account_for_embedding / account_for_loss
  std::optional<int64_t> first, last;
  const std::vector<int64_t>& list;
};

SplitShape ShapeOf(const Plan& p) {
  const PipelineSpec& pipe = p.pipeline;
  return {p.model.layers,         p.parallel.pp,
          p.parallel.vpp,         pipe.account_for_embedding,
          pipe.account_for_loss,  pipe.first_stage_layers,
          pipe.last_stage_layers, pipe.stage_layers};
}

// Which way the layers are split; kNone when no split rule applies (sizes not positive, or
// balance = cost / nanotron, which choose the split themselves: the pipeline partition,
// analyze/partition.h, reports what cannot be built, as P0602/P0603).
enum class SplitWay : uint8_t { kNone, kList, kOverrides, kEven };

SplitWay WayOf(const Plan& p, const SplitShape& s) {
  if (s.layers <= 0 || s.pp <= 0 || s.vpp <= 0 || p.pipeline.balance != Balance::kEven) {
    return SplitWay::kNone;
  }
  if (!s.list.empty()) return SplitWay::kList;  // an explicit list excludes every other way
  if (s.first || s.last) return SplitWay::kOverrides;
  return SplitWay::kEven;
}

// Labels the accounting flags that are on.
void AccountingFields(RuleDiag& d, const SplitShape& s) {
  if (s.embedding) d.Field(fields::kPipelineAccountForEmbedding, "true");
  if (s.loss) d.Field(fields::kPipelineAccountForLoss, "true");
}

bool CheckVppNeedsPp(RuleContext& ctx) {
  const SplitShape s = ShapeOf(ctx.plan());
  if (s.layers <= 0 || s.pp != 1 || s.vpp <= 1) return false;
  RuleDiag d(
      ctx, DiagKind::kVppNeedsPp,
      "`vpp = " + std::to_string(s.vpp) + "` with `pp = 1`: there is no pipeline to interleave");
  d.At({fields::kParallelVpp}, "virtual chunks need pipeline stages");
  d.Field(fields::kParallelPp, s.pp);
  d.Note(
      "virtual pipeline chunks interleave the layers of several pipeline ranks; Megatron-LM: "
      "\"When interleaved schedule is used, pipeline-model-parallel size should be greater than "
      "1\"");
  d.Help("remove `vpp`, or use `pp` > 1");
  d.Report();
  return true;
}

bool CheckStageLayersConflict(RuleContext& ctx) {
  const SplitShape s = ShapeOf(ctx.plan());
  if (WayOf(ctx.plan(), s) != SplitWay::kList) return false;
  if (!s.first && !s.last && !s.embedding && !s.loss) return false;
  RuleDiag d(ctx, DiagKind::kStageLayersConflict,
             "`stage_layers` is given together with other ways to split the layers");
  d.At({fields::kPipelineStageLayers}, "an explicit split");
  if (s.first) d.Field(fields::kPipelineFirstStageLayers, *s.first);
  if (s.last) d.Field(fields::kPipelineLastStageLayers, *s.last);
  AccountingFields(d, s);
  d.Note(
      "an explicit list decides every stage by itself (Megatron-LM: "
      "\"pipeline_model_parallel_layout cannot be set with other pipeline layout arguments\")");
  d.Help("keep `stage_layers` and remove the other split options, or remove `stage_layers`");
  d.Report();
  return true;
}

bool CheckStageLayersLength(RuleContext& ctx) {
  const SplitShape s = ShapeOf(ctx.plan());
  if (WayOf(ctx.plan(), s) != SplitWay::kList) return false;
  const int64_t n = static_cast<int64_t>(s.list.size());
  auto chunks = CheckedMul(s.pp, s.vpp);
  if (n == s.pp || (chunks && n == *chunks)) return false;
  RuleDiag d(ctx, DiagKind::kStageLayersLength,
             "`stage_layers` has " + std::to_string(n) +
                 " entries for `pp = " + std::to_string(s.pp) + "`" +
                 (s.vpp > 1 ? " and `vpp = " + std::to_string(s.vpp) + "`" : std::string()));
  d.At({fields::kPipelineStageLayers}, std::to_string(n) + " entries");
  d.Field(fields::kParallelPp, s.pp);
  if (s.vpp > 1) d.Field(fields::kParallelVpp, s.vpp);
  d.Note(
      "the list gives the layers of each pipeline stage (pp entries) or of each virtual chunk "
      "in "
      "pipeline order (pp · vpp entries)");
  if (ctx.helps()) {
    auto even = EvenSplit(s.layers, s.pp);
    if (ctx.Fixes({{fields::kPipelineStageLayers, ListText(even)}}, DiagKind::kStageLayersLength)) {
      d.Help("for example `stage_layers = " + ListText(even) + "`");
    }
  }
  d.Report();
  return true;
}

bool CheckStageLayersSum(RuleContext& ctx) {
  const SplitShape s = ShapeOf(ctx.plan());
  if (WayOf(ctx.plan(), s) != SplitWay::kList) return false;
  const int64_t layer_count = s.layers;
  int64_t sum = 0;
  bool overflow = false;
  for (int64_t v : s.list) overflow = overflow || __builtin_add_overflow(sum, v, &sum);
  if (overflow) sum = INT64_MAX;  // reported as a sum that is not the layer count
  if (sum == layer_count) return false;
  RuleDiag d(ctx, DiagKind::kStageLayersSum,
             "`stage_layers` adds up to " + std::to_string(sum) + " layers, but the model has " +
                 std::to_string(layer_count));
  d.At({fields::kPipelineStageLayers}, "adds up to " + std::to_string(sum));
  d.Field(fields::kModelLayers, layer_count);
  d.Value("sum(stage_layers)",
          List(s.list) + " → " + std::to_string(sum) + " ≠ " + std::to_string(layer_count));
  d.Note("every transformer layer belongs to exactly one stage");
  if (ctx.helps()) {
    auto even = EvenSplit(layer_count, static_cast<int64_t>(s.list.size()));
    if (ctx.Fixes({{fields::kPipelineStageLayers, ListText(even)}}, DiagKind::kStageLayersSum)) {
      d.Help("an even split of " + std::to_string(layer_count) +
             " layers: `stage_layers = " + ListText(even) + "`");
    }
  }
  d.Report();
  return true;
}

bool CheckStageOverridesWithAccounting(RuleContext& ctx) {
  const SplitShape s = ShapeOf(ctx.plan());
  if (WayOf(ctx.plan(), s) != SplitWay::kOverrides || (!s.embedding && !s.loss)) return false;
  RuleDiag d(ctx, DiagKind::kStageOverridesWithAccounting,
             "first/last stage overrides and embedding/loss accounting are both given");
  d.At({s.first ? fields::kPipelineFirstStageLayers : fields::kPipelineLastStageLayers},
       "an explicit stage size");
  if (s.first) d.Field(fields::kPipelineFirstStageLayers, *s.first);
  if (s.last) d.Field(fields::kPipelineLastStageLayers, *s.last);
  AccountingFields(d, s);
  d.Note(
      "both decide how many layers the first and last stages hold, so Megatron-Core takes only "
      "one "
      "(\"num_layers_in_first_pipeline_stage and num_layers_in_last_pipeline_stage cannot be set "
      "at "
      "the same time with account_for_embedding_in_pipeline_split and "
      "account_for_loss_in_pipeline_split\")");
  d.Help("remove the accounting flags and keep the overrides, or the other way round");
  d.Report();
  return true;
}

bool CheckStageLayersNotPositive(RuleContext& ctx) {
  const SplitShape s = ShapeOf(ctx.plan());
  if (WayOf(ctx.plan(), s) != SplitWay::kOverrides) return false;
  for (auto [field, value] :
       {std::pair<FieldId, std::optional<int64_t>>{fields::kPipelineFirstStageLayers, s.first},
        {fields::kPipelineLastStageLayers, s.last}}) {
    if (!value || *value >= 1) continue;
    const std::string name(ShortName(field));
    RuleDiag d(ctx, DiagKind::kStageLayersNotPositive,
               "`" + name + " = " + std::to_string(*value) + "` leaves the stage without layers");
    d.At({field}, "must be at least 1");
    d.Note(
        "an override gives its stage a number of transformer layers, at least one "
        "(Megatron-Core: "
        "\"num_layers_in_first_pipeline_stage must be larger than 0\")");
    d.Help("remove `" + name + "` for an even split, or set it to 1 or more");
    d.Report();
    return true;
  }
  return false;
}

// The layers the overrides leave to the middle stages, and how many middle stages there are.
struct Middle {
  int64_t first, last;  // 0 when not given
  int64_t stages, layers;
  bool Splits() const {
    return layers >= 0 && (layers > 0) == (stages > 0) && (stages <= 0 || layers % stages == 0);
  }
};

Middle MiddleOf(const SplitShape& s) {
  const int64_t first = s.first.value_or(0), last = s.last.value_or(0);
  return {first, last, s.pp - (s.first ? 1 : 0) - (s.last ? 1 : 0), s.layers - first - last};
}

// The nearest size of the first stage (of the last one when only it is given), at most 8
// layers away, that makes the middle split; nullopt when none does.
std::optional<int64_t> NearbyOverride(RuleContext& ctx, const SplitShape& s) {
  const FieldId varied =
      s.first ? fields::kPipelineFirstStageLayers : fields::kPipelineLastStageLayers;
  const int64_t current = s.first ? *s.first : s.last.value_or(0);
  for (int64_t delta = 1; delta <= 8; ++delta) {
    for (int64_t sign : {-1, 1}) {
      const int64_t value = current + sign * delta;
      if (ctx.Fixes({{varied, value}}, DiagKind::kMiddleLayersVsStages)) return value;
    }
  }
  return std::nullopt;
}

bool CheckMiddleLayersVsStages(RuleContext& ctx) {
  const SplitShape s = ShapeOf(ctx.plan());
  if (WayOf(ctx.plan(), s) != SplitWay::kOverrides) return false;
  const Middle m = MiddleOf(s);
  if (m.Splits()) return false;
  const int64_t layer_count = s.layers;
  std::string what =
      m.layers < 0 ? "the overrides ask for " + std::to_string(m.first + m.last) + " of " +
                         std::to_string(layer_count) + " layers"
      : m.stages <= 0 ? std::to_string(m.layers) + " layers are left but no middle stage"
      : m.layers == 0 ? "no layers are left for " + std::to_string(m.stages) + " middle stages"
                      : std::to_string(m.layers) + " remaining layers do not split over " +
                            std::to_string(m.stages) + " middle stages";
  RuleDiag d(ctx, DiagKind::kMiddleLayersVsStages, what);
  d.At({s.first ? fields::kPipelineFirstStageLayers : fields::kPipelineLastStageLayers},
       "fixes the first/last stage");
  d.Field(fields::kModelLayers, layer_count);
  if (s.first) d.Field(fields::kPipelineFirstStageLayers, m.first);
  if (s.last) d.Field(fields::kPipelineLastStageLayers, m.last);
  d.Field(fields::kParallelPp, s.pp);
  d.Value("layers - first - last", Dot({layer_count}) + " - " + std::to_string(m.first) + " - " +
                                       std::to_string(m.last) + " = " + std::to_string(m.layers));
  d.Value("middle stages", std::to_string(m.stages));
  d.Note(
      "the layers not given to the first and last stage are split evenly over the other stages "
      "(Megatron-Core: \"number of layers at middle stage: " +
      std::to_string(m.layers) + " must be divisible by the middle pipeline model parallel size " +
      std::to_string(m.stages) + "\")");
  if (ctx.helps() && m.stages > 0) {
    if (std::optional<int64_t> value = NearbyOverride(ctx, s)) {
      d.Help("`" + std::string(s.first ? "first" : "last") +
             "_stage_layers = " + std::to_string(*value) + "` splits the rest evenly");
    }
  }
  d.Report();
  return true;
}

// With the accounting flags on: the plan without them, or an explicit list in their place.
void DropAccountingHelps(RuleContext& ctx, RuleDiag& d, const SplitShape& s) {
  const bool e = s.embedding, l = s.loss;
  std::vector<std::pair<std::vector<FieldChange>, std::string>> toggles;
  if (e && l)
    toggles.push_back(
        {{{fields::kPipelineAccountForEmbedding, false}, {fields::kPipelineAccountForLoss, false}},
         "without both accounting flags"});
  if (e)
    toggles.push_back(
        {{{fields::kPipelineAccountForEmbedding, false}}, "without `account_for_embedding`"});
  if (l)
    toggles.push_back({{{fields::kPipelineAccountForLoss, false}}, "without `account_for_loss`"});
  for (auto& [changes, words] : toggles) {
    auto cand = ctx.Changed(changes);
    if (!cand || !ctx.Fixes(*cand, DiagKind::kLayersNotDivisibleByPp)) continue;
    int64_t t =
        cand->model.layers + cand->pipeline.account_for_embedding + cand->pipeline.account_for_loss;
    d.Help(words + ": " + std::to_string(t) + " / " + std::to_string(s.pp) + " = " +
           std::to_string(t / s.pp) + " per stage");
    break;
  }
  auto split = AccountedSplit(s.layers, s.pp, e, l);
  if (split) {
    std::string text = ListText(*split);
    auto cand = ctx.Changed({{fields::kPipelineStageLayers, text},
                             {fields::kPipelineAccountForEmbedding, false},
                             {fields::kPipelineAccountForLoss, false}});
    if (cand && ctx.Fixes(*cand, DiagKind::kLayersNotDivisibleByPp)) {
      d.Help("or split unevenly with `stage_layers = " + text +
             "` in place of the accounting flags (the "
             "embedding rides on stage 0, the loss on the last stage)");
    }
  }
}

// Without the accounting flags: Megatron-Core's own ways out, counting the embedding and the
// loss as layers (--account-for-embedding/loss-in-pipeline-split), giving the first and last
// stages their own counts (--decoder-first/last-pipeline-num-layers), or an explicit list.
void OtherSplitHelps(RuleContext& ctx, RuleDiag& d, const SplitShape& s) {
  const int64_t layer_count = s.layers, pp = s.pp;
  const std::pair<std::vector<FieldChange>, std::string> accounting[] = {
      {{{fields::kPipelineAccountForEmbedding, true}, {fields::kPipelineAccountForLoss, true}},
       "`account_for_embedding = true` and `account_for_loss = true`"},
      {{{fields::kPipelineAccountForEmbedding, true}}, "`account_for_embedding = true`"},
      {{{fields::kPipelineAccountForLoss, true}}, "`account_for_loss = true`"}};
  for (const auto& [changes, words] : accounting) {
    auto cand = ctx.Changed(changes);
    if (!cand || !ctx.Fixes(*cand, DiagKind::kLayersNotDivisibleByPp)) continue;
    const int64_t t =
        cand->model.layers + cand->pipeline.account_for_embedding + cand->pipeline.account_for_loss;
    d.Help("count the embedding and loss as layers with " + words + ": " + std::to_string(t) +
           " / " + std::to_string(pp) + " = " + std::to_string(t / pp) + " per stage");
    break;
  }
  if (pp > 2) {
    // Middle stages of m layers, the first and last with what is left, split as evenly as
    // possible (never more than m each).
    for (int64_t m = (layer_count + pp - 1) / pp; m <= layer_count / (pp - 2); ++m) {
      const int64_t rest = layer_count - m * (pp - 2);
      const int64_t first = rest / 2, last = rest - first;
      if (first > m || last > m || first < 1) continue;
      auto cand = ctx.Changed(
          {{fields::kPipelineFirstStageLayers, first}, {fields::kPipelineLastStageLayers, last}});
      if (cand && ctx.Fixes(*cand, DiagKind::kLayersNotDivisibleByPp)) {
        d.Help("or give the first and last stages their own counts: `first_stage_layers = " +
               std::to_string(first) + "` and `last_stage_layers = " + std::to_string(last) +
               "` (" + std::to_string(m) + " on each of the other " + std::to_string(pp - 2) + ")");
      }
      break;
    }
  }
  auto split = EvenSplit(layer_count, pp);
  std::reverse(split.begin(), split.end());  // lighter stages first: they hold the embedding
  std::string text = ListText(split);
  if (s.vpp == 1 &&
      ctx.Fixes({{fields::kPipelineStageLayers, text}}, DiagKind::kLayersNotDivisibleByPp)) {
    d.Help("or split unevenly with `stage_layers = " + text + "`");
  }
}

// Even split, with the embedding and the loss counted as layers when asked.
bool CheckLayersNotDivisibleByPp(RuleContext& ctx) {
  const SplitShape s = ShapeOf(ctx.plan());
  if (WayOf(ctx.plan(), s) != SplitWay::kEven) return false;
  const int64_t layer_count = s.layers, pp = s.pp, vpp = s.vpp;
  const bool e = s.embedding, l = s.loss;
  const int64_t total = layer_count + e + l;
  if (total % pp == 0) return false;
  std::string counted = std::to_string(layer_count);
  if (e) counted += " + 1";
  if (l) counted += " + 1";
  RuleDiag d(ctx, DiagKind::kLayersNotDivisibleByPp,
             (e || l ? "the " + std::to_string(layer_count) + " layers" +
                           (e && l ? " plus embedding and loss ("
                                   : " plus " + std::string(e ? "embedding" : "loss") + " (") +
                           std::to_string(total) + ")"
                     : "the " + std::to_string(layer_count) + " layers") +
                 " do not split evenly over `pp = " + std::to_string(pp) + "` stages");
  d.At({fields::kParallelPp},
       std::to_string(total) + " / " + std::to_string(pp) + " = " + Ratio(total, pp));
  d.Field(fields::kModelLayers, layer_count);
  AccountingFields(d, s);
  d.Value(
      e || l ? "layers" + std::string(e ? " + embedding" : "") + (l ? " + loss" : "") : "layers",
      (e || l ? counted + " = " : std::string()) + std::to_string(total) + ", and " +
          std::to_string(total) + " % " + std::to_string(pp) + " = " + std::to_string(total % pp));
  d.Note(std::string(e || l ? "with account_for_embedding/account_for_loss the embedding and the "
                              "loss count as one layer each, and "
                            : "") +
         "the pipeline split gives every stage the same number of layers (Megatron-LM: \"Number "
         "of layers "
         "should be divisible by the pipeline-model-parallel size\")");
  if (ctx.helps()) {
    auto ok = ctx.WorkingValues(fields::kParallelPp, AxisCandidates(ctx.plan()),
                                DiagKind::kLayersNotDivisibleByPp, 6);
    if (!ok.empty())
      d.Help("values of `pp` that split " + std::to_string(total) +
             " evenly and fit the cluster: " + List(ok));
    if (e || l) {
      DropAccountingHelps(ctx, d, s);
    } else {
      OtherSplitHelps(ctx, d, s);
    }
    if (vpp > 1) {
      d.Help("with `vpp = " + std::to_string(vpp) + "` every stage's layers must also split into " +
             std::to_string(vpp) +
             " chunks, and `stage_layers` lists one entry per chunk (pp · vpp = " +
             std::to_string(pp * vpp) + " entries, chunk by chunk)");
    }
  }
  d.Report();
  return true;
}

// kLayersNotDivisibleByVpp, for an explicit list of pp entries: the first stage whose layers
// do not cut into vpp chunks.
bool ListStagesNotDivisibleByVpp(RuleContext& ctx, const SplitShape& s) {
  const int64_t n = static_cast<int64_t>(s.list.size());
  if (n != s.pp || s.vpp <= 1) return false;
  for (int64_t i = 0; i < n; ++i) {
    if (s.list[i] % s.vpp == 0) continue;
    RuleDiag d(ctx, DiagKind::kLayersNotDivisibleByVpp,
               "stage " + std::to_string(i) + " has " + std::to_string(s.list[i]) +
                   " layers, which do not split into `vpp = " + std::to_string(s.vpp) + "` chunks");
    d.At({fields::kPipelineStageLayers},
         "stage " + std::to_string(i) + ": " + std::to_string(s.list[i]) + " layers");
    d.Field(fields::kParallelVpp, s.vpp);
    d.Note(
        "each pipeline rank runs vpp virtual chunks with the same number of layers; give pp · "
        "vpp "
        "entries to size the chunks one by one");
    d.Report();
    return true;
  }
  return false;
}

// kLayersNotDivisibleByVpp, with first/last stage overrides: the first of the first stage, the
// last stage and the middle stages whose layers do not cut into vpp chunks.
bool OverrideStagesNotDivisibleByVpp(RuleContext& ctx, const SplitShape& s) {
  const Middle m = MiddleOf(s);
  const int64_t vpp = s.vpp;
  if (vpp <= 1) return false;
  const int64_t per = m.stages > 0 ? m.layers / m.stages : 0;
  for (auto [name, value] :
       {std::pair<std::string_view, int64_t>{"first stage", s.first ? m.first : -1},
        {"last stage", s.last ? m.last : -1},
        {"middle stages", m.stages > 0 ? per : -1}}) {
    if (value < 0 || value % vpp == 0) continue;
    RuleDiag d(ctx, DiagKind::kLayersNotDivisibleByVpp,
               "the " + std::string(name) + " " + (name == "middle stages" ? "hold " : "holds ") +
                   std::to_string(value) + " layers each, which do not split into `vpp = " +
                   std::to_string(vpp) + "` chunks");
    d.At({fields::kParallelVpp}, "virtual chunks per pipeline rank");
    if (s.first) d.Field(fields::kPipelineFirstStageLayers, m.first);
    if (s.last) d.Field(fields::kPipelineLastStageLayers, m.last);
    d.Field(fields::kModelLayers, s.layers);
    d.Value(std::string(name) + " % vpp", std::to_string(value) + " % " + std::to_string(vpp) +
                                              " = " + std::to_string(value % vpp));
    d.Note(
        "each pipeline rank's layers are cut into vpp equal virtual chunks (Megatron-Core: "
        "\"number of "
        "layers at first stage: ... must be divisible by virtual pipeline parallel degree " +
        std::to_string(vpp) + "\")");
    d.Report();
    return true;
  }
  return false;
}

// kLayersNotDivisibleByVpp, for the even split: each stage's share does not cut into vpp chunks.
bool EvenStagesNotDivisibleByVpp(RuleContext& ctx, const SplitShape& s) {
  const int64_t pp = s.pp, vpp = s.vpp;
  const bool e = s.embedding, l = s.loss;
  const int64_t total = s.layers + e + l;
  if (vpp <= 1 || (total / pp) % vpp == 0) return false;
  const int64_t per = total / pp;
  RuleDiag d(ctx, DiagKind::kLayersNotDivisibleByVpp,
             "each pipeline stage holds " + std::to_string(per) +
                 (e || l ? " layer slots" : " layers") +
                 ", which do not split into `vpp = " + std::to_string(vpp) + "` virtual chunks");
  d.At({fields::kParallelVpp},
       std::to_string(per) + " / " + std::to_string(vpp) + " = " + Ratio(per, vpp));
  d.Field(fields::kModelLayers, s.layers).Field(fields::kParallelPp, pp);
  AccountingFields(d, s);
  d.Value((e || l ? "(layers + embedding/loss) / pp" : "layers / pp"),
          std::to_string(total) + " / " + std::to_string(pp) + " = " + std::to_string(per) +
              ", and " + std::to_string(per) + " % " + std::to_string(vpp) + " = " +
              std::to_string(per % vpp));
  d.Note(
      "the interleaved schedule cuts each pipeline rank's layers into vpp equal chunks "
      "(Megatron-Core: "
      "\"num_layers_per_pipeline_rank " +
      std::to_string(per) + " should be divisible by vp_size " + std::to_string(vpp) + "\")");
  if (ctx.helps()) {
    auto ok = ctx.WorkingValues(fields::kParallelVpp, Divisors(per),
                                DiagKind::kLayersNotDivisibleByVpp, 6);
    ok.erase(std::remove(ok.begin(), ok.end(), 1), ok.end());
    if (!ok.empty()) d.Help("values of `vpp` that divide " + std::to_string(per) + ": " + List(ok));
    auto pps = ctx.WorkingValues(fields::kParallelPp, AxisCandidates(ctx.plan()),
                                 DiagKind::kLayersNotDivisibleByVpp, 4);
    pps.erase(std::remove(pps.begin(), pps.end(), 1), pps.end());
    if (!pps.empty())
      d.Help("or keep `vpp = " + std::to_string(vpp) + "` with " + Choices("pp", pps));
  }
  d.Report();
  return true;
}

bool CheckLayersNotDivisibleByVpp(RuleContext& ctx) {
  const SplitShape s = ShapeOf(ctx.plan());
  switch (WayOf(ctx.plan(), s)) {
    case SplitWay::kList:
      return ListStagesNotDivisibleByVpp(ctx, s);
    case SplitWay::kOverrides:
      return OverrideStagesNotDivisibleByVpp(ctx, s);
    case SplitWay::kEven:
      return EvenStagesNotDivisibleByVpp(ctx, s);
    case SplitWay::kNone:
      break;
  }
  return false;
}

bool CheckScheduleVppConflict(RuleContext& ctx) {
  const Plan& p = ctx.plan();
  const int64_t vpp = p.parallel.vpp;
  const Schedule schedule = p.pipeline.schedule;
  if (vpp <= 1 || schedule == Schedule::kInterleaved1F1B) return false;
  RuleDiag d(ctx, DiagKind::kScheduleVppConflict,
             "`vpp = " + std::to_string(vpp) + "` with `schedule = " +
                 std::string(ToString(schedule)) + "`, which runs one chunk per pipeline rank");
  d.At({fields::kPipelineSchedule, fields::kParallelVpp}, "does not interleave");
  d.Field(fields::kParallelVpp, vpp);
  d.Note(
      "virtual pipeline chunks are what the interleaved 1F1B schedule runs; gpipe and 1f1b run "
      "one "
      "chunk per rank");
  d.Help("set `schedule = interleaved_1f1b`, or remove `vpp`");
  d.Report();
  return true;
}

bool CheckInterleavedWithoutVpp(RuleContext& ctx) {
  const Plan& p = ctx.plan();
  const int64_t pp = p.parallel.pp;
  const int64_t vpp = p.parallel.vpp;
  if (vpp != 1 || p.pipeline.schedule != Schedule::kInterleaved1F1B || pp <= 1) return false;
  RuleDiag d(ctx, DiagKind::kInterleavedWithoutVpp,
             "`schedule = interleaved_1f1b` with `vpp = 1` runs plain 1F1B");
  d.At({fields::kPipelineSchedule}, "nothing to interleave");
  d.Field(fields::kParallelVpp, vpp);
  d.Note(
      "interleaving needs vpp > 1 virtual chunks per pipeline rank; Megatron-Core treats vpp = 1 "
      "as "
      "no interleaving");
  if (ctx.helps()) {
    int64_t per =
        (p.model.layers + p.pipeline.account_for_embedding + p.pipeline.account_for_loss) /
        std::max<int64_t>(pp, 1);
    std::vector<int64_t> ok;
    for (int64_t v : Divisors(std::max<int64_t>(per, 1))) {
      if (v > 1 && ok.size() < 4 &&
          ctx.Fixes({{fields::kParallelVpp, v}}, DiagKind::kInterleavedWithoutVpp))
        ok.push_back(v);
    }
    if (!ok.empty()) d.Help("values of `vpp` that split this plan's stages: " + List(ok));
    d.Help("or `schedule = 1f1b` to say what runs");
  }
  d.Report();
  return true;
}

// "global / (micro · dp)" with its numbers, for the microbatch rules.
void MicrobatchFields(RuleDiag& d, const Plan& p, int64_t m) {
  d.Field(fields::kBatchGlobal, p.batch.global)
      .Field(fields::kBatchMicro, p.batch.micro)
      .Field(fields::kParallelDp, p.parallel.dp);
  d.Field(fields::kParallelPp, p.parallel.pp);
  if (p.parallel.vpp > 1) d.Field(fields::kParallelVpp, p.parallel.vpp);
  d.Value("microbatches = global / (micro · dp)", std::to_string(p.batch.global) + " / (" +
                                                      Dot({p.batch.micro, p.parallel.dp}) +
                                                      ") = " + std::to_string(m));
}

bool CheckInterleavedMicrobatches(RuleContext& ctx) {
  const Plan& p = ctx.plan();
  const int64_t pp = p.parallel.pp;
  const int64_t m = p.Microbatches();  // 0 when it does not divide: the batch rule reports it
  auto per_step = CheckedMul(p.batch.micro, p.parallel.dp);
  if (pp <= 1 || p.parallel.vpp <= 1 || m <= 0 || !per_step || m % pp == 0) return false;
  RuleDiag d(ctx, DiagKind::kInterleavedMicrobatches,
             std::to_string(m) + " microbatches per step " +
                 (m < pp ? "are fewer than" : "are not a multiple of") +
                 " `pp = " + std::to_string(pp) + "`, as the interleaved schedule needs");
  d.At({fields::kBatchGlobal, fields::kParallelVpp}, std::to_string(m) + " microbatches");
  MicrobatchFields(d, p, m);
  d.Value("microbatches % pp",
          std::to_string(m) + " % " + std::to_string(pp) + " = " + std::to_string(m % pp));
  d.Note(
      "the interleaved schedule runs microbatches in groups of pp per virtual chunk "
      "(Megatron-Core "
      "checks at the first training step: \"The number of contiguous micro-batches in a virtual "
      "pipeline "
      "stage should range in [PP, M]\" and the remainder M % PP must be 0)");
  if (ctx.helps()) {
    int64_t step = *per_step * pp;
    int64_t down = p.batch.global / step * step;
    std::vector<int64_t> cands;
    if (down > 0) cands.push_back(down);
    if (auto up = CheckedAdd(down, step)) cands.push_back(*up);
    auto ok = ctx.WorkingValues(fields::kBatchGlobal, cands, DiagKind::kInterleavedMicrobatches, 2);
    if (!ok.empty())
      d.Help("a global batch that gives a multiple of " + std::to_string(pp) +
             " microbatches: " + Choices("global", ok));
    if (ctx.Fixes(
            {{fields::kParallelVpp, int64_t{1}}, {fields::kPipelineSchedule, std::string("1f1b")}},
            DiagKind::kInterleavedMicrobatches)) {
      d.Help("or give up interleaving: `vpp = 1` with `schedule = 1f1b`");
    }
  }
  d.Report();
  return true;
}

bool CheckFewerMicrobatchesThanStages(RuleContext& ctx) {
  const Plan& p = ctx.plan();
  const int64_t pp = p.parallel.pp;
  const int64_t m = p.Microbatches();  // 0 when it does not divide: the batch rule reports it
  auto per_step = CheckedMul(p.batch.micro, p.parallel.dp);
  if (pp <= 1 || p.parallel.vpp > 1 || m <= 0 || !per_step || m >= pp) return false;
  RuleDiag d(ctx, DiagKind::kFewerMicrobatchesThanStages,
             "only " + std::to_string(m) + (m == 1 ? " microbatch" : " microbatches") +
                 " per step for `pp = " + std::to_string(pp) + "` pipeline stages");
  d.At({fields::kBatchGlobal, fields::kParallelPp},
       std::to_string(m) + (m == 1 ? " microbatch" : " microbatches"));
  MicrobatchFields(d, p, m);
  d.Value("idle share of the step (bubble)", "(pp - 1) / (m + pp - 1) = " + std::to_string(pp - 1) +
                                                 " / " + std::to_string(m + pp - 1) + " = " +
                                                 std::to_string((100 * (pp - 1)) / (m + pp - 1)) +
                                                 "%");
  d.Note(
      "with fewer microbatches than stages the pipeline never fills: every stage waits for most of "
      "the "
      "step (Megatron accepts this silently)");
  if (ctx.helps()) {
    auto need = CheckedMul(*per_step, pp);
    if (need)
      d.Help("`global = " + std::to_string(*need) + "` or more (" + std::to_string(pp) +
             " microbatches of " + std::to_string(p.batch.micro) + " on each of " +
             std::to_string(p.parallel.dp) + " data-parallel replicas)");
  }
  d.Report();
  return true;
}

}  // namespace

const std::vector<Rule>& PipelineRules() {
  using namespace fields;  // NOLINT(google-build-using-namespace): the table reads as paths
  // The split rules read every way a split can be given; one poisoned input silences them all.
  const std::vector<FieldId> split = {kModelLayers,
                                      kParallelPp,
                                      kParallelVpp,
                                      kPipelineAccountForEmbedding,
                                      kPipelineAccountForLoss,
                                      kPipelineFirstStageLayers,
                                      kPipelineLastStageLayers,
                                      kPipelineStageLayers};
  constexpr RuleChain kSplit = RuleChain::kPipelineSplit;
  const std::vector<FieldId> microbatches = {kParallelPp, kParallelVpp, kBatchGlobal, kBatchMicro,
                                             kParallelDp};
  static const std::vector<Rule> kRules = {
      {DiagKind::kVppNeedsPp, CheckVppNeedsPp, split, kSplit},
      {DiagKind::kStageLayersConflict, CheckStageLayersConflict, split, kSplit},
      {DiagKind::kStageLayersLength, CheckStageLayersLength, split, kSplit},
      {DiagKind::kStageLayersSum, CheckStageLayersSum, split, kSplit},
      {DiagKind::kStageOverridesWithAccounting, CheckStageOverridesWithAccounting, split, kSplit},
      {DiagKind::kStageLayersNotPositive, CheckStageLayersNotPositive, split, kSplit},
      {DiagKind::kMiddleLayersVsStages, CheckMiddleLayersVsStages, split, kSplit},
      {DiagKind::kLayersNotDivisibleByPp, CheckLayersNotDivisibleByPp, split, kSplit},
      {DiagKind::kLayersNotDivisibleByVpp, CheckLayersNotDivisibleByVpp, split, kSplit},
      {DiagKind::kScheduleVppConflict,
       CheckScheduleVppConflict,
       {kParallelVpp, kPipelineSchedule, kParallelPp}},
      {DiagKind::kInterleavedWithoutVpp,
       CheckInterleavedWithoutVpp,
       {kParallelVpp, kPipelineSchedule, kParallelPp}},
      {DiagKind::kInterleavedMicrobatches, CheckInterleavedMicrobatches, microbatches},
      {DiagKind::kFewerMicrobatchesThanStages, CheckFewerMicrobatchesThanStages, microbatches},
  };
  return kRules;
}

}  // namespace paraplan::rules
