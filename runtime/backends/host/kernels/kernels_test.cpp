// Every backward kernel against central finite differences of its forward (a scalar loss
// L = Σ out · w with fixed random w), plus GEMM against a naive product, sharding identities,
// and the optimizer against hand-computed values.
#include "runtime/backends/host/kernels/kernels.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "runtime/backends/host/kernels/gradient_check.h"

using namespace paraplan::host;
using paraplan::host::testing::CheckGradient;
using paraplan::host::testing::Dot;
using paraplan::host::testing::Random;

TEST_CASE("gemm matches a naive product for every transpose and beta, any shape") {
  for (auto [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{1, 1, 1},
                         {5, 37, 3},
                         {9, 70, 33},
                         {33, 300, 17},
                         {4, 32, 8}}) {
    for (int ta = 0; ta < 2; ++ta) {
      for (int tb = 0; tb < 2; ++tb) {
        auto a = Random(m * k, 1), b = Random(k * n, 2), c = Random(m * n, 3);
        for (float beta : {0.0f, 1.0f}) {
          auto out = c;
          Gemm(ta, tb, m, n, k, a.data(), b.data(), beta, out.data());
          double worst = 0;
          for (int64_t i = 0; i < m; ++i) {
            for (int64_t j = 0; j < n; ++j) {
              double s = beta * c[i * n + j];
              for (int64_t kk = 0; kk < k; ++kk) {
                double av = ta ? a[kk * m + i] : a[i * k + kk];
                double bv = tb ? b[j * k + kk] : b[kk * n + j];
                s += av * bv;
              }
              worst = std::max(worst, std::abs(s - out[i * n + j]));
            }
          }
          CHECK(worst < 1e-4);
        }
      }
    }
  }
}

TEST_CASE("the BLAS runs a kernel for this CPU's vector width, not an older fallback") {
  const std::string library = GemmLibrary();
  MESSAGE("GEMM on " << library);
  if (library.rfind("OpenBLAS", 0) != 0) return;  // a build without OpenBLAS: nothing to choose
#if defined(__x86_64__) && defined(__GNUC__)
  __builtin_cpu_init();
  const char* user_core = std::getenv("OPENBLAS_CORETYPE");
  const bool chosen_here = user_core == nullptr || std::string(user_core) == "SkylakeX" ||
                           std::string(user_core) == "Haswell" || std::string(user_core) == "Zen";
  if (chosen_here && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    // Debian 12's OpenBLAS falls back to Prescott (SSE3) on CPU models newer than its table.
    for (const char* old : {"Prescott", "Core2", "Penryn", "Dunnington", "Nehalem", "Atom",
                            "Sandybridge", "Barcelona", "Bulldozer"}) {
      CHECK(library.find(old) == std::string::npos);
    }
  }
  // The AVX-512 kernel unless the user chose another one (OpenBLAS honours OPENBLAS_CORETYPE).
  const bool ours = user_core == nullptr || std::string(user_core) == "SkylakeX";
  if (ours && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl")) {
    CHECK(library.find("SkylakeX") != std::string::npos);
  }
  if (user_core != nullptr && chosen_here) CHECK(library.find(user_core) != std::string::npos);
#endif
}

TEST_CASE("column-sharded linear reproduces the full one within rounding; repeats are bitwise") {
  // A BLAS blocks each GEMM by its shape, so a column shard may round differently from the whole
  // product in the last bits (not more than a few units in the last place of the sum's terms);
  // the same call repeated gives the same bits.
  const int64_t rows = 7, in = 19, out = 70;
  auto x = Random(rows * in, 4), w = Random(out * in, 5);
  std::vector<float> full(rows * out), again(rows * out);
  LinearForward(full.data(), x.data(), w.data(), nullptr, rows, in, out);
  LinearForward(again.data(), x.data(), w.data(), nullptr, rows, in, out);
  CHECK(again == full);
  for (int64_t begin : {0, 35}) {
    std::vector<float> part(rows * 35);
    LinearForward(part.data(), x.data(), w.data() + begin * in, nullptr, rows, in, 35);
    double worst = 0;
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t o = 0; o < 35; ++o) {
        double magnitude = 0;  // Σ |x·w|: what the rounding error scales with
        for (int64_t i = 0; i < in; ++i)
          magnitude += std::abs(static_cast<double>(x[r * in + i]) * w[(begin + o) * in + i]);
        worst = std::max(worst, std::abs(part[r * 35 + o] - full[r * out + begin + o]) / magnitude);
      }
    }
    CHECK(worst < 1e-6);
  }
}

