#include "compiler/analyze/cost_stages.h"

namespace paraplan {

bool StageChunks(const Plan& plan, std::vector<CostChunk>& chunks) {
  const int64_t p = plan.parallel.pp, v = plan.parallel.vpp, L = plan.model.layers;
  if (p < 1 || v < 1 || L < 1 || p > (int64_t{1} << 20) || v > 1024) return false;
  const int64_t n = p * v;
  chunks.assign(static_cast<size_t>(n), CostChunk{});
  const auto& explicit_split = plan.pipeline.stage_layers;
  if (!explicit_split.empty()) {
    if (static_cast<int64_t>(explicit_split.size()) != n) return false;
    int64_t sum = 0;
    for (int64_t i = 0; i < n; ++i) {
      if (explicit_split[i] < 0) return false;
      chunks[i].layers = explicit_split[i];
      sum += explicit_split[i];
    }
    if (sum != L) return false;
  } else if (v == 1 && p > 1 &&
             (plan.pipeline.first_stage_layers || plan.pipeline.last_stage_layers)) {
    const int64_t first = plan.pipeline.first_stage_layers.value_or(-1);
    const int64_t last = plan.pipeline.last_stage_layers.value_or(-1);
    int64_t rest = L - (first >= 0 ? first : 0) - (last >= 0 ? last : 0);
    const int64_t middle = p - (first >= 0 ? 1 : 0) - (last >= 0 ? 1 : 0);
    if (rest < 0 || (middle == 0 && rest != 0) || (middle > 0 && rest % middle != 0)) return false;
    const int64_t each = middle > 0 ? rest / middle : 0;
    for (int64_t i = 0; i < n; ++i) chunks[i].layers = each;
    if (first >= 0) chunks[0].layers = first;
    if (last >= 0) chunks[n - 1].layers = last;
  } else {
    const int64_t emb = plan.pipeline.account_for_embedding ? 1 : 0;
    const int64_t loss = plan.pipeline.account_for_loss ? 1 : 0;
    const int64_t total = L + emb + loss;
    if (total % n != 0) return false;
    for (int64_t i = 0; i < n; ++i) chunks[i].layers = total / n;
    chunks[0].layers -= emb;
    chunks[n - 1].layers -= loss;
    if (chunks[0].layers < 0 || chunks[n - 1].layers < 0) return false;
  }
  int64_t next = 0;
  for (int64_t i = 0; i < n; ++i) {
    chunks[i].first_layer = next;
    next += chunks[i].layers;
  }
  chunks[0].embedding = true;
  chunks[n - 1].loss = true;
  return true;
}

}  // namespace paraplan
