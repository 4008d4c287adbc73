// planc search as a user runs it: a plan with swept fields in, a ranked table or JSON out.
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
  static const std::string kDir = paraplan::testing::ScratchDir("search");
  return kDir;
}

Result Planc(const std::string& args) {
  return paraplan::testing::RunCommand(std::string(PARAPLAN_PLANC) + " " + args, Dir());
}

// A small Llama-style model on one node of 8 GPUs; 4 · 4 · 2 · 2 · 2 · 2 = 256 candidates.
constexpr const char* kPlan = R"(
gpu g { memory = 80 GiB  peak_bf16 = 989 TFLOPS  peak_fp16 = 989 TFLOPS  peak_fp8 = 1979 TFLOPS  hbm_bandwidth = 3.35 TB/s }
cluster node { gpu = g  nodes = 1  gpus_per_node = 8  nvlink_bandwidth = 450 GB/s  network_bandwidth = 50 GB/s }
model small {
  layers = 16  hidden = 2048  ffn_hidden = 5632  heads = 16  kv_heads = 8  head_dim = 128
  vocab = 32000  seq_len = 4096  norm = rmsnorm  activation = swiglu  position = rope
}
plan small_search {
  model = small
  cluster = node
  parallel {
    tp = [1, 2, 4, 8]
    pp = [1, 2, 4, 8]
    sp = [false, true]
    dp = auto
  }
  optimizer { zero = [0, 1] }
  batch { global = 64  micro = [1, 2] }
  precision = bf16
  recompute = [selective, full]
}
)";

// Every axis with many values: 12^5 (tp, pp, vpp, cp, micro) · 2 · 4 · 3 = 5,971,968 candidates.
constexpr const char* kHugePlan = R"(
gpu g { memory = 80 GiB  peak_bf16 = 989 TFLOPS  peak_fp16 = 989 TFLOPS  peak_fp8 = 1979 TFLOPS  hbm_bandwidth = 3.35 TB/s }
cluster node { gpu = g  nodes = 64  gpus_per_node = 8  nvlink_bandwidth = 450 GB/s  network_bandwidth = 50 GB/s }
model small {
  layers = 64  hidden = 2048  ffn_hidden = 5632  heads = 64  kv_heads = 8  head_dim = 32
  vocab = 32000  seq_len = 4096  norm = rmsnorm  activation = swiglu  position = rope
}
plan huge_search {
  model = small
  cluster = node
  parallel {
    tp = [1, 2, 3, 4, 5, 6, 7, 8, 16, 32, 64, 128]
    pp = [1, 2, 3, 4, 5, 6, 7, 8, 16, 32, 64, 128]
    vpp = [1, 2, 3, 4, 5, 6, 7, 8, 16, 32, 64, 128]
    cp = [1, 2, 3, 4, 5, 6, 7, 8, 16, 32, 64, 128]
    sp = [false, true]
    dp = auto
  }
  optimizer { zero = [0, 1, 2, 3] }
  batch { global = 4096  micro = [1, 2, 3, 4, 5, 6, 7, 8, 16, 32, 64, 128] }
  precision = bf16
  recompute = [none, selective, full]
}
)";

std::string Write(const std::string& name, const char* text) {
  std::string path = Dir() + "/" + name;
  std::ofstream(path) << text;
  return path;
}

int64_t Int(const llvm::json::Object* o, llvm::StringRef key) {
  auto v = o ? o->getInteger(key) : llvm::None;
  return v ? *v : -1;
}

double Num(const llvm::json::Object* o, llvm::StringRef key) {
  auto v = o ? o->getNumber(key) : llvm::None;
  return v ? *v : -1;
}

std::string Setting(const llvm::json::Object* settings, llvm::StringRef key) {
  auto v = settings->getString(key);
  return v ? v->str() : std::string();
}

int CountRows(const std::string& text) {
  // Ranked rows start with the rank right-aligned in 4 columns: "   1 ", "  10 ".
  int rows = 0;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.size() > 5 && line[4] == ' ' && std::isdigit(static_cast<unsigned char>(line[3])))
      ++rows;
  }
  return rows;
}

}  // namespace

