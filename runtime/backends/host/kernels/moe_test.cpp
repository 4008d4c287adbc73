// Mixture-of-experts kernels: the router's choice and weights, the permutation round trip, and
// every backward against central finite differences.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <numeric>
#include <random>
#include <vector>

#include "runtime/backends/host/kernels/gradient_check.h"
#include "runtime/backends/host/kernels/kernels.h"

using namespace paraplan::host;
using paraplan::host::testing::CheckGradient;
using paraplan::host::testing::Dot;
using paraplan::host::testing::Random;

namespace {

// Router logits whose order within a row is a random permutation with gaps of 0.5, so that a
// finite-difference step never changes which experts a row picks.
std::vector<float> SeparatedLogits(int64_t rows, int64_t experts, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> noise(-0.05f, 0.05f);
  std::vector<float> z(static_cast<size_t>(rows * experts));
  std::vector<int> order(static_cast<size_t>(experts));
  for (int64_t r = 0; r < rows; ++r) {
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), gen);
    for (int64_t e = 0; e < experts; ++e)
      z[static_cast<size_t>(r * experts + e)] =
          0.5f * static_cast<float>(order[static_cast<size_t>(e)]) - 1.5f + noise(gen);
  }
  return z;
}

// The router's logits gradient against central finite differences of the weights projected on
// `proj` plus aux_scale times the load-balancing loss; the backward overwrites its output (it
// starts as 123), and the experts picked do not move under the steps.
void CheckRouterBackward(const char* what, std::vector<float>& z, const std::vector<float>& bias,
                         const std::vector<float>& proj, int64_t rows,
                         const MoeRouterConfig& config, float aux_scale) {
  const int64_t experts = config.experts, topk = config.topk;
  std::vector<float> w(rows * topk), s(rows * experts), counts(experts);
  std::vector<int32_t> idx(rows * topk);
  auto loss = [&] {
    MoeRouterForward(w.data(), idx.data(), s.data(), counts.data(), z.data(), bias.data(), rows,
                     config);
    float aux = 0;
    MoeAuxLoss(&aux, s.data(), counts.data(), rows, config);
    return Dot(w, proj) + aux_scale * static_cast<double>(aux);
  };
  loss();
  const auto picked = idx;
  std::vector<float> dz(rows * experts, 123.0f);
  MoeRouterBackward(dz.data(), proj.data(), idx.data(), s.data(), counts.data(), rows, config,
                    aux_scale);
  CheckGradient(what, z, dz, loss, 1e-2f, 1e-3);
  loss();
  CHECK(idx == picked);
}

}  // namespace

TEST_CASE("moe router: top-k of softmax or sigmoid scores, ties to the lower expert, counts") {
  const int64_t rows = 3, experts = 4;
  // Row 0 has a tie between experts 1 and 3; row 2 is flat (all tied).
  std::vector<float> z = {0.0f, 2.0f,  1.0f, 2.0f,  //
                          3.0f, -1.0f, 0.5f, 0.0f,  //
                          0.7f, 0.7f,  0.7f, 0.7f};
  for (RouterScore score : {RouterScore::kSoftmax, RouterScore::kSigmoid}) {
    for (bool normalize : {false, true}) {
      CAPTURE(static_cast<int>(score));
      CAPTURE(normalize);
      const MoeRouterConfig config{
          .experts = experts, .topk = 2, .score = score, .normalize = normalize};
      std::vector<float> w(rows * 2), s(rows * experts), counts(experts, -1.0f);
      std::vector<int32_t> idx(rows * 2);
      MoeRouterForward(w.data(), idx.data(), s.data(), counts.data(), z.data(), nullptr, rows,
                       config);
      CHECK(idx == std::vector<int32_t>{1, 3, 0, 2, 0, 1});
      CHECK(counts == std::vector<float>{2, 2, 1, 1});
      for (int64_t r = 0; r < rows; ++r) {
        double row_sum = 0;
        for (int64_t e = 0; e < experts; ++e) row_sum += s[r * experts + e];
        if (score == RouterScore::kSoftmax) CHECK(row_sum == doctest::Approx(1.0));
        for (int64_t j = 0; j < 2; ++j) {
          const float picked = s[r * experts + idx[r * 2 + j]];
          if (!normalize) CHECK(w[r * 2 + j] == picked);
        }
        if (normalize) CHECK(w[r * 2] + w[r * 2 + 1] == doctest::Approx(1.0f));
      }
      CHECK(s[0 * experts + 1] ==
            doctest::Approx(score == RouterScore::kSigmoid
                                ? 1.0 / (1.0 + std::exp(-2.0))
                                : std::exp(2.0) / (2 + 2 * std::exp(2.0) + std::exp(1.0) - 1.0)));
    }
  }
  // The expert bias moves the choice, not the weights.
  const MoeRouterConfig config{.experts = experts, .topk = 1};
  std::vector<float> bias = {0.0f, 0.0f, 0.0f, 5.0f}, w(rows), s(rows * experts), counts(experts);
  std::vector<int32_t> idx(rows);
  MoeRouterForward(w.data(), idx.data(), s.data(), counts.data(), z.data(), bias.data(), rows,
                   config);
  CHECK(idx == std::vector<int32_t>{3, 3, 3});
  for (int64_t r = 0; r < rows; ++r) CHECK(w[r] == s[r * experts + 3]);
}

