#include "compiler/analyze/memory.h"

#include <algorithm>
#include <cstdio>

#include "compiler/analyze/cost_comm.h"
#include "compiler/analyze/cost_shape.h"
#include "compiler/analyze/cost_stages.h"

namespace paraplan {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

int64_t Scale(int64_t count, double bytes_per) {
  const double v = static_cast<double>(count) * bytes_per;
  if (!(v < 9.0e18)) return INT64_MAX;
  return static_cast<int64_t>(v + 0.5);
}

// --- planrun's static arena (framework = paraplan) -----------------------------------------
//
// What compiler/lower allocates, term by term, so that `check` and `compile` tell one truth:
// the buffers a chunk's forward and backward both touch are stashed once per in-flight
// microbatch (body.cpp, ClassifyStash), the slots per chunk are the most microbatches of that
// chunk in flight at once in the schedule (lower.cpp, AssignSlots), and everything else lives
// in a scratch region as large as the busiest op of any body (memory_plan.cpp).

struct ArenaSizes {
  int64_t t = 1;        // tensor parallel
  int64_t T = 0;        // tokens of a microbatch: micro · seq
  int64_t R = 0;        // rows a TP rank holds between layers: T / t under SP, else T
  int64_t h = 0, hd = 0, heads = 0, kv = 0, ffn = 0, vocab = 0;  // per TP rank where split
  int64_t a = 2;        // activation element bytes of the program's precision
  bool gelu = false, layernorm = false;
};

ArenaSizes ArenaSizesOf(const Plan& plan) {
  const ModelSpec& m = plan.model;
  ArenaSizes z;
  z.t = std::max<int64_t>(1, plan.parallel.tp);
  z.T = SatMul(plan.batch.micro, m.seq_len);
  z.R = plan.parallel.sp && z.t > 1 ? z.T / z.t : z.T;
  z.h = m.hidden;
  z.hd = m.head_dim > 0 ? m.head_dim : m.hidden / std::max<int64_t>(1, m.heads);
  z.heads = m.heads / z.t;
  z.kv = std::max<int64_t>(1, (m.kv_heads > 0 ? m.kv_heads : m.heads) / z.t);
  z.ffn = m.ffn_hidden / z.t;
  const int64_t multiple = 128 * z.t;
  z.vocab = CeilDiv(m.vocab, multiple) * multiple / z.t;
  z.a = plan.precision == Precision::kFp32 ? 4 : 2;
  z.gelu = m.activation != Activation::kSwiGlu;
  z.layernorm = m.norm == Norm::kLayerNorm;
  return z;
}

// Stashed bytes of one layer per microbatch: its input x and, unless the whole layer is
// recomputed, the gathered norm outputs, q, k, v, the attention output (and its softmax
// statistics unless selective recompute redoes the core), the residual, the MLP intermediates and
// the norms' fp32 statistics.
int64_t ArenaLayerStash(const ArenaSizes& z, Recompute recompute) {
  int64_t bytes = SatMul(z.R, z.h * z.a);  // x
  if (recompute == Recompute::kFull) return bytes;
  const int64_t per_token = 2 * z.h + 2 * z.heads * z.hd + 2 * z.kv * z.hd + (z.gelu ? 2 : 3) * z.ffn;
  bytes = SatAdd(bytes, SatMul(z.T, per_token * z.a));       // n1f, n2f, q, o, k, v, MLP
  bytes = SatAdd(bytes, SatMul(z.R, z.h * z.a));             // residual x1
  bytes = SatAdd(bytes, SatMul(z.R, (z.layernorm ? 4 : 2) * 4));  // rstd (and mean) of both norms
  if (recompute == Recompute::kNone) bytes = SatAdd(bytes, SatMul(z.T, z.heads * 4));  // lse
  return bytes;
}

// Stashed bytes of a chunk beyond its layers, per microbatch: the chunk's output and the
// gradient arriving for it; token ids on the embedding chunk; on the loss chunk the final norm's
// statistics and gathered output, the logits, labels and cross-entropy statistics.
int64_t ArenaChunkExtra(const ArenaSizes& z, bool embedding, bool loss) {
  int64_t bytes = SatMul(2, SatMul(z.R, z.h * z.a));
  if (embedding) bytes = SatAdd(bytes, SatMul(z.T, 4));
  if (loss) {
    bytes = SatAdd(bytes, SatMul(z.R, (z.layernorm ? 2 : 1) * 4));
    bytes = SatAdd(bytes, SatMul(z.T, (z.h + z.vocab) * z.a));
    bytes = SatAdd(bytes, SatMul(z.T, 4 + 4 + 8));
  }
  return bytes;
}

// The busiest op of a chunk's bodies (scratch): the MLP and attention backward of one layer
// (with the recomputed layer under full recompute, the recomputed core under selective), and on
// the loss chunk the logits' gradient with the final norm's.
int64_t ArenaBodyPeak(const ArenaSizes& z, Recompute recompute, bool loss) {
  const int64_t mlp = z.gelu ? std::max(2 * z.ffn, z.ffn + z.h) + z.h : std::max(3 * z.ffn, 2 * z.ffn + z.h);
  int64_t attn = 2 * z.heads * z.hd + 2 * z.kv * z.hd;
  attn = std::max(attn, z.heads * z.hd + 2 * z.kv * z.hd + z.h);
  int64_t peak = SatMul(z.T, std::max(mlp, attn) * z.a);
  if (recompute == Recompute::kSelective) peak = SatAdd(peak, SatMul(z.T, z.heads * z.hd * z.a + z.heads * 4));
  if (recompute == Recompute::kFull)
    peak = SatAdd(peak, ArenaLayerStash(z, Recompute::kNone) - SatMul(z.R, z.h * z.a));
  if (loss) peak = std::max(peak, SatMul(z.T, (z.vocab + z.h) * z.a));
  return peak;
}

// Microbatches of each local chunk in flight at once on pipeline rank r, in the order the
// schedule runs them (Megatron's: warm-up forwards, one forward one backward, cool-down).
std::vector<int64_t> ArenaSlots(const Plan& plan, int64_t r, int64_t m) {
  const int64_t p = std::max<int64_t>(1, plan.parallel.pp), v = std::max<int64_t>(1, plan.parallel.vpp);
  std::vector<int64_t> slots(static_cast<size_t>(v), 0);
  if (plan.pipeline.schedule == Schedule::kGpipe) {
    std::fill(slots.begin(), slots.end(), m);
    return slots;
  }
  if (v == 1) {
    slots[0] = std::min(p - r, m);
    return slots;
  }
  const int64_t total = m * v;
  const int64_t warmup = std::min(total, 2 * (p - r - 1) + (v - 1) * p);
  std::vector<int64_t> live(static_cast<size_t>(v), 0);
  auto forward = [&](int64_t k) {
    const size_t c = static_cast<size_t>((k / p) % v);
    slots[c] = std::max(slots[c], ++live[c]);
  };
  auto backward = [&](int64_t k) { --live[static_cast<size_t>(v - 1 - (k / p) % v)]; };
  for (int64_t k = 0; k < warmup; ++k) forward(k);
  for (int64_t i = 0; i < total - warmup; ++i) {
    forward(warmup + i);
    backward(i);
  }
  return slots;
}

}  // namespace