TEST_CASE(
    "text: a header with the counts, then candidates fastest first with memory, step time and "
    "MFU") {
  Result r = Planc("search " + Write("small.plan", kPlan));
  REQUIRE_MESSAGE(r.status == 0, r.err);
  CHECK(r.out.find("search small_search: 256 candidates; 60 duplicates (sp = true or "
                   "tp_comm_overlap = true at tp = 1, zero > 0 over one data-parallel rank)") !=
        std::string::npos);
  CHECK(r.out.find("peak memory") != std::string::npos);
  CHECK(r.out.find("step (s)") != std::string::npos);
  CHECK(r.out.find("tokens/s/GPU") != std::string::npos);
  CHECK(r.out.find("MFU") != std::string::npos);
  CHECK(r.out.find("vs best") != std::string::npos);
  CHECK(CountRows(r.out) == 10);  // --top defaults to 10
  CHECK(r.out.find("GiB") != std::string::npos);
  // The profile that priced the candidates, and the error it has shown on published runs (or
  // that it has none).
  CHECK(r.out.find("priced as framework ") != std::string::npos);
  CHECK((r.out.find("median error") != std::string::npos ||
         r.out.find("unchecked") != std::string::npos));
}

TEST_CASE("--top K limits the table to K candidates") {
  const std::string plan = Write("small.plan", kPlan);
  Result r = Planc("search " + plan + " --top 3");
  REQUIRE_MESSAGE(r.status == 0, r.err);
  CHECK(CountRows(r.out) == 3);
  r = Planc("search " + plan + " --top=1");
  REQUIRE_MESSAGE(r.status == 0, r.err);
  CHECK(CountRows(r.out) == 1);
  r = Planc("search " + plan + " --top 0");
  CHECK(r.status == 2);
  CHECK(r.err.find("--top takes a number from 1 to 100000, got '0'") != std::string::npos);
  r = Planc("search " + plan + " --top");
  CHECK(r.status == 2);
}

TEST_CASE("a sweep that repeats a value searches it once and says so") {
  const std::string plan = Write("small.plan", kPlan);
  Result r = Planc("search " + plan + " --set 'parallel.tp=[2,2,4,2]' --top 100");
  REQUIRE_MESSAGE(r.status == 0, r.err);
  CHECK(r.out.find("`parallel.tp` lists the same value more than once (2 repeats)") !=
        std::string::npos);
  Result once = Planc("search " + plan + " --set 'parallel.tp=[2,4]' --top 100");
  REQUIRE_MESSAGE(once.status == 0, once.err);
  CHECK(CountRows(r.out) == CountRows(once.out));
}

TEST_CASE("--format=json: every candidate's settings, peak memory, step time and MFU, ranked") {
  Result r = Planc("search " + Write("small.plan", kPlan) + " --format=json --top 40");
  REQUIRE_MESSAGE(r.status == 0, r.err);
  auto json = llvm::json::parse(r.out);
  REQUIRE_MESSAGE(static_cast<bool>(json), r.out);
  const llvm::json::Object* root = json->getAsObject();
  REQUIRE(root);
  CHECK(Int(root, "version") == 1);
  CHECK(root->getString("plan") == llvm::StringRef("small_search"));
  const llvm::json::Object* framework = root->getObject("framework");
  REQUIRE(framework);
  CHECK(static_cast<bool>(framework->getString("stack")));
  CHECK(static_cast<bool>(framework->getInteger("checked_runs")));
  const int64_t enumerated = Int(root, "enumerated");
  const int64_t duplicates = Int(root, "duplicates");
  const int64_t fitting = Int(root, "fitting");
  // How many of the listed plans lie within the profile's median error of the best (0 when the
  // profile has no published runs), never more than are listed.
  CHECK(Int(root, "within_median_error_of_best") >= 0);
  CHECK(Int(root, "within_median_error_of_best") <= 40);
  const llvm::json::Object* rejected = root->getObject("rejected");
  REQUIRE(rejected);
  CHECK(enumerated == 256);
  CHECK(duplicates == 32 + 28);  // sp = true at tp = 1; zero = 1 where tp · pp = 8 (dp = 1)
  CHECK(enumerated == duplicates + Int(rejected, "rules") + Int(rejected, "partition") +
                          Int(rejected, "memory") + fitting);
  const llvm::json::Array* axes = root->getObject("axes")->getArray("parallel.tp");
  REQUIRE(axes);
  CHECK(axes->size() == 4);
  const llvm::json::Array* candidates = root->getArray("candidates");
  REQUIRE(candidates);
  CHECK(static_cast<int64_t>(candidates->size()) == std::min<int64_t>(40, fitting));
  double previous = 0;
  int64_t rank = 0;
  for (const llvm::json::Value& v : *candidates) {
    const llvm::json::Object* c = v.getAsObject();
    REQUIRE(c);
    CHECK(Int(c, "rank") == ++rank);
    const llvm::json::Object* s = c->getObject("settings");
    REQUIRE(s);
    for (const char* key : {"parallel.tp", "parallel.pp", "parallel.sp", "optimizer.zero",
                            "batch.micro", "recompute", "parallel.dp"})
      CHECK_MESSAGE(!Setting(s, key).empty(), key);
    const int tp = std::atoi(Setting(s, "parallel.tp").c_str());
    const int pp = std::atoi(Setting(s, "parallel.pp").c_str());
    CHECK(tp * pp * std::atoi(Setting(s, "parallel.dp").c_str()) == 8);
    CHECK_FALSE((tp == 1 && Setting(s, "parallel.sp") == "true"));  // canonical: sp off at tp 1
    if (tp * pp == 8) CHECK(Setting(s, "optimizer.zero") == "0");   // canonical: no ZeRO at dp 1
    const int64_t peak = Int(c, "peak_memory_bytes");
    CHECK(peak > 0);
    CHECK(peak <= int64_t{80} << 30);
    const double step = Num(c, "step_seconds");
    CHECK(step > 0);
    CHECK(step >= previous);  // fastest first
    previous = step;
    // How far behind the first candidate, as the text table's "vs best" column says.
    const double first = Num(candidates->front().getAsObject(), "step_seconds");
    CHECK(Num(c, "step_over_best") == doctest::Approx(step / first - 1));
    const double mfu = Num(c, "mfu");
    CHECK(mfu > 0);
    CHECK(mfu < 1);
    CHECK(Num(c, "tokens_per_s_per_gpu") > 0);
  }
}

