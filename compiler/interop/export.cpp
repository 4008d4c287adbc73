// Export: a checked Plan as the file that runs it on a framework. Every setting is written
// explicitly (the framework's defaults differ from a plan's), the settings paraplan derived are
// stated in comments (dp, microbatches, the padded vocabulary, edp), and what the framework has
// no setting for is P0905 at the plan's line, with no file written.
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "compiler/interop/draft.h"
#include "compiler/interop/interop.h"
#include "compiler/interop/pipeline_layout.h"

namespace paraplan {
namespace {

std::string Field(const Plan& plan, FieldId field) { return *GetFieldText(plan, field.path); }

// Reals as the frameworks read them back ("1" for clip_grad 1.0 is fine everywhere).
std::string Real(double v) { return interop::RealText(v); }

int64_t PaddedVocab(const Plan& plan) {
  const int64_t unit = plan.model.vocab_divisor * plan.parallel.tp;
  return (plan.model.vocab + unit - 1) / unit * unit;
}

// The plan's explicit split as Megatron-Core's pipeline layout ("Et|(tt|)*30mL"): the
// embedding on the first virtual stage, the MTP modules and the loss on the last, as the plan
// places them. Empty without an explicit split, or when it gives one entry per rank for several
// chunks (how those split is paraplan's rule, which no layout states).
std::string PipelineLayout(const Plan& p) {
  const std::vector<int64_t>& split = p.pipeline.stage_layers;
  if (split.empty() || static_cast<int64_t>(split.size()) != p.parallel.pp * p.parallel.vpp)
    return {};
  return interop::LayoutText(split, p.model.mtp_layers);
}

class Exporter {
 public:
  Exporter(ConfigKind kind, const Plan& plan, DiagnosticSink& sink)
      : kind_(kind), plan_(plan), sink_(sink) {}

  // The target has no setting for `path`'s value.
  void Cannot(FieldId path, const std::string& what, const std::string& note,
              const std::string& help) {
    std::string value = Field(plan_, path);
    sink_.Report(Diag(DiagKind::kExportNotExpressible,
                      std::string(FrameworkName(kind_)) + " cannot express `" +
                          std::string(path.path) + " = " + value + "`")
                     .At(plan_.Range(path), what)
                     .Note(note)
                     .Help(help));
    ok_ = false;
  }
  bool Ok() const { return ok_; }

  // The derived settings, one comment line each.
  std::vector<std::string> Derived() const {
    const Plan& p = plan_;
    std::vector<std::string> out;
    out.push_back("world = nodes · gpus_per_node = " + std::to_string(p.cluster.nodes) + " · " +
                  std::to_string(p.cluster.gpus_per_node) + " = " + std::to_string(p.World()));
    out.push_back("dp = world / (tp · pp · cp) = " + std::to_string(p.World()) + " / (" +
                  std::to_string(p.parallel.tp) + " · " + std::to_string(p.parallel.pp) + " · " +
                  std::to_string(p.parallel.cp) + ") = " + std::to_string(p.parallel.dp));
    if (p.model.IsMoe())
      out.push_back("edp = world / (etp · ep · pp) = " + std::to_string(p.Edp()));
    out.push_back("microbatches per step = global / (micro · dp) = " +
                  std::to_string(p.batch.global) + " / (" + std::to_string(p.batch.micro) + " · " +
                  std::to_string(p.parallel.dp) + ") = " + std::to_string(p.Microbatches()));
    out.push_back("padded vocabulary = ceil(vocab / (" + std::to_string(p.model.vocab_divisor) +
                  " · tp)) · " + std::to_string(p.model.vocab_divisor) +
                  " · tp = " + std::to_string(PaddedVocab(p)) + " rows for vocab " +
                  std::to_string(p.model.vocab));
    out.push_back("GPU: " + p.cluster.gpu.name + " (" + p.cluster.name + ")");
    return out;
  }

  // Settings no framework here has: a per-stage layer list (but as Megatron-Core's pipeline
  // layout, where the target writes one), cost balancing, another rank order.
  void CommonLimits(bool order_ok_tp_pp_dp, bool writes_layout = false) {
    const Plan& p = plan_;
    if (!p.pipeline.stage_layers.empty() && !writes_layout) {
      Cannot(fields::kPipelineStageLayers, "an explicit split",
             "the framework splits layers by its own rule",
             "use pipeline.first_stage_layers / last_stage_layers, or an even split");
    } else if (!p.pipeline.stage_layers.empty() && PipelineLayout(p).empty()) {
      Cannot(fields::kPipelineStageLayers, "one entry per pipeline rank",
             "Megatron-Core's pipeline layout names the layers of every virtual stage; how a "
             "rank's layers split over its vpp = " +
                 std::to_string(p.parallel.vpp) + " chunks is paraplan's rule",
             "give one entry per virtual stage (pp · vpp = " +
                 std::to_string(p.parallel.pp * p.parallel.vpp) + " entries, chunk by chunk)");
    }
    if (p.pipeline.balance != Balance::kEven) {
      Cannot(fields::kPipelineBalance, "a cost-balanced split",
             "the framework splits layers evenly", "write the split as first/last stage layers");
    }
    if (p.parallel.order != "tp-cp-ep-dp-pp" &&
        !(order_ok_tp_pp_dp && p.parallel.order == "tp-cp-ep-pp-dp")) {
      Cannot(fields::kParallelOrder, "this rank order",
             "the framework lays ranks out in its own order",
             "use the default order \"tp-cp-ep-dp-pp\"");
    }
  }

