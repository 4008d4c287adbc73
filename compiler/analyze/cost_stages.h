// The pipeline content the cost models need: for every model chunk (global virtual stage
// c·pp + r lives on pipeline rank r as its local chunk c, Megatron's loop placement) its layer
// range and whether it holds the embedding or the loss.
//
// TODO(layout): this is a stand-in until compiler/analyze/partition.h lands on main; then
// StageChunks becomes a thin adapter over the partition (no second copy of the split rules).
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
// Returns false (and leaves `chunks` unspecified) when the split cannot be formed; the rules
// report why, the cost models then stay quiet.
bool StageChunks(const Plan& plan, std::vector<CostChunk>& chunks);

}  // namespace paraplan

#endif  // PARAPLAN_COMPILER_ANALYZE_COST_STAGES_H_
