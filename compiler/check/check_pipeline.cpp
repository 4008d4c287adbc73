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

void CheckSplit(RuleContext& ctx) {
  const Plan& p = ctx.plan();
  const PipelineSpec& pipe = p.pipeline;
  const int64_t L = p.model.layers;
  const int64_t pp = p.parallel.pp;
  const int64_t vpp = p.parallel.vpp;
  const bool e = pipe.account_for_embedding;
  const bool l = pipe.account_for_loss;
  const bool has_f = pipe.first_stage_layers.has_value();
  const bool has_k = pipe.last_stage_layers.has_value();
  if (ctx.Poisoned({"model.layers", "parallel.pp", "parallel.vpp", "pipeline.account_for_embedding",
                    "pipeline.account_for_loss", "pipeline.first_stage_layers",
                    "pipeline.last_stage_layers", "pipeline.stage_layers"}) ||
      L <= 0 || pp <= 0 || vpp <= 0) {
    return;
  }

  if (vpp > 1 && pp == 1) {
    RuleDiag d(
        ctx, DiagKind::kVppNeedsPp,
        "`vpp = " + std::to_string(vpp) + "` with `pp = 1`: there is no pipeline to interleave");
    d.At({"parallel.vpp"}, "virtual chunks need pipeline stages");
    d.Field("parallel.pp", pp);
    d.Note(
        "virtual pipeline chunks interleave the layers of several pipeline ranks; Megatron-LM: "
        "\"When interleaved schedule is used, pipeline-model-parallel size should be greater than "
        "1\"");
    d.Help("remove `vpp`, or use `pp` > 1");
    d.Report();
    return;
  }

  // balance = cost / nanotron choose the split themselves (no divisibility needed); the pipeline
  // partition (analyze/partition.h) reports what cannot be built, as P0602/P0603.
  if (pipe.balance != Balance::kEven) return;

  // An explicit list excludes every other way to split.
  if (!pipe.stage_layers.empty()) {
    if (has_f || has_k || e || l) {
      RuleDiag d(ctx, DiagKind::kStageLayersConflict,
                 "`stage_layers` is given together with other ways to split the layers");
      d.At({"pipeline.stage_layers"}, "an explicit split");
      if (has_f) d.Field("pipeline.first_stage_layers", *pipe.first_stage_layers);
      if (has_k) d.Field("pipeline.last_stage_layers", *pipe.last_stage_layers);
      if (e) d.Field("pipeline.account_for_embedding", "true");
      if (l) d.Field("pipeline.account_for_loss", "true");
      d.Note(
          "an explicit list decides every stage by itself (Megatron-LM: "
          "\"pipeline_model_parallel_layout cannot be set with other pipeline layout arguments\")");
      d.Help("keep `stage_layers` and remove the other split options, or remove `stage_layers`");
      d.Report();
      return;
    }
    const int64_t n = static_cast<int64_t>(pipe.stage_layers.size());
    auto chunks = CheckedMul(pp, vpp);
    if (n != pp && (!chunks || n != *chunks)) {
      RuleDiag d(ctx, DiagKind::kStageLayersLength,
                 "`stage_layers` has " + std::to_string(n) +
                     " entries for `pp = " + std::to_string(pp) + "`" +
                     (vpp > 1 ? " and `vpp = " + std::to_string(vpp) + "`" : std::string()));
      d.At({"pipeline.stage_layers"}, std::to_string(n) + " entries");
      d.Field("parallel.pp", pp);
      if (vpp > 1) d.Field("parallel.vpp", vpp);
      d.Note(
          "the list gives the layers of each pipeline stage (pp entries) or of each virtual chunk "
          "in "
          "pipeline order (pp · vpp entries)");
      if (ctx.helps()) {
        auto even = EvenSplit(L, pp);
        if (ctx.Fixes({{"pipeline.stage_layers", ListText(even)}}, DiagKind::kStageLayersLength)) {
          d.Help("for example `stage_layers = " + ListText(even) + "`");
        }
      }
      d.Report();
      return;
    }
    int64_t sum = 0;
    bool overflow = false;
    for (int64_t v : pipe.stage_layers) overflow = overflow || __builtin_add_overflow(sum, v, &sum);
    if (overflow) sum = INT64_MAX;  // reported as a sum that is not the layer count
    if (sum != L) {
      RuleDiag d(ctx, DiagKind::kStageLayersSum,
                 "`stage_layers` adds up to " + std::to_string(sum) +
                     " layers, but the model has " + std::to_string(L));
      d.At({"pipeline.stage_layers"}, "adds up to " + std::to_string(sum));
      d.Field("model.layers", L);
      d.Value("sum(stage_layers)",
              List(pipe.stage_layers) + " → " + std::to_string(sum) + " ≠ " + std::to_string(L));
      d.Note("every transformer layer belongs to exactly one stage");
      if (ctx.helps()) {
        auto even = EvenSplit(L, n);
        if (ctx.Fixes({{"pipeline.stage_layers", ListText(even)}}, DiagKind::kStageLayersSum)) {
          d.Help("an even split of " + std::to_string(L) +
                 " layers: `stage_layers = " + ListText(even) + "`");
        }
      }
      d.Report();
      return;
    }
    if (n == pp && vpp > 1) {
      for (int64_t i = 0; i < n; ++i) {
        if (pipe.stage_layers[i] % vpp == 0) continue;
        RuleDiag d(ctx, DiagKind::kLayersNotDivisibleByVpp,
                   "stage " + std::to_string(i) + " has " + std::to_string(pipe.stage_layers[i]) +
                       " layers, which do not split into `vpp = " + std::to_string(vpp) +
                       "` chunks");
        d.At({"pipeline.stage_layers"}, "stage " + std::to_string(i) + ": " +
                                            std::to_string(pipe.stage_layers[i]) + " layers");
        d.Field("parallel.vpp", vpp);
        d.Note(
            "each pipeline rank runs vpp virtual chunks with the same number of layers; give pp · "
            "vpp "
            "entries to size the chunks one by one");
        d.Report();
        return;
      }
    }
    return;
  }

  if ((has_f || has_k) && (e || l)) {
    RuleDiag d(ctx, DiagKind::kStageOverridesWithAccounting,
               "first/last stage overrides and embedding/loss accounting are both given");
    d.At({has_f ? "pipeline.first_stage_layers" : "pipeline.last_stage_layers"},
         "an explicit stage size");
    if (has_f) d.Field("pipeline.first_stage_layers", *pipe.first_stage_layers);
    if (has_k) d.Field("pipeline.last_stage_layers", *pipe.last_stage_layers);
    if (e) d.Field("pipeline.account_for_embedding", "true");
    if (l) d.Field("pipeline.account_for_loss", "true");
    d.Note(
        "both decide how many layers the first and last stages hold, so Megatron-Core takes only "
        "one "
        "(\"num_layers_in_first_pipeline_stage and num_layers_in_last_pipeline_stage cannot be set "
        "at "
        "the same time with account_for_embedding_in_pipeline_split and "
        "account_for_loss_in_pipeline_split\")");
    d.Help("remove the accounting flags and keep the overrides, or the other way round");
    d.Report();
    return;
  }

  if (has_f || has_k) {
    for (auto [path, value] : {std::pair<std::string_view, std::optional<int64_t>>{
                                   "pipeline.first_stage_layers", pipe.first_stage_layers},
                               {"pipeline.last_stage_layers", pipe.last_stage_layers}}) {
      if (value && *value < 1) {
        RuleDiag d(ctx, DiagKind::kStageLayersNotPositive,
                   "`" + std::string(ShortName(path)) + " = " + std::to_string(*value) +
                       "` leaves the stage without layers");
        d.At({path}, "must be at least 1");
        d.Note(
            "an override gives its stage a number of transformer layers, at least one "
            "(Megatron-Core: "
            "\"num_layers_in_first_pipeline_stage must be larger than 0\")");
        d.Help("remove `" + std::string(ShortName(path)) +
               "` for an even split, or set it to 1 or more");
        d.Report();
        return;
      }
    }
    const int64_t F = pipe.first_stage_layers.value_or(0);
    const int64_t K = pipe.last_stage_layers.value_or(0);
    const int64_t middle_stages = pp - (has_f ? 1 : 0) - (has_k ? 1 : 0);
    const int64_t middle = L - F - K;
    bool ok = middle >= 0 && (middle > 0) == (middle_stages > 0) &&
              (middle_stages <= 0 || middle % middle_stages == 0);
    if (!ok) {
      std::string what =
          middle < 0 ? "the overrides ask for " + std::to_string(F + K) + " of " +
                           std::to_string(L) + " layers"
          : middle_stages <= 0 ? std::to_string(middle) + " layers are left but no middle stage"
          : middle == 0
              ? "no layers are left for " + std::to_string(middle_stages) + " middle stages"
              : std::to_string(middle) + " remaining layers do not split over " +
                    std::to_string(middle_stages) + " middle stages";
      RuleDiag d(ctx, DiagKind::kMiddleLayersVsStages, what);
      d.At({has_f ? "pipeline.first_stage_layers" : "pipeline.last_stage_layers"},
           "fixes the first/last stage");
      d.Field("model.layers", L);
      if (has_f) d.Field("pipeline.first_stage_layers", F);
      if (has_k) d.Field("pipeline.last_stage_layers", K);
      d.Field("parallel.pp", pp);
      d.Value("layers - first - last", Dot({L}) + " - " + std::to_string(F) + " - " +
                                           std::to_string(K) + " = " + std::to_string(middle));
      d.Value("middle stages", std::to_string(middle_stages));
      d.Note(
          "the layers not given to the first and last stage are split evenly over the other stages "
          "(Megatron-Core: \"number of layers at middle stage: " +
          std::to_string(middle) +
          " must be divisible by the middle pipeline model parallel size " +
          std::to_string(middle_stages) + "\")");
      if (ctx.helps() && middle_stages > 0) {
        // Nearby first/last sizes that make the middle split.
        for (int64_t delta = 1; delta <= 8; ++delta) {
          std::vector<FieldChange> change;
          int64_t nf = F, nk = K;
          for (int64_t sign : {-1, 1}) {
            nf = has_f ? F + sign * delta : F;
            nk = has_k ? K : K;
            if (!has_f) nk = K + sign * delta;
            std::vector<FieldChange> c;
            if (has_f) c.push_back({"pipeline.first_stage_layers", nf});
            if (has_k) c.push_back({"pipeline.last_stage_layers", nk});
            auto cand = ctx.Changed(c);
            if (cand && ctx.Fixes(*cand, DiagKind::kMiddleLayersVsStages)) {
              d.Help(
                  has_f
                      ? "`first_stage_layers = " + std::to_string(nf) + "` splits the rest evenly"
                      : "`last_stage_layers = " + std::to_string(nk) + "` splits the rest evenly");
              delta = 99;
              break;
            }
          }
        }
      }
      d.Report();
      return;
    }
    if (vpp > 1) {
      int64_t per = middle_stages > 0 ? middle / middle_stages : 0;
      for (auto [name, value] :
           {std::pair<std::string_view, int64_t>{"first stage", has_f ? F : -1},
            {"last stage", has_k ? K : -1},
            {"middle stages", middle_stages > 0 ? per : -1}}) {
        if (value < 0 || value % vpp == 0) continue;
        RuleDiag d(ctx, DiagKind::kLayersNotDivisibleByVpp,
                   "the " + std::string(name) + " " +
                       (name == "middle stages" ? "hold " : "holds ") + std::to_string(value) +
                       " layers each, which do not split into `vpp = " + std::to_string(vpp) +
                       "` chunks");
        d.At({"parallel.vpp"}, "virtual chunks per pipeline rank");
        if (has_f) d.Field("pipeline.first_stage_layers", F);
        if (has_k) d.Field("pipeline.last_stage_layers", K);
        d.Field("model.layers", L);
        d.Value(std::string(name) + " % vpp", std::to_string(value) + " % " + std::to_string(vpp) +
                                                  " = " + std::to_string(value % vpp));
        d.Note(
            "each pipeline rank's layers are cut into vpp equal virtual chunks (Megatron-Core: "
            "\"number of "
            "layers at first stage: ... must be divisible by virtual pipeline parallel degree " +
            std::to_string(vpp) + "\")");
        d.Report();
        return;
      }
    }
    return;
  }

  // Even split, with the embedding and the loss counted as layers when asked.
  const int64_t total = L + e + l;
  if (total % pp != 0) {
    std::string counted = std::to_string(L);
    if (e) counted += " + 1";
    if (l) counted += " + 1";
    RuleDiag d(ctx, DiagKind::kLayersNotDivisibleByPp,
               (e || l ? "the " + std::to_string(L) + " layers" +
                             (e && l ? " plus embedding and loss ("
                                     : " plus " + std::string(e ? "embedding" : "loss") + " (") +
                             std::to_string(total) + ")"
                       : "the " + std::to_string(L) + " layers") +
                   " do not split evenly over `pp = " + std::to_string(pp) + "` stages");
    d.At({"parallel.pp"},
         std::to_string(total) + " / " + std::to_string(pp) + " = " + Ratio(total, pp));
    d.Field("model.layers", L);
    if (e) d.Field("pipeline.account_for_embedding", "true");
    if (l) d.Field("pipeline.account_for_loss", "true");
    d.Value(
        e || l ? "layers" + std::string(e ? " + embedding" : "") + (l ? " + loss" : "") : "layers",
        (e || l ? counted + " = " : std::string()) + std::to_string(total) + ", and " +
            std::to_string(total) + " % " + std::to_string(pp) + " = " +
            std::to_string(total % pp));
    d.Note(std::string(e || l ? "with account_for_embedding/account_for_loss the embedding and the "
                                "loss count as one layer each, and "
                              : "") +
           "the pipeline split gives every stage the same number of layers (Megatron-LM: \"Number "
           "of layers "
           "should be divisible by the pipeline-model-parallel size\")");
    if (ctx.helps()) {
      auto ok =
          ctx.WorkingValues("parallel.pp", AxisCandidates(p), DiagKind::kLayersNotDivisibleByPp, 6);
      if (!ok.empty())
        d.Help("values of `pp` that split " + std::to_string(total) +
               " evenly and fit the cluster: " + List(ok));
      if (e || l) {
        std::vector<std::pair<std::vector<FieldChange>, std::string>> toggles;
        if (e && l)
          toggles.push_back(
              {{{"pipeline.account_for_embedding", false}, {"pipeline.account_for_loss", false}},
               "without both accounting flags"});
        if (e)
          toggles.push_back(
              {{{"pipeline.account_for_embedding", false}}, "without `account_for_embedding`"});
        if (l)
          toggles.push_back({{{"pipeline.account_for_loss", false}}, "without `account_for_loss`"});
        for (auto& [changes, words] : toggles) {
          auto cand = ctx.Changed(changes);
          if (!cand || !ctx.Fixes(*cand, DiagKind::kLayersNotDivisibleByPp)) continue;
          int64_t t = cand->model.layers + cand->pipeline.account_for_embedding +
                      cand->pipeline.account_for_loss;
          d.Help(words + ": " + std::to_string(t) + " / " + std::to_string(pp) + " = " +
                 std::to_string(t / pp) + " per stage");
          break;
        }
        auto split = AccountedSplit(L, pp, e, l);
        if (split) {
          std::string text = ListText(*split);
          auto cand = ctx.Changed({{"pipeline.stage_layers", text},
                                   {"pipeline.account_for_embedding", false},
                                   {"pipeline.account_for_loss", false}});
          if (cand && ctx.Fixes(*cand, DiagKind::kLayersNotDivisibleByPp)) {
            d.Help("or split unevenly with `stage_layers = " + text +
                   "` in place of the accounting flags (the "
                   "embedding rides on stage 0, the loss on the last stage)");
          }
        }
      } else {
        // Megatron-Core's own ways out: count the embedding and the loss as layers
        // (--account-for-embedding/loss-in-pipeline-split), or give the first and last stages
        // their own counts (--decoder-first/last-pipeline-num-layers).
        const std::pair<std::vector<FieldChange>, std::string> accounting[] = {
            {{{"pipeline.account_for_embedding", true}, {"pipeline.account_for_loss", true}},
             "`account_for_embedding = true` and `account_for_loss = true`"},
            {{{"pipeline.account_for_embedding", true}}, "`account_for_embedding = true`"},
            {{{"pipeline.account_for_loss", true}}, "`account_for_loss = true`"}};
        for (const auto& [changes, words] : accounting) {
          auto cand = ctx.Changed(changes);
          if (!cand || !ctx.Fixes(*cand, DiagKind::kLayersNotDivisibleByPp)) continue;
          const int64_t t = cand->model.layers + cand->pipeline.account_for_embedding +
                            cand->pipeline.account_for_loss;
          d.Help("count the embedding and loss as layers with " + words + ": " + std::to_string(t) +
                 " / " + std::to_string(pp) + " = " + std::to_string(t / pp) + " per stage");
          break;
        }
        if (pp > 2) {
          // Middle stages of m layers, the first and last with what is left, split as evenly as
          // possible (never more than m each).
          for (int64_t m = (L + pp - 1) / pp; m <= L / (pp - 2); ++m) {
            const int64_t rest = L - m * (pp - 2);
            const int64_t first = rest / 2, last = rest - first;
            if (first > m || last > m || first < 1) continue;
            auto cand = ctx.Changed(
                {{"pipeline.first_stage_layers", first}, {"pipeline.last_stage_layers", last}});
            if (cand && ctx.Fixes(*cand, DiagKind::kLayersNotDivisibleByPp)) {
              d.Help("or give the first and last stages their own counts: `first_stage_layers = " +
                     std::to_string(first) + "` and `last_stage_layers = " + std::to_string(last) +
                     "` (" + std::to_string(m) + " on each of the other " + std::to_string(pp - 2) +
                     ")");
            }
            break;
          }
        }
        auto split = EvenSplit(L, pp);
        std::reverse(split.begin(), split.end());  // lighter stages first: they hold the embedding
        std::string text = ListText(split);
        if (vpp == 1 &&
            ctx.Fixes({{"pipeline.stage_layers", text}}, DiagKind::kLayersNotDivisibleByPp)) {
          d.Help("or split unevenly with `stage_layers = " + text + "`");
        }
      }
      if (vpp > 1) {
        d.Help("with `vpp = " + std::to_string(vpp) +
               "` every stage's layers must also split into " + std::to_string(vpp) +
               " chunks, and `stage_layers` lists one entry per chunk (pp · vpp = " +
               std::to_string(pp * vpp) + " entries, chunk by chunk)");
      }
    }
    d.Report();
    return;
  }
  if (vpp > 1 && (total / pp) % vpp != 0) {
    int64_t per = total / pp;
    RuleDiag d(ctx, DiagKind::kLayersNotDivisibleByVpp,
               "each pipeline stage holds " + std::to_string(per) +
                   (e || l ? " layer slots" : " layers") +
                   ", which do not split into `vpp = " + std::to_string(vpp) + "` virtual chunks");
    d.At({"parallel.vpp"},
         std::to_string(per) + " / " + std::to_string(vpp) + " = " + Ratio(per, vpp));
    d.Field("model.layers", L).Field("parallel.pp", pp);
    if (e) d.Field("pipeline.account_for_embedding", "true");
    if (l) d.Field("pipeline.account_for_loss", "true");
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
      std::vector<int64_t> cands = Divisors(per);
      auto ok = ctx.WorkingValues("parallel.vpp", cands, DiagKind::kLayersNotDivisibleByVpp, 6);
      ok.erase(std::remove(ok.begin(), ok.end(), 1), ok.end());
      if (!ok.empty())
        d.Help("values of `vpp` that divide " + std::to_string(per) + ": " + List(ok));
      auto pps = ctx.WorkingValues("parallel.pp", AxisCandidates(p),
                                   DiagKind::kLayersNotDivisibleByVpp, 4);
      pps.erase(std::remove(pps.begin(), pps.end(), 1), pps.end());
      if (!pps.empty())
        d.Help("or keep `vpp = " + std::to_string(vpp) + "` with " + Choices("pp", pps));
    }
    d.Report();
  }
}

