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
constexpr EnumChoice kMegatronRouterScore[] = {{"softmax", "softmax"}, {"sigmoid", "sigmoid"}};
constexpr EnumChoice kMegatronDropPolicy[] = {{"probs", "probs"}, {"position", "position"}};
constexpr EnumChoice kMegatronDispatcher[] = {
    {"alltoall", "alltoall"}, {"allgather", "allgather"}, {"flex", "flex"}};

// Megatron-LM's pretrain_gpt.py arguments (megatron/training/arguments.py). Rows that need more
// than one flag (--num-layers-per-virtual-pipeline-stage, --moe-layer-freq, the defaults) are
// handled beside the table in megatron.cpp.
constexpr SettingRow kMegatron[] = {
    {"--tensor-model-parallel-size", fields::kParallelTp, Convert::kInt},
    {"--pipeline-model-parallel-size", fields::kParallelPp, Convert::kInt},
    {"--context-parallel-size", fields::kParallelCp, Convert::kInt},
    {"--expert-model-parallel-size", fields::kParallelEp, Convert::kInt},
    {"--expert-tensor-parallel-size", fields::kParallelEtp, Convert::kInt},
    {"--sequence-parallel", fields::kParallelSp, Convert::kSwitch, "true"},
    {"--tp-comm-overlap", fields::kParallelTpCommOverlap, Convert::kSwitch, "true"},
    {"--use-tp-pp-dp-mapping", fields::kParallelOrder, Convert::kSwitch, "\"tp-cp-ep-pp-dp\""},
    {"--virtual-pipeline-model-parallel-size", fields::kParallelVpp, Convert::kInt},
    {"--num-virtual-stages-per-pipeline-rank", fields::kParallelVpp, Convert::kInt},
    {"--decoder-first-pipeline-num-layers", fields::kPipelineFirstStageLayers, Convert::kInt},
    {"--decoder-last-pipeline-num-layers", fields::kPipelineLastStageLayers, Convert::kInt},
    {"--account-for-embedding-in-pipeline-split", fields::kPipelineAccountForEmbedding,
     Convert::kSwitch, "true"},
    {"--account-for-loss-in-pipeline-split", fields::kPipelineAccountForLoss, Convert::kSwitch,
     "true"},
    {"--num-layers", fields::kModelLayers, Convert::kInt},
    {"--hidden-size", fields::kModelHidden, Convert::kInt},
    {"--ffn-hidden-size", fields::kModelFfnHidden, Convert::kInt},
    {"--num-attention-heads", fields::kModelHeads, Convert::kInt},
    {"--kv-channels", fields::kModelHeadDim, Convert::kInt},
    {"--seq-length", fields::kModelSeqLen, Convert::kInt},
    {"--vocab-size", fields::kModelVocab, Convert::kInt},
    {"--make-vocab-size-divisible-by", fields::kModelVocabDivisor, Convert::kInt},
    {"--normalization", fields::kModelNorm, Convert::kEnum, {}, kMegatronNorm},
    {"--position-embedding-type", fields::kModelPosition, Convert::kEnum, {}, kMegatronPosition},
    {"--swiglu", fields::kModelActivation, Convert::kSwitch, "swiglu"},
    {"--untie-embeddings-and-output-weights", fields::kModelTiedEmbeddings, Convert::kSwitch,
     "false"},
    {"--num-experts", fields::kModelExperts, Convert::kInt},
    {"--moe-router-topk", fields::kModelTopk, Convert::kInt},
    {"--moe-ffn-hidden-size", fields::kModelMoeFfnHidden, Convert::kInt},
    {"--q-lora-rank", fields::kModelQLoraRank, Convert::kInt},
    {"--kv-lora-rank", fields::kModelKvLoraRank, Convert::kInt},
    {"--qk-head-dim", fields::kModelQkNopeHeadDim, Convert::kInt},
    {"--qk-pos-emb-head-dim", fields::kModelQkRopeHeadDim, Convert::kInt},
    {"--v-head-dim", fields::kModelVHeadDim, Convert::kInt},
    {"--micro-batch-size", fields::kBatchMicro, Convert::kInt},
    {"--global-batch-size", fields::kBatchGlobal, Convert::kInt},
    {"--bf16", fields::kPrecision, Convert::kSwitch, "bf16"},
    {"--fp16", fields::kPrecision, Convert::kSwitch, "fp16"},
    {"--fp8-format", fields::kPrecision, Convert::kEnum, {}, kMegatronFp8},
    {"--recompute-activations", fields::kRecompute, Convert::kSwitch, "selective"},
    // Megatron-LM before 2022 and Megatron-DeepSpeed: every layer's input checkpointed.
    {"--checkpoint-activations", fields::kRecompute, Convert::kSwitch, "full"},
    {"--recompute-granularity", fields::kRecompute, Convert::kEnum, {}, kMegatronRecompute},
    {"--fp8-recipe", fields::kMixedPrecisionFp8, Convert::kEnum, {}, kMegatronFp8Recipe},
    {"--fp8-param-gather", fields::kMixedPrecisionFp8Params, Convert::kSwitch, "true"},
    {"--grad-reduce-in-bf16", fields::kMixedPrecisionGrads, Convert::kSwitch, "bf16"},
    {"--recompute-method",
     fields::kActivationsRecomputeMethod,
     Convert::kEnum,
     {},
     kMegatronRecomputeMethod},
    {"--cpu-offloading-num-layers", fields::kActivationsOffloadLayers, Convert::kInt},
    {"--moe-token-dispatcher-type",
     fields::kMoeDispatcher,
     Convert::kEnum,
     {},
     kMegatronDispatcher},
    {"--moe-expert-capacity-factor", fields::kMoeCapacityFactor, Convert::kReal},
    {"--moe-token-drop-policy", fields::kMoeDropPolicy, Convert::kEnum, {}, kMegatronDropPolicy},
    {"--moe-router-score-function",
     fields::kModelRouterScore,
     Convert::kEnum,
     {},
     kMegatronRouterScore},
    {"--moe-router-pre-softmax", fields::kModelRouterTopkNorm, Convert::kSwitch, "false"},
    {"--moe-aux-loss-coeff", fields::kModelRouterAuxCoeff, Convert::kReal},
    {"--moe-router-num-groups", fields::kModelRouterGroups, Convert::kInt},
    {"--moe-router-group-topk", fields::kModelRouterGroupTopk, Convert::kInt},
    {"--moe-router-topk-scaling-factor", fields::kModelRouterScale, Convert::kReal},
    {"--optimizer-offload-fraction", fields::kOptimizerOffloadFraction, Convert::kReal},
    {"--qk-layernorm", fields::kModelQkNorm, Convert::kSwitch, "true"},
    {"--mtp-num-layers", fields::kModelMtpLayers, Convert::kInt},
    {"--mtp-loss-scaling-factor", fields::kModelMtpLossScale, Convert::kReal},
    {"--squared-relu", fields::kModelActivation, Convert::kSwitch, "squared_relu"},
    {"--use-distributed-optimizer", fields::kOptimizerZero, Convert::kSwitch, "1"},
    {"--optimizer-cpu-offload", fields::kOptimizerOffload, Convert::kSwitch, "cpu"},
    {"--optimizer", fields::kOptimizerType, Convert::kEnum, {}, kMegatronOptimizer},
    {"--lr", fields::kOptimizerLr, Convert::kReal},
    {"--min-lr", fields::kOptimizerMinLr, Convert::kReal},
    {"--lr-warmup-iters", fields::kOptimizerWarmupSteps, Convert::kInt},
    {"--weight-decay", fields::kOptimizerWeightDecay, Convert::kReal},
    {"--adam-beta1", fields::kOptimizerBeta1, Convert::kReal},
    {"--adam-beta2", fields::kOptimizerBeta2, Convert::kReal},
    {"--adam-eps", fields::kOptimizerEps, Convert::kReal},
    {"--clip-grad", fields::kOptimizerClipGrad, Convert::kReal},
    {"--train-iters", fields::kTrainSteps, Convert::kInt},
    {"--seed", fields::kTrainSeed, Convert::kInt},
    {"--save", fields::kTrainCheckpointDir, Convert::kString},
    {"--save-interval", fields::kTrainCheckpointEvery, Convert::kInt},
    // Megatron-DeepSpeed's own arguments.
    {"--zero-stage", fields::kOptimizerZero, Convert::kInt},
    {"--no-pipeline-parallel", fields::kParallelPp, Convert::kSwitch, "1"},
    {"--use-rotary-position-embeddings", fields::kModelPosition, Convert::kSwitch, "rope"},
    {"--num-key-value-heads", fields::kModelKvHeads, Convert::kInt},
};

// Settings a plan has no field for yet; listed so that nothing is dropped in silence.
constexpr SkippedRow kMegatronSkipped[] = {
    {"--fp8-amax-history-len", "no plan field yet: fp8 scaling"},
    {"--fp8-amax-compute-algo", "no plan field yet: fp8 scaling"},
    {"--moe-grouped-gemm", "no plan field: a kernel choice", false},
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
