// Small text helpers shared by the analysis diagnostics and `planc explain`: integers with
// thousands separators, byte and bandwidth quantities in the units people read.
#ifndef PARAPLAN_COMPILER_ANALYZE_FORMAT_UTIL_H_
#define PARAPLAN_COMPILER_ANALYZE_FORMAT_UTIL_H_

#include <cstdint>
#include <string>

namespace paraplan {

// 25296896 -> "25,296,896"; negative numbers keep their sign.
std::string GroupDigits(int64_t value);
// Bytes per second in decimal units as cluster data sheets write them: "450 GB/s", "50 GB/s".
std::string BandwidthText(double bytes_per_second);
// A ratio as "9x" or "1.5x".
std::string RatioText(double ratio);

}  // namespace paraplan

#endif  // PARAPLAN_COMPILER_ANALYZE_FORMAT_UTIL_H_