void CheckSchedule(RuleContext& ctx) {
  const Plan& p = ctx.plan();
  const int64_t pp = p.parallel.pp;
  const int64_t vpp = p.parallel.vpp;
  const Schedule schedule = p.pipeline.schedule;
  if (ctx.Poisoned({"parallel.vpp", "pipeline.schedule", "parallel.pp"})) return;
  if (vpp > 1 && schedule != Schedule::kInterleaved1F1B) {
    RuleDiag d(ctx, DiagKind::kScheduleVppConflict,
               "`vpp = " + std::to_string(vpp) + "` with `schedule = " +
                   std::string(ToString(schedule)) + "`, which runs one chunk per pipeline rank");
    d.At({"pipeline.schedule", "parallel.vpp"}, "does not interleave");
    d.Field("parallel.vpp", vpp);
    d.Note(
        "virtual pipeline chunks are what the interleaved 1F1B schedule runs; gpipe and 1f1b run "
        "one "
        "chunk per rank");
    d.Help("set `schedule = interleaved_1f1b`, or remove `vpp`");
    d.Report();
  } else if (vpp == 1 && schedule == Schedule::kInterleaved1F1B && pp > 1) {
    RuleDiag d(ctx, DiagKind::kInterleavedWithoutVpp,
               "`schedule = interleaved_1f1b` with `vpp = 1` runs plain 1F1B");
    d.At({"pipeline.schedule"}, "nothing to interleave");
    d.Field("parallel.vpp", vpp);
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
            ctx.Fixes({{"parallel.vpp", v}}, DiagKind::kInterleavedWithoutVpp))
          ok.push_back(v);
      }
      if (!ok.empty()) d.Help("values of `vpp` that split this plan's stages: " + List(ok));
      d.Help("or `schedule = 1f1b` to say what runs");
    }
    d.Report();
  }
}

