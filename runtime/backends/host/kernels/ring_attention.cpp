// The chunk-pair pieces of ring attention (context parallelism): one query chunk against one
// K/V chunk with the causal mask (and a sliding window's) taken on global positions, the
// log-sum-exp merge of partial results, and the backward of a pair from the final output. Plain
// loops accumulating in double: these run once per chunk pair and are the reference the CUDA
// kernels are checked against.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "runtime/backends/host/kernels/kernels.h"

namespace paraplan::host {

// NOLINTBEGIN(bugprone-easily-swappable-parameters)

namespace {

constexpr double kMinusInf = -std::numeric_limits<double>::infinity();

// Keys of the K/V chunk a query at global position `pos` sees: local positions [lo, n) (lo > 0
// only under a sliding window of `window` keys, which starts at pos - window + 1).
struct KeyRange {
  int64_t lo = 0, n = 0;
};
KeyRange VisibleKeys(int64_t pos, const TokenLayout& kv, int64_t window) {
  const int64_t n = std::clamp<int64_t>(pos - kv.seq_offset + 1, 0, kv.seq);
  const int64_t lo = window > 0 ? std::clamp<int64_t>(pos - window + 1 - kv.seq_offset, 0, n) : 0;
  return {lo, n};
}

double Dot(const float* a, const float* b, int64_t n) {
  double s = 0.0;
  for (int64_t d = 0; d < n; ++d) s += static_cast<double>(a[d]) * b[d];
  return s;
}

}  // namespace

void AttentionBlockForward(float* out, float* lse, const float* q, const float* k, const float* v,
                           const TokenLayout& q_layout, const TokenLayout& kv_layout,
                           int64_t q_heads, int64_t kv_heads, int64_t head_dim, float scale,
                           int64_t window) {
  const int64_t group = q_heads / kv_heads, hd = head_dim;
  std::vector<double> scores(static_cast<size_t>(kv_layout.seq)), acc(static_cast<size_t>(hd));
  for (int64_t b = 0; b < q_layout.batch; ++b) {
    for (int64_t s = 0; s < q_layout.seq; ++s) {
      const int64_t row = q_layout.Row(s, b);
      const auto [lo, n] = VisibleKeys(q_layout.seq_offset + s, kv_layout, window);
      for (int64_t h = 0; h < q_heads; ++h) {
        float* o = out + (row * q_heads + h) * hd;
        const float* qr = q + (row * q_heads + h) * hd;
        const int64_t g = h / group;
        if (lo == n) {
          std::fill(o, o + hd, 0.0f);
          lse[row * q_heads + h] = -std::numeric_limits<float>::infinity();
          continue;
        }
        double mx = kMinusInf;
        for (int64_t j = lo; j < n; ++j) {
          const float* kr = k + (kv_layout.Row(j, b) * kv_heads + g) * hd;
          scores[j] = Dot(qr, kr, hd) * scale;
          mx = std::max(mx, scores[j]);
        }
        double sum = 0.0;
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int64_t j = lo; j < n; ++j) {
          const double p = std::exp(scores[j] - mx);
          sum += p;
          const float* vr = v + (kv_layout.Row(j, b) * kv_heads + g) * hd;
          for (int64_t d = 0; d < hd; ++d) acc[d] += p * vr[d];
        }
        for (int64_t d = 0; d < hd; ++d) o[d] = static_cast<float>(acc[d] / sum);
        lse[row * q_heads + h] = static_cast<float>(mx + std::log(sum));
      }
    }
  }
}

void AttentionMergeBlocks(float* out, float* lse, const float* block_out, const float* block_lse,
                          const TokenLayout& layout, int64_t q_heads, int64_t head_dim) {
  for (int64_t b = 0; b < layout.batch; ++b) {
    for (int64_t s = 0; s < layout.seq; ++s) {
      const int64_t row = layout.Row(s, b);
      for (int64_t h = 0; h < q_heads; ++h) {
        const int64_t i = row * q_heads + h;
        const double a = lse[i], c = block_lse[i];
        if (std::isinf(c) && c < 0) continue;  // the chunk saw nothing
        float* o = out + i * head_dim;
        const float* bo = block_out + i * head_dim;
        if (std::isinf(a) && a < 0) {  // nothing seen before
          std::copy(bo, bo + head_dim, o);
          lse[i] = block_lse[i];
          continue;
        }
        const double m = std::max(a, c);
        const double merged = m + std::log(std::exp(a - m) + std::exp(c - m));
        const double wa = std::exp(a - merged), wc = std::exp(c - merged);
        for (int64_t d = 0; d < head_dim; ++d)
          o[d] = static_cast<float>(wa * o[d] + wc * static_cast<double>(bo[d]));
        lse[i] = static_cast<float>(merged);
      }
    }
  }
}

