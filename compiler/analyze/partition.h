// The pipeline partition: which transformer layers every (pipeline rank, virtual chunk) holds,
// and which ranks hold the embedding and the loss (output layer + loss).
//
// Virtual stages run in Megatron's interleaved order: virtual stage s = chunk · pp + pp_rank,
// so chunk c of pipeline rank p holds the s-th contiguous run of layers. The embedding sits on
// virtual stage 0 (rank 0, chunk 0), the loss on the last (rank pp-1, chunk vpp-1). Methods,
// in order of precedence:
//   explicit    pipeline.stage_layers: one count per pipeline rank (split evenly over its
//               chunks) or one per virtual stage (chunk-major, as Megatron's layout string)
//   first_last  pipeline.first_stage_layers / last_stage_layers: Megatron's uneven split, the
//               middle ranks share the rest evenly; each rank's count splits over its chunks
//   account     account_for_embedding / account_for_loss: Megatron counts them as layers, so
//               virtual stage 0 holds one layer less (and the last one one less)
//   cost        balance = cost: contiguous split minimising the most expensive virtual stage
//               by per-block forward FLOPs (embedding on the first, output layer + loss on the
//               last), every virtual stage holding at least one transformer layer
//   nanotron    balance = nanotron: Nanotron's greedy cumulative-cost split, reproduced to
//               check a Nanotron run; a stage it leaves without parameters is an error (P0602)
//   even        layers / (pp · vpp) per virtual stage
//
// Invariants of a Partition: the virtual stages cover [0, layers) in order without gaps;
// every virtual stage holds a layer, the embedding or the loss. Made by BuildPartition
// (analyze/); read by checks, explain, memory/time (per-stage parameters) and lower/ (bodies).
#ifndef PARAPLAN_COMPILER_ANALYZE_PARTITION_H_
#define PARAPLAN_COMPILER_ANALYZE_PARTITION_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "compiler/diagnostics/diagnostic.h"
#include "compiler/plan/plan.h"

namespace paraplan {

// Per-block forward compute cost in FLOPs per token (2 per multiply-add), as cost balancing
// sees the model: the embedding, each transformer layer (dense or MoE), the output layer
// with the loss. Causal attention counts half of the score and value products.
struct BlockCosts {
  int64_t embedding = 0;
  std::vector<int64_t> layers;  // one per transformer layer
  int64_t head = 0;             // final norm, output projection, loss
};
BlockCosts ComputeBlockCosts(const ModelSpec& model);

// Nanotron's block costs (its get_block_compute_costs): a decoder layer costs
// 4·heads·head_dim·hidden + 3·ffn_hidden·hidden, the LM head vocab·hidden, every other block 0.
BlockCosts NanotronBlockCosts(const ModelSpec& model);

enum class PartitionMethod : uint8_t { kEven, kAccount, kFirstLast, kExplicit, kCost, kNanotron };
std::string_view ToString(PartitionMethod method);  // "even", "account", "first_last", ...

// One virtual stage: a chunk of one pipeline rank.
struct PipelineChunk {
  int64_t pp_rank = 0;
  int64_t chunk = 0;          // 0 .. vpp-1
  int64_t virtual_stage = 0;  // chunk · pp + pp_rank
  int64_t first_layer = 0;    // transformer layers [first_layer, end_layer)
  int64_t end_layer = 0;
  bool embedding = false;
  bool loss = false;
  int64_t cost = 0;  // forward FLOPs per token of its blocks (ComputeBlockCosts)

  int64_t layer_count() const { return end_layer - first_layer; }
};

// What one pipeline rank holds.
struct PipelineStage {
  int64_t pp_rank = 0;
  std::vector<PipelineChunk> chunks;  // by chunk index
  bool embedding = false;
  bool loss = false;

  int64_t layer_count() const;
  int64_t cost() const;
};

struct Partition {
  int64_t layers = 0;
  int64_t pp = 1;
  int64_t vpp = 1;
  PartitionMethod method = PartitionMethod::kEven;
  std::vector<PipelineStage> stages;  // by pp rank
  BlockCosts costs;                   // the model's per-block costs (always filled)

  const PipelineChunk& Chunk(int64_t pp_rank, int64_t chunk) const {
    return stages[pp_rank].chunks[chunk];
  }
  // The chunk holding transformer layer `layer` (0-based), nullptr when out of range.
  const PipelineChunk* ChunkOfLayer(int64_t layer) const;
  // Chunks in execution order (virtual stage 0, 1, ...).
  std::vector<const PipelineChunk*> VirtualStages() const;

  std::vector<std::string> Verify() const;
  // Stable text dump: one line per (rank, chunk) with its layers, embedding and loss.
  std::string Print() const;
};

// Builds the partition of a checked plan. Problems only the partition can find are reported
// to `sink` (P06xx: an empty stage, Nanotron-style cost balancing that leaves a stage without
// a layer, an explicit split that does not cover the layers) and yield nullopt; pure
// divisibility rules are the rules' (P04xx) and are not reported again here, but a plan that
// breaks them still yields nullopt (with a P0603 when nothing else said why). `sink` may be
// null when the caller only wants the structure.
std::optional<Partition> BuildPartition(const Plan& plan, DiagnosticSink* sink);

// Layer counts per virtual stage (execution order) of Megatron's split for the plan's options
// (no cost balancing); nullopt with `why` when Megatron would reject them.
std::optional<std::vector<int64_t>> MegatronStageLayers(const Plan& plan, std::string* why);

// Cost balancing: layer counts per virtual stage minimising the most expensive one, every
// count >= 1; nullopt when layers < stages.
std::optional<std::vector<int64_t>> BalanceByCost(const BlockCosts& costs, int64_t stages);

// `layers` over `stages` as evenly as possible, the remainder on the middle stages first (the
// first and last also hold the embedding and the output layer).
std::vector<int64_t> EvenLayerCounts(int64_t layers, int64_t stages);

// Nanotron's greedy split over pp ranks (blocks in order; a rank is left once the cumulative
// cost exceeds (rank+1)/pp of the total): transformer layers per rank, and per rank whether
// it holds a block with parameters (embedding, a layer, the final norm, the LM head).
struct NanotronSplit {
  std::vector<int64_t> layers;       // per pp rank
  std::vector<bool> has_parameters;  // per pp rank
  int64_t head_rank = 0;             // rank of the LM head
};
NanotronSplit NanotronGreedySplit(const ModelSpec& model, int64_t pp);

}  // namespace paraplan

#endif  // PARAPLAN_COMPILER_ANALYZE_PARTITION_H_
