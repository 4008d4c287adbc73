// Pipeline partition: Megatron's even / accounted / uneven splits with and without virtual
// chunks (offsets checked against Megatron's get_transformer_layer_offset by hand), explicit
// lists, cost balancing, and Nanotron's greedy split.
#include "compiler/analyze/partition.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <numeric>

namespace paraplan {
namespace {

Plan SmallPlan(int64_t layers, int64_t pp, int64_t vpp = 1) {
  Plan p;
  p.model.layers = layers;
  p.model.hidden = 512;
  p.model.ffn_hidden = 1376;
  p.model.heads = 8;
  p.model.kv_heads = 8;
  p.model.head_dim = 64;
  p.model.vocab = 50257;
  p.model.seq_len = 1024;
  p.parallel.pp = pp;
  p.parallel.vpp = vpp;
  return p;
}

// (first, end) of every virtual stage in execution order.
std::vector<std::pair<int64_t, int64_t>> Ranges(const Partition& part) {
  std::vector<std::pair<int64_t, int64_t>> out;
  for (const PipelineChunk* c : part.VirtualStages())
    out.emplace_back(c->first_layer, c->end_layer);
  return out;
}

std::vector<int64_t> PerRankLayers(const Partition& part) {
  std::vector<int64_t> out;
  for (const PipelineStage& s : part.stages) out.push_back(s.layer_count());
  return out;
}

Partition MustBuild(const Plan& plan) {
  DiagnosticSink sink;
  auto part = BuildPartition(plan, &sink);
  REQUIRE_MESSAGE(part.has_value(),
                  (sink.diagnostics().empty() ? "" : sink.diagnostics()[0].message));
  CHECK(sink.diagnostics().empty());
  CHECK(part->Verify().empty());
  return *part;
}

TEST_CASE("even split: embedding on the first stage, loss on the last") {
  Partition part = MustBuild(SmallPlan(8, 4));
  CHECK(part.method == PartitionMethod::kEven);
  CHECK(PerRankLayers(part) == std::vector<int64_t>{2, 2, 2, 2});
  CHECK(part.stages[0].embedding);
  CHECK_FALSE(part.stages[0].loss);
  CHECK(part.stages[3].loss);
  CHECK_FALSE(part.stages[1].embedding);
  CHECK(part.ChunkOfLayer(5)->pp_rank == 2);
  CHECK(part.ChunkOfLayer(8) == nullptr);
}

TEST_CASE("virtual pipeline: chunk c of rank p holds virtual stage c·pp + p") {
  Partition part = MustBuild(SmallPlan(16, 4, 2));
  CHECK(part.Chunk(0, 0).first_layer == 0);
  CHECK(part.Chunk(1, 0).first_layer == 2);
  CHECK(part.Chunk(3, 0).end_layer == 8);
  CHECK(part.Chunk(0, 1).first_layer == 8);
  CHECK(part.Chunk(0, 1).end_layer == 10);
  CHECK(part.Chunk(3, 1).first_layer == 14);
  CHECK(part.Chunk(3, 1).loss);
  CHECK_FALSE(part.Chunk(3, 0).loss);
  CHECK(part.Chunk(0, 0).embedding);
  CHECK_FALSE(part.Chunk(0, 1).embedding);
  CHECK(part.stages[3].loss);
}

TEST_CASE("account_for_embedding/loss count as layers (62 + 2 on pp 4)") {
  Plan plan = SmallPlan(62, 4);
  plan.pipeline.account_for_embedding = true;
  plan.pipeline.account_for_loss = true;
  Partition part = MustBuild(plan);
  CHECK(part.method == PartitionMethod::kAccount);
  CHECK(PerRankLayers(part) == std::vector<int64_t>{15, 16, 16, 15});

  // With vpp: Megatron's offset = vp·total/vpp + pp_rank·per_virtual - 1 (embedding counted).
  Plan v = SmallPlan(30, 4, 2);
  v.pipeline.account_for_embedding = true;
  v.pipeline.account_for_loss = true;
  Partition pv = MustBuild(v);
  CHECK(Ranges(pv) ==
        std::vector<std::pair<int64_t, int64_t>>{
            {0, 3}, {3, 7}, {7, 11}, {11, 15}, {15, 19}, {19, 23}, {23, 27}, {27, 30}});

  // Too few layers for the accounted split: 60 + 2 over 4 does not divide.
  Plan bad = SmallPlan(60, 4);
  bad.pipeline.account_for_embedding = true;
  bad.pipeline.account_for_loss = true;
  DiagnosticSink sink;
  CHECK_FALSE(BuildPartition(bad, &sink).has_value());
  REQUIRE(sink.diagnostics().size() == 1);
  CHECK(sink.diagnostics()[0].kind == DiagKind::kPipelineSplitInvalid);
  CHECK(sink.diagnostics()[0].message.find("62 layers") != std::string::npos);
}

TEST_CASE("first/last stage layers: Megatron's uneven split, with chunks") {
  Plan plan = SmallPlan(30, 4);
  plan.pipeline.first_stage_layers = 6;
  plan.pipeline.last_stage_layers = 6;
  CHECK(PerRankLayers(MustBuild(plan)) == std::vector<int64_t>{6, 9, 9, 6});

  plan.parallel.vpp = 3;
  Partition part = MustBuild(plan);
  CHECK(part.method == PartitionMethod::kFirstLast);
  // Megatron: offset(rank 2, vp 1) = 1·10 + 2 + (2-1)·(6/2) = 15
  CHECK(part.Chunk(2, 1).first_layer == 15);
  CHECK(part.Chunk(2, 1).layer_count() == 3);
  CHECK(part.Chunk(0, 2).first_layer == 20);
  CHECK(part.Chunk(3, 2).end_layer == 30);

  Plan only_first = SmallPlan(10, 3);
  only_first.pipeline.first_stage_layers = 2;
  CHECK(PerRankLayers(MustBuild(only_first)) == std::vector<int64_t>{2, 4, 4});
}

TEST_CASE("explicit stage_layers: per rank, per virtual stage, and an empty stage") {
  Plan plan = SmallPlan(8, 2);
  plan.pipeline.stage_layers = {3, 5};
  Partition part = MustBuild(plan);
  CHECK(part.method == PartitionMethod::kExplicit);
  CHECK(PerRankLayers(part) == std::vector<int64_t>{3, 5});

  Plan v = SmallPlan(8, 2, 2);
  v.pipeline.stage_layers = {1, 3, 3, 1};  // virtual stages, chunk-major
  Partition pv = MustBuild(v);
  CHECK(pv.Chunk(1, 0).layer_count() == 3);
  CHECK(pv.Chunk(0, 1).first_layer == 4);
  CHECK(PerRankLayers(pv) == std::vector<int64_t>{4, 4});

  Plan empty = SmallPlan(8, 3);
  empty.pipeline.stage_layers = {4, 0, 4};
  DiagnosticSink sink;
  CHECK_FALSE(BuildPartition(empty, &sink).has_value());
  REQUIRE(sink.diagnostics().size() == 1);
  const Diagnostic& d = sink.diagnostics()[0];
  CHECK(d.kind == DiagKind::kPipelineStageEmpty);
  CHECK(d.message == "pipeline stage 1 holds no transformer layer, no embedding and no loss");
  CHECK(d.helps[0] == "spread the 8 layers: `stage_layers = [2, 3, 3]`");

  // A first stage with only the embedding is fine (Megatron's layout allows it).
  Plan emb_only = SmallPlan(8, 3);
  emb_only.pipeline.stage_layers = {0, 4, 4};
  CHECK(PerRankLayers(MustBuild(emb_only)) == std::vector<int64_t>{0, 4, 4});

  Plan wrong_sum = SmallPlan(9, 2);
  wrong_sum.pipeline.stage_layers = {4, 4};
  DiagnosticSink s2;
  CHECK_FALSE(BuildPartition(wrong_sum, &s2).has_value());
  REQUIRE(s2.diagnostics().size() == 1);
  CHECK(s2.diagnostics()[0].message ==
        "`stage_layers` [4, 4] sums to 8, but the model has 9 layers");
}

TEST_CASE("BalanceByCost minimises the most expensive stage and keeps a layer on each") {
  BlockCosts c;
  c.layers.assign(8, 10);
  c.head = 80;
  CHECK(BalanceByCost(c, 2) == std::vector<int64_t>{7, 1});
  c.head = 0;
  CHECK(BalanceByCost(c, 2) == std::vector<int64_t>{4, 4});
  c.layers.assign(10, 1);
  auto four = BalanceByCost(c, 4);
  REQUIRE(four.has_value());
  CHECK(*std::max_element(four->begin(), four->end()) == 3);
  CHECK(std::accumulate(four->begin(), four->end(), int64_t{0}) == 10);
  CHECK_FALSE(BalanceByCost(c, 11).has_value());
  c.embedding = 5;
  auto with_embedding = BalanceByCost(c, 2);  // 5 + k vs 10 - k: k = 2 or 3, worst 8
  REQUIRE(with_embedding.has_value());
  CHECK(std::max(5 + (*with_embedding)[0], (*with_embedding)[1]) == 8);

  // Long models take the bottleneck search; same bottleneck as the exact answer.
  BlockCosts big;
  big.layers.assign(1200, 7);
  big.head = 70;
  auto split = BalanceByCost(big, 100);
  REQUIRE(split.has_value());
  CHECK(split->size() == 100);
  CHECK(std::accumulate(split->begin(), split->end(), int64_t{0}) == 1200);
  CHECK(split->back() >= 1);
  int64_t worst = 0;
  for (size_t s = 0; s < split->size(); ++s) {
    worst = std::max(worst, (*split)[s] * 7 + (s + 1 == split->size() ? 70 : 0));
  }
  CHECK(worst == 91);  // 13 layers, or 3 layers + the head (91): ceil((8400 + 70) / 100) -> 91
}

TEST_CASE("balance = cost on a large-vocabulary model puts few layers beside the head") {
  Plan plan = SmallPlan(8, 2);
  plan.pipeline.balance = Balance::kCost;
  Partition part = MustBuild(plan);
  CHECK(part.method == PartitionMethod::kCost);
  auto per_rank = PerRankLayers(part);
  CHECK(per_rank[1] >= 1);
  CHECK(per_rank[0] > per_rank[1]);
  CHECK(part.stages[1].cost() >= part.costs.head);

  Plan too_few = SmallPlan(3, 4);
  too_few.pipeline.balance = Balance::kCost;
  DiagnosticSink sink;
  CHECK_FALSE(BuildPartition(too_few, &sink).has_value());
  REQUIRE(sink.diagnostics().size() == 1);
  CHECK(sink.diagnostics()[0].kind == DiagKind::kPipelineSplitInvalid);

  Plan mixed = SmallPlan(8, 2);
  mixed.pipeline.balance = Balance::kCost;
  mixed.pipeline.stage_layers = {4, 4};
  DiagnosticSink s2;
  CHECK_FALSE(BuildPartition(mixed, &s2).has_value());
  CHECK(s2.diagnostics().size() == 1);
}

TEST_CASE("Nanotron's greedy split: off-by-one per threshold, and a head that empties stage 1") {
  ModelSpec m = SmallPlan(8, 2).model;
  m.vocab = 1000;  // a light head: layers dominate
  NanotronSplit light = NanotronGreedySplit(m, 2);
  // The rank moves on only after the cumulative cost passes half: the fifth layer stays on 0.
  CHECK(light.layers == std::vector<int64_t>{5, 3});
  CHECK(light.head_rank == 1);

  m.vocab = 50257;  // 50,257 · 512 = 25,731,584 > 8 · 3,162,112 = 25,296,896
  NanotronSplit heavy = NanotronGreedySplit(m, 2);
  CHECK(heavy.layers == std::vector<int64_t>{8, 0});
  CHECK(heavy.head_rank == 0);
  CHECK(heavy.has_parameters == std::vector<bool>{true, false});

  Plan plan = SmallPlan(8, 2);
  plan.pipeline.balance = Balance::kNanotron;
  DiagnosticSink sink;
  CHECK_FALSE(BuildPartition(plan, &sink).has_value());
  REQUIRE(sink.diagnostics().size() == 1);
  const Diagnostic& d = sink.diagnostics()[0];
  CHECK(d.kind == DiagKind::kNanotronBalanceEmptyStage);
  CHECK(d.message == "Nanotron's cost balancing leaves pipeline stage 1 without a trainable layer");
  bool saw_layer = false, saw_head = false;
  for (const auto& [expr, value] : d.values) {
    if (value == "4·8·64·512 + 3·1376·512 = 3,162,112") saw_layer = true;
    if (value == "50257·512 = 25,731,584") saw_head = true;
  }
  CHECK(saw_layer);
  CHECK(saw_head);
  REQUIRE(!d.helps.empty());
  CHECK(d.helps[0].find("use `balance = cost`") == 0);

  // When Nanotron's split is sound it is used as is.
  Plan ok = SmallPlan(8, 2);
  ok.model.vocab = 1000;
  ok.pipeline.balance = Balance::kNanotron;
  Partition part = MustBuild(ok);
  CHECK(PerRankLayers(part) == std::vector<int64_t>{5, 3});
}

TEST_CASE("block costs: GQA, MoE layers after the dense ones, MLA") {
  ModelSpec m = SmallPlan(4, 1).model;
  BlockCosts dense = ComputeBlockCosts(m);
  REQUIRE(dense.layers.size() == 4);
  // 2·512·(512 + 2·512) + 2·512·512 + 2·1024·512 + 2·3·1376·512
  CHECK(dense.layers[0] == 2 * 512 * 1536 + 2 * 512 * 512 + 2 * 1024 * 512 + 6 * 1376 * 512);
  CHECK(dense.head == 2 * 512 * 50257);
  m.kv_heads = 2;
  CHECK(ComputeBlockCosts(m).layers[0] < dense.layers[0]);
  m.experts = 8;
  m.topk = 2;
  m.moe_ffn_hidden = 1376;
  m.dense_layers = 1;
  BlockCosts moe = ComputeBlockCosts(m);
  CHECK(moe.layers[1] > moe.layers[0]);
  CHECK(moe.layers[1] == moe.layers[3]);
  // A multi-token-prediction module rides with the output layer: a layer of the last kind, its
  // 2h -> h projection (2 · 2h · h) and the output layer again.
  m.mtp_layers = 1;
  const int64_t h = m.hidden;
  CHECK(ComputeBlockCosts(m).head == 2 * moe.head + moe.layers[3] + 4 * h * h);
}

}  // namespace
}  // namespace paraplan
