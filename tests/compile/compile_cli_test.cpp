// planc compile / planc dump as a user runs them.
#include <doctest/doctest.h>
#include <llvm/Support/JSON.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "compiler/lower/program.h"
#include "tests/support/cli.h"

namespace fs = std::filesystem;

namespace {

using paraplan::testing::ReadFile;
using Result = paraplan::testing::CommandResult;

std::string Dir() {
  static const std::string kDir = paraplan::testing::ScratchDir("compile");
  return kDir;
}

std::string Read(const std::string& path) { return ReadFile(path); }

Result Planc(const std::string& args) {
  return paraplan::testing::RunCommand(std::string(PARAPLAN_PLANC) + " " + args, Dir());
}

constexpr const char* kPlan = R"(
gpu cpu { memory = 16 GiB  peak_bf16 = 1 TFLOPS  peak_fp16 = 1 TFLOPS  peak_fp8 = 1 TFLOPS  hbm_bandwidth = 50 GB/s }
cluster box { gpu = cpu  nodes = 1  gpus_per_node = 8  nvlink_bandwidth = 10 GB/s  network_bandwidth = 1 GB/s }
model tiny { layers = 4  hidden = 64  ffn_hidden = 128  heads = 4  kv_heads = 2  head_dim = 16  vocab = 256  seq_len = 32
             norm = rmsnorm  activation = swiglu  position = rope }
plan tiny_tp2_pp2_dp2 {
  model = tiny
  cluster = box
  parallel { tp = 2  pp = 2  dp = 2  sp = true }
  pipeline { schedule = "1f1b" }
  optimizer { zero = 1 }
  batch { global = 16  micro = 2 }
  precision = fp32
}
)";

int64_t Int(const llvm::json::Object* o, llvm::StringRef key) {
  auto v = o->getInteger(key);
  return v ? *v : -1;
}
std::string Str(const llvm::json::Object* o, llvm::StringRef key) {
  auto v = o->getString(key);
  return v ? v->str() : std::string();
}

std::string PlanFile() {
  std::string path = Dir() + "/tiny.plan";
  std::ofstream(path) << kPlan;
  return path;
}

std::string Compiled() {
  static const std::string kPath = [] {
    std::string out = Dir() + "/tiny.pplan";
    Result r = Planc("compile " + PlanFile() + " -o " + out + " --trace " + Dir() + "/trace.json");
    REQUIRE_MESSAGE(r.status == 0, r.err);
    return out;
  }();
  return kPath;
}

TEST_CASE("compile writes a program that dump reads back and verifies") {
  std::string prog = Compiled();
  Result r = Planc("dump " + prog);
  REQUIRE_MESSAGE(r.status == 0, r.err);
  CHECK(r.out.find("world size 8") != std::string::npos);
  CHECK(r.out.find("schedule: zero_grads F0 sa0 F1 sa1 rg0 B0 F2 sa2 rg1 B1 F3 sa3 rg2 B2 rg3 B3 "
                   "reduce_grads optimizer_step") != std::string::npos);
  r = Planc("dump " + prog + " --rank 5");
  REQUIRE(r.status == 0);
  CHECK(r.out.find("rank 5: role stage1") != std::string::npos);
  CHECK(r.out.find("body chunk0.forward") != std::string::npos);
}

TEST_CASE(
    "dump --format=json follows DESIGN.md: per rank a schedule of {op, microbatch, chunk, peer}") {
  Result r = Planc("dump " + Compiled() + " --rank 0 --format=json");
  REQUIRE_MESSAGE(r.status == 0, r.err);
  auto json = llvm::json::parse(r.out);
  REQUIRE(static_cast<bool>(json));
  const llvm::json::Object* root = json->getAsObject();
  CHECK(Int(root, "version") == 1);
  CHECK(Int(root, "world_size") == 8);
  const llvm::json::Array* ranks = root->getArray("ranks");
  REQUIRE(ranks->size() == 1);
  const llvm::json::Array* sched = (*ranks)[0].getAsObject()->getArray("schedule");
  REQUIRE(sched->size() == 19);
  const llvm::json::Object* f0 = (*sched)[1].getAsObject();
  CHECK(Str(f0, "op") == "forward");
  CHECK(Int(f0, "microbatch") == 0);
  CHECK(Int(f0, "chunk") == 0);
  const llvm::json::Object* s0 = (*sched)[2].getAsObject();
  CHECK(Str(s0, "op") == "send_activation");
  // Rank 0 (tp 0, dp 0, pp 0) sends to pipeline rank 1 of its pipeline: global rank 4.
  CHECK(Int(s0, "peer") == 4);
  CHECK(Str((*sched)[17].getAsObject(), "op") == "reduce_grads");
  CHECK(Str((*sched)[18].getAsObject(), "op") == "optimizer_step");
}

