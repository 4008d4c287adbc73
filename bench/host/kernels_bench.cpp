// Host kernel throughput: GEMM in the three shapes a linear layer uses (forward, dgrad, wgrad)
// and attention forward + backward, single thread. Prints GFLOP/s.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <vector>

#include "runtime/kernels/host/kernels.h"

using namespace paraplan::host;

namespace {

double Seconds(const std::function<void()>& fn, int reps) {
  fn();  // warm-up
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < reps; ++i) fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps;
}

}  // namespace

int main() {
  struct Shape { int64_t rows, in, out; };
  for (Shape s : {Shape{512, 256, 768}, Shape{512, 384, 1024}, Shape{1024, 512, 512}}) {
    std::vector<float> x(s.rows * s.in, 0.5f), w(s.out * s.in, 0.25f), y(s.rows * s.out), dx(s.rows * s.in),
        dw(s.out * s.in);
    const double flops = 2.0 * s.rows * s.in * s.out;
    const double f = Seconds([&] { LinearForward(y.data(), x.data(), w.data(), nullptr, s.rows, s.in, s.out); }, 5);
    const double d = Seconds([&] { LinearBackward(dx.data(), nullptr, nullptr, y.data(), x.data(), w.data(), s.rows, s.in, s.out, false); }, 5);
    const double g = Seconds([&] { LinearBackward(nullptr, dw.data(), nullptr, y.data(), x.data(), w.data(), s.rows, s.in, s.out, false); }, 5);
    std::printf("linear rows %4lld in %4lld out %4lld: forward %6.1f GFLOP/s, dgrad %6.1f, wgrad %6.1f\n",
                static_cast<long long>(s.rows), static_cast<long long>(s.in), static_cast<long long>(s.out),
                flops / f * 1e-9, flops / d * 1e-9, flops / g * 1e-9);
  }
  const int64_t seq = 128, batch = 4, heads = 4, hd = 64, rows = seq * batch;
  std::vector<float> q(rows * heads * hd, 0.1f), k(q), v(q), o(q), dq(q), dk(q), dv(q), lse(batch * heads * seq);
  auto layout = TokenLayout::BatchMajor(seq, batch);
  const double flops = 4.0 * batch * heads * seq * seq / 2 * hd;
  const double af = Seconds([&] { AttentionForward(o.data(), lse.data(), q.data(), k.data(), v.data(), layout, heads, heads, hd, 0.125f); }, 3);
  const double ab = Seconds([&] { AttentionBackward(dq.data(), dk.data(), dv.data(), o.data(), o.data(), lse.data(), q.data(), k.data(), v.data(), layout, heads, heads, hd, 0.125f); }, 3);
  std::printf("attention seq %lld batch %lld heads %lld hd %lld: forward %.1f GFLOP/s (%.2f ms), backward %.2f ms\n",
              static_cast<long long>(seq), static_cast<long long>(batch), static_cast<long long>(heads),
              static_cast<long long>(hd), flops / af * 1e-9, af * 1e3, ab * 1e3);
  return 0;
}
