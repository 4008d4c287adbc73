// Program files mutated as a damaged disk or a hostile user would: every mutant must be refused
// with an error (ProgramError at decode, a whole-world verification message as planrun gives
// before starting any rank, RunError / CommError / DataError while running) or run one step;
// never a crash, a hang, a sanitizer report or an allocation of the whole machine.
//
// Mutations: 1-3 random bytes; the high byte(s) of an 8-byte-aligned word (int64 attributes,
// shapes and offsets near 2^56..2^63); a hostile int64 (2^62 + 32, INT64_MAX, INT64_MIN, -1,
// 2^31, 2^32) or int32 (INT32_MAX, INT32_MIN, -1, 0) written at an aligned offset.
// PARAPLAN_FUZZ_ITERATIONS (default 3000) and PARAPLAN_FUZZ_SEED (default 987) set the run;
// PARAPLAN_FUZZ_TRACE prints each iteration, PARAPLAN_FUZZ_SAVE=N saves mutant N for planrun;
// README.md records the counts run under AddressSanitizer and UndefinedBehaviorSanitizer.
#include <doctest/doctest.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "compiler/driver/frontend.h"
#include "compiler/lower/lower.h"
#include "runtime/exec/interpreter.h"
#include "runtime/exec/tiny_program.h"
#include "runtime/verify/verify.h"

using namespace paraplan::exec;
namespace fs = std::filesystem;

