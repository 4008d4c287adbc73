// DeepSpeed: a ds_config JSON (ZeRO stage, offload, batch, precision, optimizer), alone or named
// by a Megatron-DeepSpeed launch script (`--deepspeed_config ds.json`), whose flags give the
// model and the parallel sizes; the JSON's settings win where both speak (DeepSpeed reads them).
#include <cmath>
#include <filesystem>

#include "compiler/interop/config_tree.h"
#include "compiler/interop/readers.h"

namespace paraplan::interop {
namespace {

constexpr EnumChoice kDsOffload[] = {{"cpu", "cpu"}, {"none", "none"}};
constexpr EnumChoice kDsOptimizer[] = {
    {"Adam", "adamw"}, {"AdamW", "adamw"}, {"FusedAdam", "adamw"}, {"SGD", "sgd"}};

constexpr SettingRow kDeepSpeed[] = {
    {"train_batch_size", fields::kBatchGlobal, Convert::kInt},
    {"train_micro_batch_size_per_gpu", fields::kBatchMicro, Convert::kInt},
    {"zero_optimization.stage", fields::kOptimizerZero, Convert::kInt},
    {"zero_optimization.offload_optimizer.device",
     fields::kOptimizerOffload,
     Convert::kEnum,
     {},
     kDsOffload},
    {"zero_optimization.offload_optimizer.ratio", fields::kOptimizerOffloadFraction,
     Convert::kReal},
    {"bf16.enabled", fields::kPrecision, Convert::kSwitch, "bf16"},
    {"fp16.enabled", fields::kPrecision, Convert::kSwitch, "fp16"},
    {"optimizer.type", fields::kOptimizerType, Convert::kEnum, {}, kDsOptimizer},
    {"optimizer.params.lr", fields::kOptimizerLr, Convert::kReal},
    {"optimizer.params.eps", fields::kOptimizerEps, Convert::kReal},
    {"optimizer.params.weight_decay", fields::kOptimizerWeightDecay, Convert::kReal},
    {"gradient_clipping", fields::kOptimizerClipGrad, Convert::kReal},
    {"scheduler.params.warmup_num_steps", fields::kOptimizerWarmupSteps, Convert::kInt},
};

constexpr SkippedRow kDeepSpeedSkipped[] = {
    {"gradient_accumulation_steps", "derived: global / (micro · dp), checked by the plan"},
    {"zero_optimization.offload_param.device", "no plan field yet: parameter offload"},
    {"zero_optimization.overlap_comm", "no plan field: the time model assumes overlap"},
    {"zero_optimization.contiguous_gradients", "not a layout setting"},
    {"zero_optimization.reduce_bucket_size", "no plan field: bucket sizes"},
    {"zero_optimization.allgather_bucket_size", "no plan field: bucket sizes"},
    {"zero_optimization.stage3_prefetch_bucket_size", "no plan field: bucket sizes"},
    {"zero_optimization.stage3_max_reuse_distance",
     "no plan field: the memory model takes DeepSpeed's default (1e9)"},
    {"zero_optimization.stage3_param_persistence_threshold",
     "no plan field: small parameters kept gathered"},
    {"steps_per_print", "not a layout setting"},
    {"scheduler.type", "the plan's schedule is linear warmup then cosine decay"},
    {"scheduler.params.total_num_steps", "the plan decays over train.steps"},
    {"scheduler.params.warmup_max_lr", "the peak rate is optimizer.params.lr"},
    {"scheduler.params.warmup_min_lr", "not a plan setting"},
    {"wall_clock_breakdown", "not a layout setting"},
    {"activation_checkpointing.partition_activations",
     "no plan field yet: partitioned activations"},
    {"activation_checkpointing.cpu_checkpointing", "no plan field yet: activation offload"},
};

constexpr std::string_view kHandled[] = {"optimizer.params.betas",
                                         "zero_optimization.stage3_max_live_parameters"};

bool ApplyDeepSpeedJson(std::span<const ConfigEntry> entries, PlanDraft& draft,
                        DiagnosticSink& sink) {
  if (!draft.Has(fields::kPrecision))
    draft.Set(fields::kPrecision, "fp32", {}, "DeepSpeed's default: no bf16 or fp16");
  if (!ApplyRows(entries, kDeepSpeed, kDeepSpeedSkipped, kHandled, draft, sink)) return false;
  if (const ConfigEntry* b = FindEntry(entries, "optimizer.params.betas")) {
    if (b->type != ValueType::kList || b->items.size() != 2 || !ParseReal(b->items[0]) ||
        !ParseReal(b->items[1])) {
      sink.Report(Diag(DiagKind::kConfigBadValue,
                       "`optimizer.params.betas` expects a list of two numbers, got " + b->text)
                      .At(b->range));
      return false;
    }
    draft.Set(fields::kOptimizerBeta1, RealText(*ParseReal(b->items[0])), b->range,
              "betas[0] = " + b->items[0]);
    draft.Set(fields::kOptimizerBeta2, RealText(*ParseReal(b->items[1])), b->range,
              "betas[1] = " + b->items[1]);
  }
  // A count DeepSpeed's own configurations write as a real (1e9): a whole number, at least 1.
  if (const ConfigEntry* m = FindEntry(entries, "zero_optimization.stage3_max_live_parameters")) {
    const std::optional<double> v = m->type == ValueType::kInt || m->type == ValueType::kReal
                                        ? ParseReal(m->text)
                                        : std::nullopt;
    if (!v || *v < 1 || *v > 1e18 || std::floor(*v) != *v) {
      sink.Report(Diag(DiagKind::kConfigBadValue,
                       "`zero_optimization.stage3_max_live_parameters` expects a whole number of "
                       "parameters, got " +
                           m->text)
                      .At(m->range));
      return false;
    }
    draft.Set(fields::kFsdpMaxLiveParams, std::to_string(static_cast<int64_t>(*v)), m->range,
              "stage3_max_live_parameters = " + m->text);
  }
  return true;
}

}  // namespace

std::span<const SettingRow> DeepSpeedRows() { return kDeepSpeed; }

std::optional<PlanDraft> ReadDeepSpeed(SourceManager& sm, uint32_t buffer, DiagnosticSink& sink,
                                       GivenCluster given) {
  std::string_view text = sm.Text(buffer);
  size_t first = text.find_first_not_of(" \t\r\n");
  if (first != std::string_view::npos && text[first] == '{') {
    auto entries = ReadJson(sm, buffer, sink);
    if (!entries) return std::nullopt;
    PlanDraft draft;
    draft.kind = ConfigKind::kDeepSpeed;
    if (!ApplyDeepSpeedJson(*entries, draft, sink)) return std::nullopt;
    sink.Report(
        Diag(DiagKind::kConfigMissing, "a DeepSpeed configuration alone names no model")
            .At({buffer, 0, 1}, "batch, ZeRO and precision only")
            .Note("the model and the parallel sizes are arguments of the training script")
            .Help("import the Megatron-DeepSpeed launch script that passes --deepspeed_config " +
                  std::string(sm.Name(buffer))));
    return std::nullopt;
  }
  // A Megatron-DeepSpeed launch script: its flags, then the JSON it names.
  auto draft = ReadMegatron(sm, buffer, sink, given);
  if (!draft) return std::nullopt;
  draft->kind = ConfigKind::kDeepSpeed;
  draft->Set(fields::kFramework, "deepspeed", {}, "a Megatron-DeepSpeed script runs on DeepSpeed");
  const DraftSkip* config = nullptr;
  for (const DraftSkip& s : draft->Skipped()) {
    if (s.text.rfind("--deepspeed_config ", 0) == 0 || s.text.rfind("--deepspeed-config ", 0) == 0)
      config = &s;
  }
  if (!config) {
    sink.Report(Diag(DiagKind::kConfigMissing, "the script passes no --deepspeed_config")
                    .At({buffer, 0, 1})
                    .Help("import it with --from=megatron, or add --deepspeed_config ds.json"));
    return std::nullopt;
  }
  std::string path = config->text.substr(config->text.find(' ') + 1);
  const SourceRange config_range = config->range;
  std::filesystem::path p(path);
  if (p.is_relative()) p = std::filesystem::path(std::string(sm.Name(buffer))).parent_path() / p;
  std::string error;
  auto json = sm.AddFile(p.string(), BufferKind::kFile, &error);
  if (!json) {
    sink.Report(Diag(DiagKind::kFileNotReadable,
                     "cannot read the DeepSpeed configuration '" + p.string() + "': " + error)
                    .At(config_range, "named here"));
    return std::nullopt;
  }
  auto entries = ReadJson(sm, *json, sink);
  if (!entries) return std::nullopt;
  if (!ApplyDeepSpeedJson(*entries, *draft, sink)) return std::nullopt;
  // Read here, so not "not imported".
  for (const char* flag : {"--deepspeed", "--deepspeed_config", "--deepspeed-config"})
    draft->Unskip(flag);
  return draft;
}

}  // namespace paraplan::interop
