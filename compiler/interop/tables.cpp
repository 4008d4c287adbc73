#include "compiler/interop/tables.h"

#include <cctype>
#include <string>

#include "compiler/interop/draft.h"

namespace paraplan::interop {
namespace {

// Megatron-DeepSpeed spells the norms in lower case.
constexpr EnumChoice kMegatronNorm[] = {{"RMSNorm", "rmsnorm"},
                                        {"LayerNorm", "layernorm"},
                                        {"rmsnorm", "rmsnorm"},
                                        {"layernorm", "layernorm"}};
constexpr EnumChoice kMegatronPosition[] = {{"rope", "rope"}, {"learned_absolute", "learned"}};
constexpr EnumChoice kMegatronRecompute[] = {{"full", "full"}, {"selective", "selective"}};
constexpr EnumChoice kMegatronOptimizer[] = {{"adam", "adamw"}, {"sgd", "sgd"}};
constexpr EnumChoice kMegatronFp8[] = {{"e4m3", "fp8"}, {"hybrid", "fp8"}};
constexpr EnumChoice kMegatronFp8Recipe[] = {{"delayed", "delayed"},
                                             {"tensorwise", "current"},
                                             {"blockwise", "blockwise"},
                                             {"mxfp8", "mxfp8"}};
constexpr EnumChoice kMegatronRecomputeMethod[] = {{"uniform", "uniform"}, {"block", "block"}};
constexpr EnumChoice kMegatronDispatcher[] = {
    {"alltoall", "alltoall"}, {"allgather", "allgather"}, {"flex", "flex"}};

// Megatron-LM's pretrain_gpt.py arguments (megatron/training/arguments.py). Rows that need more
// than one flag (--num-layers-per-virtual-pipeline-stage, --moe-layer-freq, the defaults) are
// handled beside the table in megatron.cpp.
constexpr SettingRow kMegatron[] = {
    {"--tensor-model-parallel-size", "parallel.tp", Convert::kInt},
    {"--pipeline-model-parallel-size", "parallel.pp", Convert::kInt},
    {"--context-parallel-size", "parallel.cp", Convert::kInt},
    {"--expert-model-parallel-size", "parallel.ep", Convert::kInt},
    {"--expert-tensor-parallel-size", "parallel.etp", Convert::kInt},
    {"--sequence-parallel", "parallel.sp", Convert::kSwitch, "true"},
    {"--tp-comm-overlap", "parallel.tp_comm_overlap", Convert::kSwitch, "true"},
    {"--use-tp-pp-dp-mapping", "parallel.order", Convert::kSwitch, "\"tp-cp-ep-pp-dp\""},
    {"--virtual-pipeline-model-parallel-size", "parallel.vpp", Convert::kInt},
    {"--num-virtual-stages-per-pipeline-rank", "parallel.vpp", Convert::kInt},
    {"--decoder-first-pipeline-num-layers", "pipeline.first_stage_layers", Convert::kInt},
    {"--decoder-last-pipeline-num-layers", "pipeline.last_stage_layers", Convert::kInt},
    {"--account-for-embedding-in-pipeline-split", "pipeline.account_for_embedding",
     Convert::kSwitch, "true"},
    {"--account-for-loss-in-pipeline-split", "pipeline.account_for_loss", Convert::kSwitch, "true"},
    {"--num-layers", "model.layers", Convert::kInt},
    {"--hidden-size", "model.hidden", Convert::kInt},
    {"--ffn-hidden-size", "model.ffn_hidden", Convert::kInt},
    {"--num-attention-heads", "model.heads", Convert::kInt},
    {"--kv-channels", "model.head_dim", Convert::kInt},
    {"--seq-length", "model.seq_len", Convert::kInt},
    {"--vocab-size", "model.vocab", Convert::kInt},
    {"--make-vocab-size-divisible-by", "model.vocab_divisor", Convert::kInt},
    {"--normalization", "model.norm", Convert::kEnum, {}, kMegatronNorm},
    {"--position-embedding-type", "model.position", Convert::kEnum, {}, kMegatronPosition},
    {"--swiglu", "model.activation", Convert::kSwitch, "swiglu"},
    {"--untie-embeddings-and-output-weights", "model.tied_embeddings", Convert::kSwitch, "false"},
    {"--num-experts", "model.experts", Convert::kInt},
    {"--moe-router-topk", "model.topk", Convert::kInt},
    {"--moe-ffn-hidden-size", "model.moe_ffn_hidden", Convert::kInt},
    {"--q-lora-rank", "model.q_lora_rank", Convert::kInt},
    {"--kv-lora-rank", "model.kv_lora_rank", Convert::kInt},
    {"--qk-head-dim", "model.qk_nope_head_dim", Convert::kInt},
    {"--qk-pos-emb-head-dim", "model.qk_rope_head_dim", Convert::kInt},
    {"--v-head-dim", "model.v_head_dim", Convert::kInt},
    {"--micro-batch-size", "batch.micro", Convert::kInt},
    {"--global-batch-size", "batch.global", Convert::kInt},
    {"--bf16", "precision", Convert::kSwitch, "bf16"},
    {"--fp16", "precision", Convert::kSwitch, "fp16"},
    {"--fp8-format", "precision", Convert::kEnum, {}, kMegatronFp8},
    {"--recompute-activations", "recompute", Convert::kSwitch, "selective"},
    {"--recompute-granularity", "recompute", Convert::kEnum, {}, kMegatronRecompute},
    {"--fp8-recipe", "mixed_precision.fp8", Convert::kEnum, {}, kMegatronFp8Recipe},
    {"--fp8-param-gather", "mixed_precision.fp8_params", Convert::kSwitch, "true"},
    {"--grad-reduce-in-bf16", "mixed_precision.grads", Convert::kSwitch, "bf16"},
    {"--recompute-method",
     "activations.recompute_method",
     Convert::kEnum,
     {},
     kMegatronRecomputeMethod},
    {"--cpu-offloading-num-layers", "activations.offload_layers", Convert::kInt},
    {"--moe-token-dispatcher-type", "moe.dispatcher", Convert::kEnum, {}, kMegatronDispatcher},
    {"--moe-expert-capacity-factor", "moe.capacity_factor", Convert::kReal},
    {"--optimizer-offload-fraction", "optimizer.offload_fraction", Convert::kReal},
    {"--qk-layernorm", "model.qk_norm", Convert::kSwitch, "true"},
    {"--mtp-num-layers", "model.mtp_layers", Convert::kInt},
    {"--squared-relu", "model.activation", Convert::kSwitch, "squared_relu"},
    {"--use-distributed-optimizer", "optimizer.zero", Convert::kSwitch, "1"},
    {"--optimizer-cpu-offload", "optimizer.offload", Convert::kSwitch, "cpu"},
    {"--optimizer", "optimizer.type", Convert::kEnum, {}, kMegatronOptimizer},
    {"--lr", "optimizer.lr", Convert::kReal},
    {"--min-lr", "optimizer.min_lr", Convert::kReal},
    {"--lr-warmup-iters", "optimizer.warmup_steps", Convert::kInt},
    {"--weight-decay", "optimizer.weight_decay", Convert::kReal},
    {"--adam-beta1", "optimizer.beta1", Convert::kReal},
    {"--adam-beta2", "optimizer.beta2", Convert::kReal},
    {"--adam-eps", "optimizer.eps", Convert::kReal},
    {"--clip-grad", "optimizer.clip_grad", Convert::kReal},
    {"--train-iters", "train.steps", Convert::kInt},
    {"--seed", "train.seed", Convert::kInt},
    {"--save", "train.checkpoint_dir", Convert::kString},
    {"--save-interval", "train.checkpoint_every", Convert::kInt},
    // Megatron-DeepSpeed's own arguments.
    {"--zero-stage", "optimizer.zero", Convert::kInt},
    {"--no-pipeline-parallel", "parallel.pp", Convert::kSwitch, "1"},
    {"--use-rotary-position-embeddings", "model.position", Convert::kSwitch, "rope"},
    {"--num-key-value-heads", "model.kv_heads", Convert::kInt},
};

// Settings a plan has no field for yet; listed so that nothing is dropped in silence.
constexpr SkippedRow kMegatronSkipped[] = {
    {"--fp8-amax-history-len", "no plan field yet: fp8 scaling"},
    {"--fp8-amax-compute-algo", "no plan field yet: fp8 scaling"},
    {"--moe-grouped-gemm", "no plan field: a kernel choice", false},
    {"--moe-router-load-balancing-type", "no plan field: router loss"},
    {"--moe-aux-loss-coeff", "no plan field: router loss"},
    {"--overlap-grad-reduce", "no plan field: the time model assumes overlap", false},
    {"--overlap-param-gather", "no plan field: the time model assumes overlap", false},
    {"--max-position-embeddings", "no plan field: the plan's sequence is --seq-length"},
    {"--use-mcore-models", "not a layout setting", false},
    {"--transformer-impl", "not a layout setting"},
    {"--tokenizer-type", "not a layout setting: the vocabulary size is --vocab-size"},
    {"--tokenizer-model", "not a layout setting: the vocabulary size is --vocab-size"},
    {"--data-path", "not a layout setting: planrun reads train.data"},
    {"--load", "not a layout setting"},
    {"--deepspeed", "read with --from=deepspeed", false},
    {"--deepspeed_config", "a DeepSpeed configuration: read with --from=deepspeed"},
    {"--deepspeed-config", "a DeepSpeed configuration: read with --from=deepspeed"},
    {"--deepspeed-activation-checkpointing", "no plan field yet: DeepSpeed's checkpointing", false},
};

}  // namespace

std::optional<std::string> ConvertSetting(const SettingRow& row, std::string_view text,
                                          std::string* error) {
  switch (row.convert) {
    case Convert::kInt: {
      auto v = ParseInteger(text);
      if (!v) {
        *error = "expects an integer, got '" + std::string(text) + "'";
        return std::nullopt;
      }
      return std::to_string(*v);
    }
    case Convert::kReal: {
      auto v = ParseReal(text);
      if (!v) {
        *error = "expects a number, got '" + std::string(text) + "'";
        return std::nullopt;
      }
      return RealText(*v);
    }
    case Convert::kString:
      return QuoteString(text);
    case Convert::kSwitch: {
      std::string t;
      for (char c : text) t += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      if (t.empty() || t == "true" || t == "1") return std::string(row.value);
      if (t == "false" || t == "0") {
        error->clear();
        return std::nullopt;
      }
      *error = "expects true or false, got '" + std::string(text) + "'";
      return std::nullopt;
    }
    case Convert::kEnum: {
      std::string accepted;
      for (const EnumChoice& c : row.choices) {
        if (c.framework == text) return std::string(c.plan);
        accepted += (accepted.empty() ? "" : ", ") + std::string(c.framework);
      }
      *error = "takes " + accepted + ", got '" + std::string(text) + "'";
      return std::nullopt;
    }
  }
  return std::nullopt;
}

std::optional<std::string> FrameworkValue(const SettingRow& row, std::string_view plan_value) {
  switch (row.convert) {
    case Convert::kInt:
    case Convert::kReal:
    case Convert::kString:
      return std::string(plan_value);
    case Convert::kSwitch:
      if (plan_value == row.value) return std::string("true");
      return std::nullopt;
    case Convert::kEnum:
      for (const EnumChoice& c : row.choices) {
        if (c.plan == plan_value) return std::string(c.framework);
      }
      return std::nullopt;
  }
  return std::nullopt;
}

std::span<const SettingRow> MegatronRows() { return kMegatron; }
std::span<const SkippedRow> MegatronSkippedRows() { return kMegatronSkipped; }

const SettingRow* FindRow(std::span<const SettingRow> rows, std::string_view key) {
  for (const SettingRow& r : rows) {
    if (r.key == key) return &r;
  }
  return nullptr;
}

const SkippedRow* FindSkipped(std::span<const SkippedRow> rows, std::string_view key) {
  for (const SkippedRow& r : rows) {
    if (r.key == key) return &r;
  }
  return nullptr;
}

}  // namespace paraplan::interop