bool ArenaModelApplies(const Plan& plan) {
  const ModelSpec& m = plan.model;
  return plan.framework == Framework::kParaplan && !m.IsMoe() && !m.IsMla() && plan.parallel.cp == 1 &&
         plan.parallel.ep == 1;
}

std::string_view MemoryPartName(MemoryPart part) {
  switch (part) {
    case MemoryPart::kWeights: return "weights";
    case MemoryPart::kGradients: return "gradients";
    case MemoryPart::kOptimizer: return "optimizer";
    case MemoryPart::kActivations: return "activations";
    case MemoryPart::kEmbeddingAndLoss: return "embedding_and_loss";
    case MemoryPart::kRecomputeWorkspace: return "recompute_workspace";
    case MemoryPart::kCommBuffers: return "comm_buffers";
    case MemoryPart::kRuntimeReserve: return "runtime_reserve";
    case MemoryPart::kAllocatorMargin: return "allocator_margin";
    case MemoryPart::kCount: break;
  }
  return "?";
}

std::string_view MemoryPartTitle(MemoryPart part) {
  switch (part) {
    case MemoryPart::kWeights: return "weights";
    case MemoryPart::kGradients: return "gradients";
    case MemoryPart::kOptimizer: return "optimizer state";
    case MemoryPart::kActivations: return "activations";
    case MemoryPart::kEmbeddingAndLoss: return "embedding/logits";
    case MemoryPart::kRecomputeWorkspace: return "recompute workspace";
    case MemoryPart::kCommBuffers: return "comm buffers";
    case MemoryPart::kRuntimeReserve: return "CUDA/runtime";
    case MemoryPart::kAllocatorMargin: return "allocator margin";
    case MemoryPart::kCount: break;
  }
  return "?";
}