TEST_CASE("moe router backward: weights and the load-balancing loss, every score kind") {
  const int64_t rows = 6, experts = 5, topk = 2;
  auto z = SeparatedLogits(rows, experts, 11);
  const auto proj = Random(rows * topk, 12);
  const std::vector<float> bias = {0.0f, 0.01f, -0.02f, 0.0f, 0.03f};
  const float aux_scale = 0.7f;
  for (RouterScore score : {RouterScore::kSoftmax, RouterScore::kSigmoid}) {
    for (bool normalize : {false, true}) {
      CAPTURE(static_cast<int>(score));
      CAPTURE(normalize);
      // aux_rows larger than rows: the counts stand for a group of ranks.
      const MoeRouterConfig config{.experts = experts,
                                   .topk = topk,
                                   .score = score,
                                   .normalize = normalize,
                                   .aux_coeff = 5.0f,
                                   .aux_rows = 2 * rows};
      CheckRouterBackward("dlogits", z, bias, proj, rows, config, aux_scale);
      // Without the auxiliary term only the weights' gradient is left.
      CheckRouterBackward("dlogits without aux", z, bias, proj, rows, config, 0.0f);
    }
  }
}

namespace {

// Group-limited routing by sorting: each group's keys sorted in decreasing order and its best
// topk / group_topk summed, the groups stably sorted by that score, then the kept groups'
// experts stably sorted by key; the weights as the router computes them.
void ReferenceGroupRouting(std::vector<int32_t>& idx, std::vector<float>& w, const float* s,
                           const float* bias, const MoeRouterConfig& c) {
  const int64_t size = c.experts / c.groups, n = c.topk / c.group_topk;
  std::vector<float> key(static_cast<size_t>(c.experts));
  for (int64_t e = 0; e < c.experts; ++e) key[e] = bias ? s[e] + bias[e] : s[e];
  std::vector<float> group_score(static_cast<size_t>(c.groups));
  for (int64_t g = 0; g < c.groups; ++g) {
    std::vector<float> v(key.begin() + g * size, key.begin() + (g + 1) * size);
    std::sort(v.begin(), v.end(), std::greater<>());
    float sum = 0.0f;
    for (int64_t i = 0; i < n; ++i) sum += v[i];
    group_score[g] = sum;
  }
  std::vector<int64_t> groups(static_cast<size_t>(c.groups));
  std::iota(groups.begin(), groups.end(), 0);
  std::stable_sort(groups.begin(), groups.end(),
                   [&](int64_t a, int64_t b) { return group_score[a] > group_score[b]; });
  std::vector<int64_t> candidates;
  for (int64_t e = 0; e < c.experts; ++e)
    if (std::find(groups.begin(), groups.begin() + c.group_topk, e / size) !=
        groups.begin() + c.group_topk)
      candidates.push_back(e);
  std::stable_sort(candidates.begin(), candidates.end(),
                   [&](int64_t a, int64_t b) { return key[a] > key[b]; });
  idx.assign(candidates.begin(), candidates.begin() + c.topk);
  w.resize(static_cast<size_t>(c.topk));
  double sum = 0;
  for (int64_t j = 0; j < c.topk; ++j) {
    w[j] = s[idx[j]];
    sum += s[idx[j]];
  }
  const auto inv = static_cast<float>(1.0 / sum);
  for (int64_t j = 0; j < c.topk; ++j) {
    if (c.normalize) w[j] *= inv;
    if (c.scale != 1.0f) w[j] *= c.scale;
  }
}

}  // namespace

