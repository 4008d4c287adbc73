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
    {"trainer.num_nodes", "cluster.nodes", Convert::kInt},
    {"trainer.devices", "cluster.gpus_per_node", Convert::kInt},
    {"trainer.precision", "precision", Convert::kEnum, {}, kNemoPrecision},
    {"trainer.max_steps", "train.steps", Convert::kInt},
    {"model.micro_batch_size", "batch.micro", Convert::kInt},
    {"model.global_batch_size", "batch.global", Convert::kInt},
    {"model.tensor_model_parallel_size", "parallel.tp", Convert::kInt},
    {"model.pipeline_model_parallel_size", "parallel.pp", Convert::kInt},
    {"model.virtual_pipeline_model_parallel_size", "parallel.vpp", Convert::kInt},
    {"model.context_parallel_size", "parallel.cp", Convert::kInt},
    {"model.expert_model_parallel_size", "parallel.ep", Convert::kInt},
    {"model.expert_tensor_parallel_size", "parallel.etp", Convert::kInt},
    {"model.sequence_parallel", "parallel.sp", Convert::kSwitch, "true"},
    {"model.ub_tp_comm_overlap", "parallel.tp_comm_overlap", Convert::kSwitch, "true"},
    {"model.account_for_embedding_in_pipeline_split", "pipeline.account_for_embedding",
     Convert::kSwitch, "true"},
    {"model.account_for_loss_in_pipeline_split", "pipeline.account_for_loss", Convert::kSwitch,
     "true"},
    {"model.num_layers_in_first_pipeline_stage", "pipeline.first_stage_layers", Convert::kInt},
    {"model.num_layers_in_last_pipeline_stage", "pipeline.last_stage_layers", Convert::kInt},
    {"model.encoder_seq_length", "model.seq_len", Convert::kInt},
    {"model.seq_length", "model.seq_len", Convert::kInt},
    {"model.num_layers", "model.layers", Convert::kInt},
    {"model.hidden_size", "model.hidden", Convert::kInt},
    {"model.ffn_hidden_size", "model.ffn_hidden", Convert::kInt},
    {"model.num_attention_heads", "model.heads", Convert::kInt},
    {"model.num_query_groups", "model.kv_heads", Convert::kInt},
    {"model.kv_channels", "model.head_dim", Convert::kInt},
    {"model.vocab_size", "model.vocab", Convert::kInt},
    {"model.make_vocab_size_divisible_by", "model.vocab_divisor", Convert::kInt},
    {"model.normalization", "model.norm", Convert::kEnum, {}, kNemoNorm},
    {"model.activation", "model.activation", Convert::kEnum, {}, kNemoActivation},
    {"model.position_embedding_type", "model.position", Convert::kEnum, {}, kNemoPosition},
    {"model.num_moe_experts", "model.experts", Convert::kInt},
    {"model.moe_router_topk", "model.topk", Convert::kInt},
    {"model.moe_ffn_hidden_size", "model.moe_ffn_hidden", Convert::kInt},
    {"model.activations_checkpoint_granularity", "recompute", Convert::kEnum, {}, kNemoRecompute},
    {"model.recompute_granularity", "recompute", Convert::kEnum, {}, kNemoRecompute},
    {"model.fp8", "precision", Convert::kSwitch, "fp8"},
    {"model.fp8_recipe", "mixed_precision.fp8", Convert::kEnum, {}, kNemoFp8Recipe},
    {"model.fp8_params", "mixed_precision.fp8_params", Convert::kSwitch, "true"},
    {"model.activations_checkpoint_method",
     "activations.recompute_method",
     Convert::kEnum,
     {},
     kNemoRecomputeMethod},
    {"model.activations_checkpoint_num_layers", "activations.recompute_layers", Convert::kInt},
    {"model.recompute_method",
     "activations.recompute_method",
     Convert::kEnum,
     {},
     kNemoRecomputeMethod},
    {"model.recompute_num_layers", "activations.recompute_layers", Convert::kInt},
    {"model.moe_token_dispatcher_type", "moe.dispatcher", Convert::kEnum, {}, kNemoDispatcher},
    {"model.seed", "train.seed", Convert::kInt},
    {"model.optim.lr", "optimizer.lr", Convert::kReal},
    {"model.optim.eps", "optimizer.eps", Convert::kReal},
    {"trainer.gradient_clip_val", "optimizer.clip_grad", Convert::kReal},
    {"model.optim.weight_decay", "optimizer.weight_decay", Convert::kReal},
    {"model.optim.sched.warmup_steps", "optimizer.warmup_steps", Convert::kInt},
    {"model.optim.sched.min_lr", "optimizer.min_lr", Convert::kReal},
    // Megatron-Bridge's ConfigContainer overrides.
    {"train.global_batch_size", "batch.global", Convert::kInt},
    {"train.micro_batch_size", "batch.micro", Convert::kInt},
    {"train.train_iters", "train.steps", Convert::kInt},
    {"optimizer.lr", "optimizer.lr", Convert::kReal},
    {"optimizer.min_lr", "optimizer.min_lr", Convert::kReal},
    {"optimizer.weight_decay", "optimizer.weight_decay", Convert::kReal},
    {"optimizer.adam_beta1", "optimizer.beta1", Convert::kReal},
    {"optimizer.adam_beta2", "optimizer.beta2", Convert::kReal},
    {"optimizer.adam_eps", "optimizer.eps", Convert::kReal},
    {"optimizer.clip_grad", "optimizer.clip_grad", Convert::kReal},
    {"optimizer.use_distributed_optimizer", "optimizer.zero", Convert::kSwitch, "1"},
    {"ddp.use_distributed_optimizer", "optimizer.zero", Convert::kSwitch, "1"},
    {"scheduler.lr_warmup_iters", "optimizer.warmup_steps", Convert::kInt},
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
  draft.Set("framework", "megatron_core", {}, "NeMo runs on Megatron-Core");
  if (!ApplyRows(*entries, kNemo, kNemoSkipped, kHandled, draft, sink)) return std::nullopt;
  if (const ConfigEntry* o = FindEntry(*entries, "model.optim.name")) {
    if (o->text == "distributed_fused_adam" || o->text == "mcore_distributed_optim") {
      draft.Set("optimizer.zero", "1", o->range, "model.optim.name = " + o->text);
      draft.Set("optimizer.type", "adamw", o->range, "model.optim.name = " + o->text);
    } else if (o->text == "fused_adam" || o->text == "adamw" || o->text == "adam") {
      draft.Set("optimizer.type", "adamw", o->range, "model.optim.name = " + o->text);
    } else if (o->text == "sgd") {
      draft.Set("optimizer.type", "sgd", o->range, "model.optim.name = sgd");
    } else {
      draft.Skip("model.optim.name = " + o->text, o->range, "no plan optimizer of this name");
    }
  }
  if (const ConfigEntry* b = FindEntry(*entries, "model.optim.betas")) {
    if (b->items.size() == 2 && ParseReal(b->items[0]) && ParseReal(b->items[1])) {
      draft.Set("optimizer.beta1", RealText(*ParseReal(b->items[0])), b->range,
                "betas[0] = " + b->items[0]);
      draft.Set("optimizer.beta2", RealText(*ParseReal(b->items[1])), b->range,
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
    draft.Set("model.tied_embeddings",
              t->text == "True"    ? "true"
              : t->text == "False" ? "false"
                                   : t->text,
              t->range, t->key + " = " + t->text);
  }
  if (const ConfigEntry* m = FindEntry(*entries, "model.recompute_modules")) {
    std::string names;
    for (const std::string& item : m->items) names += (names.empty() ? "" : ", ") + item;
    if (m->type != ValueType::kList) names = m->text;
    draft.Set("activations.recompute_modules", QuoteString(names), m->range,
              m->key + " = [" + m->text + "]");
  }
  if (auto vpp = draft.Find("parallel.vpp"); vpp && vpp->value != "1" && vpp->value != "null") {
    draft.Set("pipeline.schedule", "interleaved_1f1b", vpp->origin, vpp->source);
  }
  return draft;
}

}  // namespace paraplan::interop