TEST_CASE("the trace is Chrome JSON with a row per rank and compute and pipeline slices") {
  Compiled();
  auto json = llvm::json::parse(Read(Dir() + "/trace.json"));
  REQUIRE(static_cast<bool>(json));
  const llvm::json::Array* events = json->getAsObject()->getArray("traceEvents");
  REQUIRE(events);
  int rows = 0, forwards = 0, transfers = 0;
  for (const llvm::json::Value& e : *events) {
    const llvm::json::Object* o = e.getAsObject();
    if (Str(o, "name") == "thread_name") ++rows;
    if (Str(o, "cat") == "compute" && Str(o, "name").rfind("F", 0) == 0) ++forwards;
    if (Str(o, "cat") == "pipeline") ++transfers;
  }
  CHECK(rows == 8);
  CHECK(forwards == 8 * 4);
  CHECK(transfers == 8 * 2 * 4);  // every rank: 4 sends or receives of activations and 4 of grads
}

// --- expert parallelism ---
// Every layer MoE, 2 per stage; ep 2 (the Tp pair, etp 1): each forward exchanges counts,
// dispatches and combines per layer, each backward dispatches the output's gradient and combines
// the input's. The all-to-alls are slices of their own inside their computation.
TEST_CASE("the trace of an expert-parallel plan shows the all-to-alls over Ep") {
  const std::string plan = Dir() + "/moe_ep.plan";
  std::ofstream(plan) << kPlan << R"(
model tiny_moe extends tiny { experts = 4  topk = 2  moe_ffn_hidden = 64 }
plan tiny_moe_ep2 extends tiny_tp2_pp2_dp2 {
  model = tiny_moe
  parallel { ep = 2  etp = 1 }
  optimizer { zero = 0 }
}
)";
  Result r = Planc("compile " + plan + " --plan tiny_moe_ep2 -o " + Dir() +
                   "/moe_ep.pplan --trace " + Dir() + "/moe_ep.json");
  REQUIRE_MESSAGE(r.status == 0, r.err);
  const std::string text = Read(Dir() + "/moe_ep.json");
  auto json = llvm::json::parse(text);
  REQUIRE(static_cast<bool>(json));
  int exchanges = 0, dispatches = 0, combines = 0;
  for (const llvm::json::Value& e : *json->getAsObject()->getArray("traceEvents")) {
    const llvm::json::Object* o = e.getAsObject();
    if (Str(o, "cat") != "expert-parallel") continue;
    const std::string name = Str(o, "name");
    exchanges += name == "moe_exchange_counts[ep]";
    dispatches += name == "moe_dispatch[ep]";
    combines += name == "moe_combine[ep]";
  }
  // 8 ranks, 4 microbatches, 2 MoE layers per stage.
  CHECK(exchanges == 8 * 4 * 2);
  CHECK(dispatches == 8 * 4 * 2 * 2);  // forward and backward
  CHECK(combines == 8 * 4 * 2 * 2);
}
// --- end expert parallelism ---

// "simulated step X s (time model: Y s)" from planc compile --trace; {-1, -1} when absent.
std::pair<double, double> TraceTimes(const std::string& err) {
  const size_t at = err.find("simulated step ");
  if (at == std::string::npos) return {-1, -1};
  double simulated = -1, model = -1;
  if (std::sscanf(err.c_str() + at, "simulated step %lf s (time model: %lf s)", &simulated,
                  &model) != 2)
    return {-1, -1};
  return {simulated, model};
}