TEST_CASE("moe router: group-limited top k equals sorting groups then experts, with the scale") {
  struct Shape {
    int64_t experts, groups, group_topk, topk;
  };
  // n = topk / group_topk best scores per group: 1, 2 and 3 (the integer division included).
  const Shape shapes[] = {{8, 4, 2, 2}, {16, 4, 2, 4}, {16, 8, 3, 6}, {12, 3, 2, 5}, {6, 6, 6, 6}};
  const int64_t rows = 64;
  uint32_t seed = 40;
  for (const Shape& shape : shapes) {
    for (RouterScore score : {RouterScore::kSoftmax, RouterScore::kSigmoid}) {
      for (bool with_bias : {false, true}) {
        for (bool normalize : {false, true}) {
          CAPTURE(shape.experts);
          CAPTURE(shape.groups);
          CAPTURE(static_cast<int>(score));
          CAPTURE(with_bias);
          CAPTURE(normalize);
          const int64_t e = shape.experts, k = shape.topk;
          // Logits on a grid of quarters, so that rows hold tied scores, keys and group scores.
          std::mt19937 gen(++seed);
          std::uniform_int_distribution<int> level(-6, 6);
          std::vector<float> z(static_cast<size_t>(rows * e)), bias(static_cast<size_t>(e));
          for (float& v : z) v = 0.25f * static_cast<float>(level(gen));
          for (float& v : bias) v = 0.125f * static_cast<float>(level(gen) % 3);
          const MoeRouterConfig config{.experts = e,
                                       .topk = k,
                                       .score = score,
                                       .normalize = normalize,
                                       .groups = shape.groups,
                                       .group_topk = shape.group_topk,
                                       .scale = 2.5f};
          std::vector<float> w(rows * k), s(rows * e), counts(e);
          std::vector<int32_t> idx(rows * k);
          const float* b = with_bias ? bias.data() : nullptr;
          MoeRouterForward(w.data(), idx.data(), s.data(), counts.data(), z.data(), b, rows,
                           config);
          std::vector<float> expect_counts(e, 0.0f);
          for (int64_t r = 0; r < rows; ++r) {
            std::vector<int32_t> ref_idx;
            std::vector<float> ref_w;
            ReferenceGroupRouting(ref_idx, ref_w, s.data() + r * e, b, config);
            CAPTURE(r);
            CHECK(std::vector<int32_t>(idx.begin() + r * k, idx.begin() + (r + 1) * k) == ref_idx);
            CHECK(std::vector<float>(w.begin() + r * k, w.begin() + (r + 1) * k) == ref_w);
            for (int32_t x : ref_idx) expect_counts[x] += 1.0f;
          }
          CHECK(counts == expect_counts);
        }
      }
    }
  }
  // Keeping every group is plain top k; keeping fewer changes some rows' choice.
  const int64_t e = 8, k = 2;
  const auto z = Random(rows * e, 49);
  std::vector<float> w0(rows * k), w1(rows * k), s(rows * e), counts(e);
  std::vector<int32_t> i0(rows * k), i1(rows * k);
  MoeRouterForward(w0.data(), i0.data(), s.data(), counts.data(), z.data(), nullptr, rows,
                   MoeRouterConfig{.experts = e, .topk = k});
  MoeRouterForward(w1.data(), i1.data(), s.data(), counts.data(), z.data(), nullptr, rows,
                   MoeRouterConfig{.experts = e, .topk = k, .groups = 4, .group_topk = 1});
  CHECK(i0 != i1);  // one pair kept, the one of largest sum: not always the two best experts
  MoeRouterForward(w1.data(), i1.data(), s.data(), counts.data(), z.data(), nullptr, rows,
                   MoeRouterConfig{.experts = e, .topk = k, .groups = 2, .group_topk = 2});
  CHECK(i0 == i1);
  CHECK(w0 == w1);
}