  // The newer records' settings (precision record, recompute detail, FSDP groups, MoE dispatch,
  // model features): a setting the target does not write must be what the shorthands imply,
  // else it is refused. `carried` lists the paths the target writes.
  void RecordLimits(const std::vector<FieldId>& carried) {
    const Plan& p = plan_;
    auto carries = [&](FieldId field) {
      return std::find(carried.begin(), carried.end(), field) != carried.end();
    };
    const MixedPrecisionSpec eff = EffectiveMixedPrecision(p);
    const ElementType implied_params = p.precision == Precision::kFp16   ? ElementType::kFp16
                                       : p.precision == Precision::kFp32 ? ElementType::kFp32
                                                                         : ElementType::kBf16;
    struct Check {
      FieldId path;
      bool implied;
    };
    const Check checks[] = {
        {fields::kMixedPrecisionParams, eff.params == implied_params},
        {fields::kMixedPrecisionGrads,
         eff.grads == (p.precision == Precision::kFp16 ? ElementType::kFp16 : ElementType::kFp32)},
        {fields::kMixedPrecisionMainParams, eff.main_params == (p.precision != Precision::kFp32)},
        {fields::kMixedPrecisionOptimizerState, eff.optimizer_state == ElementType::kFp32},
        {fields::kMixedPrecisionFp8,
         eff.fp8 == (p.precision == Precision::kFp8 ? Fp8Recipe::kDelayed : Fp8Recipe::kNone)},
        {fields::kMixedPrecisionFp8Params, !eff.fp8_params},
        {fields::kActivationsRecomputeMethod,
         p.activations.recompute_method == RecomputeMethod::kUniform},
        {fields::kActivationsRecomputeLayers, p.activations.recompute_layers == 0},
        {fields::kActivationsRecomputeModules, p.activations.recompute_modules.empty()},
        {fields::kActivationsOffloadLayers, p.activations.offload_layers == 0},
        {fields::kFsdpShard,
         p.fsdp.shard == 0 || p.fsdp.shard * p.fsdp.replicate == p.parallel.dp * p.parallel.cp},
        {fields::kFsdpReplicate, p.fsdp.replicate == 1},
        {fields::kFsdpReshardAfterForward, p.fsdp.reshard_after_forward},
        {fields::kFsdpMaxLiveParams, p.fsdp.max_live_params == 0},
        {fields::kMoeDispatcher, p.moe.dispatcher == Dispatcher::kAllToAll},
        {fields::kMoeCapacityFactor, p.moe.capacity_factor == 0},
        {fields::kMoeDropPolicy, p.moe.drop_policy == DropPolicy::kProbs},
        {fields::kModelQkNorm, !p.model.qk_norm},
        {fields::kModelVocabDivisor, p.model.vocab_divisor == 128},
        {fields::kModelWindow, p.model.window == 0},
        {fields::kModelMtpLayers, p.model.mtp_layers == 0},
        {fields::kModelMtpLossScale, p.model.mtp_loss_scale == 0.1},
        {fields::kModelMoeLayerFreq, p.model.moe_layer_freq == 1},
        {fields::kModelRouterScore, p.model.router_score == RouterScore::kSoftmax},
        {fields::kModelRouterTopkNorm, p.model.router_topk_norm},
        {fields::kModelRouterAuxCoeff, p.model.router_aux_coeff == ModelSpec{}.router_aux_coeff},
        {fields::kModelRouterBiasRate, p.model.router_bias_rate == 0},
        {fields::kModelRouterGroups, p.model.router_groups == 1},
        {fields::kModelRouterGroupTopk, p.model.router_group_topk == 1},
        {fields::kModelRouterScale, p.model.router_scale == 1},
        {fields::kOptimizerOffloadFraction, p.optimizer.offload_fraction == 1.0},
    };
    for (const Check& c : checks) {
      if (c.implied || carries(c.path)) continue;
      Cannot(c.path, "no setting for this",
             std::string(FrameworkName(kind_)) + "'s file has no setting that says this",
             "leave `" + std::string(c.path.path) +
                 "` to follow the plan's shorthands, or export to another framework");
    }
    if (p.model.activation == Activation::kSquaredRelu && !carries(fields::kModelActivation)) {
      Cannot(fields::kModelActivation, "squared ReLU",
             std::string(FrameworkName(kind_)) + "'s file has no squared-ReLU MLP",
             "export to megatron");
    }
  }

  ConfigKind kind_;
  const Plan& plan_;
  DiagnosticSink& sink_;
  bool ok_ = true;
};

// --- Megatron-LM ------------------------------------------------------------------------------

// Megatron-LM's flags in order, each with its value ("--num-layers 32").
class MegatronFlags {
 public:
  void operator()(const std::string& flag, const std::string& value = {}) {
    args_.push_back(value.empty() ? flag : flag + " " + value);
  }
  std::vector<std::string> Take() { return std::move(args_); }

