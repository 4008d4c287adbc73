// Every kernel of the CUDA backend against the host backend (the specification), through the
// Backend interface, on random inputs and odd sizes. Skipped, with a message, without a GPU.
//
// Tolerances: exact where the CUDA kernel adds in the host's order (embedding, positions,
// elementwise); 1e-4 relative for fp32 reductions in another order (norms, softmax sums); bf16
// tolerance (inputs rounded to 8 significant bits, fp32 accumulation): for GEMMs the bound
// |cuda − host| ≤ (2^-8 + 1e-5)·Σ|a|·|b| per element (ExcessBf16Gemm), for linear layers and
// attention |cuda − host| ≤ 3e-2 + 2e-2·|host| (3e-2 relative for attention gradients).
//
// The same file runs on a GPU (cuda_backend_tests, built with nvcc; skipped without one) and on
// the CPU emulation (cuda_backend_emulated_tests, tests/cuda_emulation).
#include "runtime/backends/cuda/cuda_backend.h"

#include <doctest/doctest.h>

#include <array>
#include <cmath>
#include <cstdlib>
#include <random>
#include <tuple>
#include <utility>

#include "runtime/backends/host/host_backend.h"

namespace paraplan::cuda {
namespace {

using exec::Backend;
using host::TokenLayout;

bool GpuOrSkip() {
  const std::string why = CudaUnavailableReason();
  if (!why.empty()) {
    MESSAGE("skipped: " << why << " (this test needs a GPU)");
    return false;
  }
  return true;
}

std::vector<float> Random(int64_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-scale, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(gen);
  return v;
}

std::vector<float> Abs(std::vector<float> v) {
  for (auto& x : v) x = std::fabs(x);
  return v;
}

// One host and one CUDA backend fed the same inputs.
struct Pair {
  std::unique_ptr<Backend> host = exec::MakeHostBackend();
  CudaRanks cuda = MakeLocalCudaRanks(1, 0);
  Backend& Gpu() { return *cuda.backends[0]; }

