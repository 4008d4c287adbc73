// NeMo (megatron_gpt_config.yaml and launcher configs: trainer.*, model.*, model.optim.*) and
// Megatron-Bridge ConfigContainers and their overrides (model.* with Megatron-Core's
// TransformerConfig names, train.*, optimizer.*, ddp.*, mixed_precision.*), one YAML table. Simple
// OmegaConf interpolations (`${trainer.devices}`) are resolved against the file. Settings that need
// more than one key (the gradient precision, the router's balancing, shared experts, MoE layer
// frequency, MLA head size, fp8 switches and presets) are read after the table.
#include <algorithm>
#include <cctype>
#include <regex>

#include "compiler/base/checked.h"
#include "compiler/interop/config_tree.h"
#include "compiler/interop/pipeline_layout.h"
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
constexpr EnumChoice kNemoRouterScore[] = {{"softmax", "softmax"}, {"sigmoid", "sigmoid"}};
constexpr EnumChoice kNemoDropPolicy[] = {{"probs", "probs"}, {"position", "position"}};
constexpr EnumChoice kNemoOptimizer[] = {{"adam", "adamw"}, {"sgd", "sgd"}};

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
    {"optimizer.optimizer", fields::kOptimizerType, Convert::kEnum, {}, kNemoOptimizer},
    {"optimizer.optimizer_cpu_offload", fields::kOptimizerOffload, Convert::kSwitch, "cpu"},
    {"optimizer.optimizer_offload_fraction", fields::kOptimizerOffloadFraction, Convert::kReal},
    {"checkpoint.save", fields::kTrainCheckpointDir, Convert::kString},
    {"checkpoint.save_interval", fields::kTrainCheckpointEvery, Convert::kInt},
    {"rng.seed", fields::kTrainSeed, Convert::kInt},
    {"dist.use_tp_pp_dp_mapping", fields::kParallelOrder, Convert::kSwitch, "\"tp-cp-ep-pp-dp\""},
    // Megatron-Core's TransformerConfig names (the Megatron-LM flag with underscores), as
    // Megatron-Bridge's model providers spell them.
    {"model.tp_comm_overlap", fields::kParallelTpCommOverlap, Convert::kSwitch, "true"},
    {"comm_overlap.tp_comm_overlap", fields::kParallelTpCommOverlap, Convert::kSwitch, "true"},
    {"model.gated_linear_unit", fields::kModelActivation, Convert::kSwitch, "swiglu"},
    {"model.qk_layernorm", fields::kModelQkNorm, Convert::kSwitch, "true"},
    {"model.mtp_num_layers", fields::kModelMtpLayers, Convert::kInt},
    {"model.mtp_loss_scaling_factor", fields::kModelMtpLossScale, Convert::kReal},
    {"model.q_lora_rank", fields::kModelQLoraRank, Convert::kInt},
    {"model.kv_lora_rank", fields::kModelKvLoraRank, Convert::kInt},
    {"model.qk_head_dim", fields::kModelQkNopeHeadDim, Convert::kInt},
    {"model.qk_pos_emb_head_dim", fields::kModelQkRopeHeadDim, Convert::kInt},
    {"model.v_head_dim", fields::kModelVHeadDim, Convert::kInt},
    {"model.cpu_offloading_num_layers", fields::kActivationsOffloadLayers, Convert::kInt},
    {"model.moe_expert_capacity_factor", fields::kMoeCapacityFactor, Convert::kReal},
    {"model.moe_token_drop_policy", fields::kMoeDropPolicy, Convert::kEnum, {}, kNemoDropPolicy},
    {"model.moe_router_score_function",
     fields::kModelRouterScore,
     Convert::kEnum,
     {},
     kNemoRouterScore},
    {"model.moe_router_pre_softmax", fields::kModelRouterTopkNorm, Convert::kSwitch, "false"},
    {"model.moe_aux_loss_coeff", fields::kModelRouterAuxCoeff, Convert::kReal},
    {"model.moe_router_num_groups", fields::kModelRouterGroups, Convert::kInt},
    {"model.moe_router_group_topk", fields::kModelRouterGroupTopk, Convert::kInt},
    {"model.moe_router_topk_scaling_factor", fields::kModelRouterScale, Convert::kReal},
    {"model.bf16", fields::kPrecision, Convert::kSwitch, "bf16"},
    {"model.fp16", fields::kPrecision, Convert::kSwitch, "fp16"},
    {"model.fp8_param", fields::kMixedPrecisionFp8Params, Convert::kSwitch, "true"},
    // Megatron-Bridge's MixedPrecisionConfig and DistributedDataParallelConfig.
    {"mixed_precision.bf16", fields::kPrecision, Convert::kSwitch, "bf16"},
    {"mixed_precision.fp16", fields::kPrecision, Convert::kSwitch, "fp16"},
    {"mixed_precision.fp8_recipe", fields::kMixedPrecisionFp8, Convert::kEnum, {}, kNemoFp8Recipe},
    {"mixed_precision.fp8_param", fields::kMixedPrecisionFp8Params, Convert::kSwitch, "true"},
    {"mixed_precision.fp8_param_gather", fields::kMixedPrecisionFp8Params, Convert::kSwitch,
     "true"},
    {"ddp.fp8_param_gather", fields::kMixedPrecisionFp8Params, Convert::kSwitch, "true"},
};

