// The memory model: bytes per GPU for every pipeline stage of a plan.
//
// Every pipeline rank is evaluated (not only stage 0): its layers, the embedding on the first
// and the output layer on the last stage (and a tied copy there when pp > 1), the microbatches
// in flight of the actual schedule (1F1B: min(pp - r, m); interleaved: Megatron's warm-up
// count, chunk by chunk; GPipe: m). Within a stage every rank holds the same bytes under the
// model's assumptions (experts divide evenly; routing imbalance applies to all EP ranks alike).
//
// Model states follow Megatron's mixed-precision accounting: bf16/fp16 weights (2 B), main
// gradients (fp32 4 B for bf16/fp8, 2 B for fp16 as in the distributed-optimizer table), and
// AdamW's fp32 master weights (absent in fp32 training) and two moments; ZeRO 1 shards the
// optimizer state, 2 the gradients, 3 the weights, over DP x CP for dense parameters and over
// the expert-DP group for routed experts. CPU offload moves the optimizer state to the host.
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
  int64_t stage = 0;              // pipeline rank
  int64_t layers = 0;             // transformer layers on the rank (all its chunks)
  int64_t in_flight = 0;          // chunk-microbatches whose activations are held at the peak
  bool embedding = false;
  bool loss = false;
  int64_t params = 0;             // parameters on one GPU of this stage (before ZeRO 3)
  std::array<int64_t, kMemoryPartCount> bytes{};
  int64_t total = 0;              // sum of bytes
  int64_t host_bytes = 0;         // CPU memory for offloaded optimizer state
  // framework = paraplan on a plan planrun lowers: the bytes of planrun's static arena on this
  // stage (everything but NCCL communicators and the CUDA context); 0 otherwise.
  int64_t arena = 0;

  int64_t Get(MemoryPart part) const { return bytes[static_cast<size_t>(part)]; }
};

struct MemoryEstimate {
  bool valid = false;             // false when the plan's pipeline split cannot be formed
  int64_t capacity = 0;           // the GPU's memory (cluster.gpu.memory)
  int64_t microbatches = 0;       // per step and DP replica
  std::vector<StageMemory> stages;
  int64_t peak = 0;               // max total over stages
  int64_t peak_stage = 0;         // the first stage reaching it
};

MemoryEstimate EstimateMemory(const Plan& plan, const CostOptions& options = {});

// True when the estimate is planrun's static arena, term by term as compiler/lower allocates it
// (framework = paraplan and a plan it lowers: dense, ordinary attention, no cp or ep).
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