TEST_CASE("moe router backward: group-limited choice and the scale, by finite differences") {
  const int64_t rows = 6, experts = 8, topk = 2;
  auto z = SeparatedLogits(rows, experts, 13);
  const auto proj = Random(rows * topk, 14);
  const std::vector<float> bias = {0.0f, 0.01f, -0.02f, 0.0f, 0.03f, 0.0f, -0.01f, 0.02f};
  const float aux_scale = 0.7f;
  for (RouterScore score : {RouterScore::kSoftmax, RouterScore::kSigmoid}) {
    for (bool normalize : {false, true}) {
      CAPTURE(static_cast<int>(score));
      CAPTURE(normalize);
      const MoeRouterConfig config{.experts = experts,
                                   .topk = topk,
                                   .score = score,
                                   .normalize = normalize,
                                   .aux_coeff = 5.0f,
                                   .aux_rows = rows,
                                   .groups = 4,
                                   .group_topk = 2,
                                   .scale = 2.5f};
      std::vector<float> w(rows * topk), s(rows * experts), counts(experts);
      std::vector<int32_t> idx(rows * topk);
      MoeRouterForward(w.data(), idx.data(), s.data(), counts.data(), z.data(), bias.data(), rows,
                       config);
      // The scale multiplies the weights of the unscaled router exactly.
      MoeRouterConfig unscaled = config;
      unscaled.scale = 1.0f;
      std::vector<float> w1(rows * topk), s1(rows * experts), c1(experts);
      std::vector<int32_t> i1(rows * topk);
      MoeRouterForward(w1.data(), i1.data(), s1.data(), c1.data(), z.data(), bias.data(), rows,
                       unscaled);
      CHECK(i1 == idx);
      for (int64_t p = 0; p < rows * topk; ++p) CHECK(w[p] == w1[p] * 2.5f);
      CheckRouterBackward("dlogits", z, bias, proj, rows, config, aux_scale);
    }
  }
}

TEST_CASE("moe auxiliary loss: sharded sums add up to the whole batch's loss") {
  const int64_t rows = 8, experts = 4, topk = 2;
  auto z = Random(rows * experts, 21);
  const MoeRouterConfig whole{.experts = experts, .topk = topk, .aux_coeff = 0.01f};
  std::vector<float> w(rows * topk), s(rows * experts), counts(experts);
  std::vector<int32_t> idx(rows * topk);
  MoeRouterForward(w.data(), idx.data(), s.data(), counts.data(), z.data(), nullptr, rows, whole);
  float full = 0;
  MoeAuxLoss(&full, s.data(), counts.data(), rows, whole);
  // Direct formula: E / (k T²) Σ_e count_e Σ_t s_te.
  double expect = 0;
  for (int64_t e = 0; e < experts; ++e) {
    double col = 0;
    for (int64_t r = 0; r < rows; ++r) col += s[r * experts + e];
    expect += counts[e] * col;
  }
  expect *= 0.01 * experts / (topk * rows * rows);
  CHECK(full == doctest::Approx(expect).epsilon(1e-6));
  // Two halves with the counts summed over both (an all-reduce) give the same loss.
  MoeRouterConfig half = whole;
  half.aux_rows = rows;
  std::vector<float> c0(experts), c1(experts), s0(rows / 2 * experts), s1(rows / 2 * experts);
  MoeRouterForward(w.data(), idx.data(), s0.data(), c0.data(), z.data(), nullptr, rows / 2, half);
  MoeRouterForward(w.data(), idx.data(), s1.data(), c1.data(), z.data() + rows / 2 * experts,
                   nullptr, rows / 2, half);
  for (int64_t e = 0; e < experts; ++e) c0[e] += c1[e];
  float sharded = 0;
  MoeAuxLoss(&sharded, s0.data(), c0.data(), rows / 2, half);
  MoeAuxLoss(&sharded, s1.data(), c0.data(), rows / 2, half);
  CHECK(sharded == doctest::Approx(full).epsilon(1e-6));
}

TEST_CASE("moe permute groups tokens by expert; unpermute combines them back") {
  const int64_t rows = 4, dim = 3, experts = 3, topk = 2;
  const std::vector<int32_t> idx = {2, 0, 0, 1, 2, 1, 0, 2};
  auto x = Random(rows * dim, 31);
  std::vector<float> out(rows * topk * dim);
  std::vector<int32_t> map(rows * topk), counts(experts);
  MoePermute(out.data(), map.data(), counts.data(), x.data(), idx.data(), rows, dim, experts, topk);
  CHECK(counts == std::vector<int32_t>{3, 2, 3});
  // Expert 0: tokens 0, 1, 3; expert 1: tokens 1, 2; expert 2: tokens 0, 2, 3.
  CHECK(map == std::vector<int32_t>{5, 0, 1, 3, 6, 4, 2, 7});
  const std::vector<int64_t> token_of_row = {0, 1, 3, 1, 2, 0, 2, 3};
  for (int64_t p = 0; p < rows * topk; ++p)
    for (int64_t c = 0; c < dim; ++c) CHECK(out[p * dim + c] == x[token_of_row[p] * dim + c]);
  // Unpermute with weights 1 sums each token's copies; with weights it is the weighted combine.
  std::vector<float> y(rows * dim, 99.0f);
  MoeUnpermute(y.data(), out.data(), map.data(), nullptr, rows, dim, topk);
  for (int64_t i = 0; i < rows * dim; ++i) CHECK(y[i] == 2 * x[i]);
  const std::vector<float> w = {0.25f, 0.75f, 0.5f, 0.5f, 1.0f, 0.0f, 0.1f, 0.9f};
  MoeUnpermute(y.data(), out.data(), map.data(), w.data(), rows, dim, topk);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < dim; ++c)
      CHECK(y[r * dim + c] == doctest::Approx((w[r * 2] + w[r * 2 + 1]) * x[r * dim + c]));
}

