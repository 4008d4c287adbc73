// The spread of relative errors (predicted / measured - 1) that the calibration reports: the
// median and 90th percentile of their magnitudes, and how many are within 25%.
#ifndef PARAPLAN_BENCH_CALIBRATION_ERROR_STATS_H_
#define PARAPLAN_BENCH_CALIBRATION_ERROR_STATS_H_

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

namespace paraplan::calibration {

struct Stats {
  size_t n = 0;
  double median = 0, p90 = 0, within25 = 0;
};

inline Stats Summarize(std::vector<double> errors) {
  Stats s;
  for (double& e : errors) e = std::fabs(e);
  std::sort(errors.begin(), errors.end());
  s.n = errors.size();
  if (s.n == 0) return s;
  s.median = s.n % 2 ? errors[s.n / 2] : (errors[s.n / 2 - 1] + errors[s.n / 2]) / 2;
  s.p90 =
      errors[std::min(s.n - 1, static_cast<size_t>(std::ceil(0.9 * static_cast<double>(s.n))) - 1)];
  for (double e : errors) s.within25 += e <= 0.25 ? 1 : 0;
  return s;
}

}  // namespace paraplan::calibration

#endif  // PARAPLAN_BENCH_CALIBRATION_ERROR_STATS_H_
