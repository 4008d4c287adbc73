// The out-of-memory examples as a user meets them: `planc check` reports P0701, and `planc
// explain` still shows where the memory goes (every stage, text and JSON) while exiting 1.
#include <doctest/doctest.h>
#include <llvm/Support/JSON.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "tests/support/cli.h"

namespace {

using Result = paraplan::testing::CommandResult;

std::string Dir() {
  static const std::string kDir = paraplan::testing::ScratchDir("memory");
  return kDir;
}

Result Planc(const std::string& args) {
  return paraplan::testing::RunCommand(std::string(PARAPLAN_PLANC) + " " + args, Dir(),
                                       PARAPLAN_ROOT);
}

size_t Count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

constexpr const char* kTp1 = "examples/deepseek_v2_16node_oom_tp1.plan";

}  // namespace

TEST_CASE(
    "check: the DeepSeek-V2 16-node plans that pass every structural rule run out of memory") {
  Result r = Planc(std::string("check ") + kTp1);
  CHECK(r.status == 1);
  CHECK(r.err.find(
            "error[P0701]: pipeline stage 0 needs 136.41 GiB per GPU; `h100_sxm` has 80.00 GiB") !=
        std::string::npos);
  CHECK(r.err.find("help: `recompute = full` brings the largest stage (3) to 58.34 GiB") !=
        std::string::npos);
  r = Planc("check examples/deepseek_v2_16node_oom_tp2_sp.plan");
  CHECK(r.status == 1);
  CHECK(r.err.find("error[P0701]: pipeline stage 0 needs 84.67 GiB") != std::string::npos);
  // The configuration that trains: no error. Under planrun its arena (the experts' receive
  // buffers sized by the stated imbalance, the norms' outputs kept on the rank's rows) fits
  // without a warning; stating twice the average routed tokens it would not.
  r = Planc("check examples/deepseek_v2_32node.plan");
  CHECK(r.status == 0);
  CHECK(r.err.find("P0701") == std::string::npos);
  CHECK(r.err.find("P0702") == std::string::npos);
  r = Planc("check examples/deepseek_v2_32node.plan --set moe.imbalance=2");
  CHECK(r.status == 1);
  CHECK(r.err.find("error[P0701]: pipeline stage 0 needs 85.66 GiB per GPU") != std::string::npos);
  r = Planc("check examples/deepseek_v2_32node.plan --set framework=megatron_core");
  CHECK(r.status == 0);
  CHECK(r.err.find("P0701") == std::string::npos);
  CHECK(r.err.find("P0702") == std::string::npos);
}

TEST_CASE("explain: an out-of-memory plan is still explained, every stage's memory shown, exit 1") {
  Result r = Planc(std::string("explain ") + kTp1);
  CHECK(r.status == 1);
  CHECK(r.err.find("error[P0701]") != std::string::npos);
  CHECK(r.out.find("memory per GPU (capacity 80.00 GiB, 48 microbatches per step)") !=
        std::string::npos);
  CHECK(r.out.find("136.41     114.34      93.34      77.33") != std::string::npos);
  CHECK(Count(r.out, "OUT OF MEMORY") == 3);  // stages 0-2; stage 3 fits
  CHECK(r.out.find("MFU") != std::string::npos);
}

TEST_CASE("explain --format=json: the memory section per stage, in bytes, over the capacity") {
  Result r = Planc(std::string("explain ") + kTp1 + " --format=json");
  CHECK(r.status == 1);
  auto json = llvm::json::parse(r.out);
  REQUIRE_MESSAGE(static_cast<bool>(json), r.out);
  const llvm::json::Object* memory = json->getAsObject()->getObject("memory");
  REQUIRE(memory);
  const llvm::json::Array* stages = memory->getArray("stages");
  REQUIRE(stages);
  REQUIRE(stages->size() == 4);
  const int64_t capacity = int64_t{80} << 30;
  int over = 0;
  for (const llvm::json::Value& v : *stages) {
    const llvm::json::Object* s = v.getAsObject();
    REQUIRE(s);
    auto total = s->getInteger("total_bytes");
    REQUIRE(total.hasValue());
    if (*total > capacity) ++over;
  }
  CHECK(over == 3);
}

TEST_CASE("explain: a plan with a structural error is not explained") {
  Result r = Planc("explain examples/deepseek_v2_16node.plan");
  CHECK(r.status == 1);
  CHECK(r.err.find("error[P0303]") != std::string::npos);
  CHECK(r.out.empty());
}