TEST_CASE("moe permute and unpermute backward") {
  const int64_t rows = 5, dim = 4, experts = 3, topk = 2;
  const std::vector<int32_t> idx = {1, 0, 2, 1, 0, 2, 1, 2, 0, 1};
  auto x = Random(rows * dim, 41);
  const auto proj_perm = Random(rows * topk * dim, 42);
  std::vector<float> out(rows * topk * dim);
  std::vector<int32_t> map(rows * topk), counts(experts);
  // Permute: its backward is MoeUnpermute without weights.
  auto permute_loss = [&] {
    MoePermute(out.data(), map.data(), counts.data(), x.data(), idx.data(), rows, dim, experts,
               topk);
    return Dot(out, proj_perm);
  };
  permute_loss();
  std::vector<float> dx(rows * dim);
  MoeUnpermute(dx.data(), proj_perm.data(), map.data(), nullptr, rows, dim, topk);
  CheckGradient("permute dx", x, dx, permute_loss);
  // Unpermute: gradients of the expert rows and of the weights.
  auto expert_out = Random(rows * topk * dim, 43);
  auto w = Random(rows * topk, 44);
  const auto proj = Random(rows * dim, 45);
  std::vector<float> y(rows * dim);
  auto unpermute_loss = [&] {
    MoeUnpermute(y.data(), expert_out.data(), map.data(), w.data(), rows, dim, topk);
    return Dot(y, proj);
  };
  std::vector<float> dexp(rows * topk * dim, 77.0f), dw(rows * topk, 77.0f);
  MoeUnpermuteBackward(dexp.data(), dw.data(), proj.data(), expert_out.data(), map.data(), w.data(),
                       rows, dim, topk);
  CheckGradient("unpermute dx", expert_out, dexp, unpermute_loss);
  CheckGradient("unpermute dweights", w, dw, unpermute_loss);
}

