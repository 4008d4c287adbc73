// Vocab-parallel cross-entropy phases, squared norms, AdamW, SGD and the learning-rate schedule,
// on 8-lane vectors (simd.h).
#include <algorithm>
#include <cmath>

#include "runtime/backends/host/kernels/kernels.h"
#include "runtime/backends/host/kernels/simd.h"

namespace paraplan::host {

// Kernel signatures follow the Backend interface (runtime/exec/backend.h) and the host
// specification: tensors as raw pointers and sizes in the specification's order, several of one
// type side by side; every argument is checked against the reference by the kernel tests.
// NOLINTBEGIN(bugprone-easily-swappable-parameters)

using simd::kLanes;
using simd::V8;

PARAPLAN_HOST_CLONES void CrossEntropyRowMax(float* row_max, const float* logits, int64_t rows,
                                             int64_t vocab_local) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* lr = logits + r * vocab_local;
    V8 m = simd::Splat(-INFINITY);
    int64_t j = 0;
    for (; j + kLanes <= vocab_local; j += kLanes) {
      const V8 x = simd::Load(lr + j);
      m = x > m ? x : m;
    }
    if (j < vocab_local) {
      const V8 x = simd::LoadPart(lr + j, vocab_local - j, -INFINITY);
      m = x > m ? x : m;
    }
    row_max[r] = simd::Max(m);
  }
}

PARAPLAN_HOST_CLONES void CrossEntropySumExp(float* st, const float* logits, const float* row_max,
                                             const int32_t* targets, int64_t rows,
                                             int64_t vocab_local, int64_t vocab_begin,
                                             int64_t vocab) {
  const int64_t valid = std::clamp<int64_t>(vocab - vocab_begin, 0, vocab_local);
  for (int64_t r = 0; r < rows; ++r) {
    if (targets[r] < 0) {  // an ignored row: (0, 0) on every slice marks it after the TP sum
      st[2 * r] = 0.0f;
      st[2 * r + 1] = 0.0f;
      continue;
    }
    const float* lr = logits + r * vocab_local;
    const V8 mx = simd::Splat(row_max[r]);
    V8 s{};
    int64_t j = 0;
    for (; j + kLanes <= valid; j += kLanes) s += simd::Exp(simd::Load(lr + j) - mx);
    if (j < valid) s += simd::Exp(simd::LoadPart(lr + j, valid - j, -INFINITY) - mx);
    st[2 * r] = simd::Sum(s);
    const int64_t t = static_cast<int64_t>(targets[r]) - vocab_begin;
    st[2 * r + 1] = (t >= 0 && t < valid) ? lr[t] : 0.0f;
  }
}

void CrossEntropyLoss(float* loss_sum, const float* row_max, const float* st, int64_t rows,
                      float scale) {
  double sum = 0;
  for (int64_t r = 0; r < rows; ++r) {
    if (st[2 * r] == 0.0f) continue;  // ignored (a counted row's sum holds exp(0) of its max)
    sum += std::log(st[2 * r]) + row_max[r] - st[2 * r + 1];
  }
  loss_sum[0] += static_cast<float>(scale * sum / static_cast<double>(rows));
}

PARAPLAN_HOST_CLONES void CrossEntropyBackward(float* dlogits, const float* logits,
                                               const float* row_max, const float* st,
                                               const int32_t* targets, int64_t rows,
                                               int64_t vocab_local, int64_t vocab_begin,
                                               int64_t vocab, float grad_scale) {
  const int64_t valid = std::clamp<int64_t>(vocab - vocab_begin, 0, vocab_local);
  const float scale = grad_scale / static_cast<float>(rows);
  for (int64_t r = 0; r < rows; ++r) {
    float* d = dlogits + r * vocab_local;
    if (targets[r] < 0) {
      std::fill(d, d + vocab_local, 0.0f);
      continue;
    }
    const float* lr = logits + r * vocab_local;
    const V8 mx = simd::Splat(row_max[r]), inv = simd::Splat(1.0f / st[2 * r]);
    int64_t j = 0;
    for (; j + kLanes <= valid; j += kLanes)
      simd::Store(d + j, simd::Exp(simd::Load(lr + j) - mx) * inv);
    if (j < valid) {
      simd::StorePart(d + j, simd::Exp(simd::LoadPart(lr + j, valid - j) - mx) * inv, valid - j);
    }
    const int64_t t = static_cast<int64_t>(targets[r]) - vocab_begin;
    if (t >= 0 && t < valid) d[t] -= 1.0f;
    for (j = 0; j < valid; ++j) d[j] *= scale;
    for (j = valid; j < vocab_local; ++j) d[j] = 0.0f;
  }
}

PARAPLAN_HOST_CLONES double SumOfSquares(const float* x, int64_t n) {
  // 8 lanes in double (two 4-lane halves), summed in a fixed order at the end.
  simd::D4 lo{}, hi{};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    const V8 v = simd::Load(x + i);
    lo += simd::Low(v) * simd::Low(v);
    hi += simd::High(v) * simd::High(v);
  }
  if (i < n) {
    const V8 v = simd::LoadPart(x + i, n - i);
    lo += simd::Low(v) * simd::Low(v);
    hi += simd::High(v) * simd::High(v);
  }
  return simd::Sum(lo + hi);
}

PARAPLAN_HOST_CLONES void AdamW(float* param, const float* grad, float* m, float* v, int64_t n,
                                const AdamWConfig& c, int64_t step, float grad_scale) {
  const float bc1 = 1.0f - static_cast<float>(std::pow(static_cast<double>(c.beta1), step));
  const float bc2 = 1.0f - static_cast<float>(std::pow(static_cast<double>(c.beta2), step));
  const float beta1 = c.beta1, beta2 = c.beta2, one_minus_beta1 = 1.0f - c.beta1,
              one_minus_beta2 = 1.0f - c.beta2, lr = c.lr, eps = c.eps, wd = c.weight_decay;
  for (int64_t i = 0; i < n; ++i) {
    const float g = grad[i] * grad_scale;
    const float mi = beta1 * m[i] + one_minus_beta1 * g;
    const float vi = beta2 * v[i] + one_minus_beta2 * g * g;
    m[i] = mi;
    v[i] = vi;
    const float mhat = mi / bc1, vhat = vi / bc2;
    param[i] -= lr * (mhat / (std::sqrt(vhat) + eps) + wd * param[i]);
  }
}

PARAPLAN_HOST_CLONES void Sgd(float* param, const float* grad, int64_t n, float lr,
                              float weight_decay, float grad_scale) {
  for (int64_t i = 0; i < n; ++i) param[i] -= lr * (grad[i] * grad_scale + weight_decay * param[i]);
}

double WarmupCosineLr(int64_t step, int64_t warmup, int64_t total_steps, double max_lr,
                      double min_lr) {
  if (step < warmup) return max_lr * static_cast<double>(step + 1) / static_cast<double>(warmup);
  const double p = static_cast<double>(step - warmup) /
                   static_cast<double>(std::max<int64_t>(1, total_steps - warmup));
  return min_lr + 0.5 * (max_lr - min_lr) * (1.0 + std::cos(M_PI * std::min(p, 1.0)));
}

// NOLINTEND(bugprone-easily-swappable-parameters)

}  // namespace paraplan::host