TEST_CASE(
    "the simulated step of the emitted program is within 5% of the time model, for every "
    "schedule") {
  const std::string root = PARAPLAN_SOURCE_DIR;
  const std::string interleaved = " --set pipeline.schedule=interleaved_1f1b --set parallel.vpp=2";
  const std::string one_f_one_b = " --set 'pipeline.schedule=\"1f1b\"' --set parallel.vpp=1";
  const std::string gpipe = " --set pipeline.schedule=gpipe --set parallel.vpp=1";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {root + "/examples/tiny_llama.plan", ""},
      {root + "/examples/tiny_llama.plan", interleaved},
      {root + "/examples/tiny_llama.plan", gpipe},
      // Interleaved, vpp 2, 256 microbatches (full recompute: the program's arena fits 80 GiB).
      {root + "/examples/llama3_70b.plan", " --set recompute=full"},
      {root + "/examples/llama3_70b.plan", one_f_one_b + " --set recompute=full"},
      {root + "/examples/llama3_70b.plan", gpipe + " --set batch.global=16 --set recompute=full"},
      // Context parallelism: ring attention over CP 4 with TP 8 and dp 2.
      {root + "/examples/llama3_8b_64k_cp4.plan", ""},
      // Experts: a tiny DeepSeek-style model on 1F1B, GPipe and interleaved chunks (its MoE
      // layers' router, permutation and grouped GEMMs), and DeepSeek-V2 on ep 32 with tp 8.
      {root + "/examples/tiny_deepseek.plan", ""},
      {root + "/examples/tiny_deepseek.plan", " --set pipeline.schedule=gpipe"},
      {root + "/examples/tiny_deepseek.plan", " --set model.layers=8" + interleaved},
      {root + "/examples/deepseek_v2_32node.plan", ""},
      // Multi-token prediction: one module (an MoE layer) on the loss stage, and one dense
      // module beside context parallelism.
      {root + "/examples/tiny_deepseek.plan", " --set model.mtp_layers=1"},
      {root + "/examples/deepseek_v2_32node.plan", " --set model.mtp_layers=1"},
      {root + "/examples/llama3_8b_64k_cp4.plan", " --set model.mtp_layers=1"},
      {root + "/bench/compile/llama3_405b_16k.plan", ""},
      {root + "/bench/compile/llama3_405b_16k.plan", interleaved},
      {root + "/bench/explain/llama3_405b_16k.plan", ""},
      // GPT 1T on pp 64: interleaved over 2 chunks with 512 microbatches per pipeline, 1F1B,
      // and GPipe on a batch whose microbatches all fit at once.
      {root + "/bench/compile/gpt_1t_interleaved.plan", ""},
      {root + "/bench/compile/gpt_1t_interleaved.plan", one_f_one_b},
      {root + "/bench/compile/gpt_1t_interleaved.plan", gpipe + " --set batch.global=96"},
      // Llama 3 70B on pp 4 x vpp 5 (full recompute: the program's arena fits 80 GiB), 1F1B,
      // GPipe.
      {root + "/bench/check/llama3_70b.plan", " --set recompute=full"},
      {root + "/bench/check/llama3_70b.plan", one_f_one_b},
      {root + "/bench/check/llama3_70b.plan",
       gpipe + " --set batch.global=16 --set recompute=full"},
      // No pipeline (pp 1): a 125M model whose step is short enough that the per-step host cost
      // (0.05 s of 0.17 s) must be in the simulation too.
      {root + "/bench/gpu/plans.plan", ""},
  };
  for (const auto& [plan, sets] : cases) {
    Result r = Planc("compile " + plan + sets + " -o " + Dir() + "/sim.pplan --trace " + Dir() +
                     "/sim.json");
    INFO(plan << sets);
    REQUIRE_MESSAGE(r.status == 0, r.err);
    const auto [simulated, model] = TraceTimes(r.err);
    REQUIRE(simulated > 0);
    REQUIRE(model > 0);
    CHECK(std::fabs(simulated / model - 1) <= 0.05);
  }
}