TEST_CASE(
    "compile: a program whose static arena does not fit the GPU is refused with its breakdown") {
  // Checked for Megatron-Core (the experts' all-to-all buffers sized as Megatron-LM sizes them:
  // fits), the DeepSeek-V2 example stating twice the average routed tokens per rank has a
  // planrun arena of 84.45 GiB (the experts' receive buffers sized by that imbalance); with the
  // CUDA context and NCCL it needs 85.70 GiB of the H100's 80.
  const std::string plan = "examples/deepseek_v2_32node.plan --set moe.imbalance=2";
  Result r = Planc("check " + plan + " --set framework=megatron_core");
  CHECK(r.status == 0);
  r = Planc("compile " + plan + " --set framework=megatron_core -o " + Dir() + "/dsv2.pp");
  CHECK(r.status == 1);
  CHECK(r.err.find(
            "error[P0701]: the program of pipeline stage 0 needs 85.70 GiB per GPU; `h100_sxm` has "
            "80.00 GiB") != std::string::npos);
  CHECK(r.err.find("stashed activations = 55.83 GiB") != std::string::npos);
  CHECK(r.err.find("CUDA context and NCCL = 1.25 GiB") != std::string::npos);
  CHECK(!std::filesystem::exists(Dir() + "/dsv2.pp"));
  // Checked as planrun runs it, the same plan is refused by check already, within 0.04 GiB.
  r = Planc("check " + plan);
  CHECK(r.status == 1);
  CHECK(r.err.find("error[P0701]: pipeline stage 0 needs 85.66 GiB per GPU") != std::string::npos);
  // At the stated 1.25 the arena fits, and compile writes the program.
  r = Planc("compile examples/deepseek_v2_32node.plan -o " + Dir() + "/dsv2_fits.pp");
  CHECK(r.status == 0);
  CHECK(std::filesystem::exists(Dir() + "/dsv2_fits.pp"));
}

TEST_CASE("compile: Megatron-Bridge's FP8 runs in planrun's arena, laid out in bf16") {
  // Llama 3 70B on 64 H100 (TP 4, PP 8, VPP 5, FP8): Megatron-Core's memory fits, and so does
  // planrun's arena with bf16 activations, each rank's chunks sharing one pool of stash slots and
  // each chunk's output and gradient one buffer.
  const std::string llama70 = "tests/memory/calibration/ran.plan --plan mbridge_llama3_70b_64gpu";
  Result r = Planc("check " + llama70);
  CHECK(r.status == 0);
  r = Planc("compile " + llama70 + " -o " + Dir() + "/llama70b.pp");
  CHECK(r.status == 0);
  CHECK(r.err.find("largest arena 78.09 GiB") != std::string::npos);
  // ... in bf16: planrun's backends hold every element in f32, which this H100 cannot (P0805,
  // a warning; the program is written).
  CHECK(r.err.find("P0805") != std::string::npos);
  CHECK(r.err.find("warning[P0805]: planrun's backends hold pipeline stage 0's program in 135.28 "
                   "GiB per GPU") != std::string::npos);
  CHECK(r.err.find("(133.97 GiB in f32, as planrun's backends hold it)") != std::string::npos);
  // Its FP8 recipe and FP8 parameters lower as bf16, which the compile says.
  CHECK(r.err.find("note[P0806]: this FP8 plan's program holds its activations and weights in "
                   "bf16") != std::string::npos);
  CHECK(r.err.find("its FP8 parameters (`mixed_precision.fp8_params`) are held in bf16 too") !=
        std::string::npos);
  // Llama 3.1 405B on 1,024 H100 (TP 8, PP 8, VPP 8, CP 2, FP8): 80.08 GiB with the CUDA context
  // and NCCL, refused, and the refusal says that planrun stashes the activations in bf16.
  const std::string llama405 =
      "tests/memory/calibration/ran.plan --plan mbridge_llama31_405b_1024gpu";
  r = Planc("check " + llama405);
  CHECK(r.status == 0);
  r = Planc("compile " + llama405 + " -o " + Dir() + "/llama405b.pp");
  CHECK(r.status == 1);
  CHECK(r.err.find("error[P0701]: the program of pipeline stage 0 needs 80.08 GiB per GPU") !=
        std::string::npos);
  CHECK(r.err.find("the program lays FP8 plans out in bf16") != std::string::npos);
}