TEST_CASE("gemm with beta 0 ignores NaNs in C; concurrent callers get the serial bits") {
  const int64_t m = 64, n = 96, k = 48;
  auto a = Random(m * k, 12), b = Random(k * n, 13);
  std::vector<float> c(m * n, std::nanf(""));
  Gemm(false, false, m, n, k, a.data(), b.data(), 0.0f, c.data());
  for (float v : c) REQUIRE(std::isfinite(v));
  std::vector<std::vector<float>> outs(8, std::vector<float>(m * n));
  std::vector<std::thread> threads;
  for (auto& out : outs) {
    threads.emplace_back([&] {
      for (int rep = 0; rep < 20; ++rep)
        Gemm(false, false, m, n, k, a.data(), b.data(), 0.0f, out.data());
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& out : outs) CHECK(out == c);
}

TEST_CASE("linear backward: dx, dw, dbias") {
  const int64_t rows = 5, in = 6, out = 4;
  auto x = Random(rows * in, 6), w = Random(out * in, 7), b = Random(out, 8),
       proj = Random(rows * out, 9);
  auto loss = [&] {
    std::vector<float> y(rows * out);
    LinearForward(y.data(), x.data(), w.data(), b.data(), rows, in, out);
    return Dot(y, proj);
  };
  std::vector<float> dx(rows * in), dw(out * in, 0.0f), db(out, 0.0f);
  LinearBackward(dx.data(), dw.data(), db.data(), proj.data(), x.data(), w.data(), rows, in, out,
                 false);
  CheckGradient("dx", x, dx, loss);
  CheckGradient("dw", w, dw, loss);
  CheckGradient("dbias", b, db, loss);
  // accumulate_dx adds.
  auto dx2 = dx;
  LinearBackward(dx2.data(), nullptr, nullptr, proj.data(), x.data(), w.data(), rows, in, out,
                 true);
  for (size_t i = 0; i < dx.size(); ++i) CHECK(dx2[i] == doctest::Approx(2 * dx[i]));
}

TEST_CASE("vocab-parallel embedding and learned positions") {
  const int64_t vocab = 10, dim = 3, rows = 6;
  std::vector<int32_t> tokens = {1, 9, 4, 1, 5, 0};
  auto table = Random(vocab * dim, 10), proj = Random(rows * dim, 11);
  // Two slices of 5 sum to the full lookup.
  std::vector<float> full(rows * dim), a(rows * dim), b(rows * dim);
  EmbeddingForward(full.data(), tokens.data(), table.data(), rows, dim, 0, vocab);
  EmbeddingForward(a.data(), tokens.data(), table.data(), rows, dim, 0, 5);
  EmbeddingForward(b.data(), tokens.data(), table.data() + 5 * dim, rows, dim, 5, 5);
  for (int64_t i = 0; i < rows * dim; ++i) CHECK(a[i] + b[i] == full[i]);
  auto loss = [&] {
    std::vector<float> y(rows * dim);
    EmbeddingForward(y.data(), tokens.data(), table.data(), rows, dim, 0, vocab);
    return Dot(y, proj);
  };
  std::vector<float> dtable(vocab * dim, 0.0f);
  EmbeddingBackward(dtable.data(), proj.data(), tokens.data(), rows, dim, 0, vocab);
  CheckGradient("dtable", table, dtable, loss);

  // Positions of 6 rows starting at global row 5 with seq 4: 1, 2, 3, 0, 1, 2.
  auto wpe = Random(4 * dim, 12);
  auto base = Random(rows * dim, 27);
  auto ploss = [&] {
    std::vector<float> y(rows * dim);
    AddPosition(y.data(), base.data(), wpe.data(), rows, dim, 5, 4);
    return Dot(y, proj);
  };
  std::vector<float> y(rows * dim);
  AddPosition(y.data(), base.data(), wpe.data(), rows, dim, 5, 4);
  CHECK(y[3 * dim] == base[3 * dim] + wpe[0]);
  std::vector<float> dwpe(4 * dim, 0.0f);
  AddPositionBackward(dwpe.data(), proj.data(), rows, dim, 5, 4);
  CheckGradient("dwpe", wpe, dwpe, ploss);
}

TEST_CASE("rmsnorm and layernorm backward") {
  const int64_t rows = 4, dim = 8;
  auto x = Random(rows * dim, 13), w = Random(dim, 14), b = Random(dim, 15),
       proj = Random(rows * dim, 16);
  std::vector<float> rstd(rows), mean(rows);
  auto rms_loss = [&] {
    std::vector<float> y(rows * dim);
    RmsNormForward(y.data(), rstd.data(), x.data(), w.data(), rows, dim, 1e-5f);
    return Dot(y, proj);
  };
  rms_loss();
  std::vector<float> dx(rows * dim), dw(dim, 0.0f);
  RmsNormBackward(dx.data(), dw.data(), proj.data(), x.data(), w.data(), rstd.data(), rows, dim);
  CheckGradient("rmsnorm dx", x, dx, rms_loss);
  CheckGradient("rmsnorm dw", w, dw, rms_loss);

  auto ln_loss = [&] {
    std::vector<float> y(rows * dim);
    LayerNormForward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), rows, dim,
                     1e-5f);
    return Dot(y, proj);
  };
  ln_loss();
  std::vector<float> ldx(rows * dim), ldw(dim, 0.0f), ldb(dim, 0.0f);
  LayerNormBackward(ldx.data(), ldw.data(), ldb.data(), proj.data(), x.data(), w.data(),
                    mean.data(), rstd.data(), rows, dim);
  CheckGradient("layernorm dx", x, ldx, ln_loss);
  CheckGradient("layernorm dw", w, ldw, ln_loss);
  CheckGradient("layernorm db", b, ldb, ln_loss);
}