TEST_CASE("P0703: no candidate fits the GPU's memory") {
  const std::string plan = Write("small.plan", kPlan);
  Result r = Planc("search " + plan + " --set 'cluster.gpu.memory=1 GiB'");
  CHECK(r.status == 1);
  CHECK(r.err.find("error[P0703]: none of the 256 candidates fits") != std::string::npos);
  CHECK(r.err.find("over 1.00 GiB of memory") != std::string::npos);
  CHECK(r.err.find("the valid candidates need at least") != std::string::npos);
  CHECK(r.out.empty());
  // JSON still prints the (empty) result on stdout, the diagnostic on stderr.
  r = Planc("search " + plan + " --set 'cluster.gpu.memory=1 GiB' --format=json");
  CHECK(r.status == 1);
  CHECK(r.err.find("P0703") != std::string::npos);
  auto json = llvm::json::parse(r.out);
  REQUIRE_MESSAGE(static_cast<bool>(json), r.out);
  CHECK(json->getAsObject()->getArray("candidates")->empty());
  CHECK(Int(json->getAsObject(), "fitting") == 0);
}

TEST_CASE("P0704: a search space over the limit is refused before enumerating") {
  Result r = Planc("search " + Write("huge.plan", kHugePlan));
  CHECK(r.status == 1);
  CHECK(r.err.find("P0704") != std::string::npos);
  CHECK(r.err.find("error[P0704]: the search space has 5,971,968 candidates, more than the "
                   "4,000,000 that planc "
                   "search enumerates") != std::string::npos);
  CHECK(r.err.find("`parallel.vpp` ranges over 12 values") != std::string::npos);
  CHECK(r.err.find("candidates = recompute 3 · tp 12 · pp 12 · vpp 12 · cp 12") !=
        std::string::npos);
  CHECK(r.err.find("help: fix some fields to one value") != std::string::npos);
  CHECK(r.out.empty());
}

TEST_CASE(
    "P0703 names the whole-plan check that refused every candidate (a world too large to lay "
    "out)") {
  const std::string plan = Write("small.plan", kPlan);
  Result r = Planc(
      "search " + plan +
      " --set cluster.nodes=100000 --set parallel.tp=8 --set parallel.pp=1 "
      "--set parallel.sp=true --set optimizer.zero=1 --set batch.micro=1 --set recompute=full "
      "--set batch.global=800000");
  CHECK(r.status == 1);
  CHECK(r.err.find("none of the 1 candidates fits") != std::string::npos);
  CHECK(r.err.find("1 by the checks of the whole plan") != std::string::npos);
  CHECK(r.err.find("the layout of more than 262144") != std::string::npos);
  CHECK(r.err.find("widen the search") == std::string::npos);
}
