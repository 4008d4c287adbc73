// Checked 64-bit integer arithmetic for sizes, counts and bytes, shared by the compiler and the
// runtime (header-only, no dependencies).
//
// Every size read from a file (a program's shapes and offsets, a data index, a checkpoint) and
// every size in a plan is an int64_t; a product or sum of them goes through these helpers so
// that an overflow is refused instead of wrapping. They return std::nullopt on overflow (or
// division by zero); callers turn that into a diagnostic or an error naming the file.
#ifndef PARAPLAN_RUNTIME_FORMAT_CHECKED_SIZE_H_
#define PARAPLAN_RUNTIME_FORMAT_CHECKED_SIZE_H_

#include <cstdint>
#include <initializer_list>
#include <optional>

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

// Sum of all terms, nullopt on overflow.
inline std::optional<int64_t> CheckedSum(std::initializer_list<int64_t> terms) {
  int64_t r = 0;
  for (int64_t t : terms) {
    auto next = CheckedAdd(r, t);
    if (!next) return std::nullopt;
    r = *next;
  }
  return r;
}

}  // namespace paraplan

#endif  // PARAPLAN_RUNTIME_FORMAT_CHECKED_SIZE_H_