TEST_CASE("rope backward, and rope keeps norms") {
  const int64_t heads = 2, hd = 8;
  auto layout = TokenLayout::BatchMajor(5, 2);
  layout.seq_offset = 3;
  const int64_t n = 10 * heads * hd;
  auto x = Random(n, 17), proj = Random(n, 18);
  auto loss = [&] {
    auto y = x;
    RopeForward(y.data(), layout, heads, hd, 10000.0f);
    return Dot(y, proj);
  };
  auto dx = proj;
  RopeBackward(dx.data(), layout, heads, hd, 10000.0f);
  CheckGradient("rope dx", x, dx, loss);
  auto y = x;
  RopeForward(y.data(), layout, heads, hd, 10000.0f);
  CHECK(Dot(y, y) == doctest::Approx(Dot(x, x)).epsilon(1e-5));
}

TEST_CASE("attention on 16-lane (AVX-512) paths agrees with the 8-lane ones; repeats are bitwise") {
  if (simd::VectorWidth() != 16) {
    MESSAGE("no AVX-512 on this CPU: only the 8-lane tiles run here");
    return;
  }
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  // Head sizes with and without 16- and 8-column leftovers; sequences off multiples of 16.
  for (const auto& shape : {std::array<int64_t, 2>{64, 32}, std::array<int64_t, 2>{37, 64},
                            std::array<int64_t, 2>{23, 24}, std::array<int64_t, 2>{50, 40}}) {
    const int64_t seq = shape[0], hd = shape[1];  // not bindings: the lambda captures them
    const int64_t batch = 2, qh = 4, kh = 2;
    const TokenLayout layout = TokenLayout::SeqMajor(seq, batch);
    std::vector<float> q(seq * batch * qh * hd), k(seq * batch * kh * hd), v(k.size()), g(q.size());
    for (auto* t : {&q, &k, &v, &g})
      for (float& x : *t) x = dist(rng);
    struct Result {
      std::vector<float> out, lse, dq, dk, dv;
    };
    auto run = [&](int lanes) {
      simd::SetVectorWidth(lanes);
      Result r{std::vector<float>(q.size()), std::vector<float>(batch * qh * seq),
               std::vector<float>(q.size()), std::vector<float>(k.size()),
               std::vector<float>(v.size())};
      AttentionForward(r.out.data(), r.lse.data(), q.data(), k.data(), v.data(), layout, qh, kh, hd,
                       0.125f);
      AttentionBackward(r.dq.data(), r.dk.data(), r.dv.data(), g.data(), r.out.data(), r.lse.data(),
                        q.data(), k.data(), v.data(), layout, qh, kh, hd, 0.125f);
      return r;
    };
    const Result narrow = run(8), wide = run(16), again = run(16);
    CHECK(simd::VectorWidth() == 16);
    // The 16-lane paths fuse multiplies and adds: equal to rounding, and bitwise run to run.
    auto close = [](const std::vector<float>& a, const std::vector<float>& b) {
      double worst = 0;
      for (size_t i = 0; i < a.size(); ++i)
        worst = std::max(worst, std::abs(double(a[i]) - b[i]) / (1e-3 + std::abs(double(a[i]))));
      return worst;
    };
    CHECK(close(narrow.out, wide.out) < 1e-4);
    CHECK(close(narrow.lse, wide.lse) < 1e-5);
    CHECK(close(narrow.dq, wide.dq) < 1e-3);
    CHECK(close(narrow.dk, wide.dk) < 1e-3);
    CHECK(close(narrow.dv, wide.dv) < 1e-3);
    CHECK(wide.out == again.out);
    CHECK(wide.dq == again.dq);
    CHECK(wide.dk == again.dk);
    CHECK(wide.dv == again.dv);
  }
}

TEST_CASE("causal GQA attention backward, both token layouts") {
  const int64_t seq = 5, batch = 2, qh = 4, kvh = 2, hd = 4, rows = seq * batch;
  for (bool seq_major : {true, false}) {
    auto layout =
        seq_major ? TokenLayout::SeqMajor(seq, batch) : TokenLayout::BatchMajor(seq, batch);
    auto q = Random(rows * qh * hd, 19), k = Random(rows * kvh * hd, 20),
         v = Random(rows * kvh * hd, 21);
    auto proj = Random(rows * qh * hd, 22);
    std::vector<float> out(rows * qh * hd), lse(batch * qh * seq);
    auto loss = [&] {
      AttentionForward(out.data(), lse.data(), q.data(), k.data(), v.data(), layout, qh, kvh, hd,
                       0.5f);
      return Dot(out, proj);
    };
    loss();
    std::vector<float> dq(q.size()), dk(k.size()), dv(v.size());
    AttentionBackward(dq.data(), dk.data(), dv.data(), proj.data(), out.data(), lse.data(),
                      q.data(), k.data(), v.data(), layout, qh, kvh, hd, 0.5f);
    CheckGradient("dq", q, dq, loss);
    CheckGradient("dk", k, dk, loss);
    CheckGradient("dv", v, dv, loss);
    // Causality: the first token's output is its own value.
    const int64_t r0 = layout.Row(0, 1);
    for (int64_t d = 0; d < hd; ++d)
      CHECK(out[(r0 * qh + 3) * hd + d] == v[(r0 * kvh + 1) * hd + d]);
  }
}