TEST_CASE("damaged and mismatched program files are refused with a clear message, never a crash") {
  std::string good = Read(Compiled());
  auto write = [&](const std::string& name, const std::string& bytes) {
    std::string path = Dir() + "/" + name;
    std::ofstream(path, std::ios::binary) << bytes;
    return path;
  };
  Result r = Planc("dump " + write("truncated.pplan", good.substr(0, good.size() / 2)));
  CHECK(r.status == 1);
  CHECK(r.err.find("is not a valid program") != std::string::npos);
  r = Planc("dump " + write("garbage.pplan", "this is not a program at all"));
  CHECK(r.status == 1);
  CHECK(r.err.find("no 'PPLN' file identifier") != std::string::npos);
  r = Planc("dump " + write("empty.pplan", ""));
  CHECK(r.status == 1);
  // Flip bytes all over the file: every result is refused or verified, never a crash.
  for (size_t step = 7; step < good.size(); step += good.size() / 23) {
    std::string bad = good;
    bad[step] = static_cast<char>(bad[step] ^ 0x5a);
    r = Planc("dump " + write("flipped.pplan", bad));
    CHECK((r.status == 0 || r.status == 1));
  }
  // A program of another format version.
  std::string error;
  auto p = paraplan::lower::FromFlatBuffer(reinterpret_cast<const uint8_t*>(good.data()),
                                           good.size(), &error);
  REQUIRE(p.has_value());
  p->format_version = 99;
  auto bytes = paraplan::lower::ToFlatBuffer(*p);
  r = Planc("dump " + write("version.pplan", std::string(bytes.begin(), bytes.end())));
  CHECK(r.status == 1);
  CHECK(r.err.find("format version 99 is not the supported version " +
                   std::to_string(paraplan::prog::kFormatVersion)) != std::string::npos);
  // A rank table that does not match the world size.
  p->format_version = paraplan::prog::kFormatVersion;
  p->ranks.pop_back();
  bytes = paraplan::lower::ToFlatBuffer(*p);
  r = Planc("dump " + write("world.pplan", std::string(bytes.begin(), bytes.end())));
  CHECK(r.status == 1);
  CHECK(r.err.find("7 rank entries for world size 8") != std::string::npos);
  // A rank outside its communicator.
  p = paraplan::lower::FromFlatBuffer(reinterpret_cast<const uint8_t*>(good.data()), good.size(),
                                      &error);
  std::swap(p->ranks[0].comms[static_cast<int>(paraplan::prog::CommKind::Tp)],
            p->ranks[2].comms[static_cast<int>(paraplan::prog::CommKind::Tp)]);
  bytes = paraplan::lower::ToFlatBuffer(*p);
  r = Planc("dump " + write("member.pplan", std::string(bytes.begin(), bytes.end())));
  CHECK(r.status == 1);
  CHECK(r.err.find("not a member of its tp communicator") != std::string::npos);
  // A buffer placed past the arena.
  p = paraplan::lower::FromFlatBuffer(reinterpret_cast<const uint8_t*>(good.data()), good.size(),
                                      &error);
  p->roles[0].buffers[3].offset = p->roles[0].arena_bytes;
  bytes = paraplan::lower::ToFlatBuffer(*p);
  r = Planc("dump " + write("bounds.pplan", std::string(bytes.begin(), bytes.end())));
  CHECK(r.status == 1);
  CHECK(r.err.find("outside the arena") != std::string::npos);
  r = Planc("dump " + Compiled() + " --rank 8");
  CHECK(r.status == 2);
  CHECK(r.err.find("outside the program's world of 8 ranks") != std::string::npos);
}

TEST_CASE("compile agrees with check: settings check calls inert compile, offload is refused") {
  // interleaved_1f1b with vpp = 1 runs plain 1F1B (P0413), as check says: the same program.
  const std::string base = Dir() + "/agree_base.pplan", inter = Dir() + "/agree_inter.pplan";
  REQUIRE(Planc("compile " + PlanFile() + " -o " + base).status == 0);
  Result r =
      Planc("compile " + PlanFile() + " -o " + inter + " --set pipeline.schedule=interleaved_1f1b");
  REQUIRE_MESSAGE(r.status == 0, r.err);
  CHECK(r.err.find("P0413") != std::string::npos);
  CHECK(Read(base) == Read(inter));
  // An fp8 recipe without precision = fp8 has no effect (P0517): it compiles.
  r = Planc("compile " + PlanFile() + " -o " + Dir() + "/agree_fp8.pplan" +
            " --set mixed_precision.fp8=current");
  REQUIRE_MESSAGE(r.status == 0, r.err);
  CHECK(r.err.find("P0517") != std::string::npos);
  // The optimizer offloaded: planrun keeps it in the arena, so compile refuses instead of
  // writing a program that needs the memory check counted on the host.
  r = Planc("compile " + PlanFile() + " -o " + Dir() + "/agree_offload.pplan" +
            " --set optimizer.offload=cpu");
  CHECK(r.status == 1);
  CHECK(r.err.find("P0801") != std::string::npos);
  CHECK(r.err.find("the optimizer offloaded to the host") != std::string::npos);
}