  struct Buf {
    float* h;
    float* g;
    int64_t n;
  };
  Buf Upload(const std::vector<float>& v) {
    Buf b{Alloc(*host, v.size()), Alloc(Gpu(), v.size()), static_cast<int64_t>(v.size())};
    host->CopyToDevice(b.h, v.data(), v.size() * 4);
    Gpu().CopyToDevice(b.g, v.data(), v.size() * 4);
    return b;
  }
  Buf Zeros(int64_t n) { return Upload(std::vector<float>(n, 0.0f)); }
  std::pair<int32_t*, int32_t*> Tokens(const std::vector<int32_t>& t) {
    auto* h = static_cast<int32_t*>(host->Allocate(t.size() * 4));
    auto* g = static_cast<int32_t*>(Gpu().Allocate(t.size() * 4));
    host->CopyToDevice(h, t.data(), t.size() * 4);
    Gpu().CopyToDevice(g, t.data(), t.size() * 4);
    return {h, g};
  }
  // Largest violation of |g − h| ≤ atol + rtol·|h| (≤ 0 means within tolerance).
  double Excess(const Buf& b, double atol, double rtol) {
    std::vector<float> h(b.n), g(b.n);
    host->CopyToHost(h.data(), b.h, b.n * 4);
    Gpu().CopyToHost(g.data(), b.g, b.n * 4);
    double worst = -1.0;
    for (int64_t i = 0; i < b.n; ++i) {
      if (!std::isfinite(g[i])) return INFINITY;
      worst = std::max(worst, std::fabs(g[i] - h[i]) - (atol + rtol * std::fabs(h[i])));
    }
    return worst;
  }
  // Largest violation of |g − h| ≤ (2^-8 + 1e-5) · bound[i] + 1e-6, where bound holds Σ|a|·|b|
  // of a GEMM: rounding both operands to bf16 (relative error ≤ 2^-9 each) moves each product by
  // at most 2^-8 of its magnitude; fp32 sums in other orders add far less than 1e-5.
  double ExcessBf16Gemm(const Buf& b, const Buf& bound) {
    std::vector<float> h(b.n), g(b.n), k(b.n);
    host->CopyToHost(h.data(), b.h, b.n * 4);
    Gpu().CopyToHost(g.data(), b.g, b.n * 4);
    host->CopyToHost(k.data(), bound.h, b.n * 4);
    double worst = -1.0;
    for (int64_t i = 0; i < b.n; ++i) {
      if (!std::isfinite(g[i])) return INFINITY;
      worst = std::max(worst, std::fabs(g[i] - h[i]) - ((0.00390625 + 1e-5) * k[i] + 1e-6));
    }
    return worst;
  }
  static float* Alloc(Backend& be, int64_t n) {
    return static_cast<float*>(be.Allocate(std::max<int64_t>(n, 1) * 4));
  }
};

#define CHECK_CLOSE(pair, buf, atol, rtol) CHECK((pair).Excess((buf), (atol), (rtol)) <= 0.0)

TEST_CASE("cuda backend: elementwise and activations match the host") {
  if (!GpuOrSkip()) return;
  Pair p;
  const int64_t n = 1001;
  auto a = p.Upload(Random(n, 1)), b = p.Upload(Random(n, 2)), out = p.Zeros(n);
  p.host->Add(out.h, a.h, b.h, n);
  p.Gpu().Add(out.g, a.g, b.g, n);
  CHECK_CLOSE(p, out, 0, 0);
  p.host->Accumulate(out.h, a.h, n);
  p.Gpu().Accumulate(out.g, a.g, n);
  p.host->Scale(out.h, n, 0.5f);
  p.Gpu().Scale(out.g, n, 0.5f);
  CHECK_CLOSE(p, out, 0, 0);
  auto dgate = p.Zeros(n), dup = p.Zeros(n);
  p.host->SwiGluForward(out.h, a.h, b.h, n);
  p.Gpu().SwiGluForward(out.g, a.g, b.g, n);
  CHECK_CLOSE(p, out, 1e-6, 1e-5);
  p.host->SwiGluBackward(dgate.h, dup.h, out.h, a.h, b.h, n);
  p.Gpu().SwiGluBackward(dgate.g, dup.g, out.g, a.g, b.g, n);
  CHECK_CLOSE(p, dgate, 1e-6, 1e-5);
  CHECK_CLOSE(p, dup, 1e-6, 1e-5);
  p.host->GeluForward(out.h, a.h, n);
  p.Gpu().GeluForward(out.g, a.g, n);
  CHECK_CLOSE(p, out, 1e-6, 1e-5);
  p.host->GeluBackward(dgate.h, b.h, a.h, n);
  p.Gpu().GeluBackward(dgate.g, b.g, a.g, n);
  CHECK_CLOSE(p, dgate, 1e-6, 1e-5);
  p.host->SquaredReluForward(out.h, a.h, n);
  p.Gpu().SquaredReluForward(out.g, a.g, n);
  CHECK_CLOSE(p, out, 1e-6, 1e-5);
  p.host->SquaredReluBackward(dgate.h, b.h, a.h, n);
  p.Gpu().SquaredReluBackward(dgate.g, b.g, a.g, n);
  CHECK_CLOSE(p, dgate, 1e-6, 1e-5);
  // Fill and Copy are exact: they start from a buffer equal on both sides (the activation checks
  // above allow rounding differences, which the elements Fill leaves alone would carry).
  auto filled = p.Zeros(n);
  p.host->Fill(filled.h, n - 3, 0.125f);
  p.Gpu().Fill(filled.g, n - 3, 0.125f);
  CHECK_CLOSE(p, filled, 0, 0);
  p.host->Copy(filled.h + 1, a.h, n - 1);
  p.Gpu().Copy(filled.g + 1, a.g, n - 1);
  CHECK_CLOSE(p, filled, 0, 0);
}

// The elementwise kernels take four elements per thread where every pointer is 16-byte aligned
// and one otherwise: both paths give the same bits (inputs shifted by one element take the
// other path; 1001 and 1000 elements leave a tail of 1 and 0 after the fours).
TEST_CASE("cuda backend: elementwise kernels give the same bits aligned and unaligned") {
  if (!GpuOrSkip()) return;
  Pair p;
  Backend& gpu = p.Gpu();
  for (int64_t n : {int64_t{1001}, int64_t{1000}, int64_t{3}}) {
    INFO("n " << n);
    const auto va = Random(n, 90, 4.0f), vb = Random(n, 91, 4.0f), vc = Random(n, 92, 4.0f);
    // Three inputs and two outputs, at offset 0 (aligned) and 1 (not 16-byte aligned).
    auto buffers = [&](int64_t offset) {
      std::array<float*, 5> b{};
      for (float*& x : b) x = Pair::Alloc(gpu, n + 1) + offset;
      gpu.CopyToDevice(b[0], va.data(), n * 4);
      gpu.CopyToDevice(b[1], vb.data(), n * 4);
      gpu.CopyToDevice(b[2], vc.data(), n * 4);
      return b;
    };
    auto run = [&](int64_t offset) {
      const auto b = buffers(offset);
      std::vector<float> out;
      auto take = [&](const float* x) {
        std::vector<float> v(n);
        gpu.CopyToHost(v.data(), x, n * 4);
        out.insert(out.end(), v.begin(), v.end());
      };
      gpu.Add(b[3], b[0], b[1], n);
      take(b[3]);
      gpu.Accumulate(b[3], b[2], n);
      take(b[3]);
      gpu.Scale(b[3], n, 0.3f);
      take(b[3]);
      gpu.SwiGluForward(b[3], b[0], b[1], n);
      take(b[3]);
      gpu.SwiGluBackward(b[3], b[4], b[2], b[0], b[1], n);
      take(b[3]);
      take(b[4]);
      gpu.GeluForward(b[3], b[0], n);
      take(b[3]);
      gpu.GeluBackward(b[3], b[2], b[0], n);
      take(b[3]);
      gpu.Fill(b[4], n, -1.5f);
      take(b[4]);
      return out;
    };
    CHECK(run(0) == run(1));
  }
}

TEST_CASE("cuda backend: column copies (slices, one head broadcast, sums over heads) are exact") {
  if (!GpuOrSkip()) return;
  Pair p;
  const int64_t rows = 37, heads = 5, nope = 16, rope = 8, latent = 24;
  const host::ColumnMap broadcast{
      heads, rope, latent + rope, 0, latent, heads * (nope + rope), nope + rope, nope};
  const host::ColumnMap slice{
      heads, nope, heads * (nope + 16), nope + 16, 0, heads * (nope + rope), nope + rope, 0};
  auto kv_a = p.Upload(Random(rows * (latent + rope), 60));
  auto kv = p.Upload(Random(rows * heads * (nope + 16), 61));
  auto k = p.Upload(Random(rows * heads * (nope + rope), 62));
  for (bool accumulate : {false, true}) {
    p.host->CopyColumns(k.h, kv.h, rows, slice, accumulate);
    p.Gpu().CopyColumns(k.g, kv.g, rows, slice, accumulate);
    p.host->CopyColumns(k.h, kv_a.h, rows, broadcast, accumulate);
    p.Gpu().CopyColumns(k.g, kv_a.g, rows, broadcast, accumulate);
    CHECK_CLOSE(p, k, 0, 0);
  }
  // The broadcast's backward sums the heads into the shared one, in the host's order.
  p.host->CopyColumns(kv_a.h, k.h, rows, broadcast.Transposed(), true);
  p.Gpu().CopyColumns(kv_a.g, k.g, rows, broadcast.Transposed(), true);
  CHECK_CLOSE(p, kv_a, 0, 0);
  p.host->CopyColumns(kv.h, k.h, rows, slice.Transposed(), false);
  p.Gpu().CopyColumns(kv.g, k.g, rows, slice.Transposed(), false);
  CHECK_CLOSE(p, kv, 0, 0);
}

TEST_CASE("cuda backend: bf16 GEMMs and linear layers within bf16 tolerance") {
  if (!GpuOrSkip()) return;
  Pair p;
  const int64_t m = 67, n = 45, k = 96;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      const auto va = Random(m * k, 3), vb = Random(k * n, 4);
      auto a = p.Upload(va), b = p.Upload(vb), c = p.Upload(Random(m * n, 5));
      auto abs_a = p.Upload(Abs(va)), abs_b = p.Upload(Abs(vb)), bound = p.Zeros(m * n);
      for (float beta : {0.0f, 1.0f}) {
        INFO("trans_a " << ta << " trans_b " << tb << " beta " << beta);
        p.host->Gemm(ta, tb, m, n, k, a.h, b.h, beta, c.h);
        p.Gpu().Gemm(ta, tb, m, n, k, a.g, b.g, beta, c.g);
        p.host->Gemm(ta, tb, m, n, k, abs_a.h, abs_b.h, beta, bound.h);
        CHECK(p.ExcessBf16Gemm(c, bound) <= 0.0);
      }
    }
  }
  const int64_t rows = 33, in = 64, out = 48;
  auto x = p.Upload(Random(rows * in, 6)), w = p.Upload(Random(out * in, 7));
  auto bias = p.Upload(Random(out, 8)), y = p.Zeros(rows * out),
       dy = p.Upload(Random(rows * out, 9));
  auto dx = p.Zeros(rows * in), dw = p.Zeros(out * in), db = p.Zeros(out);
  p.host->LinearForward(y.h, x.h, w.h, bias.h, rows, in, out);
  p.Gpu().LinearForward(y.g, x.g, w.g, bias.g, rows, in, out);
  CHECK_CLOSE(p, y, 3e-2, 2e-2);
  p.host->LinearBackward(dx.h, dw.h, db.h, dy.h, x.h, w.h, rows, in, out, false);
  p.Gpu().LinearBackward(dx.g, dw.g, db.g, dy.g, x.g, w.g, rows, in, out, false);
  CHECK_CLOSE(p, dx, 3e-2, 2e-2);
  CHECK_CLOSE(p, dw, 3e-2, 2e-2);
  CHECK_CLOSE(p, db, 1e-5, 1e-5);
}

// LinearBackward casts dy to bf16 once for dx and dw; PARAPLAN_CUDA_GEMM_CAST=1 casts it per
// product. The same bits reach cuBLASLt either way, so the results are identical.
TEST_CASE("cuda backend: a linear backward's shared dy cast equals one cast per product") {
  if (!GpuOrSkip()) return;
  const int64_t rows = 41, in = 72, out = 24;  // x larger than w: the shared scratch holds both
  const auto vx = Random(rows * in, 70), vw = Random(out * in, 71), vdy = Random(rows * out, 72),
             vdw = Random(out * in, 73), vdx = Random(rows * in, 74);
  auto run = [&](const char* cast_each, bool accumulate_dx) {
    if (cast_each != nullptr)
      setenv("PARAPLAN_CUDA_GEMM_CAST", cast_each, 1);
    else
      unsetenv("PARAPLAN_CUDA_GEMM_CAST");
    CudaRanks ranks = MakeLocalCudaRanks(1, 0);
    unsetenv("PARAPLAN_CUDA_GEMM_CAST");
    Backend& be = *ranks.backends[0];
    auto upload = [&](const std::vector<float>& v) {
      float* d = Pair::Alloc(be, static_cast<int64_t>(v.size()));
      be.CopyToDevice(d, v.data(), static_cast<int64_t>(v.size()) * 4);
      return d;
    };
    float *x = upload(vx), *w = upload(vw), *dy = upload(vdy), *dw = upload(vdw), *dx = upload(vdx);
    be.LinearBackward(dx, dw, nullptr, dy, x, w, rows, in, out, accumulate_dx);
    std::vector<float> result(rows * in + out * in);
    be.CopyToHost(result.data(), dx, rows * in * 4);
    be.CopyToHost(result.data() + rows * in, dw, out * in * 4);
    return result;
  };
  for (bool accumulate_dx : {false, true}) {
    INFO("accumulate_dx " << accumulate_dx);
    const auto shared = run(nullptr, accumulate_dx), each = run("1", accumulate_dx);
    CHECK(run("0", accumulate_dx) == shared);
    CHECK(shared == each);
  }
  setenv("PARAPLAN_CUDA_GEMM_CAST", "2", 1);
  CHECK_THROWS_WITH_AS(MakeLocalCudaRanks(1, 0), doctest::Contains("PARAPLAN_CUDA_GEMM_CAST"),
                       std::runtime_error);
  unsetenv("PARAPLAN_CUDA_GEMM_CAST");
}

