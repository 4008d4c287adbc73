// The memory model: bytes per GPU for every pipeline stage of a plan.
//
// Every pipeline rank is evaluated (not only stage 0): its layers, the embedding on the first
// and the output layer on the last stage (and a tied copy there when pp > 1), the microbatches
// in flight of the actual schedule (1F1B: min(pp - r, m); interleaved: Megatron's warm-up
// count, chunk by chunk; GPipe: m). Within a stage every rank holds the same bytes under the
// model's assumptions (experts divide evenly; routing imbalance applies to all EP ranks alike).
//
// Terms and their sources (../shared/reference/cost-models.md section 2 unless named):
//   model states  Megatron's distributed-optimizer table, term by term from the precision record
//                 (EffectiveMixedPrecision): weights in `params` (1 B with fp8_params; + 1 B of
//                 cached FP8 casts under Transformer Engine), main gradients in `grads`, fp32
//                 master weights when `main_params`, Adam's two moments in `optimizer_state`.
//                 ZeRO 1/2/3 shard them over fsdp.shard ranks (dp·cp / fsdp.replicate); routed
//                 experts over their expert-DP group, world / (etp·ep·pp) (planrun too, but
//                 over dp·cp beside the dense parameters with ep = 1 and etp = tp, no SP or
//                 ZeRO 2/3: ArenaExpertShardGroup). PyTorch FSDP (torchtitan,
//                 llm_foundry) keeps the fp32 shard as the parameter itself (no separate master).
//   activations   Korthikanti et al. per layer (cost_shape), minus what the recompute keeps out:
//                 Megatron's --recompute-modules drop their outputs (DroppedByModules), full
//                 recompute with --recompute-method/--recompute-num-layers keeps inputs of the
//                 recomputed layers; FP8 GEMM inputs stored as 1-byte copies; offloaded layers
//                 move to host_bytes. Microbatches in flight of the actual schedule (1F1B:
//                 min(pp - r, m); interleaved: Megatron's warm-up count; GPipe: m).
//                 torchtitan under SP (DTensor): the all-gathered inputs of the column-parallel
//                 projections are saved at full sequence length (FP8 under float8).
//   embedding and loss  int64 ids, final-norm and output inputs, fp32 logits; MTP modules add a
//                 layer and logits each on the last stage. torchtitan's upcast loss holds 12 B
//                 per logit at its backward, 16 B under loss_parallel (TP > 1).
//   comm buffers  one NCCL communicator per group of size > 1 (runtime-anchors.md 3.2, item 7),
//                 gathered SP/CP/EP buffers, ZeRO-3 gathered weights (two layers, or the whole
//                 stage when reshard_after_forward is off, as torchtitan does under pp > 1).
//   reserve       CUDA context and library workspaces (GpuEfficiency::runtime_reserve_bytes).
//   allocator margin  the caching allocator's fragmentation, CostOptions::allocator_margin_percent
//                 from the framework profile (FrameworkProfile::allocator_margin_percent: 5%,
//                 torchtitan 10%); 0 for planrun, whose arena is allocated whole.
// framework = paraplan on a plan planrun lowers (ArenaModelApplies): the activations, embedding
// and loss terms and the workspace are planrun's static arena instead, term by term as
// compiler/lower lays it out (StageMemory::arena; within 3% of `planc compile`, tested). MoE
// layers there: the router's buffers, the routed buffers at their worst case (rows · topk), the
// Etp group's gathered rows under sp, shared experts, the expert bias State buffers.
//
// Made by EstimateMemory for `planc check` (OOM diagnostics), explain and every search
// candidate; must stay allocation-light.
#ifndef PARAPLAN_COMPILER_ANALYZE_MEMORY_H_
#define PARAPLAN_COMPILER_ANALYZE_MEMORY_H_

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "compiler/analyze/cost_params.h"
#include "compiler/plan/plan.h"

