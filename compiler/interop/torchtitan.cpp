// torchtitan job files (train_configs/*.toml): [parallelism] degrees with FSDP/HSDP,
// [activation_checkpoint], float8 through [model] converters, the model flavor, [training]
// batch and sequence, [optimizer], [lr_scheduler], [checkpoint].
#include <algorithm>

#include "compiler/base/checked.h"
#include "compiler/interop/config_tree.h"
#include "compiler/interop/readers.h"

namespace paraplan::interop {
namespace {

constexpr EnumChoice kTitanSchedule[] = {
    {"1F1B", "1f1b"}, {"GPipe", "gpipe"}, {"Interleaved1F1B", "interleaved_1f1b"}};
constexpr EnumChoice kTitanRecompute[] = {
    {"none", "none"}, {"selective", "selective"}, {"full", "full"}};
constexpr EnumChoice kTitanPrecision[] = {
    {"bfloat16", "bf16"}, {"float16", "fp16"}, {"float32", "fp32"}};
constexpr EnumChoice kTitanReduce[] = {{"float32", "fp32"}, {"bfloat16", "bf16"}};
constexpr EnumChoice kTitanOptimizer[] = {{"AdamW", "adamw"}, {"Adam", "adamw"}, {"SGD", "sgd"}};
// torchao's recipes: "tensorwise" (the default), "rowwise", and "rowwise_with_gw_hp" (row-wise,
// its weight gradient in high precision).
constexpr EnumChoice kTitanFp8Recipe[] = {
    {"tensorwise", "current"}, {"rowwise", "rowwise"}, {"rowwise_with_gw_hp", "rowwise"}};

constexpr SettingRow kTorchtitan[] = {
    {"parallelism.tensor_parallel_degree", fields::kParallelTp, Convert::kInt},
    {"parallelism.pipeline_parallel_degree", fields::kParallelPp, Convert::kInt},
    {"parallelism.context_parallel_degree", fields::kParallelCp, Convert::kInt},
    {"parallelism.expert_parallel_degree", fields::kParallelEp, Convert::kInt},
    {"parallelism.expert_tensor_parallel_degree", fields::kParallelEtp, Convert::kInt},
    {"parallelism.pipeline_parallel_schedule",
     fields::kPipelineSchedule,
     Convert::kEnum,
     {},
     kTitanSchedule},
    {"parallelism.enable_sequence_parallel", fields::kParallelSp, Convert::kSwitch, "true"},
    {"parallelism.enable_async_tensor_parallel", fields::kParallelTpCommOverlap, Convert::kSwitch,
     "true"},
    {"activation_checkpoint.mode", fields::kRecompute, Convert::kEnum, {}, kTitanRecompute},
    {"compile.enable", fields::kCompile, Convert::kSwitch, "true"},
    {"training.compile", fields::kCompile, Convert::kSwitch, "true"},
    {"training.mixed_precision_param", fields::kPrecision, Convert::kEnum, {}, kTitanPrecision},
    {"training.seq_len", fields::kModelSeqLen, Convert::kInt},
    {"training.mixed_precision_reduce",
     fields::kMixedPrecisionGrads,
     Convert::kEnum,
     {},
     kTitanReduce},
    {"training.steps", fields::kTrainSteps, Convert::kInt},
    {"training.max_norm", fields::kOptimizerClipGrad, Convert::kReal},
    {"training.seed", fields::kTrainSeed, Convert::kInt},
    {"training.global_batch_size", fields::kBatchGlobal, Convert::kInt},
    {"parallelism.pipeline_parallel_microbatch_size", fields::kBatchMicro, Convert::kInt},
    {"optimizer.name", fields::kOptimizerType, Convert::kEnum, {}, kTitanOptimizer},
    {"optimizer.lr", fields::kOptimizerLr, Convert::kReal},
    {"optimizer.eps", fields::kOptimizerEps, Convert::kReal},
    {"optimizer.weight_decay", fields::kOptimizerWeightDecay, Convert::kReal},
    {"optimizer.beta1", fields::kOptimizerBeta1, Convert::kReal},
    {"optimizer.beta2", fields::kOptimizerBeta2, Convert::kReal},
    {"lr_scheduler.warmup_steps", fields::kOptimizerWarmupSteps, Convert::kInt},
    {"checkpoint.folder", fields::kTrainCheckpointDir, Convert::kString},
    {"checkpoint.interval", fields::kTrainCheckpointEvery, Convert::kInt},
};

constexpr SkippedRow kTorchtitanSkipped[] = {
    {"activation_checkpoint.selective_ac_option",
     "no plan field yet: which layers or ops are recomputed"},
    {"parallelism.disable_loss_parallel", "no plan field: loss parallelism"},
    {"float8.enable_fsdp_float8_all_gather", "no plan field yet: fp8 all-gather"},
    {"float8.precompute_float8_dynamic_scale_for_fsdp", "no plan field yet: fp8 scaling"},
    {"job.dump_folder", "not a layout setting"},
    {"job.description", "not a layout setting"},
    {"training.dataset", "not a layout setting"},
    {"training.dataset_path", "not a layout setting"},
    {"model.tokenizer_path", "not a layout setting"},
    {"model.hf_assets_path", "not a layout setting"},
    {"checkpoint.enable_checkpoint", "not a layout setting"},
};

constexpr std::string_view kHandled[] = {"parallelism.data_parallel_shard_degree",
                                         "parallelism.data_parallel_replicate_degree",
                                         "training.local_batch_size",
                                         "training.batch_size",
                                         "model.name",
                                         "model.flavor",
                                         "model.converters",
                                         "float8.enable_float8_linear",
                                         "float8.recipe_name",
                                         "parallelism.fsdp_reshard_after_forward"};

// torchtitan's model flavors (torchtitan/models/*/__init__.py) that the stdlib has.
struct Flavor {
  std::string_view name, flavor, model;
};
constexpr Flavor kFlavors[] = {
    {"llama3", "8B", "llama3_8b"},          {"llama3", "70B", "llama3_70b"},
    {"llama3", "405B", "llama3_405b"},      {"llama2", "7B", "llama2_7b"},
    {"llama2", "70B", "llama2_70b"},        {"deepseek_v3", "671B", "deepseek_v3"},
    {"deepseek_v3", "236B", "deepseek_v2"}, {"qwen3", "30B-A3B", "qwen3_30b_a3b"},
};

// The model the job trains: [model] name and flavor, a stdlib model (checked by the writer).
bool ReadModelFlavor(std::span<const ConfigEntry> entries, uint32_t buffer, PlanDraft& draft,
                     DiagnosticSink& sink) {
  const ConfigEntry* name = FindEntry(entries, "model.name");
  const ConfigEntry* flavor = FindEntry(entries, "model.flavor");
  if (!name || !flavor) {
    sink.Report(
        Diag(DiagKind::kConfigMissing, "the job file names no model ([model] name and flavor)")
            .At({buffer, 0, 0})
            .Help("add [model] with name = \"llama3\" and flavor = \"8B\""));
    return false;
  }
  std::string source = "model.name = " + name->text + ", flavor = " + flavor->text;
  draft.stdlib_model_source = source;
  draft.stdlib_model_origin = flavor->range;
  for (const Flavor& f : kFlavors) {
    if (f.name == name->text && f.flavor == flavor->text) draft.stdlib_model = f.model;
  }
  if (draft.stdlib_model.empty()) draft.stdlib_model = name->text + "_" + flavor->text;
  return true;
}

// float8 training: the float8 converter on the model, or the older [float8] switch, and
// torchao's scaling recipe. False, with an error at its line, for a recipe torchao lacks.
bool ReadFloat8(std::span<const ConfigEntry> entries, PlanDraft& draft, DiagnosticSink& sink) {
  if (const ConfigEntry* c = FindEntry(entries, "model.converters")) {
    if (std::find(c->items.begin(), c->items.end(), "float8") != c->items.end()) {
      draft.Set(fields::kPrecision, "fp8", c->range, "model.converters = [" + c->text + "]");
      draft.Set(fields::kMixedPrecisionFp8, "current", c->range,
                "torchtitan's float8 scales per tensor (tensorwise)");
    }
  }
  if (const ConfigEntry* f = FindEntry(entries, "float8.enable_float8_linear");
      f && f->text == "true") {
    draft.Set(fields::kPrecision, "fp8", f->range, "float8.enable_float8_linear = true");
    draft.Set(fields::kMixedPrecisionFp8, "current", f->range,
              "torchtitan's float8 scales per tensor (tensorwise)");
  }
  // The scaling recipe; without the float8 converter torchtitan ignores it.
  const ConfigEntry* r = FindEntry(entries, "float8.recipe_name");
  if (!r) return true;
  const SettingRow recipe_row{
      "float8.recipe_name", fields::kMixedPrecisionFp8, Convert::kEnum, {}, kTitanFp8Recipe};
  std::string error;
  const std::optional<std::string> recipe = ConvertSetting(recipe_row, r->text, &error);
  if (!recipe) {
    sink.Report(Diag(DiagKind::kConfigBadValue, "`float8.recipe_name` " + error).At(r->range));
    return false;
  }
  if (draft.Has(fields::kMixedPrecisionFp8) && *recipe != "current")
    draft.Set(fields::kMixedPrecisionFp8, *recipe, r->range,
              "float8.recipe_name = \"" + r->text + "\"");
  return true;
}

// The floor of the decay, as a fraction of the peak rate.
bool ReadMinLrFactor(std::span<const ConfigEntry> entries, PlanDraft& draft, DiagnosticSink& sink) {
  const ConfigEntry* f = FindEntry(entries, "lr_scheduler.min_lr_factor");
  if (!f) return true;
  auto factor = ParseReal(f->text);
  const DraftSetting* lr = draft.Find(fields::kOptimizerLr);
  auto peak = lr ? ParseReal(lr->value) : std::optional<double>(8e-4);  // torchtitan's default lr
  if (!factor || (f->type != ValueType::kReal && f->type != ValueType::kInt)) {
    sink.Report(Diag(DiagKind::kConfigBadValue,
                     "`lr_scheduler.min_lr_factor` expects a number, got " + f->text)
                    .At(f->range));
    return false;
  }
  draft.Set(fields::kOptimizerMinLr, RealText(*factor * *peak), f->range,
            "min_lr_factor = " + f->text + " of lr");
  return true;
}

// FSDP / HSDP: dp = replicate · shard, each as the job file states it.
struct DataParallelDegrees {
  const ConfigEntry* shard = nullptr;
  const ConfigEntry* replicate = nullptr;
  int64_t shard_degree = -1;  // -1: the rest of the world
  int64_t replicate_degree = 1;
};

std::optional<DataParallelDegrees> ReadDataParallelDegrees(std::span<const ConfigEntry> entries,
                                                           DiagnosticSink& sink) {
  DataParallelDegrees d;
  d.shard = FindEntry(entries, "parallelism.data_parallel_shard_degree");
  d.replicate = FindEntry(entries, "parallelism.data_parallel_replicate_degree");
  if (d.shard) d.shard_degree = ParseInteger(d.shard->text).value_or(0);
  if (d.replicate) d.replicate_degree = ParseInteger(d.replicate->text).value_or(0);
  const bool bad_shard =
      d.shard && (d.shard->type != ValueType::kInt || d.shard_degree == 0 || d.shard_degree < -1);
  const bool bad_replicate =
      d.replicate && (d.replicate->type != ValueType::kInt || d.replicate_degree < 1);
  if (bad_shard || bad_replicate) {
    const ConfigEntry* bad = bad_shard ? d.shard : d.replicate;
    sink.Report(Diag(DiagKind::kConfigBadValue,
                     "`" + bad->key +
                         "` expects a positive integer (or -1 for the shard degree), got " +
                         bad->text)
                    .At(bad->range));
    return std::nullopt;
  }
  return d;
}

// Sharding over the shard group is ZeRO-3; the replicas of HSDP are the FSDP replicate group.
void SetFsdp(const DataParallelDegrees& d, PlanDraft& draft) {
  if (d.shard_degree != 1) {
    const ConfigEntry* at = d.shard ? d.shard : d.replicate;
    draft.Set(fields::kOptimizerZero, "3", at ? at->range : SourceRange{},
              d.shard ? d.shard->key + " = " + d.shard->text + " (FSDP)"
                      : "torchtitan's default: FSDP over the data-parallel ranks");
  }
  if (d.replicate_degree > 1 && d.shard_degree != 1) {
    draft.Set(fields::kFsdpReplicate, std::to_string(d.replicate_degree), d.replicate->range,
              d.replicate->key + " = " + d.replicate->text);
  }
}

bool ReadReshardAfterForward(std::span<const ConfigEntry> entries, PlanDraft& draft,
                             DiagnosticSink& sink) {
  const ConfigEntry* r = FindEntry(entries, "parallelism.fsdp_reshard_after_forward");
  if (!r) return true;
  if (r->text == "never" || r->text == "always") {
    draft.Set(fields::kFsdpReshardAfterForward, r->text == "always" ? "true" : "false", r->range,
              r->key + " = " + r->text);
  } else if (r->text != "default") {
    sink.Report(Diag(DiagKind::kConfigBadValue,
                     "`" + r->key + "` takes default, always or never, got " + r->text)
                    .At(r->range));
    return false;
  }
  return true;
}

// parallel.dp when the shard degree is stated (-1 leaves it to the world size). Pure
// replication (shard 1) takes its origin from the replicate degree, which alone sets it.
bool SetDataParallel(const DataParallelDegrees& d, PlanDraft& draft, DiagnosticSink& sink) {
  if (d.shard_degree == 1 && d.replicate) {
    draft.Set(fields::kParallelDp, std::to_string(d.replicate_degree), d.replicate->range,
              d.replicate->key + " = " + d.replicate->text);
  } else if (d.shard_degree > 0) {
    auto dp = CheckedMul(d.shard_degree, d.replicate_degree);
    if (!dp) {
      sink.Report(
          Diag(DiagKind::kConfigBadValue,
               "data_parallel_replicate_degree · data_parallel_shard_degree is past 64 bits")
              .At(d.shard->range));
      return false;
    }
    draft.Set(fields::kParallelDp, std::to_string(*dp), d.shard->range,
              "data_parallel_replicate_degree · data_parallel_shard_degree");
  }
  return true;
}

// The batch: local_batch_size per data-parallel rank (global_batch_size when given wins).
bool ReadLocalBatch(const ConfigEntry* local, PlanDraft& draft, DiagnosticSink& sink) {
  if (!local || draft.Has(fields::kBatchGlobal)) return true;
  auto v = ParseInteger(local->text);
  if (!v || local->type != ValueType::kInt) {
    sink.Report(Diag(DiagKind::kConfigBadValue,
                     "`" + local->key + "` expects an integer, got " + local->text)
                    .At(local->range));
    return false;
  }
  draft.Set(fields::kBatchGlobal, std::to_string(*v) + " * parallel.dp", local->range,
            local->key + " = " + local->text + " per data-parallel rank");
  return true;
}

// torchtitan's own choices where the job file is silent: sequence parallelism with tensor
// parallelism, and the microbatch.
void SetTorchtitanDefaults(const ConfigEntry* local, const ConfigEntry* sequence_parallel,
                           PlanDraft& draft) {
  // torchtitan's tensor parallelism shards the sequence between its layers unless the job file
  // turns that off (`parallelism.enable_sequence_parallel = false`, since March 2026; before,
  // it always did).
  const bool off = sequence_parallel && sequence_parallel->text == "false";
  if (const DraftSetting* tp = draft.Find(fields::kParallelTp); tp && tp->value != "1" && !off) {
    draft.Set(fields::kParallelSp, "true", tp->origin,
              "torchtitan's tensor parallelism is sequence-parallel by default");
  }
  const DraftSetting* pp = draft.Find(fields::kParallelPp);
  if (draft.Has(fields::kBatchMicro)) return;
  if (pp && pp->value != "1") {
    draft.Set(fields::kBatchMicro, "1", {},
              "torchtitan's default: pipeline_parallel_microbatch_size = 1");
  } else if (local) {
    // Without pipelining each rank runs its local batch at once.
    draft.Set(fields::kBatchMicro, local->text, local->range, local->key + " = " + local->text);
  }
}

}  // namespace

std::span<const SettingRow> TorchtitanRows() { return kTorchtitan; }

std::optional<PlanDraft> ReadTorchtitan(const SourceManager& sm, uint32_t buffer,
                                        DiagnosticSink& sink) {
  auto entries = ReadToml(sm, buffer, sink);
  if (!entries) return std::nullopt;
  PlanDraft draft;
  draft.kind = ConfigKind::kTorchtitan;
  draft.vocab_help = "name a model flavor the stdlib has ([model] name and flavor)";
  draft.Set(fields::kFramework, "torchtitan", {}, "a torchtitan job file");
  // torchtitan trains in bf16 with fp32 reductions unless told otherwise.
  draft.Set(fields::kPrecision, "bf16", {},
            "torchtitan's default: mixed_precision_param = \"bfloat16\"");
  if (!ApplyRows(*entries, kTorchtitan, kTorchtitanSkipped, kHandled, draft, sink))
    return std::nullopt;
  // A checkpoint folder with checkpointing off saves nothing.
  if (const ConfigEntry* on = FindEntry(*entries, "checkpoint.enable_checkpoint");
      on && on->text == "false") {
    draft.Erase(fields::kTrainCheckpointDir);
    draft.Erase(fields::kTrainCheckpointEvery);
  }
  if (!ReadModelFlavor(*entries, buffer, draft, sink)) return std::nullopt;
  if (!ReadFloat8(*entries, draft, sink) || !ReadMinLrFactor(*entries, draft, sink))
    return std::nullopt;
  auto degrees = ReadDataParallelDegrees(*entries, sink);
  if (!degrees) return std::nullopt;
  SetFsdp(*degrees, draft);
  if (!ReadReshardAfterForward(*entries, draft, sink) || !SetDataParallel(*degrees, draft, sink))
    return std::nullopt;
  const ConfigEntry* local = FindEntry(*entries, "training.local_batch_size");
  if (!local) local = FindEntry(*entries, "training.batch_size");
  if (!ReadLocalBatch(local, draft, sink)) return std::nullopt;
  SetTorchtitanDefaults(local, FindEntry(*entries, "parallelism.enable_sequence_parallel"), draft);
  return draft;
}

}  // namespace paraplan::interop
