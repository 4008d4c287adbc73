#include "compiler/base/checked.h"

#include <algorithm>
#include <cstdlib>

namespace paraplan {

std::vector<int64_t> Divisors(int64_t n) {
  std::vector<int64_t> low, high;
  if (n <= 0) return low;
  for (int64_t d = 1; d <= n / d; ++d) {
    if (n % d != 0) continue;
    low.push_back(d);
    if (d != n / d) high.push_back(n / d);
  }
  low.insert(low.end(), high.rbegin(), high.rend());
  return low;
}

std::vector<int64_t> NearestDivisors(int64_t n, int64_t near) {
  std::vector<int64_t> all = Divisors(n);
  std::vector<int64_t> out;
  auto it = std::lower_bound(all.begin(), all.end(), near);
  if (it != all.begin()) out.push_back(*(it - 1));
  if (it != all.end()) {
    if (*it == near) {
      if (it + 1 != all.end()) out.push_back(*(it + 1));
    } else {
      out.push_back(*it);
    }
  }
  return out;
}

std::optional<int64_t> RoundUpToMultiple(int64_t n, int64_t m) {
  if (m <= 0) return std::nullopt;
  int64_t rem = n % m;
  if (rem == 0) return n;
  return CheckedAdd(n, m - rem);
}

int64_t Gcd(int64_t a, int64_t b) {
  a = std::llabs(a);
  b = std::llabs(b);
  while (b != 0) {
    int64_t t = a % b;
    a = b;
    b = t;
  }
  return a;
}

std::optional<int64_t> Lcm(int64_t a, int64_t b) {
  if (a == 0 || b == 0) return 0;
  return CheckedMul(a / Gcd(a, b), b);
}

}  // namespace paraplan