constexpr SkippedRow kNemoSkipped[] = {
    {"model.max_position_embeddings", "no plan field: the plan's sequence is the sequence length"},
    {"model.moe_grouped_gemm", "no plan field: a kernel choice"},
    {"model.moe_permute_fusion", "no plan field: a kernel choice"},
    {"model.fp8_amax_history_len", "no plan field yet: fp8 scaling"},
    {"model.fp8_amax_compute_algo", "no plan field yet: fp8 scaling"},
    {"mixed_precision.fp8_amax_history_len", "no plan field yet: fp8 scaling"},
    {"mixed_precision.fp8_amax_compute_algo", "no plan field yet: fp8 scaling"},
    {"mixed_precision.first_last_layers_bf16", "no plan field yet: layers kept in bf16 under fp8"},
    {"mixed_precision.num_layers_at_start_in_bf16",
     "no plan field yet: layers kept in bf16 under fp8"},
    {"mixed_precision.num_layers_at_end_in_bf16",
     "no plan field yet: layers kept in bf16 under fp8"},
    {"ddp.overlap_grad_reduce", "no plan field: the time model assumes overlap"},
    {"ddp.overlap_param_gather", "no plan field: the time model assumes overlap"},
    {"comm_overlap.overlap_grad_reduce", "no plan field: the time model assumes overlap"},
    {"comm_overlap.overlap_param_gather", "no plan field: the time model assumes overlap"},
    {"model.transformer_impl", "not a layout setting"},
    {"trainer.accelerator", "not a layout setting"},
    {"trainer.strategy", "not a layout setting"},
};

// Keys read beside the table, after it (below).
constexpr std::string_view kHandled[] = {"model.optim.name",
                                         "model.optim.betas",
                                         "model.recompute_modules",
                                         "model.share_embeddings_and_output_weights",
                                         "model.fp8",
                                         "mixed_precision",
                                         "mixed_precision.fp8",
                                         "ddp.grad_reduce_in_fp32",
                                         "mixed_precision.grad_reduce_in_fp32",
                                         "model.moe_router_load_balancing_type",
                                         "model.moe_router_enable_expert_bias",
                                         "model.moe_router_bias_update_rate",
                                         "model.moe_shared_expert_intermediate_size",
                                         "model.moe_layer_freq",
                                         "model.multi_latent_attention",
                                         "model.pipeline_model_parallel_layout"};

// A key's entry, unless it is absent or null (the framework's default).
const ConfigEntry* Stated(std::span<const ConfigEntry> entries, std::string_view key) {
  const ConfigEntry* e = FindEntry(entries, key);
  return e && e->type != ValueType::kNull ? e : nullptr;
}

// What the plan's comment names: "ddp.grad_reduce_in_fp32 = false".
std::string EntrySource(const ConfigEntry& e) {
  return e.key + " = " + (e.type == ValueType::kList ? "[" + e.text + "]" : e.text);
}

