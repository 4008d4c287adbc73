// Test helpers for the kernels' tests: seeded normal data, a float dot product, the largest
// element difference of two results, and the central finite-difference check every backward
// kernel is held to.
#ifndef PARAPLAN_RUNTIME_BACKENDS_HOST_KERNELS_GRADIENT_CHECK_H_
#define PARAPLAN_RUNTIME_BACKENDS_HOST_KERNELS_GRADIENT_CHECK_H_

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <vector>

namespace paraplan::host::testing {

// n values from N(0, scale²), the same for the same seed.
inline std::vector<float> Random(int64_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = dist(gen);
  return v;
}

inline double Dot(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}

// The largest |a[i] - b[i]|.
inline double MaxDiff(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i)
    worst = std::max(worst, std::abs(static_cast<double>(a[i]) - b[i]));
  return worst;
}

// Checks analytic[i] against (L(x + h e_i) - L(x - h e_i)) / 2h for every i.
inline void CheckGradient(const char* what, std::vector<float>& x,
                          const std::vector<float>& analytic, const std::function<double()>& loss,
                          float h = 1e-2f, double tol = 2e-3) {
  REQUIRE(x.size() == analytic.size());
  double worst = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const float saved = x[i];
    x[i] = saved + h;
    const double lp = loss();
    x[i] = saved - h;
    const double lm = loss();
    x[i] = saved;
    const double numeric = (lp - lm) / (2.0 * h);
    const double err = std::abs(numeric - analytic[i]) / std::max(1.0, std::abs(numeric));
    worst = std::max(worst, err);
  }
  INFO(what << ": worst relative error " << worst);
  CHECK(worst < tol);
}

}  // namespace paraplan::host::testing

#endif  // PARAPLAN_RUNTIME_BACKENDS_HOST_KERNELS_GRADIENT_CHECK_H_