// Sliding-window attention against a plain masked softmax in double: windows of 1 (each query
// sees only itself), shorter and longer than the 4-row blocks and 8-key lanes, and at least the
// sequence (the causal result, bit for bit); backward by finite differences.
TEST_CASE("sliding-window attention: masked reference, gradients, and the window limits") {
  const int64_t seq = 37, batch = 2, qh = 4, kvh = 2, hd = 12, rows = seq * batch;
  const float scale = 0.3f;
  const auto layout = TokenLayout::BatchMajor(seq, batch);
  const auto q = Random(rows * qh * hd, 40), k = Random(rows * kvh * hd, 41),
             v = Random(rows * kvh * hd, 42);
  auto run = [&](int64_t window) {
    std::vector<float> out(q.size()), lse(batch * qh * seq);
    AttentionForward(out.data(), lse.data(), q.data(), k.data(), v.data(), layout, qh, kvh, hd,
                     scale, window);
    return std::make_pair(out, lse);
  };
  for (int64_t window : {1, 2, 5, 8, 13, 36}) {
    CAPTURE(window);
    const auto [out, lse] = run(window);
    double worst = 0, worst_lse = 0;
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t h = 0; h < qh; ++h)
        for (int64_t i = 0; i < seq; ++i) {
          const int64_t g = h / (qh / kvh), row = layout.Row(i, b);
          std::vector<double> p;
          double mx = -1e300, sum = 0;
          for (int64_t j = std::max<int64_t>(0, i - window + 1); j <= i; ++j) {
            double dot = 0;
            for (int64_t d = 0; d < hd; ++d)
              dot += double(q[(row * qh + h) * hd + d]) * k[(layout.Row(j, b) * kvh + g) * hd + d];
            p.push_back(dot * scale);
            mx = std::max(mx, p.back());
          }
          for (double& x : p) sum += (x = std::exp(x - mx));
          worst_lse =
              std::max(worst_lse, std::abs(mx + std::log(sum) - lse[(b * qh + h) * seq + i]));
          for (int64_t d = 0; d < hd; ++d) {
            double o = 0;
            const int64_t j0 = std::max<int64_t>(0, i - window + 1);
            for (int64_t j = j0; j <= i; ++j)
              o += p[j - j0] / sum * v[(layout.Row(j, b) * kvh + g) * hd + d];
            worst = std::max(worst, std::abs(o - out[(row * qh + h) * hd + d]));
          }
        }
    CHECK(worst < 1e-5);
    CHECK(worst_lse < 1e-5);
  }
  // Window 1: each query's output is its own value.
  const auto [own, own_lse] = run(1);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t d = 0; d < hd; ++d) CHECK(own[(i * qh + 3) * hd + d] == v[(i * kvh + 1) * hd + d]);
  // A window covering the sequence is plain causal attention, bit for bit.
  CHECK(run(seq).first == run(0).first);
  CHECK(run(seq + 100).second == run(0).second);

  // Backward on a short sequence by finite differences, both layouts.
  const int64_t s2 = 11, r2 = s2 * batch;
  for (bool seq_major : {true, false}) {
    const auto l2 =
        seq_major ? TokenLayout::SeqMajor(s2, batch) : TokenLayout::BatchMajor(s2, batch);
    auto q2 = Random(r2 * qh * 4, 43), k2 = Random(r2 * kvh * 4, 44), v2 = Random(r2 * kvh * 4, 45);
    const auto proj = Random(r2 * qh * 4, 46);
    std::vector<float> out(q2.size()), lse(batch * qh * s2);
    auto loss = [&] {
      AttentionForward(out.data(), lse.data(), q2.data(), k2.data(), v2.data(), l2, qh, kvh, 4,
                       0.5f, 3);
      return Dot(out, proj);
    };
    loss();
    std::vector<float> dq(q2.size()), dk(k2.size()), dv(v2.size());
    AttentionBackward(dq.data(), dk.data(), dv.data(), proj.data(), out.data(), lse.data(),
                      q2.data(), k2.data(), v2.data(), l2, qh, kvh, 4, 0.5f, 3);
    CheckGradient("window dq", q2, dq, loss);
    CheckGradient("window dk", k2, dk, loss);
    CheckGradient("window dv", v2, dv, loss);
  }
}