std::optional<bool> BoolValue(const ConfigEntry& e) {
  if (e.type != ValueType::kBool) return std::nullopt;
  return e.text == "true" || e.text == "True";
}

void BadValue(DiagnosticSink& sink, const ConfigEntry& e, std::string message,
              std::string help = {}) {
  Diag d(DiagKind::kConfigBadValue, std::move(message));
  d.At(e.range);
  if (!help.empty()) d.Help(std::move(help));
  sink.Report(std::move(d));
}

std::optional<int64_t> DraftInteger(const PlanDraft& draft, FieldId field) {
  const DraftSetting* s = draft.Find(field);
  return s ? ParseInteger(s->value) : std::nullopt;
}

// A YAML false states a value where a Megatron-LM switch can only be absent: a file that says
// `qk_layernorm: false` or `moe_router_pre_softmax: false` sets the plan's field, over a stdlib
// model's.
void ReadStatedFalse(std::span<const ConfigEntry> entries, PlanDraft& draft) {
  struct Negated {
    const char* key;
    FieldId field;
    const char* value;
  };
  for (const Negated& k :
       {Negated{"model.qk_layernorm", fields::kModelQkNorm, "false"},
        Negated{"model.moe_router_pre_softmax", fields::kModelRouterTopkNorm, "true"}}) {
    const ConfigEntry* e = Stated(entries, k.key);
    if (e && BoolValue(*e) == false) draft.Set(k.field, k.value, e->range, EntrySource(*e));
  }
}

// Megatron-Bridge's mixed-precision recipes by name (`mixed_precision: bf16_mixed`): the
// precision, the FP8 recipe and whether the weights are gathered in FP8.
struct PrecisionPreset {
  std::string_view name;
  std::string_view precision;
  std::string_view fp8;  // the plan's recipe; empty without FP8
  bool fp8_params;
};

constexpr PrecisionPreset kPrecisionPresets[] = {
    {"bf16_mixed", "bf16", "", false},
    {"fp16_mixed", "fp16", "", false},
    {"bf16_with_fp8_delayed_scaling_mixed", "fp8", "delayed", true},
    {"bf16_with_fp8_current_scaling_mixed", "fp8", "current", true},
    {"bf16_with_mxfp8_mixed", "fp8", "mxfp8", true},
    {"bf16_with_fp8_subchannel_scaling_mixed", "fp8", "blockwise", false},
};

// A recipe name sets what the file's own keys do not; FP8 wins over a bf16 precision (the FP8
// layers run on a bf16 model).
void ReadPrecisionPreset(std::span<const ConfigEntry> entries, PlanDraft& draft) {
  const ConfigEntry* e = Stated(entries, "mixed_precision");
  if (!e || e->type == ValueType::kTable) return;  // a table: mixed_precision.* keys
  std::string name = e->text;
  std::replace(name.begin(), name.end(), '-', '_');
  const auto* preset = std::find_if(std::begin(kPrecisionPresets), std::end(kPrecisionPresets),
                                    [&](const PrecisionPreset& p) { return p.name == name; });
  if (preset == std::end(kPrecisionPresets)) {
    draft.Skip(EntrySource(*e), e->range,
               "no plan precision for this mixed-precision recipe; state mixed_precision.* keys");
    return;
  }
  const std::string source = EntrySource(*e);
  if (preset->precision == "fp8" || !draft.Has(fields::kPrecision)) {
    draft.Set(fields::kPrecision, std::string(preset->precision), e->range, source);
  }
  if (!preset->fp8.empty() && !draft.Has(fields::kMixedPrecisionFp8)) {
    draft.Set(fields::kMixedPrecisionFp8, std::string(preset->fp8), e->range, source);
  }
  if (preset->fp8_params && !draft.Has(fields::kMixedPrecisionFp8Params)) {
    draft.Set(fields::kMixedPrecisionFp8Params, "true", e->range, source);
  }
}