// A capacity factor: MoePermuteKept leaves the dropped pairs (mask 0) out of the permuted rows
// and the counts (row_map -1), and the unpermutes give them nothing; the result equals the
// dropless path with the dropped pairs weighted 0, forward and backward.
TEST_CASE("moe permute of the kept pairs: dropped pairs are not permuted, add nothing") {
  const int64_t rows = 4, dim = 3, experts = 3, topk = 2;
  const std::vector<int32_t> idx = {2, 0, 0, 1, 2, 1, 0, 2};
  // Drop token 3's choice of expert 0, token 2's of expert 1 and both of token 1's choices.
  const std::vector<float> mask = {1, 1, 0, 0, 1, 0, 0, 1};
  auto x = Random(rows * dim, 61);
  const int64_t kept = 4;
  std::vector<float> out((kept + 1) * dim, 99.0f);  // one spare row, left as it is
  std::vector<int32_t> map(rows * topk), counts(experts);
  MoePermuteKept(out.data(), map.data(), counts.data(), x.data(), idx.data(), mask.data(), rows,
                 dim, experts, topk, kept + 1);
  // Expert 0: token 0; expert 1: none; expert 2: tokens 0, 2, 3.
  CHECK(counts == std::vector<int32_t>{1, 0, 3});
  CHECK(map == std::vector<int32_t>{1, 0, -1, -1, 2, -1, -1, 3});
  const std::vector<int64_t> token_of_row = {0, 0, 2, 3};
  for (int64_t p = 0; p < kept; ++p)
    for (int64_t c = 0; c < dim; ++c) CHECK(out[p * dim + c] == x[token_of_row[p] * dim + c]);
  for (int64_t c = 0; c < dim; ++c) CHECK(out[kept * dim + c] == 99.0f);
  // A buffer too small for the kept pairs: nothing is written past it; the counts still say how
  // many there are (the caller refuses the run).
  std::vector<float> small(2 * dim, 7.0f);
  MoePermuteKept(small.data(), map.data(), counts.data(), x.data(), idx.data(), mask.data(), rows,
                 dim, experts, topk, 1);
  CHECK(counts[0] + counts[1] + counts[2] == kept);
  for (int64_t c = 0; c < dim; ++c) CHECK(small[dim + c] == 7.0f);
  MoePermuteKept(out.data(), map.data(), counts.data(), x.data(), idx.data(), mask.data(), rows,
                 dim, experts, topk, kept);
  // Against the dropless path with the dropped pairs' weights 0: the same output, bit for bit.
  const std::vector<float> w = {0.25f, 0.75f, 0.5f, 0.5f, 1.0f, 0.3f, 0.1f, 0.9f};
  std::vector<float> w_kept(w.size());
  for (size_t p = 0; p < w.size(); ++p) w_kept[p] = w[p] * mask[p];
  std::vector<float> all(rows * topk * dim);
  std::vector<int32_t> all_map(rows * topk), all_counts(experts);
  MoePermute(all.data(), all_map.data(), all_counts.data(), x.data(), idx.data(), rows, dim,
             experts, topk);
  std::vector<float> y(rows * dim, 99.0f), y_all(rows * dim);
  MoeUnpermute(y.data(), out.data(), map.data(), w_kept.data(), rows, dim, topk);
  MoeUnpermute(y_all.data(), all.data(), all_map.data(), w_kept.data(), rows, dim, topk);
  CHECK(y == y_all);
  for (int64_t c = 0; c < dim; ++c) CHECK(y[1 * dim + c] == 0.0f);  // token 1: all dropped
  // Without weights (the permute's backward): a dropped pair's row adds nothing.
  MoeUnpermute(y.data(), out.data(), map.data(), nullptr, rows, dim, topk);
  for (int64_t c = 0; c < dim; ++c) {
    CHECK(y[0 * dim + c] == 2 * x[0 * dim + c]);
    CHECK(y[1 * dim + c] == 0.0f);
    CHECK(y[2 * dim + c] == x[2 * dim + c]);
    CHECK(y[3 * dim + c] == x[3 * dim + c]);
  }
}

TEST_CASE("moe permute and unpermute backward with dropped pairs") {
  const int64_t rows = 5, dim = 4, experts = 3, topk = 2;
  const std::vector<int32_t> idx = {1, 0, 2, 1, 0, 2, 1, 2, 0, 1};
  const std::vector<float> mask = {1, 0, 1, 1, 0, 0, 1, 1, 1, 0};
  const int64_t kept = 6;
  auto x = Random(rows * dim, 71);
  const auto proj_perm = Random(kept * dim, 72);
  std::vector<float> out(kept * dim);
  std::vector<int32_t> map(rows * topk), counts(experts);
  // Permute: its backward is MoeUnpermute without weights; the dropped pairs carry no gradient.
  auto permute_loss = [&] {
    MoePermuteKept(out.data(), map.data(), counts.data(), x.data(), idx.data(), mask.data(), rows,
                   dim, experts, topk, kept);
    return Dot(out, proj_perm);
  };
  permute_loss();
  CHECK(counts[0] + counts[1] + counts[2] == kept);
  std::vector<float> dx(rows * dim);
  MoeUnpermute(dx.data(), proj_perm.data(), map.data(), nullptr, rows, dim, topk);
  CheckGradient("kept permute dx", x, dx, permute_loss);
  // Unpermute: gradients of the kept expert rows and of every weight (0 for a dropped pair).
  auto expert_out = Random(kept * dim, 73);
  auto w = Random(rows * topk, 74);
  const auto proj = Random(rows * dim, 75);
  std::vector<float> y(rows * dim);
  auto unpermute_loss = [&] {
    MoeUnpermute(y.data(), expert_out.data(), map.data(), w.data(), rows, dim, topk);
    return Dot(y, proj);
  };
  std::vector<float> dexp(kept * dim, 77.0f), dw(rows * topk, 77.0f);
  MoeUnpermuteBackward(dexp.data(), dw.data(), proj.data(), expert_out.data(), map.data(), w.data(),
                       rows, dim, topk);
  CheckGradient("kept unpermute dx", expert_out, dexp, unpermute_loss);
  CheckGradient("kept unpermute dweights", w, dw, unpermute_loss);
  for (int64_t p = 0; p < rows * topk; ++p)
    if (mask[p] == 0) CHECK(dw[p] == 0.0f);
}