TEST_CASE("cuda backend: embeddings and learned positions add in the host's order") {
  if (!GpuOrSkip()) return;
  Pair p;
  const int64_t rows = 300, dim = 40, vocab_begin = 10, vocab_count = 20;
  std::vector<int32_t> tokens(rows);
  for (int64_t r = 0; r < rows; ++r) tokens[r] = static_cast<int32_t>((r * 7919) % 37);  // repeats
  auto [th, tg] = p.Tokens(tokens);
  auto table = p.Upload(Random(vocab_count * dim, 10)), out = p.Zeros(rows * dim);
  p.host->EmbeddingForward(out.h, th, table.h, rows, dim, vocab_begin, vocab_count);
  p.Gpu().EmbeddingForward(out.g, tg, table.g, rows, dim, vocab_begin, vocab_count);
  CHECK_CLOSE(p, out, 0, 0);
  auto dout = p.Upload(Random(rows * dim, 11)), dtable = p.Upload(Random(vocab_count * dim, 12));
  p.host->EmbeddingBackward(dtable.h, dout.h, th, rows, dim, vocab_begin, vocab_count);
  p.Gpu().EmbeddingBackward(dtable.g, dout.g, tg, rows, dim, vocab_begin, vocab_count);
  CHECK_CLOSE(p, dtable, 0, 0);
  const int64_t seq = 64, t0 = 70;
  auto pos = p.Upload(Random(seq * dim, 13)), y = p.Zeros(rows * dim), dpos = p.Zeros(seq * dim);
  p.host->AddPosition(y.h, dout.h, pos.h, rows, dim, t0, seq);
  p.Gpu().AddPosition(y.g, dout.g, pos.g, rows, dim, t0, seq);
  CHECK_CLOSE(p, y, 0, 0);
  p.host->AddPositionBackward(dpos.h, dout.h, rows, dim, t0, seq);
  p.Gpu().AddPositionBackward(dpos.g, dout.g, rows, dim, t0, seq);
  CHECK_CLOSE(p, dpos, 0, 0);
}

TEST_CASE("cuda backend: RMSNorm and LayerNorm forward and backward") {
  if (!GpuOrSkip()) return;
  Pair p;
  const int64_t rows = 77, dim = 200;
  auto x = p.Upload(Random(rows * dim, 14, 3.0f)), w = p.Upload(Random(dim, 15));
  auto b = p.Upload(Random(dim, 16)), dout = p.Upload(Random(rows * dim, 17));
  auto out = p.Zeros(rows * dim), mean = p.Zeros(rows), rstd = p.Zeros(rows);
  auto dx = p.Zeros(rows * dim), dw = p.Zeros(dim), db = p.Zeros(dim);
  p.host->RmsNormForward(out.h, rstd.h, x.h, w.h, rows, dim, 1e-5f);
  p.Gpu().RmsNormForward(out.g, rstd.g, x.g, w.g, rows, dim, 1e-5f);
  CHECK_CLOSE(p, out, 1e-5, 1e-4);
  CHECK_CLOSE(p, rstd, 1e-6, 1e-4);
  p.host->RmsNormBackward(dx.h, dw.h, dout.h, x.h, w.h, rstd.h, rows, dim);
  p.Gpu().RmsNormBackward(dx.g, dw.g, dout.g, x.g, w.g, rstd.g, rows, dim);
  CHECK_CLOSE(p, dx, 1e-5, 1e-4);
  CHECK_CLOSE(p, dw, 1e-4, 1e-4);
  p.host->LayerNormForward(out.h, mean.h, rstd.h, x.h, w.h, b.h, rows, dim, 1e-5f);
  p.Gpu().LayerNormForward(out.g, mean.g, rstd.g, x.g, w.g, b.g, rows, dim, 1e-5f);
  CHECK_CLOSE(p, out, 1e-5, 1e-4);
  CHECK_CLOSE(p, mean, 1e-6, 1e-4);
  p.host->LayerNormBackward(dx.h, dw.h, db.h, dout.h, x.h, w.h, mean.h, rstd.h, rows, dim);
  p.Gpu().LayerNormBackward(dx.g, dw.g, db.g, dout.g, x.g, w.g, mean.g, rstd.g, rows, dim);
  CHECK_CLOSE(p, dx, 1e-5, 1e-4);
  CHECK_CLOSE(p, dw, 1e-4, 1e-4);
  CHECK_CLOSE(p, db, 1e-4, 1e-4);
}

// Random q, k, v and an output gradient for `rows` tokens of qh query and kvh key/value heads,
// uploaded to both backends (seeds seed .. seed + 3).
struct AttentionInputs {
  Pair::Buf q, k, v, dout;
};
AttentionInputs RandomAttentionInputs(Pair& p, int64_t rows, int64_t qh, int64_t kvh,
                                      int64_t head_dim, uint32_t seed) {
  return {p.Upload(Random(rows * qh * head_dim, seed)),
          p.Upload(Random(rows * kvh * head_dim, seed + 1)),
          p.Upload(Random(rows * kvh * head_dim, seed + 2)),
          p.Upload(Random(rows * qh * head_dim, seed + 3))};
}

// Flash attention forward and backward on both backends from the same inputs: the output and
// log-sum-exp within 3e-2 + 2e-2·|host|, the gradients within 3e-2 + 3e-2·|host|. Returns dq.
Pair::Buf CheckAttention(Pair& p, const Pair::Buf& q, const Pair::Buf& k, const Pair::Buf& v,
                         const Pair::Buf& dout, const TokenLayout& layout, int64_t qh, int64_t kvh,
                         int64_t head_dim, float scale, int64_t window = 0) {
  auto out = p.Zeros(q.n), lse = p.Zeros(q.n / head_dim);
  p.host->AttentionForward(out.h, lse.h, q.h, k.h, v.h, layout, qh, kvh, head_dim, scale, window);
  p.Gpu().AttentionForward(out.g, lse.g, q.g, k.g, v.g, layout, qh, kvh, head_dim, scale, window);
  CHECK_CLOSE(p, out, 3e-2, 2e-2);
  CHECK_CLOSE(p, lse, 3e-2, 2e-2);
  auto dq = p.Zeros(q.n), dk = p.Zeros(k.n), dv = p.Zeros(v.n);
  p.host->AttentionBackward(dq.h, dk.h, dv.h, dout.h, out.h, lse.h, q.h, k.h, v.h, layout, qh, kvh,
                            head_dim, scale, window);
  p.Gpu().AttentionBackward(dq.g, dk.g, dv.g, dout.g, out.g, lse.g, q.g, k.g, v.g, layout, qh, kvh,
                            head_dim, scale, window);
  CHECK_CLOSE(p, dq, 3e-2, 3e-2);
  CHECK_CLOSE(p, dk, 3e-2, 3e-2);
  CHECK_CLOSE(p, dv, 3e-2, 3e-2);
  return dq;
}

