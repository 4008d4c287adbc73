// Vocab-parallel cross-entropy phases, squared norms, AdamW, SGD and the learning-rate schedule.
#include <algorithm>
#include <cmath>

#include "runtime/kernels/host/kernels.h"

namespace paraplan::host {

void CrossEntropyRowMax(float* row_max, const float* logits, int64_t rows, int64_t vocab_local) {
  for (int64_t r = 0; r < rows; ++r) {
    float m = -INFINITY;
    for (int64_t j = 0; j < vocab_local; ++j) m = std::max(m, logits[r * vocab_local + j]);
    row_max[r] = m;
  }
}

void CrossEntropySumExp(float* st, const float* logits, const float* row_max,
                        const int32_t* targets, int64_t rows, int64_t vocab_local,
                        int64_t vocab_begin, int64_t vocab) {
  const int64_t valid = std::clamp<int64_t>(vocab - vocab_begin, 0, vocab_local);
  for (int64_t r = 0; r < rows; ++r) {
    const float* lr = logits + r * vocab_local;
    float s = 0;
    for (int64_t j = 0; j < valid; ++j) s += std::exp(lr[j] - row_max[r]);
    st[2 * r] = s;
    const int64_t t = static_cast<int64_t>(targets[r]) - vocab_begin;
    st[2 * r + 1] = (t >= 0 && t < valid) ? lr[t] : 0.0f;
  }
}

void CrossEntropyLoss(float* loss_sum, const float* row_max, const float* st, int64_t rows,
                      float scale) {
  double sum = 0;
  for (int64_t r = 0; r < rows; ++r) sum += std::log(st[2 * r]) + row_max[r] - st[2 * r + 1];
  loss_sum[0] += static_cast<float>(scale * sum / static_cast<double>(rows));
}

void CrossEntropyBackward(float* dlogits, const float* logits, const float* row_max,
                          const float* st, const int32_t* targets, int64_t rows,
                          int64_t vocab_local, int64_t vocab_begin, int64_t vocab,
                          float grad_scale) {
  const int64_t valid = std::clamp<int64_t>(vocab - vocab_begin, 0, vocab_local);
  const float scale = grad_scale / static_cast<float>(rows);
  for (int64_t r = 0; r < rows; ++r) {
    const float inv = 1.0f / st[2 * r];
    const int64_t t = static_cast<int64_t>(targets[r]) - vocab_begin;
    float* d = dlogits + r * vocab_local;
    for (int64_t j = 0; j < valid; ++j) {
      float p = std::exp(logits[r * vocab_local + j] - row_max[r]) * inv;
      if (j == t) p -= 1.0f;
      d[j] = p * scale;
    }
    for (int64_t j = valid; j < vocab_local; ++j) d[j] = 0.0f;
  }
}

double SumOfSquares(const float* x, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(x[i]) * x[i];
  return s;
}

void AdamW(float* param, const float* grad, float* m, float* v, int64_t n,
           const AdamWConfig& c, int64_t step, float grad_scale) {
  const float bc1 = 1.0f - static_cast<float>(std::pow(static_cast<double>(c.beta1), step));
  const float bc2 = 1.0f - static_cast<float>(std::pow(static_cast<double>(c.beta2), step));
  for (int64_t i = 0; i < n; ++i) {
    const float g = grad[i] * grad_scale;
    m[i] = c.beta1 * m[i] + (1.0f - c.beta1) * g;
    v[i] = c.beta2 * v[i] + (1.0f - c.beta2) * g * g;
    const float mhat = m[i] / bc1, vhat = v[i] / bc2;
    param[i] -= c.lr * (mhat / (std::sqrt(vhat) + c.eps) + c.weight_decay * param[i]);
  }
}

void Sgd(float* param, const float* grad, int64_t n, float lr, float weight_decay,
         float grad_scale) {
  for (int64_t i = 0; i < n; ++i) param[i] -= lr * (grad[i] * grad_scale + weight_decay * param[i]);
}

double WarmupCosineLr(int64_t step, int64_t warmup, int64_t total_steps, double max_lr,
                      double min_lr) {
  if (step < warmup) return max_lr * static_cast<double>(step + 1) / static_cast<double>(warmup);
  const double p = static_cast<double>(step - warmup) /
                   static_cast<double>(std::max<int64_t>(1, total_steps - warmup));
  return min_lr + 0.5 * (max_lr - min_lr) * (1.0 + std::cos(M_PI * std::min(p, 1.0)));
}

}  // namespace paraplan::host
