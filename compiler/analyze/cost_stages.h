// The pipeline content the cost models need, flattened from the partition (partition.h): for
// every model chunk (global virtual stage c·pp + r lives on pipeline rank r as its local chunk
// c, Megatron's loop placement) its layer range and whether it holds the embedding or the loss.
// A flat vector so that memory and time walk it without touching the partition's structure.
// Made per plan (and per search candidate); read by memory.cpp and time.cpp.
#ifndef PARAPLAN_COMPILER_ANALYZE_COST_STAGES_H_
#define PARAPLAN_COMPILER_ANALYZE_COST_STAGES_H_

#include <cstdint>
#include <vector>

#include "compiler/plan/plan.h"

namespace paraplan {

struct CostChunk {
  int64_t first_layer = 0;
  int64_t layers = 0;
  bool embedding = false;
  bool loss = false;
};

// pp·vpp chunks in global stage order; chunks[c * pp + r] is local chunk c of pipeline rank r.
// Returns false (and leaves `chunks` unspecified) when BuildPartition cannot split the plan;
// the rules and the partition checks report why, the cost models then stay quiet.
bool StageChunks(const Plan& plan, std::vector<CostChunk>& chunks);

}  // namespace paraplan

#endif  // PARAPLAN_COMPILER_ANALYZE_COST_STAGES_H_
