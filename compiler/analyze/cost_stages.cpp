#include "compiler/analyze/cost_stages.h"

#include "compiler/analyze/partition.h"

namespace paraplan {

bool StageChunks(const Plan& plan, std::vector<CostChunk>& chunks) {
  const int64_t p = plan.parallel.pp, v = plan.parallel.vpp;
  if (p < 1 || v < 1 || plan.model.layers < 1) return false;
  const std::optional<Partition> partition = BuildPartition(plan, nullptr);
  if (!partition || partition->pp != p || partition->vpp != v) return false;
  chunks.assign(static_cast<size_t>(p * v), CostChunk{});
  for (const PipelineStage& stage : partition->stages) {
    for (const PipelineChunk& c : stage.chunks) {
      CostChunk& out = chunks[static_cast<size_t>(c.chunk * p + c.pp_rank)];
      out.first_layer = c.first_layer;
      out.layers = c.layer_count();
      out.embedding = c.embedding;
      out.loss = c.loss;
    }
  }
  return true;
}

}  // namespace paraplan