TEST_CASE("grouped linear: one GEMM per group, empty groups skipped; backward") {
  const int64_t in = 5, out = 3, groups = 4;
  const std::vector<int32_t> counts = {3, 0, 4, 1};
  const int64_t rows = 8;
  auto x = Random(rows * in, 51), w = Random(groups * out * in, 52);
  const auto proj = Random(rows * out, 53);
  std::vector<float> y(rows * out);
  GroupedLinearForward(y.data(), x.data(), w.data(), counts.data(), groups, in, out);
  // Each group equals the dense linear layer of its rows, bit for bit.
  int64_t row = 0;
  for (int64_t g = 0; g < groups; ++g) {
    if (counts[g] > 0) {
      std::vector<float> ref(counts[g] * out);
      LinearForward(ref.data(), x.data() + row * in, w.data() + g * out * in, nullptr, counts[g],
                    in, out);
      for (int64_t i = 0; i < counts[g] * out; ++i) CHECK(ref[i] == y[row * out + i]);
    }
    row += counts[g];
  }
  auto loss = [&] {
    GroupedLinearForward(y.data(), x.data(), w.data(), counts.data(), groups, in, out);
    return Dot(y, proj);
  };
  std::vector<float> dx(rows * in, 5.0f), dw(groups * out * in, 0.0f);
  GroupedLinearBackward(dx.data(), dw.data(), proj.data(), x.data(), w.data(), counts.data(),
                        groups, in, out, false);
  CheckGradient("dx", x, dx, loss);
  CheckGradient("dw", w, dw, loss);
  for (int64_t i = 0; i < out * in; ++i) CHECK(dw[out * in + i] == 0.0f);  // the empty group
  auto dx2 = dx;
  GroupedLinearBackward(dx2.data(), nullptr, proj.data(), x.data(), w.data(), counts.data(), groups,
                        in, out, true);
  for (size_t i = 0; i < dx.size(); ++i) CHECK(dx2[i] == doctest::Approx(2 * dx[i]));
}

TEST_CASE(
    "aux-loss-free bias: overloaded experts move down, underloaded up, by the rate; load cleared") {
  std::vector<float> load = {6, 2, 4, 0, 8}, bias = {0.5f, -0.25f, 0, 0.125f, 0};
  MoeExpertBiasUpdate(bias.data(), load.data(), 5, 0.125f);  // mean load 4
  CHECK(bias == std::vector<float>{0.375f, -0.125f, 0, 0.25f, -0.125f});
  CHECK(load == std::vector<float>(5, 0.0f));
  // Picked by score + bias, weighted by the score alone.
  const std::vector<float> logits = {0.0f, 0.1f, 0.2f}, shift = {0.5f, 0.0f, 0.0f};
  std::vector<float> weights(1), scores(3), counts(3);
  std::vector<int32_t> indices(1);
  const MoeRouterConfig config{.experts = 3, .topk = 1, .score = RouterScore::kSigmoid};
  MoeRouterForward(weights.data(), indices.data(), scores.data(), counts.data(), logits.data(),
                   shift.data(), 1, config);
  CHECK(indices[0] == 0);
  CHECK(weights[0] == doctest::Approx(0.5f));
  CHECK(counts == std::vector<float>{1, 0, 0});
}

