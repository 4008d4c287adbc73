#include "compiler/interop/interop.h"

#include <doctest/doctest.h>

#include <cstdlib>
#include <fstream>
#include <iterator>

#include "compiler/check/evaluate.h"
#include "compiler/interop/shell_words.h"
#include "compiler/interop/tables.h"

namespace paraplan {
namespace {

std::string Stdlib() {
  const char* root = std::getenv("PARAPLAN_SOURCE_DIR");
  return std::string(root ? root : ".") + "/stdlib";
}

struct Imported {
  SourceManager sm;
  DiagnosticSink sink;
  std::optional<ImportedPlan> plan;
  std::optional<Plan> checked;  // the text evaluated, with the user's origins applied
  uint32_t plan_buffer = 0;

  Imported(ConfigKind kind, std::string text, ImportOptions options = {}) {
    options.stdlib_dir = Stdlib();
    plan = ImportConfigText(kind, "train.sh", std::move(text), options, sm, sink);
    if (!plan) return;
    LoadOptions load;
    load.stdlib_dir = Stdlib();
    plan_buffer = static_cast<uint32_t>(sm.BufferCount()) + 1;
    auto source = PlanSource::FromText("train.sh (as a plan)", plan->text, load, sm, sink);
    REQUIRE(source);
    checked = source->Evaluate("", {}, EvalOptions{}, sink);
    if (checked) ApplyImportedOrigins(*plan, plan_buffer, sm, *checked);
  }
  // The text of the user's file an origin points at.
  std::string_view OriginText(std::string_view path) const {
    return sm.Slice(checked->Range(path));
  }
  bool Has(std::string_view code) const {
    for (const Diagnostic& d : sink.diagnostics()) {
      if (GetDiagKindInfo(d.kind).code == code) return true;
    }
    return false;
  }
};

constexpr const char* kLlamaScript = R"(#!/bin/bash
#SBATCH --nodes=8
#SBATCH --ntasks-per-node=8
TP=8
PP=${PIPELINE:-4}
MODEL_ARGS="--num-layers 80 --hidden-size 8192 --ffn-hidden-size 28672 \
  --num-attention-heads 64 --group-query-attention --num-query-groups 8 \
  --seq-length 8192 --normalization RMSNorm --swiglu --position-embedding-type rope \
  --untie-embeddings-and-output-weights"
srun python pretrain_gpt.py $MODEL_ARGS \
    --tensor-model-parallel-size $TP --pipeline-model-parallel-size "${PP}" \
    --num-layers-per-virtual-pipeline-stage 10 --sequence-parallel \
    --use-distributed-optimizer --micro-batch-size 1 --global-batch-size 512 \
    --bf16 --recompute-granularity full --log-interval 1 \
    --recompute-modules core_attn mlp
)";

TEST_CASE("a Megatron-LM script: variables, quoting, continuations, #SBATCH, a stdlib model") {
  Imported im(ConfigKind::kMegatron, kLlamaScript);
  REQUIRE(im.plan);
  REQUIRE(im.checked);
  CHECK(!im.sink.has_errors());
  const Plan& p = *im.checked;
  CHECK(p.model.name == "llama3_70b");
  CHECK(im.plan->text.find("  model = llama3_70b") != std::string::npos);
  CHECK(im.plan->text.find(
            "tp = 8                              # --tensor-model-parallel-size 8 (line 11)") !=
        std::string::npos);
  CHECK(p.parallel.tp == 8);
  CHECK(p.parallel.pp == 4);
  CHECK(p.parallel.vpp == 2);  // 80 / (4 · 10)
  CHECK(p.pipeline.schedule == Schedule::kInterleaved1F1B);
  CHECK(p.parallel.sp);
  CHECK(p.optimizer.zero == 1);
  CHECK(p.precision == Precision::kBf16);
  CHECK(p.recompute == Recompute::kFull);
  CHECK(p.cluster.nodes == 8);
  CHECK(p.cluster.gpus_per_node == 8);
  CHECK(p.batch.global == 512);
  // Origins are the user's flags, with the variable as written.
  CHECK(im.OriginText("parallel.tp") == "--tensor-model-parallel-size $TP");
  CHECK(im.OriginText("parallel.pp") == "--pipeline-model-parallel-size \"${PP}\"");
  CHECK(im.OriginText("model.layers") == "--num-layers 80");
  CHECK(im.OriginText("cluster.nodes") == "--nodes=8");
  // Not imported, and said so: the note and the comment list them, a list flag whole.
  CHECK(im.Has("P0903"));
  CHECK(im.plan->text.find("--recompute-modules core_attn mlp") != std::string::npos);
  CHECK(im.plan->text.find("--log-interval 1  (not a layout setting)") != std::string::npos);
}

TEST_CASE("Megatron-LM pipeline-split flags: accounting, first/last stage layers, virtual stages") {
  Imported im(
      ConfigKind::kMegatron,
      "torchrun --nnodes 2 --nproc-per-node 8 pretrain_gpt.py --num-layers 62 --hidden-size 1024 "
      "--num-attention-heads 16 --seq-length 2048 --vocab-size 32000 "
      "--pipeline-model-parallel-size 4 "
      "--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split "
      "--decoder-first-pipeline-num-layers 14 --decoder-last-pipeline-num-layers 14 "
      "--num-virtual-stages-per-pipeline-rank 2 --global-batch-size 64\n");
  REQUIRE(im.checked);
  const Plan& p = *im.checked;
  CHECK(p.pipeline.account_for_embedding);
  CHECK(p.pipeline.account_for_loss);
  CHECK(p.pipeline.first_stage_layers == 14);
  CHECK(p.pipeline.last_stage_layers == 14);
  CHECK(p.parallel.vpp == 2);
  CHECK(p.pipeline.schedule == Schedule::kInterleaved1F1B);
  CHECK(im.OriginText("pipeline.first_stage_layers") == "--decoder-first-pipeline-num-layers 14");
}

TEST_CASE("Megatron-LM's defaults are written where the script is silent") {
  Imported im(ConfigKind::kMegatron,
              "torchrun --nnodes 2 --nproc-per-node 4 pretrain_gpt.py --num-layers 4 "
              "--hidden-size 512 --num-attention-heads 8 --seq-length 1024 --vocab-size 32000 "
              "--micro-batch-size 2 --global-batch-size 16\n");
  REQUIRE(im.checked);
  const Plan& p = *im.checked;
  CHECK(p.model.name == "train_model");  // no stdlib model has this shape
  CHECK(p.precision == Precision::kFp32);
  CHECK(p.model.norm == Norm::kLayerNorm);
  CHECK(p.model.activation == Activation::kGelu);
  CHECK(p.model.tied_embeddings);
  CHECK(p.model.ffn_hidden == 2048);
  CHECK(p.optimizer.weight_decay == doctest::Approx(0.01));
  CHECK(p.cluster.nodes == 2);
  CHECK(p.cluster.gpus_per_node == 4);
  CHECK(im.plan->text.find("Megatron-LM's default: 4 · hidden") != std::string::npos);
  CHECK(!im.Has("P0903"));
}

TEST_CASE("Megatron-LM MoE and MLA flags: dense layers, shared experts, SwiGLU ffn default") {
  Imported im(ConfigKind::kMegatron,
              "python pretrain_gpt.py --num-layers 6 --hidden-size 1024 --num-attention-heads 16 "
              "--seq-length 2048 --vocab-size 50000 --swiglu --num-experts 8 --moe-router-topk 2 "
              "--moe-ffn-hidden-size 512 --moe-shared-expert-intermediate-size 1024 "
              "--moe-layer-freq '([0]*1+[1]*5)' --multi-latent-attention --kv-lora-rank 128 "
              "--q-lora-rank 256 --qk-head-dim 64 --qk-pos-emb-head-dim 32 --v-head-dim 64 "
              "--expert-model-parallel-size 4 --bf16\n",
              ImportOptions{.nodes = 1, .gpus_per_node = 8});
  REQUIRE(im.checked);
  const Plan& p = *im.checked;
  CHECK(p.model.ffn_hidden == 2688);  // int(4 · 1024 · 2/3 / 64) · 64
  CHECK(p.model.experts == 8);
  CHECK(p.model.shared_experts == 2);
  CHECK(p.model.dense_layers == 1);
  CHECK(p.model.kv_lora_rank == 128);
  CHECK(p.model.qk_rope_head_dim == 32);
  CHECK(p.parallel.ep == 4);
  CHECK(im.OriginText("model.dense_layers") == "--moe-layer-freq '([0]*1+[1]*5)'");
}

// A plan file's text, evaluated with the stdlib; nullopt when it does not check.
std::optional<Plan> EvaluatePlanText(const std::string& name, const std::string& text) {
  SourceManager sm;
  DiagnosticSink sink;
  LoadOptions load;
  load.stdlib_dir = Stdlib();
  auto source = PlanSource::FromText(name, text, load, sm, sink);
  if (!source) return std::nullopt;
  std::optional<Plan> plan = source->Evaluate("", {}, EvalOptions{}, sink);
  if (sink.has_errors()) return std::nullopt;
  return plan;
}

// A Megatron-LM script imported back into a plan, evaluated; nullopt when it does not import.
std::optional<Plan> ImportMegatronText(const std::string& text) {
  SourceManager sm;
  DiagnosticSink sink;
  ImportOptions options;
  options.stdlib_dir = Stdlib();
  auto imported = ImportConfigText(ConfigKind::kMegatron, "p.sh", text, options, sm, sink);
  if (!imported) return std::nullopt;
  return EvaluatePlanText("back.plan", imported->text);
}

TEST_CASE("Megatron-LM's router flags: score function, pre-softmax, loss, the expert bias") {
  const std::string head =
      "python pretrain_gpt.py --num-layers 4 --hidden-size 1024 --num-attention-heads 16 "
      "--seq-length 2048 --vocab-size 32000 --num-experts 8 --moe-router-topk 2 ";
  {
    Imported im(ConfigKind::kMegatron,
                head +
                    "--moe-router-score-function sigmoid --moe-aux-loss-coeff 0.001 "
                    "--moe-router-enable-expert-bias --moe-router-bias-update-rate 0.002\n",
                ImportOptions{.nodes = 1, .gpus_per_node = 8});
    REQUIRE(im.checked);
    const Plan& p = *im.checked;
    CHECK(p.model.router_score == RouterScore::kSigmoid);
    CHECK(p.model.router_topk_norm);
    CHECK(p.model.router_aux_coeff == doctest::Approx(0.001));
    CHECK(p.model.router_bias_rate == doctest::Approx(0.002));
    CHECK(im.OriginText("model.router_bias_rate") == "--moe-router-bias-update-rate 0.002");
  }
  {
    // Megatron-LM's defaults: no balancing loss; the switch alone takes its rate 1e-3.
    Imported im(ConfigKind::kMegatron,
                head + "--moe-router-pre-softmax --moe-router-enable-expert-bias\n",
                ImportOptions{.nodes = 1, .gpus_per_node = 8});
    REQUIRE(im.checked);
    const Plan& p = *im.checked;
    CHECK(p.model.router_score == RouterScore::kSoftmax);
    CHECK_FALSE(p.model.router_topk_norm);
    CHECK(p.model.router_aux_coeff == 0);
    CHECK(p.model.router_bias_rate == doctest::Approx(0.001));
  }
  {
    Imported im(ConfigKind::kMegatron,
                head + "--moe-aux-loss-coeff 0.01 --moe-router-load-balancing-type none\n",
                ImportOptions{.nodes = 1, .gpus_per_node = 8});
    REQUIRE(im.checked);
    CHECK(im.checked->model.router_aux_coeff == 0);
  }
  {
    Imported im(ConfigKind::kMegatron,
                head + "--moe-router-bias-update-rate fast --moe-router-enable-expert-bias\n",
                ImportOptions{.nodes = 1, .gpus_per_node = 8});
    CHECK_FALSE(im.checked);
  }
}

TEST_CASE("the router's settings export to Megatron-LM and back") {
  std::optional<Plan> plan = EvaluatePlanText(
      "p.plan",
      "import std.models.deepseek\nimport std.clusters\n"
      "plan p { model = deepseek_v3  cluster = dgx_h100 { nodes = 64 }  framework = megatron_core\n"
      "  parallel { tp = 8  pp = 1  ep = 8  etp = 1  sp = true }  batch { global = 512 } }\n");
  REQUIRE(plan);
  DiagnosticSink out;
  ExportResult megatron = ExportPlan(ConfigKind::kMegatron, *plan, out);
  CHECK(megatron.text.find("--moe-router-score-function sigmoid") != std::string::npos);
  CHECK(megatron.text.find("--moe-router-enable-expert-bias") != std::string::npos);
  CHECK(megatron.text.find("--moe-router-pre-softmax") == std::string::npos);
  std::optional<Plan> back = ImportMegatronText(megatron.text);
  REQUIRE(back);
  CHECK(back->model.router_score == RouterScore::kSigmoid);
  CHECK(back->model.router_topk_norm);
  CHECK(back->model.router_aux_coeff == doctest::Approx(plan->model.router_aux_coeff));
  CHECK(back->model.router_bias_rate == doctest::Approx(0.001));
}

TEST_CASE("Megatron-LM's group-limited routing and topk scaling factor import and export") {
  const std::string head =
      "python pretrain_gpt.py --num-layers 4 --hidden-size 1024 --num-attention-heads 16 "
      "--seq-length 2048 --vocab-size 32000 --num-experts 16 --moe-router-topk 4 ";
  {
    Imported im(ConfigKind::kMegatron,
                head +
                    "--moe-router-num-groups 4 --moe-router-group-topk 2 "
                    "--moe-router-topk-scaling-factor 2.5\n",
                ImportOptions{.nodes = 1, .gpus_per_node = 8});
    REQUIRE(im.checked);
    const Plan& p = *im.checked;
    CHECK(p.model.router_groups == 4);
    CHECK(p.model.router_group_topk == 2);
    CHECK(p.model.router_scale == doctest::Approx(2.5));
    CHECK(im.OriginText("model.router_groups") == "--moe-router-num-groups 4");
    CHECK(im.OriginText("model.router_scale") == "--moe-router-topk-scaling-factor 2.5");
  }
  {
    // Without the flags: no grouping, no scale.
    Imported im(ConfigKind::kMegatron, head + "\n", ImportOptions{.nodes = 1, .gpus_per_node = 8});
    REQUIRE(im.checked);
    CHECK(im.checked->model.router_groups == 1);
    CHECK(im.checked->model.router_group_topk == 1);
    CHECK(im.checked->model.router_scale == 1);
  }
  {
    // Groups that do not divide the experts are imported as written: the plan's check refuses
    // them (P0515).
    Imported im(ConfigKind::kMegatron,
                head + "--moe-router-num-groups 3 --moe-router-group-topk 2\n",
                ImportOptions{.nodes = 1, .gpus_per_node = 8});
    REQUIRE(im.checked);
    CHECK(im.checked->model.router_groups == 3);
  }
  // DeepSeek-V2's and V3's routers round-trip through Megatron-LM's flags.
  for (const char* model : {"deepseek_v2", "deepseek_v3"}) {
    CAPTURE(model);
    std::optional<Plan> plan = EvaluatePlanText(
        "p.plan",
        std::string("import std.models.deepseek\nimport std.clusters\nplan p { model = ") + model +
            "  cluster = dgx_h100 { nodes = 64 }  framework = megatron_core\n"
            "  parallel { tp = 8  pp = 1  ep = 8  etp = 1  sp = true }  batch { global = "
            "512 } }\n");
    REQUIRE(plan);
    DiagnosticSink out;
    ExportResult megatron = ExportPlan(ConfigKind::kMegatron, *plan, out);
    CHECK(megatron.text.find("--moe-router-num-groups 8") != std::string::npos);
    CHECK(megatron.text.find("--moe-router-topk-scaling-factor") != std::string::npos);
    std::optional<Plan> back = ImportMegatronText(megatron.text);
    REQUIRE(back);
    CHECK(back->model.router_groups == plan->model.router_groups);
    CHECK(back->model.router_group_topk == plan->model.router_group_topk);
    CHECK(back->model.router_scale == doctest::Approx(plan->model.router_scale));
  }
  // No grouping, no scale: no flags.
  std::optional<Plan> mixtral = EvaluatePlanText(
      "m.plan",
      "import std.models.mixtral\nimport std.clusters\n"
      "plan p { model = mixtral_8x7b  cluster = dgx_h100 { nodes = 8 }  framework = megatron_core\n"
      "  parallel { tp = 8  pp = 1  ep = 8  sp = true }  batch { global = 512 } }\n");
  REQUIRE(mixtral);
  DiagnosticSink out;
  ExportResult flags = ExportPlan(ConfigKind::kMegatron, *mixtral, out);
  CHECK(flags.text.find("--moe-router-num-groups") == std::string::npos);
  CHECK(flags.text.find("--moe-router-group-topk") == std::string::npos);
  CHECK(flags.text.find("--moe-router-topk-scaling-factor") == std::string::npos);
  // A framework without the settings refuses them.
  DiagnosticSink titan_out;
  std::optional<Plan> v3 = EvaluatePlanText(
      "t.plan",
      "import std.models.deepseek\nimport std.clusters\n"
      "plan p { model = deepseek_v3  cluster = dgx_h100 { nodes = 64 }  framework = torchtitan\n"
      "  parallel { tp = 8  pp = 1  ep = 8  etp = 1  sp = true }  batch { global = 512 } }\n");
  REQUIRE(v3);
  ExportPlan(ConfigKind::kTorchtitan, *v3, titan_out);
  bool refused_groups = false;
  for (const Diagnostic& d : titan_out.diagnostics())
    refused_groups = refused_groups || d.message.find("router_groups") != std::string::npos;
  CHECK(refused_groups);
}

TEST_CASE("Megatron-LM's --moe-layer-freq k: every k-th layer is an MoE layer, and imported") {
  Imported im(ConfigKind::kMegatron,
              "torchrun --nnodes 2 --nproc-per-node 8 pretrain_gpt.py --num-layers 8 "
              "--hidden-size 1024 --num-attention-heads 16 --seq-length 2048 --vocab-size 32000 "
              "--num-experts 8 --moe-layer-freq 2\n");
  REQUIRE(im.checked);
  const Plan& p = *im.checked;
  CHECK(p.model.moe_layer_freq == 2);
  CHECK(p.model.dense_layers == 0);
  CHECK(im.OriginText("model.moe_layer_freq") == "--moe-layer-freq 2");
  // Read into the plan, so neither the note nor the plan's first comment lists it.
  CHECK(!im.Has("P0903"));
  CHECK(im.plan->text.find("Not imported") == std::string::npos);
}

TEST_CASE("malformed Megatron-LM input is reported at its line") {
  SUBCASE("a flag without a value") {
    Imported im(ConfigKind::kMegatron, "python pretrain_gpt.py --num-layers --hidden-size 8\n");
    CHECK(!im.plan);
    REQUIRE(im.sink.diagnostics().size() == 1);
    const Diagnostic& d = im.sink.diagnostics()[0];
    CHECK(GetDiagKindInfo(d.kind).code == "P0902");
    CHECK(d.message == "`--num-layers` needs a value");
    CHECK(im.sm.Slice(d.primary) == "--num-layers");
  }
  SUBCASE("a value of the wrong type") {
    Imported im(ConfigKind::kMegatron,
                "python pretrain_gpt.py\\\n  --tensor-model-parallel-size four\n");
    CHECK(!im.plan);
    CHECK(im.sink.diagnostics()[0].message ==
          "`--tensor-model-parallel-size` expects an integer, got 'four'");
    CHECK(im.sm
              .Position(im.sink.diagnostics()[0].primary.buffer,
                        im.sink.diagnostics()[0].primary.begin)
              .line == 2);
  }
  SUBCASE("a variable the script does not set") {
    Imported im(ConfigKind::kMegatron, "torchrun --nnodes $SLURM_NNODES pretrain_gpt.py\n");
    CHECK(!im.plan);
    CHECK(im.sink.diagnostics()[0].message ==
          "the value of `--nnodes` comes from `SLURM_NNODES`, which the script does not set");
    CHECK(im.sink.diagnostics()[0].helps[0] == "pass --nodes N to planc");
    // As the help says: --nodes (and --gpus-per-node for `--nproc-per-node $GPUS`) stand in.
    const std::string script =
        "torchrun --nnodes $SLURM_NNODES --nproc-per-node $GPUS pretrain_gpt.py --num-layers 4 "
        "--hidden-size 256 --num-attention-heads 8 --seq-length 64 --vocab-size 512 "
        "--micro-batch-size 1 --global-batch-size 16 --bf16\n";
    Imported given(ConfigKind::kMegatron, script, ImportOptions{.nodes = 2, .gpus_per_node = 4});
    REQUIRE(given.plan);
    REQUIRE(given.checked);
    CHECK(given.checked->cluster.nodes == 2);
    CHECK(given.checked->cluster.gpus_per_node == 4);
    Imported half(ConfigKind::kMegatron, script, ImportOptions{.nodes = 2});
    CHECK(!half.plan);
    CHECK(half.sink.diagnostics()[0].message ==
          "the value of `--nproc-per-node` comes from `GPUS`, which the script does not set");
  }
  SUBCASE("an unterminated quote") {
    Imported im(ConfigKind::kMegatron, "ARGS=\"--num-layers 4\npython pretrain_gpt.py $ARGS\n");
    CHECK(!im.plan);
    CHECK(GetDiagKindInfo(im.sink.diagnostics()[0].kind).code == "P0901");
  }
  SUBCASE("a size past 64 bits in the importer's arithmetic") {
    Imported im(ConfigKind::kMegatron,
                "python pretrain_gpt.py --hidden-size 9223372036854775807\n");
    CHECK(!im.plan);
    CHECK(im.sink.diagnostics()[0].message == "`--hidden-size` is too large");
  }
  SUBCASE("MoE flags without the model's size") {
    Imported im(ConfigKind::kMegatron, "python pretrain_gpt.py --num-experts 8 --num-layers 2\n");
    CHECK(!im.plan);
    CHECK(im.Has("P0904"));
  }
  SUBCASE("no vocabulary and no stdlib shape") {
    Imported im(ConfigKind::kMegatron,
                "python pretrain_gpt.py --num-layers 4 --hidden-size 512 --num-attention-heads 8 "
                "--seq-length 1024\n");
    CHECK(!im.plan);
    CHECK(GetDiagKindInfo(im.sink.diagnostics()[0].kind).code == "P0904");
  }
}

TEST_CASE(
    "the shell scanner splits quoted lists where they are written and skips their expansion") {
  SourceManager sm;
  uint32_t b = sm.AddBuffer("s.sh", "A=\"--x 1 --y $B\"\nB=2\nrun $A ${C:-7} 'q r' \\\n  --z\n",
                            BufferKind::kFile);
  interop::ShellScript s = interop::ScanShellScript(sm, b);
  std::vector<std::string> texts;
  for (const auto& w : s.words) texts.push_back(w.text);
  // $B is not set yet when A is assigned; $A expands to a list, which is skipped.
  CHECK(texts ==
        std::vector<std::string>{"--x", "1", "--y", "", "run", "--x 1 --y ", "7", "q r", "--z"});
  CHECK(s.words[3].unresolved == "B");
  CHECK(s.words[5].list_expansion);
  CHECK(sm.Slice(s.words[0].range) == "--x");
}

// What bash gives for each form: ${A:-${B:-12}} is 12 with neither set, not ''.
TEST_CASE("the shell scanner expands defaults, assigned defaults and alternatives as bash does") {
  struct Case {
    const char* script;
    const char* value;  // the last word, as bash gives it
  };
  const Case cases[] = {
      {"X=${LAYERS:-${DEFAULT_LAYERS:-12}}\nrun $X\n", "12"},
      {"D=6\nX=${LAYERS:-${D}0}\nrun $X\n", "60"},
      {"X=${A:=12}\nrun $X$A\n", "1212"},
      {"A=\nrun ${A=12}4\n", "4"},
      {"A=\nX=${A:=12}\nrun $A\n", "12"},
      {"run ${A-12}\n", "12"},
      {"A=\nrun ${A-12}x\n", "x"},
      {"run ${A:+x}12\n", "12"},
      {"A=\nrun ${A:+x}12\n", "12"},
      {"A=1\nrun ${A:+4}\n", "4"},
      {"A=1\nrun ${A+4}\n", "4"},
      {"A=1\nrun ${A:?unset}\n", "1"},
      {"A=12\nrun ${B:-\"$A\"}\n", "12"},
      {"A=12\nrun ${B:-'$A'}\n", "$A"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.script);
    SourceManager sm;
    uint32_t b = sm.AddBuffer("s.sh", c.script, BufferKind::kFile);
    interop::ShellScript s = interop::ScanShellScript(sm, b);
    REQUIRE(!s.words.empty());
    CHECK(s.words.back().text == c.value);
    CHECK(s.words.back().unresolved.empty());
  }
}

TEST_CASE(
    "a flag's value from ${A:?msg} with A unset, or from a form planc does not read, is "
    "P0902 naming it") {
  struct Case {
    const char* script;
    const char* message;
  };
  const Case cases[] = {
      {"X=${LAYERS:?set LAYERS}\npython pretrain_gpt.py --num-layers $X\n",
       "the value of `--num-layers` comes from `${LAYERS:?set LAYERS}`, which stops the shell: "
       "`LAYERS` is not set in the script (LAYERS: set LAYERS)"},
      {"python pretrain_gpt.py --num-layers ${LAYERS?}\n",
       "the value of `--num-layers` comes from `${LAYERS?}`, which stops the shell: `LAYERS` is "
       "not set in the script (LAYERS: parameter null or not set)"},
      {"A=12.5\npython pretrain_gpt.py --num-layers ${A%.*}\n",
       "the value of `--num-layers` comes from `${A%.*}`, a suffix removal (`%`) that planc does "
       "not evaluate"},
      {"A=12\npython pretrain_gpt.py --num-layers ${#A}\n",
       "the value of `--num-layers` comes from `${#A}`, a length (`${#NAME}`) that planc does not "
       "evaluate"},
      {"A=12\nX=${A:0:1}\npython pretrain_gpt.py --num-layers $X\n",
       "the value of `--num-layers` comes from `${A:0:1}`, a substring (`:offset`) that planc "
       "does not evaluate"},
      {"A=ab\npython pretrain_gpt.py --num-layers ${A/a/1}\n",
       "the value of `--num-layers` comes from `${A/a/1}`, a pattern substitution (`/`) that "
       "planc does not evaluate"},
      // Assigned from a variable the script does not set: not '' later either.
      {"X=$SLURM_LAYERS\npython pretrain_gpt.py --num-layers $X\n",
       "the value of `--num-layers` comes from `SLURM_LAYERS`, which the script does not set"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.script);
    Imported im(ConfigKind::kMegatron, c.script);
    CHECK(!im.plan);
    REQUIRE(!im.sink.diagnostics().empty());
    const Diagnostic& d = im.sink.diagnostics()[0];
    CHECK(GetDiagKindInfo(d.kind).code == "P0902");
    CHECK(d.message == c.message);
    CHECK(im.sm.Slice(d.primary).substr(0, 12) == "--num-layers");
  }
}

TEST_CASE("quoted array items hold a flag and its value; a list variable's flag is still listed") {
  Imported im(
      ConfigKind::kMegatron,
      "DATA=\"1 ./a\"\nARGS=(\n  \"--fp8-format hybrid\"\n)\n"
      "python pretrain_gpt.py ${ARGS[@]} --num-layers 4 --hidden-size 512 --num-attention-heads 8 "
      "--seq-length 1024 --vocab-size 32000 --bf16 --data-path $DATA\n");
  REQUIRE(im.checked);
  CHECK(im.checked->precision == Precision::kFp8);
  CHECK(im.OriginText("precision") == "--fp8-format hybrid");
  CHECK(im.plan->text.find("--data-path  (not a layout setting") != std::string::npos);
  // No --global-batch-size: one microbatch per data-parallel rank, as Megatron-LM does.
  CHECK(im.checked->batch.global == im.checked->parallel.dp);
}

}  // namespace
}  // namespace paraplan