StateBytesPerParam StateBytes(const Plan& plan, int64_t shard) {
  StateBytesPerParam b;
  const bool adam = plan.optimizer.type == OptimizerType::kAdamW;
  switch (plan.precision) {
    case Precision::kFp32:
      b.weights = 4; b.gradients = 4; b.optimizer = adam ? 8 : 4;
      break;
    case Precision::kFp16:  // fp16 grads; fp32 master, fp32 main-grad copy and moments
      b.weights = 2; b.gradients = 2; b.optimizer = adam ? 16 : 12;
      break;
    case Precision::kBf16:
      b.weights = 2; b.gradients = 4; b.optimizer = adam ? 12 : 8;
      break;
    case Precision::kFp8:  // bf16 weights plus their fp8 cast kept for the GEMMs
      b.weights = 3; b.gradients = 4; b.optimizer = adam ? 12 : 8;
      break;
  }
  const double d = static_cast<double>(std::max<int64_t>(1, shard));
  if (plan.optimizer.zero >= 1) b.optimizer /= d;
  if (plan.optimizer.zero >= 2) b.gradients /= d;
  if (plan.optimizer.zero >= 3) b.weights /= d;
  return b;
}

MemoryEstimate EstimateMemory(const Plan& plan, const CostOptions& options) {
  MemoryEstimate est;
  est.capacity = plan.cluster.gpu.memory;
  std::vector<CostChunk> chunks;
  if (!StageChunks(plan, chunks)) return est;
  const ModelSpec& m = plan.model;
  const ParallelSpec& par = plan.parallel;
  const int64_t p = par.pp, v = par.vpp;
  const int64_t t = std::max<int64_t>(1, par.tp);
  const int64_t world = std::max<int64_t>(1, plan.cluster.nodes * plan.cluster.gpus_per_node);
  const int64_t edp = std::max<int64_t>(1, world / std::max<int64_t>(1, par.etp * par.ep * p));
  const int64_t dense_shard = std::max<int64_t>(1, par.dp * par.cp);
  const int64_t denom = std::max<int64_t>(1, plan.batch.micro * par.dp);
  est.microbatches = std::max<int64_t>(1, plan.batch.global / denom);
  const int64_t mb = est.microbatches;
  const GpuEfficiency& eff = EfficiencyFor(plan.cluster.gpu, options);

  StateBytesPerParam dense_state = StateBytes(plan, dense_shard);
  // planrun keeps an fp32 master copy beside the moments whatever the precision (body.cpp,
  // BuildBuckets): fp32 training holds 12 bytes of optimizer state per parameter, not 8.
  if (ArenaModelApplies(plan) && plan.precision == Precision::kFp32 && plan.optimizer.type == OptimizerType::kAdamW)
    dense_state.optimizer *= 12.0 / 8.0;
  const StateBytesPerParam expert_state = StateBytes(plan, edp);
  const bool offload = plan.optimizer.offload == Offload::kCpu;

  ActivationShape shape;
  shape.seq = m.seq_len;
  shape.micro = plan.batch.micro;
  shape.tp = t;
  shape.cp = par.cp;
  shape.etp = par.etp;
  shape.sp = par.sp;
  shape.recompute = plan.recompute;
  shape.element_bytes = ActivationElementBytes(plan.precision);
  shape.options = options;
  const int64_t act_dense = LayerActivationBytes(m, LayerKind::kDense, shape);
  const int64_t act_moe = m.IsMoe() ? LayerActivationBytes(m, LayerKind::kMoe, shape) : 0;
  const int64_t work_dense = RecomputeWorkspaceBytes(m, LayerKind::kDense, shape);
  const int64_t work_moe = m.IsMoe() ? RecomputeWorkspaceBytes(m, LayerKind::kMoe, shape) : 0;
  const int64_t emb_act = EmbeddingActivationBytes(m, shape);
  const int64_t loss_act = LossActivationBytes(m, shape);
  const LayerParams dense_params = ParamsOfLayer(m, LayerKind::kDense);
  const LayerParams moe_params = m.IsMoe() ? ParamsOfLayer(m, LayerKind::kMoe) : LayerParams{};
  const int64_t ep_etp = std::max<int64_t>(1, par.ep * par.etp);

  // Communicator buffers: one NCCL communicator per group of size > 1 that a rank belongs to.
  const CommGroups groups = PlaceGroups(plan);
  int64_t communicators = 0;
  for (const CommGroup* g : {&groups.tp, &groups.cp, &groups.dp_cp, &groups.pp, &groups.ep,
                                  &groups.etp, &groups.edp})
    communicators += g->size > 1 ? 1 : 0;
  const int64_t tokens = CeilDiv(SatMul(m.seq_len, plan.batch.micro), std::max<int64_t>(1, par.cp));
  const int64_t x = shape.element_bytes;
  // Sequence parallel gathers the full sequence of one GEMM input (double-buffered).
  const int64_t sp_gather = par.sp && t > 1 ? SatMul(2, SatMul(tokens, SatMul(x, m.hidden))) : 0;
  // Context parallel: K and V chunks in flight (send and receive) of the ring.
  const int64_t kv_width = m.IsMla() ? m.heads * (m.qk_nope_head_dim + m.qk_rope_head_dim + m.v_head_dim)
                                     : 2 * std::max<int64_t>(1, m.kv_heads) * (m.head_dim > 0 ? m.head_dim : m.hidden / std::max<int64_t>(1, m.heads));
  const int64_t cp_ring = par.cp > 1 ? SatMul(2, SatMul(tokens, CeilDiv(SatMul(x, kv_width), t))) : 0;
  const int64_t ep_buffers = m.IsMoe() ? SatMul(2, SatMul(RoutedPairsPerRank(m, shape), SatMul(x, m.hidden))) : 0;

  const bool arena = ArenaModelApplies(plan);
  const ArenaSizes arena_sizes = arena ? ArenaSizesOf(plan) : ArenaSizes{};
  est.stages.resize(static_cast<size_t>(p));
  std::vector<int64_t> counts(static_cast<size_t>(v));
  for (int64_t r = 0; r < p; ++r) {
    StageMemory& s = est.stages[static_cast<size_t>(r)];
    s.stage = r;
    // Microbatches in flight per local chunk at the stage's peak.
    std::fill(counts.begin(), counts.end(), 0);
    if (arena) {
      counts = ArenaSlots(plan, r, mb);
    } else if (plan.pipeline.schedule == Schedule::kGpipe) {
      for (auto& c : counts) c = mb;
    } else if (v == 1) {
      counts[0] = std::min(p - r, mb);
    } else {
      const int64_t held = std::min(2 * (p - r - 1) + (v - 1) * p + 1, mb * v);
      for (int64_t k = 0; k < held; ++k) ++counts[static_cast<size_t>((k % (p * v)) / p)];
    }
    int64_t dense_count = 0, moe_count = 0, activations = 0, workspace = 0;
    int64_t extra = 0, dense_p = 0, repl_p = 0, expert_p = 0;
    for (int64_t c = 0; c < v; ++c) {
      const CostChunk& chunk = chunks[static_cast<size_t>(c * p + r)];
      const int64_t first = chunk.first_layer, end = chunk.first_layer + chunk.layers;
      const int64_t dense_end = m.IsMoe() ? std::clamp(m.dense_layers, first, end) : end;
      const int64_t nd = dense_end - first, nm = end - dense_end;
      dense_count += nd;
      moe_count += nm;
      const int64_t chunk_act = SatAdd(SatMul(nd, act_dense), SatMul(nm, act_moe));
      const int64_t held = counts[static_cast<size_t>(c)];
      if (arena) {
        activations = SatAdd(activations, SatMul(held, SatMul(chunk.layers, ArenaLayerStash(arena_sizes, plan.recompute))));
        extra = SatAdd(extra, SatMul(held, ArenaChunkExtra(arena_sizes, chunk.embedding, chunk.loss)));
        workspace = std::max(workspace, ArenaBodyPeak(arena_sizes, plan.recompute, chunk.loss));
      } else {
        activations = SatAdd(activations, SatMul(held, chunk_act));
      }
      if (nd > 0 && !arena) workspace = std::max(workspace, work_dense);
      if (nm > 0 && !arena) workspace = std::max(workspace, work_moe);
      if (chunk.embedding) {
        s.embedding = true;
        if (!arena) extra = SatAdd(extra, SatMul(held, emb_act));
        dense_p = SatAdd(dense_p, CeilDiv(EmbeddingParams(m), t));
        repl_p = SatAdd(repl_p, PositionParams(m));
      }
      if (chunk.loss) {
        s.loss = true;
        if (!arena) extra = SatAdd(extra, SatMul(std::max<int64_t>(1, held), loss_act));
        repl_p = SatAdd(repl_p, FinalNormParams(m));
        int64_t head = OutputParams(m);
        if (m.tied_embeddings && p > 1) head = EmbeddingParams(m);  // the tied copy on the last stage
        dense_p = SatAdd(dense_p, CeilDiv(head, t));
      }
      s.in_flight += held;
    }
    s.layers = dense_count + moe_count;
    dense_p = SatAdd(dense_p, CeilDiv(SatAdd(SatMul(dense_count, dense_params.tp_sharded),
                                             SatMul(moe_count, moe_params.tp_sharded)), t));
    repl_p = SatAdd(repl_p, SatAdd(SatMul(dense_count, dense_params.replicated),
                                   SatMul(moe_count, moe_params.replicated)));
    expert_p = CeilDiv(SatMul(moe_count, moe_params.expert), ep_etp);
    const int64_t shared_p = SatAdd(dense_p, repl_p);
    s.params = SatAdd(shared_p, expert_p);

    auto& b = s.bytes;
    b[size_t(MemoryPart::kWeights)] = SatAdd(Scale(shared_p, dense_state.weights), Scale(expert_p, expert_state.weights));
    b[size_t(MemoryPart::kGradients)] = SatAdd(Scale(shared_p, dense_state.gradients), Scale(expert_p, expert_state.gradients));
    const int64_t optimizer = SatAdd(Scale(shared_p, dense_state.optimizer), Scale(expert_p, expert_state.optimizer));
    if (offload) {
      s.host_bytes = optimizer;
    } else {
      b[size_t(MemoryPart::kOptimizer)] = optimizer;
    }
    b[size_t(MemoryPart::kActivations)] = activations;
    b[size_t(MemoryPart::kEmbeddingAndLoss)] = extra;
    b[size_t(MemoryPart::kRecomputeWorkspace)] = workspace;
    int64_t comm = SatMul(communicators, eff.nccl_bytes_per_communicator);
    if (arena) {
      // ZeRO >= 2 on dp > 1: a layer's (or the embedding's) full grad bucket, fp32, and with
      // ZeRO-3 its gathered weights live inside the body that uses them.
      if (plan.optimizer.zero >= 2 && par.dp > 1) {
        int64_t bucket = CeilDiv(dense_params.tp_sharded, t) + dense_params.replicated;
        if (s.embedding || s.loss) bucket = std::max(bucket, SatMul(arena_sizes.vocab, m.hidden));
        const int64_t per = 4 + (plan.optimizer.zero >= 3 ? arena_sizes.a : 0);
        b[size_t(MemoryPart::kRecomputeWorkspace)] = SatAdd(workspace, SatMul(bucket, per));
      }
    } else {
      comm = SatAdd(comm, std::max({sp_gather, cp_ring, moe_count > 0 ? ep_buffers : 0}));
    }
    if (plan.optimizer.zero >= 3 && !arena) {
      // Two layers' full (unsharded) 16-bit weights: the one computing and the one prefetched.
      const int64_t layer = std::max(dense_count > 0 ? dense_params.tp_sharded / t + dense_params.replicated : 0,
                                     moe_count > 0 ? moe_params.tp_sharded / t + moe_params.replicated + moe_params.expert / ep_etp : 0);
      comm = SatAdd(comm, SatMul(4, layer));
    }
    b[size_t(MemoryPart::kCommBuffers)] = comm;
    b[size_t(MemoryPart::kRuntimeReserve)] = eff.runtime_reserve_bytes;
    int64_t sum = 0;
    for (size_t i = 0; i < kMemoryPartCount; ++i) sum = SatAdd(sum, b[i]);
    // planrun allocates one static arena per rank: no caching-allocator fragmentation.
    const int64_t margin = sum == INT64_MAX || arena ? 0 : sum / 100 * options.allocator_margin_percent;
    b[size_t(MemoryPart::kAllocatorMargin)] = margin;
    s.total = SatAdd(sum, margin);
    if (arena) s.arena = sum - b[size_t(MemoryPart::kCommBuffers)] - b[size_t(MemoryPart::kRuntimeReserve)];
    if (s.total > est.peak) {
      est.peak = s.total;
      est.peak_stage = r;
    }
  }
  est.valid = true;
  return est;
}