TEST_CASE("swiglu and gelu backward") {
  const int64_t n = 12;
  auto g = Random(n, 23), u = Random(n, 24), proj = Random(n, 25);
  auto loss = [&] {
    std::vector<float> y(n);
    SwiGluForward(y.data(), g.data(), u.data(), n);
    return Dot(y, proj);
  };
  std::vector<float> dg(n), du(n);
  SwiGluBackward(dg.data(), du.data(), proj.data(), g.data(), u.data(), n);
  CheckGradient("swiglu dgate", g, dg, loss);
  CheckGradient("swiglu dup", u, du, loss);
  auto gloss = [&] {
    std::vector<float> y(n);
    GeluForward(y.data(), g.data(), n);
    return Dot(y, proj);
  };
  std::vector<float> dx(n);
  GeluBackward(dx.data(), proj.data(), g.data(), n);
  CheckGradient("gelu dx", g, dx, gloss);
  // Squared ReLU: away from the kink at 0 (a finite difference across it is not a derivative).
  for (float& x : g)
    if (std::abs(x) < 0.05f) x = x < 0 ? -0.05f : 0.05f;
  auto rloss = [&] {
    std::vector<float> y(n);
    SquaredReluForward(y.data(), g.data(), n);
    return Dot(y, proj);
  };
  SquaredReluBackward(dx.data(), proj.data(), g.data(), n);
  CheckGradient("squared relu dx", g, dx, rloss);
  std::vector<float> y(n);
  SquaredReluForward(y.data(), g.data(), n);
  for (int64_t i = 0; i < n; ++i) {
    CAPTURE(i);
    CHECK(y[i] == (g[i] > 0 ? g[i] * g[i] : 0.0f));
    if (g[i] < 0) CHECK(dx[i] == 0.0f);
  }
}

TEST_CASE(
    "cross-entropy: loss, gradient, padding, and vocab-parallel phases equal the full softmax") {
  const int64_t rows = 3, vocab_padded = 8, vocab = 7;  // column 7 is padding
  std::vector<int32_t> targets = {2, 6, 4};
  auto logits = Random(rows * vocab_padded, 26, 2.0f);
  std::vector<float> mx(rows), st(2 * rows);
  auto loss = [&] {
    CrossEntropyRowMax(mx.data(), logits.data(), rows, vocab_padded);
    CrossEntropySumExp(st.data(), logits.data(), mx.data(), targets.data(), rows, vocab_padded, 0,
                       vocab);
    float sum = 0.0f;
    CrossEntropyLoss(&sum, mx.data(), st.data(), rows, 0.5f);
    return static_cast<double>(sum);
  };
  const double full = loss();
  double ref = 0;  // 0.5 * mean log-softmax loss in double over the unpadded columns
  for (int64_t r = 0; r < rows; ++r) {
    double z = 0;
    for (int64_t j = 0; j < vocab; ++j)
      z += std::exp(static_cast<double>(logits[r * vocab_padded + j]));
    ref += std::log(z) - logits[r * vocab_padded + targets[r]];
  }
  CHECK(full == doctest::Approx(0.5 * ref / rows).epsilon(1e-6));
  std::vector<float> dl(rows * vocab_padded);
  CrossEntropyBackward(dl.data(), logits.data(), mx.data(), st.data(), targets.data(), rows,
                       vocab_padded, 0, vocab, 0.5f);
  for (int64_t r = 0; r < rows; ++r) CHECK(dl[r * vocab_padded + 7] == 0.0f);
  CheckGradient("dlogits", logits, dl, loss);

  // Two vocab shards, combined as the TP all-reduces would (max, then sums).
  loss();
  const int64_t half = vocab_padded / 2;
  std::vector<float> sl[2], smx[2], sst[2];
  for (int s = 0; s < 2; ++s) {
    sl[s].resize(rows * half);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < half; ++j)
        sl[s][r * half + j] = logits[r * vocab_padded + s * half + j];
    smx[s].resize(rows);
    CrossEntropyRowMax(smx[s].data(), sl[s].data(), rows, half);
  }
  std::vector<float> gmx(rows), gst(2 * rows, 0.0f);
  for (int64_t r = 0; r < rows; ++r) gmx[r] = std::max(smx[0][r], smx[1][r]);
  for (int s = 0; s < 2; ++s) {
    sst[s].resize(2 * rows);
    CrossEntropySumExp(sst[s].data(), sl[s].data(), gmx.data(), targets.data(), rows, half,
                       s * half, vocab);
    for (int64_t i = 0; i < 2 * rows; ++i) gst[i] += sst[s][i];
  }
  float sharded = 0.0f;
  CrossEntropyLoss(&sharded, gmx.data(), gst.data(), rows, 0.5f);
  CHECK(sharded == doctest::Approx(full).epsilon(1e-6));
}