// NeMo's `model.fp8: true`, and Megatron-Core's FP8 format (`fp8: hybrid`, the Megatron-LM flag
// --fp8-format) under model or mixed_precision: either turns FP8 on, over a bf16 precision.
bool ReadFp8Switches(std::span<const ConfigEntry> entries, PlanDraft& draft, DiagnosticSink& sink) {
  bool ok = true;
  for (const char* key : {"model.fp8", "mixed_precision.fp8"}) {
    const ConfigEntry* e = Stated(entries, key);
    if (!e) continue;
    std::string t;
    for (char c : e->text) t += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    const bool on = (e->type == ValueType::kBool && t == "true") ||
                    (e->type == ValueType::kString && (t == "e4m3" || t == "hybrid"));
    if (on) {
      draft.Set(fields::kPrecision, "fp8", e->range, EntrySource(*e));
    } else if (e->type != ValueType::kBool) {
      BadValue(sink, *e,
               "`" + e->key + "` takes true, false, e4m3 or hybrid, got '" + e->text + "'");
      ok = false;
    }
  }
  return ok;
}

// Megatron-Bridge's gradient buffers: `grad_reduce_in_fp32: false` under ddp or mixed_precision
// keeps the main gradients and their reduction in the model's 16-bit type (Megatron-LM's
// --grad-reduce-in-bf16); true keeps them in fp32. The mixed-precision setup copies its value into
// the DDP config, so two that disagree describe no one run.
bool ReadGradPrecision(std::span<const ConfigEntry> entries, PlanDraft& draft,
                       DiagnosticSink& sink) {
  std::vector<const ConfigEntry*> stated;
  for (const char* key : {"ddp.grad_reduce_in_fp32", "mixed_precision.grad_reduce_in_fp32"}) {
    const ConfigEntry* e = Stated(entries, key);
    if (!e) continue;
    if (e->type != ValueType::kBool) {
      BadValue(sink, *e, "`" + e->key + "` expects a boolean, got '" + e->text + "'",
               "false reduces gradients in bf16, true in fp32");
      return false;
    }
    stated.push_back(e);
  }
  if (stated.empty()) return true;
  std::sort(stated.begin(), stated.end(), [](const ConfigEntry* a, const ConfigEntry* b) {
    return a->range.begin < b->range.begin;
  });
  const ConfigEntry& first = *stated.front();
  const ConfigEntry& last = *stated.back();
  const bool fp32 = *BoolValue(last);
  const DraftSetting* precision = draft.Find(fields::kPrecision);
  const std::string half = precision && precision->value == "fp16" ? "fp16" : "bf16";
  if (*BoolValue(first) != fp32) {
    sink.Report(
        Diag(DiagKind::kConfigBadValue,
             "`" + EntrySource(last) + "` disagrees with `" + EntrySource(first) + "`")
            .At(last.range, fp32 ? "gradients reduced in fp32" : "gradients reduced in " + half)
            .Label(first.range,
                   *BoolValue(first) ? "gradients reduced in fp32" : "gradients reduced in " + half)
            .Note("Megatron-Bridge copies mixed_precision.grad_reduce_in_fp32 into the DDP "
                  "config; the file states two gradient precisions")
            .Help("set both to false (" + half +
                  " gradients, as Megatron-Bridge's performance recipes do) or both to true "
                  "(fp32 gradients)"));
    return false;
  }
  draft.Set(fields::kMixedPrecisionGrads, fp32 ? "fp32" : half, last.range, EntrySource(last));
  return true;
}

// Multi-latent attention: the query/key head is the no-position part plus the rotary part (what
// a plan's head_dim holds for an MLA model); kv_channels does not size it.
void ReadLatentAttention(std::span<const ConfigEntry> entries, PlanDraft& draft) {
  const ConfigEntry* mla = Stated(entries, "model.multi_latent_attention");
  if (mla && BoolValue(*mla).value_or(true) && !draft.Has(fields::kModelKvLoraRank)) {
    draft.Skip(EntrySource(*mla), mla->range,
               "multi-latent attention needs model.kv_lora_rank for a plan");
  }
  if (!draft.Has(fields::kModelKvLoraRank)) return;
  auto nope = DraftInteger(draft, fields::kModelQkNopeHeadDim);
  auto rope = DraftInteger(draft, fields::kModelQkRopeHeadDim);
  auto sum = nope && rope ? CheckedAdd(*nope, *rope) : std::nullopt;
  if (!sum) return;
  if (const DraftSetting* kv = draft.Find(fields::kModelHeadDim)) {
    draft.Skip(kv->source, kv->origin,
               "multi-latent attention sizes its heads by model.qk_head_dim and "
               "model.qk_pos_emb_head_dim");
  }
  const DraftSetting n = *draft.Find(fields::kModelQkNopeHeadDim);
  draft.Set(fields::kModelHeadDim, std::to_string(*sum), n.origin,
            "model.qk_head_dim + model.qk_pos_emb_head_dim");
}

