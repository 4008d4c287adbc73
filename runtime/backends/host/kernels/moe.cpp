// Mixture-of-experts kernels: the router (scores, top-k choice, load-balancing loss), the
// permutation of tokens into expert order and back, and grouped linear layers. Scalar loops in a
// fixed order (each row's result depends only on that row, and sums run in increasing index), so
// results never depend on how rows are split between calls; the grouped GEMMs go through Gemm,
// as LinearForward does.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "runtime/backends/host/kernels/kernels.h"

namespace paraplan::host {

// Kernel signatures follow the Backend interface (runtime/exec/backend.h): tensors as raw
// pointers and sizes, several of one type side by side.
// NOLINTBEGIN(bugprone-easily-swappable-parameters)

namespace {

// Scores of one row of logits.
void RowScores(float* s, const float* z, int64_t experts, RouterScore score) {
  if (score == RouterScore::kSigmoid) {
    for (int64_t e = 0; e < experts; ++e) s[e] = 1.0f / (1.0f + std::exp(-z[e]));
    return;
  }
  float m = z[0];
  for (int64_t e = 1; e < experts; ++e) m = std::max(m, z[e]);
  double sum = 0;
  for (int64_t e = 0; e < experts; ++e) {
    s[e] = std::exp(z[e] - m);
    sum += s[e];
  }
  const auto inv = static_cast<float>(1.0 / sum);
  for (int64_t e = 0; e < experts; ++e) s[e] *= inv;
}

// The coefficient of counts[e] · scores[r, e] in the auxiliary loss.
double AuxFactor(int64_t rows, const MoeRouterConfig& config) {
  const auto t = static_cast<double>(config.aux_rows > 0 ? config.aux_rows : rows);
  return static_cast<double>(config.aux_coeff) * static_cast<double>(config.experts) /
         (static_cast<double>(config.topk) * t * t);
}

// The routing key of expert e: its score plus the expert bias, which changes the choice only.
float RouterKey(const float* s, const float* bias, int64_t e) {
  return bias ? s[e] + bias[e] : s[e];
}

// The score of the group of experts [first, first + size): the sum of its n largest keys, added
// in decreasing order (key descending, then index ascending); each pick is the largest key after
// the previous pick in that order, so the sum needs no storage (the CUDA kernel's loop).
float GroupScore(const float* s, const float* bias, int64_t first, int64_t size, int64_t n) {
  float sum = 0.0f;
  int64_t prev = -1;
  float prev_key = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    int64_t best = -1;
    float best_key = 0.0f;
    for (int64_t e = first; e < first + size; ++e) {
      const float key = RouterKey(s, bias, e);
      if (prev >= 0 && !(key < prev_key || (key == prev_key && e > prev))) continue;
      if (best < 0 || key > best_key) {
        best = e;
        best_key = key;
      }
    }
    sum += best_key;
    prev = best;
    prev_key = best_key;
  }
  return sum;
}

// Group-limited routing: kept[g] = 1 for the group_topk groups of highest score (ties to the
// lower group index).
void KeepGroups(std::vector<char>& kept, std::vector<float>& group_scores, const float* s,
                const float* bias, const MoeRouterConfig& config) {
  const int64_t groups = config.groups, size = config.experts / config.groups;
  const int64_t n = config.topk / config.group_topk;
  for (int64_t g = 0; g < groups; ++g)
    group_scores[static_cast<size_t>(g)] = GroupScore(s, bias, g * size, size, n);
  std::fill(kept.begin(), kept.end(), 0);
  for (int64_t i = 0; i < config.group_topk; ++i) {
    int64_t best = -1;
    for (int64_t g = 0; g < groups; ++g) {
      if (kept[static_cast<size_t>(g)]) continue;
      if (best < 0 ||
          group_scores[static_cast<size_t>(g)] > group_scores[static_cast<size_t>(best)])
        best = g;
    }
    kept[static_cast<size_t>(best)] = 1;
  }
}

}  // namespace

