// planrun's CUDA path on the CPU: the equivalence plans (tests/equivalence/equivalence.plan)
// compiled by planc and trained by planrun --backend=cuda linked against the emulation
// (planrun_cuda_emulated: runtime/planrun.cpp, unchanged), one rank and local mode with several
// ranks on the one emulated device, against planrun --backend=host on the same program.
//
// Tolerance: every step's loss within 2e-3 relative of the host's. The CUDA backend rounds GEMM
// and attention operands to bf16 (8 significant bits) and accumulates in fp32; over the first AdamW
// steps of the tiny models the losses (about 5.5) move apart by about 1e-4 relative.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "tests/support/cli.h"

namespace paraplan {
namespace {

constexpr double kLossTolerance = 2e-3;

std::string SourceDir() {
  const char* dir = std::getenv("PARAPLAN_SOURCE_DIR");
  return dir ? dir : ".";
}

std::vector<double> Losses(const std::string& metrics) {
  std::vector<double> losses;
  const std::string text = testing::ReadFile(metrics);
  for (size_t at = text.find("\"loss\": "); at != std::string::npos;
       at = text.find("\"loss\": ", at + 1)) {
    losses.push_back(std::stod(text.substr(at + 8)));
  }
  return losses;
}

void CheckPlan(const std::string& plan, int expected_ranks) {
  const std::string dir = testing::ScratchDir("planrun_emulated_" + plan);
  const std::string program = dir + "/" + plan + ".pplan";
  auto compiled = testing::RunCommand(std::string(PARAPLAN_PLANC) + " compile '" + SourceDir() +
                                          "/tests/equivalence/equivalence.plan' --plan " + plan +
                                          " -o " + program,
                                      dir);
  REQUIRE_MESSAGE(compiled.status == 0, compiled.err);
  const std::string data =
      " --data '" + SourceDir() + "/data/corpus/classics.txt' --steps 3 --timeout 120";
  auto host = testing::RunCommand(std::string(PARAPLAN_PLANRUN) + " " + program +
                                      " --backend=host --metrics " + dir + "/host.jsonl" + data,
                                  dir);
  REQUIRE_MESSAGE(host.status == 0, host.err);
  auto cuda = testing::RunCommand(std::string(PARAPLAN_PLANRUN_EMULATED) + " " + program +
                                      " --backend=cuda --metrics " + dir + "/cuda.jsonl" + data,
                                  dir);
  INFO(cuda.out);
  REQUIRE_MESSAGE(cuda.status == 0, cuda.err);
  CHECK(cuda.out.find(std::to_string(expected_ranks) + " ranks as threads on the cuda backend") !=
        std::string::npos);
  const auto want = Losses(dir + "/host.jsonl"), got = Losses(dir + "/cuda.jsonl");
  REQUIRE(want.size() == 3);
  REQUIRE(got.size() == want.size());
  double worst = 0;
  for (size_t s = 0; s < want.size(); ++s)
    worst = std::max(worst, std::abs(got[s] - want[s]) / std::abs(want[s]));
  MESSAGE(plan << ": largest relative loss difference from the host backend " << worst
               << " (losses " << want.front() << " -> " << want.back() << ")");
  CHECK(worst <= kLossTolerance);
  CHECK(got.back() < got.front());
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

// One CTest test per plan (tests/cuda_emulation/CMakeLists.txt selects them by name).
TEST_CASE("plan single: one rank, Llama-style") { CheckPlan("single", 1); }

TEST_CASE("plan gpt_single: one rank, GPT-2-style") { CheckPlan("gpt_single", 1); }

TEST_CASE("plan tp2_pp2_dp2_zero1_sp: local mode, 8 ranks, sequence parallel, ZeRO-1") {
  CheckPlan("tp2_pp2_dp2_zero1_sp", 8);
}

TEST_CASE("plan pp2_vpp2_dp2_zero3: local mode, 4 ranks, interleaved pipeline, ZeRO-3") {
  CheckPlan("pp2_vpp2_dp2_zero3", 4);
}

TEST_CASE("plan gpt_tp2_pp2_dp2: local mode, 8 ranks, GPT-2-style") {
  CheckPlan("gpt_tp2_pp2_dp2", 8);
}

TEST_CASE("plan cp2_tp2_dp2_sp: local mode, 8 ranks, ring attention over cp 2") {
  CheckPlan("cp2_tp2_dp2_sp", 8);
}

TEST_CASE("plan cp2_tp2_dp2_zero1_sp: local mode, 8 ranks, ZeRO-1 over dp · cp") {
  CheckPlan("cp2_tp2_dp2_zero1_sp", 8);
}

TEST_CASE("plan gpt_cp2_tp2_sp: local mode, 4 ranks, learned positions over cp 2") {
  CheckPlan("gpt_cp2_tp2_sp", 4);
}

TEST_CASE("plan moe_ep2_tp2_dp2_sp: local mode, 4 ranks, experts dispatched over ep 2") {
  CheckPlan("moe_ep2_tp2_dp2_sp", 4);
}

TEST_CASE("plan moe_ep2_pp2_dp2: local mode, 4 ranks, experts dispatched over ep 2, pp 2") {
  CheckPlan("moe_ep2_pp2_dp2", 4);
}

TEST_CASE("plan moe_capacity_etp2_tp2_sp: local mode, 2 ranks, a capacity per rank's rows") {
  CheckPlan("moe_capacity_etp2_tp2_sp", 2);
}

TEST_CASE("plan moe_grouped_etp2_tp2_sp: local mode, 4 ranks, group-limited routing, scaled") {
  CheckPlan("moe_grouped_etp2_tp2_sp", 4);
}

TEST_CASE("plan mla_tp2_sp: local mode, 2 ranks, multi-head latent attention, sequence parallel") {
  CheckPlan("mla_tp2_sp", 2);
}

TEST_CASE("plan mla_cp2_tp2_sp: local mode, 4 ranks, multi-head latent attention over cp 2") {
  CheckPlan("mla_cp2_tp2_sp", 4);
}

TEST_CASE("plan qk_sq_tp2_pp2_sp: local mode, 4 ranks, QK-norm, squared ReLU, block recompute") {
  CheckPlan("qk_sq_tp2_pp2_sp", 4);
}
TEST_CASE("plan window_cp2_tp2_sp: local mode, 4 ranks, sliding-window attention over cp 2") {
  CheckPlan("window_cp2_tp2_sp", 4);
}
TEST_CASE("plan hsdp_dp4_r2_zero3: local mode, 4 ranks, ZeRO 3 over each replica's pair") {
  CheckPlan("hsdp_dp4_r2_zero3", 4);
}
TEST_CASE("plan mtp_tp2_pp2_sp: local mode, 4 ranks, two multi-token prediction modules") {
  CheckPlan("mtp_tp2_pp2_sp", 4);
}

// The emulated device holds 34.5 MB: the GEMM workspace (32 MiB) fits, the program's f32 arena
// beside it does not. planrun stops at start with exit 1, naming the rank, the arena in f32 and
// in the program's precision, and the device's error (never a crash or a hang).
TEST_CASE("a device too small for the arena stops the run at start, saying why") {
  const std::string dir = testing::ScratchDir("planrun_emulated_small_device");
  const std::string program = dir + "/single.pplan";
  auto compiled =
      testing::RunCommand(std::string(PARAPLAN_PLANC) + " compile '" + SourceDir() +
                              "/tests/equivalence/equivalence.plan' --plan single -o " + program,
                          dir);
  REQUIRE_MESSAGE(compiled.status == 0, compiled.err);
  auto run = testing::RunCommand("env PARAPLAN_EMULATED_DEVICE_BYTES=34500000 " +
                                     std::string(PARAPLAN_PLANRUN_EMULATED) + " " + program +
                                     " --backend=cuda --steps 1 --timeout 60",
                                 dir);
  CHECK(run.status == 1);
  INFO(run.out << run.err);
  CHECK(run.err.find("rank 0: stage0 cannot allocate its arena of 4.3 MiB") != std::string::npos);
  CHECK(run.err.find("planrun keeps every element in f32") != std::string::npos);
  CHECK(run.err.find("cudaErrorMemoryAllocation") != std::string::npos);
}

}  // namespace
}  // namespace paraplan
