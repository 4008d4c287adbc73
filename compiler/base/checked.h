// Checked 64-bit integer arithmetic for sizes, counts and bytes.
//
// Every size in a plan (layers, ranks, bytes) is an int64_t, and every operation on sizes goes
// through these helpers so that an overflow is reported instead of wrapping. The arithmetic
// itself lives in runtime/format/checked_size.h, shared with the runtime (which must not include
// compiler headers); this adds divisors and rounding. They return std::nullopt on overflow (or
// division by zero); callers turn that into a diagnostic.
#ifndef PARAPLAN_COMPILER_BASE_CHECKED_H_
#define PARAPLAN_COMPILER_BASE_CHECKED_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "runtime/format/checked_size.h"  // CheckedAdd/Sub/Mul/Div/Mod/Product/Sum

namespace paraplan {

// All positive divisors of n (n > 0), ascending.
std::vector<int64_t> Divisors(int64_t n);

// The divisors of n closest to `near` (one below and one above when both exist), ascending.
std::vector<int64_t> NearestDivisors(int64_t n, int64_t near);

// Smallest multiple of `m` that is >= n (m > 0); nullopt on overflow.
std::optional<int64_t> RoundUpToMultiple(int64_t n, int64_t m);

int64_t Gcd(int64_t a, int64_t b);
std::optional<int64_t> Lcm(int64_t a, int64_t b);

}  // namespace paraplan

#endif  // PARAPLAN_COMPILER_BASE_CHECKED_H_
