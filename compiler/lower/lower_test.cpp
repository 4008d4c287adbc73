// Lowering whole plans: every configuration verifies, the bodies carry the collectives the
// parallelism needs, and mutated programs are caught with messages naming ranks and ops.
#include "compiler/lower/lower.h"

#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <set>

#include "compiler/lower/memory_plan.h"
#include "compiler/lower/print.h"
#include "runtime/format/ops.h"
#include "runtime/verify/verify.h"

namespace paraplan::lower {

// Shared with the other lower tests.
Plan TinyPlan(int64_t tp, int64_t pp, int64_t dp, Schedule schedule = Schedule::k1F1B,
              int64_t vpp = 1) {
  Plan plan;
  plan.name = "tiny";
  ModelSpec& m = plan.model;
  m.name = "llama_tiny";
  m.layers = 8;
  m.hidden = 64;
  m.ffn_hidden = 128;
  m.heads = 4;
  m.kv_heads = 2;
  m.head_dim = 16;
  m.vocab = 300;
  m.seq_len = 32;
  plan.cluster.nodes = 1;
  plan.cluster.gpus_per_node = tp * pp * dp;
  plan.parallel.tp = tp;
  plan.parallel.etp = tp;
  plan.parallel.pp = pp;
  plan.parallel.dp = dp;
  plan.parallel.vpp = vpp;
  plan.pipeline.schedule = schedule;
  plan.batch.micro = 2;
  plan.batch.global = 2 * dp * 8;  // 8 microbatches
  plan.train.steps = 5;
  return plan;
}

Plan Gpt2Plan(int64_t tp, int64_t pp, int64_t dp) {
  Plan plan = TinyPlan(tp, pp, dp);
  plan.model.name = "gpt2_tiny";
  plan.model.norm = Norm::kLayerNorm;
  plan.model.activation = Activation::kGelu;
  plan.model.position = Position::kLearned;
  plan.model.tied_embeddings = true;
  plan.model.kv_heads = plan.model.heads;
  return plan;
}

// Multi-head latent attention (DeepSeek-V2) on the tiny model: 4 heads of 24 + 8 query/key
// columns and 16 value columns; latents of rank 32 (queries, or none) and 16 (keys and values).
Plan MlaPlan(int64_t tp, int64_t pp, int64_t dp, int64_t q_lora_rank = 32) {
  Plan plan = TinyPlan(tp, pp, dp);
  ModelSpec& m = plan.model;
  m.name = "mla_tiny";
  m.kv_heads = m.heads;
  m.q_lora_rank = q_lora_rank;
  m.kv_lora_rank = 16;
  m.qk_nope_head_dim = 24;
  m.qk_rope_head_dim = 8;
  m.v_head_dim = 16;
  m.head_dim = 32;
  return plan;
}

namespace {

Program MustLowerWith(const Plan& plan, const LowerOptions& options) {
  DiagnosticSink sink;
  std::optional<Program> p = LowerPlan(plan, options, sink);
  for (const Diagnostic& d : sink.diagnostics()) {
    MESSAGE(d.message);
    for (const auto& n : d.notes) MESSAGE(n);
  }
  REQUIRE(p.has_value());
  return std::move(*p);
}

Program MustLower(const Plan& plan, bool verify = true) {
  LowerOptions options;
  options.verify = verify;
  return MustLowerWith(plan, options);
}

int CountOps(const Body& body, OpKind kind, CommKind comm) {
  return static_cast<int>(std::count_if(body.ops.begin(), body.ops.end(), [&](const Op& op) {
    return op.kind == kind && op.comm == comm;
  }));
}

std::string Joined(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += x + "\n";
  return s;
}

TEST_CASE("configurations lower and verify") {
  struct Case {
    const char* name;
    Plan plan;
  };
  std::vector<Case> cases = {
      {"single rank", TinyPlan(1, 1, 1)},
      {"tp2", TinyPlan(2, 1, 1)},
      {"pp2 1f1b", TinyPlan(1, 2, 1)},
      {"pp4 gpipe", TinyPlan(1, 4, 1, Schedule::kGpipe)},
      {"pp2 vpp2 interleaved", TinyPlan(1, 2, 1, Schedule::kInterleaved1F1B, 2)},
      {"pp4 vpp2 interleaved", TinyPlan(1, 4, 1, Schedule::kInterleaved1F1B, 2)},
      {"dp2", TinyPlan(1, 1, 2)},
      {"tp2 pp2 dp2", TinyPlan(2, 2, 2)},
      {"gpt2 tp2 pp2", Gpt2Plan(2, 2, 1)},
      {"gpt2 single", Gpt2Plan(1, 1, 1)},
  };
  Plan sp = TinyPlan(2, 2, 2);
  sp.parallel.sp = true;
  sp.optimizer.zero = 1;
  cases.push_back({"tp2 pp2 dp2 sp zero1", sp});
  Plan z3 = TinyPlan(1, 2, 2);
  z3.optimizer.zero = 3;
  cases.push_back({"pp2 dp2 zero3", z3});
  Plan gsp = Gpt2Plan(2, 2, 2);
  gsp.parallel.sp = true;
  gsp.optimizer.zero = 2;
  cases.push_back({"gpt2 tp2 pp2 dp2 sp zero2", gsp});
  for (const Case& c : cases) {
    CAPTURE(c.name);
    Program p = MustLower(c.plan);
    CHECK(p.world_size == c.plan.parallel.tp * c.plan.parallel.pp * c.plan.parallel.dp);
    CHECK(static_cast<int64_t>(p.roles.size()) == c.plan.parallel.pp);
    VerifyStats stats;
    CHECK(Joined(VerifyWorld(p, &stats)) == "");
    CHECK(stats.simulated_ops > 0);
    // Round trip through the file format.
    std::vector<uint8_t> bytes = ToFlatBuffer(p);
    std::string error;
    std::optional<Program> back = FromFlatBuffer(bytes.data(), bytes.size(), &error);
    REQUIRE_MESSAGE(back.has_value(), error);
    CHECK(Joined(VerifyWorld(*back)) == "");
    CHECK(back->roles[0].schedule.size() == p.roles[0].schedule.size());
  }
}

TEST_CASE(
    "tensor parallel bodies: an all-reduce after every row-parallel linear, forward and backward") {
  Program p = MustLower(TinyPlan(2, 1, 1));
  const Role& role = p.roles[0];
  const Body& fwd = role.bodies[role.chunks[0].forward];
  const Body& bwd = role.bodies[role.chunks[0].backward];
  // Forward: embedding + 2 per layer (attention, mlp) + loss max + loss sums.
  CHECK(CountOps(fwd, OpKind::AllReduce, CommKind::Tp) == 1 + 2 * 8 + 2);
  // Backward: 2 per layer (norm inputs) + final norm input.
  CHECK(CountOps(bwd, OpKind::AllReduce, CommKind::Tp) == 2 * 8 + 1);
  CHECK(CountOps(fwd, OpKind::AllGather, CommKind::Tp) == 0);
}

TEST_CASE(
    "sequence parallel bodies: all-gather before and reduce-scatter after every tensor-parallel "
    "block") {
  Plan plan = TinyPlan(2, 1, 1);
  plan.parallel.sp = true;
  Program p = MustLower(plan);
  const Role& role = p.roles[0];
  const Body& fwd = role.bodies[role.chunks[0].forward];
  const Body& bwd = role.bodies[role.chunks[0].backward];
  CHECK(CountOps(fwd, OpKind::AllGather, CommKind::Tp) == 2 * 8 + 1);
  CHECK(CountOps(fwd, OpKind::ReduceScatter, CommKind::Tp) == 1 + 2 * 8);
  // (The norms' outputs, kept on the rank's rows, are gathered again before the weight
  // gradients, beside the output gradients.)
  CHECK(CountOps(bwd, OpKind::AllGather, CommKind::Tp) == 4 * 8 + 1);
  CHECK(CountOps(bwd, OpKind::ReduceScatter, CommKind::Tp) == 2 * 8 + 1);
  // Norm weights are partial per rank under sp: all-reduced over tp in reduce_grads.
  const Body& reduce = role.bodies[role.schedule[role.schedule.size() - 2].ints[0]];
  CHECK(CountOps(reduce, OpKind::AllReduce, CommKind::Tp) == 2 * 8 + 1);
}

TEST_CASE("data parallel and ZeRO steps") {
  Plan plan = TinyPlan(1, 1, 2);
  for (int zero : {0, 1, 2, 3}) {
    CAPTURE(zero);
    plan.optimizer.zero = zero;
    Program p = MustLower(plan);
    const Role& role = p.roles[0];
    const Body& reduce = role.bodies[role.schedule[role.schedule.size() - 2].ints[0]];
    const Body& step = role.bodies[role.schedule.back().ints[0]];
    const Body& fwd = role.bodies[role.chunks[0].forward];
    const Body& bwd = role.bodies[role.chunks[0].backward];
    // ZeRO 0/1: one bucket per chunk, one gradient reduction per step. ZeRO 2/3: a bucket per
    // layer (and per embedding, final norm, output layer), reduce-scattered into its grad shard
    // as soon as the backward body has finished with it.
    const int buckets = static_cast<int>(role.buckets.size());
    CHECK(buckets == (zero <= 1 ? 1 : 8 + 3));
    CHECK(CountOps(reduce, zero == 0 ? OpKind::AllReduce : OpKind::ReduceScatter, CommKind::Dp) ==
          (zero <= 1 ? 1 : 0));
    CHECK(CountOps(bwd, OpKind::ReduceScatter, CommKind::Dp) == (zero >= 2 ? buckets : 0));
    CHECK(CountOps(bwd, OpKind::Fill, CommKind::None) == (zero >= 2 ? buckets : 0));
    CHECK(CountOps(step, OpKind::AllGather, CommKind::Dp) ==
          (zero == 1 || zero == 2 ? buckets : 0));
    CHECK(CountOps(step, OpKind::AdamW, zero == 0 ? CommKind::None : CommKind::Dp) == buckets);
    CHECK(CountOps(step, OpKind::AllReduce, zero == 0 ? CommKind::Mp : CommKind::World) ==
          (zero == 0 ? 0 : 1));
    // ZeRO-3: each bucket is gathered in the body right before its first use, in the forward
    // and again in the backward; no schedule-level GatherParams.
    CHECK(CountOps(fwd, OpKind::AllGather, CommKind::Dp) == (zero == 3 ? buckets : 0));
    // (The backward reads every weight but the word embedding's: EmbeddingBackward needs ids only.)
    CHECK(CountOps(bwd, OpKind::AllGather, CommKind::Dp) == (zero == 3 ? buckets - 1 : 0));
    CHECK(std::none_of(role.schedule.begin(), role.schedule.end(),
                       [](const Op& op) { return op.kind == OpKind::GatherParams; }));
    int64_t param_bytes = 0, grad_bytes = 0, largest_params = 0, largest_grads = 0;
    for (const Bucket& b : role.buckets) {
      CHECK(b.elements % 2 == 0);
      CHECK(b.shard_elements == (zero == 0 ? b.elements : b.elements / 2));
      CHECK((b.grad_shard >= 0) == (zero >= 2));
      CHECK((b.param_shard >= 0) == (zero >= 3));
      param_bytes += b.elements * 2;
      grad_bytes += b.elements * 4;
      largest_params = std::max(largest_params, b.elements * 2);
      largest_grads = std::max(largest_grads, b.elements * 4);
    }
    // Memory: the persistent shards, and at most one layer's full grads (and gathered params)
    // live inside a body at a time.
    MemoryBreakdown m = MeasureMemory(role);
    CHECK(m.params == (zero >= 3 ? param_bytes / 2 : param_bytes));
    CHECK(m.grads == (zero >= 2 ? grad_bytes / 2 : grad_bytes));
    CHECK(m.full_grads == (zero >= 2 ? largest_grads : 0));
    CHECK(m.gathered_params == (zero >= 3 ? largest_params : 0));
    CHECK(role.peak_bytes == m.Total());
  }
}

TEST_CASE("ZeRO-3 with interleaving: the layers' gathered buckets share bytes") {
  Plan plan = TinyPlan(1, 2, 2, Schedule::kInterleaved1F1B, 2);
  plan.optimizer.zero = 3;
  plan.parallel.sp = true;
  Program p = MustLower(plan);
  for (const Role& role : p.roles) {
    std::map<int64_t, int> offsets;  // layer param buckets by offset
    int64_t largest = 0;
    for (const Bucket& b : role.buckets) {
      const Buffer& params = role.buffers[b.params];
      if (params.name.find(".layers.") == std::string::npos) continue;
      offsets[params.offset]++;
      largest = std::max(largest, params.bytes);
    }
    REQUIRE(!offsets.empty());
    CHECK(offsets.size() < 4);  // 4 layers per role, never live together: they reuse bytes
    MemoryBreakdown m = MeasureMemory(role);
    CHECK(m.gathered_params <= 2 * largest);
    // In every chunk body, a bucket's AllGather comes before any op that reads its params.
    for (const Chunk& c : role.chunks) {
      for (int32_t bi : {c.forward, c.backward}) {
        std::set<int32_t> gathered;
        for (const Op& op : role.bodies[bi].ops) {
          if (op.kind == OpKind::AllGather && op.comm == CommKind::Dp)
            gathered.insert(op.outputs[0]);
          for (int32_t x : op.inputs) {
            const Buffer& buf = role.buffers[x];
            if (buf.kind == BufferKind::Param && buf.view_of >= 0)
              CHECK(gathered.count(buf.view_of) == 1);
          }
        }
      }
    }
  }
}

TEST_CASE(
    "ZeRO-2 with tied embeddings across the pipeline: the embedding has its own bucket on both "
    "ends") {
  Plan plan = Gpt2Plan(1, 2, 2);
  plan.optimizer.zero = 2;
  Program p = MustLower(plan);
  std::vector<int64_t> sizes;
  for (const Role& role : p.roles) {
    auto word = std::find_if(role.params.begin(), role.params.end(),
                             [](const Param& x) { return x.key == 0; });
    REQUIRE(word != role.params.end());
    auto bucket = std::find_if(role.buckets.begin(), role.buckets.end(), [&](const Bucket& b) {
      return role.buffers[word->grad].view_of == b.grads;
    });
    REQUIRE(bucket != role.buckets.end());
    sizes.push_back(bucket->elements);
    const Body& reduce = role.bodies[role.schedule[role.schedule.size() - 2].ints[0]];
    REQUIRE(CountOps(reduce, OpKind::AllReduce, CommKind::Embedding) == 1);
    const Op& op = *std::find_if(reduce.ops.begin(), reduce.ops.end(),
                                 [](const Op& o) { return o.comm == CommKind::Embedding; });
    CHECK(op.inputs[0] == bucket->grad_shard);
  }
  REQUIRE(sizes.size() == 2);
  CHECK(sizes[0] == sizes[1]);
}

TEST_CASE(
    "tied embeddings across the pipeline: a copy on the last stage, summed over the embedding "
    "group") {
  Program p = MustLower(Gpt2Plan(1, 2, 1));
  const Role& last = p.roles[1];
  auto copy = std::find_if(last.params.begin(), last.params.end(),
                           [](const Param& x) { return x.key == 0; });
  REQUIRE(copy != last.params.end());
  CHECK_FALSE(copy->counts_in_norm);
  for (const Role& role : p.roles) {
    const Body& reduce = role.bodies[role.schedule[role.schedule.size() - 2].ints[0]];
    CHECK(CountOps(reduce, OpKind::AllReduce, CommKind::Embedding) == 1);
  }
  CHECK(p.ranks[0].comms[static_cast<int>(CommKind::Embedding)] >= 0);
}

TEST_CASE("slots: 1f1b keeps p - r microbatches in flight on rank r") {
  Plan plan = TinyPlan(1, 4, 1);
  Program p = MustLower(plan);
  for (int r = 0; r < 4; ++r) CHECK(p.roles[r].chunks[0].slots == 4 - r);
  Plan gp = TinyPlan(1, 4, 1, Schedule::kGpipe);
  Program g = MustLower(gp);
  CHECK(g.roles[0].chunks[0].slots == 8);  // gpipe holds every microbatch
}

TEST_CASE("memory plan: buffers inside the arena, live scratch buffers never overlap") {
  Plan mla = MlaPlan(2, 2, 1);
  mla.parallel.sp = true;
  for (const Program& p : {MustLower(TinyPlan(2, 2, 1)), MustLower(mla)})
    for (const Role& role : p.roles) {
      CHECK(role.peak_bytes <= role.arena_bytes);
      CHECK(role.fp32_arena_bytes >= role.arena_bytes);
      for (const Buffer& b : role.buffers) {
        CHECK(b.offset + (b.slots - 1) * b.slot_stride + b.bytes <= role.arena_bytes);
        bool inside = b.offset + (b.slots - 1) * b.slot_stride + b.bytes <= role.arena_bytes;
        CHECK(inside);
      }
    }
}

TEST_CASE(
    "memory plan: no two buffers live at the same op of a body share bytes (scratch, ZeRO "
    "buckets)") {
  std::vector<Plan> plans;
  for (int zero : {0, 2, 3}) {
    Plan plan = TinyPlan(2, 2, 2, Schedule::kInterleaved1F1B, 2);
    plan.parallel.sp = true;
    plan.optimizer.zero = zero;
    plan.recompute = zero == 3 ? Recompute::kFull : Recompute::kSelective;
    plans.push_back(plan);
  }
  plans.push_back(Gpt2Plan(1, 2, 2));
  plans.back().optimizer.zero = 3;
  // Experts split over the Tp groups (etp = tp): the gathered rows, routed buffers and partial
  // outputs of the MoE layers, with full recompute and ZeRO-3.
  plans.push_back(TinyPlan(2, 2, 2));
  plans.back().parallel.sp = true;
  plans.back().parallel.etp = 2;
  plans.back().model.experts = 4;
  plans.back().model.topk = 2;
  plans.back().model.moe_ffn_hidden = 64;
  plans.back().optimizer.zero = 3;
  plans.back().recompute = Recompute::kFull;
  for (Recompute recompute : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
    plans.push_back(MlaPlan(2, 2, 2, recompute == Recompute::kFull ? 0 : 32));
    plans.back().parallel.sp = true;
    plans.back().optimizer.zero = recompute == Recompute::kNone ? 3 : 1;
    plans.back().recompute = recompute;
  }
  for (const Plan& plan : plans) {
    Program p = MustLower(plan);
    for (const Role& role : p.roles) {
      CAPTURE(role.name);
      CHECK(role.peak_bytes <= role.arena_bytes);
      // Every buffer an op of a body touches stands for its storage (a view for its parent).
      auto storage = [&](int32_t b) {
        while (role.buffers[b].view_of >= 0) b = role.buffers[b].view_of;
        return b;
      };
      for (const Body& body : role.bodies) {
        std::map<int32_t, std::pair<size_t, size_t>> live;  // body-scoped storage -> first, last op
        for (size_t i = 0; i < body.ops.size(); ++i)
          for (const auto* list : {&body.ops[i].inputs, &body.ops[i].outputs})
            for (int32_t x : *list) {
              if (x < 0) continue;  // an operand left out (MoeUnpermute without weights)
              const int32_t b = storage(x);
              const Buffer& buf = role.buffers[b];
              const bool scoped =
                  buf.kind == BufferKind::Scratch ||
                  std::any_of(role.buckets.begin(), role.buckets.end(), [&](const Bucket& k) {
                    return (k.param_shard >= 0 && k.params == b) ||
                           (k.grad_shard >= 0 && k.grads == b);
                  });
              if (!scoped) continue;
              auto [it, fresh] = live.insert({b, {i, i}});
              if (!fresh) it->second.second = i;
            }
        for (auto a = live.begin(); a != live.end(); ++a)
          for (auto c = std::next(a); c != live.end(); ++c) {
            const bool same_time =
                !(a->second.second < c->second.first || c->second.second < a->second.first);
            const Buffer& x = role.buffers[a->first];
            const Buffer& y = role.buffers[c->first];
            const bool same_bytes = x.offset < y.offset + y.bytes && y.offset < x.offset + x.bytes;
            const bool same_bytes32 = x.fp32_offset < y.fp32_offset + y.fp32_bytes &&
                                      y.fp32_offset < x.fp32_offset + x.fp32_bytes;
            if (same_time && (same_bytes || same_bytes32))
              FAIL_CHECK(body.name << ": " << x.name << " and " << y.name);
          }
      }
    }
  }
}

// --- mutations ---------------------------------------------------------------------------

// Gives `rank` its own copy of its role, so a mutation touches that rank only.
Role& SplitRole(Program& p, int32_t rank) {
  p.roles.push_back(p.roles[p.ranks[rank].role]);
  p.roles.back().name += "-mutated";
  p.ranks[rank].role = static_cast<int32_t>(p.roles.size() - 1);
  return p.roles.back();
}

TEST_CASE("mutation: a dropped receive is caught, naming both ranks") {
  Program p = MustLower(TinyPlan(1, 2, 1), false);
  Role& role = SplitRole(p, 1);
  auto it = std::find_if(role.schedule.begin(), role.schedule.end(),
                         [](const Op& op) { return op.kind == OpKind::RecvActivation; });
  REQUIRE(it != role.schedule.end());
  role.schedule.erase(it);
  std::string errors = Joined(VerifyWorld(p));
  CHECK(errors.find(
            "rank 0 (stage0) sends 8 transfers to rank 1 (stage1-mutated), which receives 7") !=
        std::string::npos);
}

TEST_CASE("mutation: a receive moved later is a deadlock, reported with the waiting ops") {
  Program p = MustLower(TinyPlan(1, 2, 1), false);
  Role& role = SplitRole(p, 1);
  // Move the first recv_activation behind the first backward: forward 0 then has no input.
  auto recv = std::find_if(role.schedule.begin(), role.schedule.end(),
                           [](const Op& op) { return op.kind == OpKind::RecvActivation; });
  Op moved = *recv;
  moved.ints[prog::kP2pGroup] = 0;
  role.schedule.erase(recv);
  auto fwd = std::find_if(role.schedule.begin(), role.schedule.end(),
                          [](const Op& op) { return op.kind == OpKind::Forward; });
  // Instead of the recv before forward 0, keep order of pairs but make rank 1 wait on a grad
  // it can only get after sending its activation: swap to a receive of a grad first.
  Op bogus = moved;
  bogus.kind = OpKind::RecvGrad;
  bogus.outputs = {role.chunks[0].grad};
  role.schedule.insert(fwd, bogus);
  std::string errors = Joined(VerifyWorld(p));
  CHECK(errors.find("rank 1 (stage1-mutated)") != std::string::npos);
  CHECK(errors.find("recv_grad(microbatch 0, chunk 0, peer 0)") != std::string::npos);
}

TEST_CASE(
    "mutation: swapped collectives on one rank are caught, naming the communicator and both "
    "ranks") {
  Program p = MustLower(TinyPlan(2, 2, 1), false);
  Role& role = SplitRole(p, 0);
  // Two different collectives in rank 0's optimizer step: grad-norm all-reduce over mp and
  // nothing else... use the forward body instead: swap a tp all-reduce with the max all-reduce.
  Body& step = role.bodies[role.schedule.back().ints[0]];
  // Add a second cross-role collective so that two exist, then swap on this rank only.
  Op extra{OpKind::AllReduce, step.ops[1].inputs, step.ops[1].outputs,
           CommKind::Mp,      {prog::kReduceMax}, {}};
  for (Role& r : p.roles) {
    Body& s = r.bodies[r.schedule.back().ints[0]];
    s.ops.insert(s.ops.begin() + 2, extra);
  }
  std::swap(step.ops[1], step.ops[2]);
  std::string errors = Joined(VerifyWorld(p));
  CHECK(errors.find("collective #0 of mp communicator") != std::string::npos);
  CHECK(errors.find("rank 0 (stage0-mutated)") != std::string::npos);
  CHECK(errors.find("all_reduce[mp, max]") != std::string::npos);
  CHECK(errors.find("all_reduce[mp, sum]") != std::string::npos);
}

// pp 2, vpp 3: the first rank's middle chunk would take a slot for its next input before the
// backward frees one; it receives into a landing buffer that its forward copies into the slot.
TEST_CASE(
    "landing buffers: the first rank's middle chunk of pp 2, vpp 3 receives outside its slots") {
  Plan plan = TinyPlan(1, 2, 1, Schedule::kInterleaved1F1B, 3);
  plan.model.layers = 6;
  Program p = MustLower(plan);
  const Role& first = p.roles[0];
  REQUIRE(first.chunks.size() == 3);
  const int32_t landing = LandingBuffer(first, first.chunks[1]);
  REQUIRE(landing >= 0);
  CHECK(first.buffers[landing].kind == BufferKind::Persistent);
  CHECK(first.buffers[landing].shape == first.buffers[first.chunks[1].input].shape);
  CHECK(LandingBuffer(first, first.chunks[0]) < 0);
  CHECK(LandingBuffer(first, first.chunks[2]) < 0);  // its receives would not raise its slots
  for (const Role& role : p.roles)
    if (role.pipeline_rank != 0)
      for (const Chunk& c : role.chunks) CHECK(LandingBuffer(role, c) < 0);
  // Every receive of the chunk names the landing buffer and the slot its forward takes.
  std::map<int64_t, int64_t> received;  // microbatch -> slot
  int receives = 0;
  for (const Op& op : first.schedule) {
    const prog::StepAttrs a = prog::DecodeStepAttrs(op);
    if (a.chunk != 1) continue;
    if (op.kind == OpKind::RecvActivation) {
      CHECK(op.outputs == std::vector<int32_t>{landing});
      received[a.microbatch] = a.slot;
      ++receives;
    }
    if (op.kind == OpKind::Forward) CHECK(received.at(a.microbatch) == a.slot);
  }
  CHECK(receives == 8);
  // Counted with slots per chunk (slot pools off), the landing buffer saves the chunk a slot.
  LowerOptions per_chunk;
  per_chunk.slot_pools = false;
  LowerOptions slots_only = per_chunk;
  slots_only.landing_buffers = false;
  DiagnosticSink sink;
  std::optional<Program> with = LowerPlan(plan, per_chunk, sink);
  std::optional<Program> without = LowerPlan(plan, slots_only, sink);
  REQUIRE(with.has_value());
  REQUIRE(without.has_value());
  CHECK(with->roles[0].chunks[1].slots + 1 == without->roles[0].chunks[1].slots);
}

// pp 2, vpp 3: each rank's chunks share one pool of stash slots (PoolChunkSlots), fewer than
// the chunks' own slots together; the verifier proves that a slot is taken by one microbatch at
// a time across the pool, and that the pool's buffers lie in one run of slots.
TEST_CASE("slot pools: the chunks of a rank share their slots, one microbatch per slot") {
  Plan plan = TinyPlan(1, 2, 1, Schedule::kInterleaved1F1B, 3);
  plan.model.layers = 6;
  Program p = MustLower(plan, false);
  CHECK(VerifyWorld(p).empty());
  LowerOptions per_chunk;
  per_chunk.slot_pools = false;
  const Program own = MustLowerWith(plan, per_chunk);
  int pooled_roles = 0;
  for (size_t r = 0; r < p.roles.size(); ++r) {
    const Role& role = p.roles[r];
    int32_t pool_slots = 0, own_slots = 0, members = 0;
    for (size_t c = 0; c < role.chunks.size(); ++c) {
      if (role.chunks[c].pool < 0) continue;
      ++members;
      pool_slots = role.chunks[c].slots;
      own_slots += own.roles[r].chunks[c].slots;
    }
    if (members == 0) continue;
    ++pooled_roles;
    CHECK(members >= 2);
    CHECK(pool_slots < own_slots);
    CHECK(MeasureMemory(role).stash < MeasureMemory(own.roles[r]).stash);
  }
  CHECK(pooled_roles > 0);
  CHECK(PrintProgram(p).find(" slots (pool 0)") != std::string::npos);  // planc dump

  // The role and the first op at which a microbatch of one pooled chunk takes a slot while a
  // microbatch of another pooled chunk holds a different one.
  size_t role_index = p.roles.size(), at = 0;
  int64_t other_slot = -1;
  for (size_t r = 0; r < p.roles.size() && other_slot < 0; ++r) {
    const Role& role = p.roles[r];
    std::map<std::pair<int64_t, int64_t>, int64_t> held;
    for (size_t i = 0; i < role.schedule.size() && other_slot < 0; ++i) {
      const Op& op = role.schedule[i];
      if (op.kind != OpKind::Forward) continue;
      const prog::StepAttrs a = prog::DecodeStepAttrs(op);
      if (role.chunks[a.chunk].pool < 0) continue;
      for (const auto& [key, slot] : held)
        if (key.second != a.chunk && slot != a.slot && !held.count({a.microbatch, a.chunk})) {
          role_index = r, at = i, other_slot = slot;
          break;
        }
      held[{a.microbatch, a.chunk}] = a.slot;
    }
  }
  REQUIRE(other_slot >= 0);
  SUBCASE("a microbatch that takes a slot another chunk's microbatch holds") {
    Role& role = p.roles[role_index];
    const prog::StepAttrs moved = prog::DecodeStepAttrs(role.schedule[at]);
    for (Op& op : role.schedule) {
      const prog::StepAttrs a = prog::DecodeStepAttrs(op);
      if (op.kind != OpKind::ZeroGrads && op.kind != OpKind::ReduceGrads &&
          op.kind != OpKind::OptimizerStep && a.microbatch == moved.microbatch &&
          a.chunk == moved.chunk)
        prog::SetStepSlot(op, other_slot);
    }
    const std::string errors = Joined(VerifyWorld(p));
    CHECK(errors.find(fmt::format("takes slot {}, which microbatch", other_slot)) !=
          std::string::npos);
    CHECK(errors.find("still holds") != std::string::npos);
  }
  SUBCASE("a chunk taken out of the pool, its buffers where the pool's are") {
    Role& role = p.roles[role_index];
    for (Chunk& c : role.chunks)
      if (c.pool >= 0) {
        c.pool = -1;
        break;
      }
    CHECK(Joined(VerifyWorld(p)).find("overlap") != std::string::npos);
  }
  // The Stash buffers of the pool's first chunk.
  auto pooled_buffers = [&](Role& role) {
    const std::vector<int32_t> chunk_of = StashChunks(role);
    int32_t chunk = -1;
    std::vector<size_t> out;
    for (size_t b = 0; b < role.buffers.size(); ++b) {
      const int32_t c = chunk_of[b];
      if (c < 0 || role.chunks[c].pool < 0 || role.buffers[b].view_of >= 0 ||
          role.buffers[b].kind != BufferKind::Stash)
        continue;
      if (chunk < 0) chunk = c;
      if (c == chunk) out.push_back(b);
    }
    REQUIRE(out.size() >= 2);
    return out;
  };
  SUBCASE("a body that fills a pooled stash buffer (every slot, other chunks' included)") {
    Role& role = p.roles[role_index];
    const std::vector<size_t> buffers = pooled_buffers(role);
    role.bodies[role.chunks[0].forward].ops.push_back(
        prog::MakeOp(prog::attrs::Fill{.value = 0.0}, {}, {static_cast<int32_t>(buffers[0])}));
    CHECK(Joined(VerifyWorld(p)).find("fills stash buffer") != std::string::npos);
  }
  SUBCASE("a stash buffer whose slots are not its chunk's") {
    Role& role = p.roles[role_index];
    role.buffers[pooled_buffers(role)[0]].slots -= 1;
    CHECK(Joined(VerifyWorld(p)).find("slots, its chunk") != std::string::npos);
  }
  SUBCASE("two stash buffers of one chunk at the same bytes") {
    Role& role = p.roles[role_index];
    const std::vector<size_t> buffers = pooled_buffers(role);
    role.buffers[buffers[1]].offset = role.buffers[buffers[0]].offset;
    CHECK(Joined(VerifyWorld(p)).find("two stash buffers of chunk") != std::string::npos);
  }
  SUBCASE("a pool's slot stride shorter than a member's frame") {
    Role& role = p.roles[role_index];
    for (size_t b : pooled_buffers(role)) role.buffers[b].slot_stride /= 2;
    for (Buffer& buf : role.buffers)
      if (buf.kind == BufferKind::Stash && buf.slots > 1 && buf.slot_stride > 0)
        buf.slot_stride = role.buffers[pooled_buffers(role)[0]].slot_stride;
    CHECK(Joined(VerifyWorld(p)).find("more than its slot stride") != std::string::npos);
  }
  SUBCASE("a damaged pool number") {
    p.roles[role_index].chunks[0].pool = -3;
    CHECK(Joined(VerifyWorld(p)).find("has pool -3") != std::string::npos);
  }
  SUBCASE("a pooled buffer with another slot stride") {
    Role& role = p.roles[role_index];
    const std::vector<int32_t> chunk_of = StashChunks(role);
    for (size_t b = 0; b < role.buffers.size(); ++b)
      if (chunk_of[b] >= 0 && role.chunks[chunk_of[b]].pool >= 0) {
        role.buffers[b].slot_stride += 256;
        break;
      }
    CHECK(Joined(VerifyWorld(p)).find("differ in slots or slot stride") != std::string::npos);
  }
}

// A chunk's output and gradient are one buffer each (BoundaryBuffersOf): the output from the
// forward to its send, the gradient from its receive (into a landing buffer, on chunks that
// both receive and send gradients) through the backward to its send.
TEST_CASE("boundary buffers: a chunk's output and gradient are one buffer each, not per slot") {
  for (const Plan& plan : {TinyPlan(1, 4, 1), TinyPlan(1, 4, 1, Schedule::kGpipe),
                           TinyPlan(1, 2, 1, Schedule::kInterleaved1F1B, 2)}) {
    Program p = MustLower(plan, false);
    CHECK(VerifyWorld(p).empty());
    LowerOptions slotted;
    slotted.boundary_buffers = false;
    const Program before = MustLowerWith(plan, slotted);
    int landings = 0;
    for (size_t r = 0; r < p.roles.size(); ++r) {
      const Role& role = p.roles[r];
      CAPTURE(role.name);
      for (const Chunk& c : role.chunks) {
        if (c.output >= 0) CHECK(role.buffers[c.output].kind == BufferKind::Persistent);
        CHECK(role.buffers[c.grad].kind == BufferKind::Persistent);
        const int32_t landing = GradLandingBuffer(role, c);
        CHECK((landing >= 0) == (!c.has_loss && c.stage > 0));
        if (landing >= 0) ++landings;
      }
      if (p.parallel.pp > 1 && role.chunks.front().slots > 1)
        CHECK(MeasureMemory(role).stash < MeasureMemory(before.roles[r]).stash);
    }
    CHECK(landings > 0);
  }
}

TEST_CASE("mutation: a send after the chunk's next forward, a gradient received too early") {
  Plan plan = TinyPlan(1, 4, 1);
  Role* role = nullptr;
  Program p = MustLower(plan, false);
  role = &p.roles[1];
  auto is = [](OpKind kind) { return [=](const Op& op) { return op.kind == kind; }; };
  SUBCASE("the first send of an activation, moved after the next forward") {
    auto send =
        std::find_if(role->schedule.begin(), role->schedule.end(), is(OpKind::SendActivation));
    REQUIRE(send != role->schedule.end());
    const Op moved = *send;
    auto next = std::find_if(role->schedule.erase(send), role->schedule.end(), is(OpKind::Forward));
    REQUIRE(next != role->schedule.end());
    role->schedule.insert(next + 1, moved);
    CHECK(Joined(VerifyWorld(p))
              .find("overwrites the chunk's output before microbatch 0 is "
                    "sent") != std::string::npos);
  }
  SUBCASE("a send of another microbatch than the forward's") {
    auto send =
        std::find_if(role->schedule.begin(), role->schedule.end(), is(OpKind::SendActivation));
    REQUIRE(send != role->schedule.end());
    REQUIRE(send->ints[0] == 0);
    send->ints[0] = 1;
    CHECK(Joined(VerifyWorld(p)).find("the chunk's output holds microbatch 0") !=
          std::string::npos);
  }
  // The second RecvGrad of `r`'s schedule, moved right after the first.
  auto receive_early = [&](Role& r) {
    auto first = std::find_if(r.schedule.begin(), r.schedule.end(), is(OpKind::RecvGrad));
    REQUIRE(first != r.schedule.end());
    auto second = std::find_if(first + 1, r.schedule.end(), is(OpKind::RecvGrad));
    REQUIRE(second != r.schedule.end());
    const Op moved = *second;
    r.schedule.erase(second);
    r.schedule.insert(first + 1, moved);
  };
  SUBCASE("the second gradient received before the first backward (into the landing buffer)") {
    receive_early(*role);
    CHECK(Joined(VerifyWorld(p))
              .find("overwrites the chunk's grad landing buffer before "
                    "microbatch 0's backward reads it") != std::string::npos);
  }
  SUBCASE("the same on the first stage, which receives into its grad") {
    receive_early(p.roles[0]);
    CHECK(
        Joined(VerifyWorld(p)).find("receives into the chunk's grad while it holds microbatch 0") !=
        std::string::npos);
  }
}

TEST_CASE("mutation: a receive that overwrites an unread landing buffer is caught") {
  Plan plan = TinyPlan(1, 2, 1, Schedule::kInterleaved1F1B, 3);
  plan.model.layers = 6;
  Program p = MustLower(plan, false);
  Role& role = p.roles[0];
  auto is = [](OpKind kind, int64_t chunk) {
    return
        [=](const Op& op) { return op.kind == kind && prog::DecodeStepAttrs(op).chunk == chunk; };
  };
  // The first forward of the middle chunk, moved after the chunk's next receive.
  auto fwd = std::find_if(role.schedule.begin(), role.schedule.end(), is(OpKind::Forward, 1));
  REQUIRE(fwd != role.schedule.end());
  const Op moved = *fwd;
  auto next =
      std::find_if(role.schedule.erase(fwd), role.schedule.end(), is(OpKind::RecvActivation, 1));
  REQUIRE(next != role.schedule.end());
  role.schedule.insert(next + 1, moved);
  const std::string errors = Joined(VerifyWorld(p));
  CHECK(errors.find("overwrites the chunk's landing buffer before microbatch 0 is read by its "
                    "forward") != std::string::npos);
  CHECK(errors.find("forward(microbatch 0, chunk 1): the chunk's landing buffer holds "
                    "microbatch 1") != std::string::npos);
}

TEST_CASE(
    "mutation: swapped tensor-parallel collectives inside one rank's forward body are caught") {
  Plan plan = TinyPlan(2, 1, 1);
  plan.parallel.sp = true;
  Program p = MustLower(plan, false);
  Role& role = SplitRole(p, 1);
  Body& fwd = role.bodies[role.chunks[0].forward];
  auto first = std::find_if(fwd.ops.begin(), fwd.ops.end(),
                            [](const Op& op) { return op.kind == OpKind::AllGather; });
  auto second = std::find_if(first + 1, fwd.ops.end(),
                             [](const Op& op) { return op.kind == OpKind::ReduceScatter; });
  REQUIRE(second != fwd.ops.end());
  std::swap(*first, *second);
  std::string errors = Joined(VerifyWorld(p));
  CHECK(errors.find("tp communicator") != std::string::npos);
  CHECK(errors.find("rank 0 (stage0)") != std::string::npos);
  CHECK(errors.find("rank 1 (stage0-mutated)") != std::string::npos);
  CHECK(errors.find("forward(microbatch 0, chunk 0)") != std::string::npos);
}

TEST_CASE("mutation: a duplicated forward is caught by counting, naming the ranks and ops") {
  Program p = MustLower(TinyPlan(1, 2, 1), false);
  Role& role = p.roles[1];
  auto fwd = std::find_if(role.schedule.begin(), role.schedule.end(),
                          [](const Op& op) { return op.kind == OpKind::Forward; });
  Op dup = *fwd;
  role.schedule.insert(fwd + 1, dup);
  std::string errors = Joined(VerifyWorld(p));
  CHECK(
      errors.find("ranks 1 (stage1): microbatch 0 of chunk 0 runs forward 2 times (ops #2, #3)") !=
      std::string::npos);
}

// The program with every role's schedule moved into its compact form (Role::steps).
Program Compacted(Program p) {
  for (Role& role : p.roles) {
    role.steps.resize(role.schedule.size());
    for (size_t i = 0; i < role.schedule.size(); ++i)
      REQUIRE(prog::mem::ToScheduleStep(role.schedule[i], &role.steps[i]));
    role.schedule.clear();
  }
  return p;
}

TEST_CASE("compact schedules: the same steps, verification and file as the ops") {
  std::vector<Plan> plans = {TinyPlan(2, 2, 2), TinyPlan(1, 4, 1, Schedule::kInterleaved1F1B, 2),
                             Gpt2Plan(2, 2, 2), TinyPlan(1, 2, 2, Schedule::kGpipe)};
  plans[0].optimizer.zero = 1;
  for (const Plan& plan : plans) {
    CAPTURE(plan.parallel.pp);
    const Program ops = MustLower(plan);
    DiagnosticSink sink;
    LowerOptions options;
    options.compact_schedule = true;
    std::optional<Program> compact = LowerPlan(plan, options, sink);
    REQUIRE(compact.has_value());
    for (size_t r = 0; r < ops.roles.size(); ++r) {
      const Role& a = ops.roles[r];
      const Role& b = compact->roles[r];
      CHECK(b.schedule.empty());
      REQUIRE(b.steps.size() == a.schedule.size());
      const std::vector<Op> back = prog::mem::ScheduleOps(b);
      for (size_t i = 0; i < back.size(); ++i) {
        CHECK(back[i].kind == a.schedule[i].kind);
        CHECK(back[i].ints == a.schedule[i].ints);
        CHECK(back[i].inputs == a.schedule[i].inputs);
        CHECK(back[i].outputs == a.schedule[i].outputs);
        CHECK(back[i].comm == a.schedule[i].comm);
      }
    }
    VerifyStats sa, sb;
    CHECK(Joined(VerifyWorld(ops, &sa)) == "");
    CHECK(Joined(VerifyWorld(*compact, &sb)) == "");
    CHECK(sa.simulated_ops == sb.simulated_ops);
    CHECK(sa.transfers == sb.transfers);
    CHECK(sa.collectives == sb.collectives);
    // One file, whichever form the schedule was held in; read back, it holds ops again.
    const std::vector<uint8_t> bytes = ToFlatBuffer(ops);
    CHECK(ToFlatBuffer(*compact) == bytes);
    std::string error;
    std::optional<Program> back = FromFlatBuffer(bytes.data(), bytes.size(), &error);
    REQUIRE_MESSAGE(back.has_value(), error);
    CHECK(back->roles[0].steps.empty());
    CHECK(back->roles[0].schedule.size() == ops.roles[0].schedule.size());
  }
}

TEST_CASE("compact schedules: mutated programs get the messages the ops get") {
  auto both = [](Program p) {
    const std::string ops = Joined(VerifyWorld(p));
    CHECK(ops != "");
    CHECK(Joined(VerifyWorld(Compacted(std::move(p)))) == ops);
  };
  {  // a duplicated forward
    Program p = MustLower(TinyPlan(1, 2, 1), false);
    auto& s = p.roles[1].schedule;
    auto fwd =
        std::find_if(s.begin(), s.end(), [](const Op& op) { return op.kind == OpKind::Forward; });
    s.insert(fwd + 1, *fwd);
    both(p);
  }
  {  // a dropped receive
    Program p = MustLower(TinyPlan(1, 2, 1), false);
    Role& role = SplitRole(p, 1);
    role.schedule.erase(std::find_if(role.schedule.begin(), role.schedule.end(), [](const Op& op) {
      return op.kind == OpKind::RecvActivation;
    }));
    both(p);
  }
  {  // a receive of a gradient before the forward that needs an activation: a deadlock
    Program p = MustLower(TinyPlan(1, 2, 1), false);
    Role& role = SplitRole(p, 1);
    auto recv = std::find_if(role.schedule.begin(), role.schedule.end(),
                             [](const Op& op) { return op.kind == OpKind::RecvActivation; });
    Op bogus = *recv;
    bogus.ints[prog::kP2pGroup] = 0;
    bogus.kind = OpKind::RecvGrad;
    bogus.outputs = {role.chunks[0].grad};
    role.schedule.erase(recv);
    role.schedule.insert(std::find_if(role.schedule.begin(), role.schedule.end(),
                                      [](const Op& op) { return op.kind == OpKind::Forward; }),
                         bogus);
    both(p);
  }
  {  // a transfer naming the wrong buffer
    Program p = MustLower(TinyPlan(1, 2, 1), false);
    Role& role = SplitRole(p, 0);
    auto send = std::find_if(role.schedule.begin(), role.schedule.end(),
                             [](const Op& op) { return op.kind == OpKind::SendActivation; });
    send->inputs = {role.chunks[0].grad};
    both(p);
  }
  {  // a schedule held twice is a structural error
    Program p = MustLower(TinyPlan(1, 2, 1), false);
    Program c = Compacted(p);
    c.roles[0].schedule = p.roles[0].schedule;
    CHECK(Joined(VerifyWorld(c)).find("stage0: the schedule is held twice, as ops and as steps") !=
          std::string::npos);
  }
}

TEST_CASE("multi-token prediction: modules on the loss chunk, shifted loads, a shared embedding") {
  // pp 2, untied embeddings: the last stage keeps a copy of the word embedding for the modules,
  // summed with the first stage's over the Embedding group; tp 2 under sequence parallelism.
  Plan plan = TinyPlan(2, 2, 1);
  plan.parallel.sp = true;
  plan.model.mtp_layers = 2;
  plan.model.mtp_loss_scale = 0.3;
  const Program p = MustLower(plan);
  CHECK(p.model.mtp_layers == 2);
  CHECK(p.model.mtp_loss_scale == 0.3);
  const Role& last = p.roles[1];
  std::set<std::string> names;
  for (const Param& prm : last.params) names.insert(prm.name);
  for (const char* n :
       {"embedding.word.mtp_copy", "mtp.0.enorm.weight", "mtp.0.hnorm.weight", "mtp.0.eh_proj",
        "mtp.1.final_norm.weight", "layers.8.attention.wq", "layers.9.mlp.w_down"})
    CHECK_MESSAGE(names.count(n) == 1, n);
  CHECK(p.roles[0].params.size() < last.params.size());
  // The shifted inputs and labels of depths 1 and 2, beside the model's own.
  std::map<std::pair<int64_t, int64_t>, int> loads;  // (what, shift) -> count
  int losses = 0;
  for (const Body& b : last.bodies)
    for (const Op& op : b.ops) {
      if (op.kind == OpKind::LoadBatch) {
        const auto a = prog::DecodeAttrs<prog::attrs::LoadBatch>(op);
        ++loads[{static_cast<int64_t>(a.what), a.shift}];
      }
      losses += op.kind == OpKind::CrossEntropyLoss;
    }
  CHECK(loads[{1, 0}] == 1);
  CHECK(loads[{0, 1}] == 1);
  CHECK(loads[{1, 1}] == 1);
  CHECK(loads[{0, 2}] == 1);
  CHECK(loads[{1, 2}] == 1);
  CHECK(losses == 3);
  // The copy's gradient and the first stage's embedding gradient meet over the Embedding group.
  const auto embedding_sums = [&](const Role& r) {
    return CountOps(r.bodies[r.schedule[r.schedule.size() - 2].ints[0]], OpKind::AllReduce,
                    CommKind::Embedding);
  };
  CHECK(embedding_sums(p.roles[0]) == 1);
  CHECK(embedding_sums(last) == 1);
  CHECK(std::any_of(p.communicators.begin(), p.communicators.end(),
                    [](const Communicator& c) { return c.kind == CommKind::Embedding; }));
  CHECK(PrintProgram(p).find("multi-token prediction: 2 modules, loss weight 0.3") !=
        std::string::npos);
  // The modules' layer is of the last layer's kind: an MoE module after MoE layers.
  Plan moe = TinyPlan(1, 1, 2);
  moe.model.experts = 4;
  moe.model.topk = 2;
  moe.model.moe_ffn_hidden = 64;
  moe.model.mtp_layers = 1;
  const Program pm = MustLower(moe);
  CHECK(std::any_of(pm.roles[0].params.begin(), pm.roles[0].params.end(),
                    [](const Param& prm) { return prm.name == "layers.8.moe.router"; }));
}

TEST_CASE("the precision record: bf16 gradients and any FP8 recipe lower; the rest is P0801") {
  Plan plan = TinyPlan(2, 2, 2);
  plan.parallel.sp = true;
  plan.optimizer.zero = 1;
  const Program f32 = MustLower(plan);
  // As `--set` states them: the value and its origin.
  auto set = [&](const char* path, const char* value) {
    REQUIRE(SetFieldText(plan, path, value).empty());
    plan.origins.Mutable(path)->kind = OriginKind::kCommandLine;
  };
  set("mixed_precision.grads", "bf16");
  const Program bf16 = MustLower(plan);
  for (size_t r = 0; r < bf16.roles.size(); ++r) {
    const Role& role = bf16.roles[r];
    int grads = 0;
    for (const Buffer& b : role.buffers) {
      const bool grad = b.kind == BufferKind::Grad || b.name.ends_with(".grads");
      if (!grad) continue;
      ++grads;
      CHECK_MESSAGE(b.dtype == DType::Bf16, b.name);
    }
    CHECK(grads > 0);
    // Half the gradient bytes in the program's precision; planrun's f32 placement unchanged.
    CHECK(role.arena_bytes < f32.roles[r].arena_bytes);
    CHECK(role.fp32_arena_bytes == f32.roles[r].fp32_arena_bytes);
  }
  // FP8 under Transformer Engine's current scaling lowers as bf16, saying so (P0806).
  plan.precision = Precision::kFp8;
  set("mixed_precision.fp8", "current");
  DiagnosticSink sink;
  REQUIRE(LowerPlan(plan, {}, sink).has_value());
  const auto note =
      std::find_if(sink.diagnostics().begin(), sink.diagnostics().end(),
                   [](const Diagnostic& d) { return d.kind == DiagKind::kLowerFp8AsBf16; });
  REQUIRE(note != sink.diagnostics().end());
  CHECK(note->message == "this FP8 plan's program holds its activations and weights in bf16");
  CHECK(Joined(note->notes).find("the current scaling recipe does not change the program") !=
        std::string::npos);
  // Optimizer moments in bf16 are not lowered yet.
  set("mixed_precision.optimizer_state", "bf16");
  DiagnosticSink refused;
  CHECK_FALSE(LowerPlan(plan, {}, refused).has_value());
  CHECK(refused.diagnostics()[0].kind == DiagKind::kLowerUnsupported);
}

TEST_CASE("unsupported features and bad shapes are P08xx diagnostics") {
  // Multi-token prediction beside learned positions is refused, naming it.
  Plan mtp = Gpt2Plan(1, 1, 2);
  mtp.model.mtp_layers = 1;
  DiagnosticSink sink;
  CHECK_FALSE(LowerPlan(mtp, {}, sink).has_value());
  REQUIRE(sink.diagnostics().size() >= 1);
  CHECK(sink.diagnostics()[0].kind == DiagKind::kLowerUnsupported);
  CHECK(sink.diagnostics()[0].message ==
        "lowering does not emit multi-token prediction (1 modules) beside learned positions yet");

  Plan odd = TinyPlan(2, 1, 1);
  odd.model.kv_heads = 1;
  DiagnosticSink s2;
  CHECK_FALSE(LowerPlan(odd, {}, s2).has_value());
  REQUIRE(s2.diagnostics().size() >= 1);
  CHECK(s2.diagnostics()[0].kind == DiagKind::kLowerShape);
  CHECK(s2.diagnostics()[0].message == "kv_heads = 1 is not a multiple of tp = 2");

  Plan inter = TinyPlan(1, 4, 1, Schedule::kInterleaved1F1B, 2);
  inter.batch.global = int64_t{2} * 6;  // 6 microbatches: 6 mod 4 = 2 < 4
  DiagnosticSink s3;
  CHECK_FALSE(LowerPlan(inter, {}, s3).has_value());
  bool found = false;
  for (const auto& d : s3.diagnostics()) found |= d.kind == DiagKind::kLowerSchedule;
  CHECK(found);
}

// --- expert parallelism ---
// dp 4, ep 2: Ep groups {0,1} {2,3}, Edp {0,2} {1,3} (order tp-cp-ep-dp-pp); each rank holds 2
// of the 4 experts, dispatches by all-to-all over Ep and reduces its expert grads over Edp.
TEST_CASE("expert parallelism: dispatch and combine over Ep, experts sharded, grads over Edp") {
  Plan plan = TinyPlan(1, 1, 4);
  plan.parallel.ep = 2;
  plan.parallel.etp = 1;
  plan.model.experts = 4;
  plan.model.topk = 2;
  plan.model.moe_ffn_hidden = 64;
  plan.model.dense_layers = 1;
  plan.model.moe_layer_freq = 2;  // layers 1, 3, 5, 7
  const Program p = MustLower(plan);
  std::map<CommKind, std::vector<std::vector<int32_t>>> groups;
  for (const Communicator& c : p.communicators) groups[c.kind].push_back(c.members);
  CHECK(groups[CommKind::Ep] == std::vector<std::vector<int32_t>>{{0, 1}, {2, 3}});
  CHECK(groups[CommKind::Edp] == std::vector<std::vector<int32_t>>{{0, 2}, {1, 3}});
  const Role& role = p.roles[0];
  const Body& fwd = role.bodies[role.chunks[0].forward];
  const Body& bwd = role.bodies[role.chunks[0].backward];
  CHECK(CountOps(fwd, OpKind::MoeExchangeCounts, CommKind::Ep) == 4);
  CHECK(CountOps(fwd, OpKind::MoeDispatch, CommKind::Ep) == 4);
  CHECK(CountOps(fwd, OpKind::MoeCombine, CommKind::Ep) == 4);
  CHECK(CountOps(bwd, OpKind::MoeDispatch, CommKind::Ep) == 4);  // the output's gradient
  CHECK(CountOps(bwd, OpKind::MoeCombine, CommKind::Ep) == 4);   // the input's gradient
  for (const Op& op : fwd.ops)
    if (op.kind == OpKind::GroupedLinear)
      CHECK(prog::DecodeAttrs<prog::attrs::GroupedLinear>(op).groups == 2);  // local experts
  int sharded = 0;
  for (const Param& prm : role.params) {
    if (prm.name.find(".experts.") == std::string::npos) {
      CHECK(prm.split_comm != CommKind::Ep);
      continue;
    }
    ++sharded;
    CHECK(prm.split_comm == CommKind::Ep);
    CHECK(prm.split_dim == 0);
    CHECK(prm.global_shape[0] == 4);
    CHECK(role.buffers[prm.buffer].shape[0] == 2);
  }
  CHECK(sharded == 4 * 3);
  // Receive buffers at the worst case: both Ep peers' 64 rows, each choosing min(topk, 2) = 2
  // of this rank's experts.
  for (const Buffer& b : role.buffers)
    if (b.name.find("moe.ep.dispatched") != std::string::npos)
      CHECK(b.shape == std::vector<int64_t>{int64_t{2} * 64 * 2, 64});
  // A stated routing imbalance bounds them: 1.5 · 64 rows · topk 2 = 192 rows.
  Plan stated = plan;
  stated.moe.imbalance = 1.5;
  stated.origins.Mutable("moe.imbalance")->kind = OriginKind::kCommandLine;
  const Program q = MustLower(stated);
  for (const Buffer& b : q.roles[0].buffers)
    if (b.name.find("moe.ep.dispatched") != std::string::npos)
      CHECK(b.shape == std::vector<int64_t>{192, 64});
  // Expert grads reduce over Edp, the rest over Dp; the grad norm counts each element once.
  const Body& reduce = role.bodies[role.chunks.size() * 2 + 1];
  REQUIRE(reduce.name == "reduce_grads");
  CHECK(CountOps(reduce, OpKind::AllReduce, CommKind::Edp) == 1);
  CHECK(CountOps(reduce, OpKind::AllReduce, CommKind::Dp) == 1);
  const Body& step = role.bodies[role.chunks.size() * 2 + 2];
  for (const Op& op : step.ops)
    if (op.kind == OpKind::GradNormSquare)
      CHECK(prog::DecodeAttrs<prog::attrs::GradNormSquare>(op).count_once);
  CHECK(CountOps(step, OpKind::AllReduce, CommKind::World) == 1);
  // ZeRO 1: the experts' states are sharded over Edp, the rest over Dp.
  plan.optimizer.zero = 1;
  const Program z = MustLower(plan);
  const Role& zr = z.roles[0];
  const Body& zreduce = zr.bodies[zr.chunks.size() * 2 + 1];
  CHECK(CountOps(zreduce, OpKind::ReduceScatter, CommKind::Edp) == 1);
  CHECK(CountOps(zreduce, OpKind::ReduceScatter, CommKind::Dp) == 1);
  const Body& zstep = zr.bodies[zr.chunks.size() * 2 + 2];
  CHECK(CountOps(zstep, OpKind::AdamW, CommKind::Edp) == 1);
  CHECK(CountOps(zstep, OpKind::AdamW, CommKind::Dp) == 1);
  CHECK(CountOps(zstep, OpKind::AllGather, CommKind::Edp) == 1);
  for (const Bucket& b : zr.buckets)
    CHECK(b.shard_elements *
              (zr.buffers[b.params].name.find("experts") != std::string::npos ? 2 : 4) ==
          b.elements);
}

// The whole-world verifier checks the all-to-alls over Ep as group calls: their order (counts are
// known only at run time) and that every rank has the communicator its bodies name.
Plan EpPlan() {
  Plan plan = TinyPlan(1, 1, 2);
  plan.parallel.ep = 2;
  plan.parallel.etp = 1;
  plan.model.experts = 4;
  plan.model.topk = 2;
  return plan;
}

TEST_CASE("mutation: a dispatch and a combine swapped on one Ep rank are caught") {
  Program p = MustLower(EpPlan(), false);
  Role& role = SplitRole(p, 1);
  Body& fwd = role.bodies[role.chunks[0].forward];
  auto dispatch = std::find_if(fwd.ops.begin(), fwd.ops.end(),
                               [](const Op& op) { return op.kind == OpKind::MoeDispatch; });
  auto combine = std::find_if(dispatch, fwd.ops.end(),
                              [](const Op& op) { return op.kind == OpKind::MoeCombine; });
  REQUIRE(combine != fwd.ops.end());
  std::swap(*dispatch, *combine);
  const std::string errors = Joined(VerifyWorld(p));
  CHECK(errors.find("ep communicator") != std::string::npos);
  CHECK(errors.find("rank 0 (stage0): moe_dispatch[ep]") != std::string::npos);
  CHECK(errors.find("rank 1 (stage0-mutated): moe_combine[ep]") != std::string::npos);
}

TEST_CASE("mutation: a rank outside every Ep group is caught") {
  Program p = MustLower(EpPlan(), false);
  p.ranks[1].comms[static_cast<int>(CommKind::Ep)] = -1;
  const std::string errors = Joined(VerifyWorld(p));
  CHECK(errors.find("rank 1 (stage0): body 'chunk0.forward' uses the ep communicator, but the "
                    "rank has none") != std::string::npos);
}

// tp 2, dp 4, ep 2, etp 2 (Megatron-Core's expert mesh, etp first): Etp = Tp {0,1} {2,3} ...,
// Ep joins ranks of one Etp index {0,2} {1,3} {4,6} {5,7}, Edp {0,4} {1,5} {2,6} {3,7}. Each
// expert weight is split over Ep (the expert) and over Etp (its ffn slice).
TEST_CASE("expert parallelism beside expert tensor parallelism: the expert mesh, two splits") {
  for (bool sp : {true, false}) {
    Plan plan = TinyPlan(2, 1, 4);
    plan.parallel.sp = sp;
    plan.parallel.ep = 2;
    plan.model.experts = 4;
    plan.model.topk = 2;
    plan.model.moe_ffn_hidden = 64;
    const Program p = MustLower(plan);
    std::map<CommKind, std::vector<std::vector<int32_t>>> groups;
    for (const Communicator& c : p.communicators) groups[c.kind].push_back(c.members);
    CHECK(groups[CommKind::Etp] == groups[CommKind::Tp]);
    CHECK(groups[CommKind::Ep] ==
          std::vector<std::vector<int32_t>>{{0, 2}, {1, 3}, {4, 6}, {5, 7}});
    CHECK(groups[CommKind::Edp] ==
          std::vector<std::vector<int32_t>>{{0, 4}, {1, 5}, {2, 6}, {3, 7}});
    const Role& role = p.roles[0];
    const Body& fwd = role.bodies[role.chunks[0].forward];
    CHECK(CountOps(fwd, OpKind::MoeDispatch, CommKind::Ep) == 8);
    CHECK(CountOps(fwd, OpKind::AllGather, CommKind::Etp) == (sp ? 16 : 0));
    CHECK(CountOps(fwd, OpKind::ReduceScatter, CommKind::Etp) == (sp ? 8 : 0));
    CHECK(CountOps(fwd, OpKind::AllReduce, CommKind::Etp) == (sp ? 0 : 8));
    // The dispatch follows the Etp group's rows: 2 · 32 under sp (the group's gathered rows),
    // 64 without; the combine returns them.
    const int64_t rows = 64;
    for (const Buffer& b : role.buffers) {
      if (b.name.find("moe.ep.dispatched") != std::string::npos)
        CHECK(b.shape == std::vector<int64_t>{2 * rows * 2, 64});
      if (b.name.find("moe.ep.combined") != std::string::npos)
        CHECK(b.shape == std::vector<int64_t>{rows * 2, 64});
    }
    int split = 0;
    for (const Param& prm : role.params) {
      if (prm.name.find(".experts.") == std::string::npos) continue;
      ++split;
      CHECK(prm.split_comm == CommKind::Ep);
      CHECK(prm.split_dim == 0);
      CHECK(prm.split2_comm == CommKind::Etp);
      CHECK(prm.split2_dim == (prm.name.find("w_down") != std::string::npos ? 2 : 1));
      std::vector<int64_t> local = prm.global_shape;
      local[0] /= 2;
      local[prm.split2_dim] /= 2;
      CHECK(role.buffers[prm.buffer].shape == local);
    }
    CHECK(split == 8 * 3);
  }
}

TEST_CASE("expert parallelism: refusals name the combination") {
  Plan plan = TinyPlan(2, 1, 1);
  plan.parallel.ep = 2;
  plan.parallel.etp = 1;
  plan.model.experts = 4;
  plan.model.topk = 2;
  DiagnosticSink no_sp;
  CHECK_FALSE(LowerPlan(plan, {}, no_sp).has_value());
  REQUIRE(!no_sp.diagnostics().empty());
  CHECK(no_sp.diagnostics()[0].kind == DiagKind::kLowerUnsupported);
  CHECK(no_sp.diagnostics()[0].message ==
        "lowering does not emit expert parallelism (ep = 2) beside tp = 2 without sequence "
        "parallelism (etp = 1) yet");
  plan.parallel.sp = true;
  plan.model.experts = 3;
  DiagnosticSink odd;
  CHECK_FALSE(LowerPlan(plan, {}, odd).has_value());
  REQUIRE(!odd.diagnostics().empty());
  CHECK(odd.diagnostics()[0].kind == DiagKind::kLowerShape);
  CHECK(odd.diagnostics()[0].message == "experts = 3 is not a multiple of ep = 2");
  plan.model.experts = 4;
  // ZeRO 3: each layer's experts in a bucket of their own, gathered and reduce-scattered over Edp
  // inside the bodies (tp 2, dp 2, ep 2: Edp groups of 2).
  plan.optimizer.zero = 3;
  plan.parallel.dp = 2;
  plan.cluster.gpus_per_node = 4;
  const Program zero3 = MustLower(plan);
  const Role& role = zero3.roles[0];
  int expert_buckets = 0;
  for (const Bucket& b : role.buckets)
    expert_buckets += role.buffers[b.params].name.find(".experts.params") != std::string::npos;
  CHECK(expert_buckets == plan.model.layers);
  CHECK(CountOps(role.bodies[role.chunks[0].forward], OpKind::AllGather, CommKind::Edp) ==
        plan.model.layers);
  CHECK(CountOps(role.bodies[role.chunks[0].backward], OpKind::ReduceScatter, CommKind::Edp) ==
        plan.model.layers);
  plan.parallel.dp = 1;
  plan.cluster.gpus_per_node = 2;
  // A capacity factor beside expert parallelism: each rank drops past the capacity of the rows
  // it routes, before the dispatch (the dropped pairs are not dispatched).
  plan.optimizer.zero = 0;
  plan.moe.capacity_factor = 1.25;
  const Program capped = MustLower(plan);
  int capacities = 0;
  for (const Role& role : capped.roles)
    for (const Chunk& c : role.chunks)
      capacities += CountOps(role.bodies[c.forward], OpKind::MoeCapacity, CommKind::None);
  CHECK(capacities > 0);
  Plan dense = TinyPlan(1, 1, 2);
  dense.parallel.ep = 2;
  DiagnosticSink ds;
  CHECK_FALSE(LowerPlan(dense, {}, ds).has_value());
  REQUIRE(!ds.diagnostics().empty());
  CHECK(ds.diagnostics()[0].message ==
        "lowering does not emit expert parallelism (ep = 2) for a model without experts yet");
}
// A capacity factor leaves the dropped pairs out of the routed path: MoePermute reads the kept
// pairs' mask, and the routed buffers hold at most every expert's capacity (ep = 1: the permuted
// rows and the experts' activations), the receive buffers every local expert's capacity from
// every Ep peer, when fewer than the dropless worst case. tp 2 under sp, etp 1: rows =
// 2 · 32 / 2 = 32 per rank, topk 2 over 4 experts, 64 routed pairs; ep 2 receives at most
// 2 · 32 · min(2, 2) = 128 rows dropless. Factor 0.5 keeps ceil(64 / 4 · 0.5) = 8 pairs per
// expert: 4 · 8 = 32 routed rows, 2 · 2 · 8 = 32 received; factor 1.25 keeps 20: 64 routed
// (all), 2 · 2 · 20 = 80 received.
TEST_CASE("a capacity factor bounds the routed and the Ep receive buffers by the capacity") {
  struct Case {
    int64_t ep;
    double factor;
    int64_t routed, received;
  };
  for (const Case& c : {Case{1, 0, 64, 0}, Case{1, 0.5, 32, 0}, Case{1, 1.25, 64, 0},
                        Case{2, 0, 64, 128}, Case{2, 0.5, 32, 32}, Case{2, 1.25, 64, 80}}) {
    CAPTURE(c.ep);
    CAPTURE(c.factor);
    Plan plan = TinyPlan(2, 1, 2);
    plan.parallel.sp = true;
    plan.parallel.ep = c.ep;
    plan.parallel.etp = 1;
    plan.model.experts = 4;
    plan.model.topk = 2;
    plan.moe.capacity_factor = c.factor;
    const Program p = MustLower(plan);
    const Role& role = p.roles[0];
    auto rows_of = [&](const std::string& suffix) {
      std::set<int64_t> rows;
      for (const Buffer& b : role.buffers)
        if (b.name.ends_with(suffix)) rows.insert(b.shape.front());
      return rows;
    };
    const std::set<int64_t> routed{c.routed}, received{c.received};
    CHECK(rows_of(".moe.permuted") == routed);
    CHECK(rows_of(".moe.experts.out.grad") == routed);
    CHECK(rows_of(".moe.row_map") == std::set<int64_t>{64});  // one per pair, kept or dropped
    if (c.ep == 1) {
      CHECK(rows_of(".moe.experts.act") == routed);
      CHECK(rows_of(".moe.experts.out") == routed);
    } else {
      CHECK(rows_of(".moe.ep.dispatched") == received);
      CHECK(rows_of(".moe.experts.act") == received);
      CHECK(rows_of(".moe.ep.combined") == routed);
    }
    // The permute reads the mask only with a capacity factor (dropless programs are unchanged).
    int permutes = 0;
    for (const Chunk& ch : role.chunks) {
      for (const Op& op : role.bodies[ch.forward].ops) {
        if (op.kind != OpKind::MoePermute) continue;
        ++permutes;
        REQUIRE(op.inputs.size() == (c.factor > 0 ? 3u : 2u));
        if (c.factor > 0) CHECK(role.buffers[op.inputs[2]].name.ends_with("moe.capacity.mask"));
      }
    }
    CHECK(permutes > 0);
  }
}
// --- end expert parallelism ---
// --- multi-head latent attention ---
TEST_CASE("multi-head latent attention: replicated latents, heads split by tp, refused beside cp") {
  Plan plan = MlaPlan(2, 1, 1);
  plan.parallel.sp = true;
  const Program p = MustLower(plan);
  const Role& role = p.roles[0];
  auto param = [&](const std::string& name) -> const Param& {
    auto it = std::find_if(role.params.begin(), role.params.end(),
                           [&](const Param& x) { return x.name == name; });
    REQUIRE_MESSAGE(it != role.params.end(), name);
    return *it;
  };
  // Down projections and latent norms whole on every rank, their gradients summed over Tp.
  for (const char* name : {"layers.0.attention.wq_down", "layers.0.attention.q_norm.weight",
                           "layers.0.attention.wkv_down", "layers.0.attention.kv_norm.weight"}) {
    CAPTURE(name);
    CHECK(param(name).tp_replicated);
    CHECK(param(name).grad_sync_tp);
    CHECK(param(name).split_dim == -1);
  }
  CHECK(param("layers.0.attention.wkv_down").global_shape == std::vector<int64_t>{16 + 8, 64});
  CHECK(param("layers.0.attention.wq_up").global_shape ==
        std::vector<int64_t>{int64_t{4} * 32, 32});
  CHECK(param("layers.0.attention.wq_up").split_dim == 0);
  CHECK(param("layers.0.attention.wkv_up").global_shape ==
        std::vector<int64_t>{int64_t{4} * (24 + 16), 16});
  CHECK(param("layers.0.attention.wkv_up").split_dim == 0);
  CHECK(param("layers.0.attention.wo").global_shape == std::vector<int64_t>{64, int64_t{4} * 16});
  CHECK(param("layers.0.attention.wo").split_dim == 1);
  // Attention runs on the rank's 2 heads of 32 columns (values padded from 16).
  const Body& fwd = role.bodies[role.chunks[0].forward];
  int attentions = 0, copies = 0;
  for (const Op& op : fwd.ops) {
    if (op.kind == OpKind::Attention) {
      const auto a = prog::DecodeAttrs<prog::attrs::Attention>(op);
      CHECK(a.heads == 2);
      CHECK(a.kv_heads == 2);
      CHECK(a.head_dim == 32);
      ++attentions;
    }
    copies += op.kind == OpKind::CopyColumns;
  }
  CHECK(attentions == 8);
  CHECK(copies > 0);
  // The model record carries the latent shape through the file (additive fields; 0 elsewhere).
  std::vector<uint8_t> bytes = ToFlatBuffer(p);
  std::string error;
  std::optional<Program> back = FromFlatBuffer(bytes.data(), bytes.size(), &error);
  REQUIRE_MESSAGE(back.has_value(), error);
  CHECK(back->model.q_lora_rank == 32);
  CHECK(back->model.kv_lora_rank == 16);
  CHECK(back->model.qk_nope_head_dim == 24);
  CHECK(back->model.qk_rope_head_dim == 8);
  CHECK(back->model.v_head_dim == 16);
  CHECK(MustLower(TinyPlan(1, 1, 1)).model.kv_lora_rank == 0);
  // Beside context parallelism the core is RingAttention with every head its own key/value
  // head at the query/key head size, and the decoupled RoPE takes the Cp ranks' positions.
  Plan cp = MlaPlan(1, 1, 1);
  cp.parallel.cp = 2;
  cp.cluster.gpus_per_node = 2;
  const Program ring = MustLower(cp);
  int rings = 0, ropes = 0;
  for (const Body& body : ring.roles[0].bodies)
    for (const Op& op : body.ops) {
      if (op.kind == OpKind::RingAttention) {
        const auto a = prog::DecodeAttrs<prog::attrs::RingAttention>(op);
        CHECK(a.heads == a.kv_heads);
        CHECK(a.head_dim == 32);  // qk_nope 24 + qk_rope 8
        ++rings;
      }
      if (op.kind == OpKind::Rope) {
        CHECK(op.comm == CommKind::Cp);
        ++ropes;
      }
      CHECK(op.kind != OpKind::Attention);
    }
  CHECK(rings == cp.model.layers);
  CHECK(ropes == 2 * cp.model.layers);  // the queries' rope part and the shared key head
}
// --- end multi-head latent attention ---

// --- mixture of experts ---
// The equivalence suite's tiny_moe: a dense first layer, then every second layer MoE with 4
// experts, 2 per token, one shared expert.
void SetTinyMoe(ModelSpec& m) {
  m.experts = 4;
  m.topk = 2;
  m.moe_ffn_hidden = 64;
  m.shared_experts = 1;
  m.dense_layers = 1;
  m.moe_layer_freq = 2;
}

TEST_CASE("mixture of experts lowers with ep = 1 and etp = 1; routed buffers at their worst case") {
  Plan plan = TinyPlan(2, 2, 1);
  plan.parallel.sp = true;
  plan.parallel.etp = 1;
  SetTinyMoe(plan.model);  // MoE layers 1, 3, 5, 7
  for (Recompute recompute : {Recompute::kNone, Recompute::kFull}) {
    plan.recompute = recompute;
    const Program p = MustLower(plan);
    int routers = 0, router_backwards = 0, counts_reductions = 0;
    for (const Role& role : p.roles) {
      for (const Chunk& c : role.chunks) {
        const Body& fwd = role.bodies[c.forward];
        const Body& bwd = role.bodies[c.backward];
        routers += CountOps(fwd, OpKind::MoeRouter, CommKind::None);
        router_backwards += CountOps(bwd, OpKind::MoeRouterBackward, CommKind::None);
        for (const Op& op : fwd.ops)
          if (op.kind == OpKind::AllReduce && op.comm == CommKind::Tp &&
              role.buffers[op.inputs[0]].name.find("moe.router.counts") != std::string::npos)
            ++counts_reductions;
        // With full recompute the backward routes again from the stashed layer input.
        CHECK(CountOps(bwd, OpKind::MoeRouter, CommKind::None) ==
              (recompute == Recompute::kFull ? c.layers / 2 : 0));
      }
      for (const Buffer& b : role.buffers)
        if (b.name.find("moe.permuted") != std::string::npos)
          CHECK(b.shape == std::vector<int64_t>{int64_t{2} * 32 / 2 * 2, 64});  // rows / tp · topk
    }
    CHECK(routers == 4);
    CHECK(router_backwards == 4);
    CHECK(counts_reductions == 4);
  }
  // Beside context parallelism the router's counts are summed over Tp, then over Cp, and the
  // aux loss's gradient divides by the microbatch's tokens (all Cp ranks' positions).
  plan.parallel.etp = 1;
  plan.parallel.cp = 2;
  plan.cluster.gpus_per_node *= 2;
  plan.recompute = Recompute::kNone;
  const Program cp = MustLower(plan);
  int cp_reductions = 0, tp_reductions = 0;
  for (const Role& role : cp.roles) {
    for (const Chunk& c : role.chunks) {
      for (const Op& op : role.bodies[c.forward].ops)
        if (op.kind == OpKind::AllReduce &&
            role.buffers[op.inputs[0]].name.find("moe.router.counts") != std::string::npos)
          ++(op.comm == CommKind::Cp ? cp_reductions : tp_reductions);
      for (const Op& op : role.bodies[c.backward].ops)
        if (op.kind == OpKind::MoeRouterBackward)
          CHECK(prog::DecodeAttrs<prog::attrs::MoeRouterBackward>(op).aux_rows ==
                plan.batch.micro * plan.model.seq_len);
    }
  }
  CHECK(cp_reductions == 4);
  CHECK(tp_reductions == 4);
  // A capacity factor drops the pairs past ceil(rows · topk / experts · factor) of each expert:
  // the dispatch weights are the kept ones, and their gradient goes through the mask.
  plan.moe.capacity_factor = 1.25;
  const Program capped = MustLower(plan);
  int capacities = 0, capacity_backwards = 0;
  for (const Role& role : capped.roles) {
    for (const Chunk& c : role.chunks) {
      for (const Op& op : role.bodies[c.forward].ops)
        if (op.kind == OpKind::MoeCapacity) {
          ++capacities;
          // rows = micro · seq / (tp under sp) = 2 · 32 / 2, topk 2, 4 experts: ceil(8 · 1.25)
          CHECK(prog::DecodeAttrs<prog::attrs::MoeCapacity>(op).capacity == 10);
        }
      capacity_backwards +=
          CountOps(role.bodies[c.backward], OpKind::MoeCapacityBackward, CommKind::None);
    }
  }
  CHECK(capacities == 4);
  CHECK(capacity_backwards == 4);
  // With the experts split over the Etp group under sp the group routes its gathered rows: each
  // rank still drops past the capacity of its own rows, one segment of the gathered rows per
  // member of the group, each with the capacity of one rank's rows.
  plan.parallel.cp = 1;
  plan.cluster.gpus_per_node /= 2;
  for (const int64_t etp : {1, 2}) {
    CAPTURE(etp);
    plan.parallel.etp = etp;
    const Program split = MustLower(plan);
    int split_capacities = 0;
    for (const Role& role : split.roles) {
      for (const Chunk& c : role.chunks) {
        for (const Op& op : role.bodies[c.forward].ops) {
          if (op.kind != OpKind::MoeCapacity) continue;
          ++split_capacities;
          const auto a = prog::DecodeAttrs<prog::attrs::MoeCapacity>(op);
          // rows = micro · seq / tp = 2 · 32 / 2 per rank: ceil(32 · 2 / 4 · 1.25) each.
          CHECK(a.capacity == 20);
          CHECK(a.segments == etp);
          CHECK(role.buffers[op.inputs[0]].shape == std::vector<int64_t>{32 * etp, 2});
          // The default (one segment) is left out of the program: programs without expert tensor
          // parallelism are unchanged.
          CHECK(op.ints.size() == (etp == 1 ? 4u : 5u));
        }
      }
    }
    CHECK(split_capacities == 4);
  }
}

// ep = 1, etp = 1 beside tp 2 under sequence parallelism, dp 2: every rank holds every expert
// whole and routes its own rows, so the experts sit in a bucket of their own, reduced once over
// Edp (Megatron-Core's expert data-parallel group, tp · dp = 4 ranks) with no Tp reduction, and
// under ZeRO 1 their optimizer state is sharded 4 ways, the dense params' over dp = 2.
TEST_CASE("ep = 1, etp = 1, tp 2, sp: the experts reduce and shard over Edp, the stage's ranks") {
  Plan plan = TinyPlan(2, 1, 2);
  plan.parallel.sp = true;
  plan.parallel.etp = 1;
  plan.optimizer.zero = 1;
  SetTinyMoe(plan.model);  // MoE layers 1, 3, 5, 7
  const Program p = MustLower(plan);
  std::map<CommKind, std::vector<std::vector<int32_t>>> groups;
  for (const Communicator& c : p.communicators) groups[c.kind].push_back(c.members);
  CHECK(groups[CommKind::Edp] == std::vector<std::vector<int32_t>>{{0, 1, 2, 3}});
  CHECK(groups.count(CommKind::Ep) == 0);  // a group of one
  const Role& role = p.roles[0];
  int64_t expert_elements = 0;
  std::set<int32_t> expert_grads;
  for (const Param& prm : role.params) {
    if (prm.name.find(".experts.") == std::string::npos) continue;
    CHECK(prm.split_comm == CommKind::Ep);  // split one way: every expert on every rank
    CHECK(prm.split_dim == 0);
    CHECK(role.buffers[prm.buffer].shape[0] == 4);
    CHECK_FALSE(prm.tp_replicated);
    CHECK_FALSE(prm.grad_sync_tp);
    expert_elements += role.buffers[prm.buffer].Elements();
    expert_grads.insert(prm.grad);
  }
  CHECK(expert_elements == int64_t{4} * 3 * 4 * 64 * 64);
  const Body& reduce = role.bodies[role.chunks.size() * 2 + 1];
  REQUIRE(reduce.name == "reduce_grads");
  CHECK(CountOps(reduce, OpKind::ReduceScatter, CommKind::Edp) == 1);
  CHECK(CountOps(reduce, OpKind::ReduceScatter, CommKind::Dp) == 1);
  CHECK(CountOps(reduce, OpKind::AllReduce, CommKind::Tp) > 0);  // the router, norms, ...
  for (const Op& op : reduce.ops)
    if (op.comm == CommKind::Tp) CHECK(expert_grads.count(op.inputs[0]) == 0);
  const Body& step = role.bodies[role.chunks.size() * 2 + 2];
  CHECK(CountOps(step, OpKind::AdamW, CommKind::Edp) == 1);
  CHECK(CountOps(step, OpKind::AdamW, CommKind::Dp) == 1);
  CHECK(CountOps(step, OpKind::AllGather, CommKind::Edp) == 1);
  for (const Op& op : step.ops)
    if (op.kind == OpKind::GradNormSquare)
      CHECK(prog::DecodeAttrs<prog::attrs::GradNormSquare>(op).count_once);
  // The expert optimizer state per rank: a quarter of the experts' (padded) bucket.
  REQUIRE(role.buckets.size() == 2);
  int experts_buckets = 0;
  for (const Bucket& b : role.buckets) {
    const bool experts = role.buffers[b.params].name == "chunk0.experts.params";
    experts_buckets += experts ? 1 : 0;
    CHECK(b.shard_elements * (experts ? 4 : 2) == b.elements);
    for (int32_t state : {b.master, b.exp_avg, b.exp_avg_sq})
      CHECK(role.buffers[state].Elements() == b.shard_elements);
    if (experts) {
      CHECK(b.elements >= expert_elements);
      CHECK(b.elements <
            expert_elements + int64_t{3} * 64 + 4);  // alignment between params, rounding
    }
  }
  CHECK(experts_buckets == 1);
  // ZeRO 0: the experts' grads all-reduced over Edp, the update unsharded.
  plan.optimizer.zero = 0;
  const Program z0 = MustLower(plan);
  const Role& r0 = z0.roles[0];
  CHECK(CountOps(r0.bodies[r0.chunks.size() * 2 + 1], OpKind::AllReduce, CommKind::Edp) == 1);
  CHECK(CountOps(r0.bodies[r0.chunks.size() * 2 + 1], OpKind::AllReduce, CommKind::Dp) == 1);
  CHECK(CountOps(r0.bodies[r0.chunks.size() * 2 + 2], OpKind::AdamW, CommKind::None) == 2);
  // ZeRO 2, or no sequence parallelism (every Tp rank then holds the whole expert gradient):
  // the experts stay beside the dense params, sharded over dp, and no rank needs Edp.
  for (bool sp : {true, false}) {
    Plan other = plan;
    other.parallel.sp = sp;
    other.optimizer.zero = sp ? 2 : 1;
    const Program q = MustLower(other);
    for (const Communicator& c : q.communicators) CHECK(c.kind != CommKind::Edp);
    for (const Param& prm : q.roles[0].params) CHECK(prm.split_comm != CommKind::Ep);
    for (const Bucket& b : q.roles[0].buckets) CHECK(b.shard_elements * 2 == b.elements);
  }
}

TEST_CASE("group-limited routing and the scale reach every router, forward and backward") {
  Plan plan = TinyPlan(2, 1, 1);
  plan.model.experts = 8;
  plan.model.topk = 4;
  plan.model.moe_ffn_hidden = 64;
  plan.parallel.sp = true;
  plan.parallel.etp = 2;  // the Etp group routes its gathered rows again
  plan.model.router_groups = 4;
  plan.model.router_group_topk = 2;
  plan.model.router_scale = 2.5;
  int routers = 0, etp_routers = 0, backwards = 0;
  for (const Role& role : MustLower(plan).roles) {
    for (const Chunk& c : role.chunks) {
      for (const Op& op : role.bodies[c.forward].ops) {
        if (op.kind != OpKind::MoeRouter) continue;
        const auto a = prog::DecodeAttrs<prog::attrs::MoeRouter>(op);
        CHECK(a.groups == 4);
        CHECK(a.group_topk == 2);
        CHECK(a.scale == 2.5);
        ++routers;
        etp_routers += role.buffers[op.inputs[0]].name.find("etp") != std::string::npos;
      }
      for (const Op& op : role.bodies[c.backward].ops) {
        if (op.kind != OpKind::MoeRouterBackward) continue;
        CHECK(prog::DecodeAttrs<prog::attrs::MoeRouterBackward>(op).scale == 2.5);
        ++backwards;
      }
    }
  }
  CHECK(etp_routers > 0);
  CHECK(routers == 2 * etp_routers);
  CHECK(backwards == etp_routers);
  // Without them the router's ints and floats are those of a plain router.
  plan.model.router_groups = 1;
  plan.model.router_group_topk = 1;
  plan.model.router_scale = 1;
  for (const Role& role : MustLower(plan).roles)
    for (const Body& body : role.bodies)
      for (const Op& op : body.ops) {
        if (op.kind == OpKind::MoeRouter) {
          CHECK(op.ints.size() == 4);
          CHECK(op.floats.empty());
        }
        if (op.kind == OpKind::MoeRouterBackward) CHECK(op.floats.size() == 2);
      }
}

TEST_CASE("the router as the model states it: sigmoid scores, top-k renormalised, expert bias") {
  Plan plan = TinyPlan(1, 2, 2);
  plan.model.experts = 4;
  plan.model.topk = 2;
  plan.model.moe_ffn_hidden = 64;
  plan.model.router_score = RouterScore::kSigmoid;
  plan.model.router_topk_norm = false;
  plan.model.router_aux_coeff = 0.003;
  plan.model.router_bias_rate = 0.001;
  const Program p = MustLower(plan);
  for (const Role& role : p.roles) {
    int loads = 0, updates = 0, load_reductions = 0, layers = 0;
    for (const Chunk& c : role.chunks) {
      layers += c.layers;
      for (const Op& op : role.bodies[c.forward].ops) {
        if (op.kind != OpKind::MoeRouter) continue;
        const auto a = prog::DecodeAttrs<prog::attrs::MoeRouter>(op);
        CHECK(a.score == 1);
        CHECK_FALSE(a.normalize);
        REQUIRE(op.inputs.size() == 2);  // logits and the expert bias
        CHECK(role.buffers[op.inputs[1]].kind == prog::BufferKind::State);
      }
      for (const Op& op : role.bodies[c.backward].ops) {
        if (op.kind == OpKind::MoeRouterBackward)
          CHECK(prog::DecodeAttrs<prog::attrs::MoeRouterBackward>(op).aux_coeff ==
                doctest::Approx(0.003));
        loads += op.kind == OpKind::MoeExpertLoad;
      }
    }
    for (const Op& op : role.bodies[role.bodies.size() - 1].ops) {
      if (op.kind == OpKind::MoeExpertBiasUpdate) {
        ++updates;
        CHECK(prog::DecodeAttrs<prog::attrs::MoeExpertBiasUpdate>(op).rate ==
              doctest::Approx(0.001));
      }
      if (op.kind == OpKind::AllReduce && op.comm == CommKind::Dp &&
          role.buffers[op.inputs[0]].name.find("expert_load") != std::string::npos)
        ++load_reductions;
    }
    CHECK(loads == layers);  // every layer is MoE: one load per layer's backward
    CHECK(updates == layers);
    CHECK(load_reductions == layers);
  }
}
// --- expert tensor parallelism ---
namespace {
// Collectives of `kind` over Etp in the forward (first) and backward (second) bodies.
std::pair<int, int> EtpCollectives(const Program& p, OpKind kind) {
  std::pair<int, int> n{0, 0};
  for (const Role& role : p.roles)
    for (const Chunk& c : role.chunks) {
      n.first += CountOps(role.bodies[c.forward], kind, CommKind::Etp);
      n.second += CountOps(role.bodies[c.backward], kind, CommKind::Etp);
    }
  return n;
}
}  // namespace

TEST_CASE(
    "expert tensor parallelism: experts split over the Etp groups (the Tp groups), the rows "
    "gathered before dispatch, the partial outputs reduce-scattered") {
  Plan plan = TinyPlan(2, 2, 1);
  plan.parallel.sp = true;
  plan.parallel.etp = 2;
  SetTinyMoe(plan.model);  // MoE layers 1, 3, 5, 7
  const Program p = MustLower(plan);
  // The Etp communicators are the Tp groups, member for member.
  std::set<std::vector<int32_t>> tp, etp;
  for (const Communicator& c : p.communicators) {
    if (c.kind == CommKind::Tp) tp.insert(c.members);
    if (c.kind == CommKind::Etp) etp.insert(c.members);
  }
  CHECK(etp.size() == 2);
  CHECK(etp == tp);
  for (const Rank& r : p.ranks) CHECK(r.comms[static_cast<int>(CommKind::Etp)] >= 0);
  // gate/up split by rows of ffn, down by columns, over Etp; the router whole.
  int split = 0;
  for (const Role& role : p.roles)
    for (const Param& prm : role.params) {
      if (prm.name.find(".moe.") == std::string::npos ||
          prm.name.find("shared") != std::string::npos)
        continue;
      const std::vector<int64_t>& local = role.buffers[prm.buffer].shape;
      if (prm.name.find("router") != std::string::npos) {
        CHECK(prm.split_dim == -1);
        CHECK(prm.tp_replicated);
        continue;
      }
      ++split;
      CAPTURE(prm.name);
      CHECK(prm.split_comm == CommKind::Etp);
      CHECK_FALSE(prm.tp_replicated);
      CHECK_FALSE(prm.grad_sync_tp);
      if (prm.name.find("w_down") != std::string::npos) {
        CHECK(prm.split_dim == 2);
        CHECK(local == std::vector<int64_t>{4, 64, 32});
      } else {
        CHECK(prm.split_dim == 1);
        CHECK(local == std::vector<int64_t>{4, 32, 64});
      }
    }
  CHECK(split == 4 * 3);
  // Per MoE layer: the rows and the router logits gathered, the combined output reduce-scattered;
  // in the backward the output gradient gathered, the router weights' and the inputs' gradients
  // reduce-scattered. The routed buffers hold every choice of the group's tokens.
  CHECK(EtpCollectives(p, OpKind::AllGather) == std::make_pair(4 * 2, 4 * 1));
  CHECK(EtpCollectives(p, OpKind::ReduceScatter) == std::make_pair(4 * 1, 4 * 2));
  CHECK(EtpCollectives(p, OpKind::AllReduce) == std::make_pair(0, 0));
  for (const Role& role : p.roles)
    for (const Buffer& b : role.buffers)
      if (b.name.find("moe.permuted") != std::string::npos)
        CHECK(b.shape == std::vector<int64_t>{int64_t{2} * 32 * 2, 64});  // tokens · topk
  // The shared expert reads the rows the Etp group gathered: no second gather over Tp.
  for (const Role& role : p.roles)
    for (const Buffer& b : role.buffers) {
      CAPTURE(b.name);
      CHECK(b.name.find("moe.shared.down.grad_full") == std::string::npos);
      for (const char* layer : {"layers.1.", "layers.3.", "layers.5.", "layers.7."})
        CHECK(b.name.find(std::string(layer) + "mlp_norm.out_full") == std::string::npos);
    }
  // Without sequence parallelism every rank holds every row: the partial sums are all-reduced.
  plan.parallel.sp = false;
  const Program replicated = MustLower(plan);
  CHECK(EtpCollectives(replicated, OpKind::AllGather) == std::make_pair(0, 0));
  CHECK(EtpCollectives(replicated, OpKind::ReduceScatter) == std::make_pair(0, 0));
  CHECK(EtpCollectives(replicated, OpKind::AllReduce) == std::make_pair(4 * 1, 4 * 2));
  // A dense model states no Etp communicator, whatever etp is.
  Plan dense = TinyPlan(2, 2, 1);
  dense.parallel.etp = 2;
  for (const Communicator& c : MustLower(dense).communicators) CHECK(c.kind != CommKind::Etp);
}

TEST_CASE("expert tensor parallelism other than etp = tp, or off the Tp groups, is P0801") {
  auto moe = [](int64_t tp, int64_t dp, int64_t etp) {
    Plan plan = TinyPlan(tp, 1, dp);
    plan.parallel.etp = etp;
    plan.model.experts = 4;
    plan.model.topk = 2;
    plan.model.moe_ffn_hidden = 64;
    return plan;
  };
  auto refusal = [](const Plan& plan) {
    DiagnosticSink sink;
    CHECK_FALSE(LowerPlan(plan, {}, sink).has_value());
    REQUIRE(!sink.diagnostics().empty());
    CHECK(sink.diagnostics()[0].kind == DiagKind::kLowerUnsupported);
    return sink.diagnostics()[0].message;
  };
  CHECK(refusal(moe(2, 2, 4)) ==
        "lowering does not emit experts split by tensor parallelism over etp = 4 ranks, other "
        "than tp = 2 yet");
  CHECK(refusal(moe(1, 2, 2)) ==
        "lowering does not emit experts split by tensor parallelism over etp = 2 ranks, other "
        "than tp = 1 yet");
  // Beside expert parallelism it lowers (see "expert parallelism beside expert tensor
  // parallelism").
  Plan ep = moe(2, 2, 2);
  ep.parallel.ep = 2;
  MustLower(ep);
  // Context parallelism laid inside the Tp groups: the expert mesh has no cp, so its Etp groups
  // are other ranks than the Tp groups.
  Plan cp = moe(2, 1, 2);
  cp.parallel.cp = 2;
  cp.cluster.gpus_per_node = 4;
  cp.parallel.order = "cp-tp-dp-pp";
  CHECK(refusal(cp).find("the expert-tensor-parallel groups differ from the tensor-parallel "
                         "groups") != std::string::npos);
  cp.parallel.order = "tp-cp-dp-pp";
  MustLower(cp);
  // Each expert's ffn must split evenly.
  Plan odd = moe(2, 1, 2);
  odd.model.moe_ffn_hidden = 63;
  DiagnosticSink sink;
  CHECK_FALSE(LowerPlan(odd, {}, sink).has_value());
  REQUIRE(!sink.diagnostics().empty());
  CHECK(sink.diagnostics()[0].message == "moe_ffn_hidden = 63 is not a multiple of etp = 2");
}
// --- end expert tensor parallelism ---
// --- end mixture of experts ---

TEST_CASE("a program that fails verification is not returned: P0804 with the verifier's messages") {
  LowerOptions options;
  options.before_verify = [](Program& p) {
    auto& s = p.roles[1].schedule;
    s.erase(std::find_if(s.begin(), s.end(),
                         [](const Op& op) { return op.kind == OpKind::RecvActivation; }));
  };
  DiagnosticSink sink;
  CHECK_FALSE(LowerPlan(TinyPlan(1, 2, 1), options, sink).has_value());
  REQUIRE(sink.diagnostics().size() == 1);
  CHECK(sink.diagnostics()[0].kind == DiagKind::kLowerVerify);
  CHECK(sink.diagnostics()[0].message.find(
            "rank 0 (stage0) sends 8 transfers to rank 1 (stage1), which receives 7") !=
        std::string::npos);
}

TEST_CASE(
    "recompute: full re-emits each layer's forward with its TP/SP collectives in the backward "
    "body") {
  Plan plan = TinyPlan(2, 2, 1);
  plan.parallel.sp = true;
  Program none = MustLower(plan);
  plan.recompute = Recompute::kFull;
  Program full = MustLower(plan);  // verified: the recomputed collectives match on every Tp group
  plan.recompute = Recompute::kSelective;
  Program selective = MustLower(plan);
  for (size_t r = 0; r < none.roles.size(); ++r) {
    CAPTURE(r);
    const Role& a = none.roles[r];
    const Role& b = full.roles[r];
    const Role& c = selective.roles[r];
    const int layers = a.chunks[0].layers;
    const Body& fa = a.bodies[a.chunks[0].forward];
    const Body& fb = b.bodies[b.chunks[0].forward];
    const Body& ba = a.bodies[a.chunks[0].backward];
    const Body& bb = b.bodies[b.chunks[0].backward];
    CHECK(fa.ops.size() == fb.ops.size());  // the forward itself is unchanged
    // Per layer the two norm outputs are gathered once in either (the recomputed forward's, or
    // again from the kept rows) and one reduce-scatter (attention output) is re-run; the MLP's
    // reduce-scatter feeds only the residual add, which nothing reads.
    CHECK(CountOps(bb, OpKind::AllGather, CommKind::Tp) ==
          CountOps(ba, OpKind::AllGather, CommKind::Tp));
    CHECK(CountOps(bb, OpKind::ReduceScatter, CommKind::Tp) ==
          CountOps(ba, OpKind::ReduceScatter, CommKind::Tp) + layers);
    CHECK(CountOps(bb, OpKind::Attention, CommKind::None) == layers);
    CHECK(CountOps(c.bodies[c.chunks[0].backward], OpKind::Attention, CommKind::None) == layers);
    // Stash: full keeps the layer inputs (and the chunk's boundary buffers), far fewer buffers.
    auto stash = [](const Role& role) {
      return std::count_if(role.buffers.begin(), role.buffers.end(),
                           [](const Buffer& x) { return x.kind == BufferKind::Stash; });
    };
    CHECK(stash(b) < stash(c));
    CHECK(stash(c) == stash(a) - layers);  // selective: no log-sum-exp per layer
    CHECK(b.peak_bytes < a.peak_bytes);
  }
}

TEST_CASE("memory breakdown of a program read back from its file equals the compiled one's") {
  Plan plan = TinyPlan(2, 2, 2, Schedule::kInterleaved1F1B, 2);
  plan.parallel.sp = true;
  plan.optimizer.zero = 3;
  plan.recompute = Recompute::kSelective;
  Program p = MustLower(plan);
  std::vector<uint8_t> bytes = ToFlatBuffer(p);
  std::string error;
  std::optional<Program> q = FromFlatBuffer(bytes.data(), bytes.size(), &error);
  REQUIRE(q.has_value());
  for (size_t r = 0; r < p.roles.size(); ++r) {
    MemoryBreakdown a = MeasureMemory(p.roles[r]), b = MeasureMemory(q->roles[r]);
    CHECK(a.stash == b.stash);
    CHECK(a.scratch == b.scratch);
    CHECK(a.Total() == b.Total());
    CHECK(b.Total() == q->roles[r].peak_bytes);
  }
}

TEST_CASE("structural damage is reported before simulation") {
  // Verification itself is exercised above; here only the wiring: a program with a broken
  // structure yields the diagnostic through VerifyWorld's first message.
  Program p = MustLower(TinyPlan(1, 2, 1), false);
  p.roles[0].schedule[1].ints[1] = 7;  // chunk out of range
  CHECK(Joined(VerifyWorld(p)).find("chunk = 7 lies outside 0 .. 0") != std::string::npos);
}

TEST_CASE(
    "a bucket naming a buffer out of range is refused on read, before `planc dump` sizes it") {
  // `planc dump` measures each role's memory from its buckets: an index past the buffers (one
  // damaged byte) crashed it while the structure check passed.
  Program p = MustLower(TinyPlan(1, 1, 2), false);
  REQUIRE(!p.roles[0].buckets.empty());
  for (int32_t Bucket::*field : {&Bucket::grads, &Bucket::params}) {
    Program q = p;
    q.roles[0].buckets[0].*field = static_cast<int32_t>(q.roles[0].buffers.size()) + 0x20000;
    const std::vector<uint8_t> bytes = ToFlatBuffer(q);
    std::string error;
    CHECK(!FromFlatBuffer(bytes.data(), bytes.size(), &error).has_value());
    CHECK(error.find("bucket 0 names a buffer out of range") != std::string::npos);
  }
  Program q = p;
  q.roles[0].buckets[0].exp_avg = -2;
  CHECK(Joined(VerifyStructure(q)).find("bucket 0 names a buffer out of range") !=
        std::string::npos);
}

// --- context parallelism ---

Plan CpPlan(int64_t cp, int64_t tp, int64_t dp) {
  Plan plan = TinyPlan(tp, 1, dp);
  plan.parallel.cp = cp;
  plan.cluster.gpus_per_node = tp * dp * cp;
  return plan;
}

TEST_CASE(
    "context parallelism: ring attention over Cp, the rank's tokens, loss and grads over DpCp") {
  const Program p = MustLower(CpPlan(2, 2, 2));
  const Role& role = p.roles[0];
  const Body& fwd = role.bodies[role.chunks[0].forward];
  const Body& bwd = role.bodies[role.chunks[0].backward];
  const Body& reduce = role.bodies[role.schedule[role.schedule.size() - 2].ints[0]];
  const Body& step = role.bodies[role.schedule.back().ints[0]];
  CHECK(CountOps(fwd, OpKind::RingAttention, CommKind::Cp) == 8);
  CHECK(CountOps(bwd, OpKind::RingAttentionBackward, CommKind::Cp) == 8);
  CHECK(CountOps(fwd, OpKind::Attention, CommKind::None) == 0);
  CHECK(CountOps(bwd, OpKind::AttentionBackward, CommKind::None) == 0);
  CHECK(CountOps(fwd, OpKind::Rope, CommKind::Cp) == 16);
  CHECK(CountOps(bwd, OpKind::RopeBackward, CommKind::Cp) == 16);
  CHECK(CountOps(fwd, OpKind::LoadBatch, CommKind::Cp) == 2);
  CHECK(CountOps(reduce, OpKind::AllReduce, CommKind::DpCp) == 1);
  CHECK(CountOps(reduce, OpKind::AllReduce, CommKind::Dp) == 0);
  CHECK(CountOps(step, OpKind::AllReduce, CommKind::DpCp) == 1);  // the loss average
  // A rank holds micro · seq / cp = 2 · 32 / 2 tokens; the ring's working buffers are scratch.
  for (const Op& op : fwd.ops) {
    if (op.kind == OpKind::LoadBatch) CHECK(role.buffers[op.outputs[0]].Elements() == 32);
    if (op.kind != OpKind::RingAttention) continue;
    CHECK(role.buffers[op.outputs[1]].shape == std::vector<int64_t>{32, 2});  // lse [T, H]
    for (size_t i = 2; i < op.outputs.size(); ++i)
      CHECK(role.buffers[op.outputs[i]].kind == BufferKind::Scratch);
  }
  for (const Op& op : bwd.ops)
    if (op.kind == OpKind::CrossEntropyBackward)
      CHECK(prog::DecodeAttrs<prog::attrs::CrossEntropyBackward>(op).grad_scale ==
            doctest::Approx(1.0 / (8 * 2 * 2)));
}

TEST_CASE("mutation: a ring attention one Cp member skips is caught") {
  Program p = MustLower(CpPlan(2, 1, 1), false);
  Role& role = SplitRole(p, 1);
  std::vector<Op>& ops = role.bodies[role.chunks[0].forward].ops;
  auto it = std::find_if(ops.begin(), ops.end(),
                         [](const Op& op) { return op.kind == OpKind::RingAttention; });
  REQUIRE(it != ops.end());
  ops.erase(it);
  const std::string errors = Joined(VerifyWorld(p));
  CHECK(errors.find("cp communicator 1: collective #7 inside the bodies differs between rank 0 "
                    "(stage0): ring_attention of forward") != std::string::npos);
}

TEST_CASE(
    "context parallelism: learned positions over Cp, ZeRO over DpCp, sequences that do not chunk") {
  Plan learned = CpPlan(2, 2, 1);
  learned.model.position = Position::kLearned;
  learned.parallel.sp = true;
  const Program lp = MustLower(learned);
  const Role& lrole = lp.roles[0];
  CHECK(CountOps(lrole.bodies[lrole.chunks[0].forward], OpKind::AddPosition, CommKind::Cp) == 1);
  CHECK(CountOps(lrole.bodies[lrole.chunks[0].backward], OpKind::AddPositionBackward,
                 CommKind::Cp) == 1);

  for (int64_t zero : {1, 3}) {
    CAPTURE(zero);
    Plan plan = CpPlan(2, 1, 2);
    plan.optimizer.zero = zero;
    const Program p = MustLower(plan);
    const Role& role = p.roles[0];
    const Body& step = role.bodies[role.schedule.back().ints[0]];
    for (const Bucket& b : role.buckets) CHECK(b.shard_elements * 4 == b.elements);
    CHECK(CountOps(step, OpKind::AdamW, CommKind::DpCp) == static_cast<int>(role.buckets.size()));
    CHECK(CountOps(step, OpKind::GradNormSquare, CommKind::DpCp) == 1);
    int on_dp = 0;
    for (const Body& body : role.bodies)
      for (const Op& op : body.ops) on_dp += op.comm == CommKind::Dp ? 1 : 0;
    CHECK(on_dp == 0);
    const Body& bwd = role.bodies[role.chunks[0].backward];
    if (zero == 1) {
      const Body& reduce = role.bodies[role.schedule[role.schedule.size() - 2].ints[0]];
      CHECK(CountOps(reduce, OpKind::ReduceScatter, CommKind::DpCp) ==
            static_cast<int>(role.buckets.size()));
      CHECK(CountOps(step, OpKind::AllGather, CommKind::DpCp) ==
            static_cast<int>(role.buckets.size()));
    } else {
      CHECK(CountOps(bwd, OpKind::ReduceScatter, CommKind::DpCp) > 0);
      CHECK(CountOps(role.bodies[role.chunks[0].forward], OpKind::AllGather, CommKind::DpCp) > 0);
    }
  }

  Plan odd = CpPlan(4, 1, 1);
  odd.model.seq_len = 36;  // 36 mod 8 = 4
  DiagnosticSink s3;
  CHECK_FALSE(LowerPlan(odd, {}, s3).has_value());
  REQUIRE(s3.diagnostics().size() >= 1);
  CHECK(s3.diagnostics()[0].kind == DiagKind::kLowerShape);
  CHECK(s3.diagnostics()[0].message == "seq_len = 36 does not cut into 2 · cp = 8 equal chunks");
}
// --- end context parallelism ---

TEST_CASE("full recompute by layers: which layers keep only their input") {
  // The eight layers of TinyPlan in one chunk: the layers whose buffers the backward re-creates,
  // and how many layers keep their q from the forward to the backward.
  auto recomputed = [](RecomputeMethod method, int64_t layers) {
    Plan plan = TinyPlan(1, 1, 1);
    REQUIRE(plan.model.layers == 8);
    plan.recompute = Recompute::kFull;
    plan.activations.recompute_method = method;
    plan.activations.recompute_layers = layers;
    const Program p = MustLower(plan);
    std::set<int> out;
    int stashed_q = 0;
    for (const Buffer& b : p.roles[0].buffers)
      for (int l = 0; l < 8; ++l) {
        const std::string layer = "layers." + std::to_string(l) + ".";
        if (b.name.rfind(layer + "recompute.", 0) == 0) out.insert(l);
        if (b.name == layer + "q" && b.kind == BufferKind::Stash) ++stashed_q;
      }
    return std::make_pair(out, stashed_q);
  };
  // Block: the first n layers of the chunk recompute, the others keep everything.
  CHECK(recomputed(RecomputeMethod::kBlock, 1) == std::make_pair(std::set<int>{0}, 7));
  CHECK(recomputed(RecomputeMethod::kBlock, 3) == std::make_pair(std::set<int>{0, 1, 2}, 5));
  // Uniform: every layer is recomputed, in groups; nothing but the groups' inputs is kept.
  const std::set<int> all = {0, 1, 2, 3, 4, 5, 6, 7};
  CHECK(recomputed(RecomputeMethod::kUniform, 3) == std::make_pair(all, 0));
  CHECK(recomputed(RecomputeMethod::kUniform, 0) == std::make_pair(all, 0));
  // A model with experts lowers with either method; uniform groups mix layers of both kinds.
  Plan moe = TinyPlan(1, 1, 1);
  moe.model.experts = 4;
  moe.model.topk = 2;
  moe.model.moe_ffn_hidden = 64;
  moe.recompute = Recompute::kFull;
  moe.activations.recompute_layers = 3;
  for (RecomputeMethod method : {RecomputeMethod::kUniform, RecomputeMethod::kBlock}) {
    moe.activations.recompute_method = method;
    int remade_router = 0;
    const Program p = MustLower(moe);
    for (const Buffer& b : p.roles[0].buffers)
      remade_router += b.name.find("recompute.moe.router.logits") != std::string::npos;
    CHECK(remade_router == (method == RecomputeMethod::kUniform ? moe.model.layers : 3));
  }
}

TEST_CASE("selective recompute of the experts' activation: not kept, made again in the backward") {
  Plan plan = TinyPlan(1, 1, 1);
  plan.model.experts = 4;
  plan.model.topk = 2;
  plan.model.moe_ffn_hidden = 64;
  plan.recompute = Recompute::kSelective;
  for (const char* modules : {"moe_act", "core_attn,moe_act", "core_attn"}) {
    CAPTURE(modules);
    plan.activations.recompute_modules = modules;
    const Program p = MustLower(plan);
    int kept_act = 0, remade_act = 0, kept_lse = 0;
    for (const Buffer& b : p.roles[0].buffers) {
      const bool stash = b.kind == BufferKind::Stash;
      if (b.name.size() > 17 && b.name.find(".moe.experts.act") != std::string::npos &&
          b.name.find(".grad") == std::string::npos) {
        if (b.name.find("recompute.") != std::string::npos)
          ++remade_act;
        else
          kept_act += stash;
      }
      if (b.name.find("attention.lse") != std::string::npos && stash) ++kept_lse;
    }
    const std::string m = modules;
    CHECK((kept_act == 0) == (m.find("moe_act") != std::string::npos));
    CHECK((remade_act > 0) == (m.find("moe_act") != std::string::npos));
    CHECK((kept_lse == 0) == (m.find("core_attn") != std::string::npos));
  }
  // The mlp module: a dense layer's MLP intermediates are not kept, and made again.
  Plan dense = TinyPlan(1, 1, 1);
  dense.recompute = Recompute::kSelective;
  dense.activations.recompute_modules = "mlp";
  const Program lowered = MustLower(dense);
  int kept_mlp = 0, remade_mlp = 0;
  for (const Buffer& b : lowered.roles[0].buffers) {
    if (b.name == "layers.0.mlp.act" && b.kind == BufferKind::Stash) ++kept_mlp;
    if (b.name == "layers.0.recompute.mlp.act") ++remade_mlp;
  }
  CHECK(kept_mlp == 0);
  CHECK(remade_mlp == 1);
  // Every module lowers; offloading the activations instead is refused.
  plan.activations.offload_layers = 1;
  DiagnosticSink sink;
  CHECK_FALSE(LowerPlan(plan, {}, sink).has_value());
  REQUIRE(!sink.diagnostics().empty());
  CHECK(sink.diagnostics()[0].message.find("activation offload") != std::string::npos);
}

TEST_CASE("selective recompute of the MoE block: only its input kept, the block made again") {
  Plan plan = TinyPlan(2, 1, 1);
  plan.parallel.sp = true;
  plan.model.experts = 4;
  plan.model.topk = 2;
  plan.model.moe_ffn_hidden = 64;
  plan.recompute = Recompute::kSelective;
  plan.activations.recompute_modules = "moe,moe_act";
  const Program lowered = MustLower(plan);
  std::map<std::string, BufferKind> kinds;
  std::map<std::string, int> made;
  for (const Buffer& b : lowered.roles[0].buffers) {
    kinds[b.name] = b.kind;
    ++made[b.name];
  }
  for (int l = 0; l < plan.model.layers; ++l) {
    const std::string layer = "layers." + std::to_string(l) + ".";
    CAPTURE(layer);
    for (const char* name :
         {"moe.router.logits", "moe.permuted", "moe.experts.act", "moe.experts.out"}) {
      CHECK(kinds.at(layer + name) == BufferKind::Scratch);
      // Made once more (moe_act inside the moe module adds no second activation).
      CHECK(made[layer + "recompute." + name] == 1);
    }
    CHECK(kinds.at(layer + "mlp_norm.out") == BufferKind::Stash);  // the block's input
  }
}

TEST_CASE("selective recompute of latent attention's up projections (mla_up_proj)") {
  Plan plan = MlaPlan(2, 1, 1);
  plan.recompute = Recompute::kSelective;
  plan.activations.recompute_modules = "mla_up_proj";
  const Program lowered = MustLower(plan);
  std::map<std::string, BufferKind> kinds;
  for (const Buffer& b : lowered.roles[0].buffers) kinds[b.name] = b.kind;
  // q, k and v (padded) are made again from the kept latents and the kv latent's rope columns.
  for (const char* name : {"q", "k", "v_padded", "attention.kv"}) {
    CAPTURE(name);
    CHECK(kinds.at(std::string("layers.0.") + name) == BufferKind::Scratch);
    CHECK(kinds.count(std::string("layers.0.recompute.") + name) == 1);
  }
  for (const char* name : {"attention.kv_latent_rope", "attention.kv_norm.out",
                           "attention.q_norm.out", "attention.out"})
    CHECK(kinds.at(std::string("layers.0.") + name) == BufferKind::Stash);
}

TEST_CASE("selective recompute of the norms: their outputs and statistics made again") {
  Plan plan = TinyPlan(2, 1, 1);
  plan.parallel.sp = true;
  plan.recompute = Recompute::kSelective;
  plan.activations.recompute_modules = "layernorm";
  const Program lowered = MustLower(plan);
  std::map<std::string, BufferKind> kinds;
  for (const Buffer& b : lowered.roles[0].buffers) kinds[b.name] = b.kind;
  // The norms' gathered outputs and statistics are no longer kept between the passes; each is
  // made again in the backward from the kept residual stream.
  for (const char* name : {"layers.1.attention_norm.out_full", "layers.1.mlp_norm.out_full",
                           "layers.1.attention_norm.rstd", "layers.1.mlp_norm.rstd"}) {
    CAPTURE(name);
    REQUIRE(kinds.count(name) == 1);
    CHECK(kinds[name] == BufferKind::Scratch);
    CHECK(kinds.count(std::string("layers.1.recompute.") + (name + 9)) == 1);
  }
  CHECK(kinds.at("layers.1.residual1") == BufferKind::Stash);
}

TEST_CASE("hybrid sharding: ZeRO over each replica's Shard group, gradients over Replicate") {
  Plan plan = TinyPlan(1, 1, 4);
  plan.optimizer.zero = 3;
  plan.fsdp.replicate = 2;
  const Program p = MustLower(plan);
  CHECK(p.parallel.replicate == 2);
  std::map<CommKind, std::vector<std::vector<int32_t>>> groups;
  for (const Communicator& c : p.communicators) groups[c.kind].push_back(c.members);
  CHECK(groups[CommKind::Shard] == std::vector<std::vector<int32_t>>{{0, 1}, {2, 3}});
  CHECK(groups[CommKind::Replicate] == std::vector<std::vector<int32_t>>{{0, 2}, {1, 3}});
  const Role& role = p.roles[0];
  for (const Bucket& b : role.buckets) CHECK(b.shard_elements * 2 == b.elements);
  const Body& fwd = role.bodies[role.chunks[0].forward];
  CHECK(CountOps(fwd, OpKind::AllGather, CommKind::Shard) > 0);
  CHECK(CountOps(fwd, OpKind::AllGather, CommKind::Dp) == 0);
  const Body& reduce = role.bodies[role.chunks.size() * 2 + 1];
  CHECK(CountOps(reduce, OpKind::AllReduce, CommKind::Replicate) ==
        static_cast<int>(role.buckets.size()));
  // A shard group of one rank: plain data parallelism (nothing sharded, grads over Dp).
  plan.fsdp.replicate = 4;
  const Program ddp = MustLower(plan);
  for (const Bucket& b : ddp.roles[0].buckets) CHECK(b.shard_elements == b.elements);
  for (const Communicator& c : ddp.communicators) CHECK(c.kind != CommKind::Shard);
}

TEST_CASE("sliding-window attention: the window rides on the attention ops and the model record") {
  Plan plan = TinyPlan(2, 1, 1);
  plan.model.window = 6;
  Plan ring = plan;
  ring.parallel.cp = 2;
  ring.cluster.gpus_per_node = 4;
  for (const Plan& each : {plan, ring}) {
    const Program p = MustLower(each);
    CHECK(p.model.window == 6);
    int cores = 0;
    for (const Body& body : p.roles[0].bodies)
      for (const Op& op : body.ops) {
        if (op.kind == OpKind::Attention)
          CHECK(prog::DecodeAttrs<prog::attrs::Attention>(op).window == 6);
        if (op.kind == OpKind::AttentionBackward)
          CHECK(prog::DecodeAttrs<prog::attrs::AttentionBackward>(op).window == 6);
        if (op.kind == OpKind::RingAttention)
          CHECK(prog::DecodeAttrs<prog::attrs::RingAttention>(op).window == 6);
        if (op.kind == OpKind::RingAttentionBackward)
          CHECK(prog::DecodeAttrs<prog::attrs::RingAttentionBackward>(op).window == 6);
        cores += op.kind == OpKind::Attention || op.kind == OpKind::RingAttention;
      }
    CHECK(cores == each.model.layers);
    std::vector<uint8_t> bytes = ToFlatBuffer(p);
    std::string error;
    std::optional<Program> back = FromFlatBuffer(bytes.data(), bytes.size(), &error);
    REQUIRE_MESSAGE(back.has_value(), error);
    CHECK(back->model.window == 6);
  }
  // Without a window the attention ops keep their five ints (programs as before).
  const Program plain = MustLower(TinyPlan(2, 1, 1));
  for (const Body& body : plain.roles[0].bodies)
    for (const Op& op : body.ops)
      if (op.kind == OpKind::Attention) CHECK(op.ints.size() == 5);
}

TEST_CASE("query/key norms: one replicated weight per norm, its gradient summed over Tp") {
  Plan plan = TinyPlan(2, 1, 1);
  plan.model.qk_norm = true;
  const Program p = MustLower(plan);
  CHECK(p.model.qk_norm);
  for (const Role& role : p.roles) {
    int norms = 0;
    for (const Param& prm : role.params) {
      if (prm.name.find("_norm.weight") == std::string::npos ||
          prm.name.find("attention.") == std::string::npos)
        continue;
      CAPTURE(prm.name);
      CHECK(prm.global_shape == std::vector<int64_t>{plan.model.head_dim});
      CHECK(prm.tp_replicated);
      CHECK(prm.grad_sync_tp);
      ++norms;
    }
    CHECK(norms == 2 * plan.model.layers);
    // Every layer normalises q and k (forward) and runs their norms' backward.
    int forward = 0, backward = 0;
    for (const Body& body : role.bodies)
      for (const Op& op : body.ops) {
        forward += op.kind == OpKind::RmsNorm;
        backward += op.kind == OpKind::RmsNormBackward;
      }
    // Two residual norms per layer and the final norm, plus the two query/key norms per layer.
    CHECK(forward == 4 * plan.model.layers + 1);
    CHECK(backward == 4 * plan.model.layers + 1);
  }
  // Latent attention normalises its latents instead: refused.
  Plan mla = MlaPlan(1, 1, 1);
  mla.model.qk_norm = true;
  DiagnosticSink sink;
  CHECK_FALSE(LowerPlan(mla, {}, sink).has_value());
  REQUIRE(!sink.diagnostics().empty());
  CHECK(sink.diagnostics()[0].kind == DiagKind::kLowerUnsupported);
  CHECK(sink.diagnostics()[0].message.find("query/key normalisation with multi-head latent") !=
        std::string::npos);
}

}  // namespace
}  // namespace paraplan::lower
