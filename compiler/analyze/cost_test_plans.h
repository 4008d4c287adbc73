// Plans built in C++ for the cost-model unit tests (no parser needed): Korthikanti's GPT
// shapes, Llama 3 70B and DeepSeek-V2 on DGX A100 / H100 clusters. Test-only helpers.
#ifndef PARAPLAN_COMPILER_ANALYZE_COST_TEST_PLANS_H_
#define PARAPLAN_COMPILER_ANALYZE_COST_TEST_PLANS_H_

#include "compiler/plan/plan.h"

namespace paraplan::testing {

inline constexpr int64_t kGiB = int64_t{1} << 30;

inline ClusterSpec DgxA100(int64_t nodes) {
  ClusterSpec c;
  c.name = "dgx_a100";
  c.gpu = {"a100_sxm4_80gb", 80 * kGiB, 312e12, 312e12, 0, 2.039e12};
  c.nodes = nodes;
  c.gpus_per_node = 8;
  c.nvlink_bandwidth = 300e9;
  c.network_bandwidth = 25e9;
  return c;
}

inline ClusterSpec DgxH100(int64_t nodes) {
  ClusterSpec c;
  c.name = "dgx_h100";
  c.gpu = {"h100_sxm", 80 * kGiB, 989e12, 989e12, 1979e12, 3.35e12};
  c.nodes = nodes;
  c.gpus_per_node = 8;
  c.nvlink_bandwidth = 450e9;
  c.network_bandwidth = 50e9;
  return c;
}

// Korthikanti's GPT: LayerNorm, GeLU MLP with f = 4h, learned positions, vocab 51200.
inline ModelSpec Gpt(int64_t layers, int64_t hidden, int64_t heads, int64_t seq = 2048) {
  ModelSpec m;
  m.name = "gpt";
  m.layers = layers;
  m.hidden = hidden;
  m.ffn_hidden = 4 * hidden;
  m.heads = heads;
  m.kv_heads = heads;
  m.head_dim = hidden / heads;
  m.vocab = 51200;
  m.seq_len = seq;
  m.norm = Norm::kLayerNorm;
  m.activation = Activation::kGelu;
  m.position = Position::kLearned;
  m.tied_embeddings = true;
  return m;
}

inline ModelSpec Llama3Of70B() {
  ModelSpec m;
  m.name = "llama3_70b";
  m.layers = 80;
  m.hidden = 8192;
  m.ffn_hidden = 28672;
  m.heads = 64;
  m.kv_heads = 8;
  m.head_dim = 128;
  m.vocab = 128256;
  m.seq_len = 8192;
  return m;
}

inline ModelSpec DeepSeekV2() {
  ModelSpec m;
  m.name = "deepseek_v2";
  m.layers = 60;
  m.hidden = 5120;
  m.ffn_hidden = 12288;
  m.heads = 128;
  m.kv_heads = 128;
  m.head_dim = 128;
  m.vocab = 102400;
  m.seq_len = 4096;
  m.experts = 160;
  m.topk = 6;
  m.moe_ffn_hidden = 1536;
  m.shared_experts = 2;
  m.dense_layers = 1;
  m.q_lora_rank = 1536;
  m.kv_lora_rank = 512;
  m.qk_nope_head_dim = 128;
  m.qk_rope_head_dim = 64;
  m.v_head_dim = 128;
  return m;
}

// A resolved plan: dp = world / (tp·pp·cp), etp = tp unless given. (Test fixture: its callers
// spell out the four sizes positionally, as the tables they come from do.)
// NOLINTNEXTLINE(bugprone-easily-swappable-parameters)
inline Plan MakePlan(ModelSpec model, ClusterSpec cluster, int64_t tp, int64_t pp, int64_t global,
                     int64_t micro) {
  Plan p;
  p.name = "test";
  p.model = std::move(model);
  p.cluster = std::move(cluster);
  p.parallel.tp = tp;
  p.parallel.etp = tp;
  p.parallel.pp = pp;
  p.parallel.dp = p.World() / (tp * pp);
  p.batch.global = global;
  p.batch.micro = micro;
  return p;
}

}  // namespace paraplan::testing

#endif  // PARAPLAN_COMPILER_ANALYZE_COST_TEST_PLANS_H_