TEST_CASE("cuda backend: rotary embedding and flash attention, both token layouts, GQA") {
  if (!GpuOrSkip()) return;
  Pair p;
  for (int64_t head_dim : {64, 128, 192}) {  // 192: latent attention's query/key heads
    for (bool seq_major : {true, false}) {
      const int64_t seq = 150, batch = 2, qh = 4, kvh = 2, rows = seq * batch;
      INFO("head_dim " << head_dim << (seq_major ? " seq-major" : " batch-major"));
      const TokenLayout layout =
          seq_major ? TokenLayout::SeqMajor(seq, batch) : TokenLayout::BatchMajor(seq, batch);
      const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
      auto [q, k, v, dout] = RandomAttentionInputs(p, rows, qh, kvh, head_dim, 20);
      p.host->RopeForward(q.h, layout, qh, head_dim, 10000.0f);
      p.Gpu().RopeForward(q.g, layout, qh, head_dim, 10000.0f);
      CHECK_CLOSE(p, q, 1e-5, 1e-5);
      auto dq = CheckAttention(p, q, k, v, dout, layout, qh, kvh, head_dim, scale);
      p.host->RopeBackward(dq.h, layout, qh, head_dim, 10000.0f);
      p.Gpu().RopeBackward(dq.g, layout, qh, head_dim, 10000.0f);
      CHECK_CLOSE(p, dq, 3e-2, 3e-2);
    }
  }
}

// Keys whose scores grow along the sequence, so that each query row's running max rises by more
// than the forward kernel's rescaling slack on most key tiles (the rescaling path runs). The
// inputs are exact in bf16 (q near 1 in steps of 1/8, k a ramp plus steps of 1/4), so the scores
// match the host's up to fp32 sums and the usual tolerance holds despite scores up to about 60.
TEST_CASE("cuda backend: flash attention whose running max keeps rising") {
  if (!GpuOrSkip()) return;
  Pair p;
  for (int64_t head_dim : {16, 64, 192}) {
    INFO("head_dim " << head_dim);
    const int64_t seq = 200, batch = 1, qh = 2, kvh = 1;
    const TokenLayout layout = TokenLayout::SeqMajor(seq, batch);
    const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
    const float top = 60.0f / std::sqrt(static_cast<float>(head_dim));  // largest ramp value
    std::mt19937 gen(70);
    std::uniform_int_distribution<int> step(-2, 2);
    std::vector<float> qv(seq * qh * head_dim), kv(seq * kvh * head_dim);
    for (auto& x : qv) x = 1.0f + static_cast<float>(step(gen)) / 8.0f;
    for (int64_t t = 0; t < seq; ++t) {
      const float ramp = std::round(4.0f * top * static_cast<float>(t) / seq) / 4.0f;
      for (int64_t i = 0; i < kvh * head_dim; ++i) {
        kv[t * kvh * head_dim + i] = ramp + static_cast<float>(step(gen)) / 4.0f;
      }
    }
    auto q = p.Upload(qv), k = p.Upload(kv);
    auto v = p.Upload(Random(seq * kvh * head_dim, 71)),
         dout = p.Upload(Random(seq * qh * head_dim, 72));
    CheckAttention(p, q, k, v, dout, layout, qh, kvh, head_dim, scale);
  }
}

// A sliding window: windows shorter than a tile, across tile boundaries, and longer than the
// sequence (every key seen), on both layouts and with GQA; the host kernel is the reference.
TEST_CASE("cuda backend: flash attention under a sliding window") {
  if (!GpuOrSkip()) return;
  Pair p;
  for (int64_t head_dim : {16, 64, 128}) {
    for (int64_t window : {1, 5, 64, 97, 300}) {
      const int64_t seq = 200, batch = 2, qh = 4, kvh = 2, rows = seq * batch;
      const bool seq_major = window % 2 == 1;
      INFO("head_dim " << head_dim << " window " << window);
      const TokenLayout layout =
          seq_major ? TokenLayout::SeqMajor(seq, batch) : TokenLayout::BatchMajor(seq, batch);
      const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
      const AttentionInputs in = RandomAttentionInputs(p, rows, qh, kvh, head_dim, 80);
      CheckAttention(p, in.q, in.k, in.v, in.dout, layout, qh, kvh, head_dim, scale, window);
    }
  }
}

TEST_CASE("cuda backend: ring attention chunk pairs, merge and backward match the host") {
  if (!GpuOrSkip()) return;
  Pair p;
  for (int64_t head_dim : {16, 80}) {
    // Sliding windows of 12 keys (chunk 0 partly seen from chunk 2) and of 4 (chunk 0 unseen).
    for (const auto& [layout_seq_major, key_window] :
         {std::pair<bool, int64_t>{true, 0}, {false, 0}, {true, 12}, {false, 4}}) {
      const bool seq_major = layout_seq_major;  // (bindings cannot be captured before C++20)
      const int64_t window = key_window;
      // One sequence cut into 4 chunks of 9; the query chunk is chunk 2, the K/V chunks 0, 2 and
      // 3 (before it, itself: the causal diagonal, after it: masked out entirely).
      const int64_t len = 9, seq = 4 * len, batch = 2, qh = 4, kvh = 2, rows = seq * batch;
      INFO("head_dim " << head_dim << (seq_major ? " seq-major" : " batch-major") << " window "
                       << window);
      const TokenLayout whole =
          seq_major ? TokenLayout::SeqMajor(seq, batch) : TokenLayout::BatchMajor(seq, batch);
      const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
      auto [q, k, v, dout] = RandomAttentionInputs(p, rows, qh, kvh, head_dim, 30);
      auto out = p.Zeros(rows * qh * head_dim),
           lse = p.Upload(std::vector<float>(rows * qh, -INFINITY));
      auto block_out = p.Zeros(out.n), block_lse = p.Zeros(lse.n);
      auto dq = p.Zeros(q.n), dk = p.Zeros(k.n), dv = p.Zeros(v.n);
      const auto chunk = [&](int64_t c) {
        TokenLayout l = whole;
        l.seq = len;
        l.seq_offset = c * len;
        return std::make_pair(l, whole.Row(c * len, 0));
      };
      const auto [ql, q_row] = chunk(2);
      const int64_t qo = q_row * qh * head_dim, lo = q_row * qh;
      for (int64_t c : {3, 0, 2}) {
        const auto [kl, k_row] = chunk(c);
        const int64_t ko = k_row * kvh * head_dim;
        for (Backend* be : {p.host.get(), &p.Gpu()}) {
          const bool h = be == p.host.get();
          auto at = [h](const Pair::Buf& b, int64_t off) { return (h ? b.h : b.g) + off; };
          be->AttentionBlockForward(at(block_out, qo), at(block_lse, lo), at(q, qo), at(k, ko),
                                    at(v, ko), ql, kl, qh, kvh, head_dim, scale, window);
          be->AttentionMergeBlocks(at(out, qo), at(lse, lo), at(block_out, qo), at(block_lse, lo),
                                   ql, qh, head_dim);
        }
        CHECK_CLOSE(p, block_out, 1e-5, 1e-4);
        CHECK_CLOSE(p, out, 1e-5, 1e-4);
      }
      for (int64_t c : {0, 2, 3}) {
        const auto [kl, k_row] = chunk(c);
        const int64_t ko = k_row * kvh * head_dim;
        for (Backend* be : {p.host.get(), &p.Gpu()}) {
          const bool h = be == p.host.get();
          auto at = [h](const Pair::Buf& b, int64_t off) { return (h ? b.h : b.g) + off; };
          be->AttentionBlockBackward(at(dq, qo), at(dk, ko), at(dv, ko), at(dout, qo), at(out, qo),
                                     at(lse, lo), at(q, qo), at(k, ko), at(v, ko), ql, kl, qh, kvh,
                                     head_dim, scale, window);
        }
      }
      CHECK_CLOSE(p, dq, 1e-4, 1e-4);
      CHECK_CLOSE(p, dk, 1e-4, 1e-4);
      CHECK_CLOSE(p, dv, 1e-4, 1e-4);
    }
  }
}

