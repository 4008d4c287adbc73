// The interpreter on hand-built programs (tiny_program.h): training reduces the loss,
// data-parallel runs (ZeRO 0 and 1) equal the one-rank run, the planned arena and separate
// buffers agree bit for bit, checkpoints resume bitwise, and bad inputs are refused.
#include "runtime/exec/interpreter.h"

#include <doctest/doctest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "runtime/exec/checkpoint.h"
#include "runtime/exec/rank_runner.h"
#include "runtime/exec/tiny_program.h"

using namespace paraplan::exec;
namespace fs = std::filesystem;

namespace {

std::string TempDir(const std::string& name) {
  auto dir = fs::temp_directory_path() / ("paraplan_interp_" + std::to_string(::getpid())) / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

std::string TinyData() {
  const std::string path = TempDir("data") + "/tokens.u16";
  std::ofstream out(path, std::ios::binary);
  // A learnable pattern: mostly counting up modulo 13, with a few jumps.
  for (int i = 0; i < 400; ++i) {
    uint16_t t = static_cast<uint16_t>((i * 3 + (i % 7 == 0 ? 5 : 0)) % 13);
    out.write(reinterpret_cast<const char*>(&t), 2);
  }
  return path;
}

ProgramImage Tiny(testing::TinyOptions o) {
  auto bytes = testing::TinyProgram(o);
  return DecodeProgramImage(bytes.data(), bytes.size(), "tiny");
}

double RelErr(double a, double b) { return std::abs(a - b) / std::max(1e-6, std::abs(b)); }

}  // namespace

TEST_CASE("one rank trains: the loss falls and replicas agree") {
  const std::string data = TinyData();
  auto prog = Tiny({1, 0, 4, 20, "tiny", data});
  RunOptions opt;
  auto r = Train(prog, opt);
  REQUIRE(r.steps.size() == 20);
  CHECK(r.steps.back().loss < 0.8 * r.steps.front().loss);
  CHECK(r.steps.front().loss == doctest::Approx(std::log(13.0)).epsilon(0.3));
  CHECK(r.params.count("embedding.word") == 1);
  CHECK(r.params["final_norm"].size() == 8);
  CHECK(r.steps[0].lr == doctest::Approx(0.025));
  CHECK(r.steps[0].grad_norm > 0);
}

TEST_CASE("data parallel with ZeRO 0 and 1 equals the one-rank run") {
  const std::string data = TinyData();
  RunOptions opt;
  auto one = Train(Tiny({1, 0, 4, 5, "tiny", data}), opt);
  for (int zero : {0, 1}) {
    auto two = Train(Tiny({2, zero, 4, 5, "tiny", data}), opt);
    REQUIRE(two.steps.size() == 5);
    for (size_t s = 0; s < 5; ++s) {
      CHECK(RelErr(two.steps[s].loss, one.steps[s].loss) < 1e-5);
      CHECK(RelErr(two.steps[s].grad_norm, one.steps[s].grad_norm) < 1e-5);
    }
    for (auto& param : one.params) {
      const std::string& name = param.first;  // not a binding: doctest captures it
      auto& w = param.second;
      const auto& v = two.params.at(name);
      REQUIRE(v.size() == w.size());
      double worst = 0;
      for (size_t i = 0; i < w.size(); ++i)
        worst = std::max(
            worst, static_cast<double>(std::abs(v[i] - w[i]) / std::max(1e-3f, std::abs(w[i]))));
      INFO("zero " << zero << " param " << name);
      CHECK(worst < 1e-5);
    }
  }
}

// --- mixture of experts ----------------------------------------------------------------------
TEST_CASE("a mixture-of-experts block trains; data parallel equals the one-rank run") {
  const std::string data = TinyData();
  testing::TinyOptions o{1, 0, 4, 20, "tiny_moe", data};
  o.moe = true;
  RunOptions opt;
  auto one = Train(Tiny(o), opt);
  REQUIRE(one.steps.size() == 20);
  CHECK(one.steps.back().loss < 0.8 * one.steps.front().loss);
  REQUIRE(one.params.count("moe.experts") == 1);
  CHECK(one.params["moe.experts"].size() == 4 * 8 * 8);
  o.steps = 5;
  auto base = Train(Tiny(o), opt);
  for (int zero : {0, 1}) {
    testing::TinyOptions d = o;
    d.dp = 2;
    d.zero = zero;
    auto two = Train(Tiny(d), opt);
    REQUIRE(two.steps.size() == 5);
    for (size_t s = 0; s < 5; ++s) {
      CHECK(RelErr(two.steps[s].loss, base.steps[s].loss) < 1e-5);
      CHECK(RelErr(two.steps[s].grad_norm, base.steps[s].grad_norm) < 1e-5);
    }
    for (auto& param : base.params) {
      const std::string& name = param.first;
      const auto& v = two.params.at(name);
      REQUIRE(v.size() == param.second.size());
      double worst = 0;
      for (size_t i = 0; i < v.size(); ++i)
        worst = std::max(worst, static_cast<double>(std::abs(v[i] - param.second[i]) /
                                                    std::max(1e-3f, std::abs(param.second[i]))));
      INFO("zero " << zero << " param " << name);
      CHECK(worst < 1e-5);
    }
  }
}
// --- end mixture of experts ------------------------------------------------------------------

TEST_CASE("planned arena and separate buffers give identical bits; runs are deterministic") {
  const std::string data = TinyData();
  RunOptions a, b;
  b.separate_buffers = true;
  auto prog = Tiny({2, 1, 4, 4, "tiny", data});
  auto ra = Train(prog, a), rb = Train(prog, b), rc = Train(prog, a);
  for (size_t s = 0; s < 4; ++s) {
    CHECK(ra.steps[s].loss == rb.steps[s].loss);
    CHECK(ra.steps[s].loss == rc.steps[s].loss);
  }
  CHECK(ra.params == rb.params);
}

TEST_CASE("resume from a checkpoint continues bitwise; another plan's checkpoint is refused") {
  const std::string data = TinyData();
  for (int dp : {1, 2}) {
    auto prog = Tiny({dp, dp - 1, 4, 6, "tiny", data});
    RunOptions full;
    auto ref = Train(prog, full);
    const std::string dir = TempDir("ckpt" + std::to_string(dp));
    RunOptions first;
    first.steps = 3;
    first.checkpoint_dir = dir;
    auto r1 = Train(prog, first);
    CHECK(fs::exists(dir + "/latest"));
    CHECK(fs::exists(dir + "/step-000003/manifest.json"));
    CHECK(fs::exists(dir + "/step-000003/rank-00000.bin"));
    RunOptions second;
    second.resume_dir = dir;
    auto r2 = Train(prog, second);
    REQUIRE(r2.start_step == 3);
    REQUIRE(r2.steps.size() == 3);
    for (size_t s = 0; s < 3; ++s) {
      CHECK(r1.steps[s].loss == ref.steps[s].loss);
      CHECK(r2.steps[s].loss == ref.steps[s + 3].loss);  // bitwise
    }
    CHECK(r2.params == ref.params);
  }
  // A checkpoint of the dp=1 plan does not resume the dp=2 plan, nor a plan with another seed.
  RunOptions resume;
  resume.resume_dir = TempDir("ckpt_other");
  {
    RunOptions w;
    w.steps = 1;
    w.checkpoint_dir = resume.resume_dir;
    Train(Tiny({1, 0, 4, 6, "tiny", data}), w);
  }
  CHECK_THROWS_WITH_AS(
      Train(Tiny({2, 0, 4, 6, "wide", data}), resume),
      doctest::Contains("a checkpoint resumes only the plan and layout that wrote it"),
      CheckpointError);
  // A damaged shard is refused.
  {
    std::fstream f(resume.resume_dir + "/step-000001/rank-00000.bin",
                   std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(60);
    f.put('\x7f');
  }
  CHECK_THROWS_WITH_AS(Train(Tiny({1, 0, 4, 6, "tiny", data}), resume),
                       doctest::Contains("checksum"), RunError);
}

TEST_CASE("bad programs, data and checkpoints are refused with clear messages") {
  const std::string data = TinyData();
  auto bytes = testing::TinyProgram({1, 0, 4, 2, "tiny", data});
  CHECK_THROWS_WITH_AS(DecodeProgramImage(bytes.data(), 3, "x"),
                       doctest::Contains("not a paraplan program"), ProgramError);
  auto cut = bytes;
  cut.resize(bytes.size() / 2);
  CHECK_THROWS_AS(DecodeProgramImage(cut.data(), cut.size(), "x"), ProgramError);
  CHECK_THROWS_WITH_AS(LoadProgramImage("/nonexistent/p.pplan"),
                       doctest::Contains("does not exist"), ProgramError);
  auto prog = Tiny({1, 0, 4, 2, "tiny", data});
  RunOptions opt;
  opt.data_path = "/nonexistent/tokens.u16";
  CHECK_THROWS_WITH_AS(Train(prog, opt), doctest::Contains("does not exist"),
                       paraplan::data::DataError);
  // Tokens outside the vocabulary of 13.
  const std::string big = TempDir("big") + "/t.u16";
  {
    std::ofstream out(big, std::ios::binary);
    for (int i = 0; i < 100; ++i) {
      uint16_t t = 40;
      out.write(reinterpret_cast<const char*>(&t), 2);
    }
  }
  opt.data_path = big;
  CHECK_THROWS_WITH_AS(Train(prog, opt), doctest::Contains("outside the model's vocabulary of 13"),
                       paraplan::data::DataError);
  opt.data_path = "";
  opt.resume_dir = TempDir("empty_ckpt");
  CHECK_THROWS_WITH_AS(Train(prog, opt), doctest::Contains("holds no checkpoint"), CheckpointError);
}

TEST_CASE("the loader refuses ops the registry rules out, naming the op and the rule") {
  const std::string data = TinyData();
  const auto bytes = testing::TinyProgram({1, 0, 4, 2, "tiny", data});
  const paraplan::prog::mem::Program good =
      paraplan::prog::mem::DecodeProgram(bytes.data(), bytes.size(), "tiny");
  auto refused = [&](auto&& damage) {
    paraplan::prog::mem::Program p = good;
    damage(p.roles[0]);
    const std::vector<uint8_t> b = paraplan::prog::mem::EncodeProgram(p);
    std::string message;
    try {
      DecodeProgramImage(b.data(), b.size(), "damaged");
    } catch (const ProgramError& e) {
      message = e.what();
    }
    return message;
  };
  // Body 0 is the forward: LoadBatch, LoadBatch, Embedding, RmsNorm, Linear, ...
  CHECK(refused([](auto& role) { role.bodies[0].ops[1].ints = {2}; }) ==
        "program `damaged`: role `stage0`: op 1 (load_batch) of body `chunk0.forward` what = 2 "
        "lies outside 0 .. 1");
  CHECK(refused([](auto& role) {
          role.bodies[0].ops[2].inputs = {role.bodies[0].ops[2].inputs[1],
                                          role.bodies[0].ops[2].inputs[1]};
        })
            .find("op 2 (embedding) of body `chunk0.forward` input 0 (ids) `emb` holds "
                  "F32; the op takes I32 token ids") != std::string::npos);
  CHECK(refused([](auto& role) {
          role.bodies[0].ops[4].outputs.push_back(0);
        }).find("op 4 (linear) of body `chunk0.forward` has 2 outputs; it takes 1") !=
        std::string::npos);
  CHECK(refused([](auto& role) {
          role.schedule[1].ints[2] = 1;
        }).find("schedule op 1 (forward) slot = 1 lies outside 0 .. 0") != std::string::npos);
  CHECK(refused([](auto& role) { role.bodies[1].ops[0].comm = paraplan::prog::CommKind::Dp; })
            .find("cross_entropy_backward) of body `chunk0.backward` runs over communicator kind "
                  "Dp; it takes None, Tp") != std::string::npos);
  CHECK(refused([](auto&) {}) == "");
}

TEST_CASE("initialisation is counter-based: a value depends only on (seed, key, index)") {
  CHECK(InitValue(1, 2, 3, 1.0) == InitValue(1, 2, 3, 1.0));
  CHECK(InitValue(1, 2, 3, 1.0) != InitValue(1, 2, 4, 1.0));
  CHECK(InitValue(1, 2, 3, 1.0) != InitValue(2, 2, 3, 1.0));
  double sum = 0, sq = 0;
  const int n = 20000;
  for (int i = 0; i < n; ++i) {
    const double v = InitValue(9, 5, i, 0.02);
    sum += v;
    sq += v * v;
  }
  CHECK(std::abs(sum / n) < 0.02 * 0.05);
  CHECK(std::sqrt(sq / n) == doctest::Approx(0.02).epsilon(0.03));
}

// Parameter init spreads a block over threads; every thread count writes the same bits, each
// element the value of its global index.
TEST_CASE("threaded parameter init writes the same values as one thread") {
  // A [3, 40000 / 4, 7] block of a [3, 40000, 7] tensor split four ways on dimension 1: 210,000
  // elements, enough for several threads; and a block of a tensor split on its first dimension.
  for (const InitBlock& block :
       {InitBlock{3, 40000, 10000, 2, 7}, InitBlock{1, 280004, 70001, 3, 1}}) {
    const int64_t local = block.outer * block.n_local * block.inner;
    std::vector<float> one(local), many(local);
    InitNormalBlock(one.data(), 7, 11, 0.02, block, 1);
    for (int64_t li : {int64_t{0}, int64_t{1}, local / 3, local - 1}) {
      const int64_t i = li % block.inner, j = li / block.inner % block.n_local,
                    o = li / block.inner / block.n_local;
      const int64_t gi = (o * block.n_global + block.part * block.n_local + j) * block.inner + i;
      CHECK(one[li] == InitValue(7, 11, gi, 0.02));
    }
    for (int threads : {2, 3, 7}) {
      std::fill(many.begin(), many.end(), 0.0f);
      InitNormalBlock(many.data(), 7, 11, 0.02, block, threads);
      CHECK(many == one);
    }
  }
}

TEST_CASE("a rank that fails mid-step stops every rank with its message (no hang)") {
  const std::string data = TinyData();
  ProgramImage prog = Tiny({2, 0, 4, 3, "tiny", data});
  // Rank 1 claims data-parallel coordinate 5: its first LoadBatch fails while rank 0 waits for it
  // in the gradient all-reduce.
  prog.ranks[1].coords = paraplan::prog::Coordinates(0, 0, 0, 5, 0);
  RunOptions options;  // default timeout of 600 s: only the abort can end this run promptly
  CHECK_THROWS_WITH_AS(Train(prog, options),
                       doctest::Contains("rank 1: no microbatch 0 of data-parallel rank 5"),
                       RunError);
}

TEST_CASE(
    "a stop request ends the run at a step every rank agrees on, with a checkpoint that resumes "
    "bitwise") {
  const std::string data = TinyData();
  for (int dp : {1, 2}) {
    // Ranks run ahead of the thread that reports steps, so a run long enough that the request
    // (made when step `at` is reported) comes before the ranks have finished.
    const int64_t total = 1000;
    auto prog = Tiny({dp, dp - 1, 4, total, "tiny", data});
    const auto ref = Train(prog, RunOptions{});
    for (int64_t at : {0, 1, 3}) {
      const std::string dir = TempDir("stop" + std::to_string(dp) + "_" + std::to_string(at));
      std::atomic<int> stop{0};
      RunOptions run;
      run.checkpoint_dir = dir;
      run.stop_request = &stop;
      if (at == 0) stop = 15;  // before the first step: nothing runs, nothing is written
      run.on_step = [&](const StepMetrics& m) {
        if (m.step == at) stop = 15;
      };
      const auto r = Train(prog, run);
      CHECK(r.stopped);
      if (at == 0) {
        CHECK(r.steps.empty());
        CHECK(r.checkpoint_step == -1);
        CHECK_FALSE(fs::exists(dir + "/step-000000"));
        continue;
      }
      // Ranks may have started later steps before the request: they finish them.
      REQUIRE(static_cast<int64_t>(r.steps.size()) > at);
      REQUIRE(static_cast<int64_t>(r.steps.size()) < total);
      CHECK(r.checkpoint_step == static_cast<int64_t>(r.steps.size()));
      CHECK(FindCheckpoint(dir, prog).step == r.checkpoint_step);
      for (size_t s = 0; s < r.steps.size(); ++s) CHECK(r.steps[s].loss == ref.steps[s].loss);
      RunOptions resume;
      resume.resume_dir = dir;
      const auto rest = Train(prog, resume);
      REQUIRE(static_cast<int64_t>(rest.steps.size()) ==
              total - static_cast<int64_t>(r.steps.size()));
      for (size_t s = 0; s < rest.steps.size(); ++s)
        CHECK(rest.steps[s].loss == ref.steps[r.steps.size() + s].loss);
      CHECK(rest.params == ref.params);
    }
  }
}

TEST_CASE("a rank thread that cannot be created is reported, not std::terminate") {
  // In a child process whose address space leaves room for about one more thread stack, a run
  // of 16 ranks cannot start all its threads (more than glibc keeps cached): the started ones are
  // aborted and joined and Train throws RunError.
  const std::string data = TinyData();
  const auto prog = Tiny({16, 0, 32, 2, "tiny", data});
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    long pages = 0, resident = 0;
    if (FILE* f = std::fopen("/proc/self/statm", "r")) {
      if (std::fscanf(f, "%ld %ld", &pages, &resident) != 2) pages = 0;
      std::fclose(f);
    }
    struct rlimit limit {};
    limit.rlim_cur = limit.rlim_max =
        static_cast<rlim_t>(pages) * sysconf(_SC_PAGESIZE) + (12 << 20);
    if (pages == 0 || setrlimit(RLIMIT_AS, &limit) != 0) _exit(3);
    try {
      RunOptions run;
      Train(prog, run);
      _exit(4);
    } catch (const RunError& e) {
      _exit(std::string(e.what()).find("cannot start the thread of rank") != std::string::npos ? 0
                                                                                               : 5);
    } catch (...) {
      _exit(6);
    }
  }
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}
