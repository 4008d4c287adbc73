// Ring attention's chunk-pair pieces: chunked and merged they equal whole-sequence causal
// attention (forward and backward, in any order of the K/V chunks and with the load-balanced
// chunk assignment), and the backward matches central finite differences of the forward.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <vector>

#include "runtime/backends/host/kernels/gradient_check.h"
#include "runtime/backends/host/kernels/kernels.h"

using namespace paraplan::host;
using paraplan::host::testing::CheckGradient;
using paraplan::host::testing::Dot;
using paraplan::host::testing::MaxDiff;
using paraplan::host::testing::Random;

namespace {

// Chunk c (of length len) of a whole-sequence layout: its layout and its first row.
struct Chunk {
  TokenLayout layout;
  int64_t first_row = 0;
};
Chunk ChunkOf(const TokenLayout& whole, int64_t c, int64_t len) {
  TokenLayout l = whole;
  l.seq = len;
  l.seq_offset = c * len;
  return {l, whole.Row(c * len, 0)};
}

struct Shape {
  int64_t seq, batch, qh, kvh, hd, chunks;
  float scale;
  int64_t window = 0;
};

// The ring's forward over whole-sequence buffers: every query chunk takes the K/V chunks in
// the order `order(qc, step)` and merges them.
void ChunkedForward(std::vector<float>& out, std::vector<float>& lse, const std::vector<float>& q,
                    const std::vector<float>& k, const std::vector<float>& v,
                    const TokenLayout& whole, const Shape& s,
                    const std::function<int64_t(int64_t, int64_t)>& order) {
  const int64_t len = s.seq / s.chunks;
  std::vector<float> block_out(out.size()), block_lse(lse.size());
  std::fill(out.begin(), out.end(), 0.0f);
  std::fill(lse.begin(), lse.end(), -std::numeric_limits<float>::infinity());
  for (int64_t qc = 0; qc < s.chunks; ++qc) {
    const Chunk cq = ChunkOf(whole, qc, len);
    for (int64_t step = 0; step < s.chunks; ++step) {
      const Chunk ck = ChunkOf(whole, order(qc, step), len);
      const int64_t qo = cq.first_row * s.qh, ko = ck.first_row * s.kvh;
      AttentionBlockForward(block_out.data() + qo * s.hd, block_lse.data() + qo,
                            q.data() + qo * s.hd, k.data() + ko * s.hd, v.data() + ko * s.hd,
                            cq.layout, ck.layout, s.qh, s.kvh, s.hd, s.scale, s.window);
      AttentionMergeBlocks(out.data() + qo * s.hd, lse.data() + qo, block_out.data() + qo * s.hd,
                           block_lse.data() + qo, cq.layout, s.qh, s.hd);
    }
  }
}

void ChunkedBackward(std::vector<float>& dq, std::vector<float>& dk, std::vector<float>& dv,
                     const std::vector<float>& dout, const std::vector<float>& out,
                     const std::vector<float>& lse, const std::vector<float>& q,
                     const std::vector<float>& k, const std::vector<float>& v,
                     const TokenLayout& whole, const Shape& s,
                     const std::function<int64_t(int64_t, int64_t)>& order) {
  const int64_t len = s.seq / s.chunks;
  std::fill(dq.begin(), dq.end(), 0.0f);
  std::fill(dk.begin(), dk.end(), 0.0f);
  std::fill(dv.begin(), dv.end(), 0.0f);
  for (int64_t qc = 0; qc < s.chunks; ++qc) {
    const Chunk cq = ChunkOf(whole, qc, len);
    for (int64_t step = 0; step < s.chunks; ++step) {
      const Chunk ck = ChunkOf(whole, order(qc, step), len);
      const int64_t qo = cq.first_row * s.qh, ko = ck.first_row * s.kvh;
      AttentionBlockBackward(dq.data() + qo * s.hd, dk.data() + ko * s.hd, dv.data() + ko * s.hd,
                             dout.data() + qo * s.hd, out.data() + qo * s.hd, lse.data() + qo,
                             q.data() + qo * s.hd, k.data() + ko * s.hd, v.data() + ko * s.hd,
                             cq.layout, ck.layout, s.qh, s.kvh, s.hd, s.scale, s.window);
    }
  }
}

// Without a window, and with sliding windows inside a chunk (3), across chunk boundaries (5)
// and reaching several chunks back (7; chunks of 2).
void CheckChunkedEqualsWhole(int64_t window) {
  const Shape s{8, 2, 4, 2, 8, 4, 0.35f, window};
  const int64_t rows = s.seq * s.batch;
  // K/V chunks in ring order from the query chunk's own (as a CP rank receives them), and in
  // reverse: the merge does not depend on the order beyond rounding.
  const std::function<int64_t(int64_t, int64_t)> orders[] = {
      [&](int64_t qc, int64_t step) { return (qc + s.chunks - step) % s.chunks; },
      [&](int64_t, int64_t step) { return s.chunks - 1 - step; }};
  for (bool seq_major : {true, false}) {
    for (const auto& order : orders) {
      CAPTURE(seq_major);
      const TokenLayout whole = seq_major ? TokenLayout::SeqMajor(s.seq, s.batch)
                                          : TokenLayout::BatchMajor(s.seq, s.batch);
      const auto q = Random(rows * s.qh * s.hd, 1), k = Random(rows * s.kvh * s.hd, 2),
                 v = Random(rows * s.kvh * s.hd, 3), dout = Random(rows * s.qh * s.hd, 4);
      std::vector<float> ref_out(q.size()), ref_lse(s.batch * s.qh * s.seq);
      AttentionForward(ref_out.data(), ref_lse.data(), q.data(), k.data(), v.data(), whole, s.qh,
                       s.kvh, s.hd, s.scale, s.window);
      std::vector<float> out(q.size()), lse(rows * s.qh);
      ChunkedForward(out, lse, q, k, v, whole, s, order);
      CHECK(MaxDiff(out, ref_out) < 1e-5);
      for (int64_t b = 0; b < s.batch; ++b)
        for (int64_t h = 0; h < s.qh; ++h)
          for (int64_t t = 0; t < s.seq; ++t)
            CHECK(std::abs(lse[whole.Row(t, b) * s.qh + h] - ref_lse[(b * s.qh + h) * s.seq + t]) <
                  1e-5);

      std::vector<float> ref_dq(q.size()), ref_dk(k.size()), ref_dv(v.size());
      AttentionBackward(ref_dq.data(), ref_dk.data(), ref_dv.data(), dout.data(), ref_out.data(),
                        ref_lse.data(), q.data(), k.data(), v.data(), whole, s.qh, s.kvh, s.hd,
                        s.scale, s.window);
      std::vector<float> dq(q.size()), dk(k.size()), dv(v.size());
      ChunkedBackward(dq, dk, dv, dout, out, lse, q, k, v, whole, s, order);
      CHECK(MaxDiff(dq, ref_dq) < 1e-4);
      CHECK(MaxDiff(dk, ref_dk) < 1e-4);
      CHECK(MaxDiff(dv, ref_dv) < 1e-4);
    }
  }
}

}  // namespace