namespace paraplan {
namespace {

TEST_CASE(
    "torchtitan TOML: degrees, FSDP, checkpointing, float8, the flavor; a type error at its line") {
  Imported im(ConfigKind::kTorchtitan,
              "[model]\nname = \"llama3\"\nflavor = \"70B\"\nconverters = [\"float8\"]\n"
              "[training]\nlocal_batch_size = 8\nseq_len = 4096\nsteps = 10\n"
              "[parallelism]\ndata_parallel_shard_degree = -1\ntensor_parallel_degree = 8\n"
              "pipeline_parallel_degree = 4\npipeline_parallel_schedule = \"1F1B\"\n"
              "[activation_checkpoint]\nmode = \"full\"\n[metrics]\nlog_freq = 10\n",
              ImportOptions{.nodes = 8});
  REQUIRE(im.checked);
  const Plan& p = *im.checked;
  CHECK(p.model.name == "llama3_70b");
  CHECK(p.model.seq_len == 4096);
  CHECK(p.parallel.tp == 8);
  CHECK(p.parallel.sp);
  CHECK(p.parallel.pp == 4);
  CHECK(p.parallel.dp == 2);
  CHECK(p.optimizer.zero == 3);
  CHECK(p.precision == Precision::kFp8);
  CHECK(p.recompute == Recompute::kFull);
  CHECK(p.batch.micro == 1);
  CHECK(p.batch.global == 16);  // local_batch_size 8 per data-parallel rank, dp 2
  CHECK(im.OriginText("parallel.tp") == "tensor_parallel_degree = 8");
  CHECK(im.Has("P0903"));  // metrics.log_freq

  Imported bad(ConfigKind::kTorchtitan,
               "[model]\nname = \"llama3\"\nflavor = \"8B\"\n[parallelism]\ntensor_parallel_degree "
               "= \"2\"\n");
  CHECK(!bad.plan);
  REQUIRE(bad.sink.diagnostics().size() == 1);
  CHECK(bad.sink.diagnostics()[0].message ==
        "`parallelism.tensor_parallel_degree` expects an integer, got a string (2)");
  CHECK(bad.sm
            .Position(bad.sink.diagnostics()[0].primary.buffer,
                      bad.sink.diagnostics()[0].primary.begin)
            .line == 5);

  Imported syntax(ConfigKind::kTorchtitan, "[model]\nname = \"llama3\nflavor = 8B\n");
  CHECK(!syntax.plan);
  CHECK(syntax.Has("P0901"));
}

// A table where a setting takes a number: flattened, its keys would only be listed as not
// recognised and the plan would take the default in silence.
TEST_CASE("a table where a setting takes a number is P0902 at the key, in TOML, YAML and JSON") {
  struct Case {
    ConfigKind kind;
    const char* text;
    const char* message;
    uint32_t line;
  };
  const Case cases[] = {
      {ConfigKind::kTorchtitan,
       "[model]\nname = \"llama3\"\nflavor = \"8B\"\n[training]\nseq_len = {a = 1}\n",
       "`training.seq_len` expects an integer, got a table", 5},
      {ConfigKind::kTorchtitan,
       "[model]\nname = \"llama3\"\nflavor = \"8B\"\n[parallelism.pipeline_parallel_degree]\n"
       "a = 2\n",
       "`parallelism.pipeline_parallel_degree` expects an integer, got a table", 4},
      {ConfigKind::kTorchtitan,
       "[model]\nname = \"llama3\"\nflavor = \"8B\"\n[parallelism]\n"
       "context_parallel_degree = {}\n",
       "`parallelism.context_parallel_degree` expects an integer, got a table", 5},
      {ConfigKind::kNemo, "model:\n  micro_batch_size:\n    a: 1\n",
       "`model.micro_batch_size` expects an integer, got a table", 2},
      {ConfigKind::kNemo, "model:\n  virtual_pipeline_model_parallel_size: {a: 2}\n",
       "`model.virtual_pipeline_model_parallel_size` expects an integer, got a table", 2},
      {ConfigKind::kNemo, "model:\n  context_parallel_size: {}\n",
       "`model.context_parallel_size` expects an integer, got a table", 2},
      {ConfigKind::kNemo, "trainer:\n  num_nodes: 1\n  devices:\n    count: 8\n",
       "`trainer.devices` expects an integer, got a table", 3},
      {ConfigKind::kDeepSpeed, "{\"train_batch_size\": {\"a\": 8}}",
       "`train_batch_size` expects an integer, got a table", 1},
      {ConfigKind::kDeepSpeed,
       "{\"train_batch_size\": 8,\n \"zero_optimization\": {\"stage\": {\"a\": 2}}}",
       "`zero_optimization.stage` expects an integer, got a table", 2},
  };
  for (const Case& c : cases) {
    CAPTURE(c.text);
    Imported im(c.kind, c.text);
    CHECK(!im.plan);
    REQUIRE(!im.sink.diagnostics().empty());
    const Diagnostic& d = im.sink.diagnostics()[0];
    CHECK(GetDiagKindInfo(d.kind).code == "P0902");
    CHECK(d.message == c.message);
    CHECK(im.sm.Position(d.primary.buffer, d.primary.begin).line == c.line);
  }
  // A table of keys the file may hold (a section, Megatron-Bridge's mixed_precision) is no error.
  Imported sections(ConfigKind::kNemo,
                    std::string("mixed_precision:\n  grad_reduce_in_fp32: true\n") +
                        "model:\n  num_layers: 32\n  hidden_size: 4096\n"
                        "  num_attention_heads: 32\n  seq_length: 4096\n"
                        "  vocab_size: 32000\n");
  REQUIRE(sections.plan);
  CHECK(sections.plan->text.find("grads = fp32") != std::string::npos);
}

TEST_CASE("NeMo YAML: trainer and model keys, interpolation, unknown keys noted at their line") {
  Imported im(
      ConfigKind::kNemo,
      "trainer:\n  num_nodes: 2\n  devices: 8\n  precision: bf16-mixed\n"
      "model:\n  tensor_model_parallel_size: ${trainer.devices}\n  micro_batch_size: 1\n"
      "  global_batch_size: 64\n  encoder_seq_length: 4096\n  num_layers: 32\n  hidden_size: 4096\n"
      "  ffn_hidden_size: 11008\n  num_attention_heads: 32\n  normalization: rmsnorm\n"
      "  activation: fast-swiglu\n  position_embedding_type: rope\n"
      "  share_embeddings_and_output_weights: false\n  virtual_pipeline_model_parallel_size: null\n"
      "  tensor_parallel_sizee: 4\n");
  REQUIRE(im.checked);
  const Plan& p = *im.checked;
  CHECK(p.model.name == "llama2_7b");
  CHECK(p.parallel.tp == 8);
  CHECK(p.cluster.nodes == 2);
  CHECK(p.precision == Precision::kBf16);
  bool noted = false;
  for (const Diagnostic& d : im.sink.diagnostics()) {
    if (GetDiagKindInfo(d.kind).code != "P0903") continue;
    noted = im.sm.Slice(d.primary) == "tensor_parallel_sizee: 4" &&
            im.sm.Position(d.primary.buffer, d.primary.begin).line == 19;
  }
  CHECK(noted);
  Imported bad(ConfigKind::kNemo, "model:\n  num_layers: [1\n");
  CHECK(!bad.plan);
  CHECK(bad.Has("P0901"));
}

// A small MoE model in Megatron-Bridge's keys (Megatron-Core's TransformerConfig names).
constexpr const char* kBridgeModel =
    "model:\n  num_layers: 4\n  hidden_size: 256\n  ffn_hidden_size: 512\n"
    "  num_attention_heads: 8\n  seq_length: 128\n  vocab_size: 1024\n  normalization: RMSNorm\n"
    "  position_embedding_type: rope\n  share_embeddings_and_output_weights: false\n"
    "  num_moe_experts: 8\n  moe_router_topk: 2\n  moe_ffn_hidden_size: 64\n";

TEST_CASE("Megatron-Bridge's MoE and model keys map as Megatron-LM's flags do") {
  Imported im(ConfigKind::kNemo,
              std::string(kBridgeModel) +
                  "  gated_linear_unit: true\n  qk_layernorm: True\n  mtp_num_layers: 1\n"
                  "  moe_expert_capacity_factor: 1.5\n  moe_token_drop_policy: position\n"
                  "  moe_router_score_function: sigmoid\n  moe_router_pre_softmax: false\n"
                  "  moe_aux_loss_coeff: 0.002\n  moe_router_num_groups: 2\n"
                  "  moe_router_group_topk: 1\n  moe_router_topk_scaling_factor: 2.5\n"
                  "  moe_router_enable_expert_bias: true\n  moe_router_bias_update_rate: 0.01\n"
                  "  moe_shared_expert_intermediate_size: 128\n  moe_layer_freq: [0, 1, 1, 1]\n"
                  "  cpu_offloading_num_layers: 1\n  tp_comm_overlap: false\n"
                  "  recompute_granularity: selective\n  recompute_modules: [core_attn]\n"
                  "optimizer:\n  optimizer: adam\n  optimizer_cpu_offload: true\n"
                  "  optimizer_offload_fraction: 0.5\n"
                  "rng:\n  seed: 7\n");
  REQUIRE(im.checked);
  const Plan& p = *im.checked;
  CHECK(p.model.activation == Activation::kSwiGlu);
  CHECK(p.model.qk_norm);
  CHECK(p.model.mtp_layers == 1);
  CHECK(p.moe.capacity_factor == 1.5);
  CHECK(p.moe.drop_policy == DropPolicy::kPosition);
  CHECK(p.model.router_score == RouterScore::kSigmoid);
  CHECK(p.model.router_topk_norm);  // pre_softmax false: the top k is renormalised
  CHECK(p.model.router_aux_coeff == 0.002);
  CHECK(p.model.router_groups == 2);
  CHECK(p.model.router_group_topk == 1);
  CHECK(p.model.router_scale == 2.5);
  CHECK(p.model.router_bias_rate == 0.01);
  CHECK(p.model.shared_experts == 2);
  CHECK(p.model.dense_layers == 1);
  CHECK(p.activations.offload_layers == 1);
  CHECK(!p.parallel.tp_comm_overlap);
  CHECK(p.activations.recompute_modules == "core_attn");
  CHECK(p.optimizer.type == OptimizerType::kAdamW);
  CHECK(p.optimizer.offload == Offload::kCpu);
  CHECK(p.optimizer.offload_fraction == 0.5);
  CHECK(p.train.seed == 7);
  CHECK(im.OriginText("model.router_bias_rate") == "moe_router_bias_update_rate: 0.01");
  CHECK(im.OriginText("model.shared_experts") == "moe_shared_expert_intermediate_size: 128");
  // Every key above has a plan field: nothing is noted as not imported.
  CHECK(!im.Has("P0903"));

  // pre-softmax, the loss switched off, a frequency, the bias at Megatron-Core's rate.
  Imported other(ConfigKind::kNemo, std::string(kBridgeModel) +
                                        "  moe_router_pre_softmax: True\n"
                                        "  moe_router_load_balancing_type: none\n"
                                        "  moe_aux_loss_coeff: 0.01\n  moe_layer_freq: 2\n"
                                        "  moe_router_enable_expert_bias: True\n");
  REQUIRE(other.checked);
  CHECK(!other.checked->model.router_topk_norm);
  CHECK(other.checked->model.router_aux_coeff == 0);
  CHECK(other.checked->model.moe_layer_freq == 2);
  CHECK(other.checked->model.dense_layers == 0);
  CHECK(other.checked->model.router_bias_rate == 0.001);

  // Megatron-Bridge's communication-overlap section.
  Imported overlap(ConfigKind::kNemo, std::string(kBridgeModel) +
                                          "  tensor_model_parallel_size: 2\n"
                                          "  sequence_parallel: true\n"
                                          "comm_overlap:\n  tp_comm_overlap: true\n"
                                          "  overlap_grad_reduce: true\n");
  REQUIRE(overlap.checked);
  CHECK(overlap.checked->parallel.tp_comm_overlap);
  CHECK(overlap.Has("P0903"));  // overlap_grad_reduce: the time model assumes overlap
}

TEST_CASE("Megatron-Bridge's fp8 settings: the format, the recipe, parameter gathering, presets") {
  Imported im(ConfigKind::kNemo, std::string(kBridgeModel) +
                                     "mixed_precision:\n  bf16: true\n  fp8: hybrid\n"
                                     "  fp8_recipe: tensorwise\n  fp8_param_gather: true\n");
  REQUIRE(im.checked);
  CHECK(im.checked->precision == Precision::kFp8);
  CHECK(im.checked->mixed_precision.fp8 == Fp8Recipe::kCurrent);
  CHECK(im.checked->mixed_precision.fp8_params);
  CHECK(im.OriginText("precision") == "fp8: hybrid");
  // NeMo's boolean spelling, after the trainer's bf16: fp8 wins.
  Imported nemo(ConfigKind::kNemo, std::string(kBridgeModel) +
                                       "  fp8: True\n  fp8_param: true\ntrainer:\n  precision: "
                                       "bf16-mixed\n");
  REQUIRE(nemo.checked);
  CHECK(nemo.checked->precision == Precision::kFp8);
  CHECK(nemo.checked->mixed_precision.fp8_params);
  Imported off(ConfigKind::kNemo, std::string(kBridgeModel) + "  fp8: false\n  bf16: true\n");
  REQUIRE(off.checked);
  CHECK(off.checked->precision == Precision::kBf16);
  // A recipe by name.
  Imported preset(ConfigKind::kNemo, std::string(kBridgeModel) +
                                         "mixed_precision: bf16_with_fp8_current_scaling_mixed\n");
  REQUIRE(preset.checked);
  CHECK(preset.checked->precision == Precision::kFp8);
  CHECK(preset.checked->mixed_precision.fp8 == Fp8Recipe::kCurrent);
  CHECK(preset.checked->mixed_precision.fp8_params);
  Imported bf16(ConfigKind::kNemo, std::string(kBridgeModel) + "mixed_precision: bf16-mixed\n");
  REQUIRE(bf16.checked);
  CHECK(bf16.checked->precision == Precision::kBf16);
  CHECK(bf16.checked->mixed_precision.fp8 == Fp8Recipe::kNone);
  Imported unknown(ConfigKind::kNemo, std::string(kBridgeModel) +
                                          "mixed_precision: fp16_with_fp8_delayed_scaling_mixed\n");
  REQUIRE(unknown.checked);
  CHECK(unknown.Has("P0903"));
}

TEST_CASE("Megatron-Bridge's grad_reduce_in_fp32: false is bf16 gradients, true fp32") {
  for (const char* spelling : {"false", "False"}) {
    CAPTURE(spelling);
    Imported im(ConfigKind::kNemo, std::string(kBridgeModel) + "  bf16: true\nddp:\n" +
                                       "  grad_reduce_in_fp32: " + spelling + "\n");
    REQUIRE(im.checked);
    CHECK(im.checked->mixed_precision.grads == ElementType::kBf16);
    CHECK(im.OriginText("mixed_precision.grads") ==
          std::string("grad_reduce_in_fp32: ") + spelling);
  }
  for (const char* spelling : {"true", "True"}) {
    CAPTURE(spelling);
    Imported im(ConfigKind::kNemo, std::string(kBridgeModel) + "  bf16: true\nmixed_precision:\n" +
                                       "  grad_reduce_in_fp32: " + spelling + "\n");
    REQUIRE(im.checked);
    CHECK(im.checked->mixed_precision.grads == ElementType::kFp32);
    CHECK(im.checked->Range("mixed_precision.grads").IsValid());
  }
  // Both, agreeing.
  Imported both(ConfigKind::kNemo,
                std::string(kBridgeModel) +
                    "ddp:\n  grad_reduce_in_fp32: false\n"
                    "mixed_precision:\n  bf16: true\n  grad_reduce_in_fp32: false\n");
  REQUIRE(both.checked);
  CHECK(both.checked->mixed_precision.grads == ElementType::kBf16);
  // Both, disagreeing: P0902 at the second, the first labelled.
  Imported clash(ConfigKind::kNemo, std::string(kBridgeModel) +
                                        "ddp:\n  grad_reduce_in_fp32: false\n"
                                        "mixed_precision:\n  grad_reduce_in_fp32: true\n");
  CHECK(!clash.plan);
  REQUIRE(clash.sink.diagnostics().size() == 1);
  const Diagnostic& d = clash.sink.diagnostics()[0];
  CHECK(GetDiagKindInfo(d.kind).code == "P0902");
  CHECK(d.message ==
        "`mixed_precision.grad_reduce_in_fp32 = true` disagrees with `ddp.grad_reduce_in_fp32 = "
        "false`");
  CHECK(clash.sm.Slice(d.primary) == "grad_reduce_in_fp32: true");
  CHECK(clash.sm.Position(d.primary.buffer, d.primary.begin).line == 17);
  // Not a boolean.
  Imported text(ConfigKind::kNemo,
                std::string(kBridgeModel) + "ddp:\n  grad_reduce_in_fp32: \"no\"\n");
  CHECK(!text.plan);
  CHECK(text.Has("P0902"));
}

TEST_CASE("Megatron-Bridge keys with bad values are P0902 at their line") {
  const char* bad[] = {
      "  moe_token_drop_policy: random\n",
      "  moe_router_score_function: tanh\n",
      "  moe_expert_capacity_factor: big\n",
      "  moe_router_num_groups: 2.5\n",
      "  qk_layernorm: 1\n",
      "  fp8: e5m2\n",
      "  moe_shared_expert_intermediate_size: 100\n",
      "  moe_router_enable_expert_bias: true\n  moe_router_bias_update_rate: -1\n",
      "  moe_router_enable_expert_bias: sometimes\n",
  };
  for (const char* line : bad) {
    CAPTURE(line);
    Imported im(ConfigKind::kNemo, std::string(kBridgeModel) + line);
    CHECK(!im.plan);
    REQUIRE(!im.sink.diagnostics().empty());
    const Diagnostic& d = im.sink.diagnostics()[0];
    CHECK(GetDiagKindInfo(d.kind).code == "P0902");
    CHECK(im.sm.Position(d.primary.buffer, d.primary.begin).line >= 14);
  }
}

TEST_CASE("Megatron-Bridge's pipeline layout, a string or lists, is the plan's stage_layers") {
  Imported lists(ConfigKind::kNemo,
                 std::string(kBridgeModel) +
                     "  mtp_num_layers: 1\n  pipeline_model_parallel_size: 2\n"
                     "  pipeline_model_parallel_layout: [[Embedding, decoder], [decoder], "
                     "[decoder], [decoder, mtp, loss]]\n");
  REQUIRE(lists.checked);
  CHECK(!lists.sink.has_errors());
  CHECK(lists.checked->pipeline.stage_layers == std::vector<int64_t>{1, 1, 1, 1});
  CHECK(lists.checked->parallel.vpp == 2);  // 4 virtual stages over pp 2
  CHECK(lists.checked->pipeline.schedule == Schedule::kInterleaved1F1B);
  CHECK(lists.OriginText("pipeline.stage_layers").starts_with("pipeline_model_parallel_layout:"));
  CHECK(lists.plan->text.find("# model.pipeline_model_parallel_layout = Et|(t|)*2tmL (as lists)") !=
        std::string::npos);
  CHECK(!lists.Has("P0903"));

  // The same lists in YAML's block style.
  Imported block(ConfigKind::kNemo, std::string(kBridgeModel) +
                                        "  mtp_num_layers: 1\n  pipeline_model_parallel_size: 2\n"
                                        "  pipeline_model_parallel_layout:\n"
                                        "  - [embedding, decoder, decoder]\n"
                                        "  - - decoder\n    - decoder\n    - mtp\n    - loss\n");
  REQUIRE(block.checked);
  CHECK(block.checked->pipeline.stage_layers == std::vector<int64_t>{2, 2});
  CHECK(block.checked->parallel.vpp == 1);

  Imported text(ConfigKind::kNemo, std::string(kBridgeModel) +
                                       "  pipeline_model_parallel_size: 2\n"
                                       "  virtual_pipeline_model_parallel_size: null\n"
                                       "  pipeline_model_parallel_layout: Ettt|tL\n");
  REQUIRE(text.checked);
  CHECK(!text.sink.has_errors());
  CHECK(text.checked->pipeline.stage_layers == std::vector<int64_t>{3, 1});
  CHECK(text.checked->parallel.vpp == 1);
  CHECK(text.checked->pipeline.schedule == Schedule::k1F1B);
}

TEST_CASE("a pipeline layout Megatron-Core or a plan refuses is P0902 at its key") {
  const char* bad[] = {
      "  pipeline_model_parallel_layout: Ett|tt\n",             // no loss
      "  pipeline_model_parallel_layout: Ett|tx|L\n",           // unknown symbol
      "  pipeline_model_parallel_layout: E(tt|*2ttL\n",         // unbalanced
      "  pipeline_model_parallel_layout: E(t|)*999999999tL\n",  // huge count
      "  pipeline_model_parallel_layout: Et|tt|tL\n",           // 3 stages, pp 2
      "  pipeline_model_parallel_layout: Ett|tttL\n",           // 5 layers, the model 4
      "  pipeline_model_parallel_layout: Ett|ttmL\n",           // MTP, mtp_num_layers unset
      "  virtual_pipeline_model_parallel_size: 3\n"
      "  pipeline_model_parallel_layout: Et|t|t|tL\n",  // vpp 3, the layout 2
      "  pipeline_model_parallel_layout: [[embedding, decoder, decoder], [decoder, attention, "
      "loss]]\n",  // unknown layer type
      "  mtp_num_layers: 1\n"
      "  pipeline_model_parallel_layout: [[embedding, decoder, decoder], [decoder, decoder], "
      "[mtp], [loss]]\n",  // standalone MTP
      "  pipeline_model_parallel_layout: 5\n",
  };
  for (const char* line : bad) {
    CAPTURE(line);
    Imported im(ConfigKind::kNemo,
                std::string(kBridgeModel) + "  pipeline_model_parallel_size: 2\n" + line);
    CHECK(!im.plan);
    REQUIRE(!im.sink.diagnostics().empty());
    const Diagnostic& d = im.sink.diagnostics()[0];
    CHECK(GetDiagKindInfo(d.kind).code == "P0902");
    CHECK(d.message.find("pipeline_model_parallel_layout") != std::string::npos);
    CHECK(im.sm.Slice(d.primary).starts_with("pipeline_model_parallel_layout:"));
  }
}

TEST_CASE("--pipeline-model-parallel-layout: stage_layers, and vpp derived as Megatron-LM does") {
  const std::string script =
      "torchrun --nnodes 1 --nproc-per-node 8 pretrain_gpt.py --num-layers 8 --hidden-size 1024 "
      "--num-attention-heads 16 --seq-length 2048 --vocab-size 32000 --bf16 "
      "--pipeline-model-parallel-size 2 --global-batch-size 64 ";
  Imported im(ConfigKind::kMegatron,
              script + "--pipeline-model-parallel-layout \"E,t|(tt|)*2t*3,L\"\n");
  REQUIRE(im.checked);
  CHECK(!im.sink.has_errors());
  CHECK(im.checked->pipeline.stage_layers == std::vector<int64_t>{1, 2, 2, 3});
  CHECK(im.checked->parallel.vpp == 2);
  CHECK(im.checked->pipeline.schedule == Schedule::kInterleaved1F1B);
  CHECK(im.OriginText("pipeline.stage_layers") ==
        "--pipeline-model-parallel-layout \"E,t|(tt|)*2t*3,L\"");
  CHECK(!im.Has("P0903"));

  // Megatron-LM replaces --virtual-pipeline-model-parallel-size by the layout's stages / pp.
  Imported replaced(ConfigKind::kMegatron, script +
                                               "--virtual-pipeline-model-parallel-size 4 "
                                               "--pipeline-model-parallel-layout 'Etttt|ttttL'\n");
  REQUIRE(replaced.checked);
  CHECK(!replaced.sink.has_errors());
  CHECK(replaced.checked->parallel.vpp == 1);
  CHECK(replaced.checked->pipeline.schedule == Schedule::k1F1B);
  CHECK(replaced.checked->pipeline.stage_layers == std::vector<int64_t>{4, 4});

  // Megatron-LM takes one way of setting the virtual stages, and an `m` only with MTP modules.
  for (const char* extra : {"--num-layers-per-virtual-pipeline-stage 2 "
                            "--pipeline-model-parallel-layout 'Ett|ttL'",
                            "--num-virtual-stages-per-pipeline-rank 2 "
                            "--pipeline-model-parallel-layout 'Ett|ttL'",
                            "--pipeline-model-parallel-layout 'Ett|ttmL'",
                            "--pipeline-model-parallel-layout 'Ett|t(t|)L'"}) {
    CAPTURE(extra);
    Imported bad(ConfigKind::kMegatron, script + extra + "\n");
    CHECK(!bad.plan);
    REQUIRE(!bad.sink.diagnostics().empty());
    const Diagnostic& d = bad.sink.diagnostics()[0];
    CHECK(GetDiagKindInfo(d.kind).code == "P0902");
    CHECK(d.message.find("pipeline-model-parallel-layout") != std::string::npos);
  }
}

TEST_CASE("Megatron-Bridge's MLA keys size the head as Megatron-LM's flags do") {
  Imported im(ConfigKind::kNemo,
              std::string(kBridgeModel) +
                  "  multi_latent_attention: true\n  q_lora_rank: 64\n  kv_lora_rank: 32\n"
                  "  qk_head_dim: 32\n  qk_pos_emb_head_dim: 16\n  v_head_dim: 32\n"
                  "  kv_channels: 32\n");
  REQUIRE(im.checked);
  CHECK(im.checked->model.kv_lora_rank == 32);
  CHECK(im.checked->model.q_lora_rank == 64);
  CHECK(im.checked->model.head_dim == 48);
  CHECK(im.checked->model.v_head_dim == 32);
  CHECK(im.Has("P0903"));  // kv_channels does not size an MLA head
}

// docs/interop.md lists every row of the NeMo table with its plan path, and every key it skips.
TEST_CASE("docs/interop.md documents every NeMo and Megatron-Bridge key") {
  const char* root = std::getenv("PARAPLAN_SOURCE_DIR");
  std::ifstream in(std::string(root ? root : ".") + "/docs/interop.md");
  const std::string docs((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  REQUIRE(!docs.empty());
  for (const interop::SettingRow& row : interop::NemoRows()) {
    CAPTURE(row.key);
    CHECK(docs.find("| `" + std::string(row.key) + "` | `" + std::string(row.path.path) + "` |") !=
          std::string::npos);
  }
  for (const interop::SkippedRow& row : interop::NemoSkippedRows()) {
    CAPTURE(row.key);
    CHECK(docs.find("| `" + std::string(row.key) + "` | " + std::string(row.reason) + " |") !=
          std::string::npos);
  }
}

TEST_CASE("Megatron-DeepSpeed's own spellings: lower-case norms, rotary switch, key-value heads") {
  Imported im(ConfigKind::kMegatron,
              "torchrun pretrain_gpt.py --num-layers 4 --hidden-size 512 --num-attention-heads 8 "
              "--seq-length 1024 --vocab-size 32000 --normalization rmsnorm "
              "--use-rotary-position-embeddings --num-key-value-heads 2 --swiglu\n");
  REQUIRE(im.checked);
  CHECK(im.checked->model.norm == Norm::kRmsNorm);
  CHECK(im.checked->model.position == Position::kRope);
  CHECK(im.checked->model.kv_heads == 2);
}

TEST_CASE("DeepSpeed JSON with a Megatron-DeepSpeed script; the JSON alone names no model") {
  Imported alone(ConfigKind::kDeepSpeed,
                 "{\"train_batch_size\": 8, \"zero_optimization\": {\"stage\": 2}}");
  CHECK(!alone.plan);
  CHECK(alone.Has("P0904"));
  Imported bad(ConfigKind::kDeepSpeed,
               "{\"train_batch_size\": 8,\n \"zero_optimization\": {\"stage\": \"two\"}}");
  CHECK(!bad.plan);
  CHECK(bad.sink.diagnostics()[0].message ==
        "`zero_optimization.stage` expects an integer, got a string (two)");
  Imported syntax(ConfigKind::kDeepSpeed,
                  "{\"train_batch_size\": 8,\n \"bf16\": {\"enabled\": true,}}");
  CHECK(!syntax.plan);
  CHECK(syntax.Has("P0901"));
}

constexpr const char* kTinyScript =
    "torchrun --nnodes 1 --nproc-per-node 8 pretrain_gpt.py --num-layers 4 --hidden-size 256 "
    "--num-attention-heads 8 --seq-length 64 --vocab-size 512 --micro-batch-size 1 "
    "--global-batch-size 16 --bf16\n";

// The A100 40GB is a GPU record of std.gpus over the dgx_a100 cluster; the written plan imports
// both, whether the model is a record of its own (the probe evaluates it with the cluster) or a
// stdlib model.
TEST_CASE("every --gpu name imports from every kind, and the plan evaluates on that GPU") {
  const std::pair<ConfigKind, std::string> files[] = {
      {ConfigKind::kMegatron, kTinyScript},
      {ConfigKind::kNemo, std::string(kBridgeModel) + "trainer:\n  num_nodes: 1\n  devices: 8\n"},
      {ConfigKind::kTorchtitan, "[model]\nname = \"llama3\"\nflavor = \"8B\"\n"},
  };
  const std::pair<const char*, const char*> gpus[] = {
      {"h100", "h100_sxm"},  {"h200", "h200"},           {"h800", "h800"},
      {"a100", "a100_80gb"}, {"a100_80gb", "a100_80gb"}, {"a100_40gb", "a100_40gb"}};
  REQUIRE(ImportGpuNames().size() == std::size(gpus));
  for (const auto& file : files) {
    for (const auto& gpu : gpus) {
      CAPTURE(ToString(file.first));
      CAPTURE(gpu.first);
      Imported im(file.first, file.second, ImportOptions{.gpu = gpu.first});
      REQUIRE(im.plan);
      REQUIRE(im.checked);
      CHECK(im.checked->cluster.gpu.name == gpu.second);
      CHECK((im.plan->text.find("import std.gpus\n") != std::string::npos) ==
            (std::string(gpu.first) == "a100_40gb"));
    }
  }
  // Only the names themselves: a path or a name with more around it is no GPU.
  for (const char* bad : {"../h100", "x/../a100", "a100/..", "h100;", "H100", "a100_40"}) {
    CAPTURE(bad);
    Imported im(ConfigKind::kMegatron, kTinyScript, ImportOptions{.gpu = bad});
    CHECK(!im.plan);
    REQUIRE(!im.sink.diagnostics().empty());
    CHECK(im.sink.diagnostics()[0].message ==
          "no stdlib cluster has the GPU `" + std::string(bad) + "`");
  }
}

TEST_CASE("a cluster whose nodes · GPUs per node is past 64 bits is P0902 at its settings") {
  Imported nemo(
      ConfigKind::kNemo,
      std::string(kBridgeModel) + "trainer:\n  num_nodes: 128\n  devices: 9223372036854775807\n");
  CHECK(!nemo.plan);
  REQUIRE(!nemo.sink.diagnostics().empty());
  const Diagnostic& d = nemo.sink.diagnostics()[0];
  CHECK(GetDiagKindInfo(d.kind).code == "P0902");
  CHECK(d.message ==
        "the cluster's size is out of range: `nodes · gpus_per_node` = 128 · 9223372036854775807 "
        "is past 64 bits");
  CHECK(nemo.sm.Slice(d.primary) == "num_nodes: 128");
  REQUIRE(d.labels.size() == 1);
  CHECK(nemo.sm.Slice(d.labels[0].range) == "devices: 9223372036854775807");

  // The launcher's node count, with the stdlib cluster's 8 GPUs per node.
  Imported megatron(ConfigKind::kMegatron,
                    "NNODES=9223372036854775807\ntorchrun --nnodes $NNODES pretrain_gpt.py "
                    "--num-layers 4 --hidden-size 256 --num-attention-heads 8 --seq-length 64 "
                    "--vocab-size 512\n");
  CHECK(!megatron.plan);
  REQUIRE(!megatron.sink.diagnostics().empty());
  CHECK(megatron.sink.diagnostics()[0].message ==
        "the cluster's size is out of range: `nodes · gpus_per_node` = 9223372036854775807 · 8 "
        "is past 64 bits");
  CHECK(megatron.sm.Slice(megatron.sink.diagnostics()[0].primary) == "--nnodes $NNODES");

  // The command line's node count times the file's GPUs per node.
  Imported option(ConfigKind::kNemo,
                  std::string(kBridgeModel) + "trainer:\n  devices: 4611686018427387904\n",
                  ImportOptions{.nodes = 2});
  CHECK(!option.plan);
  REQUIRE(!option.sink.diagnostics().empty());
  CHECK(option.sm.Slice(option.sink.diagnostics()[0].primary) == "devices: 4611686018427387904");
  // One less fits in 64 bits: the plan's own checks take it from there.
  Imported fits(ConfigKind::kNemo,
                std::string(kBridgeModel) + "trainer:\n  devices: 4611686018427387903\n",
                ImportOptions{.nodes = 2});
  CHECK(fits.plan);
}

}  // namespace
}  // namespace paraplan

namespace paraplan {
namespace {

TEST_CASE(
    "the precision record, recompute detail, MoE dispatch and framework from a Megatron-LM "
    "script") {
  Imported im(
      ConfigKind::kMegatron,
      "torchrun --nnodes 4 --nproc-per-node 8 pretrain_gpt.py --num-layers 8 --hidden-size 1024 "
      "--num-attention-heads 16 --seq-length 2048 --vocab-size 32000 --swiglu "
      "--num-experts 8 --moe-router-topk 2 --moe-token-dispatcher-type flex "
      "--expert-model-parallel-size 8 --pipeline-model-parallel-size 2 "
      "--bf16 --fp8-format hybrid --fp8-recipe tensorwise --fp8-param-gather --grad-reduce-in-bf16 "
      "--recompute-granularity full --recompute-method block --recompute-num-layers 4 "
      "--make-vocab-size-divisible-by 64 --global-batch-size 64\n");
  REQUIRE(im.checked);
  const Plan& p = *im.checked;
  CHECK(p.framework == Framework::kMegatronCore);
  CHECK(p.precision == Precision::kFp8);
  CHECK(p.mixed_precision.fp8 == Fp8Recipe::kCurrent);
  CHECK(p.mixed_precision.fp8_params);
  CHECK(p.mixed_precision.grads == ElementType::kBf16);
  CHECK(p.recompute == Recompute::kFull);
  CHECK(p.activations.recompute_method == RecomputeMethod::kBlock);
  CHECK(p.activations.recompute_layers == 0);  // 4 = every layer of a chunk (8 layers / pp 2)
  CHECK(p.moe.dispatcher == Dispatcher::kFlex);
  CHECK(p.model.vocab_divisor == 64);
  CHECK(im.OriginText("mixed_precision.fp8") == "--fp8-recipe tensorwise");

  Imported sel(ConfigKind::kMegatron,
               "python pretrain_gpt.py --num-layers 8 --hidden-size 1024 --num-attention-heads 16 "
               "--seq-length 2048 --vocab-size 32000 --recompute-granularity selective "
               "--recompute-modules core_attn mlp --recompute-num-layers 3\n");
  REQUIRE(sel.checked);
  CHECK(sel.checked->activations.recompute_modules == "core_attn, mlp");
  CHECK(sel.checked->activations.recompute_layers == 3);
}

TEST_CASE("torchtitan HSDP, resharding and float8; NeMo and DeepSpeed name their framework") {
  Imported im(ConfigKind::kTorchtitan,
              "[model]\nname = \"llama3\"\nflavor = \"8B\"\nconverters = [\"float8\"]\n"
              "[training]\nlocal_batch_size = 2\nmixed_precision_reduce = \"bfloat16\"\n"
              "[parallelism]\ndata_parallel_replicate_degree = 2\ndata_parallel_shard_degree = 4\n"
              "fsdp_reshard_after_forward = \"never\"\n",
              ImportOptions{.nodes = 1});
  REQUIRE(im.checked);
  const Plan& p = *im.checked;
  CHECK(p.framework == Framework::kTorchtitan);
  CHECK(p.optimizer.zero == 3);
  CHECK(p.parallel.dp == 8);
  CHECK(p.fsdp.replicate == 2);
  CHECK(!p.fsdp.reshard_after_forward);
  CHECK(p.mixed_precision.fp8 == Fp8Recipe::kCurrent);
  CHECK(p.mixed_precision.grads == ElementType::kBf16);
  CHECK(im.OriginText("fsdp.replicate") == "data_parallel_replicate_degree = 2");

  // Pure replication (DDP): dp is the replicate degree, and its origin is that key.
  Imported ddp(
      ConfigKind::kTorchtitan,
      "[model]\nname = \"llama3\"\nflavor = \"8B\"\n[training]\nlocal_batch_size = 1\n"
      "[parallelism]\ndata_parallel_replicate_degree = 8\ndata_parallel_shard_degree = 1\n",
      ImportOptions{.nodes = 1});
  REQUIRE(ddp.checked);
  CHECK(ddp.checked->parallel.dp == 8);
  CHECK(ddp.checked->optimizer.zero == 0);
  CHECK(ddp.OriginText("parallel.dp") == "data_parallel_replicate_degree = 8");

  Imported nemo(
      ConfigKind::kNemo,
      "model:\n  num_layers: 32\n  hidden_size: 4096\n  num_attention_heads: 32\n"
      "  encoder_seq_length: 4096\n  ffn_hidden_size: 11008\n  activation: fast-swiglu\n"
      "  normalization: rmsnorm\n  share_embeddings_and_output_weights: false\n"
      "  recompute_modules: [core_attn, mlp]\n  activations_checkpoint_granularity: selective\n");
  REQUIRE(nemo.checked);
  CHECK(nemo.checked->framework == Framework::kMegatronCore);
  CHECK(nemo.checked->activations.recompute_modules == "core_attn, mlp");
}

TEST_CASE("torchtitan's sequence-parallel switch: on by default with TP, off where the file says") {
  const std::string head =
      "[model]\nname = \"llama3\"\nflavor = \"8B\"\n[training]\nlocal_batch_size = 2\n"
      "[parallelism]\ndata_parallel_shard_degree = 4\ntensor_parallel_degree = 2\n";
  Imported on(ConfigKind::kTorchtitan, head, ImportOptions{.nodes = 1});
  REQUIRE(on.checked);
  CHECK(on.checked->parallel.sp);
  // torchtitan's switch since March 2026: tensor parallelism with replicated activations.
  Imported off(ConfigKind::kTorchtitan, head + "enable_sequence_parallel = false\n",
               ImportOptions{.nodes = 1});
  REQUIRE(off.checked);
  CHECK(off.checked->parallel.tp == 2);
  CHECK_FALSE(off.checked->parallel.sp);
  // A TOML job file has no such switch (torchtitan's TOML files always ran TP with SP): export
  // refuses the plan and says so.
  DiagnosticSink out;
  CHECK(ExportPlan(ConfigKind::kTorchtitan, *off.checked, out).text.empty());
  CHECK(out.has_errors());
  DiagnosticSink out_on;
  const ExportResult back = ExportPlan(ConfigKind::kTorchtitan, *on.checked, out_on);
  CHECK_FALSE(back.text.empty());
  CHECK(back.text.find("enable_sequence_parallel") == std::string::npos);
}

TEST_CASE("torchtitan's torch.compile switch is the plan's `compile`, both ways") {
  for (const char* section : {"[compile]\nenable = true\n", "[training]\ncompile = true\n"}) {
    Imported im(ConfigKind::kTorchtitan,
                std::string("[model]\nname = \"llama3\"\nflavor = \"8B\"\n") + section +
                    "[parallelism]\ndata_parallel_shard_degree = 8\n",
                ImportOptions{.nodes = 1});
    INFO(section);
    REQUIRE(im.checked);
    CHECK(im.checked->compile);
    DiagnosticSink out;
    const ExportResult back = ExportPlan(ConfigKind::kTorchtitan, *im.checked, out);
    CHECK(back.text.find("[compile]\nenable = true") != std::string::npos);
  }
  Imported eager(ConfigKind::kTorchtitan,
                 "[model]\nname = \"llama3\"\nflavor = \"8B\"\n[compile]\nenable = false\n"
                 "[parallelism]\ndata_parallel_shard_degree = 8\n",
                 ImportOptions{.nodes = 1});
  REQUIRE(eager.checked);
  CHECK_FALSE(eager.checked->compile);
  DiagnosticSink out;
  CHECK(ExportPlan(ConfigKind::kTorchtitan, *eager.checked, out).text.find("[compile]") ==
        std::string::npos);
}

TEST_CASE("torchtitan's row-wise float8 recipe: read, written back, refused where it has no name") {
  const std::string head =
      "[model]\nname = \"llama3\"\nflavor = \"8B\"\nconverters = [\"float8\"]\n"
      "[training]\nlocal_batch_size = 2\n[parallelism]\ndata_parallel_shard_degree = 8\n";
  Imported im(ConfigKind::kTorchtitan, head + "[float8]\nrecipe_name = \"rowwise\"\n",
              ImportOptions{.nodes = 1});
  REQUIRE(im.checked);
  CHECK(im.checked->mixed_precision.fp8 == Fp8Recipe::kRowwise);
  CHECK(im.OriginText("mixed_precision.fp8") == "recipe_name = \"rowwise\"");
  // The weight gradient kept in high precision is still row-wise scaling.
  Imported gw(ConfigKind::kTorchtitan, head + "[float8]\nrecipe_name = \"rowwise_with_gw_hp\"\n",
              ImportOptions{.nodes = 1});
  REQUIRE(gw.checked);
  CHECK(gw.checked->mixed_precision.fp8 == Fp8Recipe::kRowwise);
  // tensorwise is the converter's default.
  Imported tensorwise(ConfigKind::kTorchtitan, head + "[float8]\nrecipe_name = \"tensorwise\"\n",
                      ImportOptions{.nodes = 1});
  REQUIRE(tensorwise.checked);
  CHECK(tensorwise.checked->mixed_precision.fp8 == Fp8Recipe::kCurrent);
  // A recipe torchao does not have is an error at its line, not a silent default.
  Imported bad(ConfigKind::kTorchtitan, head + "[float8]\nrecipe_name = \"colwise\"\n",
               ImportOptions{.nodes = 1});
  CHECK_FALSE(bad.plan);
  REQUIRE(bad.sink.diagnostics().size() == 1);
  CHECK(bad.sink.diagnostics()[0].message ==
        "`float8.recipe_name` takes tensorwise, rowwise, rowwise_with_gw_hp, got 'colwise'");
  // Written back for torchtitan; Megatron-LM and NeMo have no row-wise recipe.
  DiagnosticSink out;
  const std::string toml = ExportPlan(ConfigKind::kTorchtitan, *im.checked, out).text;
  CHECK(toml.find("[float8]\nrecipe_name = \"rowwise\"") != std::string::npos);
  Imported again(ConfigKind::kTorchtitan, toml, ImportOptions{.nodes = 1});
  REQUIRE(again.checked);
  CHECK(again.checked->mixed_precision.fp8 == Fp8Recipe::kRowwise);
  for (ConfigKind kind : {ConfigKind::kMegatron, ConfigKind::kNemo}) {
    DiagnosticSink sink;
    CHECK(ExportPlan(kind, *im.checked, sink).text.empty());
    bool refused = false;
    for (const Diagnostic& d : sink.diagnostics())
      refused = refused || d.message.find("mixed_precision.fp8 = rowwise") != std::string::npos;
    CHECK(refused);
  }
}

TEST_CASE("export carries the record settings its target has and refuses the others") {
  std::optional<Plan> plan = EvaluatePlanText(
      "p.plan",
      "import std.models.llama\nimport std.clusters\n"
      "plan p { model = llama3_8b  cluster = dgx_h100 { nodes = 2 }  framework = megatron_core\n"
      "  parallel { tp = 2  pp = 2  sp = true }  batch { global = 64 }  precision = fp8  recompute "
      "= selective\n"
      "  mixed_precision { fp8 = blockwise  grads = bf16 }  activations { recompute_modules = "
      "\"core_attn, mlp\" } }\n");
  REQUIRE(plan);
  DiagnosticSink out;
  ExportResult megatron = ExportPlan(ConfigKind::kMegatron, *plan, out);
  CHECK(megatron.text.find("--fp8-recipe blockwise") != std::string::npos);
  CHECK(megatron.text.find("--grad-reduce-in-bf16") != std::string::npos);
  CHECK(megatron.text.find("--recompute-modules core_attn mlp") != std::string::npos);
  // Back again: the record settings are the same.
  std::optional<Plan> back = ImportMegatronText(megatron.text);
  REQUIRE(back);
  CHECK(back->mixed_precision.fp8 == Fp8Recipe::kBlockwise);
  CHECK(back->mixed_precision.grads == ElementType::kBf16);
  CHECK(back->activations.recompute_modules == "core_attn, mlp");
  // torchtitan's float8 is tensorwise only: the blockwise recipe is refused at its line.
  DiagnosticSink titan_sink;
  CHECK(ExportPlan(ConfigKind::kTorchtitan, *plan, titan_sink).text.empty());
  bool refused = false;
  for (const Diagnostic& d : titan_sink.diagnostics()) {
    refused = refused || d.message == "torchtitan cannot express `mixed_precision.fp8 = blockwise`";
  }
  CHECK(refused);
}

}  // namespace
}  // namespace paraplan