namespace paraplan {

// The lines of a stage's breakdown, in display order.
enum class MemoryPart : uint8_t {
  kWeights,             // parameters on the GPU
  kGradients,           // main gradients (sharded from ZeRO 2)
  kOptimizer,           // master weights and moments (sharded from ZeRO 1; 0 when offloaded)
  kActivations,         // layer activations of the microbatches in flight
  kEmbeddingAndLoss,    // input ids, embedding output, final norm, fp32 logits
  kRecomputeWorkspace,  // one layer's working set while it is recomputed
  kCommBuffers,         // NCCL communicators, gathered SP/ZeRO-3 tensors, EP dispatch buffers
  kRuntimeReserve,      // CUDA context, cuBLAS/TE workspaces
  kAllocatorMargin,     // stated fragmentation margin (CostOptions::allocator_margin_percent)
  kCount
};
inline constexpr size_t kMemoryPartCount = static_cast<size_t>(MemoryPart::kCount);
std::string_view MemoryPartName(MemoryPart part);   // "weights", "optimizer", ... (JSON keys)
std::string_view MemoryPartTitle(MemoryPart part);  // "optimizer state", ... (tables)

struct StageMemory {
  int64_t stage = 0;      // pipeline rank
  int64_t layers = 0;     // transformer layers on the rank (all its chunks)
  int64_t in_flight = 0;  // chunk-microbatches whose activations are held at the peak
  // Per local chunk, the microbatches whose activations it holds at once; planrun's arena: its
  // stash slots, a chunk's of a slot pool the pool's (memory_arena.h, ArenaPooledSlots).
  std::vector<int64_t> chunk_slots;
  bool embedding = false;
  bool loss = false;
  int64_t params = 0;  // parameters on one GPU of this stage (before ZeRO 3)
  std::array<int64_t, kMemoryPartCount> bytes{};
  int64_t total = 0;       // sum of bytes
  int64_t host_bytes = 0;  // CPU memory for offloaded optimizer state
  // framework = paraplan on a plan planrun lowers: the bytes of planrun's static arena on this
  // stage (everything but NCCL communicators and the CUDA context); 0 otherwise.
  int64_t arena = 0;
  // Bytes outside the framework's allocator: CUDA context, library workspaces and NCCL
  // communicators. total - outside_allocator is what torch.cuda.max_memory_reserved reports.
  int64_t outside_allocator = 0;

  int64_t Get(MemoryPart part) const { return bytes[static_cast<size_t>(part)]; }
};

struct MemoryEstimate {
  bool valid = false;        // false when the plan's pipeline split cannot be formed
  int64_t capacity = 0;      // the GPU's memory (cluster.gpu.memory)
  int64_t microbatches = 0;  // per step and DP replica
  std::vector<StageMemory> stages;
  int64_t peak = 0;        // max total over stages
  int64_t peak_stage = 0;  // the first stage reaching it
};

// `options`' software flags give way to those of the plan's framework (OptionsForFramework).
MemoryEstimate EstimateMemory(const Plan& plan, const CostOptions& options = {});

// The predicted peak of every pipeline stage (all ranks of a stage hold the same bytes), for
// tools that print predicted against measured memory (bench/calibration): `device` is what the
// GPU must hold, `allocator` what the framework's allocator reports (torch.cuda's
// max_memory_reserved; planrun's arena), without the CUDA context and NCCL. Empty when the
// pipeline split cannot be formed.
struct StagePeak {
  int64_t stage = 0;
  int64_t device = 0;
  int64_t allocator = 0;
};
std::vector<StagePeak> PredictedPeaks(const Plan& plan, const CostOptions& options = {});

// True when the estimate is planrun's static arena, term by term as compiler/lower allocates it
// (framework = paraplan and a plan it lowers: ordinary or multi-head latent attention; dense, or
// mixture of experts with etp = 1 or etp = tp, with or without a capacity factor, ep = 1 or
// ep > 1 with any ZeRO stage and, beside tp > 1, sequence parallelism or etp = tp; cp included).
bool ArenaModelApplies(const Plan& plan);

// Bytes per parameter of model states on one GPU for a shard group of `shard` ranks (the
// distributed-optimizer table: bf16 ZeRO 0 = 18, ZeRO 1 = 6 + 12/d). Split into weights,
// gradients and optimizer; fractional where ZeRO divides.
struct StateBytesPerParam {
  double weights = 0, gradients = 0, optimizer = 0;
  double Total() const { return weights + gradients + optimizer; }
};
StateBytesPerParam StateBytes(const Plan& plan, int64_t shard);

// A stable text table of the estimate (sizes in GiB with two decimals), one row per stage.
std::string PrintMemory(const MemoryEstimate& estimate);
// "71.25 GiB"
std::string FormatGiB(int64_t bytes);

}  // namespace paraplan

#endif  // PARAPLAN_COMPILER_ANALYZE_MEMORY_H_
