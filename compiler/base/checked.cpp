#include "compiler/base/checked.h"

#include <algorithm>
#include <cstdlib>
#include <numeric>

namespace paraplan {

namespace {

using u64 = uint64_t;
using u128 = unsigned __int128;

u64 MulMod(u64 a, u64 b, u64 m) { return static_cast<u64>(static_cast<u128>(a) * b % m); }

u64 PowMod(u64 base, u64 exp, u64 m) {
  u64 result = 1;
  base %= m;
  for (; exp > 0; exp >>= 1) {
    if (exp & 1) result = MulMod(result, base, m);
    base = MulMod(base, base, m);
  }
  return result;
}

// Miller-Rabin with the first twelve primes as bases: exact for every n below 3.3 · 10^24.
bool IsPrime(u64 n) {
  if (n < 2) return false;
  static constexpr u64 kBases[] = {2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37};
  for (u64 p : kBases) {
    if (n % p == 0) return n == p;
  }
  u64 d = n - 1;
  int r = 0;
  while ((d & 1) == 0) {
    d >>= 1;
    ++r;
  }
  for (u64 a : kBases) {
    u64 x = PowMod(a, d, n);
    if (x == 1 || x == n - 1) continue;
    bool composite = true;
    for (int i = 1; i < r && composite; ++i) {
      x = MulMod(x, x, n);
      composite = x != n - 1;
    }
    if (composite) return false;
  }
  return true;
}

// A non-trivial factor of the odd composite n (Pollard's rho with Brent's cycle finding).
u64 FindFactor(u64 n) {
  for (u64 c = 1;; ++c) {
    u64 y = 2, x = 2, g = 1, q = 1, ys = 2;
    const auto step = [&](u64 v) { return (MulMod(v, v, n) + c) % n; };
    for (u64 len = 1; g == 1; len <<= 1) {
      x = y;
      for (u64 i = 0; i < len; ++i) y = step(y);
      for (u64 k = 0; k < len && g == 1; k += 128) {
        ys = y;
        for (u64 i = 0; i < std::min<u64>(128, len - k); ++i) {
          y = step(y);
          q = MulMod(q, x > y ? x - y : y - x, n);
        }
        g = std::gcd(q, n);
      }
    }
    if (g == n) {  // the batch overshot: step one at a time from its start
      do {
        ys = step(ys);
        g = std::gcd(x > ys ? x - ys : ys - x, n);
      } while (g == 1);
    }
    if (g != n) return g;
  }
}

void PrimeFactors(u64 n, std::vector<u64>& out) {
  if (n == 1) return;
  if (IsPrime(n)) {
    out.push_back(n);
    return;
  }
  const u64 f = FindFactor(n);
  PrimeFactors(f, out);
  PrimeFactors(n / f, out);
}

}  // namespace

// From the prime factorisation (trial division by small primes, then Pollard's rho), so that
// a size near 2^63 costs microseconds instead of the 2^31 trial divisions of a square-root scan.
std::vector<int64_t> Divisors(int64_t n) {
  std::vector<int64_t> out;
  if (n <= 0) return out;
  std::vector<u64> primes;
  u64 rest = static_cast<u64>(n);
  for (u64 p = 2; p < 1000 && p * p <= rest; p += p == 2 ? 1 : 2) {
    while (rest % p == 0) {
      primes.push_back(p);
      rest /= p;
    }
  }
  PrimeFactors(rest, primes);
  std::sort(primes.begin(), primes.end());
  out.push_back(1);
  for (size_t i = 0; i < primes.size();) {
    size_t j = i;
    while (j < primes.size() && primes[j] == primes[i]) ++j;
    const size_t before = out.size();
    u64 power = 1;
    for (size_t e = i; e < j; ++e) {
      power *= primes[i];
      for (size_t k = 0; k < before; ++k)
        out.push_back(static_cast<int64_t>(static_cast<u64>(out[k]) * power));
    }
    i = j;
  }
  std::sort(out.begin(), out.end());
  return out;
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
