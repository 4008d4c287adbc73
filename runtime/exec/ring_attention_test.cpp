// Ring attention over 1, 2 and 4 context-parallel members (threads on the host communicator)
// equals whole-sequence causal attention, forward and backward, for each member's chunks.
#include "runtime/exec/ring_attention.h"

#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "runtime/backends/host/comm/host_communicator.h"
#include "runtime/backends/host/host_backend.h"
#include "runtime/backends/host/kernels/gradient_check.h"
#include "runtime/backends/host/kernels/kernels.h"

namespace paraplan::exec {
namespace {

using host::testing::MaxDiff;
using host::testing::Random;

// The rows of member `member`'s share of a batch-major [micro, seq] tensor of `width` floats a
// row, in its local order (its two chunks of every sequence).
std::vector<float> Share(const std::vector<float>& whole, const RingAttentionShape& s, int cp,
                         int member, int64_t width) {
  const int64_t len = s.seq / (int64_t{2} * cp);
  std::vector<float> part;
  for (int64_t b = 0; b < s.micro; ++b) {
    for (int local = 0; local < 2; ++local) {
      const int64_t first = b * s.seq + RingChunk(member, cp, local) * len;
      part.insert(part.end(), whole.begin() + first * width, whole.begin() + (first + len) * width);
    }
  }
  return part;
}

}  // namespace

TEST_CASE("ring attention over cp members equals whole-sequence attention, forward and backward") {
  for (int cp : {1, 2, 4}) {
    CAPTURE(cp);
    RingAttentionShape s;
    s.micro = 2, s.seq = int64_t{6} * cp, s.heads = 4, s.kv_heads = 2, s.head_dim = 8,
    s.scale = 0.35f;
    const int64_t rows = s.micro * s.seq, qw = s.heads * s.head_dim, kw = s.kv_heads * s.head_dim;
    const auto q = Random(rows * qw, 1), k = Random(rows * kw, 2), v = Random(rows * kw, 3),
               dout = Random(rows * qw, 4);
    const auto layout = host::TokenLayout::BatchMajor(s.seq, s.micro);
    std::vector<float> ref_out(q.size()), ref_lse(rows * s.heads), ref_dq(q.size()),
        ref_dk(k.size()), ref_dv(v.size());
    host::AttentionForward(ref_out.data(), ref_lse.data(), q.data(), k.data(), v.data(), layout,
                           s.heads, s.kv_heads, s.head_dim, s.scale);
    host::AttentionBackward(ref_dq.data(), ref_dk.data(), ref_dv.data(), dout.data(),
                            ref_out.data(), ref_lse.data(), q.data(), k.data(), v.data(), layout,
                            s.heads, s.kv_heads, s.head_dim, s.scale);
    // The reference lse is [micro, heads, seq]; the ring's is [rows, heads].
    std::vector<float> ref_lse_rows(ref_lse.size());
    for (int64_t b = 0; b < s.micro; ++b)
      for (int64_t h = 0; h < s.heads; ++h)
        for (int64_t t = 0; t < s.seq; ++t)
          ref_lse_rows[(b * s.seq + t) * s.heads + h] = ref_lse[(b * s.heads + h) * s.seq + t];

    comm::HostWorld world(cp);
    std::vector<int> members(cp);
    for (int r = 0; r < cp; ++r) members[r] = r;
    std::vector<std::string> errors(cp);
    std::vector<std::vector<float>> outs(cp), lses(cp), dqs(cp), dks(cp), dvs(cp);
    std::vector<std::thread> threads;
    for (int r = 0; r < cp; ++r) {
      threads.emplace_back([&, r] {
        try {
          auto group = world.Join(members, r);
          auto backend = MakeHostBackend();
          const int64_t q_n = s.QElements(cp), kv_n = s.KvElements(cp), lse_n = q_n / s.head_dim;
          const auto lq = Share(q, s, cp, r, qw), lk = Share(k, s, cp, r, kw),
                     lv = Share(v, s, cp, r, kw), ld = Share(dout, s, cp, r, qw);
          std::vector<float> out(q_n), lse(lse_n), ring(8 * kv_n), block_out(q_n), block_lse(lse_n),
              dq(q_n), dk(kv_n), dv(kv_n);
          RingAttentionForward(*backend, *group, s, out.data(), lse.data(), lq.data(), lk.data(),
                               lv.data(), ring.data(), block_out.data(), block_lse.data());
          RingAttentionBackward(*backend, *group, s, dq.data(), dk.data(), dv.data(), ld.data(),
                                out.data(), lse.data(), lq.data(), lk.data(), lv.data(),
                                ring.data());
          outs[r] = out, lses[r] = lse, dqs[r] = dq, dks[r] = dk, dvs[r] = dv;
        } catch (const std::exception& e) {
          errors[r] = e.what();
        }
      });
    }
    for (auto& t : threads) t.join();
    for (int r = 0; r < cp; ++r) {
      CAPTURE(r);
      REQUIRE(errors[r].empty());
      CHECK(MaxDiff(outs[r], Share(ref_out, s, cp, r, qw)) < 1e-5);
      CHECK(MaxDiff(lses[r], Share(ref_lse_rows, s, cp, r, s.heads)) < 1e-5);
      CHECK(MaxDiff(dqs[r], Share(ref_dq, s, cp, r, qw)) < 1e-4);
      CHECK(MaxDiff(dks[r], Share(ref_dk, s, cp, r, kw)) < 1e-4);
      CHECK(MaxDiff(dvs[r], Share(ref_dv, s, cp, r, kw)) < 1e-4);
    }
  }
}

}  // namespace paraplan::exec
