// Candidates per second of the search core (rules + partition + memory + time per candidate) on
// the space of llama3_70b_64xh100.plan, built in C++ so that it measures the search alone.
// Usage: paraplan_search_bench [repetitions]
#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "compiler/search/search.h"

using namespace paraplan;

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::max(1, std::atoi(argv[1])) : 3;
  Plan plan;
  plan.name = "llama3_70b_search";
  ModelSpec& m = plan.model;
  m.name = "llama3_70b";
  m.layers = 80;
  m.hidden = 8192;
  m.ffn_hidden = 28672;
  m.heads = 64;
  m.kv_heads = 8;
  m.head_dim = 128;
  m.vocab = 128256;
  m.seq_len = 8192;
  ClusterSpec& c = plan.cluster;
  c.name = "dgx_h100";
  c.gpu = {"h100_sxm", int64_t{80} << 30, 989e12, 989e12, 1979e12, 3.35e12};
  c.nodes = 8;
  c.gpus_per_node = 8;
  c.nvlink_bandwidth = 450e9;
  c.network_bandwidth = 50e9;
  plan.batch.global = 512;
  plan.parallel.dp = 64;
  std::vector<std::string> pp;
  for (int v : {1, 2, 4, 8, 16, 32, 64}) pp.push_back(std::to_string(v));
  const std::vector<SearchAxis> axes = {
      {"parallel.tp", {"1", "2", "4", "8"}},  {"parallel.pp", pp},
      {"parallel.vpp", {"1", "2", "4", "5"}}, {"parallel.cp", {"1", "2", "4"}},
      {"parallel.sp", {"false", "true"}},     {"optimizer.zero", {"0", "1", "2", "3"}},
      {"batch.micro", {"1", "2", "4"}},       {"recompute", {"none", "selective", "full"}},
  };
  SearchOptions options;
  options.top = 5;
  double best_rate = 0;
  SearchResult result;
  for (int i = 0; i < reps; ++i) {
    const auto start = std::chrono::steady_clock::now();
    result = RunSearch(plan, axes, options);
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const double rate = static_cast<double>(result.enumerated) / s;
    std::printf("run %d: %lld candidates in %.3f s = %.0f candidates/s (%lld fit)\n", i + 1,
                static_cast<long long>(result.enumerated), s, rate,
                static_cast<long long>(result.fitting));
    if (rate > best_rate) best_rate = rate;
  }
  std::printf("best: %.0f candidates/s\n\n%s", best_rate,
              PrintSearchText(plan, axes, result).c_str());
  return 0;
}