void CheckMicrobatches(RuleContext& ctx) {
  const Plan& p = ctx.plan();
  const int64_t pp = p.parallel.pp;
  const int64_t vpp = p.parallel.vpp;
  if (pp <= 1 ||
      ctx.Poisoned({"parallel.pp", "parallel.vpp", "batch.global", "batch.micro", "parallel.dp"}))
    return;
  const int64_t m = p.Microbatches();
  if (m <= 0) return;  // the batch rule reports it
  auto per_step = CheckedMul(p.batch.micro, p.parallel.dp);
  if (!per_step) return;
  if (vpp > 1) {
    if (m % pp == 0) return;
    RuleDiag d(ctx, DiagKind::kInterleavedMicrobatches,
               std::to_string(m) + " microbatches per step " +
                   (m < pp ? "are fewer than" : "are not a multiple of") +
                   " `pp = " + std::to_string(pp) + "`, as the interleaved schedule needs");
    d.At({"batch.global", "parallel.vpp"}, std::to_string(m) + " microbatches");
    d.Field("batch.global", p.batch.global)
        .Field("batch.micro", p.batch.micro)
        .Field("parallel.dp", p.parallel.dp);
    d.Field("parallel.pp", pp).Field("parallel.vpp", vpp);
    d.Value("microbatches = global / (micro · dp)", std::to_string(p.batch.global) + " / (" +
                                                        Dot({p.batch.micro, p.parallel.dp}) +
                                                        ") = " + std::to_string(m));
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
      auto ok = ctx.WorkingValues("batch.global", cands, DiagKind::kInterleavedMicrobatches, 2);
      if (!ok.empty())
        d.Help("a global batch that gives a multiple of " + std::to_string(pp) +
               " microbatches: " + Choices("global", ok));
      if (ctx.Fixes({{"parallel.vpp", int64_t{1}}, {"pipeline.schedule", std::string("1f1b")}},
                    DiagKind::kInterleavedMicrobatches)) {
        d.Help("or give up interleaving: `vpp = 1` with `schedule = 1f1b`");
      }
    }
    d.Report();
    return;
  }
  if (m >= pp) return;
  RuleDiag d(ctx, DiagKind::kFewerMicrobatchesThanStages,
             "only " + std::to_string(m) + (m == 1 ? " microbatch" : " microbatches") +
                 " per step for `pp = " + std::to_string(pp) + "` pipeline stages");
  d.At({"batch.global", "parallel.pp"},
       std::to_string(m) + (m == 1 ? " microbatch" : " microbatches"));
  d.Field("batch.global", p.batch.global)
      .Field("batch.micro", p.batch.micro)
      .Field("parallel.dp", p.parallel.dp);
  d.Field("parallel.pp", pp);
  d.Value("microbatches = global / (micro · dp)", std::to_string(p.batch.global) + " / (" +
                                                      Dot({p.batch.micro, p.parallel.dp}) +
                                                      ") = " + std::to_string(m));
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
}

}  // namespace

void CheckPipeline(RuleContext& ctx) {
  CheckSplit(ctx);
  CheckSchedule(ctx);
  CheckMicrobatches(ctx);
}

}  // namespace paraplan::rules