TEST_CASE("cuda backend: vocab-parallel cross-entropy phases with padding and ignored rows") {
  if (!GpuOrSkip()) return;
  Pair p;
  const int64_t rows = 37, vocab_local = 300, vocab_begin = 300, vocab = 520;  // 80 padding columns
  std::vector<int32_t> targets(rows);
  // Every fifth row ignored (a negative target), as multi-token prediction's last positions.
  for (int64_t r = 0; r < rows; ++r)
    targets[r] = r % 5 == 3 ? -1 : static_cast<int32_t>((r * 131) % vocab);
  auto [th, tg] = p.Tokens(targets);
  auto logits = p.Upload(Random(rows * vocab_local, 30, 5.0f));
  auto row_max = p.Zeros(rows), st = p.Zeros(2 * rows), loss = p.Upload({0.25f});
  auto dlogits = p.Zeros(rows * vocab_local);
  p.host->CrossEntropyRowMax(row_max.h, logits.h, rows, vocab_local);
  p.Gpu().CrossEntropyRowMax(row_max.g, logits.g, rows, vocab_local);
  CHECK_CLOSE(p, row_max, 0, 0);
  p.host->CrossEntropySumExp(st.h, logits.h, row_max.h, th, rows, vocab_local, vocab_begin, vocab);
  p.Gpu().CrossEntropySumExp(st.g, logits.g, row_max.g, tg, rows, vocab_local, vocab_begin, vocab);
  CHECK_CLOSE(p, st, 1e-6, 1e-5);
  p.host->CrossEntropyLoss(loss.h, row_max.h, st.h, rows, 0.5f);
  p.Gpu().CrossEntropyLoss(loss.g, row_max.g, st.g, rows, 0.5f);
  CHECK_CLOSE(p, loss, 1e-6, 1e-5);
  p.host->CrossEntropyBackward(dlogits.h, logits.h, row_max.h, st.h, th, rows, vocab_local,
                               vocab_begin, vocab, 2.0f);
  p.Gpu().CrossEntropyBackward(dlogits.g, logits.g, row_max.g, st.g, tg, rows, vocab_local,
                               vocab_begin, vocab, 2.0f);
  CHECK_CLOSE(p, dlogits, 1e-7, 1e-5);
}

TEST_CASE("cuda backend: sum of squares and optimizers") {
  if (!GpuOrSkip()) return;
  Pair p;
  const int64_t n = 100003;
  auto x = p.Upload(Random(n, 40));
  const double h = p.host->SumOfSquares(x.h, n), g = p.Gpu().SumOfSquares(x.g, n);
  CHECK(g == doctest::Approx(h).epsilon(1e-9));
  auto param = p.Upload(Random(n, 41)), grad = p.Upload(Random(n, 42)), m = p.Zeros(n),
       v = p.Zeros(n);
  host::AdamWConfig config{1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f};
  for (int64_t step = 1; step <= 3; ++step) {
    p.host->AdamW(param.h, grad.h, m.h, v.h, n, config, step, 0.7f);
    p.Gpu().AdamW(param.g, grad.g, m.g, v.g, n, config, step, 0.7f);
  }
  CHECK_CLOSE(p, param, 1e-6, 1e-5);
  CHECK_CLOSE(p, m, 1e-7, 1e-5);
  CHECK_CLOSE(p, v, 1e-8, 1e-5);
  p.host->Sgd(param.h, grad.h, n, 0.1f, 0.01f, 0.5f);
  p.Gpu().Sgd(param.g, grad.g, n, 0.1f, 0.01f, 0.5f);
  CHECK_CLOSE(p, param, 1e-6, 1e-5);
}

// The multi-tensor forms are the per-tensor calls in fewer launches: the same bits, across
// more tensors than one launch takes, with empty and one-element tensors among them.
TEST_CASE("cuda backend: sums of squares and AdamW over many tensors equal the per-tensor calls") {
  if (!GpuOrSkip()) return;
  Pair p;
  std::vector<int64_t> sizes;
  for (int t = 0; t < 45; ++t) sizes.push_back(t % 9 == 4 ? 0 : (t * 7919) % 3001 + t % 3);
  sizes[10] = 100003;  // more elements than one tensor's 264 blocks cover in one stride
  int64_t total = 0;
  for (int64_t n : sizes) total += n;
  const auto values = Random(total, 80);
  auto x = p.Upload(values);
  std::vector<exec::ConstTensor> tensors;
  int64_t offset = 0;
  for (int64_t n : sizes) {
    tensors.push_back({x.g + offset, n});
    offset += n;
  }
  const std::vector<double> each = p.Gpu().SumOfSquaresEach(tensors);
  REQUIRE(each.size() == sizes.size());
  offset = 0;
  for (size_t t = 0; t < sizes.size(); ++t) {
    INFO("tensor " << t << " of " << sizes[t] << " elements");
    CHECK(each[t] == p.Gpu().SumOfSquares(x.g + offset, sizes[t]));
    CHECK(each[t] == doctest::Approx(p.host->SumOfSquares(x.h + offset, sizes[t])).epsilon(1e-9));
    offset += sizes[t];
  }
  CHECK(p.Gpu().SumOfSquaresEach({}).empty());

  // AdamW: one set of buffers updated per tensor, a second through AdamWEach (copies into a
  // third, except one tensor whose copy is its own weights); the host runs the per-tensor form.
  const auto params = Random(total, 81), grads = Random(total, 82);
  auto param1 = p.Upload(params), param2 = p.Upload(params), grad = p.Upload(grads);
  auto m1 = p.Zeros(total), v1 = p.Zeros(total), m2 = p.Zeros(total), v2 = p.Zeros(total);
  auto copy1 = p.Zeros(total), copy2 = p.Zeros(total);
  const host::AdamWConfig config{1e-2f, 0.9f, 0.95f, 1e-8f, 0.0f};
  for (int64_t step = 1; step <= 2; ++step) {
    std::vector<exec::AdamWTensor> updates;
    offset = 0;
    for (size_t t = 0; t < sizes.size(); ++t) {
      host::AdamWConfig c = config;
      c.weight_decay = t % 2 == 0 ? 0.1f : 0.0f;
      const int64_t o = offset, n = sizes[t];
      const bool self = t == 7;
      p.Gpu().AdamW(param1.g + o, grad.g + o, m1.g + o, v1.g + o, n, c, step, 0.7f);
      p.Gpu().Copy(self ? param1.g + o : copy1.g + o, param1.g + o, n);
      p.host->AdamW(param1.h + o, grad.h + o, m1.h + o, v1.h + o, n, c, step, 0.7f);
      updates.push_back({param2.g + o, grad.g + o, m2.g + o, v2.g + o, n, c.weight_decay,
                         self ? param2.g + o : copy2.g + o});
      offset += n;
    }
    p.Gpu().AdamWEach(updates, config, step, 0.7f);
  }
  auto download = [&](const Pair::Buf& b) {
    std::vector<float> v(b.n);
    p.Gpu().CopyToHost(v.data(), b.g, b.n * 4);
    return v;
  };
  CHECK(download(param2) == download(param1));
  CHECK(download(m2) == download(m1));
  CHECK(download(v2) == download(v1));
  CHECK(download(copy2) == download(copy1));
  CHECK_CLOSE(p, param1, 1e-6, 1e-5);
}

