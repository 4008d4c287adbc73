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

}  // namespace

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

  const StateBytesPerParam dense_state = StateBytes(plan, dense_shard);
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

  est.stages.resize(static_cast<size_t>(p));
  std::vector<int64_t> counts(static_cast<size_t>(v));
  for (int64_t r = 0; r < p; ++r) {
    StageMemory& s = est.stages[static_cast<size_t>(r)];
    s.stage = r;
    // Microbatches in flight per local chunk at the stage's peak.
    std::fill(counts.begin(), counts.end(), 0);
    if (plan.pipeline.schedule == Schedule::kGpipe) {
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
      activations = SatAdd(activations, SatMul(held, chunk_act));
      if (nd > 0) workspace = std::max(workspace, work_dense);
      if (nm > 0) workspace = std::max(workspace, work_moe);
      if (chunk.embedding) {
        s.embedding = true;
        extra = SatAdd(extra, SatMul(held, emb_act));
        dense_p = SatAdd(dense_p, CeilDiv(EmbeddingParams(m), t));
        repl_p = SatAdd(repl_p, PositionParams(m));
      }
      if (chunk.loss) {
        s.loss = true;
        extra = SatAdd(extra, SatMul(std::max<int64_t>(1, held), loss_act));
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
    comm = SatAdd(comm, std::max({sp_gather, cp_ring, moe_count > 0 ? ep_buffers : 0}));
    if (plan.optimizer.zero >= 3) {
      // Two layers' full (unsharded) 16-bit weights: the one computing and the one prefetched.
      const int64_t layer = std::max(dense_count > 0 ? dense_params.tp_sharded / t + dense_params.replicated : 0,
                                     moe_count > 0 ? moe_params.tp_sharded / t + moe_params.replicated + moe_params.expert / ep_etp : 0);
      comm = SatAdd(comm, SatMul(4, layer));
    }
    b[size_t(MemoryPart::kCommBuffers)] = comm;
    b[size_t(MemoryPart::kRuntimeReserve)] = eff.runtime_reserve_bytes;
    int64_t sum = 0;
    for (size_t i = 0; i < kMemoryPartCount; ++i) sum = SatAdd(sum, b[i]);
    const int64_t margin = sum == INT64_MAX ? 0 : sum / 100 * options.allocator_margin_percent;
    b[size_t(MemoryPart::kAllocatorMargin)] = margin;
    s.total = SatAdd(sum, margin);
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
