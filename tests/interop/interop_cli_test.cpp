// planc import, export and --from through the real binary.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "tests/support/cli.h"

namespace paraplan {
namespace {

using testing::ReadFile;
using testing::RunCommand;
using testing::ScratchDir;

const std::string kPlanc = PARAPLAN_PLANC;
const std::string kSource = PARAPLAN_SOURCE;

void Write(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

// A scratch directory removed when the test case ends.
struct ScopedScratch {
  explicit ScopedScratch(const std::string& suite) : dir(ScratchDir(suite)) {}
  ~ScopedScratch() {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
  std::string dir;
};

constexpr const char* kScript = R"(#!/bin/bash
TP=4
NNODES=16
torchrun --nnodes $NNODES --nproc-per-node 8 pretrain_gpt.py \
    --num-layers 60 --hidden-size 5120 --num-attention-heads 128 --seq-length 4096 \
    --vocab-size 102400 --swiglu --normalization RMSNorm --position-embedding-type rope \
    --untie-embeddings-and-output-weights --num-experts 160 --moe-router-topk 6 \
    --moe-ffn-hidden-size 1536 --moe-shared-expert-intermediate-size 3072 \
    --moe-layer-freq '([0]*1+[1]*59)' --ffn-hidden-size 12288 \
    --multi-latent-attention --q-lora-rank 1536 --kv-lora-rank 512 --qk-head-dim 128 \
    --qk-pos-emb-head-dim 64 --v-head-dim 128 \
    --tensor-model-parallel-size $TP \
    --pipeline-model-parallel-size 4 \
    --expert-model-parallel-size 32 \
    --use-distributed-optimizer --bf16 --micro-batch-size 1 --global-batch-size 1024
)";

TEST_CASE("planc check --from=megatron points into the user's script") {
  const ScopedScratch scratch("interop_check");
  const std::string& dir = scratch.dir;
  Write(dir + "/train.sh", kScript);
  auto r = RunCommand(kPlanc + " check --from=megatron train.sh --color=never", dir, dir);
  CHECK(r.status == 1);
  // DeepSeek-V2's expert mesh: etp · ep · pp = 4 · 32 · 4 = 512 > 128 GPUs, with the caret
  // under the flags of the script.
  CHECK(r.err.find("error[P0303]") != std::string::npos);
  CHECK(r.err.find("12 │     --tensor-model-parallel-size $TP \\") != std::string::npos);
  CHECK(r.err.find("14 │     --expert-model-parallel-size 32 \\") != std::string::npos);
  CHECK(r.err.find("train.sh (as a plan)") == std::string::npos);
  // The same file, imported and then checked as a plan, reports the same errors.
  auto imp = RunCommand(kPlanc + " import --from=megatron train.sh -o train.plan", dir, dir);
  CHECK(imp.status == 0);
  const std::string plan = ReadFile(dir + "/train.plan");
  CHECK(plan.find("  model = deepseek_v2") != std::string::npos);
  CHECK(plan.find(
            "ep = 32                             # --expert-model-parallel-size 32 (line 14)") !=
        std::string::npos);
  auto chk = RunCommand(kPlanc + " check train.plan --diagnostics=short", dir, dir);
  auto from = RunCommand(kPlanc + " check --from=megatron train.sh --diagnostics=short", dir, dir);
  CHECK(chk.status == 1);
  CHECK(from.status == 1);
  CHECK(chk.err.find("error[P0303]") != std::string::npos);
  CHECK(from.err.find("train.sh:14:5: error[P0303]") != std::string::npos);
  // The fix the error suggests, given on the command line, checks clean past the mesh rule.
  auto fixed = RunCommand(
      kPlanc + " check --from=megatron train.sh --diagnostics=short --set parallel.etp=1", dir,
      dir);
  CHECK(fixed.err.find("P0303") == std::string::npos);
}

TEST_CASE("--from works with explain, search and compile, and refuses bad usage") {
  const ScopedScratch scratch("interop_from");
  const std::string& dir = scratch.dir;
  Write(dir + "/tiny.sh",
        "torchrun --nnodes 1 --nproc-per-node 8 pretrain_gpt.py --num-layers 4 --hidden-size 256 "
        "--num-attention-heads 8 --seq-length 64 --vocab-size 512 --swiglu --normalization RMSNorm "
        "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --micro-batch-size 1 "
        "--global-batch-size 16 --bf16\n");
  auto ex = RunCommand(kPlanc + " explain --from=megatron tiny.sh --format=json", dir, dir);
  CHECK(ex.status == 0);
  CHECK(ex.out.find("\"world_size\":8") != std::string::npos);
  auto se = RunCommand(kPlanc + " search --from=megatron tiny.sh --set 'parallel.tp=[1,2]' --top 1",
                       dir, dir);
  CHECK(se.status == 0);
  auto co = RunCommand(kPlanc + " compile --from=megatron tiny.sh -o tiny.pplan", dir, dir);
  CHECK(co.status == 0);
  auto bad = RunCommand(kPlanc + " check --from=mxnet tiny.sh", dir, dir);
  CHECK(bad.status == 2);
  CHECK(bad.err.find("--from takes megatron, torchtitan, deepspeed or nemo, got 'mxnet'") !=
        std::string::npos);
  auto nodes = RunCommand(kPlanc + " check tiny.plan --nodes 2", dir, dir);
  CHECK(nodes.status == 2);
  auto missing = RunCommand(kPlanc + " import --from=megatron", dir, dir);
  CHECK(missing.status == 2);
  // --nodes on the command line wins over the launcher line.
  auto over = RunCommand(kPlanc + " import --from=megatron tiny.sh --nodes 4 --gpu a100", dir, dir);
  CHECK(over.out.find("  cluster.nodes = 4                     # --nodes 4") != std::string::npos);
  CHECK(over.out.find("  cluster = dgx_a100") != std::string::npos);
}

TEST_CASE("import takes only the documented --gpu names and decimal counts, and says why") {
  const ScopedScratch scratch("interop_usage");
  const std::string& dir = scratch.dir;
  Write(dir + "/tiny.sh",
        "torchrun --nnodes 1 --nproc-per-node 8 pretrain_gpt.py --num-layers 4 --hidden-size 256 "
        "--num-attention-heads 8 --seq-length 64 --vocab-size 512 --micro-batch-size 1 "
        "--global-batch-size 16 --bf16\n");
  // The A100 40GB: the written plan imports std.gpus, and checks.
  auto a100 = RunCommand(
      kPlanc + " import --from=megatron tiny.sh --gpu a100_40gb -o tiny.plan --diagnostics=short",
      dir, dir);
  CHECK(a100.status == 0);
  const std::string plan = ReadFile(dir + "/tiny.plan");
  CHECK(plan.find("import std.gpus\nimport std.clusters\n") != std::string::npos);
  CHECK(plan.find("cluster = dgx_a100 { gpu = a100_40gb }") != std::string::npos);
  auto chk = RunCommand(kPlanc + " check tiny.plan --diagnostics=short", dir, dir);
  CHECK(chk.status == 0);
  CHECK(chk.err.find("error") == std::string::npos);
  // Any case: `H100` as nvidia-smi writes it.
  auto upper = RunCommand(kPlanc + " import --from=megatron tiny.sh --gpu A100_40GB", dir, dir);
  CHECK(upper.status == 0);
  CHECK(upper.out.find("cluster = dgx_a100 { gpu = a100_40gb }") != std::string::npos);
  // `-o -` is standard output, not a file named `-`.
  auto dash = RunCommand(kPlanc + " import --from=megatron tiny.sh -o -", dir, dir);
  CHECK(dash.status == 0);
  CHECK(dash.out.find("plan ") != std::string::npos);
  CHECK_FALSE(std::filesystem::exists(dir + "/-"));
  for (const std::string gpu : {"'../h100'", "'x/../a100'", "'a100/..'", "'h100;'", "''"}) {
    CAPTURE(gpu);
    auto r = RunCommand(kPlanc + " import --from=megatron tiny.sh --gpu " + gpu, dir, dir);
    CHECK(r.status == 2);
    CHECK(r.err.find("planc import: --gpu takes h100, h200, h800, a100, a100_80gb or a100_40gb, "
                     "got '") == 0);
    CHECK(r.out.empty());
  }
  for (const std::string count : {"' 8'", "+8", "08", "0x8", "010", "-8", "0", "1000001", "8.0"}) {
    for (const std::string flag : {"--nodes", "--gpus-per-node"}) {
      CAPTURE(count);
      CAPTURE(flag);
      auto r =
          RunCommand(kPlanc + " check --from=megatron tiny.sh " + flag + " " + count, dir, dir);
      CHECK(r.status == 2);
      CHECK(r.err.find("planc check: " + flag +
                       " takes a count from 1 to 1000000 in decimal digits, got '") == 0);
    }
  }
  auto ok =
      RunCommand(kPlanc + " import --from=megatron tiny.sh --nodes 16 --gpus-per-node 4", dir, dir);
  CHECK(ok.status == 0);
  CHECK(ok.out.find("cluster.nodes = 16") != std::string::npos);
  CHECK(ok.out.find("cluster.gpus_per_node = 4") != std::string::npos);
  // An empty path is said to be one; a file that cannot be written is named once.
  auto empty = RunCommand(kPlanc + " import --from=nemo ''", dir, dir);
  CHECK(empty.status == 2);
  CHECK(empty.err.find("planc import: the configuration file path is empty\n") == 0);
  auto empty_check = RunCommand(kPlanc + " check --from=nemo ''", dir, dir);
  CHECK(empty_check.status == 2);
  CHECK(empty_check.err.find("planc check: the configuration file path is empty\n") == 0);
  auto unwritable =
      RunCommand(kPlanc + " import --from=megatron tiny.sh -o no/such/dir/t.plan", dir, dir);
  CHECK(unwritable.status == 1);
  CHECK(unwritable.err.find("planc import: cannot write 'no/such/dir/t.plan': ") !=
        std::string::npos);
  CHECK(unwritable.err.find("cannot write 'no/such/dir/t.plan': cannot write") ==
        std::string::npos);
  auto export_unwritable = RunCommand(
      kPlanc + " export tiny.plan --to=megatron -o no/such/dir/t.sh --diagnostics=short", dir, dir);
  CHECK(export_unwritable.status == 1);
  CHECK(export_unwritable.err.find("planc export: cannot write 'no/such/dir/t.sh': ") !=
        std::string::npos);
  CHECK(export_unwritable.err.find("cannot write: ") == std::string::npos);
}

TEST_CASE("planc export writes what runs the plan, and refuses what the target cannot express") {
  const ScopedScratch scratch("interop_export");
  const std::string& dir = scratch.dir;
  const std::string llama = kSource + "/examples/llama3_70b.plan";
  // Interleaving (vpp = 2) has no torchtitan schedule name: P0905 at the plan's line, no file.
  auto titan = RunCommand(kPlanc + " export " + llama + " --to=torchtitan -o out.toml", dir, dir);
  CHECK(titan.status == 1);
  CHECK(titan.err.find("error[P0905]: torchtitan cannot express `parallel.vpp = 2`") !=
        std::string::npos);
  CHECK(titan.err.find("parallel  { tp = 8  pp = 4  vpp = 2") != std::string::npos);
  CHECK(!std::filesystem::exists(dir + "/out.toml"));
  // The fix it suggests exports, with the derived settings stated.
  auto fixed = RunCommand(kPlanc + " export " + llama +
                              " --set parallel.vpp=1 --set 'pipeline.schedule=\"1f1b\"' --set "
                              "optimizer.zero=3 --to=torchtitan",
                          dir, dir);
  CHECK(fixed.status == 0);
  CHECK(fixed.out.find("flavor = \"70B\"") != std::string::npos);
  CHECK(fixed.out.find("microbatches per step = global / (micro · dp) = 512 / (1 · 2) = 256") !=
        std::string::npos);
  // DeepSpeed: the Megatron-DeepSpeed launch script and its ds_config.json, which import reads
  // back.
  auto ds = RunCommand(
      kPlanc + " export " + llama +
          " --set parallel.vpp=1 --set 'pipeline.schedule=\"1f1b\"' --to=deepspeed -o run.sh",
      dir, dir);
  CHECK(ReadFile(dir + "/run.sh")
            .find("deepspeed --num_nodes $NNODES --num_gpus $GPUS_PER_NODE pretrain_gpt.py") !=
        std::string::npos);
  CHECK(ds.status == 0);
  CHECK(ReadFile(dir + "/ds_config.json").find("\"gradient_accumulation_steps\": 256") !=
        std::string::npos);
  auto back = RunCommand(kPlanc + " check --from=deepspeed run.sh --gpu h100 --diagnostics=short",
                         dir, dir);
  CHECK(back.status == 0);
  auto no_out = RunCommand(kPlanc + " export " + llama + " --to=deepspeed", dir, dir);
  CHECK(no_out.status == 2);
  // Megatron-LM to NeMo, straight from the script.
  Write(dir + "/train.sh", kScript);
  auto nemo = RunCommand(kPlanc + " export --from=megatron train.sh --set parallel.etp=1 --to=nemo",
                         dir, dir);
  CHECK(nemo.status == 1);  // DeepSeek-V2's shared experts and MLA have no NeMo GPT keys
  CHECK(nemo.err.find("error[P0905]: NeMo cannot express `model = deepseek_v2`") !=
        std::string::npos);
}

// Megatron-Bridge's performance recipes keep the gradients in bf16 (grad_reduce_in_fp32: false);
// imported as fp32 gradients, Qwen3-30B-A3B's H100 run would be called out of memory.
TEST_CASE(
    "a Megatron-Bridge MoE run with bf16 gradients fits; the same with fp32 gradients does not") {
  const ScopedScratch scratch("interop_bridge_grads");
  const std::string& dir = scratch.dir;
  const std::string yaml =
      ReadFile(kSource + "/tests/interop/corpus/nemo/qwen3_30b_a3b_bridge_h100.yaml");
  REQUIRE(yaml.find("grad_reduce_in_fp32: false") != std::string::npos);
  Write(dir + "/bf16.yaml", yaml);
  std::string fp32 = yaml;
  for (size_t at = fp32.find("grad_reduce_in_fp32: false"); at != std::string::npos;
       at = fp32.find("grad_reduce_in_fp32: false", at)) {
    fp32.replace(at, std::string("grad_reduce_in_fp32: false").size(), "grad_reduce_in_fp32: true");
  }
  Write(dir + "/fp32.yaml", fp32);
  for (const char* name : {"bf16", "fp32"}) {
    CAPTURE(name);
    const std::string file = std::string(name) + ".yaml";
    auto imp = RunCommand(
        kPlanc + " import --from=nemo " + file + " --nodes 2 --gpu h100 -o " + name + ".plan", dir,
        dir);
    REQUIRE(imp.status == 0);
    const std::string plan = ReadFile(dir + "/" + name + ".plan");
    CHECK(plan.find("cluster = dgx_h100") != std::string::npos);
    CHECK(plan.find(std::string("grads = ") + name) != std::string::npos);
    auto chk = RunCommand(kPlanc + " check " + name + ".plan --diagnostics=short", dir, dir);
    if (std::string(name) == "bf16") {
      CHECK(chk.status == 0);
      CHECK(chk.err.find("P0701") == std::string::npos);
    } else {
      CHECK(chk.status == 1);
      CHECK(chk.err.find("error[P0701]") != std::string::npos);
    }
  }
}

// Narayanan et al. (SC21) Table 2 trained the 529.6B GPT with DeepSpeed ZeRO-3 at micro batch 4
// on 640 A100-80GB: its launch script and ds_config.json import and check as fitting.
TEST_CASE("a Megatron-DeepSpeed ZeRO-3 run that trained fits; its live-parameter cap is read") {
  const ScopedScratch scratch("interop_deepspeed_zero3");
  const std::string& dir = scratch.dir;
  Write(
      dir + "/run.sh",
      "#!/bin/bash\n"
      "deepspeed --num_nodes 80 --num_gpus 8 pretrain_gpt.py \\\n"
      "    --num-layers 105 --hidden-size 20480 --num-attention-heads 128 \\\n"
      "    --seq-length 2048 --vocab-size 51200 --micro-batch-size 4 --global-batch-size 2560 \\\n"
      "    --fp16 --checkpoint-activations --deepspeed --deepspeed_config ds_config.json\n");
  auto config = [&](const std::string& live) {
    Write(dir + "/ds_config.json",
          "{\n  \"zero_optimization\": {\n    \"stage\": 3,\n"
          "    \"stage3_max_live_parameters\": " +
              live +
              ",\n    \"stage3_prefetch_bucket_size\": 5e7\n  },\n"
              "  \"fp16\": { \"enabled\": true }\n}\n");
  };
  config("1e9");
  auto imp =
      RunCommand(kPlanc + " import --from=deepspeed run.sh --gpu a100_80gb -o z3.plan", dir, dir);
  REQUIRE(imp.status == 0);
  const std::string plan = ReadFile(dir + "/z3.plan");
  CHECK(plan.find("recompute = full") != std::string::npos);  // --checkpoint-activations
  CHECK(plan.find("max_live_params = 1000000000") != std::string::npos);
  CHECK(plan.find("(not recognised by planc)") == std::string::npos);
  auto fits = RunCommand(kPlanc + " check z3.plan --diagnostics=short", dir, dir);
  CHECK(fits.status == 0);
  CHECK(fits.err.find("P0701") == std::string::npos);
  // Export writes the cap back into ds_config.json.
  std::filesystem::create_directories(dir + "/back");
  auto out = RunCommand(kPlanc + " export z3.plan --to=deepspeed -o back/run.sh", dir, dir);
  CHECK(out.status == 0);
  CHECK(ReadFile(dir + "/back/ds_config.json").find("\"stage3_max_live_parameters\": 1000000000") !=
        std::string::npos);
  // A cap of 3e10 keeps whole layers gathered: no longer fits.
  config("3e10");
  auto big = RunCommand(
      kPlanc + " check --from=deepspeed run.sh --gpu a100_80gb --diagnostics=short", dir, dir);
  CHECK(big.status == 1);
  CHECK(big.err.find("error[P0701]") != std::string::npos);
  // Not a count: an error at its line.
  config("\"many\"");
  auto bad = RunCommand(kPlanc + " import --from=deepspeed run.sh --gpu a100_80gb", dir, dir);
  CHECK(bad.status == 1);
  CHECK(bad.err.find("`zero_optimization.stage3_max_live_parameters` expects a whole number of "
                     "parameters, got many") != std::string::npos);
}

// corpus/README.md, row by row.
TEST_CASE("the corpus of real configurations imports and checks as its README says") {
  struct Row {
    const char* args;  // after `planc check --from=`
    int status;
    std::vector<std::string> codes;
  };
  const Row rows[] = {
      {"megatron megatron/llama3_8b_h100_fp8.sh", 1, {"P0310", "P0701", "P0903"}},
      {"megatron megatron/mixtral_8x7b_distributed.sh", 1, {"P0904"}},
      {"torchtitan torchtitan/llama3_70b.toml --nodes 8 --gpu a100", 0, {"P0903"}},
      {"deepspeed deepspeed/pretrain_gpt2_bpe.sh", 0, {"P0502", "P0903"}},
      {"nemo nemo/llama3_70b.yaml", 0, {"P0502", "P0903"}},
      {"nemo nemo/qwen3_30b_a3b_bridge_h100.yaml --nodes 2 --gpu h100", 0, {"P0702", "P0903"}},
      {"nemo nemo/deepseek_v3_bridge_h100.yaml --nodes 128 --gpu h100", 0, {"P0605", "P0903"}},
      {"megatron megatron/deepseek_v3_h100_layout.sh", 0, {"P0605", "P0903"}},
  };
  const ScopedScratch scratch("interop_corpus");
  const std::string& dir = scratch.dir;
  const std::string corpus = kSource + "/tests/interop/corpus";
  for (const Row& row : rows) {
    CAPTURE(row.args);
    auto r = RunCommand(kPlanc + " check --from=" + row.args + " --diagnostics=short", dir, corpus);
    CHECK(r.status == row.status);
    std::set<std::string> codes;
    for (size_t at = r.err.find("["); at != std::string::npos; at = r.err.find("[", at + 1)) {
      if (r.err.compare(at + 1, 1, "P") == 0 && r.err.size() > at + 6 && r.err[at + 6] == ']') {
        codes.insert(r.err.substr(at + 1, 5));
      }
    }
    CHECK(codes == std::set<std::string>(row.codes.begin(), row.codes.end()));
    // Every diagnostic is in the user's file, none in the generated plan text.
    CHECK(r.err.find("(as a plan)") == std::string::npos);
    // The written plan of an importable file checks with the same result.
    if (row.codes != std::vector<std::string>{"P0904"}) {
      std::string import_args = row.args;
      auto imp = RunCommand(
          kPlanc + " import --from=" + import_args + " -o " + dir + "/imported.plan", dir, corpus);
      CHECK(imp.status == 0);
      auto plan =
          RunCommand(kPlanc + " check " + dir + "/imported.plan --diagnostics=short", dir, corpus);
      CHECK(plan.status == row.status);
    }
  }
}

}  // namespace
}  // namespace paraplan
