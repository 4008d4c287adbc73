// Mixture-of-experts kernels: the router (one thread per token row, the host's loops and order),
// the permutation into expert order (per-expert threads that each scan the routed pairs in
// order, so the result is the host's without atomics) and the weighted combine back. Grouped
// linear layers are the backend's: one GEMM per expert on the GEMM engine.
#include "runtime/backends/cuda/kernels/common.cuh"
#include "runtime/backends/cuda/kernels/kernels.h"

namespace paraplan::cuda {

// Kernel signatures follow the Backend interface (runtime/exec/backend.h) and the host
// specification: tensors as raw pointers and sizes in the specification's order.
// NOLINTBEGIN(bugprone-easily-swappable-parameters)
namespace {

__device__ double AuxFactor(int64_t rows, const MoeRouterConfig& config) {
  const double t = static_cast<double>(config.aux_rows > 0 ? config.aux_rows : rows);
  return static_cast<double>(config.aux_coeff) * static_cast<double>(config.experts) /
         (static_cast<double>(config.topk) * t * t);
}

__device__ float RouterKey(const float* s, const float* bias, int64_t e) {
  return bias ? s[e] + bias[e] : s[e];
}

// The host's group score: the sum of the group's n largest keys in decreasing order, each pick
// the largest key after the previous one (key descending, then index ascending).
__device__ float GroupScore(const float* s, const float* bias, int64_t first, int64_t size,
                            int64_t n) {
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

// Group-limited routing without per-row storage: the last kept group in (score descending,
// index ascending) order; group g is kept when it comes no later than it.
struct GroupCut {
  int64_t group = -1;
  float score = 0.0f;
  __device__ bool Keeps(int64_t g, float score_g) const {
    return score_g > score || (score_g == score && g <= group);
  }
};

__device__ GroupCut LastKeptGroup(const float* s, const float* bias, const MoeRouterConfig& c) {
  const int64_t size = c.experts / c.groups, n = c.topk / c.group_topk;
  GroupCut cut;
  for (int64_t i = 0; i < c.group_topk; ++i) {
    int64_t best = -1;
    float best_score = 0.0f;
    for (int64_t g = 0; g < c.groups; ++g) {
      const float score = GroupScore(s, bias, g * size, size, n);
      if (cut.group >= 0 && !(score < cut.score || (score == cut.score && g > cut.group))) continue;
      if (best < 0 || score > best_score) {
        best = g;
        best_score = score;
      }
    }
    cut.group = best;
    cut.score = best_score;
  }
  return cut;
}

// One thread per row: scores, then the top-k choice (ties to the lower index) among the kept
// groups' experts, as the host.
__global__ void RouterForwardKernel(float* weights, int32_t* indices, float* scores,
                                    const float* logits, const float* bias, int64_t rows,
                                    MoeRouterConfig config) {
  const int64_t experts = config.experts, topk = config.topk;
  PARAPLAN_GRID_STRIDE(r, rows) {
    float* s = scores + r * experts;
    const float* z = logits + r * experts;
    if (config.score == 1) {
      for (int64_t e = 0; e < experts; ++e) s[e] = 1.0f / (1.0f + expf(-z[e]));
    } else {
      float m = z[0];
      for (int64_t e = 1; e < experts; ++e) m = fmaxf(m, z[e]);
      double sum = 0;
      for (int64_t e = 0; e < experts; ++e) {
        s[e] = expf(z[e] - m);
        sum += s[e];
      }
      const float inv = static_cast<float>(1.0 / sum);
      for (int64_t e = 0; e < experts; ++e) s[e] *= inv;
    }
    const bool grouped = config.groups > 1;
    const int64_t group_size = experts / config.groups, group_n = topk / config.group_topk;
    const GroupCut cut = grouped ? LastKeptGroup(s, bias, config) : GroupCut{};
    double sum = 0;
    for (int64_t j = 0; j < topk; ++j) {
      int64_t best = -1;
      float best_key = 0;
      bool group_kept = true;
      for (int64_t e = 0; e < experts; ++e) {
        if (grouped && e % group_size == 0) {
          const int64_t g = e / group_size;
          group_kept = cut.Keeps(g, GroupScore(s, bias, e, group_size, group_n));
        }
        if (!group_kept) continue;
        bool taken = false;
        for (int64_t i = 0; i < j; ++i) taken = taken || indices[r * topk + i] == e;
        if (taken) continue;
        const float key = RouterKey(s, bias, e);
        if (best < 0 || key > best_key) {
          best = e;
          best_key = key;
        }
      }
      indices[r * topk + j] = static_cast<int32_t>(best);
      weights[r * topk + j] = s[best];
      sum += s[best];
    }
    if (config.normalize) {
      const float inv = static_cast<float>(1.0 / sum);
      for (int64_t j = 0; j < topk; ++j) weights[r * topk + j] *= inv;
    }
    if (config.scale != 1.0f)
      for (int64_t j = 0; j < topk; ++j) weights[r * topk + j] *= config.scale;
  }
}

// One thread per expert: how many routed pairs picked it.
// mask (may be null): the pairs it gives 0 are not counted.
__global__ void CountKernel(float* counts_f, int32_t* counts_i, const int32_t* indices,
                            int64_t pairs, int64_t experts, const float* mask) {
  PARAPLAN_GRID_STRIDE(e, experts) {
    int64_t n = 0;
    for (int64_t p = 0; p < pairs; ++p)
      n += indices[p] == e && (mask == nullptr || mask[p] != 0.0f) ? 1 : 0;
    if (counts_f) counts_f[e] = static_cast<float>(n);
    if (counts_i) counts_i[e] = static_cast<int32_t>(n);
  }
}

__global__ void RouterBackwardKernel(float* dlogits, const float* dweights, const int32_t* indices,
                                     const float* scores, const float* counts, int64_t rows,
                                     MoeRouterConfig config, float aux_grad_scale) {
  const int64_t experts = config.experts, topk = config.topk;
  const bool aux = aux_grad_scale != 0.0f && config.aux_coeff != 0.0f && counts != nullptr;
  const float aux_factor =
      aux ? static_cast<float>(AuxFactor(rows, config) * static_cast<double>(aux_grad_scale))
          : 0.0f;
  PARAPLAN_GRID_STRIDE(r, rows) {
    const float* s = scores + r * experts;
    const int32_t* idx = indices + r * topk;
    const float* dw = dweights + r * topk;
    float* ds = dlogits + r * experts;  // the score gradient first, then turned into dlogits
    for (int64_t e = 0; e < experts; ++e) ds[e] = aux ? aux_factor * counts[e] : 0.0f;
    const float scale = config.scale;  // the weights' factor: dw_j · scale
    if (config.normalize) {
      double sum = 0;
      for (int64_t j = 0; j < topk; ++j) sum += s[idx[j]];
      double dot = 0;
      for (int64_t j = 0; j < topk; ++j)
        dot += static_cast<double>(dw[j] * scale) * s[idx[j]] / sum;
      for (int64_t j = 0; j < topk; ++j)
        ds[idx[j]] += static_cast<float>((dw[j] * scale - dot) / sum);
    } else {
      for (int64_t j = 0; j < topk; ++j) ds[idx[j]] += dw[j] * scale;
    }
    if (config.score == 1) {
      for (int64_t e = 0; e < experts; ++e) ds[e] = ds[e] * s[e] * (1.0f - s[e]);
    } else {
      double dot = 0;
      for (int64_t e = 0; e < experts; ++e) dot += static_cast<double>(s[e]) * ds[e];
      for (int64_t e = 0; e < experts; ++e) ds[e] = s[e] * (ds[e] - static_cast<float>(dot));
    }
  }
}

// One thread per expert: its first row in expert order, then its pairs in increasing order. With
// a mask the pairs it gives 0 are dropped (row_map -1; written by the pair's own expert's thread).
__global__ void RowMapKernel(int32_t* row_map, const int32_t* counts, const int32_t* indices,
                             int64_t pairs, int64_t experts, const float* mask) {
  PARAPLAN_GRID_STRIDE(e, experts) {
    int64_t next = 0;
    for (int64_t f = 0; f < e; ++f) next += counts[f];
    for (int64_t p = 0; p < pairs; ++p) {
      if (indices[p] != e) continue;
      row_map[p] = mask != nullptr && mask[p] == 0.0f ? -1 : static_cast<int32_t>(next++);
    }
  }
}

// Rows past out_rows (more kept pairs than the buffer holds) and dropped pairs are not copied.
__global__ void PermuteRowsKernel(float* out, const float* x, const int32_t* row_map, int64_t pairs,
                                  int64_t dim, int64_t topk, int64_t out_rows) {
  PARAPLAN_GRID_STRIDE(i, pairs * dim) {
    const int64_t p = i / dim, c = i % dim;
    const int64_t row = row_map[p];
    if (row >= 0 && row < out_rows) out[row * dim + c] = x[(p / topk) * dim + c];
  }
}

__global__ void UnpermuteKernel(float* y, const float* x, const int32_t* row_map,
                                const float* weights, int64_t rows, int64_t dim, int64_t topk) {
  PARAPLAN_GRID_STRIDE(i, rows * dim) {
    const int64_t r = i / dim, c = i % dim;
    float acc = 0.0f;
    bool first = true;
    for (int64_t j = 0; j < topk; ++j) {
      const int64_t row = row_map[r * topk + j];
      if (row < 0) continue;  // a dropped pair
      const float w = weights ? weights[r * topk + j] : 1.0f;
      const float v = w * x[row * dim + c];
      acc = first ? v : acc + v;
      first = false;
    }
    y[i] = acc;
  }
}

__global__ void UnpermuteBackwardRowsKernel(float* dx, const float* dy, const int32_t* row_map,
                                            const float* weights, int64_t pairs, int64_t dim,
                                            int64_t topk) {
  PARAPLAN_GRID_STRIDE(i, pairs * dim) {
    const int64_t p = i / dim, c = i % dim, row = row_map[p];
    if (row < 0) continue;  // a dropped pair writes no row
    const float w = weights ? weights[p] : 1.0f;
    dx[row * dim + c] = w * dy[(p / topk) * dim + c];
  }
}

__global__ void UnpermuteBackwardWeightsKernel(float* dweights, const float* dy, const float* x,
                                               const int32_t* row_map, int64_t pairs, int64_t dim,
                                               int64_t topk) {
  PARAPLAN_GRID_STRIDE(p, pairs) {
    if (row_map[p] < 0) {  // a dropped pair: no gradient for its weight
      dweights[p] = 0.0f;
      continue;
    }
    const float* dyr = dy + (p / topk) * dim;
    const float* xr = x + static_cast<int64_t>(row_map[p]) * dim;
    double dot = 0;
    for (int64_t c = 0; c < dim; ++c) dot += static_cast<double>(dyr[c]) * xr[c];
    dweights[p] = static_cast<float>(dot);
  }
}

}  // namespace

void MoeRouterForward(float* weights, int32_t* indices, float* scores, float* counts,
                      const float* logits, const float* bias, int64_t rows,
                      const MoeRouterConfig& config, cudaStream_t stream) {
  if (config.experts < 1 || config.topk < 1 || config.topk > config.experts)
    throw CudaError("MoeRouterForward: need 1 <= topk <= experts");
  if (config.groups < 1 || config.experts % config.groups != 0 || config.group_topk < 1 ||
      config.group_topk > config.groups || config.group_topk > config.topk ||
      config.topk > config.group_topk * (config.experts / config.groups))
    throw CudaError(
        "MoeRouterForward: need groups dividing experts, 1 <= group_topk <= min(groups, topk) "
        "and topk <= group_topk · experts / groups");
  if (rows > 0) {
    PARAPLAN_LAUNCH(RouterForwardKernel, GridFor(rows), kThreads, 0, stream, weights, indices,
                    scores, logits, bias, rows, config);
    PARAPLAN_CUDA_CHECK_LAUNCH();
  }
  if (counts) {
    PARAPLAN_LAUNCH(CountKernel, GridFor(config.experts), kThreads, 0, stream, counts, nullptr,
                    indices, rows * config.topk, config.experts, nullptr);
    PARAPLAN_CUDA_CHECK_LAUNCH();
  }
}

void MoeRouterBackward(float* dlogits, const float* dweights, const int32_t* indices,
                       const float* scores, const float* counts, int64_t rows,
                       const MoeRouterConfig& config, float aux_grad_scale, cudaStream_t stream) {
  if (rows <= 0) return;
  PARAPLAN_LAUNCH(RouterBackwardKernel, GridFor(rows), kThreads, 0, stream, dlogits, dweights,
                  indices, scores, counts, rows, config, aux_grad_scale);
  PARAPLAN_CUDA_CHECK_LAUNCH();
}

namespace {

// One thread: the experts are few (hundreds) and the update runs once a step.
__global__ void ExpertBiasUpdateKernel(float* bias, float* load, int64_t experts, float rate) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  double total = 0;
  for (int64_t e = 0; e < experts; ++e) total += load[e];
  const double mean = total / static_cast<double>(experts);
  for (int64_t e = 0; e < experts; ++e) {
    const double offset = mean - static_cast<double>(load[e]);
    bias[e] += offset > 0 ? rate : offset < 0 ? -rate : 0.0f;
    load[e] = 0.0f;
  }
}

}  // namespace

namespace {

__global__ void CapacityKernel(float* kept, float* mask, const float* weights,
                               const int32_t* indices, int64_t pairs, int64_t segment_pairs,
                               int64_t capacity, bool position) {
  PARAPLAN_GRID_STRIDE(p, pairs) {
    const int32_t e = indices[p];
    const float w = weights[p];
    const int64_t first = p / segment_pairs * segment_pairs;
    int64_t before = 0;
    for (int64_t q = first; q < first + segment_pairs; ++q)
      if (indices[q] == e && (position ? q < p : (weights[q] > w || (weights[q] == w && q < p))))
        ++before;
    const bool keep = before < capacity;
    mask[p] = keep ? 1.0f : 0.0f;
    kept[p] = keep ? w : 0.0f;
  }
}

__global__ void CapacityBackwardKernel(float* dweights, const float* dkept, const float* mask,
                                       int64_t n) {
  PARAPLAN_GRID_STRIDE(i, n) { dweights[i] = dkept[i] * mask[i]; }
}

}  // namespace

void MoeCapacityForward(float* kept, float* mask, const float* weights, const int32_t* indices,
                        int64_t rows, int64_t experts, int64_t topk, int64_t capacity,
                        bool position, int64_t segments, cudaStream_t stream) {
  (void)experts;
  const int64_t pairs = rows * topk;
  if (pairs <= 0) return;
  PARAPLAN_LAUNCH(CapacityKernel, GridFor(pairs), kThreads, 0, stream, kept, mask, weights, indices,
                  pairs, rows / segments * topk, capacity, position);
  PARAPLAN_CUDA_CHECK_LAUNCH();
}

void MoeCapacityBackward(float* dweights, const float* dkept, const float* mask, int64_t n,
                         cudaStream_t stream) {
  if (n <= 0) return;
  PARAPLAN_LAUNCH(CapacityBackwardKernel, GridFor(n), kThreads, 0, stream, dweights, dkept, mask,
                  n);
  PARAPLAN_CUDA_CHECK_LAUNCH();
}

void MoeExpertBiasUpdate(float* bias, float* load, int64_t experts, float rate,
                         cudaStream_t stream) {
  if (experts <= 0) return;
  PARAPLAN_LAUNCH(ExpertBiasUpdateKernel, 1, 1, 0, stream, bias, load, experts, rate);
  PARAPLAN_CUDA_CHECK_LAUNCH();
}

void MoePermute(float* out, int32_t* row_map, int32_t* expert_counts, const float* x,
                const int32_t* indices, int64_t rows, int64_t dim, int64_t experts, int64_t topk,
                cudaStream_t stream) {
  if (experts <= 0) return;
  const int64_t pairs = rows * topk;
  PARAPLAN_LAUNCH(CountKernel, GridFor(experts), kThreads, 0, stream, nullptr, expert_counts,
                  indices, pairs, experts, nullptr);
  PARAPLAN_CUDA_CHECK_LAUNCH();
  if (pairs <= 0) return;
  PARAPLAN_LAUNCH(RowMapKernel, GridFor(experts), kThreads, 0, stream, row_map, expert_counts,
                  indices, pairs, experts, nullptr);
  PARAPLAN_CUDA_CHECK_LAUNCH();
  if (dim <= 0) return;
  PARAPLAN_LAUNCH(PermuteRowsKernel, GridFor(pairs * dim), kThreads, 0, stream, out, x, row_map,
                  pairs, dim, topk, pairs);
  PARAPLAN_CUDA_CHECK_LAUNCH();
}

void MoePermuteKept(float* out, int32_t* row_map, int32_t* expert_counts, const float* x,
                    const int32_t* indices, const float* mask, int64_t rows, int64_t dim,
                    int64_t experts, int64_t topk, int64_t out_rows, cudaStream_t stream) {
  if (experts <= 0) return;
  const int64_t pairs = rows * topk;
  PARAPLAN_LAUNCH(CountKernel, GridFor(experts), kThreads, 0, stream, nullptr, expert_counts,
                  indices, pairs, experts, mask);
  PARAPLAN_CUDA_CHECK_LAUNCH();
  if (pairs <= 0) return;
  PARAPLAN_LAUNCH(RowMapKernel, GridFor(experts), kThreads, 0, stream, row_map, expert_counts,
                  indices, pairs, experts, mask);
  PARAPLAN_CUDA_CHECK_LAUNCH();
  if (dim <= 0) return;
  PARAPLAN_LAUNCH(PermuteRowsKernel, GridFor(pairs * dim), kThreads, 0, stream, out, x, row_map,
                  pairs, dim, topk, out_rows);
  PARAPLAN_CUDA_CHECK_LAUNCH();
}

void MoeUnpermute(float* y, const float* x, const int32_t* row_map, const float* weights,
                  int64_t rows, int64_t dim, int64_t topk, cudaStream_t stream) {
  if (rows <= 0 || dim <= 0) return;
  PARAPLAN_LAUNCH(UnpermuteKernel, GridFor(rows * dim), kThreads, 0, stream, y, x, row_map, weights,
                  rows, dim, topk);
  PARAPLAN_CUDA_CHECK_LAUNCH();
}

void MoeUnpermuteBackward(float* dx, float* dweights, const float* dy, const float* x,
                          const int32_t* row_map, const float* weights, int64_t rows, int64_t dim,
                          int64_t topk, cudaStream_t stream) {
  const int64_t pairs = rows * topk;
  if (pairs <= 0) return;
  if (dim > 0) {
    PARAPLAN_LAUNCH(UnpermuteBackwardRowsKernel, GridFor(pairs * dim), kThreads, 0, stream, dx, dy,
                    row_map, weights, pairs, dim, topk);
    PARAPLAN_CUDA_CHECK_LAUNCH();
  }
  if (dweights) {
    PARAPLAN_LAUNCH(UnpermuteBackwardWeightsKernel, GridFor(pairs), kThreads, 0, stream, dweights,
                    dy, x, row_map, pairs, dim, topk);
    PARAPLAN_CUDA_CHECK_LAUNCH();
  }
}

// NOLINTEND(bugprone-easily-swappable-parameters)

}  // namespace paraplan::cuda
