#include "compiler/analyze/format_util.h"

#include <fmt/format.h>

#include <cmath>

namespace paraplan {

std::string GroupDigits(int64_t value) {
  std::string digits = std::to_string(value);
  size_t start = (value < 0) ? 1 : 0;
  std::string out = start ? "-" : "";
  size_t n = digits.size() - start;
  for (size_t i = 0; i < n; ++i) {
    if (i > 0 && (n - i) % 3 == 0) out += ',';
    out += digits[start + i];
  }
  return out;
}

std::string BandwidthText(double bps) {
  if (!(bps > 0)) return "unknown bandwidth";
  const char* units[] = {"B/s", "kB/s", "MB/s", "GB/s", "TB/s"};
  int u = 0;
  while (bps >= 1000 && u < 4) {
    bps /= 1000;
    ++u;
  }
  if (std::fabs(bps - std::round(bps)) < 0.05) return fmt::format("{:.0f} {}", bps, units[u]);
  return fmt::format("{:.1f} {}", bps, units[u]);
}

std::string RatioText(double ratio) {
  if (ratio >= 10 || std::fabs(ratio - std::round(ratio)) < 0.05)
    return fmt::format("{:.0f}x", ratio);
  return fmt::format("{:.1f}x", ratio);
}

}  // namespace paraplan