void MoeRouterForward(float* weights, int32_t* indices, float* scores, float* counts,
                      const float* logits, const float* bias, int64_t rows,
                      const MoeRouterConfig& config) {
  const int64_t experts = config.experts;
  const int64_t topk = config.topk;
  const int64_t group_size = experts / config.groups;
  std::vector<char> taken(static_cast<size_t>(experts));
  std::vector<char> kept(static_cast<size_t>(config.groups));
  std::vector<float> group_scores(static_cast<size_t>(config.groups));
  if (counts) std::memset(counts, 0, static_cast<size_t>(experts) * sizeof(float));
  for (int64_t r = 0; r < rows; ++r) {
    float* s = scores + r * experts;
    RowScores(s, logits + r * experts, experts, config.score);
    std::fill(taken.begin(), taken.end(), 0);
    if (config.groups > 1) {
      // The experts of the groups not kept are out of the choice.
      KeepGroups(kept, group_scores, s, bias, config);
      for (int64_t e = 0; e < experts; ++e)
        taken[static_cast<size_t>(e)] = kept[static_cast<size_t>(e / group_size)] ? 0 : 1;
    }
    double sum = 0;
    for (int64_t j = 0; j < topk; ++j) {
      int64_t best = -1;
      float best_key = 0;
      for (int64_t e = 0; e < experts; ++e) {
        if (taken[static_cast<size_t>(e)]) continue;
        const float key = RouterKey(s, bias, e);
        if (best < 0 || key > best_key) {  // strictly greater: ties keep the lower index
          best = e;
          best_key = key;
        }
      }
      taken[static_cast<size_t>(best)] = 1;
      indices[r * topk + j] = static_cast<int32_t>(best);
      weights[r * topk + j] = s[best];
      sum += s[best];
      if (counts) counts[best] += 1.0f;
    }
    if (config.normalize) {
      const auto inv = static_cast<float>(1.0 / sum);
      for (int64_t j = 0; j < topk; ++j) weights[r * topk + j] *= inv;
    }
    if (config.scale != 1.0f)
      for (int64_t j = 0; j < topk; ++j) weights[r * topk + j] *= config.scale;
  }
}

void MoeExpertBiasUpdate(float* bias, float* load, int64_t experts, float rate) {
  double total = 0;
  for (int64_t e = 0; e < experts; ++e) total += load[e];
  const double mean = total / static_cast<double>(experts);
  for (int64_t e = 0; e < experts; ++e) {
    const double offset = mean - static_cast<double>(load[e]);
    bias[e] += offset > 0 ? rate : offset < 0 ? -rate : 0.0f;
    load[e] = 0.0f;
  }
}

void MoeCapacityForward(float* kept, float* mask, const float* weights, const int32_t* indices,
                        int64_t rows, int64_t experts, int64_t topk, int64_t capacity,
                        bool position, int64_t segments) {
  const int64_t segment_pairs = rows / segments * topk;
  std::vector<std::vector<int64_t>> by_expert(static_cast<size_t>(experts));
  for (int64_t s = 0; s < segments; ++s) {
    for (auto& list : by_expert) list.clear();
    for (int64_t p = s * segment_pairs; p < (s + 1) * segment_pairs; ++p)
      by_expert[static_cast<size_t>(indices[p])].push_back(p);
    for (auto& list : by_expert) {
      if (!position)
        std::stable_sort(list.begin(), list.end(),
                         [&](int64_t a, int64_t b) { return weights[a] > weights[b]; });
      for (size_t i = 0; i < list.size(); ++i) {
        const int64_t p = list[i];
        const bool keep = static_cast<int64_t>(i) < capacity;
        mask[p] = keep ? 1.0f : 0.0f;
        kept[p] = keep ? weights[p] : 0.0f;
      }
    }
  }
}

void MoeCapacityBackward(float* dweights, const float* dkept, const float* mask, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dweights[i] = dkept[i] * mask[i];
}