TEST_CASE("compile: usage errors and plan errors") {
  Result r = Planc("compile " + PlanFile());
  CHECK(r.status == 2);
  CHECK(r.err.find("-o PROGRAM is required") != std::string::npos);
  r = Planc("compile " + PlanFile() + " -o -");
  CHECK(r.status == 2);
  CHECK(r.err.find("a program is binary FlatBuffers, not for standard output") !=
        std::string::npos);
  CHECK_FALSE(fs::exists(Dir() + "/-"));
  r = Planc("compile " + PlanFile() + " -o " + Dir() + "/x.pplan --set parallel.tp=3");
  CHECK(r.status == 1);
  CHECK_FALSE(fs::exists(Dir() + "/x.pplan"));
  r = Planc("dump");
  CHECK(r.status == 2);
  r = Planc("compile " + PlanFile() + " -o " + Dir() + "/x.pplan --microbatch-group 3abc");
  CHECK(r.status == 2);
  CHECK(r.err.find("--microbatch-group takes a positive integer, got '3abc'") != std::string::npos);
  // A global batch of 10^9 sequences would spell out 250,000,000 microbatches per step.
  r = Planc("compile " + PlanFile() + " -o " + Dir() + "/x.pplan --set batch.global=1000000000");
  CHECK(r.status == 1);
  CHECK(r.err.find("gives 250000000 microbatches per step on each data-parallel rank; programs "
                   "hold at most 65536") != std::string::npos);
}

TEST_CASE(
    "planrun refuses a misaligned buffer and a parameter shape past 64 bits (not undefined "
    "behaviour)") {
  const std::string good = Read(Compiled());
  std::string error;
  auto runs = [&](const paraplan::lower::Program& p, const std::string& name) {
    const auto bytes = paraplan::lower::ToFlatBuffer(p);
    const std::string path = Dir() + "/" + name;
    std::ofstream(path, std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes.data()), bytes.size());
    const std::string out = Dir() + "/planrun.txt";
    const int rc = std::system(
        (std::string(PARAPLAN_PLANRUN) + " " + path + " --steps 1 > " + out + " 2>&1").c_str());
    return std::make_pair(WIFEXITED(rc) ? WEXITSTATUS(rc) : 128, Read(out));
  };
  auto p = paraplan::lower::FromFlatBuffer(reinterpret_cast<const uint8_t*>(good.data()),
                                           good.size(), &error);
  REQUIRE(p.has_value());
  for (auto& b : p->roles[0].buffers) b.fp32_offset += 2;
  auto [status, out] = runs(*p, "misaligned.pplan");
  CHECK(status == 1);
  CHECK(out.find("is not aligned to its 4-byte elements") != std::string::npos);
  p = paraplan::lower::FromFlatBuffer(reinterpret_cast<const uint8_t*>(good.data()), good.size(),
                                      &error);
  p->roles[0].params[0].global_shape = {int64_t{1} << 40, int64_t{1} << 40};
  std::tie(status, out) = runs(*p, "shape.pplan");
  CHECK(status == 1);
  CHECK(out.find("has a bad global shape") != std::string::npos);
  p = paraplan::lower::FromFlatBuffer(reinterpret_cast<const uint8_t*>(good.data()), good.size(),
                                      &error);
  p->roles[0].params[0].split_comm = static_cast<paraplan::prog::CommKind>(15);
  std::tie(status, out) = runs(*p, "split_comm.pplan");
  CHECK(status == 1);
  CHECK(out.find("is split over a bad communicator kind") != std::string::npos);
  // Placements whose end passes 64 bits are outside the arena for planc dump too (no overflow).
  p = paraplan::lower::FromFlatBuffer(reinterpret_cast<const uint8_t*>(good.data()), good.size(),
                                      &error);
  p->roles[0].buffers[0].slots = 2;
  p->roles[0].buffers[0].fp32_slot_stride = INT64_MAX;
  const auto bytes = paraplan::lower::ToFlatBuffer(*p);
  std::ofstream(Dir() + "/stride.pplan", std::ios::binary)
      .write(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  Result r = Planc("dump " + Dir() + "/stride.pplan");
  CHECK(r.status == 1);
  CHECK(r.err.find("outside the f32 arena") != std::string::npos);
}