// Shared experts are given by their total size: a count of experts of the routed size.
bool ReadSharedExperts(std::span<const ConfigEntry> entries, PlanDraft& draft,
                       DiagnosticSink& sink) {
  const ConfigEntry* sh = Stated(entries, "model.moe_shared_expert_intermediate_size");
  if (!sh) return true;
  const int64_t size = sh->type == ValueType::kInt ? ParseInteger(sh->text).value_or(-1) : -1;
  auto each = DraftInteger(draft, fields::kModelMoeFfnHidden);
  if (size < 0 || !each || *each <= 0 || size % *each != 0) {
    BadValue(sink, *sh,
             "`" + EntrySource(*sh) +
                 "` is not a whole number of experts of model.moe_ffn_hidden_size " +
                 (each ? std::to_string(*each) : std::string("?")),
             "a plan counts shared experts (model.shared_experts) of the routed experts' size");
    return false;
  }
  draft.Set(fields::kModelSharedExperts, std::to_string(size / *each), sh->range, EntrySource(*sh));
  return true;
}

// moe_layer_freq: k > 1, every k-th layer an MoE layer (model.moe_layer_freq); 1 (every layer),
// a list of 0s and 1s or a pattern `([0]*K+[1]*N)` with K leading dense layers, which is what a
// plan's model.dense_layers expresses.
void ReadMoeLayerFreq(std::span<const ConfigEntry> entries, PlanDraft& draft) {
  const ConfigEntry* f = Stated(entries, "model.moe_layer_freq");
  if (!f) return;
  const std::string source = EntrySource(*f);
  std::optional<int64_t> dense;
  if (f->type == ValueType::kInt) {
    auto k = ParseInteger(f->text);
    if (k && *k > 1) draft.Set(fields::kModelMoeLayerFreq, std::to_string(*k), f->range, source);
    if (k && *k >= 1) dense = 0;
  } else if (f->type == ValueType::kList) {
    // Each item one 0 or 1 (an empty list states no layer).
    bool ok = !f->items.empty();
    std::string list = "[";
    for (const std::string& item : f->items) {
      ok = ok && (item == "0" || item == "1");
      list += item + ",";
    }
    if (ok) dense = MoeListDenseLayers(list + "]");
  } else if (auto k = MoePatternDenseLayers(f->text)) {
    dense = ParseInteger(*k);
  }
  if (dense) {
    draft.Set(fields::kModelDenseLayers, std::to_string(*dense), f->range, source);
  } else {
    draft.Skip(source, f->range, "a plan has leading dense layers only (model.dense_layers)");
  }
}