void MoeAuxLoss(float* loss_sum, const float* scores, const float* counts, int64_t rows,
                const MoeRouterConfig& config) {
  double total = 0;
  for (int64_t e = 0; e < config.experts; ++e) {
    double col = 0;
    for (int64_t r = 0; r < rows; ++r) col += scores[r * config.experts + e];
    total += static_cast<double>(counts[e]) * col;
  }
  loss_sum[0] += static_cast<float>(AuxFactor(rows, config) * total);
}

void MoeRouterBackward(float* dlogits, const float* dweights, const int32_t* indices,
                       const float* scores, const float* counts, int64_t rows,
                       const MoeRouterConfig& config, float aux_grad_scale) {
  const int64_t experts = config.experts;
  const int64_t topk = config.topk;
  const bool aux = aux_grad_scale != 0.0f && config.aux_coeff != 0.0f && counts != nullptr;
  const auto aux_factor = static_cast<float>(aux ? AuxFactor(rows, config) * aux_grad_scale : 0);
  std::vector<float> ds(static_cast<size_t>(experts));
  for (int64_t r = 0; r < rows; ++r) {
    const float* s = scores + r * experts;
    const int32_t* idx = indices + r * topk;
    const float* dw = dweights + r * topk;
    for (int64_t e = 0; e < experts; ++e)
      ds[static_cast<size_t>(e)] = aux ? aux_factor * counts[e] : 0.0f;
    // The weights are scale · w_j: the gradient of w_j is scale · dw_j.
    const float scale = config.scale;
    if (config.normalize) {
      // w_j = s_j / S: ds_j = (dw_j - Σ_i dw_i · w_i) / S.
      double sum = 0;
      for (int64_t j = 0; j < topk; ++j) sum += s[idx[j]];
      double dot = 0;
      for (int64_t j = 0; j < topk; ++j)
        dot += static_cast<double>(dw[j] * scale) * s[idx[j]] / sum;
      for (int64_t j = 0; j < topk; ++j)
        ds[static_cast<size_t>(idx[j])] += static_cast<float>((dw[j] * scale - dot) / sum);
    } else {
      for (int64_t j = 0; j < topk; ++j) ds[static_cast<size_t>(idx[j])] += dw[j] * scale;
    }
    float* dz = dlogits + r * experts;
    if (config.score == RouterScore::kSigmoid) {
      for (int64_t e = 0; e < experts; ++e)
        dz[e] = ds[static_cast<size_t>(e)] * s[e] * (1.0f - s[e]);
    } else {
      double dot = 0;
      for (int64_t e = 0; e < experts; ++e)
        dot += static_cast<double>(s[e]) * ds[static_cast<size_t>(e)];
      for (int64_t e = 0; e < experts; ++e)
        dz[e] = s[e] * (ds[static_cast<size_t>(e)] - static_cast<float>(dot));
    }
  }
}

namespace {

// MoePermute's scans over the pairs a mask keeps (every pair without one); rows of `out` past
// `out_rows` are not written.
void PermutePairs(float* out, int32_t* row_map, int32_t* expert_counts, const float* x,
                  const int32_t* indices, const float* mask, int64_t rows, int64_t dim,
                  int64_t experts, int64_t topk, int64_t out_rows) {
  auto kept = [&](int64_t p) { return mask == nullptr || mask[p] != 0.0f; };
  std::vector<int64_t> next(static_cast<size_t>(experts), 0);
  for (int64_t p = 0; p < rows * topk; ++p)
    if (kept(p)) ++next[static_cast<size_t>(indices[p])];
  int64_t offset = 0;
  for (int64_t e = 0; e < experts; ++e) {
    const int64_t count = next[static_cast<size_t>(e)];
    expert_counts[e] = static_cast<int32_t>(count);
    next[static_cast<size_t>(e)] = offset;
    offset += count;
  }
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < topk; ++j) {
      const int64_t p = r * topk + j;
      if (!kept(p)) {
        row_map[p] = -1;
        continue;
      }
      const int64_t dst = next[static_cast<size_t>(indices[p])]++;
      row_map[p] = static_cast<int32_t>(dst);
      if (dst < out_rows) Copy(out + dst * dim, x + r * dim, dim);
    }
  }
}

}  // namespace