void AttentionBlockBackward(float* dq, float* dk, float* dv, const float* dout, const float* out,
                            const float* lse, const float* q, const float* k, const float* v,
                            const TokenLayout& q_layout, const TokenLayout& kv_layout,
                            int64_t q_heads, int64_t kv_heads, int64_t head_dim, float scale,
                            int64_t window) {
  const int64_t group = q_heads / kv_heads, hd = head_dim;
  std::vector<double> dq_acc(static_cast<size_t>(hd));
  // Per K/V chunk: dK, dV summed over this call's queries in double, then added once.
  const int64_t kv_rows_elems = kv_layout.batch * kv_layout.seq * kv_heads * hd;
  std::vector<double> dk_acc(static_cast<size_t>(kv_rows_elems), 0.0),
      dv_acc(static_cast<size_t>(kv_rows_elems), 0.0);
  auto kv_index = [&](int64_t j, int64_t b, int64_t g) {
    return ((b * kv_layout.seq + j) * kv_heads + g) * hd;
  };
  for (int64_t b = 0; b < q_layout.batch; ++b) {
    for (int64_t s = 0; s < q_layout.seq; ++s) {
      const int64_t row = q_layout.Row(s, b);
      const auto [lo, n] = VisibleKeys(q_layout.seq_offset + s, kv_layout, window);
      if (lo == n) continue;
      for (int64_t h = 0; h < q_heads; ++h) {
        const int64_t i = row * q_heads + h, g = h / group;
        const float* qr = q + i * hd;
        const float* gr = dout + i * hd;
        const double l = lse[i];
        const double delta = Dot(gr, out + i * hd, hd);
        std::fill(dq_acc.begin(), dq_acc.end(), 0.0);
        for (int64_t j = lo; j < n; ++j) {
          const int64_t kv_row = kv_layout.Row(j, b);
          const float* kr = k + (kv_row * kv_heads + g) * hd;
          const float* vr = v + (kv_row * kv_heads + g) * hd;
          const double p = std::exp(Dot(qr, kr, hd) * scale - l);
          const double ds = p * (Dot(gr, vr, hd) - delta) * scale;
          double* dka = dk_acc.data() + kv_index(j, b, g);
          double* dva = dv_acc.data() + kv_index(j, b, g);
          for (int64_t d = 0; d < hd; ++d) {
            dq_acc[d] += ds * kr[d];
            dka[d] += ds * qr[d];
            dva[d] += p * gr[d];
          }
        }
        float* dqr = dq + i * hd;
        for (int64_t d = 0; d < hd; ++d) dqr[d] += static_cast<float>(dq_acc[d]);
      }
    }
  }
  for (int64_t b = 0; b < kv_layout.batch; ++b) {
    for (int64_t j = 0; j < kv_layout.seq; ++j) {
      const int64_t kv_row = kv_layout.Row(j, b);
      for (int64_t g = 0; g < kv_heads; ++g) {
        const double* dka = dk_acc.data() + kv_index(j, b, g);
        const double* dva = dv_acc.data() + kv_index(j, b, g);
        float* dkr = dk + (kv_row * kv_heads + g) * hd;
        float* dvr = dv + (kv_row * kv_heads + g) * hd;
        for (int64_t d = 0; d < hd; ++d) {
          dkr[d] += static_cast<float>(dka[d]);
          dvr[d] += static_cast<float>(dva[d]);
        }
      }
    }
  }
}

// NOLINTEND(bugprone-easily-swappable-parameters)

}  // namespace paraplan::host
