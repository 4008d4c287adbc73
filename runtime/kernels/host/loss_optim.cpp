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

void CrossEntropySumExp(float* sum_exp, float* target_logit, const float* logits,
                        const float* row_max, const int32_t* targets, int64_t rows,
                        int64_t vocab_local, int64_t vocab_begin) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* lr = logits + r * vocab_local;
    float s = 0;
    for (int64_t j = 0; j < vocab_local; ++j) s += std::exp(lr[j] - row_max[r]);
    sum_exp[r] = s;
    const int64_t t = static_cast<int64_t>(targets[r]) - vocab_begin;
    target_logit[r] = (t >= 0 && t < vocab_local) ? lr[t] : 0.0f;
  }
}

void CrossEntropyLoss(float* loss, const float* row_max, const float* sum_exp,
                      const float* target_logit, int64_t rows) {
  for (int64_t r = 0; r < rows; ++r) loss[r] = std::log(sum_exp[r]) + row_max[r] - target_logit[r];
}

void CrossEntropyBackward(float* dlogits, const float* logits, const float* row_max,
                          const float* sum_exp, const int32_t* targets, int64_t rows,
                          int64_t vocab_local, int64_t vocab_begin, float scale) {
  for (int64_t r = 0; r < rows; ++r) {
    const float inv = 1.0f / sum_exp[r];
    const int64_t t = static_cast<int64_t>(targets[r]) - vocab_begin;
    for (int64_t j = 0; j < vocab_local; ++j) {
      float p = std::exp(logits[r * vocab_local + j] - row_max[r]) * inv;
      if (j == t) p -= 1.0f;
      dlogits[r * vocab_local + j] = p * scale;
    }
  }
}

float SumOfSquares(const float* x, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(x[i]) * x[i];
  return static_cast<float>(s);
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

float WarmupCosineLr(int64_t step, int64_t warmup, int64_t total_steps, float max_lr,
                     float min_lr) {
  if (warmup > 0 && step <= warmup) return max_lr * static_cast<float>(step) / static_cast<float>(warmup);
  if (total_steps <= warmup) return max_lr;
  const double progress = std::clamp(static_cast<double>(step - warmup) /
                                         static_cast<double>(total_steps - warmup), 0.0, 1.0);
  return static_cast<float>(min_lr + 0.5 * (max_lr - min_lr) * (1.0 + std::cos(M_PI * progress)));
}

}  // namespace paraplan::host
