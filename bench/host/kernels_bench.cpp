// Host kernel throughput, single thread: GEMM in the three shapes a linear layer uses (forward,
// dgrad, wgrad) at the example model's shapes (examples/tiny_llama.plan: 128 tokens per
// microbatch, hidden 256, FFN 768, vocabulary padded to 512; one rank and a TP 2 shard) and at
// larger ones, attention forward + backward, and the memory-bound kernels (GB/s of the bytes
// they must read and write).
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <vector>

#include "runtime/backends/host/kernels/kernels.h"

using namespace paraplan::host;

namespace {

// Seconds per call: the best of 5 rounds of `reps` calls (a shared machine's other jobs only
// ever slow a round down).
double Seconds(const std::function<void()>& fn, int reps) {
  fn();  // warm-up
  double best = 1e30;
  for (int round = 0; round < 5; ++round) {
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < reps; ++i) fn();
    best = std::min(
        best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps);
  }
  return best;
}

void Linear(const char* what, int64_t rows, int64_t in, int64_t out) {
  std::vector<float> x(rows * in, 0.5f), w(out * in, 0.25f), y(rows * out), dx(rows * in),
      dw(out * in);
  const double flops = 2.0 * rows * in * out;
  const int reps = static_cast<int>(std::max(1.0, 2e8 / flops));
  const double f =
      Seconds([&] { LinearForward(y.data(), x.data(), w.data(), nullptr, rows, in, out); }, reps);
  const double d = Seconds(
      [&] {
        LinearBackward(dx.data(), nullptr, nullptr, y.data(), x.data(), w.data(), rows, in, out,
                       false);
      },
      reps);
  const double g = Seconds(
      [&] {
        LinearBackward(nullptr, dw.data(), nullptr, y.data(), x.data(), w.data(), rows, in, out,
                       false);
      },
      reps);
  std::printf(
      "%-22s rows %4lld in %4lld out %4lld: forward %6.1f GFLOP/s, dgrad %6.1f, wgrad %6.1f\n",
      what, static_cast<long long>(rows), static_cast<long long>(in), static_cast<long long>(out),
      flops / f * 1e-9, flops / d * 1e-9, flops / g * 1e-9);
}

void Attention(const char* what, int64_t seq, int64_t batch, int64_t heads, int64_t kv_heads,
               int64_t hd) {
  const int64_t rows = seq * batch;
  std::vector<float> q(rows * heads * hd, 0.1f), k(rows * kv_heads * hd, 0.1f), v(k), o(q), dq(q),
      dk(k), dv(k), lse(batch * heads * seq);
  auto layout = TokenLayout::BatchMajor(seq, batch);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  // Causal: half the score matrix counts; forward 2 GEMMs, backward 4 (5 with the recomputed
  // scores).
  const double flops = 2.0 * 2.0 * batch * heads * seq * seq / 2 * hd;
  const double af = Seconds(
      [&] {
        AttentionForward(o.data(), lse.data(), q.data(), k.data(), v.data(), layout, heads,
                         kv_heads, hd, scale);
      },
      5);
  const double ab = Seconds(
      [&] {
        AttentionBackward(dq.data(), dk.data(), dv.data(), o.data(), o.data(), lse.data(), q.data(),
                          k.data(), v.data(), layout, heads, kv_heads, hd, scale);
      },
      5);
  std::printf(
      "%-22s seq %lld batch %lld heads %lld/%lld hd %lld: forward %.3f ms (%.1f GFLOP/s), backward "
      "%.3f ms (%.1f GFLOP/s)\n",
      what, static_cast<long long>(seq), static_cast<long long>(batch),
      static_cast<long long>(heads), static_cast<long long>(kv_heads), static_cast<long long>(hd),
      af * 1e3, flops / af * 1e-9, ab * 1e3, 2.5 * flops / ab * 1e-9);
}

void Memory(const char* what, double bytes, const std::function<void()>& fn) {
  const double s = Seconds(fn, 20);
  std::printf("%-22s %8.1f us  %6.1f GB/s\n", what, s * 1e6, bytes / s * 1e-9);
}

}  // namespace

int main() {
  std::printf("GEMM on %s\n", GemmLibrary());
  // The example model (tiny_llama.plan): 128 tokens per microbatch.
  Linear("example qkv", 128, 256, 512);
  Linear("example attn out", 128, 256, 256);
  Linear("example ffn up+gate", 128, 256, 1536);
  Linear("example ffn down", 128, 768, 256);
  Linear("example lm head", 128, 256, 512);
  Linear("example TP2 ffn up", 128, 256, 768);
  Linear("example TP2 ffn down", 128, 384, 256);
  Linear("larger", 512, 256, 768);
  Linear("larger", 1024, 512, 512);
  Attention("example attention", 64, 2, 8, 4, 32);
  Attention("larger attention", 128, 4, 4, 4, 64);

  // Memory-bound kernels at the example's sizes (per microbatch of 128 tokens; AdamW over the
  // 786,944 parameters of one layer).
  const int64_t rows = 128, dim = 256, ffn = 768, vocab = 512, params = 786944;
  std::vector<float> a(rows * ffn, 0.3f), b(rows * ffn, -0.2f), c(rows * ffn), d(rows * ffn),
      e(rows * ffn);
  std::vector<float> w(dim, 1.0f), rstd(rows), logits(rows * vocab, 0.1f), dl(rows * vocab),
      mx(rows), st(2 * rows);
  std::vector<int32_t> targets(rows, 7);
  std::vector<float> p(params, 0.1f), g(params, 0.01f), m(params), v(params);
  const double f = sizeof(float);
  Memory("swiglu forward", 3.0 * rows * ffn * f,
         [&] { SwiGluForward(c.data(), a.data(), b.data(), rows * ffn); });
  Memory("swiglu backward", 5.0 * rows * ffn * f,
         [&] { SwiGluBackward(d.data(), e.data(), c.data(), a.data(), b.data(), rows * ffn); });
  Memory("rmsnorm forward", 2.0 * rows * dim * f,
         [&] { RmsNormForward(c.data(), rstd.data(), a.data(), w.data(), rows, dim, 1e-5f); });
  Memory("rmsnorm backward", 3.0 * rows * dim * f, [&] {
    RmsNormBackward(d.data(), nullptr, b.data(), a.data(), w.data(), rstd.data(), rows, dim);
  });
  Memory("cross-entropy (3 phases)", 3.0 * rows * vocab * f, [&] {
    CrossEntropyRowMax(mx.data(), logits.data(), rows, vocab);
    CrossEntropySumExp(st.data(), logits.data(), mx.data(), targets.data(), rows, vocab, 0, 259);
    CrossEntropyBackward(dl.data(), logits.data(), mx.data(), st.data(), targets.data(), rows,
                         vocab, 0, 259, 1.0f);
  });
  AdamWConfig config;
  Memory("adamw (one layer)", 7.0 * params * f,
         [&] { AdamW(p.data(), g.data(), m.data(), v.data(), params, config, 3, 1.0f); });
  return 0;
}
