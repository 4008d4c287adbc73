#include "compiler/base/checked.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <vector>

namespace paraplan {

TEST_CASE("checked arithmetic reports overflow") {
  CHECK(CheckedAdd(INT64_MAX, 1) == std::nullopt);
  CHECK(CheckedMul(int64_t{1} << 62, 2) == std::nullopt);
  CHECK(CheckedMul(3, 4) == 12);
  CHECK(CheckedDiv(7, 0) == std::nullopt);
  CHECK(CheckedDiv(INT64_MIN, -1) == std::nullopt);
  CHECK(CheckedProduct({4, 32, 4}) == 512);
}

TEST_CASE("divisors") {
  CHECK(Divisors(12) == std::vector<int64_t>{1, 2, 3, 4, 6, 12});
  CHECK(Divisors(1) == std::vector<int64_t>{1});
  CHECK(NearestDivisors(128, 48) == std::vector<int64_t>{32, 64});
  CHECK(NearestDivisors(128, 32) == std::vector<int64_t>{16, 64});
  CHECK(RoundUpToMultiple(50257, 128) == 50304);
  CHECK(Lcm(4, 6) == 12);
}

TEST_CASE("Divisors agrees with a square-root scan and is fast near 2^63") {
  const auto scan = [](int64_t n) {
    std::vector<int64_t> low, high;
    for (int64_t d = 1; d <= n / d; ++d) {
      if (n % d != 0) continue;
      low.push_back(d);
      if (d != n / d) high.push_back(n / d);
    }
    low.insert(low.end(), high.rbegin(), high.rend());
    return low;
  };
  int mismatches = 0;
  for (int64_t n = 1; n <= 20000; ++n) mismatches += Divisors(n) != scan(n);
  CHECK(mismatches == 0);
  // Squares of primes, products of two large primes, a Carmichael number.
  for (int64_t n : {int64_t{1000003} * 1000003, int64_t{999983} * 1000003, int64_t{561},
                    int64_t{4294967291} * 3, int64_t{65537} * 65537 * 2}) {
    CHECK(Divisors(n) == scan(n));
  }
  // 2^62 + 1 = 5 · 5581 · 8681 · 49477 · 384773 (32 divisors); 2^61 - 1 is prime; INT64_MAX =
  // 7^2 · 73 · 127 · 337 · 92737 · 649657 (96 divisors). A scan would take 2^31 divisions each.
  CHECK(Divisors((int64_t{1} << 62) + 1).size() == 32);
  CHECK(Divisors((int64_t{1} << 61) - 1) == std::vector<int64_t>{1, (int64_t{1} << 61) - 1});
  const std::vector<int64_t> top = Divisors(INT64_MAX);
  CHECK(top.size() == 96);
  CHECK(std::is_sorted(top.begin(), top.end()));
  for (int64_t d : top) CHECK(INT64_MAX % d == 0);
  CHECK(Divisors(int64_t{1} << 62).size() == 63);
}

}  // namespace paraplan