// The router's balancing: the loss type (`none` turns the loss off) and the aux-loss-free expert
// bias, whose rate counts only with the switch (Megatron-Core's rate: 1e-3).
bool ReadRouterBalancing(std::span<const ConfigEntry> entries, PlanDraft& draft,
                         DiagnosticSink& sink) {
  const ConfigEntry* type = Stated(entries, "model.moe_router_load_balancing_type");
  const ConfigEntry* bias = Stated(entries, "model.moe_router_enable_expert_bias");
  const ConfigEntry* rate = Stated(entries, "model.moe_router_bias_update_rate");
  if (DraftInteger(draft, fields::kModelExperts).value_or(0) <= 0) {
    for (const ConfigEntry* e : {type, bias, rate}) {
      if (e) draft.Skip(EntrySource(*e), e->range, "the model has no experts (num_moe_experts)");
    }
    return true;
  }
  if (type && type->text == "none") {
    draft.Set(fields::kModelRouterAuxCoeff, "0", type->range, EntrySource(*type));
  } else if (type && type->text != "aux_loss") {
    draft.Skip(EntrySource(*type), type->range,
               "no plan field: priced as the batch-wise loss of model.router_aux_coeff");
  }
  const std::optional<bool> enabled = bias ? BoolValue(*bias) : std::optional<bool>(false);
  if (!enabled) {
    BadValue(sink, *bias,
             "`model.moe_router_enable_expert_bias` expects a boolean, got '" + bias->text + "'");
    return false;
  }
  if (!*enabled) {
    if (rate) {
      draft.Skip(EntrySource(*rate), rate->range,
                 "counts only with model.moe_router_enable_expert_bias = true");
    }
    return true;
  }
  if (!rate) {
    draft.Set(fields::kModelRouterBiasRate, "0.001", bias->range,
              EntrySource(*bias) + " (Megatron-Core's rate 1e-3)");
    return true;
  }
  const std::optional<double> r = ParseReal(rate->text);
  if (!r || !(*r >= 0)) {
    BadValue(sink, *rate, "`" + EntrySource(*rate) + "` is not a rate", "a rate is a number >= 0");
    return false;
  }
  draft.Set(fields::kModelRouterBiasRate, RealText(*r), rate->range, EntrySource(*rate));
  return true;
}

// Megatron-Core's pipeline layout, a string or (Megatron-Bridge) a list of lists of layer names:
// the plan's per-chunk stage_layers.
bool ReadPipelineLayout(std::span<const ConfigEntry> entries, PlanDraft& draft,
                        DiagnosticSink& sink) {
  const ConfigEntry* e = Stated(entries, "model.pipeline_model_parallel_layout");
  if (!e) return true;
  ParsedLayout layout;
  std::string source = EntrySource(*e);
  if (e->type == ValueType::kString) {
    layout = ParseLayoutString(e->text);
  } else if (e->type == ValueType::kList && (!e->nested.empty() || e->items.empty())) {
    layout = ParseLayoutLists(e->nested);
    if (!layout.problem) {
      std::vector<int64_t> decoders;
      for (const LayoutStage& st : layout.stages) decoders.push_back(st.decoder);
      source = e->key + " = " + LayoutText(decoders, layout.stages.back().mtp) + " (as lists)";
    }
  } else {
    BadValue(sink, *e,
             "`" + e->key + "` expects a layout string or a list of lists of layer names, got " +
                 e->text,
             "for example `Et|(tt|)*30mL` or `[[embedding, decoder], [decoder, mtp, loss]]`");
    return false;
  }
  return ApplyLayout(layout, e->key, e->range, source, LayoutVpp::kMustMatch, draft, sink);
}

}  // namespace

std::span<const SettingRow> NemoRows() { return kNemo; }
std::span<const SkippedRow> NemoSkippedRows() { return kNemoSkipped; }

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
    if (m->type == ValueType::kTable) {
      BadValue(sink, *m, "`model.recompute_modules` expects a list of module names, got a table");
      return std::nullopt;
    }
    std::string names;
    for (const std::string& item : m->items) names += (names.empty() ? "" : ", ") + item;
    if (m->type != ValueType::kList) names = m->text;
    draft.Set(fields::kActivationsRecomputeModules, QuoteString(names), m->range,
              m->key + " = [" + m->text + "]");
  }
  ReadStatedFalse(*entries, draft);
  ReadPrecisionPreset(*entries, draft);
  if (!ReadFp8Switches(*entries, draft, sink) || !ReadGradPrecision(*entries, draft, sink)) {
    return std::nullopt;
  }
  ReadLatentAttention(*entries, draft);
  if (!ReadSharedExperts(*entries, draft, sink)) return std::nullopt;
  ReadMoeLayerFreq(*entries, draft);
  if (!ReadRouterBalancing(*entries, draft, sink)) return std::nullopt;
  if (!ReadPipelineLayout(*entries, draft, sink)) return std::nullopt;
  if (auto vpp = draft.Find(fields::kParallelVpp);
      vpp && vpp->value != "1" && vpp->value != "null") {
    draft.Set(fields::kPipelineSchedule, "interleaved_1f1b", vpp->origin, vpp->source);
  }
  return draft;
}

}  // namespace paraplan::interop
