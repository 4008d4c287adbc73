// NeMo (megatron_gpt_config.yaml and launcher configs: trainer.*, model.*, model.optim.*) and
// Megatron-Bridge recipe overrides (model.*, train.*, optimizer.*, ddp.*), one YAML table. Simple
// OmegaConf interpolations (`${trainer.devices}`) are resolved against the file.
#include <regex>

#include "compiler/interop/config_tree.h"
#include "compiler/interop/readers.h"

namespace paraplan::interop {
namespace {

constexpr EnumChoice kNemoNorm[] = {{"rmsnorm", "rmsnorm"},
                                    {"layernorm", "layernorm"},
                                    {"RMSNorm", "rmsnorm"},
                                    {"LayerNorm", "layernorm"}};
constexpr EnumChoice kNemoActivation[] = {
    {"fast-swiglu", "swiglu"}, {"swiglu", "swiglu"}, {"gelu", "gelu"}};
constexpr EnumChoice kNemoPosition[] = {{"rope", "rope"}, {"learned_absolute", "learned"}};
constexpr EnumChoice kNemoRecompute[] = {{"full", "full"}, {"selective", "selective"}};
constexpr EnumChoice kNemoRecomputeMethod[] = {{"uniform", "uniform"}, {"block", "block"}};
constexpr EnumChoice kNemoDispatcher[] = {
    {"alltoall", "alltoall"}, {"allgather", "allgather"}, {"flex", "flex"}};
constexpr EnumChoice kNemoFp8Recipe[] = {{"delayed", "delayed"},
                                         {"tensorwise", "current"},
                                         {"blockwise", "blockwise"},
                                         {"mxfp8", "mxfp8"}};
constexpr EnumChoice kNemoPrecision[] = {{"bf16", "bf16"}, {"bf16-mixed", "bf16"},
                                         {"16", "fp16"},   {"16-mixed", "fp16"},
                                         {"32", "fp32"},   {"32-true", "fp32"}};

constexpr SettingRow kNemo[] = {
    {"trainer.num_nodes", fields::kClusterNodes, Convert::kInt},
    {"trainer.devices", fields::kClusterGpusPerNode, Convert::kInt},
    {"trainer.precision", fields::kPrecision, Convert::kEnum, {}, kNemoPrecision},
    {"trainer.max_steps", fields::kTrainSteps, Convert::kInt},
    {"model.micro_batch_size", fields::kBatchMicro, Convert::kInt},
    {"model.global_batch_size", fields::kBatchGlobal, Convert::kInt},
    {"model.tensor_model_parallel_size", fields::kParallelTp, Convert::kInt},
    {"model.pipeline_model_parallel_size", fields::kParallelPp, Convert::kInt},
    {"model.virtual_pipeline_model_parallel_size", fields::kParallelVpp, Convert::kInt},
    {"model.context_parallel_size", fields::kParallelCp, Convert::kInt},
    {"model.expert_model_parallel_size", fields::kParallelEp, Convert::kInt},
    {"model.expert_tensor_parallel_size", fields::kParallelEtp, Convert::kInt},
    {"model.sequence_parallel", fields::kParallelSp, Convert::kSwitch, "true"},
    {"model.ub_tp_comm_overlap", fields::kParallelTpCommOverlap, Convert::kSwitch, "true"},
    {"model.account_for_embedding_in_pipeline_split", fields::kPipelineAccountForEmbedding,
     Convert::kSwitch, "true"},
    {"model.account_for_loss_in_pipeline_split", fields::kPipelineAccountForLoss, Convert::kSwitch,
     "true"},
    {"model.num_layers_in_first_pipeline_stage", fields::kPipelineFirstStageLayers, Convert::kInt},
    {"model.num_layers_in_last_pipeline_stage", fields::kPipelineLastStageLayers, Convert::kInt},
    {"model.encoder_seq_length", fields::kModelSeqLen, Convert::kInt},
    {"model.seq_length", fields::kModelSeqLen, Convert::kInt},
    {"model.num_layers", fields::kModelLayers, Convert::kInt},
    {"model.hidden_size", fields::kModelHidden, Convert::kInt},
    {"model.ffn_hidden_size", fields::kModelFfnHidden, Convert::kInt},
    {"model.num_attention_heads", fields::kModelHeads, Convert::kInt},
    {"model.num_query_groups", fields::kModelKvHeads, Convert::kInt},
    {"model.kv_channels", fields::kModelHeadDim, Convert::kInt},
    {"model.vocab_size", fields::kModelVocab, Convert::kInt},
    {"model.make_vocab_size_divisible_by", fields::kModelVocabDivisor, Convert::kInt},
    {"model.normalization", fields::kModelNorm, Convert::kEnum, {}, kNemoNorm},
    {"model.activation", fields::kModelActivation, Convert::kEnum, {}, kNemoActivation},
    {"model.position_embedding_type", fields::kModelPosition, Convert::kEnum, {}, kNemoPosition},
    {"model.num_moe_experts", fields::kModelExperts, Convert::kInt},
    {"model.moe_router_topk", fields::kModelTopk, Convert::kInt},
    {"model.moe_ffn_hidden_size", fields::kModelMoeFfnHidden, Convert::kInt},
    {"model.activations_checkpoint_granularity",
     fields::kRecompute,
     Convert::kEnum,
     {},
     kNemoRecompute},
    {"model.recompute_granularity", fields::kRecompute, Convert::kEnum, {}, kNemoRecompute},
    {"model.fp8", fields::kPrecision, Convert::kSwitch, "fp8"},
    {"model.fp8_recipe", fields::kMixedPrecisionFp8, Convert::kEnum, {}, kNemoFp8Recipe},
    {"model.fp8_params", fields::kMixedPrecisionFp8Params, Convert::kSwitch, "true"},
    {"model.activations_checkpoint_method",
     fields::kActivationsRecomputeMethod,
     Convert::kEnum,
     {},
     kNemoRecomputeMethod},
    {"model.activations_checkpoint_num_layers", fields::kActivationsRecomputeLayers, Convert::kInt},
    {"model.recompute_method",
     fields::kActivationsRecomputeMethod,
     Convert::kEnum,
     {},
     kNemoRecomputeMethod},
    {"model.recompute_num_layers", fields::kActivationsRecomputeLayers, Convert::kInt},
    {"model.moe_token_dispatcher_type",
     fields::kMoeDispatcher,
     Convert::kEnum,
     {},
     kNemoDispatcher},
    {"model.seed", fields::kTrainSeed, Convert::kInt},
    {"model.optim.lr", fields::kOptimizerLr, Convert::kReal},
    {"model.optim.eps", fields::kOptimizerEps, Convert::kReal},
    {"trainer.gradient_clip_val", fields::kOptimizerClipGrad, Convert::kReal},
    {"model.optim.weight_decay", fields::kOptimizerWeightDecay, Convert::kReal},
    {"model.optim.sched.warmup_steps", fields::kOptimizerWarmupSteps, Convert::kInt},
    {"model.optim.sched.min_lr", fields::kOptimizerMinLr, Convert::kReal},
    // Megatron-Bridge's ConfigContainer overrides.
    {"train.global_batch_size", fields::kBatchGlobal, Convert::kInt},
    {"train.micro_batch_size", fields::kBatchMicro, Convert::kInt},
    {"train.train_iters", fields::kTrainSteps, Convert::kInt},
    {"optimizer.lr", fields::kOptimizerLr, Convert::kReal},
    {"optimizer.min_lr", fields::kOptimizerMinLr, Convert::kReal},
    {"optimizer.weight_decay", fields::kOptimizerWeightDecay, Convert::kReal},
    {"optimizer.adam_beta1", fields::kOptimizerBeta1, Convert::kReal},
    {"optimizer.adam_beta2", fields::kOptimizerBeta2, Convert::kReal},
    {"optimizer.adam_eps", fields::kOptimizerEps, Convert::kReal},
    {"optimizer.clip_grad", fields::kOptimizerClipGrad, Convert::kReal},
    {"optimizer.use_distributed_optimizer", fields::kOptimizerZero, Convert::kSwitch, "1"},
    {"ddp.use_distributed_optimizer", fields::kOptimizerZero, Convert::kSwitch, "1"},
    {"scheduler.lr_warmup_iters", fields::kOptimizerWarmupSteps, Convert::kInt},
};

constexpr SkippedRow kNemoSkipped[] = {
    {"model.recompute_modules", "no plan field yet: recomputed modules"},
    {"model.max_position_embeddings", "no plan field: the plan's sequence is the sequence length"},
    {"trainer.accelerator", "not a layout setting"},
    {"trainer.strategy", "not a layout setting"},
};

constexpr std::string_view kHandled[] = {"model.optim.name", "model.optim.betas",
                                         "model.recompute_modules",
                                         "model.share_embeddings_and_output_weights"};

}  // namespace

std::span<const SettingRow> NemoRows() { return kNemo; }

std::optional<PlanDraft> ReadNemo(const SourceManager& sm, uint32_t buffer, DiagnosticSink& sink) {
  auto entries = ReadYaml(sm, buffer, sink);
  if (!entries) return std::nullopt;
  // ${a.b} interpolations: the value of key a.b in the same file.
  const std::regex interpolation(R"(^\$\{([A-Za-z0-9_.]+)\}$)");
  for (ConfigEntry& e : *entries) {
    std::smatch m;
    if (e.type == ValueType::kString && std::regex_match(e.text, m, interpolation)) {
      if (const ConfigEntry* target = FindEntry(*entries, m[1].str()); target && target != &e) {
        e.text = target->text;
        e.type = target->type;
      }
    }
  }
  PlanDraft draft;
  draft.kind = ConfigKind::kNemo;
  draft.vocab_help = "add model.vocab_size (NeMo takes it from the tokenizer otherwise)";
  draft.Set(fields::kFramework, "megatron_core", {}, "NeMo runs on Megatron-Core");
  if (!ApplyRows(*entries, kNemo, kNemoSkipped, kHandled, draft, sink)) return std::nullopt;
  if (const ConfigEntry* o = FindEntry(*entries, "model.optim.name")) {
    if (o->text == "distributed_fused_adam" || o->text == "mcore_distributed_optim") {
      draft.Set(fields::kOptimizerZero, "1", o->range, "model.optim.name = " + o->text);
      draft.Set(fields::kOptimizerType, "adamw", o->range, "model.optim.name = " + o->text);
    } else if (o->text == "fused_adam" || o->text == "adamw" || o->text == "adam") {
      draft.Set(fields::kOptimizerType, "adamw", o->range, "model.optim.name = " + o->text);
    } else if (o->text == "sgd") {
      draft.Set(fields::kOptimizerType, "sgd", o->range, "model.optim.name = sgd");
    } else {
      draft.Skip("model.optim.name = " + o->text, o->range, "no plan optimizer of this name");
    }
  }
  if (const ConfigEntry* b = FindEntry(*entries, "model.optim.betas")) {
    if (b->items.size() == 2 && ParseReal(b->items[0]) && ParseReal(b->items[1])) {
      draft.Set(fields::kOptimizerBeta1, RealText(*ParseReal(b->items[0])), b->range,
                "betas[0] = " + b->items[0]);
      draft.Set(fields::kOptimizerBeta2, RealText(*ParseReal(b->items[1])), b->range,
                "betas[1] = " + b->items[1]);
    } else {
      sink.Report(Diag(DiagKind::kConfigBadValue,
                       "`model.optim.betas` expects a list of two numbers, got " + b->text)
                      .At(b->range));
      return std::nullopt;
    }
  }
  if (const ConfigEntry* t = FindEntry(*entries, "model.share_embeddings_and_output_weights")) {
    if (t->type != ValueType::kBool) {
      sink.Report(
          Diag(DiagKind::kConfigBadValue,
               "`model.share_embeddings_and_output_weights` expects a boolean, got " + t->text)
              .At(t->range));
      return std::nullopt;
    }
    draft.Set(fields::kModelTiedEmbeddings,
              t->text == "True"    ? "true"
              : t->text == "False" ? "false"
                                   : t->text,
              t->range, t->key + " = " + t->text);
  }
  if (const ConfigEntry* m = FindEntry(*entries, "model.recompute_modules")) {
    std::string names;
    for (const std::string& item : m->items) names += (names.empty() ? "" : ", ") + item;
    if (m->type != ValueType::kList) names = m->text;
    draft.Set(fields::kActivationsRecomputeModules, QuoteString(names), m->range,
              m->key + " = [" + m->text + "]");
  }
  if (auto vpp = draft.Find(fields::kParallelVpp);
      vpp && vpp->value != "1" && vpp->value != "null") {
    draft.Set(fields::kPipelineSchedule, "interleaved_1f1b", vpp->origin, vpp->source);
  }
  return draft;
}

}  // namespace paraplan::interop
