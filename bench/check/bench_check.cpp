// In-memory variant checking: parse a plan once, then evaluate and rule-check variants of it
// (each with its own --set overrides) as fast as possible; prints variants per second.
//
//   bench_check PLAN [SECONDS]
//
// Two measurements: overrides parsed once and reused (what `planc search` does per candidate),
// and overrides parsed for every variant (a cold --set list each time).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <string>
#include <vector>

#include "compiler/driver/frontend.h"

using namespace paraplan;

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: bench_check PLAN [SECONDS]\n");
    return 2;
  }
  double seconds = argc > 2 ? std::atof(argv[2]) : 2.0;
  FrontendOptions opts;
  opts.file = argv[1];
  SourceManager sm;
  DiagnosticSink sink;
  auto variants = PlanVariants::Load(opts, sm, sink);
  if (!variants) {
    std::fprintf(stderr, "bench_check: %s does not load (%d errors)\n", argv[1],
                 sink.error_count());
    return 1;
  }
  std::vector<std::vector<std::string>> sets;
  for (int tp : {1, 2, 4, 8}) {
    for (int pp : {1, 2, 4, 8}) {
      for (int micro : {1, 2}) {
        // vpp = 1 runs one chunk per rank: the schedule says so (an interleaved schedule with
        // vpp = 1 is a warning whose help re-checks candidate vpp values).
        sets.push_back({"parallel.tp=" + std::to_string(tp), "parallel.pp=" + std::to_string(pp),
                        "batch.micro=" + std::to_string(micro), "parallel.vpp=1",
                        "pipeline.schedule=1f1b"});
      }
    }
  }
  std::vector<std::vector<SetOverride>> parsed;
  for (const auto& s : sets) parsed.push_back(*variants->ParseSets(s, sink));

  using Clock = std::chrono::steady_clock;
  auto run = [&](bool reparse, bool rules = true) {
    size_t done = 0, clean = 0, quiet = 0;
    std::clock_t cpu_start = std::clock();
    auto start = Clock::now();
    double elapsed = 0;
    while (elapsed < seconds) {
      for (size_t i = 0; i < sets.size(); ++i) {
        DiagnosticSink vs;
        std::optional<Plan> plan;
        if (reparse) {
          auto p = variants->ParseSets(sets[i], vs);
          plan = variants->Check(*p, vs);
        } else {
          plan = variants->Check(parsed[i], vs, rules);
        }
        clean += plan.has_value();
        quiet += vs.diagnostics().empty();
        ++done;
      }
      elapsed = std::chrono::duration<double>(Clock::now() - start).count();
    }
    double cpu = static_cast<double>(std::clock() - cpu_start) / CLOCKS_PER_SEC;
    // Per CPU-second too: on a shared machine wall time includes time spent waiting for a core.
    std::printf(
        "%-32s %8.0f variants/s wall  %8.0f per CPU-second  (%zu variants, %zu clean, %zu without "
        "a diagnostic)\n",
        !rules    ? "evaluate only (no rules)"
        : reparse ? "check, --set parsed each time"
                  : "check, --set parsed once",
        done / elapsed, done / cpu, done, clean, quiet);
  };
  run(false);
  run(true);
  run(false, false);
  return 0;
}