 private:
  std::vector<std::string> args_;
};

std::string Num(int64_t v) { return std::to_string(v); }

// Megatron-LM flags for the parallel layout and the pipeline split.
void MegatronParallelArgs(Exporter& ex, bool deepspeed, MegatronFlags& add) {
  const Plan& p = ex.plan_;
  const ModelSpec& m = p.model;
  add("--tensor-model-parallel-size", Num(p.parallel.tp));
  add("--pipeline-model-parallel-size", Num(p.parallel.pp));
  if (!deepspeed) {
    add("--context-parallel-size", Num(p.parallel.cp));
    add("--expert-model-parallel-size", Num(p.parallel.ep));
    add("--expert-tensor-parallel-size", Num(p.parallel.etp));
  }
  if (p.parallel.sp) add("--sequence-parallel");
  if (p.parallel.tp_comm_overlap) {
    if (deepspeed)
      ex.Cannot(fields::kParallelTpCommOverlap, "TP communication overlap",
                "Megatron-DeepSpeed has no --tp-comm-overlap",
                "remove `tp_comm_overlap = true`, or export to megatron, torchtitan or nemo");
    else
      add("--tp-comm-overlap");
  }
  if (p.parallel.order == "tp-cp-ep-pp-dp") add("--use-tp-pp-dp-mapping");
  const std::string layout = deepspeed ? std::string() : PipelineLayout(p);
  if (!layout.empty()) {
    // Megatron-LM derives vpp from the layout and takes no other virtual-stage flag with it.
    add("--pipeline-model-parallel-layout", "\"" + layout + "\"");
  } else if (p.parallel.vpp > 1) {
    const int64_t counted = m.layers + (p.pipeline.account_for_embedding ? 1 : 0) +
                            (p.pipeline.account_for_loss ? 1 : 0);
    if (!p.pipeline.first_stage_layers && !p.pipeline.last_stage_layers &&
        counted % (p.parallel.pp * p.parallel.vpp) == 0) {
      add("--num-layers-per-virtual-pipeline-stage",
          Num(counted / (p.parallel.pp * p.parallel.vpp)));
    } else {
      add("--num-virtual-stages-per-pipeline-rank", Num(p.parallel.vpp));
    }
  }
  if (p.pipeline.schedule == Schedule::kGpipe) {
    ex.Cannot(fields::kPipelineSchedule, "GPipe",
              "Megatron-LM runs 1F1B, interleaved when there are virtual stages",
              "use schedule = 1f1b");
  } else if ((p.pipeline.schedule == Schedule::kInterleaved1F1B) != (p.parallel.vpp > 1)) {
    ex.Cannot(fields::kPipelineSchedule, "the schedule",
              "Megatron-LM interleaves exactly when there are virtual stages (vpp > 1)",
              "use interleaved_1f1b with vpp > 1, or 1f1b with vpp = 1");
  }
  if (p.pipeline.first_stage_layers)
    add("--decoder-first-pipeline-num-layers", Num(*p.pipeline.first_stage_layers));
  if (p.pipeline.last_stage_layers)
    add("--decoder-last-pipeline-num-layers", Num(*p.pipeline.last_stage_layers));
  if (p.pipeline.account_for_embedding) add("--account-for-embedding-in-pipeline-split");
  if (p.pipeline.account_for_loss) add("--account-for-loss-in-pipeline-split");
  ex.CommonLimits(true, !deepspeed);
}

// Megatron-LM flags for the MoE router. Megatron-Core's softmax router takes the top k of the
// logits and softmaxes them (weights that sum to 1) unless --moe-router-pre-softmax; its sigmoid
// router always renormalises the top k. Its loss coefficient defaults to 0, so it is always
// written.
void MegatronRouterArgs(Exporter& ex, MegatronFlags& add) {
  const ModelSpec& m = ex.plan_.model;
  if (m.router_score == RouterScore::kSigmoid) {
    add("--moe-router-score-function", "sigmoid");
    if (!m.router_topk_norm && m.topk > 1)
      ex.Cannot(fields::kModelRouterTopkNorm, "a sigmoid router without renormalisation",
                "Megatron-Core's sigmoid router always renormalises its top-k weights",
                "set `model.router_topk_norm = true`");
  } else if (!m.router_topk_norm) {
    add("--moe-router-pre-softmax");
  }
  if (m.router_aux_coeff > 0)
    add("--moe-aux-loss-coeff", Real(m.router_aux_coeff));
  else
    add("--moe-router-load-balancing-type", "none");
  if (m.router_bias_rate > 0) {
    add("--moe-router-enable-expert-bias");
    add("--moe-router-bias-update-rate", Real(m.router_bias_rate));
  }
  // Group-limited routing and the routed scaling factor (Megatron-Core's defaults: none).
  if (m.router_groups > 1 || m.router_group_topk > 1) {
    add("--moe-router-num-groups", Num(m.router_groups));
    add("--moe-router-group-topk", Num(m.router_group_topk));
  }
  if (m.router_scale != 1) add("--moe-router-topk-scaling-factor", Real(m.router_scale));
}

// The settings both the Megatron-LM and the NeMo exporter write when the plan has them.
std::vector<FieldId> CarriedSettings() {
  return {fields::kMixedPrecisionFp8,
          fields::kMixedPrecisionFp8Params,
          fields::kMixedPrecisionGrads,
          fields::kActivationsRecomputeMethod,
          fields::kActivationsRecomputeLayers,
          fields::kActivationsRecomputeModules,
          fields::kActivationsOffloadLayers,
          fields::kMoeDispatcher,
          fields::kMoeCapacityFactor,
          fields::kMoeDropPolicy,
          fields::kModelQkNorm,
          fields::kModelVocabDivisor,
          fields::kModelMtpLayers,
          fields::kModelMtpLossScale,
          fields::kModelMoeLayerFreq,
          fields::kModelRouterScore,
          fields::kModelRouterTopkNorm,
          fields::kModelRouterAuxCoeff,
          fields::kModelRouterBiasRate,
          fields::kModelRouterGroups,
          fields::kModelRouterGroupTopk,
          fields::kModelRouterScale};
}

// Megatron-LM flags for the model.
void MegatronModelArgs(Exporter& ex, MegatronFlags& add) {
  const Plan& p = ex.plan_;
  const ModelSpec& m = p.model;
  add("--num-layers", Num(m.layers));
  add("--hidden-size", Num(m.hidden));
  add("--ffn-hidden-size", Num(m.ffn_hidden));
  add("--num-attention-heads", Num(m.heads));
  if (m.kv_heads != m.heads) {
    add("--group-query-attention");
    add("--num-query-groups", Num(m.kv_heads));
  }
  if (m.IsMla()) {
    add("--multi-latent-attention");
    if (m.q_lora_rank > 0) add("--q-lora-rank", Num(m.q_lora_rank));
    add("--kv-lora-rank", Num(m.kv_lora_rank));
    add("--qk-head-dim", Num(m.qk_nope_head_dim));
    add("--qk-pos-emb-head-dim", Num(m.qk_rope_head_dim));
    add("--v-head-dim", Num(m.v_head_dim));
    if (m.head_dim != m.qk_nope_head_dim + m.qk_rope_head_dim) {
      ex.Cannot(fields::kModelHeadDim, "this head size",
                "Megatron-LM's multi-latent attention sizes query/key heads as --qk-head-dim + "
                "--qk-pos-emb-head-dim",
                "set head_dim = qk_nope_head_dim + qk_rope_head_dim");
    }
  } else if (m.head_dim * m.heads != m.hidden) {
    add("--kv-channels", Num(m.head_dim));
  }
  add("--seq-length", Num(m.seq_len));
  add("--max-position-embeddings", Num(m.seq_len));
  add("--vocab-size", Num(m.vocab));
  add("--make-vocab-size-divisible-by", Num(m.vocab_divisor));
  add("--normalization", m.norm == Norm::kRmsNorm ? "RMSNorm" : "LayerNorm");
  if (m.activation == Activation::kSwiGlu) add("--swiglu");
  add("--position-embedding-type", m.position == Position::kRope ? "rope" : "learned_absolute");
  if (!m.tied_embeddings) add("--untie-embeddings-and-output-weights");
  if (m.IsMoe()) {
    add("--num-experts", Num(m.experts));
    add("--moe-router-topk", Num(m.topk));
    add("--moe-ffn-hidden-size", Num(m.ExpertFfn()));
    if (m.shared_experts > 0)
      add("--moe-shared-expert-intermediate-size", Num(m.shared_experts * m.ExpertFfn()));
    if (m.moe_layer_freq == 1) {
      add("--moe-layer-freq",
          "'([0]*" + Num(m.dense_layers) + "+[1]*" + Num(m.layers - m.dense_layers) + ")'");
    } else if (m.dense_layers == 0) {
      add("--moe-layer-freq", Num(m.moe_layer_freq));
    } else {
      ex.Cannot(fields::kModelMoeLayerFreq, "a frequency after dense layers",
                "planc reads --moe-layer-freq as leading dense layers or as one frequency",
                "use one of them");
    }
    if (p.moe.dispatcher != Dispatcher::kAllToAll) {
      add("--moe-token-dispatcher-type",
          p.moe.dispatcher == Dispatcher::kAllGather ? "allgather" : "flex");
    }
    if (p.moe.capacity_factor > 0) add("--moe-expert-capacity-factor", Real(p.moe.capacity_factor));
    if (p.moe.drop_policy == DropPolicy::kPosition) add("--moe-token-drop-policy", "position");
    MegatronRouterArgs(ex, add);
  }
  if (m.qk_norm) add("--qk-layernorm");
  if (m.mtp_layers > 0) add("--mtp-num-layers", Num(m.mtp_layers));
  if (m.mtp_loss_scale != 0.1) add("--mtp-loss-scaling-factor", Real(m.mtp_loss_scale));
  if (m.activation == Activation::kSquaredRelu) add("--squared-relu");
}

// Megatron-LM flags for the batch sizes and the precision.
void MegatronPrecisionArgs(Exporter& ex, MegatronFlags& add) {
  const Plan& p = ex.plan_;
  add("--micro-batch-size", Num(p.batch.micro));
  add("--global-batch-size", Num(p.batch.global));
  switch (p.precision) {
    case Precision::kBf16:
      add("--bf16");
      break;
    case Precision::kFp16:
      add("--fp16");
      break;
    case Precision::kFp32:
      break;
    case Precision::kFp8:
      add("--bf16");
      add("--fp8-format", "hybrid");
      break;
  }
  const MixedPrecisionSpec mp = EffectiveMixedPrecision(p);
  if (mp.fp8 == Fp8Recipe::kRowwise) {
    ex.Cannot(fields::kMixedPrecisionFp8, "row-wise FP8 scaling",
              "Megatron-LM's --fp8-recipe has delayed, tensorwise, blockwise and mxfp8",
              "use blockwise (1x128 activations, 128x128 weights) or current");
  } else if (p.precision == Precision::kFp8 && mp.fp8 != Fp8Recipe::kDelayed &&
             mp.fp8 != Fp8Recipe::kNone) {
    const char* recipe = mp.fp8 == Fp8Recipe::kCurrent     ? "tensorwise"
                         : mp.fp8 == Fp8Recipe::kBlockwise ? "blockwise"
                                                           : "mxfp8";
    add("--fp8-recipe", recipe);
  }
  if (IdleFp8Recipe(p)) {
    ex.Cannot(fields::kMixedPrecisionFp8, "an FP8 recipe without FP8",
              "Megatron-LM turns FP8 on with --fp8-format", "set precision = fp8");
  }
  if (mp.fp8_params) add("--fp8-param-gather");
  if (mp.grads == ElementType::kBf16) add("--grad-reduce-in-bf16");
  if (p.activations.offload_layers > 0)
    add("--cpu-offloading-num-layers", Num(p.activations.offload_layers));
}

// Megatron-LM flags for recomputation, the optimizer and what cannot be exported.
void MegatronMemoryArgs(Exporter& ex, bool deepspeed, MegatronFlags& add) {
  const Plan& p = ex.plan_;
  const ModelSpec& m = p.model;
  if (p.recompute == Recompute::kSelective && !p.activations.recompute_modules.empty()) {
    std::string modules;
    for (char c : p.activations.recompute_modules) {
      if (c != ',') modules += c;
    }
    add("--recompute-modules", modules);
  }
  if (p.recompute == Recompute::kSelective) add("--recompute-granularity", "selective");
  if (p.recompute == Recompute::kFull) {
    // Full recompute needs a method and a layer count; the plan's 0 ("all") is a whole chunk.
    add("--recompute-granularity", "full");
    add("--recompute-method",
        p.activations.recompute_method == RecomputeMethod::kBlock ? "block" : "uniform");
    int64_t layers = p.activations.recompute_layers;
    if (layers == 0) {
      if (p.pipeline.first_stage_layers || p.pipeline.last_stage_layers ||
          m.layers % (p.parallel.pp * p.parallel.vpp) != 0) {
        ex.Cannot(fields::kActivationsRecomputeLayers, "every layer of an uneven chunk",
                  "Megatron-LM counts recomputed layers per chunk, and these chunks differ",
                  "state the count");
      }
      layers = m.layers / (p.parallel.pp * p.parallel.vpp);
    }
    add("--recompute-num-layers", Num(layers));
  }
  add("--optimizer", p.optimizer.type == OptimizerType::kAdamW ? "adam" : "sgd");
  if (deepspeed) {
    add("--zero-stage", Num(p.optimizer.zero));
  } else if (p.optimizer.zero == 1) {
    add("--use-distributed-optimizer");
  } else if (p.optimizer.zero > 1) {
    ex.Cannot(fields::kOptimizerZero, "ZeRO-" + Num(p.optimizer.zero),
              "Megatron-LM's distributed optimizer shards the optimizer state only (ZeRO-1)",
              "use zero = 1, or export to deepspeed or torchtitan (FSDP)");
  }
  if (p.optimizer.offload == Offload::kCpu && !deepspeed) {
    add("--optimizer-cpu-offload");
    if (p.optimizer.offload_fraction != 1.0)
      add("--optimizer-offload-fraction", Real(p.optimizer.offload_fraction));
  }
  std::vector<FieldId> carried = CarriedSettings();
  carried.push_back(fields::kModelActivation);
  if (deepspeed || p.optimizer.offload == Offload::kCpu) {
    carried.push_back(fields::kOptimizerOffloadFraction);
  }
  if (deepspeed) carried.push_back(fields::kFsdpMaxLiveParams);
  ex.RecordLimits(carried);
}

// Megatron-LM flags for the schedule of training: learning rate, steps, checkpoints, data.
void MegatronTrainingArgs(Exporter& ex, MegatronFlags& add) {
  const Plan& p = ex.plan_;
  add("--lr", Real(p.optimizer.lr));
  add("--min-lr", Real(p.optimizer.min_lr));
  add("--lr-warmup-iters", Num(p.optimizer.warmup_steps));
  add("--weight-decay", Real(p.optimizer.weight_decay));
  add("--adam-beta1", Real(p.optimizer.beta1));
  add("--adam-beta2", Real(p.optimizer.beta2));
  add("--adam-eps", Real(p.optimizer.eps));
  add("--clip-grad", Real(p.optimizer.clip_grad));
  add("--train-iters", Num(p.train.steps));
  add("--seed", Num(p.train.seed));
  if (!p.train.checkpoint_dir.empty()) add("--save", interop::QuoteString(p.train.checkpoint_dir));
  if (p.train.checkpoint_every > 0) add("--save-interval", Num(p.train.checkpoint_every));
  if (!p.train.data.empty()) add("--data-path", interop::QuoteString(p.train.data));
}

std::vector<std::string> MegatronArgs(Exporter& ex, bool deepspeed) {
  MegatronFlags add;
  MegatronParallelArgs(ex, deepspeed, add);
  MegatronModelArgs(ex, add);
  MegatronPrecisionArgs(ex, add);
  MegatronMemoryArgs(ex, deepspeed, add);
  MegatronTrainingArgs(ex, add);
  return add.Take();
}

std::string ShellScript(const Exporter& ex, const std::string& launcher,
                        const std::vector<std::string>& args, const std::string& extra_comment) {
  const Plan& p = ex.plan_;
  std::string s = "#!/bin/bash\n# " + p.name +
                  ": written by planc export --to=" + std::string(ToString(ex.kind_)) +
                  "\n#\n# Derived by planc (Megatron-LM derives the same):\n";
  for (const std::string& d : ex.Derived()) s += "#   " + d + "\n";
  if (!extra_comment.empty()) s += extra_comment;
  s += "\nNNODES=" + std::to_string(p.cluster.nodes) +
       "\nGPUS_PER_NODE=" + std::to_string(p.cluster.gpus_per_node) + "\n\n";
  s += launcher + " \\\n";
  for (size_t i = 0; i < args.size(); ++i)
    s += "    " + args[i] + (i + 1 < args.size() ? " \\\n" : "\n");
  return s;
}

// --- DeepSpeed ----------------------------------------------------------------------------------

std::string DeepSpeedJson(Exporter& ex) {
  const Plan& p = ex.plan_;
  auto n = [](int64_t v) { return std::to_string(v); };
  std::string j = "{\n";
  j += "  \"train_batch_size\": " + n(p.batch.global) + ",\n";
  j += "  \"train_micro_batch_size_per_gpu\": " + n(p.batch.micro) + ",\n";
  j += "  \"gradient_accumulation_steps\": " + n(p.Microbatches()) + ",\n";
  j += "  \"zero_optimization\": {\n    \"stage\": " + n(p.optimizer.zero);
  if (p.optimizer.offload == Offload::kCpu) {
    j += ",\n    \"offload_optimizer\": { \"device\": \"cpu\"";
    if (p.optimizer.offload_fraction != 1.0)
      j += ", \"ratio\": " + Real(p.optimizer.offload_fraction);
    j += " }";
  }
  if (p.fsdp.max_live_params > 0)
    j += ",\n    \"stage3_max_live_parameters\": " + n(p.fsdp.max_live_params);
  j += "\n  },\n";
  j += std::string("  \"bf16\": { \"enabled\": ") +
       (p.precision == Precision::kBf16 ? "true" : "false") + " },\n";
  j += std::string("  \"fp16\": { \"enabled\": ") +
       (p.precision == Precision::kFp16 ? "true" : "false") + " },\n";
  j += "  \"optimizer\": {\n    \"type\": \"" +
       std::string(p.optimizer.type == OptimizerType::kAdamW ? "AdamW" : "SGD") +
       "\",\n    \"params\": { \"lr\": " + Real(p.optimizer.lr) + ", \"betas\": [" +
       Real(p.optimizer.beta1) + ", " + Real(p.optimizer.beta2) +
       "], \"eps\": " + Real(p.optimizer.eps) +
       ", \"weight_decay\": " + Real(p.optimizer.weight_decay) + " }\n  },\n";
  j += "  \"scheduler\": {\n    \"type\": \"WarmupDecayLR\",\n    \"params\": { "
       "\"warmup_num_steps\": " +
       n(p.optimizer.warmup_steps) + ", \"total_num_steps\": " + n(p.train.steps) +
       ", \"warmup_max_lr\": " + Real(p.optimizer.lr) + " }\n  },\n";
  j += "  \"gradient_clipping\": " + Real(p.optimizer.clip_grad) + "\n}\n";
  return j;
}

void DeepSpeedLimits(Exporter& ex) {
  const Plan& p = ex.plan_;
  if (p.parallel.cp > 1) {
    ex.Cannot(fields::kParallelCp, "context parallelism",
              "Megatron-DeepSpeed's arguments have no context-parallel size; the file would train "
              "with cp = 1",
              "export to megatron or nemo, or set `parallel.cp = 1`");
  }
  if (p.parallel.ep > 1) {
    ex.Cannot(fields::kParallelEp, "expert parallelism",
              "Megatron-DeepSpeed's GPT arguments have no Megatron-Core expert mesh",
              "export to megatron or nemo, or set `parallel.ep = 1`");
  }
  if (p.parallel.vpp > 1) {
    ex.Cannot(fields::kParallelVpp, "virtual pipeline stages",
              "DeepSpeed's pipeline engine has no interleaved schedule",
              "set `parallel.vpp = 1`, or export to megatron");
  }
  if (p.precision == Precision::kFp8) {
    ex.Cannot(fields::kPrecision, "fp8", "DeepSpeed's configuration has no fp8 training",
              "use bf16, or export to megatron or torchtitan");
  }
  if (p.optimizer.zero >= 2 && p.parallel.pp > 1) {
    ex.Cannot(
        fields::kOptimizerZero,
        "ZeRO-" + std::to_string(p.optimizer.zero) + " with pp = " + std::to_string(p.parallel.pp),
        "DeepSpeed's pipeline engine refuses ZeRO-2 and ZeRO-3 (\"ZeRO-2 and ZeRO-3 are "
        "incompatible with pipeline parallelism\")",
        "use zero = 1 with pipeline parallelism");
  }
  if (p.pipeline.schedule == Schedule::kGpipe) {
    ex.Cannot(fields::kPipelineSchedule, "GPipe",
              "DeepSpeed's pipeline engine runs its own 1F1B-style schedule", "use 1f1b");
  }
}

// --- torchtitan ---------------------------------------------------------------------------------

struct TitanFlavor {
  std::string_view model, name, flavor;
};
constexpr TitanFlavor kTitanFlavors[] = {
    {"llama3_8b", "llama3", "8B"},          {"llama3_70b", "llama3", "70B"},
    {"llama3_405b", "llama3", "405B"},      {"llama2_7b", "llama2", "7B"},
    {"llama2_70b", "llama2", "70B"},        {"deepseek_v3", "deepseek_v3", "671B"},
    {"deepseek_v2", "deepseek_v3", "236B"}, {"qwen3_30b_a3b", "qwen3", "30B-A3B"},
};

// The torchtitan flavor of the plan's model (nullptr when there is none), after reporting on
// `ex` what a torchtitan job file cannot express.
const TitanFlavor* TorchtitanCheckLimits(Exporter& ex) {
  const Plan& p = ex.plan_;
  auto n = [](int64_t v) { return std::to_string(v); };
  const TitanFlavor* flavor = nullptr;
  for (const TitanFlavor& f : kTitanFlavors) {
    if (f.model == p.model.name) flavor = &f;
  }
  if (!flavor) {
    ex.Cannot(
        "model", "this model",
        "torchtitan names a model by flavor (model.name, model.flavor); this shape is none of them",
        "use a stdlib model torchtitan has a flavor for (llama3_8b, llama3_70b, llama3_405b, "
        "deepseek_v3, ...)");
  }
  if (p.optimizer.zero == 1 || p.optimizer.zero == 2) {
    ex.Cannot(fields::kOptimizerZero, "ZeRO-" + n(p.optimizer.zero),
              "torchtitan shards with FSDP (ZeRO-3) or replicates (zero = 0)",
              "use zero = 3 (FSDP) or zero = 0");
  }
  if (p.optimizer.offload == Offload::kCpu) {
    ex.Cannot(fields::kOptimizerOffload, "CPU offload",
              "torchtitan's job file has no optimizer-state offload to the CPU",
              "use offload = none");
  }
  if (p.optimizer.type == OptimizerType::kSgd) {
    ex.Cannot(fields::kOptimizerType, "SGD", "torchtitan builds Adam and AdamW", "use adamw");
  }
  if (p.parallel.vpp > 1 || p.pipeline.schedule == Schedule::kInterleaved1F1B) {
    ex.Cannot(
        p.parallel.vpp > 1 ? FieldId(fields::kParallelVpp) : FieldId(fields::kPipelineSchedule),
        "interleaving",
        "torchtitan's schedule names (Interleaved1F1B, ...) do not say how many virtual "
        "stages a rank holds; "
        "it derives them from its own layers-per-stage rule",
        "set vpp = 1 with schedule = 1f1b, or export to megatron or nemo");
  }
  if (p.parallel.tp > 1 && !p.parallel.sp) {
    ex.Cannot(fields::kParallelSp, "no sequence parallelism",
              "torchtitan's tensor parallelism in its TOML job files always shards the sequence "
              "between layers (its Python configs have had parallelism.enable_sequence_parallel "
              "since March 2026, after the TOML files were retired)",
              "set sp = true");
  }
  if (p.pipeline.first_stage_layers || p.pipeline.last_stage_layers) {
    ex.Cannot(p.pipeline.first_stage_layers ? fields::kPipelineFirstStageLayers
                                            : fields::kPipelineLastStageLayers,
              "an uneven split", "torchtitan splits the layers by its own rule",
              "remove the override");
  }
  if (p.pipeline.account_for_embedding || p.pipeline.account_for_loss) {
    ex.Cannot(p.pipeline.account_for_embedding ? fields::kPipelineAccountForEmbedding
                                               : fields::kPipelineAccountForLoss,
              "layer accounting",
              "torchtitan has no Megatron-style embedding/loss accounting in its split",
              "set it to false");
  }
  const MixedPrecisionSpec mp = EffectiveMixedPrecision(p);
  if (p.precision == Precision::kFp8 && mp.fp8 != Fp8Recipe::kCurrent &&
      mp.fp8 != Fp8Recipe::kRowwise) {
    ex.Cannot(fields::kMixedPrecisionFp8, "this FP8 recipe",
              "torchtitan's float8 converter scales per tensor (current scaling) or per row",
              "set mixed_precision.fp8 = current or rowwise");
  }
  if (mp.grads == ElementType::kFp16) {
    ex.Cannot(fields::kMixedPrecisionGrads, "fp16 gradients",
              "torchtitan reduces in float32 or bfloat16", "use fp32 or bf16");
  }
  ex.RecordLimits({fields::kMixedPrecisionFp8, fields::kMixedPrecisionGrads, fields::kFsdpReplicate,
                   fields::kFsdpReshardAfterForward});
  ex.CommonLimits(false);
  return flavor;
}

std::string Torchtitan(Exporter& ex) {
  const Plan& p = ex.plan_;
  auto n = [](int64_t v) { return std::to_string(v); };
  const TitanFlavor* flavor = TorchtitanCheckLimits(ex);
  const MixedPrecisionSpec mp = EffectiveMixedPrecision(p);
  if (!ex.Ok()) return {};
  std::string t =
      "# " + p.name + ": written by planc export --to=torchtitan\n#\n# Derived by planc:\n";
  for (const std::string& d : ex.Derived()) t += "#   " + d + "\n";
  t += "# Launch: torchrun --nnodes " + n(p.cluster.nodes) + " --nproc-per-node " +
       n(p.cluster.gpus_per_node) + " -m torchtitan.train --job.config_file THIS_FILE\n\n";
  t += "[model]\nname = \"" + std::string(flavor->name) + "\"\nflavor = \"" +
       std::string(flavor->flavor) + "\"\n";
  if (p.precision == Precision::kFp8) t += "converters = [\"float8\"]\n";
  const char* mpp = p.precision == Precision::kFp16   ? "float16"
                    : p.precision == Precision::kFp32 ? "float32"
                                                      : "bfloat16";
  t += "\n[training]\nlocal_batch_size = " +
       n(p.parallel.pp > 1 ? p.batch.global / p.parallel.dp : p.batch.micro) +
       "\nglobal_batch_size = " + n(p.batch.global) + "\nseq_len = " + n(p.model.seq_len) +
       "\nsteps = " + n(p.train.steps) + "\nmax_norm = " + Real(p.optimizer.clip_grad) +
       "\nseed = " + n(p.train.seed) + "\nmixed_precision_param = \"" + mpp +
       "\"\nmixed_precision_reduce = \"" +
       (mp.grads == ElementType::kBf16 ? "bfloat16" : "float32") + "\"\n";
  const int64_t shard = p.optimizer.zero == 3 ? p.parallel.dp / p.fsdp.replicate : 1;
  const int64_t replicate = p.optimizer.zero == 3 ? p.fsdp.replicate : p.parallel.dp;
  t += "\n[parallelism]\ndata_parallel_replicate_degree = " + n(replicate) +
       "\ndata_parallel_shard_degree = " + n(shard) +
       "\ntensor_parallel_degree = " + n(p.parallel.tp) +
       "\npipeline_parallel_degree = " + n(p.parallel.pp) +
       "\ncontext_parallel_degree = " + n(p.parallel.cp) +
       "\nexpert_parallel_degree = " + n(p.parallel.ep) +
       "\nexpert_tensor_parallel_degree = " + n(p.parallel.etp) + "\n";
  if (!p.fsdp.reshard_after_forward) t += "fsdp_reshard_after_forward = \"never\"\n";
  if (p.parallel.tp_comm_overlap) t += "enable_async_tensor_parallel = true\n";
  if (p.parallel.pp > 1) {
    t += std::string("pipeline_parallel_schedule = \"") +
         (p.pipeline.schedule == Schedule::kGpipe ? "GPipe" : "1F1B") +
         "\"\npipeline_parallel_microbatch_size = " + n(p.batch.micro) + "\n";
  }
  t += "\n[activation_checkpoint]\nmode = \"" + std::string(ToString(p.recompute)) + "\"\n";
  t += "\n[optimizer]\nname = \"AdamW\"\nlr = " + Real(p.optimizer.lr) +
       "\neps = " + Real(p.optimizer.eps) + "\nweight_decay = " + Real(p.optimizer.weight_decay) +
       "\nbeta1 = " + Real(p.optimizer.beta1) + "\nbeta2 = " + Real(p.optimizer.beta2) + "\n";
  t += "\n[lr_scheduler]\nwarmup_steps = " + n(p.optimizer.warmup_steps) +
       "\nmin_lr_factor = " + Real(p.optimizer.min_lr / p.optimizer.lr) + "\n";
  if (!p.train.checkpoint_dir.empty()) {
    t += "\n[checkpoint]\nenable_checkpoint = true\nfolder = " +
         interop::QuoteString(p.train.checkpoint_dir) +
         "\ninterval = " + n(p.train.checkpoint_every) + "\n";
  }
  // torchtitan's async tensor parallelism runs only under torch.compile.
  if (p.compile || p.parallel.tp_comm_overlap) t += "\n[compile]\nenable = true\n";
  if (p.precision == Precision::kFp8 && mp.fp8 == Fp8Recipe::kRowwise)
    t += "\n[float8]\nrecipe_name = \"rowwise\"\n";
  return t;
}

// --- NeMo -------------------------------------------------------------------------------------

// What a NeMo GPT config cannot express, as diagnostics on `ex`.
void NemoCheckLimits(Exporter& ex) {
  const Plan& p = ex.plan_;
  const ModelSpec& m = p.model;
  auto n = [](int64_t v) { return std::to_string(v); };
  if (p.pipeline.schedule == Schedule::kGpipe) {
    ex.Cannot(fields::kPipelineSchedule, "GPipe",
              "NeMo runs Megatron-Core's 1F1B, interleaved with virtual stages", "use 1f1b");
  } else if ((p.pipeline.schedule == Schedule::kInterleaved1F1B) != (p.parallel.vpp > 1)) {
    ex.Cannot(fields::kPipelineSchedule, "the schedule",
              "NeMo interleaves exactly when there are virtual stages (vpp > 1)",
              "use interleaved_1f1b with vpp > 1, or 1f1b with vpp = 1");
  }
  if (p.optimizer.zero > 1) {
    ex.Cannot(fields::kOptimizerZero, "ZeRO-" + n(p.optimizer.zero),
              "NeMo's distributed_fused_adam shards the optimizer state (ZeRO-1)", "use zero = 1");
  }
  if (p.optimizer.offload == Offload::kCpu) {
    ex.Cannot(fields::kOptimizerOffload, "CPU offload",
              "NeMo's model.optim has no optimizer-state offload", "use offload = none");
  }
  if (m.IsMla()) {
    ex.Cannot("model", "multi-latent attention",
              "this exporter writes a NeMo GPT config, which has no multi-latent attention keys",
              "export to megatron");
  }
  if (m.IsMoe() && m.dense_layers > 0 && m.moe_layer_freq > 1) {
    ex.Cannot(fields::kModelMoeLayerFreq, "a frequency after dense layers",
              "planc reads moe_layer_freq as leading dense layers or as one frequency",
              "use one of them");
  }
  std::vector<FieldId> carried = CarriedSettings();
  carried.insert(carried.end(), {});
  ex.RecordLimits(carried);
  const MixedPrecisionSpec mp = EffectiveMixedPrecision(p);
  // grad_reduce_in_fp32 false is the model's 16-bit type: bf16 gradients under fp16 are not it.
  const ElementType half =
      p.precision == Precision::kFp16 ? ElementType::kFp16 : ElementType::kBf16;
  if (mp.grads != ElementType::kFp32 && mp.grads != half) {
    ex.Cannot(fields::kMixedPrecisionGrads, "these gradients",
              "Megatron-Bridge keeps gradients in fp32 or in the model's 16-bit type "
              "(grad_reduce_in_fp32)",
              "use grads = fp32, or the precision's own 16-bit type");
  }
  if (m.IsMoe() && m.router_score == RouterScore::kSigmoid && !m.router_topk_norm && m.topk > 1) {
    ex.Cannot(fields::kModelRouterTopkNorm, "a sigmoid router without renormalisation",
              "Megatron-Core's sigmoid router always renormalises its top-k weights",
              "set `model.router_topk_norm = true`");
  }
  if (IdleFp8Recipe(p)) {
    ex.Cannot(fields::kMixedPrecisionFp8, "an FP8 recipe without FP8",
              "NeMo turns FP8 on with model.fp8", "set precision = fp8");
  }
  if (mp.fp8 == Fp8Recipe::kRowwise) {
    ex.Cannot(fields::kMixedPrecisionFp8, "row-wise FP8 scaling",
              "NeMo's fp8_recipe has delayed, tensorwise, blockwise and mxfp8",
              "use blockwise (1x128 activations, 128x128 weights) or current");
  }
  if (m.activation == Activation::kSquaredRelu) {
    ex.Cannot(fields::kModelActivation, "squared ReLU",
              "this exporter writes NeMo's swiglu and gelu only", "export to megatron");
  }
  ex.CommonLimits(false, true);
}

// The MoE keys of the NeMo config's `model:` section, in Megatron-Core's TransformerConfig names
// (what Megatron-Bridge's model providers and NeMo's Megatron-Core models read). The router is
// written in full: where the file is silent, import takes a stdlib model's router.
template <typename KeyValue>
void NemoMoeKeys(const Plan& p, KeyValue& kv) {
  const ModelSpec& m = p.model;
  auto n = [](int64_t v) { return std::to_string(v); };
  kv("num_moe_experts", n(m.experts));
  kv("moe_router_topk", n(m.topk));
  kv("moe_ffn_hidden_size", n(m.ExpertFfn()));
  if (m.shared_experts > 0)
    kv("moe_shared_expert_intermediate_size", n(m.shared_experts * m.ExpertFfn()));
  if (m.dense_layers > 0) {
    std::string list;
    for (int64_t i = 0; i < m.layers; ++i)
      list += std::string(i ? ", " : "") + (i < m.dense_layers ? "0" : "1");
    kv("moe_layer_freq", "[" + list + "]");
  } else {
    kv("moe_layer_freq", n(m.moe_layer_freq));
  }
  kv("moe_router_score_function", m.router_score == RouterScore::kSigmoid ? "sigmoid" : "softmax");
  if (m.router_score == RouterScore::kSoftmax)
    kv("moe_router_pre_softmax", m.router_topk_norm ? "false" : "true");
  kv("moe_aux_loss_coeff", Real(m.router_aux_coeff));
  if (m.router_bias_rate > 0) {
    kv("moe_router_enable_expert_bias", "true");
    kv("moe_router_bias_update_rate", Real(m.router_bias_rate));
  }
  if (m.router_groups > 1 || m.router_group_topk > 1) {
    kv("moe_router_num_groups", n(m.router_groups));
    kv("moe_router_group_topk", n(m.router_group_topk));
  }
  if (m.router_scale != 1) kv("moe_router_topk_scaling_factor", Real(m.router_scale));
}

// The keys of the NeMo config's `model:` section, one "  key: value" line each.
std::string NemoModelKeys(const Plan& p) {
  const ModelSpec& m = p.model;
  const MixedPrecisionSpec mp = EffectiveMixedPrecision(p);
  auto n = [](int64_t v) { return std::to_string(v); };
  std::string y;
  auto kv = [&](const std::string& k, const std::string& v) { y += "  " + k + ": " + v + "\n"; };
  kv("micro_batch_size", n(p.batch.micro));
  kv("global_batch_size", n(p.batch.global));
  kv("tensor_model_parallel_size", n(p.parallel.tp));
  kv("pipeline_model_parallel_size", n(p.parallel.pp));
  kv("virtual_pipeline_model_parallel_size", p.parallel.vpp > 1 ? n(p.parallel.vpp) : "null");
  kv("context_parallel_size", n(p.parallel.cp));
  kv("expert_model_parallel_size", n(p.parallel.ep));
  kv("expert_tensor_parallel_size", n(p.parallel.etp));
  kv("sequence_parallel", p.parallel.sp ? "true" : "false");
  if (p.parallel.tp_comm_overlap) kv("ub_tp_comm_overlap", "true");
  kv("account_for_embedding_in_pipeline_split",
     p.pipeline.account_for_embedding ? "true" : "false");
  kv("account_for_loss_in_pipeline_split", p.pipeline.account_for_loss ? "true" : "false");
  if (p.pipeline.first_stage_layers)
    kv("num_layers_in_first_pipeline_stage", n(*p.pipeline.first_stage_layers));
  if (p.pipeline.last_stage_layers)
    kv("num_layers_in_last_pipeline_stage", n(*p.pipeline.last_stage_layers));
  if (const std::string layout = PipelineLayout(p); !layout.empty())
    kv("pipeline_model_parallel_layout", "\"" + layout + "\"");
  kv("encoder_seq_length", n(m.seq_len));
  kv("max_position_embeddings", n(m.seq_len));
  kv("num_layers", n(m.layers));
  kv("hidden_size", n(m.hidden));
  kv("ffn_hidden_size", n(m.ffn_hidden));
  kv("num_attention_heads", n(m.heads));
  kv("num_query_groups", n(m.kv_heads));
  kv("kv_channels", n(m.head_dim));
  kv("vocab_size", n(m.vocab));
  kv("make_vocab_size_divisible_by", n(m.vocab_divisor));
  kv("normalization", m.norm == Norm::kRmsNorm ? "rmsnorm" : "layernorm");
  kv("activation", m.activation == Activation::kSwiGlu ? "fast-swiglu" : "gelu");
  kv("position_embedding_type", m.position == Position::kRope ? "rope" : "learned_absolute");
  kv("share_embeddings_and_output_weights", m.tied_embeddings ? "true" : "false");
  kv("qk_layernorm", m.qk_norm ? "true" : "false");
  if (m.mtp_layers > 0) kv("mtp_num_layers", n(m.mtp_layers));
  if (m.mtp_loss_scale != 0.1) kv("mtp_loss_scaling_factor", Real(m.mtp_loss_scale));
  if (m.IsMoe()) NemoMoeKeys(p, kv);
  if (p.moe.capacity_factor > 0) kv("moe_expert_capacity_factor", Real(p.moe.capacity_factor));
  if (p.moe.drop_policy == DropPolicy::kPosition) kv("moe_token_drop_policy", "position");
  if (p.activations.offload_layers > 0)
    kv("cpu_offloading_num_layers", n(p.activations.offload_layers));
  kv("activations_checkpoint_granularity",
     p.recompute == Recompute::kNone ? "null" : std::string(ToString(p.recompute)));
  if (p.recompute == Recompute::kFull) {
    kv("activations_checkpoint_method",
       p.activations.recompute_method == RecomputeMethod::kBlock ? "block" : "uniform");
    kv("activations_checkpoint_num_layers", n(p.activations.recompute_layers));
  }
  if (!p.activations.recompute_modules.empty()) {
    std::string list;
    std::string item;
    for (char c : p.activations.recompute_modules + ",") {
      if (c == ',') {
        if (!item.empty()) list += (list.empty() ? "" : ", ") + item;
        item.clear();
      } else if (c != ' ') {
        item += c;
      }
    }
    kv("recompute_modules", "[" + list + "]");
  }
  kv("fp8", p.precision == Precision::kFp8 ? "true" : "false");
  if (p.precision == Precision::kFp8) {
    const char* recipe = mp.fp8 == Fp8Recipe::kCurrent     ? "tensorwise"
                         : mp.fp8 == Fp8Recipe::kBlockwise ? "blockwise"
                         : mp.fp8 == Fp8Recipe::kMxfp8     ? "mxfp8"
                                                           : "delayed";
    kv("fp8_recipe", recipe);
    kv("fp8_params", mp.fp8_params ? "true" : "false");
  }
  if (m.IsMoe() && p.moe.dispatcher != Dispatcher::kAllToAll) {
    kv("moe_token_dispatcher_type",
       p.moe.dispatcher == Dispatcher::kAllGather ? "allgather" : "flex");
  }
  kv("seed", n(p.train.seed));
  return y;
}

std::string Nemo(Exporter& ex) {
  const Plan& p = ex.plan_;
  auto n = [](int64_t v) { return std::to_string(v); };
  NemoCheckLimits(ex);
  if (!ex.Ok()) return {};
  std::string y = "# " + p.name + ": written by planc export --to=nemo\n#\n# Derived by planc:\n";
  for (const std::string& d : ex.Derived()) y += "#   " + d + "\n";
  const char* precision = p.precision == Precision::kFp16   ? "16-mixed"
                          : p.precision == Precision::kFp32 ? "32"
                                                            : "bf16-mixed";
  y += "trainer:\n  num_nodes: " + n(p.cluster.nodes) +
       "\n  devices: " + n(p.cluster.gpus_per_node) + "\n  precision: " + precision +
       "\n  max_steps: " + n(p.train.steps) +
       "\n  gradient_clip_val: " + Real(p.optimizer.clip_grad) + "\nmodel:\n";
  y += NemoModelKeys(p);
  y += "  optim:\n    name: " +
       std::string(p.optimizer.type == OptimizerType::kSgd ? "sgd"
                   : p.optimizer.zero == 1                 ? "distributed_fused_adam"
                                                           : "fused_adam") +
       "\n    lr: " + Real(p.optimizer.lr) +
       "\n    weight_decay: " + Real(p.optimizer.weight_decay) +
       "\n    eps: " + Real(p.optimizer.eps) + "\n    betas: [" + Real(p.optimizer.beta1) + ", " +
       Real(p.optimizer.beta2) +
       "]\n    sched:\n      warmup_steps: " + n(p.optimizer.warmup_steps) +
       "\n      min_lr: " + Real(p.optimizer.min_lr) + "\n";
  // Megatron-Bridge's gradient buffers, stated under both of its keys (its mixed-precision setup
  // copies the second into the first).
  const MixedPrecisionSpec mp = EffectiveMixedPrecision(p);
  if (mp.grads != (p.precision == Precision::kFp16 ? ElementType::kFp16 : ElementType::kFp32)) {
    const char* fp32 = mp.grads == ElementType::kFp32 ? "true" : "false";
    y += std::string("ddp:\n  grad_reduce_in_fp32: ") + fp32 +
         "\nmixed_precision:\n  grad_reduce_in_fp32: " + fp32 + "\n";
  }
  return y;
}

}  // namespace

ExportResult ExportPlan(ConfigKind kind, const Plan& plan, DiagnosticSink& sink) {
  Exporter ex(kind, plan, sink);
  ExportResult out;
  switch (kind) {
    case ConfigKind::kMegatron: {
      auto args = MegatronArgs(ex, false);
      if (ex.Ok()) {
        out.text = ShellScript(
            ex, "torchrun --nnodes $NNODES --nproc-per-node $GPUS_PER_NODE pretrain_gpt.py", args,
            "");
      }
      break;
    }
    case ConfigKind::kDeepSpeed: {
      DeepSpeedLimits(ex);
      auto args = MegatronArgs(ex, true);
      if (!ex.Ok()) break;
      args.push_back("--deepspeed");
      args.push_back("--deepspeed_config ds_config.json");
      out.companion_name = "ds_config.json";
      out.companion_text = DeepSpeedJson(ex);
      out.text = ShellScript(
          ex, "deepspeed --num_nodes $NNODES --num_gpus $GPUS_PER_NODE pretrain_gpt.py", args,
          "# Megatron-DeepSpeed arguments; batch, ZeRO, precision and the optimizer are in "
          "ds_config.json\n");
      break;
    }
    case ConfigKind::kTorchtitan:
      out.text = Torchtitan(ex);
      break;
    case ConfigKind::kNemo:
      out.text = Nemo(ex);
      break;
  }
  if (!ex.Ok()) out = {};
  return out;
}

}  // namespace paraplan
