// Checked 64-bit integer arithmetic for sizes, counts and bytes.
//
// Every size in a plan (layers, ranks, bytes) is an int64_t, and every operation on sizes goes
// through these helpers so that an overflow is reported instead of wrapping. They return
// std::nullopt on overflow (or division by zero); callers turn that into a diagnostic.
#ifndef PARAPLAN_COMPILER_BASE_CHECKED_H_
#define PARAPLAN_COMPILER_BASE_CHECKED_H_

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <vector>

namespace paraplan {

inline std::optional<int64_t> CheckedAdd(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_add_overflow(a, b, &r)) return std::nullopt;
  return r;
}

inline std::optional<int64_t> CheckedSub(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_sub_overflow(a, b, &r)) return std::nullopt;
  return r;
}

inline std::optional<int64_t> CheckedMul(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
  return r;
}

// Truncating division as in C++; nullopt for b == 0 and for INT64_MIN / -1.
inline std::optional<int64_t> CheckedDiv(int64_t a, int64_t b) {
  if (b == 0 || (a == INT64_MIN && b == -1)) return std::nullopt;
  return a / b;
}

inline std::optional<int64_t> CheckedMod(int64_t a, int64_t b) {
  if (b == 0 || (a == INT64_MIN && b == -1)) return std::nullopt;
  return a % b;
}

// Product of all factors, nullopt on overflow.
inline std::optional<int64_t> CheckedProduct(std::initializer_list<int64_t> factors) {
  int64_t r = 1;
  for (int64_t f : factors) {
    auto next = CheckedMul(r, f);
    if (!next) return std::nullopt;
    r = *next;
  }
  return r;
}

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