void MoePermute(float* out, int32_t* row_map, int32_t* expert_counts, const float* x,
                const int32_t* indices, int64_t rows, int64_t dim, int64_t experts, int64_t topk) {
  PermutePairs(out, row_map, expert_counts, x, indices, nullptr, rows, dim, experts, topk,
               rows * topk);
}

void MoePermuteKept(float* out, int32_t* row_map, int32_t* expert_counts, const float* x,
                    const int32_t* indices, const float* mask, int64_t rows, int64_t dim,
                    int64_t experts, int64_t topk, int64_t out_rows) {
  PermutePairs(out, row_map, expert_counts, x, indices, mask, rows, dim, experts, topk, out_rows);
}

void MoeUnpermute(float* y, const float* x, const int32_t* row_map, const float* weights,
                  int64_t rows, int64_t dim, int64_t topk) {
  for (int64_t r = 0; r < rows; ++r) {
    float* yr = y + r * dim;
    bool first = true;
    for (int64_t j = 0; j < topk; ++j) {
      const int64_t row = row_map[r * topk + j];
      if (row < 0) continue;  // a dropped pair
      const float* xr = x + row * dim;
      const float w = weights ? weights[r * topk + j] : 1.0f;
      if (first) {
        for (int64_t c = 0; c < dim; ++c) yr[c] = w * xr[c];
      } else {
        for (int64_t c = 0; c < dim; ++c) yr[c] += w * xr[c];
      }
      first = false;
    }
    if (first) Fill(yr, dim, 0.0f);
  }
}

void MoeUnpermuteBackward(float* dx, float* dweights, const float* dy, const float* x,
                          const int32_t* row_map, const float* weights, int64_t rows, int64_t dim,
                          int64_t topk) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* dyr = dy + r * dim;
    for (int64_t j = 0; j < topk; ++j) {
      const int64_t row = row_map[r * topk + j];
      if (row < 0) {  // a dropped pair: no row of dx, no gradient for its weight
        if (dweights) dweights[r * topk + j] = 0.0f;
        continue;
      }
      const float w = weights ? weights[r * topk + j] : 1.0f;
      float* dxr = dx + row * dim;
      for (int64_t c = 0; c < dim; ++c) dxr[c] = w * dyr[c];
      if (dweights) {
        const float* xr = x + row * dim;
        double dot = 0;
        for (int64_t c = 0; c < dim; ++c) dot += static_cast<double>(dyr[c]) * xr[c];
        dweights[r * topk + j] = static_cast<float>(dot);
      }
    }
  }
}

void GroupedLinearForward(float* y, const float* x, const float* w, const int32_t* counts,
                          int64_t groups, int64_t in, int64_t out) {
  int64_t row = 0;
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t n = counts[g];
    if (n > 0) LinearForward(y + row * out, x + row * in, w + g * out * in, nullptr, n, in, out);
    row += n;
  }
}

void GroupedLinearBackward(float* dx, float* dw, const float* dy, const float* x, const float* w,
                           const int32_t* counts, int64_t groups, int64_t in, int64_t out,
                           bool accumulate_dx) {
  int64_t row = 0;
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t n = counts[g];
    if (n > 0) {
      LinearBackward(dx ? dx + row * in : nullptr, dw ? dw + g * out * in : nullptr, nullptr,
                     dy + row * out, x + row * in, w + g * out * in, n, in, out, accumulate_dx);
    }
    row += n;
  }
}

// NOLINTEND(bugprone-easily-swappable-parameters)

}  // namespace paraplan::host