namespace {

int64_t EnvInt(const char* name, int64_t fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::strtoll(v, nullptr, 10) : fallback;
}

std::string TinyData() {
  const auto dir =
      fs::temp_directory_path() / ("paraplan_fuzz_program_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string path = (dir / "tokens.u16").string();
  std::ofstream out(path, std::ios::binary);
  for (int i = 0; i < 400; ++i) {
    const uint16_t t = static_cast<uint16_t>((i * 3 + (i % 7 == 0 ? 5 : 0)) % 13);
    out.write(reinterpret_cast<const char*>(&t), 2);
  }
  return path;
}

void Mutate(std::vector<uint8_t>& b, std::mt19937_64& gen) {
  static const int64_t kWords[] = {
      (int64_t{1} << 62) + 32, int64_t{1} << 62,      INT64_MAX, INT64_MIN, -1, int64_t{1} << 31,
      int64_t{1} << 32,        (int64_t{1} << 32) + 8};
  static const int32_t kInts[] = {INT32_MAX, INT32_MIN, -1, 0, 1 << 30};
  static const uint8_t kHigh[] = {0x40, 0x3f, 0x7f, 0x80, 0xff, 0x01};
  const size_t n = b.size();
  switch (gen() % 4) {
    case 0: {  // random bytes
      const int flips = 1 + static_cast<int>(gen() % 3);
      for (int f = 0; f < flips; ++f) b[gen() % n] = static_cast<uint8_t>(gen());
      break;
    }
    case 1: {  // the high byte, or high bytes, of an aligned int64
      const size_t at = (gen() % (n / 8)) * 8;
      const int count = 1 + static_cast<int>(gen() % 4);
      for (int k = 0; k < count; ++k) {
        b[at + 7 - k] = gen() % 2 ? kHigh[gen() % (sizeof kHigh)] : static_cast<uint8_t>(gen());
      }
      break;
    }
    case 2: {  // a hostile int64
      const size_t at = (gen() % (n / 8)) * 8;
      const int64_t v = kWords[gen() % (sizeof kWords / sizeof kWords[0])];
      std::memcpy(b.data() + at, &v, 8);
      break;
    }
    default: {  // a hostile int32
      const size_t at = (gen() % (n / 4)) * 4;
      const int32_t v = kInts[gen() % (sizeof kInts / sizeof kInts[0])];
      std::memcpy(b.data() + at, &v, 4);
      break;
    }
  }
}

// A program planc lowers: a small Llama over pp 2 with 3 interleaved chunks per rank, whose
// chunks share one pool of stash slots (the verifier's slot and placement rules meet damage).
std::vector<uint8_t> PooledProgram(const std::string& data) {
  paraplan::FrontendOptions opts;
  opts.file = std::string(PARAPLAN_ROOT) + "/examples/tiny_llama.plan";
  opts.sets = {"model.layers=6",
               "model.hidden=32",
               "model.heads=4",
               "model.kv_heads=2",
               "model.ffn_hidden=64",
               "model.seq_len=8",
               "parallel.tp=1",
               "parallel.sp=false",
               "parallel.pp=2",
               "parallel.vpp=3",
               "pipeline.schedule=interleaved_1f1b",
               "cluster.gpus_per_node=2",
               "batch.global=12",
               "batch.micro=1",
               "train.data=\"" + data + "\""};
  paraplan::SourceManager sm;
  paraplan::DiagnosticSink sink;
  std::optional<paraplan::Plan> plan = paraplan::LoadPlan(opts, sm, sink);
  REQUIRE(plan.has_value());
  std::optional<paraplan::lower::Program> p = paraplan::lower::LowerPlan(*plan, {}, sink);
  REQUIRE(p.has_value());
  bool pooled = false;
  for (const auto& role : p->roles)
    for (const auto& c : role.chunks) pooled = pooled || c.pool >= 0;
  REQUIRE(pooled);
  return paraplan::lower::ToFlatBuffer(*p);
}

}  // namespace

TEST_CASE("mutated program files are refused with an error or run; never a crash or a hang") {
  const std::string data = TinyData();
  const std::vector<std::vector<uint8_t>> bases = {
      testing::TinyProgram({2, 1, 4, 1, "tiny", data}),
      testing::TinyProgram({1, 0, 4, 1, "tiny", data}),
      testing::TinyProgram({2, 0, 8, 1, "tiny", data}),
      PooledProgram(data),
  };
  const int64_t iterations = EnvInt("PARAPLAN_FUZZ_ITERATIONS", 3000);
  std::mt19937_64 gen(static_cast<uint64_t>(EnvInt("PARAPLAN_FUZZ_SEED", 987)));
  const bool trace = std::getenv("PARAPLAN_FUZZ_TRACE") != nullptr;
  const int64_t save_at = EnvInt("PARAPLAN_FUZZ_SAVE", -1);
  int64_t ran = 0, refused_at_decode = 0, refused_by_verifier = 0, refused_running = 0, too_big = 0;
  for (int64_t it = 0; it < iterations; ++it) {
    auto b = bases[static_cast<size_t>(it) % bases.size()];
    Mutate(b, gen);
    if (gen() % 4 == 0) Mutate(b, gen);
    if (trace) std::fprintf(stderr, "iteration %lld\n", static_cast<long long>(it));
    if (it ==
        save_at) {  // PARAPLAN_FUZZ_SAVE=N: write mutant N to program_mutant.pplan for planrun
      std::ofstream("program_mutant.pplan", std::ios::binary)
          .write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
    }
    ProgramImage image;
    try {
      image = DecodeProgramImage(b.data(), b.size(), "mutated");
    } catch (const std::exception&) {
      ++refused_at_decode;
      continue;
    }
    // planrun's next step: the whole-world verifier, which must answer with messages (or none),
    // never throw.
    if (!paraplan::verify::VerifyWorld(image).empty()) {
      ++refused_by_verifier;
      continue;
    }
    // A mutant that asks for gigabytes is valid input (the runtime refuses only what exceeds the
    // machine) but filling that memory is not what this test is for.
    double arena = 0;
    for (const auto& r : image.ranks)
      arena += static_cast<double>(image.roles[r.role].fp32_arena_bytes);
    if (arena > 64.0 * 1048576.0) {
      ++too_big;
      continue;
    }
    try {
      RunOptions options;
      options.steps = 1;
      options.comm_timeout_seconds = 1;
      Train(image, options);
      ++ran;
    } catch (const std::exception&) {
      ++refused_running;
    }
  }
  MESSAGE(iterations << " mutants: " << refused_at_decode << " refused at decode, "
                     << refused_by_verifier << " by the whole-world verifier, " << refused_running
                     << " refused while running, " << ran << " ran, " << too_big
                     << " skipped (arenas over 64 MiB)");
  CHECK(ran + refused_at_decode + refused_by_verifier + refused_running + too_big == iterations);
  CHECK(refused_at_decode > 0);
}