std::string FormatGiB(int64_t bytes) {
  if (bytes == INT64_MAX) return "more than 8 EiB";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f GiB", static_cast<double>(bytes) / kGiB);
  return buf;
}

std::string PrintMemory(const MemoryEstimate& e) {
  std::string out;
  if (!e.valid) return "memory: not estimated (the pipeline split cannot be formed)\n";
  char buf[160];
  std::snprintf(buf, sizeof buf, "memory per GPU (capacity %s, %lld microbatches per step)\n",
                FormatGiB(e.capacity).c_str(), static_cast<long long>(e.microbatches));
  out += buf;
  std::snprintf(buf, sizeof buf, "%-22s", "stage");
  out += buf;
  for (const auto& s : e.stages) {
    std::snprintf(buf, sizeof buf, " %10lld", static_cast<long long>(s.stage));
    out += buf;
  }
  out += "\n";
  auto row = [&](std::string_view title, auto get) {
    std::snprintf(buf, sizeof buf, "%-22.*s", static_cast<int>(title.size()), title.data());
    out += buf;
    for (const auto& s : e.stages) {
      std::snprintf(buf, sizeof buf, " %10.2f", static_cast<double>(get(s)) / kGiB);
      out += buf;
    }
    out += "\n";
  };
  for (size_t i = 0; i < kMemoryPartCount; ++i)
    row(MemoryPartTitle(static_cast<MemoryPart>(i)), [&](const StageMemory& s) { return s.bytes[i]; });
  row("total (GiB)", [](const StageMemory& s) { return s.total; });
  return out;
}

}  // namespace paraplan