TEST_CASE("chunked ring attention equals whole-sequence causal attention, forward and backward") {
  for (int64_t window : {0, 3, 5, 7}) {
    CAPTURE(window);
    CheckChunkedEqualsWhole(window);
  }
}

TEST_CASE("ring attention backward against finite differences of the chunked forward") {
  const Shape s{6, 2, 2, 1, 4, 3, 0.5f};
  const int64_t rows = s.seq * s.batch;
  const TokenLayout whole = TokenLayout::SeqMajor(s.seq, s.batch);
  auto q = Random(rows * s.qh * s.hd, 11), k = Random(rows * s.kvh * s.hd, 12),
       v = Random(rows * s.kvh * s.hd, 13);
  const auto proj = Random(rows * s.qh * s.hd, 14);
  const auto order = [&](int64_t qc, int64_t step) { return (qc + step) % s.chunks; };
  std::vector<float> out(q.size()), lse(rows * s.qh);
  auto loss = [&] {
    ChunkedForward(out, lse, q, k, v, whole, s, order);
    return Dot(out, proj);
  };
  loss();
  std::vector<float> dq(q.size()), dk(k.size()), dv(v.size());
  ChunkedBackward(dq, dk, dv, proj, out, lse, q, k, v, whole, s, order);
  CheckGradient("dq", q, dq, loss);
  CheckGradient("dk", k, dk, loss);
  CheckGradient("dv", v, dv, loss);
}

TEST_CASE("a chunk entirely in a query's future contributes nothing; the merge keeps the rest") {
  const Shape s{4, 1, 1, 1, 2, 2, 1.0f};
  const TokenLayout whole = TokenLayout::SeqMajor(s.seq, s.batch);
  constexpr int64_t kElems = 8, kChunkElems = 4;  // 4 tokens of head_dim 2; 2 per chunk
  const auto q = Random(kElems, 21), k = Random(kElems, 22), v = Random(kElems, 23);
  const Chunk first = ChunkOf(whole, 0, 2), second = ChunkOf(whole, 1, 2);
  std::vector<float> out(4, 1.0f), lse(2, 0.5f), block_out(4), block_lse(2);
  // Queries 0 and 1 against keys 2 and 3: masked out entirely.
  AttentionBlockForward(block_out.data(), block_lse.data(), q.data(), k.data() + kChunkElems,
                        v.data() + kChunkElems, first.layout, second.layout, 1, 1, 2, 1.0f);
  for (float x : block_out) CHECK(x == 0.0f);
  for (float x : block_lse) CHECK((std::isinf(x) && x < 0));
  AttentionMergeBlocks(out.data(), lse.data(), block_out.data(), block_lse.data(), first.layout, 1,
                       2);
  for (float x : out) CHECK(x == 1.0f);
  for (float x : lse) CHECK(x == 0.5f);
  // Backward of a masked pair adds nothing.
  std::vector<float> dq(4, 0.0f), dk(4, 0.0f), dv(4, 0.0f);
  AttentionBlockBackward(dq.data(), dk.data(), dv.data(), q.data(), out.data(), lse.data(),
                         q.data(), k.data() + kChunkElems, v.data() + kChunkElems, first.layout,
                         second.layout, 1, 1, 2, 1.0f);
  for (float x : dq) CHECK(x == 0.0f);
  for (float x : dk) CHECK(x == 0.0f);
  for (float x : dv) CHECK(x == 0.0f);
}