TEST_CASE("cuda backend: odd shapes (one row, empty, sizes not multiples of a tile)") {
  if (!GpuOrSkip()) return;
  Pair p;
  // Empty inputs are no-ops; one element works.
  auto one = p.Upload({0.75f}), two = p.Upload({-2.0f}), out = p.Upload({9.0f});
  p.Gpu().Add(out.g, one.g, two.g, 0);
  p.host->Add(out.h, one.h, two.h, 0);
  CHECK_CLOSE(p, out, 0, 0);
  p.Gpu().Add(out.g, one.g, two.g, 1);
  p.host->Add(out.h, one.h, two.h, 1);
  CHECK_CLOSE(p, out, 0, 0);
  CHECK(p.Gpu().SumOfSquares(one.g, 0) == 0.0);
  CHECK(p.Gpu().SumOfSquares(one.g, 1) == 0.5625);
  // GEMMs of one row, one column, k = 1, and k = 0 (beta 0 writes zeros).
  for (const auto& shape :
       {std::tuple<int64_t, int64_t, int64_t>{1, 1, 1}, {1, 17, 3}, {19, 1, 33}, {3, 5, 0}}) {
    // Named copies, not structured bindings: INFO captures them.
    const int64_t m = std::get<0>(shape), n = std::get<1>(shape), k = std::get<2>(shape);
    INFO("m " << m << " n " << n << " k " << k);
    const auto va = Random(std::max<int64_t>(m * k, 1), 50),
               vb = Random(std::max<int64_t>(k * n, 1), 51);
    auto a = p.Upload(va), b = p.Upload(vb), c = p.Upload(Random(m * n, 52));
    auto abs_a = p.Upload(Abs(va)), abs_b = p.Upload(Abs(vb)), bound = p.Zeros(m * n);
    p.host->Gemm(false, true, m, n, k, a.h, b.h, 0.0f, c.h);
    p.Gpu().Gemm(false, true, m, n, k, a.g, b.g, 0.0f, c.g);
    p.host->Gemm(false, true, m, n, k, abs_a.h, abs_b.h, 0.0f, bound.h);
    CHECK(p.ExcessBf16Gemm(c, bound) <= 0.0);
  }
  // One row of a norm, a dimension that is not a multiple of the warp.
  for (int64_t dim : {1, 33}) {
    auto x = p.Upload(Random(dim, 53, 2.0f)), w = p.Upload(Random(dim, 54)),
         b = p.Upload(Random(dim, 55));
    auto y = p.Zeros(dim), mean = p.Zeros(1), rstd = p.Zeros(1), dout = p.Upload(Random(dim, 56));
    auto dx = p.Zeros(dim), dw = p.Zeros(dim), db = p.Zeros(dim);
    p.host->LayerNormForward(y.h, mean.h, rstd.h, x.h, w.h, b.h, 1, dim, 1e-5f);
    p.Gpu().LayerNormForward(y.g, mean.g, rstd.g, x.g, w.g, b.g, 1, dim, 1e-5f);
    CHECK_CLOSE(p, y, 1e-5, 1e-4);
    p.host->LayerNormBackward(dx.h, dw.h, db.h, dout.h, x.h, w.h, mean.h, rstd.h, 1, dim);
    p.Gpu().LayerNormBackward(dx.g, dw.g, db.g, dout.g, x.g, w.g, mean.g, rstd.g, 1, dim);
    CHECK_CLOSE(p, dx, 1e-4, 1e-3);
    CHECK_CLOSE(p, dw, 1e-5, 1e-4);
    p.host->RmsNormForward(y.h, rstd.h, x.h, w.h, 1, dim, 1e-5f);
    p.Gpu().RmsNormForward(y.g, rstd.g, x.g, w.g, 1, dim, 1e-5f);
    CHECK_CLOSE(p, y, 1e-5, 1e-4);
    p.host->RmsNormBackward(dx.h, dw.h, dout.h, x.h, w.h, rstd.h, 1, dim);
    p.Gpu().RmsNormBackward(dx.g, dw.g, dout.g, x.g, w.g, rstd.g, 1, dim);
    CHECK_CLOSE(p, dx, 1e-5, 1e-4);
    CHECK_CLOSE(p, dw, 1e-5, 1e-4);
  }
  // Cross-entropy of one row; an embedding of one token.
  auto [th, tg] = p.Tokens({7});
  auto logits = p.Upload(Random(130, 57, 4.0f)), row_max = p.Zeros(1), st = p.Zeros(2),
       loss = p.Zeros(1);
  auto dlogits = p.Zeros(130);
  p.host->CrossEntropyRowMax(row_max.h, logits.h, 1, 130);
  p.Gpu().CrossEntropyRowMax(row_max.g, logits.g, 1, 130);
  p.host->CrossEntropySumExp(st.h, logits.h, row_max.h, th, 1, 130, 0, 129);
  p.Gpu().CrossEntropySumExp(st.g, logits.g, row_max.g, tg, 1, 130, 0, 129);
  CHECK_CLOSE(p, st, 1e-6, 1e-5);
  p.host->CrossEntropyLoss(loss.h, row_max.h, st.h, 1, 1.0f);
  p.Gpu().CrossEntropyLoss(loss.g, row_max.g, st.g, 1, 1.0f);
  CHECK_CLOSE(p, loss, 1e-6, 1e-5);
  p.host->CrossEntropyBackward(dlogits.h, logits.h, row_max.h, st.h, th, 1, 130, 0, 129, 1.0f);
  p.Gpu().CrossEntropyBackward(dlogits.g, logits.g, row_max.g, st.g, tg, 1, 130, 0, 129, 1.0f);
  CHECK_CLOSE(p, dlogits, 1e-7, 1e-5);
  auto table = p.Upload(Random(int64_t{10} * 5, 58)), emb = p.Zeros(5), dtable = p.Zeros(50);
  p.host->EmbeddingForward(emb.h, th, table.h, 1, 5, 0, 10);
  p.Gpu().EmbeddingForward(emb.g, tg, table.g, 1, 5, 0, 10);
  CHECK_CLOSE(p, emb, 0, 0);
  p.host->EmbeddingBackward(dtable.h, emb.h, th, 1, 5, 0, 10);
  p.Gpu().EmbeddingBackward(dtable.g, emb.g, tg, 1, 5, 0, 10);
  CHECK_CLOSE(p, dtable, 0, 0);
  // Attention of one token, and of 65 tokens (one past a 64-token tile), head_dim 16 and 32.
  for (int64_t head_dim : {16, 32}) {
    for (int64_t seq : {1, 65}) {
      INFO("head_dim " << head_dim << " seq " << seq);
      const int64_t qh = 2, kvh = 1;
      const TokenLayout layout = TokenLayout::SeqMajor(seq, 1);
      const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
      auto q = p.Upload(Random(seq * qh * head_dim, 60)),
           k = p.Upload(Random(seq * kvh * head_dim, 61));
      auto v = p.Upload(Random(seq * kvh * head_dim, 62)),
           dout = p.Upload(Random(seq * qh * head_dim, 63));
      auto o = p.Zeros(q.n), lse = p.Zeros(qh * seq), dq = p.Zeros(q.n), dk = p.Zeros(k.n),
           dv = p.Zeros(v.n);
      p.host->AttentionForward(o.h, lse.h, q.h, k.h, v.h, layout, qh, kvh, head_dim, scale, 0);
      p.Gpu().AttentionForward(o.g, lse.g, q.g, k.g, v.g, layout, qh, kvh, head_dim, scale, 0);
      CHECK_CLOSE(p, o, 3e-2, 2e-2);
      CHECK_CLOSE(p, lse, 3e-2, 2e-2);
      p.host->AttentionBackward(dq.h, dk.h, dv.h, dout.h, o.h, lse.h, q.h, k.h, v.h, layout, qh,
                                kvh, head_dim, scale, 0);
      p.Gpu().AttentionBackward(dq.g, dk.g, dv.g, dout.g, o.g, lse.g, q.g, k.g, v.g, layout, qh,
                                kvh, head_dim, scale, 0);
      CHECK_CLOSE(p, dq, 3e-2, 3e-2);
      CHECK_CLOSE(p, dk, 3e-2, 3e-2);
      CHECK_CLOSE(p, dv, 3e-2, 3e-2);
    }
  }
}