TEST_CASE(
    "capacity: each expert keeps its heaviest pairs, ties to the earlier; the gradient masked") {
  // 4 rows, top 2 of 3 experts: expert 0 is picked 4 times, capacity 2.
  const std::vector<int32_t> indices = {0, 1, 0, 2, 2, 0, 0, 1};
  const std::vector<float> weights = {0.5f, 0.3f, 0.6f, 0.2f, 0.7f, 0.5f, 0.4f, 0.4f};
  std::vector<float> kept(8), mask(8);
  MoeCapacityForward(kept.data(), mask.data(), weights.data(), indices.data(), 4, 3, 2, 2, false,
                     1);
  // Expert 0: pairs 0 (0.5), 2 (0.6), 5 (0.5), 6 (0.4) -> keeps 2 and 0 (0.5 tie: pair 0 first).
  CHECK(mask == std::vector<float>{1, 1, 1, 1, 1, 0, 0, 1});
  CHECK(kept == std::vector<float>{0.5f, 0.3f, 0.6f, 0.2f, 0.7f, 0, 0, 0.4f});
  std::vector<float> dkept = {1, 2, 3, 4, 5, 6, 7, 8}, dweights(8);
  MoeCapacityBackward(dweights.data(), dkept.data(), mask.data(), 8);
  CHECK(dweights == std::vector<float>{1, 2, 3, 4, 5, 0, 0, 8});
  // Capacity 0 drops everything; a capacity past the load keeps everything.
  MoeCapacityForward(kept.data(), mask.data(), weights.data(), indices.data(), 4, 3, 2, 0, false,
                     1);
  CHECK(mask == std::vector<float>(8, 0.0f));
  MoeCapacityForward(kept.data(), mask.data(), weights.data(), indices.data(), 4, 3, 2, 8, false,
                     1);
  CHECK(kept == weights);
  // By position: expert 0 keeps its first two pairs, 0 and 2, whatever their weights.
  MoeCapacityForward(kept.data(), mask.data(), weights.data(), indices.data(), 4, 3, 2, 2, true, 1);
  CHECK(mask == std::vector<float>{1, 1, 1, 1, 1, 0, 0, 1});
  MoeCapacityForward(kept.data(), mask.data(), weights.data(), indices.data(), 4, 3, 2, 1, true, 1);
  CHECK(mask == std::vector<float>{1, 1, 0, 1, 0, 0, 0, 0});  // each expert its first pair
}

TEST_CASE(
    "capacity in segments: each run of rows chooses on its own pairs, with its own capacity") {
  // The 4 rows of the test above, then 4 more (an Etp group of 2 members, 4 rows each); the
  // second run repeats the first with its weights reversed within each row.
  const std::vector<int32_t> indices = {0, 1, 0, 2, 2, 0, 0, 1, 0, 1, 0, 2, 2, 0, 0, 1};
  const std::vector<float> weights = {0.5f, 0.3f, 0.6f, 0.2f, 0.7f, 0.5f, 0.4f, 0.4f,
                                      0.3f, 0.5f, 0.2f, 0.6f, 0.5f, 0.7f, 0.4f, 0.4f};
  std::vector<float> kept(16), mask(16);
  for (bool position : {false, true}) {
    for (int64_t capacity : {0, 1, 2, 3, 8}) {
      CAPTURE(position);
      CAPTURE(capacity);
      MoeCapacityForward(kept.data(), mask.data(), weights.data(), indices.data(), 8, 3, 2,
                         capacity, position, 2);
      // Each segment equals the kernel run on its rows alone.
      for (int64_t s = 0; s < 2; ++s) {
        std::vector<float> seg_kept(8), seg_mask(8);
        MoeCapacityForward(seg_kept.data(), seg_mask.data(), weights.data() + s * 8,
                           indices.data() + s * 8, 4, 3, 2, capacity, position, 1);
        CHECK(std::vector<float>(mask.begin() + s * 8, mask.begin() + (s + 1) * 8) == seg_mask);
        CHECK(std::vector<float>(kept.begin() + s * 8, kept.begin() + (s + 1) * 8) == seg_kept);
      }
    }
  }
  // Capacity 2 by weight: segment 0 as above; in segment 1 expert 0 holds pairs 8 (0.3), 10 (0.2),
  // 13 (0.7), 14 (0.4) and keeps 13 and 14. One segment of all 8 rows keeps two pairs of each
  // expert in all: expert 0 its pairs 2 and 13, expert 1 pairs 9 and 7, expert 2 pairs 4 and 11.
  MoeCapacityForward(kept.data(), mask.data(), weights.data(), indices.data(), 8, 3, 2, 2, false,
                     2);
  CHECK(mask == std::vector<float>{1, 1, 1, 1, 1, 0, 0, 1, 0, 1, 0, 1, 1, 1, 1, 1});
  MoeCapacityForward(kept.data(), mask.data(), weights.data(), indices.data(), 8, 3, 2, 2, false,
                     1);
  CHECK(mask == std::vector<float>{0, 0, 1, 0, 1, 0, 0, 1, 0, 1, 0, 1, 0, 1, 0, 0});
  // The gradient follows the segments' mask.
  MoeCapacityForward(kept.data(), mask.data(), weights.data(), indices.data(), 8, 3, 2, 1, true, 2);
  CHECK(mask == std::vector<float>{1, 1, 0, 1, 0, 0, 0, 0, 1, 1, 0, 1, 0, 0, 0, 0});
  std::vector<float> dkept(16, 1.0f), dweights(16);
  MoeCapacityBackward(dweights.data(), dkept.data(), mask.data(), 16);
  CHECK(dweights == mask);
}