TEST_CASE("a multi-token prediction plan compiles, dumps and trains, reporting the MTP loss") {
  const std::string plan = Dir() + "/mtp.plan";
  std::ofstream(plan) << kPlan << R"(
plan mtp extends tiny_tp2_pp2_dp2 {
  model.mtp_layers = 2
  model.mtp_loss_scale = 0.3
}
)";
  const std::string prog = Dir() + "/mtp.pplan";
  Result r = Planc("compile " + plan + " --plan mtp -o " + prog);
  REQUIRE_MESSAGE(r.status == 0, r.err);
  r = Planc("dump " + prog);
  REQUIRE(r.status == 0);
  CHECK(r.out.find("multi-token prediction: 2 modules, loss weight 0.3") != std::string::npos);
  const std::string out = Dir() + "/mtp.txt", metrics = Dir() + "/mtp.jsonl";
  const int rc = std::system((std::string(PARAPLAN_PLANRUN) + " " + prog + " --steps 2 --metrics " +
                              metrics + " > " + out + " 2>&1")
                                 .c_str());
  CHECK(WIFEXITED(rc));
  CHECK(WEXITSTATUS(rc) == 0);
  CHECK(Read(out).find("mtp_loss ") != std::string::npos);
  CHECK(Read(metrics).find("\"mtp_loss\": ") != std::string::npos);
  // A plan without the modules reports no MTP loss.
  CHECK(Read(Compiled()).size() > 0);
  const std::string plain_out = Dir() + "/plain.txt";
  std::system(
      (std::string(PARAPLAN_PLANRUN) + " " + Compiled() + " --steps 1 > " + plain_out + " 2>&1")
          .c_str());
  CHECK(Read(plain_out).find("mtp_loss") == std::string::npos);
}

TEST_CASE("outputs never destroy the plan, a device or a link; unreadable inputs are refused") {
  const std::string plan = PlanFile();
  const std::string text = Read(plan);
  Result r = Planc("compile " + plan + " -o " + plan);
  CHECK(r.status == 2);
  CHECK(r.err.find("is the source file") != std::string::npos);
  CHECK(Read(plan) == text);
  r = Planc("compile " + plan + " -o " + Dir() + "/p.pplan --trace " + plan);
  CHECK(r.status == 2);
  CHECK(Read(plan) == text);
  r = Planc("explain " + plan + " --svg " + plan);
  CHECK(r.status == 2);
  CHECK(Read(plan) == text);
  r = Planc("compile " + plan + " -o " + Dir() + "/same.pplan --trace " + Dir() + "/same.pplan");
  CHECK(r.status == 2);
  CHECK(r.err.find("name the same file") != std::string::npos);
  fs::create_directories(Dir() + "/outdir");
  r = Planc("compile " + plan + " -o " + Dir() + "/outdir");
  CHECK(r.status == 1);
  CHECK(r.err.find("it is a directory") != std::string::npos);
  // A device is written in place, never replaced by a regular file (as root, that would
  // replace /dev/null for everybody).
  r = Planc("compile " + plan + " -o /dev/null --trace /dev/null");
  CHECK(r.status == 0);
  CHECK(fs::is_character_file("/dev/null"));
  if (fs::is_character_file("/dev/full")) {
    r = Planc("compile " + plan + " -o /dev/full");
    CHECK(r.status == 1);
    CHECK(r.err.find("No space left on device") != std::string::npos);
    CHECK(fs::is_character_file("/dev/full"));
    r = Planc("explain " + plan + " --svg /dev/full");
    CHECK(r.status == 1);
  }
  // A link keeps pointing at its target, which receives the program.
  const std::string target = Dir() + "/target.pplan", link = Dir() + "/link.pplan";
  std::ofstream(target) << "old";
  fs::remove(link);
  fs::create_symlink(target, link);
  r = Planc("compile " + plan + " -o " + link);
  CHECK(r.status == 0);
  CHECK(fs::is_symlink(link));
  CHECK(Read(target).size() > 1000);
  // Inputs that are not files.
  r = Planc("check " + Dir() + "/outdir");
  CHECK(r.status == 1);
  CHECK(r.err.find("it is a directory") != std::string::npos);
  r = Planc("check /dev/zero");  // refused unread, not read to the 64 MiB limit
  CHECK(r.status == 1);
  CHECK(r.err.find("it is a character device, not a regular file") != std::string::npos);
  r = Planc("dump " + Dir() + "/outdir");
  CHECK(r.status == 1);
  CHECK(r.err.find("it is a directory") != std::string::npos);
  r = Planc("dump /dev/zero");
  CHECK(r.status == 1);
  CHECK(r.err.find("it is a character device, not a regular file") != std::string::npos);
  // A FIFO with no writer would block a reader forever: refused without opening it blocking.
  const std::string fifo = Dir() + "/plan.fifo";
  fs::remove(fifo);
  REQUIRE(mkfifo(fifo.c_str(), 0600) == 0);
  r = Planc("check " + fifo);
  CHECK(r.status == 1);
  CHECK(r.err.find("it is a FIFO, not a regular file") != std::string::npos);
  r = Planc("dump " + fifo);
  CHECK(r.status == 1);
  CHECK(r.err.find("it is a FIFO, not a regular file") != std::string::npos);
  // A stdlib directory that does not exist is named, not only `<stdlib>/clusters.plan`.
  std::ofstream(Dir() + "/std.plan") << "import std.clusters\n";
  const std::string err = Dir() + "/stdlib_err.txt";
  CHECK(std::system(("env PARAPLAN_STDLIB=" + Dir() + "/no_stdlib " + PARAPLAN_PLANC + " check " +
                     Dir() + "/std.plan 2> " + err)
                        .c_str()) != 0);
  CHECK(Read(err).find("no_stdlib` (from PARAPLAN_STDLIB)") != std::string::npos);
}