TEST_CASE("cross-entropy: ignored rows count nowhere, on every vocab shard") {
  const int64_t rows = 4, vocab = 8;
  const std::vector<int32_t> targets = {3, -1, 5, -1};  // rows 1 and 3 ignored
  auto logits = Random(rows * vocab, 41, 2.0f);
  std::vector<float> mx(rows), st(2 * rows);
  auto loss = [&](const std::vector<int32_t>& t, int64_t n) {
    CrossEntropyRowMax(mx.data(), logits.data(), n, vocab);
    CrossEntropySumExp(st.data(), logits.data(), mx.data(), t.data(), n, vocab, 0, vocab);
    float sum = 0.0f;
    CrossEntropyLoss(&sum, mx.data(), st.data(), n, 1.0f);
    return static_cast<double>(sum);
  };
  const double with_ignored = loss(targets, rows);
  CHECK(st[2] == 0.0f);
  CHECK(st[3] == 0.0f);
  // The two counted rows' sum over all four rows.
  double ref = 0;
  for (int64_t r : {0, 2}) {
    double z = 0;
    for (int64_t j = 0; j < vocab; ++j) z += std::exp(static_cast<double>(logits[r * vocab + j]));
    ref += std::log(z) - logits[r * vocab + targets[r]];
  }
  CHECK(with_ignored == doctest::Approx(ref / rows).epsilon(1e-6));
  std::vector<float> dl(rows * vocab, 7.0f);
  CrossEntropyBackward(dl.data(), logits.data(), mx.data(), st.data(), targets.data(), rows, vocab,
                       0, vocab, 1.0f);
  for (int64_t j = 0; j < vocab; ++j) {
    CHECK(dl[1 * vocab + j] == 0.0f);
    CHECK(dl[3 * vocab + j] == 0.0f);
  }
  CheckGradient("dlogits", logits, dl, [&] { return loss(targets, rows); });
  // Every row ignored: no loss, no gradient.
  const std::vector<int32_t> none = {-1, -1, -1, -1};
  CHECK(loss(none, rows) == 0.0);
  CrossEntropyBackward(dl.data(), logits.data(), mx.data(), st.data(), none.data(), rows, vocab, 0,
                       vocab, 1.0f);
  for (float d : dl) CHECK(d == 0.0f);
}

TEST_CASE("adamw, sgd, squared norm and the warmup-cosine schedule") {
  float p = 1.0f, g = 0.5f, m = 0.0f, v = 0.0f;
  AdamWConfig c{0.1f, 0.9f, 0.99f, 1e-8f, 0.01f};
  AdamW(&p, &g, &m, &v, 1, c, 1, 2.0f);  // effective grad 1.0
  // Step 1: mhat = 1, vhat = 1 -> update = 1 + wd * p.
  CHECK(m == doctest::Approx(0.1f));
  CHECK(v == doctest::Approx(0.01f));
  CHECK(p == doctest::Approx(1.0f - 0.1f * (1.0f / (1.0f + 1e-8f) + 0.01f)));
  float q = 2.0f, gq = 1.0f;
  Sgd(&q, &gq, 1, 0.5f, 0.1f, 1.0f);
  CHECK(q == doctest::Approx(2.0f - 0.5f * (1.0f + 0.2f)));
  std::vector<float> x = {3.0f, 4.0f};
  CHECK(SumOfSquares(x.data(), 2) == 25.0f);
  // step counts from 0: warmup lr·(step+1)/warmup, then cosine over steps - warmup.
  CHECK(WarmupCosineLr(0, 10, 110, 1.0, 0.1) == doctest::Approx(0.1));
  CHECK(WarmupCosineLr(9, 10, 110, 1.0, 0.1) == doctest::Approx(1.0));
  CHECK(WarmupCosineLr(10, 10, 110, 1.0, 0.1) == doctest::Approx(1.0));
  CHECK(WarmupCosineLr(60, 10, 110, 1.0, 0.1) == doctest::Approx(0.55));
  CHECK(WarmupCosineLr(110, 10, 110, 1.0, 0.1) == doctest::Approx(0.1));
  CHECK(WarmupCosineLr(500, 10, 110, 1.0, 0.1) == doctest::Approx(0.1));
  CHECK(WarmupCosineLr(3, 0, 3, 1.0, 0.0) == doctest::Approx(0.0));
}

