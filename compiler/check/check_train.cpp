// Batch, optimizer sharding, precision and the model's own shape (attention heads, MLA, MoE
// routing, vocabulary padding). See docs/diagnostics/P05xx.md.
#include <string>

#include "compiler/base/checked.h"
#include "compiler/check/rule_support.h"

namespace paraplan::rules {
namespace {

void CheckBatch(RuleContext& ctx) {
  const Plan& p = ctx.plan();
  const BatchSpec& b = p.batch;
  const int64_t dp = p.parallel.dp;
  if (ctx.Poisoned({"batch.global", "batch.micro", "parallel.dp"}) || b.global <= 0 ||
      b.micro <= 0 || dp <= 0)
    return;
  auto per_step = CheckedMul(b.micro, dp);
  if (per_step && b.global % *per_step == 0) return;
  std::string per = per_step ? std::to_string(*per_step) : std::string("(overflow)");
  RuleDiag d(
      ctx, DiagKind::kGlobalBatchNotDivisible,
      per_step && b.global < *per_step
          ? "`global = " + std::to_string(b.global) +
                "` is smaller than one microbatch on every replica, micro · dp = " + per
          : "`global = " + std::to_string(b.global) + "` is not a multiple of micro · dp = " + per);
  d.At({"batch.global"}, per_step ? std::to_string(b.global) + " / " + per + " = " +
                                        Ratio(b.global, *per_step) + " microbatches"
                                  : std::string("too large"));
  d.Field("batch.micro", b.micro).Field("parallel.dp", dp);
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
    auto ok = ctx.WorkingValues("batch.global", cands, DiagKind::kGlobalBatchNotDivisible, 2);
    if (!ok.empty()) d.Help("the nearest global batches that divide: " + Choices("global", ok));
    if (b.global % dp == 0) {
      auto micros = ctx.WorkingValues("batch.micro", Divisors(b.global / dp),
                                      DiagKind::kGlobalBatchNotDivisible, 4);
      if (!micros.empty())
        d.Help("or keep `global = " + std::to_string(b.global) + "` with " +
               Choices("micro", micros));
    }
  }
  d.Report();
}

void CheckVocab(RuleContext& ctx) {
  const Plan& p = ctx.plan();
  const int64_t v = p.model.vocab;
  const int64_t tp = p.parallel.tp;
  if (v <= 0 || tp <= 0 || ctx.Poisoned({"model.vocab", "parallel.tp", "model.vocab_divisor"}))
    return;
  // A divisor the plan states is a choice the user made: the padding is then no news.
  const OriginKind divisor_origin = p.Origin("model.vocab_divisor").kind;
  if (divisor_origin == OriginKind::kFile || divisor_origin == OriginKind::kCommandLine) return;
  const int64_t divisor = p.model.vocab_divisor;
  auto multiple = CheckedMul(divisor, tp);
  if (!multiple) return;
  auto padded = RoundUpToMultiple(v, *multiple);
  if (!padded || *padded == v) return;
  RuleDiag d(ctx, DiagKind::kVocabPadded,
             "the vocabulary of " + std::to_string(v) + " is padded to " + std::to_string(*padded) +
                 " rows, a multiple of " + std::to_string(divisor) +
                 " · tp = " + std::to_string(*multiple));
  d.At({"model.vocab", "parallel.tp"},
       "vocabulary padded by " + std::to_string(*padded - v) + " rows");
  d.Field("model.vocab", v).Field("parallel.tp", tp);
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
}

void CheckOptimizer(RuleContext& ctx) {
  const Plan& p = ctx.plan();
  const OptimizerSpec& o = p.optimizer;
  const ParallelSpec& par = p.parallel;
  if (ctx.Poisoned({"optimizer.zero", "optimizer.offload"})) return;
  if (o.offload == Offload::kCpu && o.zero == 0) {
    RuleDiag d(ctx, DiagKind::kOffloadWithoutZero,
               "`offload = cpu` without a sharded optimizer (`zero = 0`)");
    d.At({"optimizer.offload"}, "offloads the optimizer");
    d.Field("optimizer.zero", o.zero);
    d.Note(
        "CPU offloading moves the sharded optimizer state and step to the host: DeepSpeed's "
        "ZeRO-Offload "
        "is a ZeRO option, and Megatron-Core's optimizer CPU offload runs on its distributed "
        "optimizer");
    d.Help("set `zero = 1` (or higher), or remove `offload`");
    d.Report();
  }
  // DeepSpeed's pipeline engine refuses ZeRO-2/3; Megatron-Core shards gradients per bucket once
  // per step, and torchtitan's FSDP2 keeps parameters unsharded across the microbatches of a
  // pipeline step (reshard_after_forward off), so only DeepSpeed hears this.
  if (o.zero >= 2 && par.pp > 1 && p.framework == Framework::kDeepSpeed &&
      !ctx.Poisoned({"parallel.pp", "framework"})) {
    RuleDiag d(ctx, DiagKind::kZeroWithPipeline,
               "`zero = " + std::to_string(o.zero) + "` with `pp = " + std::to_string(par.pp) +
                   "`: " + (o.zero == 2 ? "gradient" : "parameter") +
                   " sharding does not combine with pipeline parallelism");
    d.At({"optimizer.zero"}, o.zero == 2 ? "shards gradients" : "shards parameters");
    d.Field("parallel.pp", par.pp);
    d.Field("framework", "deepspeed");
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
  }
  if (o.zero >= 1 && !ctx.Poisoned({"parallel.dp", "parallel.cp"})) {
    auto domain = CheckedMul(par.dp, par.cp);
    int64_t edp = p.model.IsMoe() ? p.Edp() : 1;
    if (domain && *domain == 1 && edp <= 1) {
      RuleDiag d(ctx, DiagKind::kZeroWithoutDp,
                 "`zero = " + std::to_string(o.zero) +
                     "` shards over dp · cp = 1 rank: nothing is sharded");
      d.At({"optimizer.zero"}, "no data-parallel ranks to shard over");
      d.Field("parallel.dp", par.dp).Field("parallel.cp", par.cp);
      d.Value("dp · cp", Dot({par.dp, par.cp}) + " = 1");
      d.Note(
          "ZeRO (Megatron's distributed optimizer) splits optimizer state, and at higher stages "
          "gradients "
          "and parameters, over the data-parallel ranks (dp · cp for dense weights); with one rank "
          "each "
          "holds everything");
      d.Help("use fewer model-parallel ranks (smaller tp, pp or cp) so that dp > 1, or more nodes");
      d.Report();
    }
  }
}

// The records that refine the shorthands: recompute modules are Megatron's names, and the
// FSDP degrees multiply to the data-parallel group they shard.
void CheckRefinements(RuleContext& ctx) {
  const Plan& p = ctx.plan();
  std::string bad;
  if (!ctx.Poisoned({"activations.recompute_modules"}) &&
      !ParseRecomputeModules(p.activations.recompute_modules, &bad)) {
    std::string names;
    for (std::string_view n : RecomputeModuleNames())
      names += (names.empty() ? "" : ", ") + std::string(n);
    RuleDiag d(ctx, DiagKind::kUnknownEnumValue,
               "`" + bad + "` is not a module of `activations.recompute_modules`");
    d.At({"activations.recompute_modules"}, "names modules to recompute");
    d.Note("the modules are Megatron-Core's --recompute-modules: " + names);
    d.Report();
  }
  if (ctx.Poisoned({"fsdp.shard", "fsdp.replicate", "parallel.dp", "parallel.cp"})) return;
  auto group = CheckedMul(p.parallel.dp, p.parallel.cp);
  if (!group) return;
  const int64_t shard = p.fsdp.shard > 0 ? p.fsdp.shard : *group / p.fsdp.replicate;
  auto product = CheckedMul(shard, p.fsdp.replicate);
  if (shard >= 1 && product && *product == *group) return;
  RuleDiag d(ctx, DiagKind::kFsdpDegreesMismatch,
             p.fsdp.shard > 0
                 ? "`fsdp.shard` · `fsdp.replicate` is not the data-parallel group dp · cp"
                 : "`fsdp.replicate` does not divide the data-parallel group dp · cp");
  d.At({"fsdp.replicate", "fsdp.shard"}, "sharding degrees");
  d.Field("fsdp.replicate", p.fsdp.replicate)
      .Field("parallel.dp", p.parallel.dp)
      .Field("parallel.cp", p.parallel.cp);
  if (p.fsdp.shard > 0) d.Field("fsdp.shard", p.fsdp.shard);
  d.Value("dp · cp", Dot({p.parallel.dp, p.parallel.cp}) + " = " + std::to_string(*group));
  d.Note(
      "model states are sharded over `shard` ranks and that group is replicated `replicate` times "
      "(HSDP): every data-parallel rank is in exactly one shard group");
  d.Help(
      "leave `fsdp.shard` unset (it follows dp · cp / replicate), and pick `fsdp.replicate` "
      "dividing " +
      std::to_string(*group));
  d.Report();
}

void CheckPrecision(RuleContext& ctx) {
  const Plan& p = ctx.plan();
  if (ctx.Poisoned({"precision"})) return;
  if (p.precision == Precision::kFp16 && p.parallel.ep > 1 && !ctx.Poisoned({"parallel.ep"})) {
    RuleDiag d(ctx, DiagKind::kFp16WithEp,
               "`precision = fp16` with expert parallelism (`ep = " +
                   std::to_string(p.parallel.ep) + "`)");
    d.At({"precision"}, "fp16");
    d.Field("parallel.ep", p.parallel.ep);
    d.Note(
        "Megatron-LM up to core v0.15 refuses this (\"Expert parallelism is not supported with "
        "fp16 "
        "training.\"); later versions accept it");
    d.Help("use `precision = bf16`, which needs no loss scaling");
    d.Report();
  }
  const GpuSpec& gpu = p.cluster.gpu;
  if (p.precision == Precision::kFp8 && gpu.peak_fp8 <= 0 &&
      (gpu.peak_bf16 > 0 || !gpu.name.empty()) && !ctx.Poisoned({"cluster.gpu.peak_fp8"})) {
    RuleDiag d(ctx, DiagKind::kFp8Unsupported,
               "`precision = fp8` on " +
                   (gpu.name.empty() ? std::string("a GPU") : "`" + gpu.name + "`") +
                   ", which has no fp8 tensor cores");
    d.At({"precision"}, "fp8");
    d.Field("cluster.gpu.peak_fp8", "0");
    d.Note(
        "fp8 training (Transformer Engine) needs fp8 tensor cores: Hopper (H100, H200, H800) or "
        "newer; "
        "the GPU record gives no fp8 peak");
    d.Help("use `precision = bf16` on this GPU, or a cluster with Hopper GPUs");
    d.Report();
  }
}

void CheckModelShape(RuleContext& ctx) {
  const Plan& p = ctx.plan();
  const ModelSpec& m = p.model;
  if (m.IsMoe() && m.topk > m.experts && !ctx.Poisoned({"model.topk", "model.experts"})) {
    RuleDiag d(ctx, DiagKind::kTopkExceedsExperts,
               "`topk = " + std::to_string(m.topk) +
                   "` routes each token to more experts than the " + std::to_string(m.experts) +
                   " there are");
    d.At({"model.topk"}, "more than " + std::to_string(m.experts) + " experts");
    d.Field("model.experts", m.experts);
    d.Note(
        "the router picks topk distinct experts per token; Megatron has no check and fails inside "
        "torch.topk at the first forward step");
    d.Help("`topk` at most " + std::to_string(m.experts));
    d.Report();
  }
  if (m.dense_layers > m.layers && !ctx.Poisoned({"model.dense_layers", "model.layers"})) {
    RuleDiag d(ctx, DiagKind::kDenseLayersExceedLayers,
               "`dense_layers = " + std::to_string(m.dense_layers) + "` is more than the model's " +
                   std::to_string(m.layers) + " layers");
    d.At({"model.dense_layers"}, "leading dense layers");
    d.Field("model.layers", m.layers);
    d.Note(
        "dense_layers counts the leading layers that use a dense MLP instead of experts; they are "
        "part of "
        "the model's layers");
    d.Help("`dense_layers` at most " + std::to_string(m.layers));
    d.Report();
  }
  const OriginKind head_dim_origin = p.Origin("model.head_dim").kind;
  const bool head_dim_given = head_dim_origin == OriginKind::kFile ||
                              head_dim_origin == OriginKind::kStdlib ||
                              head_dim_origin == OriginKind::kCommandLine;
  if (!m.IsMla() && !head_dim_given && m.heads > 0 && m.hidden % m.heads != 0 &&
      !ctx.Poisoned({"model.hidden", "model.heads"})) {
    RuleDiag d(ctx, DiagKind::kHiddenNotDivisibleByHeads,
               "`hidden = " + std::to_string(m.hidden) +
                   "` is not a multiple of `heads = " + std::to_string(m.heads) + "`");
    d.At({"model.heads", "model.hidden"}, "hidden / heads = " + Ratio(m.hidden, m.heads));
    d.Field("model.hidden", m.hidden).Field("model.heads", m.heads);
    d.Note(
        "without an explicit head_dim each head gets hidden / heads channels (Megatron-LM asserts "
        "hidden_size % num_attention_heads == 0 when kv_channels is not given)");
    d.Help("give `head_dim` explicitly, or choose `heads` among the divisors of " +
           std::to_string(m.hidden));
    d.Report();
  }
  if (m.kv_heads > 0 && m.heads > 0 && m.heads % m.kv_heads != 0 &&
      !ctx.Poisoned({"model.heads", "model.kv_heads"})) {
    RuleDiag d(ctx, DiagKind::kHeadsNotDivisibleByKvHeads,
               "the " + std::to_string(m.heads) +
                   " attention heads do not form whole groups over `kv_heads = " +
                   std::to_string(m.kv_heads) + "`");
    d.At({"model.kv_heads"}, "heads / kv_heads = " + Ratio(m.heads, m.kv_heads));
    d.Field("model.heads", m.heads);
    d.Note("grouped-query attention shares each KV head among heads / kv_heads query heads");
    d.Help("`kv_heads` among the divisors of " + std::to_string(m.heads) + ": " +
           List(Divisors(m.heads)));
    d.Report();
  }
  if (m.IsMla() && !ctx.Poisoned({"model.kv_lora_rank"})) {
    if (m.qk_nope_head_dim <= 0 || m.qk_rope_head_dim <= 0 || m.v_head_dim <= 0) {
      RuleDiag d(ctx, DiagKind::kMlaIncomplete,
                 "`kv_lora_rank = " + std::to_string(m.kv_lora_rank) +
                     "` makes this multi-latent attention, but its head dimensions are missing");
      d.At({"model.kv_lora_rank"}, "multi-latent attention");
      d.Field("model.qk_nope_head_dim", m.qk_nope_head_dim)
          .Field("model.qk_rope_head_dim", m.qk_rope_head_dim)
          .Field("model.v_head_dim", m.v_head_dim);
      d.Value("qk_nope_head_dim, qk_rope_head_dim, v_head_dim",
              std::to_string(m.qk_nope_head_dim) + ", " + std::to_string(m.qk_rope_head_dim) +
                  ", " + std::to_string(m.v_head_dim));
      d.Note(
          "MLA needs the per-head query/key sizes without and with RoPE and the per-head value "
          "size");
      d.Help(
          "set `qk_nope_head_dim`, `qk_rope_head_dim` and `v_head_dim` (DeepSeek-V2: 128, 64, "
          "128)");
      d.Report();
    }
    if (m.kv_heads > 0 && m.kv_heads != m.heads && !ctx.Poisoned({"model.kv_heads"})) {
      RuleDiag d(ctx, DiagKind::kMlaWithGqa,
                 "multi-latent attention with `kv_heads = " + std::to_string(m.kv_heads) +
                     "` < `heads = " + std::to_string(m.heads) + "`");
      d.At({"model.kv_heads", "model.kv_lora_rank"}, "grouped-query attention");
      d.Field("model.kv_lora_rank", m.kv_lora_rank).Field("model.heads", m.heads);
      d.Note(
          "MLA compresses keys and values into a latent of kv_lora_rank and expands them for every "
          "head; "
          "it does not combine with grouped-query attention (Megatron-LM: \"Group query attention "
          "is "
          "mutually exclusive with multi latent attention.\")");
      d.Help("set `kv_heads = " + std::to_string(m.heads) +
             "`, or `kv_lora_rank = 0` for ordinary attention");
      d.Report();
    }
  }
}

}  // namespace

void CheckTrain(RuleContext& ctx) {
  CheckModelShape(ctx);
  CheckBatch(ctx);
  CheckOptimizer(ctx);
  CheckPrecision(ctx);
  CheckRefinements(ctx);
  CheckVocab(ctx);
}

}  // namespace paraplan::rules
