// Times the in-process part of `planc explain --format=json` for Llama 3 405B on 16,384 H100
// (TP 8, PP 16, DP 128): rank layout (16 group kinds), topology, pipeline partition and the JSON
// document. The whole-process number (`planc explain` on a plan file) is in README.md.
#include <chrono>
#include <cstdio>

#include "compiler/driver/explain.h"

using namespace paraplan;

int main() {
  Plan plan;
  plan.name = std::string("llama3_405b_16k");
  plan.model.name = std::string("llama3_405b");
  plan.model.layers = 126;
  plan.model.hidden = 16384;
  plan.model.ffn_hidden = 53248;
  plan.model.heads = 128;
  plan.model.kv_heads = 8;
  plan.model.head_dim = 128;
  plan.model.vocab = 128256;
  plan.model.seq_len = 8192;
  plan.cluster.nodes = 2048;
  plan.cluster.gpus_per_node = 8;
  plan.cluster.nvlink_bandwidth = 450e9;
  plan.cluster.network_bandwidth = 50e9;
  plan.parallel.tp = 8;
  plan.parallel.etp = 8;
  plan.parallel.pp = 16;
  plan.parallel.dp = 128;
  plan.pipeline.account_for_embedding = true;
  plan.pipeline.account_for_loss = true;  // 126 + 2 = 128 = 16 · 8

  constexpr int kRuns = 20;
  double best_layout = 1e9, best_json = 1e9, best_total = 1e9;
  size_t bytes = 0;
  for (int i = 0; i < kRuns; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    std::string error;
    auto layout = BuildLayout(plan, &error);
    Topology topology = AnalyzeTopology(*layout);
    auto partition = BuildPartition(plan, nullptr);
    auto t1 = std::chrono::steady_clock::now();
    std::string json = ExplainJson(ExplainInput{plan, *layout, topology, *partition}, std::nullopt);
    auto t2 = std::chrono::steady_clock::now();
    bytes = json.size();
    best_layout = std::min(best_layout, std::chrono::duration<double, std::milli>(t1 - t0).count());
    best_json = std::min(best_json, std::chrono::duration<double, std::milli>(t2 - t1).count());
    best_total = std::min(best_total, std::chrono::duration<double, std::milli>(t2 - t0).count());
  }
  std::printf("llama3 405B, 16,384 ranks (tp 8, pp 16, dp 128), best of %d:\n", kRuns);
  std::printf("  layout + topology + partition  %8.2f ms\n", best_layout);
  std::printf("  JSON document (%zu bytes)    %8.2f ms\n", bytes, best_json);
  std::printf("  total                          %8.2f ms\n", best_total);
  return 0;
}