TEST_CASE("vectorised activations match the scalar formulas and do not depend on the split") {
  // 8-lane kernels with a padded tail: any element gives the same bits whether it sits in a
  // whole vector or in the tail, so a shard computes what the whole call does.
  const int64_t n = 43;
  auto x = Random(n, 20, 3.0f), up = Random(n, 21), g = Random(n, 22);
  x[0] = -100.0f, x[1] = 100.0f, x[2] = 0.0f;  // exp underflow, overflow, exact
  std::vector<float> whole(n), split(n), dgate(n), dup(n), dgate2(n), dup2(n);
  SwiGluForward(whole.data(), x.data(), up.data(), n);
  SwiGluForward(split.data(), x.data(), up.data(), 5);
  SwiGluForward(split.data() + 5, x.data() + 5, up.data() + 5, n - 5);
  CHECK(whole == split);
  SwiGluBackward(dgate.data(), dup.data(), g.data(), x.data(), up.data(), n);
  SwiGluBackward(dgate2.data(), dup2.data(), g.data(), x.data(), up.data(), 11);
  SwiGluBackward(dgate2.data() + 11, dup2.data() + 11, g.data() + 11, x.data() + 11, up.data() + 11,
                 n - 11);
  CHECK(dgate == dgate2);
  CHECK(dup == dup2);
  for (int64_t i = 0; i < n; ++i) {
    const double s = x[i] / (1.0 + std::exp(-static_cast<double>(x[i]))) * up[i];
    CHECK(std::abs(whole[i] - s) <= 1e-6 * std::max(1.0, std::abs(s)));
  }
  GeluForward(whole.data(), x.data(), n);
  GeluForward(split.data(), x.data(), 13);
  GeluForward(split.data() + 13, x.data() + 13, n - 13);
  CHECK(whole == split);
  for (int64_t i = 0; i < n; ++i) {
    const double v = x[i];
    const double ref = 0.5 * v * (1.0 + std::tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)));
    CHECK(std::abs(whole[i] - ref) <= 1e-6 * std::max(1.0, std::abs(ref)));
  }
}

TEST_CASE("cross-entropy phases stay exact at the exp range's ends") {
  // Logits far below the row's max underflow to zero probability; the loss stays finite.
  const int64_t rows = 2, vocab = 21;
  std::vector<float> logits(rows * vocab, -200.0f);
  logits[3] = 5.0f, logits[vocab + 20] = 50.0f;
  std::vector<int32_t> targets = {3, 7};
  std::vector<float> mx(rows), st(2 * rows), d(rows * vocab);
  CrossEntropyRowMax(mx.data(), logits.data(), rows, vocab);
  CHECK(mx[0] == 5.0f);
  CHECK(mx[1] == 50.0f);
  CrossEntropySumExp(st.data(), logits.data(), mx.data(), targets.data(), rows, vocab, 0, vocab);
  CHECK(st[0] == 1.0f);
  CHECK(st[2] == 1.0f);
  float loss = 0;
  CrossEntropyLoss(&loss, mx.data(), st.data(), rows, 1.0f);
  CHECK(loss == doctest::Approx((0.0 + 250.0) / 2));
  CrossEntropyBackward(d.data(), logits.data(), mx.data(), st.data(), targets.data(), rows, vocab,
                       0, vocab, 1.0f);
  CHECK(d[3] == 0.0f);
  CHECK(d[vocab + 20] == 0.5f);
  CHECK(d[vocab + 7] == -0.5f);
}

TEST_CASE(
    "attention with vector tails: gradients, and a KV group's heads alone give the same bits") {
  // seq 13 and head size 20 leave partial 4-row blocks, 8-key blocks and 16-column tiles.
  const int64_t seq = 13, batch = 2, qh = 4, kvh = 2, hd = 20, rows = seq * batch;
  auto layout = TokenLayout::SeqMajor(seq, batch);
  auto q = Random(rows * qh * hd, 30), k = Random(rows * kvh * hd, 31),
       v = Random(rows * kvh * hd, 32);
  auto proj = Random(rows * qh * hd, 33);
  std::vector<float> out(rows * qh * hd), lse(batch * qh * seq);
  auto loss = [&] {
    AttentionForward(out.data(), lse.data(), q.data(), k.data(), v.data(), layout, qh, kvh, hd,
                     0.3f);
    return Dot(out, proj);
  };
  loss();
  std::vector<float> dq(q.size()), dk(k.size()), dv(v.size());
  AttentionBackward(dq.data(), dk.data(), dv.data(), proj.data(), out.data(), lse.data(), q.data(),
                    k.data(), v.data(), layout, qh, kvh, hd, 0.3f);
  CheckGradient("dq", q, dq, loss);
  CheckGradient("dk", k, dk, loss);
  CheckGradient("dv", v, dv, loss);
  loss();  // CheckGradient left `out` at a perturbed input
  // The second KV group (query heads 2, 3) as a tensor-parallel shard holds it.
  auto slice = [&](const std::vector<float>& x, int64_t heads, int64_t first, int64_t count) {
    std::vector<float> s(rows * count * hd);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t h = 0; h < count; ++h)
        for (int64_t d = 0; d < hd; ++d)
          s[(r * count + h) * hd + d] = x[(r * heads + first + h) * hd + d];
    return s;
  };
  auto q1 = slice(q, qh, 2, 2), k1 = slice(k, kvh, 1, 1), v1 = slice(v, kvh, 1, 1),
       g1 = slice(proj, qh, 2, 2);
  std::vector<float> out1(rows * 2 * hd), lse1(batch * 2 * seq), dq1(q1.size()), dk1(k1.size()),
      dv1(v1.size());
  AttentionForward(out1.data(), lse1.data(), q1.data(), k1.data(), v1.data(), layout, 2, 1, hd,
                   0.3f);
  AttentionBackward(dq1.data(), dk1.data(), dv1.data(), g1.data(), out1.data(), lse1.data(),
                    q1.data(), k1.data(), v1.data(), layout, 2, 1, hd, 0.3f);
  AttentionBackward(dq.data(), dk.data(), dv.data(), proj.data(), out.data(), lse.data(), q.data(),
                    k.data(), v.data(), layout, qh, kvh, hd, 0.3f);
  CHECK(out1 == slice(out, qh, 2, 2));
  CHECK(dq1 == slice(dq, qh, 2, 2));
  CHECK(dk1 == slice(dk, kvh, 1, 1));
  CHECK(dv1 == slice(dv, kvh, 1, 1));
}