TEST_CASE(
    "a 16,384-rank program loads under a launcher with --backend=cuda; the host backend names its "
    "thread limit") {
  const std::string plan = Dir() + "/big_world.plan";
  std::ofstream(plan) << R"(
gpu cpu { memory = 16 GiB  peak_bf16 = 1 TFLOPS  peak_fp16 = 1 TFLOPS  peak_fp8 = 1 TFLOPS  hbm_bandwidth = 50 GB/s }
cluster big { gpu = cpu  nodes = 2048  gpus_per_node = 8  nvlink_bandwidth = 10 GB/s  network_bandwidth = 1 GB/s }
model tiny { layers = 4  hidden = 64  ffn_hidden = 128  heads = 4  kv_heads = 2  head_dim = 16  vocab = 256  seq_len = 32
             norm = rmsnorm  activation = swiglu  position = rope }
plan big_world {
  model = tiny
  cluster = big
  parallel { tp = 2  pp = 2  dp = 4096 }
  pipeline { schedule = "1f1b" }
  optimizer { zero = 1 }
  batch { global = 8192  micro = 1 }
  precision = fp32
}
)";
  const std::string prog = Dir() + "/big_world.pplan";
  REQUIRE(Planc("compile " + plan + " -o " + prog).status == 0);
  const std::string out = Dir() + "/big_world_run.txt";
  // The host backend runs every rank as a thread of one process: refused with its limit named.
  int rc =
      std::system((std::string(PARAPLAN_PLANRUN) + " " + prog + " > " + out + " 2>&1").c_str());
  CHECK(WEXITSTATUS(rc) == 1);
  CHECK(Read(out).find(
            "the program has 16384 ranks, but one process runs at most 4096 ranks as threads") !=
        std::string::npos);
  // One rank per process under torchrun: the program loads; only the missing GPU (or a build
  // without CUDA) stops the run, never the world size.
  rc = std::system(
      ("env RANK=5 WORLD_SIZE=16384 LOCAL_RANK=5 LOCAL_WORLD_SIZE=8 MASTER_ADDR=localhost "
       "MASTER_PORT=29500 " +
       std::string(PARAPLAN_PLANRUN) + " " + prog + " --backend=cuda > " + out + " 2>&1")
          .c_str());
  CHECK(WEXITSTATUS(rc) != 0);
  const std::string text = Read(out);
  INFO(text);
  CHECK(text.find("world size") == std::string::npos);
  CHECK(text.find("as threads") == std::string::npos);
  CHECK((text.find("CUDA") != std::string::npos || text.find("cuda") != std::string::npos));
}

}  // namespace
