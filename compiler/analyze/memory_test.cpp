#include "compiler/analyze/memory.h"

#include <doctest/doctest.h>

#include "compiler/analyze/cost_shape.h"
#include "compiler/analyze/cost_test_plans.h"

namespace paraplan {
namespace {

using testing::kGiB;

// Korthikanti et al. (MLSys 2023) count: 16-bit activations, dropout, no fused attention.
CostOptions KorthikantiOptions() {
  CostOptions o;
  o.flash_attention = false;
  o.dropout = true;
  return o;
}

ActivationShape Shape(const ModelSpec& m, int64_t b, int64_t t, bool sp, Recompute r) {
  ActivationShape s;
  s.seq = m.seq_len;
  s.micro = b;
  s.tp = t;
  s.etp = t;
  s.sp = sp;
  s.recompute = r;
  s.element_bytes = 2;
  s.options = KorthikantiOptions();
  return s;
}

TEST_CASE("per-layer activations reproduce Korthikanti's Table 2 closed forms exactly") {
  const ModelSpec m = testing::Gpt(48, 6144, 64);  // GPT-22B, s = 2048
  const int64_t s = m.seq_len, h = m.hidden, a = m.heads, b = 4, t = 8;
  const int64_t sbh = s * b * h;
  // s·b·h·(34 + 5as/h)
  CHECK(LayerActivationBytes(m, LayerKind::kDense, Shape(m, b, 1, false, Recompute::kNone)) ==
        34 * sbh + 5 * a * s * s * b);
  // s·b·h·(10 + 24/t + 5as/(ht))
  CHECK(LayerActivationBytes(m, LayerKind::kDense, Shape(m, b, t, false, Recompute::kNone)) ==
        10 * sbh + 24 * sbh / t + 5 * a * s * s * b / t);
  // s·b·h·(34/t + 5as/(ht))
  CHECK(LayerActivationBytes(m, LayerKind::kDense, Shape(m, b, t, true, Recompute::kNone)) ==
        34 * sbh / t + 5 * a * s * s * b / t);
  // s·b·h·(10 + 24/t)
  CHECK(LayerActivationBytes(m, LayerKind::kDense, Shape(m, b, t, false, Recompute::kSelective)) ==
        10 * sbh + 24 * sbh / t);
  // s·b·h·34/t
  CHECK(LayerActivationBytes(m, LayerKind::kDense, Shape(m, b, t, true, Recompute::kSelective)) ==
        34 * sbh / t);
  // full recompute keeps the layer input: 2sbh, 2sbh/t when sequence parallel splits it
  CHECK(LayerActivationBytes(m, LayerKind::kDense, Shape(m, b, t, false, Recompute::kFull)) ==
        2 * sbh);
  CHECK(LayerActivationBytes(m, LayerKind::kDense, Shape(m, b, t, true, Recompute::kFull)) ==
        2 * sbh / t);
}

// Stage-0 layer activations of Korthikanti's Figure 1 (the paper's Eq. 5 and Eq. 6 times the
// layers in flight on the first stage), as transcribed in the calibration reference.
struct Figure1Case {
  const char* name;
  int64_t layers, hidden, heads, micro, pp, vpp;
  double tp_only_gib, sp_selective_gib;
};

TEST_CASE("first-stage activations reproduce Korthikanti's Figure 1 exactly") {
  const Figure1Case cases[] = {
      {"22B", 48, 6144, 64, 4, 1, 1, 59.25, 9.5625},
      {"175B", 96, 12288, 96, 1, 8, 3, 66.84375, 12.3515625},
      {"530B", 105, 20480, 128, 1, 35, 3, 114.0234375, 23.076171875},
      {"1T", 128, 25600, 160, 1, 64, 1, 131.25, 26.5625},
  };
  for (const auto& c : cases) {
    CAPTURE(c.name);
    const int64_t nodes = c.pp;  // tp 8 inside a node, one node per stage, dp 1
    Plan plan = testing::MakePlan(testing::Gpt(c.layers, c.hidden, c.heads),
                                  testing::DgxA100(nodes), 8, c.pp, 64 * c.pp * c.micro, c.micro);
    plan.framework = Framework::kMegatronLm2021;  // the software of Korthikanti et al. (2022)
    plan.parallel.vpp = c.vpp;
    plan.pipeline.schedule = c.vpp > 1 ? Schedule::kInterleaved1F1B : Schedule::k1F1B;
    REQUIRE(plan.parallel.dp == 1);
    for (bool sp_selective : {false, true}) {
      plan.parallel.sp = sp_selective;
      plan.recompute = sp_selective ? Recompute::kSelective : Recompute::kNone;
      const MemoryEstimate e = EstimateMemory(plan, KorthikantiOptions());
      REQUIRE(e.valid);
      const double gib = static_cast<double>(e.stages[0].Get(MemoryPart::kActivations)) / kGiB;
      CHECK(gib ==
            doctest::Approx(sp_selective ? c.sp_selective_gib : c.tp_only_gib).epsilon(1e-12));
    }
  }
}

TEST_CASE("model-state bytes per parameter follow Megatron's distributed-optimizer table") {
  Plan plan = testing::MakePlan(testing::Llama3Of70B(), testing::DgxH100(8), 8, 1, 64, 1);
  plan.framework = Framework::kMegatronCore;  // Megatron-Core's accounting (Korthikanti)
  plan.precision = Precision::kBf16;
  plan.optimizer.zero = 0;
  CHECK(StateBytes(plan, 8).Total() == 18);
  plan.optimizer.zero = 1;
  CHECK(StateBytes(plan, 8).Total() == doctest::Approx(6 + 12.0 / 8));
  plan.optimizer.zero = 2;
  CHECK(StateBytes(plan, 8).Total() == doctest::Approx(2 + 16.0 / 8));
  plan.optimizer.zero = 3;
  CHECK(StateBytes(plan, 8).Total() == doctest::Approx(18.0 / 8));
  plan.precision = Precision::kFp16;
  plan.optimizer.zero = 0;
  CHECK(StateBytes(plan, 4).Total() == 20);
  plan.optimizer.zero = 1;
  CHECK(StateBytes(plan, 4).Total() == doctest::Approx(4 + 16.0 / 4));
  plan.precision = Precision::kFp32;
  CHECK(StateBytes(plan, 4).Total() == doctest::Approx(8 + 8.0 / 4));
}

TEST_CASE("DeepSpeed ZeRO keeps K = 12 optimizer bytes and gathers tensor by tensor") {
  // Narayanan et al. (SC21) Table 2: ZeRO-3 trains the 529.6B GPT (105 layers, h = 20480) at
  // micro batch 4 on 640 A100-80GB (batch 2560), with full recompute and fp16.
  Plan plan = testing::MakePlan(testing::Gpt(105, 20480, 128), testing::DgxA100(80), 1, 1, 2560, 4);
  plan.framework = Framework::kDeepSpeed;
  plan.precision = Precision::kFp16;
  plan.recompute = Recompute::kFull;
  plan.optimizer.zero = 3;
  // ZeRO's mixed-precision Adam: 2 + 2 + K = 16 bytes per parameter over the shards (Megatron's
  // fp16 optimizer adds an fp32 main gradient: 20).
  CHECK(StateBytes(plan, 640).Total() == doctest::Approx(16.0 / 640));
  const MemoryEstimate est = EstimateMemory(plan);
  REQUIRE(est.valid);
  CHECK(est.peak <= est.capacity);
  // The gathered set: stage3_max_live_parameters (1e9) plus the largest tensor (the 4h x h MLP
  // projection, 1.68e9), 16-bit, and that tensor's unreduced 16-bit gradient: far less than the
  // two whole layers (2 x 5.03e9 parameters) gathered by FSDP's layer-by-layer units.
  const int64_t largest = int64_t{4} * 20480 * 20480;
  CHECK(LargestTensorOfLayer(plan.model, LayerKind::kDense) == largest);
  const int64_t comm = est.stages.front().bytes[static_cast<size_t>(MemoryPart::kCommBuffers)];
  CHECK(comm >= 2 * (1'000'000'000 + largest) + 2 * largest);
  CHECK(comm < 2 * (1'000'000'000 + largest) + 2 * largest + kGiB);
  Plan fsdp = plan;
  fsdp.framework = Framework::kMegatronCore;
  const MemoryEstimate layerwise = EstimateMemory(fsdp);
  CHECK(layerwise.stages.front().bytes[static_cast<size_t>(MemoryPart::kCommBuffers)] >
        int64_t{4} * ParamsOfLayer(plan.model, LayerKind::kDense).Total());
  // A stated cap (stage3_max_live_parameters) replaces the default, never past two layers.
  plan.fsdp.max_live_params = 3'000'000'000;
  const int64_t capped =
      EstimateMemory(plan).stages.front().bytes[static_cast<size_t>(MemoryPart::kCommBuffers)];
  CHECK(capped - comm == int64_t{2} * 2'000'000'000);
  plan.fsdp.max_live_params = int64_t{1} << 50;
  const int64_t whole =
      EstimateMemory(plan).stages.front().bytes[static_cast<size_t>(MemoryPart::kCommBuffers)];
  CHECK(whole - capped ==
        int64_t{2} * (int64_t{2} * ParamsOfLayer(plan.model, LayerKind::kDense).Total() -
                      (3'000'000'000 + largest)));
}

TEST_CASE("every pipeline stage is evaluated: in-flight microbatches, embedding and logits") {
  Plan plan = testing::MakePlan(testing::Llama3Of70B(), testing::DgxH100(8), 8, 4, 64, 1);
  plan.framework = Framework::kMegatronCore;  // Megatron-Core's accounting (Korthikanti)
  plan.parallel.sp = true;
  plan.recompute = Recompute::kSelective;
  const MemoryEstimate e = EstimateMemory(plan);
  REQUIRE(e.valid);
  REQUIRE(e.stages.size() == 4);
  CHECK(e.microbatches == 32);
  // 1F1B: rank r holds min(pp - r, m) microbatches of its 20 layers.
  for (int r = 0; r < 4; ++r) {
    CHECK(e.stages[r].layers == 20);
    CHECK(e.stages[r].in_flight == 4 - r);
  }
  CHECK(e.stages[0].embedding);
  CHECK_FALSE(e.stages[0].loss);
  CHECK(e.stages[3].loss);
  CHECK(e.stages[0].Get(MemoryPart::kActivations) == 4 * e.stages[3].Get(MemoryPart::kActivations));
  // fp32 logits of 8192 tokens over 128256/8 vocabulary entries sit on the last stage only.
  CHECK(e.stages[3].Get(MemoryPart::kEmbeddingAndLoss) > int64_t{4} * 8192 * (128256 / 8));
  CHECK(e.stages[0].Get(MemoryPart::kEmbeddingAndLoss) < int64_t{1} << 20);
  CHECK(e.peak_stage == 0);
  CHECK(e.peak == e.stages[0].total);
}

TEST_CASE("multi-token prediction: a module's params on the last stage, with the embedding") {
  // Megatron-Core builds the word embedding wherever the modules run: with pp > 1 and untied
  // embeddings the last stage holds it beside the output layer. Each module: one layer, a
  // 2h -> h projection split over tp, three norms.
  Plan plan = testing::MakePlan(testing::Llama3Of70B(), testing::DgxH100(8), 8, 4, 64, 1);
  plan.framework = Framework::kMegatronCore;
  const MemoryEstimate none = EstimateMemory(plan);
  plan.model.mtp_layers = 1;
  const MemoryEstimate one = EstimateMemory(plan);
  REQUIRE(none.valid);
  REQUIRE(one.valid);
  const ModelSpec& m = plan.model;
  const int64_t h = m.hidden, t = 8;
  const int64_t vocab = (m.vocab + 128 * t - 1) / (128 * t) * (128 * t);
  const int64_t layer = none.stages[1].params / 20;  // a middle stage: 20 layers, nothing else
  const int64_t added = one.stages[3].params - none.stages[3].params;
  CHECK(added == vocab * h / t + layer + 2 * h * h / t + 3 * h);
  for (int r = 0; r < 3; ++r) CHECK(one.stages[r].params == none.stages[r].params);
  // Tied embeddings: the last stage holds the copy already.
  plan.model.tied_embeddings = true;
  const MemoryEstimate tied = EstimateMemory(plan);
  plan.model.mtp_layers = 0;
  const MemoryEstimate tied_none = EstimateMemory(plan);
  CHECK(tied.stages[3].params - tied_none.stages[3].params == layer + 2 * h * h / t + 3 * h);
}

TEST_CASE("interleaving holds Megatron's warm-up count on each rank") {
  Plan plan = testing::MakePlan(testing::Gpt(96, 12288, 96), testing::DgxA100(8), 8, 8, 64, 1);
  plan.framework = Framework::kMegatronCore;  // Megatron-Core's accounting (Korthikanti)
  plan.parallel.vpp = 3;
  plan.pipeline.schedule = Schedule::kInterleaved1F1B;
  const MemoryEstimate e = EstimateMemory(plan);
  REQUIRE(e.valid);
  for (int64_t r = 0; r < 8; ++r)
    CHECK(e.stages[r].in_flight == 2 * (8 - r - 1) + 17);  // 17 = 2 · 8 + 1
}

TEST_CASE("context parallel divides activations; ZeRO shards over DP x CP") {
  Plan plan = testing::MakePlan(testing::Llama3Of70B(), testing::DgxH100(8), 8, 1, 64, 1);
  plan.framework = Framework::kMegatronCore;  // Megatron-Core's accounting (Korthikanti)
  plan.recompute = Recompute::kFull;
  plan.optimizer.zero = 1;
  const MemoryEstimate base = EstimateMemory(plan);
  plan.parallel.cp = 2;
  plan.parallel.dp = 4;
  const MemoryEstimate cp = EstimateMemory(plan);
  CHECK(cp.stages[0].Get(MemoryPart::kActivations) * 2 ==
        base.stages[0].Get(MemoryPart::kActivations));
  // The optimizer is sharded over dp·cp = 8 in both plans.
  CHECK(cp.stages[0].Get(MemoryPart::kOptimizer) == base.stages[0].Get(MemoryPart::kOptimizer));
}

TEST_CASE("MoE: routed experts sharded by EP·ETP, their optimizer by expert DP") {
  Plan plan = testing::MakePlan(testing::DeepSeekV2(), testing::DgxH100(32), 8, 1, 1024, 1);
  plan.framework = Framework::kMegatronCore;  // Megatron-Core's accounting (Korthikanti)
  plan.parallel.ep = 32;
  plan.parallel.sp = true;
  plan.optimizer.zero = 1;
  plan.recompute = Recompute::kFull;
  const ModelSpec& m = plan.model;
  const LayerParams moe = ParamsOfLayer(m, LayerKind::kMoe);
  CHECK(moe.expert == int64_t{160} * 3 * 5120 * 1536);
  const MemoryEstimate e = EstimateMemory(plan);
  REQUIRE(e.valid);
  const int64_t expert_per_rank = 59 * moe.expert / 256;  // 32 · 8 ranks
  CHECK(e.stages[0].params > expert_per_rank);
  CHECK(e.stages[0].params < expert_per_rank + 3'000'000'000);
  // Total parameters of DeepSeek-V2: 236B.
  CHECK(static_cast<double>(TotalParams(m)) == doctest::Approx(236e9).epsilon(0.02));
  // Routed tokens count: top-6 of 4096 tokens, ETP = TP so every rank sees the full sequence.
  ActivationShape shape;
  shape.seq = 4096;
  shape.tp = 8;
  shape.etp = 8;
  shape.sp = true;
  CHECK(RoutedPairsPerRank(m, shape) == 6 * 4096);
  shape.etp = 1;
  CHECK(RoutedPairsPerRank(m, shape) == 6 * 4096 / 8);
  // Each routed pair keeps its expert input; before Megatron-Core 0.13 the combine also kept the
  // expert's output (probabilities applied in unpermute): one hidden-width copy more per pair.
  shape.recompute = Recompute::kSelective;
  const int64_t current = LayerActivationBytes(m, LayerKind::kMoe, shape);
  shape.options.moe_probs_in_activation = false;
  const int64_t older = LayerActivationBytes(m, LayerKind::kMoe, shape);
  CHECK(older - current == RoutedPairsPerRank(m, shape) * 2 * 5120);
}

TEST_CASE("CPU offload moves the optimizer state to the host") {
  Plan plan = testing::MakePlan(testing::Llama3Of70B(), testing::DgxH100(8), 8, 4, 64, 1);
  plan.framework = Framework::kMegatronCore;  // Megatron-Core's accounting (Korthikanti)
  const MemoryEstimate on_gpu = EstimateMemory(plan);
  plan.optimizer.offload = Offload::kCpu;
  const MemoryEstimate off = EstimateMemory(plan);
  CHECK(off.stages[1].Get(MemoryPart::kOptimizer) == 0);
  CHECK(off.stages[1].host_bytes == on_gpu.stages[1].Get(MemoryPart::kOptimizer));
  CHECK(off.peak < on_gpu.peak);
}

TEST_CASE("sizes saturate instead of wrapping") {
  Plan plan = testing::MakePlan(testing::Llama3Of70B(), testing::DgxH100(1), 1, 1, 8, 1);
  plan.framework = Framework::kMegatronCore;  // Megatron-Core's accounting (Korthikanti)
  plan.model.seq_len = int64_t{1} << 40;
  plan.batch.micro = int64_t{1} << 30;
  const MemoryEstimate e = EstimateMemory(plan);
  REQUIRE(e.valid);
  CHECK(e.peak == INT64_MAX);
  CHECK(FormatGiB(e.peak) == "more than 8 EiB");
}

}  // namespace
}  // namespace paraplan

#include "compiler/analyze/cost_report.h"

namespace paraplan {
namespace {

TEST_CASE("explain's memory and time sections: JSON per stage in bytes, text chart, SVG") {
  Plan plan = testing::MakePlan(testing::Llama3Of70B(), testing::DgxH100(8), 8, 4, 64, 1);
  plan.framework = Framework::kMegatronCore;  // Megatron-Core's accounting (Korthikanti)
  plan.parallel.sp = true;
  plan.recompute = Recompute::kSelective;
  const MemoryEstimate m = EstimateMemory(plan);
  const TimeEstimate t = EstimateTime(plan);
  const std::string json = MemoryJson(m);
  CHECK(json.find("\"stages\":[{\"stage\":0,\"total_bytes\":" +
                  std::to_string(m.stages[0].total)) != std::string::npos);
  CHECK(json.find("\"weights\":" + std::to_string(m.stages[0].Get(MemoryPart::kWeights))) !=
        std::string::npos);
  const std::string time = TimeJson(t);
  CHECK(time.find("\"step_seconds\":") != std::string::npos);
  CHECK(time.find("\"tokens_per_s\":") != std::string::npos);
  CHECK(time.find("\"mfu\":") != std::string::npos);
  const std::string text = CostText(m, t);
  CHECK(text.find("  stage   3 ") != std::string::npos);
  CHECK(text.find("MFU") != std::string::npos);
  const std::string svg = MemoryChartSvg(m);
  CHECK(svg.rfind("<svg", 0) == 0);
  CHECK(svg.find("GPU memory 80.00 GiB") != std::string::npos);
}

TEST_CASE("the precision record prices each model state term by term") {
  Plan plan = testing::MakePlan(testing::Llama3Of70B(), testing::DgxH100(8), 8, 1, 64, 1);
  plan.framework = Framework::kMegatronCore;
  auto write = [&](const char* path, const char* value) {
    REQUIRE(SetFieldText(plan, path, value) == "");
    plan.origins.Mutable(path)->kind = OriginKind::kFile;
  };
  StateBytesPerParam b = StateBytes(plan, 1);
  CHECK(b.Total() == 18);  // Megatron's table: 2 + 4 + 12
  write("mixed_precision.grads", "bf16");
  write("mixed_precision.optimizer_state", "bf16");
  b = StateBytes(plan, 1);
  CHECK(b.gradients == 2);
  CHECK(b.optimizer == 8);  // fp32 master + two bf16 moments
  write("mixed_precision.main_params", "false");
  CHECK(StateBytes(plan, 1).optimizer == 4);
  // FP8: Transformer Engine keeps a cached cast beside the bf16 weight; torchtitan casts per call;
  // FP8 parameters keep only the FP8 weight.
  Plan fp8 = testing::MakePlan(testing::Llama3Of70B(), testing::DgxH100(8), 8, 1, 64, 1);
  fp8.framework = Framework::kMegatronCore;
  fp8.precision = Precision::kFp8;
  CHECK(StateBytes(fp8, 1).weights == 3);
  fp8.framework = Framework::kTorchtitan;
  CHECK(StateBytes(fp8, 1).weights == 2);
  fp8.mixed_precision.fp8_params = true;
  fp8.origins["mixed_precision.fp8_params"].kind = OriginKind::kFile;
  CHECK(StateBytes(fp8, 1).weights == 1);
  // FSDP (torchtitan) at ZeRO 3: the fp32 shard is the parameter, 16 bytes over the group.
  Plan titan = testing::MakePlan(testing::Llama3Of70B(), testing::DgxH100(8), 8, 1, 64, 1);
  titan.framework = Framework::kTorchtitan;
  titan.optimizer.zero = 3;
  CHECK(StateBytes(titan, 4).Total() == doctest::Approx(16.0 / 4));
}

TEST_CASE("FP8 GEMM inputs: 1-byte copies under Transformer Engine, 16-bit under torchao") {
  // Transformer Engine saves the FP8 casts of the GEMM inputs for the backward; torchao's
  // Float8Linear (torchtitan) saves the high-precision input and casts again in the backward,
  // so its activations are those of bf16 (torchtitan Table 1: 8B with torch.compile at 77.0 GiB
  // in bf16, 76.8 GiB with float8).
  Plan plan = testing::MakePlan(testing::Llama3Of70B(), testing::DgxH100(8), 1, 8, 64, 1);
  plan.optimizer.zero = 1;
  auto activations = [&](Framework f, Precision p) {
    Plan q = plan;
    q.framework = f;
    q.precision = p;
    return EstimateMemory(q).stages[0].Get(MemoryPart::kActivations);
  };
  for (Recompute r : {Recompute::kNone, Recompute::kSelective}) {
    plan.recompute = r;
    CAPTURE(static_cast<int>(r));
    CHECK(activations(Framework::kMegatronCore, Precision::kFp8) <
          activations(Framework::kMegatronCore, Precision::kBf16));
    CHECK(activations(Framework::kTorchtitan, Precision::kFp8) ==
          activations(Framework::kTorchtitan, Precision::kBf16));
  }
}

TEST_CASE("recompute modules, methods, offload and HSDP change what is held") {
  Plan plan = testing::MakePlan(testing::Llama3Of70B(), testing::DgxH100(8), 8, 4, 64, 1);
  plan.framework = Framework::kMegatronCore;
  plan.optimizer.zero = 1;
  auto activations = [&](const Plan& p) {
    return EstimateMemory(p).stages[0].Get(MemoryPart::kActivations);
  };
  const int64_t none = activations(plan);
  plan.recompute = Recompute::kSelective;
  const int64_t core = activations(plan);
  plan.activations.recompute_modules = "core_attn, mlp";
  plan.origins["activations.recompute_modules"].kind = OriginKind::kFile;
  const int64_t core_mlp = activations(plan);
  CHECK(core < none);
  CHECK(core_mlp < core);
  plan.recompute = Recompute::kFull;
  const int64_t full = activations(plan);
  plan.activations.recompute_method = RecomputeMethod::kBlock;
  plan.activations.recompute_layers = 10;  // 10 of the stage's 20 layers recompute
  const int64_t block = activations(plan);
  CHECK(full < block);
  CHECK(block < none);
  CHECK(block == full / 2 + none / 2);
  plan.activations.recompute_method = RecomputeMethod::kUniform;
  plan.activations.recompute_layers = 4;  // one checkpoint per 4 layers
  CHECK(activations(plan) == full / 4);
  plan.activations.offload_layers = 10;
  const MemoryEstimate off = EstimateMemory(plan);
  CHECK(off.stages[0].Get(MemoryPart::kActivations) == full / 8);
  CHECK(off.stages[0].host_bytes == full / 8);
  // Optimizer offload by fraction; HSDP shards over fewer ranks.
  const int64_t opt = EstimateMemory(plan).stages[0].Get(MemoryPart::kOptimizer);
  plan.optimizer.offload = Offload::kCpu;
  plan.optimizer.offload_fraction = 0.5;
  CHECK(EstimateMemory(plan).stages[0].Get(MemoryPart::kOptimizer) ==
        doctest::Approx(static_cast<double>(opt) / 2).epsilon(1e-6));
  plan.optimizer.offload = Offload::kNone;
  plan.fsdp.replicate = 2;  // dp = 2: shard over 1 rank, twice the optimizer state
  CHECK(EstimateMemory(plan).stages[0].Get(MemoryPart::kOptimizer) ==
        doctest::Approx(opt * 2).epsilon(1e-6));
}

TEST_CASE("PredictedPeaks: one entry per stage, the device's bytes and the allocator's") {
  Plan plan = testing::MakePlan(testing::Llama3Of70B(), testing::DgxH100(8), 8, 4, 64, 1);
  plan.framework = Framework::kTorchtitan;
  const std::vector<StagePeak> peaks = PredictedPeaks(plan);
  const MemoryEstimate est = EstimateMemory(plan);
  REQUIRE(peaks.size() == 4);
  for (const StagePeak& p : peaks) {
    const StageMemory& s = est.stages[static_cast<size_t>(p.stage)];
    CHECK(p.device == s.total);
    // The CUDA context (1 GiB on Hopper) and one NCCL communicator per group sit outside.
    CHECK(p.device - p.allocator == s.outside_allocator);
    CHECK(p.device - p.allocator >= int64_t{1} << 30);
  }
  plan.framework = Framework::kParaplan;  // planrun: the allocator is the static arena
  for (const StagePeak& p : PredictedPeaks(plan))
    CHECK(p.allocator == EstimateMemory(plan).stages[p.stage].arena);
}

TEST_CASE("experts without moe_ffn_hidden are ffn_hidden wide in memory and time, as in lowering") {
  // Megatron-Core defaults --moe-ffn-hidden-size to --ffn-hidden-size; the lowering sizes the
  // experts so, and the estimates must agree with it (they once priced the experts at width 0).
  ModelSpec m = testing::Llama3Of70B();
  m.layers = 8;
  m.experts = 64;
  m.topk = 2;
  Plan unset = testing::MakePlan(m, testing::DgxH100(8), 8, 1, 64, 1);
  unset.parallel.ep = 8;
  unset.parallel.etp = 1;
  Plan explicit_width = unset;
  explicit_width.model.moe_ffn_hidden = m.ffn_hidden;
  REQUIRE(unset.model.ExpertFfn() == m.ffn_hidden);
  const MemoryEstimate a = EstimateMemory(unset), b = EstimateMemory(explicit_width);
  REQUIRE(a.valid);
  CHECK(a.peak == b.peak);
  CHECK(a.stages[0].params == b.stages[0].params);
  CHECK(EstimateTime(unset).step_s == doctest::Approx(EstimateTime(explicit_width).step_s));
}

}  // namespace
}  // namespace paraplan