TEST_CASE(
    "column copies: slices, broadcast of one head, and their backward by finite differences") {
  const int64_t rows = 5, heads = 3, nope = 4, rope = 2, latent = 6;
  // A naive copy of one map, against the kernel.
  auto naive = [&](std::vector<float> y, const std::vector<float>& x, const ColumnMap& m,
                   bool accumulate) {
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t g = 0; g < m.groups; ++g)
        for (int64_t j = 0; j < m.width; ++j) {
          float& to = y[r * m.y_cols + g * m.y_stride + m.y_offset + j];
          const float from = x[r * m.x_cols + g * m.x_stride + m.x_offset + j];
          to = accumulate ? to + from : from;
        }
    return y;
  };
  // The shared rope head of the latent projection [rows, latent + rope] into every head of
  // k [rows, heads · (nope + rope)] after its nope part.
  const ColumnMap broadcast{heads,       rope, latent + rope, 0, latent, heads * (nope + rope),
                            nope + rope, nope};
  // The nope part of each head of [rows, heads · (nope + v)] (v = 3) into k.
  const ColumnMap slice{heads,       nope, heads * (nope + 3), nope + 3, 0, heads * (nope + rope),
                        nope + rope, 0};
  auto kv_a = Random(rows * (latent + rope), 40), kv = Random(rows * heads * (nope + 3), 41);
  auto k = Random(rows * heads * (nope + rope), 42);
  for (bool accumulate : {false, true}) {
    auto y = k;
    CopyColumns(y.data(), kv_a.data(), rows, broadcast, accumulate);
    CHECK(y == naive(k, kv_a, broadcast, accumulate));
    auto z = k;
    CopyColumns(z.data(), kv.data(), rows, slice, accumulate);
    CHECK(z == naive(k, kv, slice, accumulate));
  }
  // k = [slice of kv, broadcast of kv_a's rope part]; L = Σ k · w. The backward copies read
  // the transposed maps, accumulating into zeroed gradients (the broadcast sums over heads).
  auto w = Random(rows * heads * (nope + rope), 43);
  auto forward = [&] {
    std::vector<float> y(k.size(), 0.0f);
    CopyColumns(y.data(), kv.data(), rows, slice, false);
    CopyColumns(y.data(), kv_a.data(), rows, broadcast, false);
    return Dot(y, w);
  };
  std::vector<float> dkv(kv.size(), 0.0f), dkv_a(kv_a.size(), 0.0f);
  CopyColumns(dkv.data(), w.data(), rows, slice.Transposed(), true);
  CopyColumns(dkv_a.data(), w.data(), rows, broadcast.Transposed(), true);
  CheckGradient("dkv", kv, dkv, forward);
  CheckGradient("dkv_a", kv_a, dkv_a, forward);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < latent; ++j) CHECK(dkv_a[r * (latent + rope) + j] == 0.0f);

  // Decoupled RoPE: the rope part of each head of q [rows, heads · (nope + rope)] copied out,
  // rotated and copied back; its backward is the same path reversed.
  const int64_t qd = nope + rope;
  const ColumnMap rope_part{heads, rope, heads * qd, qd, nope, heads * rope, rope, 0};
  auto q = Random(rows * heads * qd, 44), wq = Random(rows * heads * qd, 45);
  const TokenLayout layout = TokenLayout::BatchMajor(rows, 1);
  auto qloss = [&] {
    std::vector<float> y = q, part(rows * heads * rope);
    CopyColumns(part.data(), y.data(), rows, rope_part, false);
    RopeForward(part.data(), layout, heads, rope, 10000.0f);
    CopyColumns(y.data(), part.data(), rows, rope_part.Transposed(), false);
    return Dot(y, wq);
  };
  std::vector<float> dq = wq, dpart(rows * heads * rope);
  CopyColumns(dpart.data(), dq.data(), rows, rope_part, false);
  RopeBackward(dpart.data(), layout, heads, rope, 10000.0f);
  CopyColumns(dq.data(), dpart.data(), rows, rope_part.Transposed(), false);
  CheckGradient("dq (decoupled rope)", q, dq, qloss);
}
