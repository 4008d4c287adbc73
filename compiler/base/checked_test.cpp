#include "compiler/base/checked.h"

#include <doctest/doctest.h>

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

}  // namespace paraplan