// --- mixture of experts ----------------------------------------------------------------------
TEST_CASE("cuda backend: mixture-of-experts router, permutation and grouped linear layers") {
  if (!GpuOrSkip()) return;
  Pair p;
  const int64_t rows = 37, experts = 6, topk = 2, dim = 24, ffn = 40;
  auto ints_equal = [&](const std::pair<int32_t*, int32_t*>& b, int64_t n) {
    std::vector<int32_t> h(n), g(n);
    p.host->CopyToHost(h.data(), b.first, n * 4);
    p.Gpu().CopyToHost(g.data(), b.second, n * 4);
    return h == g;
  };
  auto logits = p.Upload(Random(rows * experts, 70, 2.0f)),
       bias = p.Upload(Random(experts, 71, 0.1f));
  for (int64_t score : {0, 1}) {
    for (bool normalize : {false, true}) {
      INFO("score " << score << " normalize " << normalize);
      const host::MoeRouterConfig config{.experts = experts,
                                         .topk = topk,
                                         .score = static_cast<host::RouterScore>(score),
                                         .normalize = normalize,
                                         .aux_coeff = 0.01f,
                                         .aux_rows = 2 * rows};
      auto weights = p.Zeros(rows * topk), scores = p.Zeros(rows * experts),
           counts = p.Zeros(experts), dlogits = p.Zeros(rows * experts);
      auto indices = p.Tokens(std::vector<int32_t>(rows * topk, 0));
      p.host->MoeRouterForward(weights.h, indices.first, scores.h, counts.h, logits.h, bias.h, rows,
                               config);
      p.Gpu().MoeRouterForward(weights.g, indices.second, scores.g, counts.g, logits.g, bias.g,
                               rows, config);
      CHECK(ints_equal(indices, rows * topk));
      CHECK_CLOSE(p, counts, 0, 0);
      CHECK_CLOSE(p, scores, 1e-7, 1e-5);
      CHECK_CLOSE(p, weights, 1e-7, 1e-5);
      auto dweights = p.Upload(Random(rows * topk, 72));
      p.host->MoeRouterBackward(dlogits.h, dweights.h, indices.first, scores.h, counts.h, rows,
                                config, 0.5f);
      p.Gpu().MoeRouterBackward(dlogits.g, dweights.g, indices.second, scores.g, counts.g, rows,
                                config, 0.5f);
      CHECK_CLOSE(p, dlogits, 1e-6, 1e-4);
    }
  }
  // Group-limited routing and the scale: the host's choice exactly, on logits with ties.
  {
    const int64_t grouped_experts = 16, k = 4;
    std::vector<float> z(rows * grouped_experts);
    for (size_t i = 0; i < z.size(); ++i) z[i] = 0.25f * static_cast<float>((i * 7 + i / 5) % 9);
    auto grouped_logits = p.Upload(z), grouped_bias = p.Upload(Random(grouped_experts, 79, 0.1f));
    for (int64_t score : {0, 1}) {
      for (bool with_bias : {false, true}) {
        INFO("grouped: score " << score << " bias " << with_bias);
        const host::MoeRouterConfig config{.experts = grouped_experts,
                                           .topk = k,
                                           .score = static_cast<host::RouterScore>(score),
                                           .normalize = score == 1,
                                           .aux_coeff = 0.01f,
                                           .groups = 4,
                                           .group_topk = 2,
                                           .scale = 2.5f};
        auto weights = p.Zeros(rows * k), scores = p.Zeros(rows * grouped_experts),
             counts = p.Zeros(grouped_experts), dlogits = p.Zeros(rows * grouped_experts);
        auto indices = p.Tokens(std::vector<int32_t>(rows * k, 0));
        auto b = with_bias ? grouped_bias : p.Zeros(grouped_experts);
        p.host->MoeRouterForward(weights.h, indices.first, scores.h, counts.h, grouped_logits.h,
                                 with_bias ? b.h : nullptr, rows, config);
        p.Gpu().MoeRouterForward(weights.g, indices.second, scores.g, counts.g, grouped_logits.g,
                                 with_bias ? b.g : nullptr, rows, config);
        CHECK(ints_equal(indices, rows * k));
        CHECK_CLOSE(p, counts, 0, 0);
        CHECK_CLOSE(p, weights, 1e-6, 1e-5);
        auto dweights = p.Upload(Random(rows * k, 80));
        p.host->MoeRouterBackward(dlogits.h, dweights.h, indices.first, scores.h, counts.h, rows,
                                  config, 0.5f);
        p.Gpu().MoeRouterBackward(dlogits.g, dweights.g, indices.second, scores.g, counts.g, rows,
                                  config, 0.5f);
        CHECK_CLOSE(p, dlogits, 1e-6, 1e-4);
      }
    }
  }
  // The aux-loss-free bias update: exactly the host's (sums of whole counts).
  auto load = p.Upload({5, 0, 3, 2, 9, 5}), expert_bias = p.Upload(Random(experts, 78, 0.1f));
  p.host->MoeExpertBiasUpdate(expert_bias.h, load.h, experts, 0.01f);
  p.Gpu().MoeExpertBiasUpdate(expert_bias.g, load.g, experts, 0.01f);
  CHECK_CLOSE(p, expert_bias, 0, 0);
  CHECK_CLOSE(p, load, 0, 0);
  // Capacity: the host's choice exactly (ties included: weights repeat), and its gradient.
  {
    std::vector<int32_t> choice(rows * topk);
    std::vector<float> w(rows * topk);
    for (int64_t i = 0; i < rows * topk; ++i) {
      choice[i] = static_cast<int32_t>((i * 7) % experts);
      w[i] = static_cast<float>((i * 5) % 9) / 8.0f;
    }
    auto idx = p.Tokens(choice);
    auto weights = p.Upload(w), kept = p.Zeros(rows * topk), mask = p.Zeros(rows * topk);
    for (bool position : {false, true}) {
      p.host->MoeCapacityForward(kept.h, mask.h, weights.h, idx.first, rows, experts, topk, 9,
                                 position, 1);
      p.Gpu().MoeCapacityForward(kept.g, mask.g, weights.g, idx.second, rows, experts, topk, 9,
                                 position, 1);
      CHECK_CLOSE(p, mask, 0, 0);
      CHECK_CLOSE(p, kept, 0, 0);
    }
    // In segments (the Etp group's gathered rows, a capacity per member's rows): the first 36
    // rows as 2, 3 and 4 runs, each with its own capacity of 3 per expert.
    for (int64_t segments : {2, 3, 4}) {
      for (bool position : {false, true}) {
        CAPTURE(segments);
        CAPTURE(position);
        p.host->MoeCapacityForward(kept.h, mask.h, weights.h, idx.first, 36, experts, topk, 3,
                                   position, segments);
        p.Gpu().MoeCapacityForward(kept.g, mask.g, weights.g, idx.second, 36, experts, topk, 3,
                                   position, segments);
        CHECK_CLOSE(p, mask, 0, 0);
        CHECK_CLOSE(p, kept, 0, 0);
      }
    }
    auto dkept = p.Upload(Random(rows * topk, 79)), dw = p.Zeros(rows * topk);
    p.host->MoeCapacityBackward(dw.h, dkept.h, mask.h, rows * topk);
    p.Gpu().MoeCapacityBackward(dw.g, dkept.g, mask.g, rows * topk);
    CHECK_CLOSE(p, dw, 0, 0);
  }
  // Permutation: the host's order exactly, and the combine back.
  std::vector<int32_t> picks(rows * topk);
  for (int64_t r = 0; r < rows; ++r) {
    picks[r * topk] = static_cast<int32_t>((r * 5) % experts);
    picks[r * topk + 1] = static_cast<int32_t>((r * 5 + 1 + r % 3) % experts);
  }
  auto indices = p.Tokens(picks);
  auto x = p.Upload(Random(rows * dim, 73)), permuted = p.Zeros(rows * topk * dim);
  auto row_map = p.Tokens(std::vector<int32_t>(rows * topk, -1));
  auto expert_counts = p.Tokens(std::vector<int32_t>(experts, -1));
  p.host->MoePermute(permuted.h, row_map.first, expert_counts.first, x.h, indices.first, rows, dim,
                     experts, topk);
  p.Gpu().MoePermute(permuted.g, row_map.second, expert_counts.second, x.g, indices.second, rows,
                     dim, experts, topk);
  CHECK(ints_equal(row_map, rows * topk));
  CHECK(ints_equal(expert_counts, experts));
  CHECK_CLOSE(p, permuted, 0, 0);
  auto weights = p.Upload(Random(rows * topk, 74)), y = p.Zeros(rows * dim);
  p.host->MoeUnpermute(y.h, permuted.h, row_map.first, weights.h, rows, dim, topk);
  p.Gpu().MoeUnpermute(y.g, permuted.g, row_map.second, weights.g, rows, dim, topk);
  CHECK_CLOSE(p, y, 1e-6, 1e-5);
  p.host->MoeUnpermute(y.h, permuted.h, row_map.first, nullptr, rows, dim, topk);
  p.Gpu().MoeUnpermute(y.g, permuted.g, row_map.second, nullptr, rows, dim, topk);
  CHECK_CLOSE(p, y, 1e-6, 1e-5);
  auto dy = p.Upload(Random(rows * dim, 75)), dperm = p.Zeros(rows * topk * dim),
       dweights = p.Zeros(rows * topk);
  p.host->MoeUnpermuteBackward(dperm.h, dweights.h, dy.h, permuted.h, row_map.first, weights.h,
                               rows, dim, topk);
  p.Gpu().MoeUnpermuteBackward(dperm.g, dweights.g, dy.g, permuted.g, row_map.second, weights.g,
                               rows, dim, topk);
  CHECK_CLOSE(p, dperm, 1e-6, 1e-5);
  CHECK_CLOSE(p, dweights, 1e-5, 1e-5);
  // A capacity factor's kept pairs only: the same rows, counts and row map (-1 for a dropped
  // pair) as the host, the combines giving a dropped pair nothing and its weight no gradient.
  {
    std::vector<float> keep(rows * topk);
    int64_t kept = 0;
    for (int64_t q = 0; q < rows * topk; ++q) {
      keep[q] = q % 3 == 1 || q % 7 == 0 ? 0.0f : 1.0f;
      kept += keep[q] != 0.0f ? 1 : 0;
    }
    auto mask = p.Upload(keep), kept_rows = p.Zeros(kept * dim);
    p.host->MoePermuteKept(kept_rows.h, row_map.first, expert_counts.first, x.h, indices.first,
                           mask.h, rows, dim, experts, topk, kept);
    p.Gpu().MoePermuteKept(kept_rows.g, row_map.second, expert_counts.second, x.g, indices.second,
                           mask.g, rows, dim, experts, topk, kept);
    CHECK(ints_equal(row_map, rows * topk));
    CHECK(ints_equal(expert_counts, experts));
    std::vector<int32_t> map(rows * topk);
    p.host->CopyToHost(map.data(), row_map.first, rows * topk * 4);
    for (int64_t q = 0; q < rows * topk; ++q) CHECK((map[q] < 0) == (keep[q] == 0.0f));
    CHECK_CLOSE(p, kept_rows, 0, 0);
    p.host->MoeUnpermute(y.h, kept_rows.h, row_map.first, weights.h, rows, dim, topk);
    p.Gpu().MoeUnpermute(y.g, kept_rows.g, row_map.second, weights.g, rows, dim, topk);
    CHECK_CLOSE(p, y, 1e-6, 1e-5);
    p.host->MoeUnpermute(y.h, kept_rows.h, row_map.first, nullptr, rows, dim, topk);
    p.Gpu().MoeUnpermute(y.g, kept_rows.g, row_map.second, nullptr, rows, dim, topk);
    CHECK_CLOSE(p, y, 1e-6, 1e-5);
    auto dkept_rows = p.Zeros(kept * dim), dkept_w = p.Upload(Random(rows * topk, 78));
    p.host->MoeUnpermuteBackward(dkept_rows.h, dkept_w.h, dy.h, kept_rows.h, row_map.first,
                                 weights.h, rows, dim, topk);
    p.Gpu().MoeUnpermuteBackward(dkept_rows.g, dkept_w.g, dy.g, kept_rows.g, row_map.second,
                                 weights.g, rows, dim, topk);
    CHECK_CLOSE(p, dkept_rows, 1e-6, 1e-5);
    CHECK_CLOSE(p, dkept_w, 1e-5, 1e-5);
    std::vector<float> dw_host(rows * topk);
    p.host->CopyToHost(dw_host.data(), dkept_w.h, rows * topk * 4);
    for (int64_t q = 0; q < rows * topk; ++q)
      if (keep[q] == 0.0f) CHECK(dw_host[q] == 0.0f);
  }
  // Grouped linear over the permuted rows (one group may be empty), bf16 tolerance.
  auto w = p.Upload(Random(experts * ffn * dim, 76, 0.2f)), h = p.Zeros(rows * topk * ffn);
  auto sizes = p.Tokens({20, 0, 13, 9, 17, 15});
  p.host->GroupedLinearForward(h.h, permuted.h, w.h, sizes.first, experts, dim, ffn);
  p.Gpu().GroupedLinearForward(h.g, permuted.g, w.g, sizes.second, experts, dim, ffn);
  CHECK_CLOSE(p, h, 3e-2, 2e-2);
  auto dh = p.Upload(Random(rows * topk * ffn, 77)), dx = p.Zeros(rows * topk * dim),
       dw = p.Zeros(experts * ffn * dim);
  p.host->GroupedLinearBackward(dx.h, dw.h, dh.h, permuted.h, w.h, sizes.first, experts, dim, ffn,
                                false);
  p.Gpu().GroupedLinearBackward(dx.g, dw.g, dh.g, permuted.g, w.g, sizes.second, experts, dim, ffn,
                                false);
  CHECK_CLOSE(p, dx, 3e-2, 2e-2);
  CHECK_CLOSE(p, dw, 3e-2, 2e-2);
}
// --- end mixture of experts ------------------------------------------------------------------

TEST_CASE("cuda backend: memory accounting") {
  if (!GpuOrSkip()) return;
  auto ranks = MakeLocalCudaRanks(1, 0);
  Backend& be = *ranks.backends[0];
  CHECK(std::string(be.Name()) == "cuda");
  void* a = be.Allocate(1000);
  void* b = be.Allocate(24);
  CHECK(be.BytesInUse() == 1024);
  be.Free(a);
  CHECK(be.BytesInUse() == 24);
  CHECK(be.PeakBytes() == 1024);
  be.Free(b);
}

TEST_CASE("cuda backend: the availability check answers on every machine") {
  const int count = CudaDeviceCount();
  CHECK(count >= 0);
  CHECK((count == 0) == !CudaUnavailableReason().empty());
  if (count == 0) {
    // Without a device the factories refuse clearly instead of crashing.
    CHECK_THROWS(MakeLocalCudaRanks(1, 0));
  }
  CHECK_THROWS_WITH(MakeLocalCudaRanks(0, 0), doctest::Contains("runs 1 to 64 ranks"));
}

}  // namespace
}  // namespace paraplan::cuda
