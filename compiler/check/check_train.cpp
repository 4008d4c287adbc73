// Batch, optimizer sharding, precision and the model's own shape (attention heads, MLA, MoE
// routing, vocabulary padding). See docs/diagnostics/P05xx.md.
#include <string>

#include "compiler/base/checked.h"
#include "compiler/check/rule_support.h"

namespace paraplan::rules {
namespace {

bool CheckGlobalBatchNotDivisible(RuleContext& ctx) {
  const Plan& p = ctx.plan();
  const BatchSpec& b = p.batch;
  const int64_t dp = p.parallel.dp;
  if (b.global <= 0 || b.micro <= 0 || dp <= 0) return false;
  auto per_step = CheckedMul(b.micro, dp);
  if (per_step && b.global % *per_step == 0) return false;
  std::string per = per_step ? std::to_string(*per_step) : std::string("(overflow)");
  RuleDiag d(
      ctx, DiagKind::kGlobalBatchNotDivisible,
      per_step && b.global < *per_step
          ? "`global = " + std::to_string(b.global) +
                "` is smaller than one microbatch on every replica, micro · dp = " + per
          : "`global = " + std::to_string(b.global) + "` is not a multiple of micro · dp = " + per);
  d.At({fields::kBatchGlobal}, per_step ? std::to_string(b.global) + " / " + per + " = " +
                                              Ratio(b.global, *per_step) + " microbatches"
                                        : std::string("too large"));
  d.Field(fields::kBatchMicro, b.micro).Field(fields::kParallelDp, dp);
  d.Value("microbatches = global / (micro · dp)",
          std::to_string(b.global) + " / (" + Dot({b.micro, dp}) +
              ") = " + (per_step ? Ratio(b.global, *per_step) : "?") + ", not a whole number");
  d.Note(
      "each step runs the same whole number of microbatches on every data-parallel replica "
      "(Megatron-Core: "
      "\"global batch size (" +
      std::to_string(b.global) + ") is not divisible by micro batch size (" +
      std::to_string(b.micro) + ") times data parallel size (" + std::to_string(dp) + ")\")");
  if (ctx.helps() && per_step) {
    int64_t down = b.global / *per_step * *per_step;
    std::vector<int64_t> cands;
    if (down > 0) cands.push_back(down);
    if (auto up = CheckedAdd(down, *per_step)) cands.push_back(*up);
    auto ok = ctx.WorkingValues(fields::kBatchGlobal, cands, DiagKind::kGlobalBatchNotDivisible, 2);
    if (!ok.empty()) d.Help("the nearest global batches that divide: " + Choices("global", ok));
    if (b.global % dp == 0) {
      auto micros = ctx.WorkingValues(fields::kBatchMicro, Divisors(b.global / dp),
                                      DiagKind::kGlobalBatchNotDivisible, 4);
      if (!micros.empty())
        d.Help("or keep `global = " + std::to_string(b.global) + "` with " +
               Choices("micro", micros));
    }
  }
  d.Report();
  return true;
}

bool CheckVocabPadded(RuleContext& ctx) {
  const Plan& p = ctx.plan();
  const int64_t v = p.model.vocab;
  const int64_t tp = p.parallel.tp;
  if (v <= 0 || tp <= 0) return false;
  // torchtitan and LLM Foundry split the vocabulary as configured: nothing is padded.
  if (p.framework == Framework::kTorchtitan || p.framework == Framework::kLlmFoundry) return false;
  // A divisor the plan states is a choice the user made: the padding is then no news.
  const OriginKind divisor_origin = p.Origin(fields::kModelVocabDivisor).kind;
  if (divisor_origin == OriginKind::kFile || divisor_origin == OriginKind::kCommandLine) {
    return false;
  }
  const int64_t divisor = p.model.vocab_divisor;
  auto multiple = CheckedMul(divisor, tp);
  if (!multiple) return false;
  auto padded = RoundUpToMultiple(v, *multiple);
  if (!padded || *padded == v) return false;
  RuleDiag d(ctx, DiagKind::kVocabPadded,
             "the vocabulary of " + std::to_string(v) + " is padded to " + std::to_string(*padded) +
                 " rows, a multiple of " + std::to_string(divisor) +
                 " · tp = " + std::to_string(*multiple));
  d.At({fields::kModelVocab, fields::kParallelTp},
       "vocabulary padded by " + std::to_string(*padded - v) + " rows");
  d.Field(fields::kModelVocab, v).Field(fields::kParallelTp, tp);
  d.Value("padded = ⌈vocab / (" + std::to_string(divisor) + " · tp)⌉ · " + std::to_string(divisor) +
              " · tp",
          "⌈" + std::to_string(v) + " / " + std::to_string(*multiple) + "⌉ · " +
              std::to_string(*multiple) + " = " + std::to_string(*padded) + " (+" +
              std::to_string(*padded - v) + ")");
  d.Note(
      "Megatron-LM pads the vocabulary so that the embedding and the output layer split evenly "
      "over tp "
      "(make_vocab_size_divisible_by = 128); the padded rows take memory and compute and are never "
      "predicted");
  d.Help(
      "state the divisor your run uses (`model.vocab_divisor = 128`) to keep this note quiet, or "
      "`model.vocab_divisor = 1` for no padding");
  d.Report();
  return true;
}

bool CheckOffloadWithoutZero(RuleContext& ctx) {
  const OptimizerSpec& o = ctx.plan().optimizer;
  if (o.offload != Offload::kCpu || o.zero != 0) return false;
  RuleDiag d(ctx, DiagKind::kOffloadWithoutZero,
             "`offload = cpu` without a sharded optimizer (`zero = 0`)");
  d.At({fields::kOptimizerOffload}, "offloads the optimizer");
  d.Field(fields::kOptimizerZero, o.zero);
  d.Note(
      "CPU offloading moves the sharded optimizer state and step to the host: DeepSpeed's "
      "ZeRO-Offload "
      "is a ZeRO option, and Megatron-Core's optimizer CPU offload runs on its distributed "
      "optimizer");
  d.Help("set `zero = 1` (or higher), or remove `offload`");
  d.Report();
  return true;
}

// A written FP8 recipe under another precision: it has no effect (UsesFp8). The models price
// the plan in its 16-bit precision; the exports and `planc compile` refuse the recipe rather
// than drop what was probably meant as FP8 training.
bool CheckFp8RecipeWithoutFp8(RuleContext& ctx) {
  const Plan& p = ctx.plan();
  if (!IdleFp8Recipe(p)) return false;
  const std::string recipe(ToString(EffectiveMixedPrecision(p).fp8));
  RuleDiag d(ctx, DiagKind::kFp8RecipeWithoutFp8,
             "`mixed_precision.fp8 = " + recipe + "` with `precision = " +
                 std::string(ToString(p.precision)) + "`: the recipe has no effect without FP8");
  d.At({fields::kMixedPrecisionFp8}, "an FP8 recipe");
  d.Field(fields::kPrecision, std::string(ToString(p.precision)));
  d.Note(
      "FP8 runs only under `precision = fp8` (Megatron-LM's --fp8-format, NeMo's fp8, "
      "torchtitan's float8 converter; the recipe says how it scales): the time and memory models "
      "price this plan in " +
      std::string(ToString(p.precision)) +
      ", and the exports and `planc compile` refuse the recipe rather than drop it");
  d.Help("set `precision = fp8` for FP8 training, or `mixed_precision.fp8 = none`");
  d.Report();
  return true;
}

// `fsdp.max_live_params` is DeepSpeed ZeRO-3's stage3_max_live_parameters; FSDP and
// Megatron-FSDP gather whole layers and have no such cap.
bool CheckMaxLiveParamsUnused(RuleContext& ctx) {
  const Plan& p = ctx.plan();
  if (p.fsdp.max_live_params <= 0 ||
      (p.framework == Framework::kDeepSpeed && p.optimizer.zero >= 3))
    return false;
  const bool deepspeed = p.framework == Framework::kDeepSpeed;
  RuleDiag d(ctx, DiagKind::kMaxLiveParamsUnused,
             deepspeed ? "`fsdp.max_live_params` without ZeRO-3: no parameters are gathered"
                       : "`fsdp.max_live_params` is DeepSpeed's: `framework = " +
                             std::string(ToString(p.framework)) + "` has no such cap");
  d.At({fields::kFsdpMaxLiveParams}, "has no effect");
  if (deepspeed)
    d.Field(fields::kOptimizerZero, p.optimizer.zero);
  else
    d.Field(fields::kFramework, std::string(ToString(p.framework)));
  d.Note(
      "DeepSpeed ZeRO-3 gathers parameters tensor by tensor and stops prefetching once this many "
      "are resident (stage3_max_live_parameters); FSDP, FSDP2 and Megatron-FSDP gather whole "
      "layers, two at a time, and the memory model prices them so");
  d.Help(deepspeed ? "remove it, or set `optimizer.zero = 3`"
                   : "remove it, or set `framework = deepspeed`");
  d.Report();
  return true;
}

// DeepSpeed's pipeline engine refuses ZeRO-2/3; Megatron-Core shards gradients per bucket once
// per step, and torchtitan's FSDP2 keeps parameters unsharded across the microbatches of a
// pipeline step (reshard_after_forward off), so only DeepSpeed hears this.
bool CheckZeroWithPipeline(RuleContext& ctx) {
  const Plan& p = ctx.plan();
  const OptimizerSpec& o = p.optimizer;
  const ParallelSpec& par = p.parallel;
  if (o.zero < 2 || par.pp <= 1 || p.framework != Framework::kDeepSpeed) return false;
  RuleDiag d(ctx, DiagKind::kZeroWithPipeline,
             "`zero = " + std::to_string(o.zero) + "` with `pp = " + std::to_string(par.pp) +
                 "`: " + (o.zero == 2 ? "gradient" : "parameter") +
                 " sharding does not combine with pipeline parallelism");
  d.At({fields::kOptimizerZero}, o.zero == 2 ? "shards gradients" : "shards parameters");
  d.Field(fields::kParallelPp, par.pp);
  d.Field(fields::kFramework, "deepspeed");
  d.Note(
      "gradients accumulate across the microbatches of a pipeline step, so sharding them "
      "(ZeRO-2) or the "
      "parameters (ZeRO-3) would reduce or gather them once per microbatch; DeepSpeed's pipeline "
      "engine "
      "refuses it (\"ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism\")");
  d.Help(
      "use `zero = 1` with pipeline parallelism, or `pp = 1`; torchtitan (`framework = "
      "torchtitan`) "
      "combines FSDP with pipeline parallelism");
  d.Report();
  return true;
}

bool CheckZeroWithoutDp(RuleContext& ctx) {
  const Plan& p = ctx.plan();
  const OptimizerSpec& o = p.optimizer;
  const ParallelSpec& par = p.parallel;
  if (o.zero < 1) return false;
  auto domain = CheckedMul(par.dp, par.cp);
  int64_t edp = p.model.IsMoe() ? p.Edp() : 1;
  if (!domain || *domain != 1 || edp > 1) return false;
  RuleDiag d(
      ctx, DiagKind::kZeroWithoutDp,
      "`zero = " + std::to_string(o.zero) + "` shards over dp · cp = 1 rank: nothing is sharded");
  d.At({fields::kOptimizerZero}, "no data-parallel ranks to shard over");
  d.Field(fields::kParallelDp, par.dp).Field(fields::kParallelCp, par.cp);
  d.Value("dp · cp", Dot({par.dp, par.cp}) + " = 1");
  d.Note(
      "ZeRO (Megatron's distributed optimizer) splits optimizer state, and at higher stages "
      "gradients "
      "and parameters, over the data-parallel ranks (dp · cp for dense weights); with one rank "
      "each "
      "holds everything");
  d.Help("use fewer model-parallel ranks (smaller tp, pp or cp) so that dp > 1, or more nodes");
  d.Report();
  return true;
}

// The records that refine the shorthands: recompute modules are Megatron's names.
bool CheckUnknownRecomputeModule(RuleContext& ctx) {
  const Plan& p = ctx.plan();
  std::string bad;
  if (ParseRecomputeModules(p.activations.recompute_modules, &bad)) return false;
  std::string names;
  for (std::string_view n : RecomputeModuleNames())
    names += (names.empty() ? "" : ", ") + std::string(n);
  RuleDiag d(ctx, DiagKind::kUnknownEnumValue,
             "`" + bad + "` is not a module of `activations.recompute_modules`");
  d.At({fields::kActivationsRecomputeModules}, "names modules to recompute");
  d.Note("the modules are Megatron-Core's --recompute-modules: " + names);
  d.Report();
  return true;
}

// The FSDP degrees multiply to the data-parallel group they shard.
bool CheckFsdpDegreesMismatch(RuleContext& ctx) {
  const Plan& p = ctx.plan();
  auto group = CheckedMul(p.parallel.dp, p.parallel.cp);
  if (!group || p.fsdp.replicate <= 0) return false;
  const int64_t shard = p.fsdp.shard > 0 ? p.fsdp.shard : *group / p.fsdp.replicate;
  auto product = CheckedMul(shard, p.fsdp.replicate);
  if (shard >= 1 && product && *product == *group) return false;
  RuleDiag d(ctx, DiagKind::kFsdpDegreesMismatch,
             p.fsdp.shard > 0
                 ? "`fsdp.shard` · `fsdp.replicate` is not the data-parallel group dp · cp"
                 : "`fsdp.replicate` does not divide the data-parallel group dp · cp");
  d.At({fields::kFsdpReplicate, fields::kFsdpShard}, "sharding degrees");
  d.Field(fields::kFsdpReplicate, p.fsdp.replicate)
      .Field(fields::kParallelDp, p.parallel.dp)
      .Field(fields::kParallelCp, p.parallel.cp);
  if (p.fsdp.shard > 0) d.Field(fields::kFsdpShard, p.fsdp.shard);
  d.Value("dp · cp", Dot({p.parallel.dp, p.parallel.cp}) + " = " + std::to_string(*group));
  d.Note(
      "model states are sharded over `shard` ranks and that group is replicated `replicate` times "
      "(HSDP): every data-parallel rank is in exactly one shard group");
  d.Help(
      "leave `fsdp.shard` unset (it follows dp · cp / replicate), and pick `fsdp.replicate` "
      "dividing " +
      std::to_string(*group));
  d.Report();
  return true;
}

bool CheckFp16WithEp(RuleContext& ctx) {
  const Plan& p = ctx.plan();
  if (p.precision != Precision::kFp16 || p.parallel.ep <= 1) return false;
  RuleDiag d(
      ctx, DiagKind::kFp16WithEp,
      "`precision = fp16` with expert parallelism (`ep = " + std::to_string(p.parallel.ep) + "`)");
  d.At({fields::kPrecision}, "fp16");
  d.Field(fields::kParallelEp, p.parallel.ep);
  d.Note(
      "Megatron-LM up to core v0.15 refuses this (\"Expert parallelism is not supported with "
      "fp16 "
      "training.\"); later versions accept it");
  d.Help("use `precision = bf16`, which needs no loss scaling");
  d.Report();
  return true;
}

bool CheckFp8Unsupported(RuleContext& ctx) {
  const Plan& p = ctx.plan();
  const GpuSpec& gpu = p.cluster.gpu;
  if (p.precision != Precision::kFp8 || gpu.peak_fp8 >= kMinFp8Peak ||
      (gpu.peak_bf16 <= 0 && gpu.name.empty())) {
    return false;
  }
  RuleDiag d(ctx, DiagKind::kFp8Unsupported,
             "`precision = fp8` on " +
                 (gpu.name.empty() ? std::string("a GPU") : "`" + gpu.name + "`") +
                 ", which has no fp8 tensor cores");
  d.At({fields::kPrecision}, "fp8");
  d.Field(fields::kClusterGpuPeakFp8, "0");
  d.Note(
      "fp8 training (Transformer Engine) needs fp8 tensor cores: Hopper (H100, H200, H800) or "
      "newer; "
      "the GPU record gives no fp8 peak");
  d.Help("use `precision = bf16` on this GPU, or a cluster with Hopper GPUs");
  d.Report();
  return true;
}

bool CheckTopkExceedsExperts(RuleContext& ctx) {
  const ModelSpec& m = ctx.plan().model;
  if (!m.IsMoe() || m.topk <= m.experts) return false;
  RuleDiag d(ctx, DiagKind::kTopkExceedsExperts,
             "`topk = " + std::to_string(m.topk) + "` routes each token to more experts than the " +
                 std::to_string(m.experts) + " there are");
  d.At({fields::kModelTopk}, "more than " + std::to_string(m.experts) + " experts");
  d.Field(fields::kModelExperts, m.experts);
  d.Note(
      "the router picks topk distinct experts per token; Megatron has no check and fails inside "
      "torch.topk at the first forward step");
  d.Help("`topk` at most " + std::to_string(m.experts));
  d.Report();
  return true;
}

// Group-limited routing (Megatron-Core's group_limited_topk): the experts split into equal
// groups, the kept groups exist, each kept group contributes its topk / group_topk best scores
// to the group's score (at least one), and the kept groups hold at least topk experts.
bool CheckRouterGroups(RuleContext& ctx) {
  const ModelSpec& m = ctx.plan().model;
  const int64_t g = m.router_groups, gk = m.router_group_topk, e = m.experts, k = m.topk;
  if (!m.IsMoe() || k > e || g <= 0 || gk <= 0 || (g == 1 && gk == 1)) return false;
  const std::string gs = std::to_string(g), gks = std::to_string(gk), es = std::to_string(e),
                    ks = std::to_string(k);
  const char* rule =
      "group-limited routing splits the experts into router_groups equal groups, keeps the "
      "router_group_topk groups whose best topk / router_group_topk scores sum highest, and "
      "picks the top k among their experts (Megatron-Core's --moe-router-num-groups and "
      "--moe-router-group-topk)";
  if (e % g != 0) {
    RuleDiag d(ctx, DiagKind::kRouterGroupsMismatch,
               "`router_groups = " + gs + "` does not divide the " + es + " experts");
    d.At({fields::kModelRouterGroups}, "experts / router_groups = " + Ratio(e, g));
    d.Field(fields::kModelExperts, e);
    d.Note(rule);
    d.Help("`router_groups` among the divisors of " + es + ": " + List(Divisors(e)));
    d.Report();
    return true;
  }
  if (gk > g) {
    RuleDiag d(ctx, DiagKind::kRouterGroupsMismatch,
               "`router_group_topk = " + gks + "` keeps more groups than the " + gs + " there are");
    d.At({fields::kModelRouterGroupTopk}, "more than " + gs + " groups");
    d.Field(fields::kModelRouterGroups, g);
    d.Note(rule);
    d.Help("`router_group_topk` at most " + gs);
    d.Report();
    return true;
  }
  if (k < gk) {
    RuleDiag d(
        ctx, DiagKind::kRouterGroupsMismatch,
        "`topk = " + ks + "` is fewer than the " + gks + " groups `router_group_topk` keeps");
    d.At({fields::kModelRouterGroupTopk},
         "topk / router_group_topk = " + ks + " / " + gks + " rounds down to 0 scores per group");
    d.Field(fields::kModelTopk, k);
    d.Note(rule);
    d.Help("`router_group_topk` at most " + ks);
    d.Report();
    return true;
  }
  const int64_t per_group = e / g, kept = gk * per_group;
  if (k > kept) {
    RuleDiag d(ctx, DiagKind::kRouterGroupsMismatch,
               "`topk = " + ks + "` routes each token to more experts than the " +
                   std::to_string(kept) + " its kept groups hold");
    d.At({fields::kModelTopk}, "more than " + std::to_string(kept) + " experts");
    d.Field(fields::kModelRouterGroupTopk, gk)
        .Field(fields::kModelRouterGroups, g)
        .Field(fields::kModelExperts, e);
    d.Value("router_group_topk · experts / router_groups",
            gks + " · " + es + " / " + gs + " = " + std::to_string(kept));
    d.Note(rule);
    d.Help("`router_group_topk` at least " + std::to_string((k + per_group - 1) / per_group) +
           ", or `topk` at most " + std::to_string(kept));
    d.Report();
    return true;
  }
  return false;
}

bool CheckDenseLayersExceedLayers(RuleContext& ctx) {
  const ModelSpec& m = ctx.plan().model;
  if (m.dense_layers <= m.layers) return false;
  RuleDiag d(ctx, DiagKind::kDenseLayersExceedLayers,
             "`dense_layers = " + std::to_string(m.dense_layers) + "` is more than the model's " +
                 std::to_string(m.layers) + " layers");
  d.At({fields::kModelDenseLayers}, "leading dense layers");
  d.Field(fields::kModelLayers, m.layers);
  d.Note(
      "dense_layers counts the leading layers that use a dense MLP instead of experts; they are "
      "part of "
      "the model's layers");
  d.Help("`dense_layers` at most " + std::to_string(m.layers));
  d.Report();
  return true;
}

bool CheckHiddenNotDivisibleByHeads(RuleContext& ctx) {
  const Plan& p = ctx.plan();
  const ModelSpec& m = p.model;
  const OriginKind head_dim_origin = p.Origin(fields::kModelHeadDim).kind;
  const bool head_dim_given = head_dim_origin == OriginKind::kFile ||
                              head_dim_origin == OriginKind::kStdlib ||
                              head_dim_origin == OriginKind::kCommandLine;
  if (m.IsMla() || head_dim_given || m.heads <= 0 || m.hidden % m.heads == 0) return false;
  RuleDiag d(ctx, DiagKind::kHiddenNotDivisibleByHeads,
             "`hidden = " + std::to_string(m.hidden) +
                 "` is not a multiple of `heads = " + std::to_string(m.heads) + "`");
  d.At({fields::kModelHeads, fields::kModelHidden}, "hidden / heads = " + Ratio(m.hidden, m.heads));
  d.Field(fields::kModelHidden, m.hidden).Field(fields::kModelHeads, m.heads);
  d.Note(
      "without an explicit head_dim each head gets hidden / heads channels (Megatron-LM asserts "
      "hidden_size % num_attention_heads == 0 when kv_channels is not given)");
  d.Help("give `head_dim` explicitly, or choose `heads` among the divisors of " +
         std::to_string(m.hidden));
  d.Report();
  return true;
}

bool CheckHeadsNotDivisibleByKvHeads(RuleContext& ctx) {
  const ModelSpec& m = ctx.plan().model;
  if (m.kv_heads <= 0 || m.heads <= 0 || m.heads % m.kv_heads == 0) return false;
  RuleDiag d(ctx, DiagKind::kHeadsNotDivisibleByKvHeads,
             "the " + std::to_string(m.heads) +
                 " attention heads do not form whole groups over `kv_heads = " +
                 std::to_string(m.kv_heads) + "`");
  d.At({fields::kModelKvHeads}, "heads / kv_heads = " + Ratio(m.heads, m.kv_heads));
  d.Field(fields::kModelHeads, m.heads);
  d.Note("grouped-query attention shares each KV head among heads / kv_heads query heads");
  d.Help("`kv_heads` among the divisors of " + std::to_string(m.heads) + ": " +
         List(Divisors(m.heads)));
  d.Report();
  return true;
}

bool CheckMlaIncomplete(RuleContext& ctx) {
  const ModelSpec& m = ctx.plan().model;
  if (!m.IsMla() || (m.qk_nope_head_dim > 0 && m.qk_rope_head_dim > 0 && m.v_head_dim > 0)) {
    return false;
  }
  RuleDiag d(ctx, DiagKind::kMlaIncomplete,
             "`kv_lora_rank = " + std::to_string(m.kv_lora_rank) +
                 "` makes this multi-latent attention, but its head dimensions are missing");
  d.At({fields::kModelKvLoraRank}, "multi-latent attention");
  d.Field(fields::kModelQkNopeHeadDim, m.qk_nope_head_dim)
      .Field(fields::kModelQkRopeHeadDim, m.qk_rope_head_dim)
      .Field(fields::kModelVHeadDim, m.v_head_dim);
  d.Value("qk_nope_head_dim, qk_rope_head_dim, v_head_dim",
          std::to_string(m.qk_nope_head_dim) + ", " + std::to_string(m.qk_rope_head_dim) + ", " +
              std::to_string(m.v_head_dim));
  d.Note(
      "MLA needs the per-head query/key sizes without and with RoPE and the per-head value "
      "size");
  d.Help(
      "set `qk_nope_head_dim`, `qk_rope_head_dim` and `v_head_dim` (DeepSeek-V2: 128, 64, "
      "128)");
  d.Report();
  return true;
}

bool CheckMlaWithGqa(RuleContext& ctx) {
  const ModelSpec& m = ctx.plan().model;
  if (!m.IsMla() || m.kv_heads <= 0 || m.kv_heads == m.heads) return false;
  RuleDiag d(ctx, DiagKind::kMlaWithGqa,
             "multi-latent attention with `kv_heads = " + std::to_string(m.kv_heads) +
                 "` < `heads = " + std::to_string(m.heads) + "`");
  d.At({fields::kModelKvHeads, fields::kModelKvLoraRank}, "grouped-query attention");
  d.Field(fields::kModelKvLoraRank, m.kv_lora_rank).Field(fields::kModelHeads, m.heads);
  d.Note(
      "MLA compresses keys and values into a latent of kv_lora_rank and expands them for every "
      "head; "
      "it does not combine with grouped-query attention (Megatron-LM: \"Group query attention "
      "is "
      "mutually exclusive with multi latent attention.\")");
  d.Help("set `kv_heads = " + std::to_string(m.heads) +
         "`, or `kv_lora_rank = 0` for ordinary attention");
  d.Report();
  return true;
}

}  // namespace

const std::vector<Rule>& TrainRules() {
  using namespace fields;  // NOLINT(google-build-using-namespace): the table reads as paths
  using K = DiagKind;
  static const std::vector<Rule> kRules = {
      {K::kTopkExceedsExperts, CheckTopkExceedsExperts, {kModelTopk, kModelExperts}},
      {K::kRouterGroupsMismatch,
       CheckRouterGroups,
       {kModelRouterGroups, kModelRouterGroupTopk, kModelTopk, kModelExperts}},
      {K::kDenseLayersExceedLayers,
       CheckDenseLayersExceedLayers,
       {kModelDenseLayers, kModelLayers}},
      {K::kHiddenNotDivisibleByHeads, CheckHiddenNotDivisibleByHeads, {kModelHidden, kModelHeads}},
      {K::kHeadsNotDivisibleByKvHeads,
       CheckHeadsNotDivisibleByKvHeads,
       {kModelHeads, kModelKvHeads}},
      {K::kMlaIncomplete, CheckMlaIncomplete, {kModelKvLoraRank}},
      {K::kMlaWithGqa, CheckMlaWithGqa, {kModelKvLoraRank, kModelKvHeads}},
      {K::kGlobalBatchNotDivisible,
       CheckGlobalBatchNotDivisible,
       {kBatchGlobal, kBatchMicro, kParallelDp}},
      {K::kOffloadWithoutZero, CheckOffloadWithoutZero, {kOptimizerZero, kOptimizerOffload}},
      {K::kZeroWithPipeline,
       CheckZeroWithPipeline,
       {kOptimizerZero, kOptimizerOffload, kParallelPp, kFramework}},
      {K::kZeroWithoutDp,
       CheckZeroWithoutDp,
       {kOptimizerZero, kOptimizerOffload, kParallelDp, kParallelCp}},
      {K::kFp16WithEp, CheckFp16WithEp, {kPrecision, kParallelEp}},
      {K::kFp8Unsupported, CheckFp8Unsupported, {kPrecision, kClusterGpuPeakFp8}},
      {K::kUnknownEnumValue, CheckUnknownRecomputeModule, {kActivationsRecomputeModules}},
      {K::kFsdpDegreesMismatch,
       CheckFsdpDegreesMismatch,
       {kFsdpShard, kFsdpReplicate, kParallelDp, kParallelCp}},
      {K::kMaxLiveParamsUnused,
       CheckMaxLiveParamsUnused,
       {kFsdpMaxLiveParams, kFramework, kOptimizerZero}},
      {K::kFp8RecipeWithoutFp8, CheckFp8RecipeWithoutFp8, {kMixedPrecisionFp8, kPrecision}},
      {K::kVocabPadded,
       CheckVocabPadded,
       {kModelVocab, kParallelTp, kModelVocabDivisor, kFramework}},
  };
  return kRules;
}

}  // namespace paraplan::rules
