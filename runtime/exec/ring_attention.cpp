// Ring attention over a context-parallel group (ring_attention.h): the chunk pairs of every
// step run on the backend's AttentionBlockForward / AttentionMergeBlocks /
// AttentionBlockBackward, the transfers on the group's point-to-point calls.
#include "runtime/exec/ring_attention.h"

#include <cmath>
#include <utility>

namespace paraplan::exec {
namespace {

// Local chunk `local` of the buffers: its layout (global offset included) and its first row.
struct LocalChunk {
  TokenLayout layout;
  int64_t first_row = 0;
};

LocalChunk ChunkOf(const RingAttentionShape& s, int member, int cp, int local) {
  const int64_t len = s.seq / (2 * static_cast<int64_t>(cp));
  TokenLayout l;
  l.seq = len;
  l.batch = s.micro;
  l.seq_stride = 1;
  l.batch_stride = 2 * len;
  l.seq_offset = RingChunk(member, cp, local) * len;
  return {l, local * len};
}

// Whether no query of chunk cq sees a key of chunk ck: ck lies wholly in cq's future, or wholly
// before the sliding window of cq's first query (window > 0).
bool Unseen(const LocalChunk& cq, const LocalChunk& ck, int64_t window) {
  const int64_t q0 = cq.layout.seq_offset, k0 = ck.layout.seq_offset;
  return k0 > q0 || (window > 0 && k0 + ck.layout.seq - 1 < q0 - window + 1);
}

// Sends `count` floats of `send` to the next member and receives as many from the previous one.
void Pass(comm::Communicator& group, const float* send, float* recv, int64_t count) {
  const int cp = group.Size(), me = group.Rank();
  group.GroupBegin();
  group.Send(send, count, comm::DType::kF32, (me + 1) % cp);
  group.Recv(recv, count, comm::DType::kF32, (me + cp - 1) % cp);
  group.GroupEnd();
}

}  // namespace

void RingAttentionForward(Backend& backend, comm::Communicator& group,
                          const RingAttentionShape& shape, float* out, float* lse, const float* q,
                          const float* k, const float* v, float* ring, float* block_out,
                          float* block_lse) {
  const int cp = group.Size(), me = group.Rank();
  const int64_t q_n = shape.QElements(cp), kv_n = shape.KvElements(cp);
  const int64_t rows = q_n / (shape.heads * shape.head_dim);
  const int64_t hd = shape.head_dim;
  backend.Fill(out, q_n, 0.0f);
  backend.Fill(lse, rows * shape.heads, -INFINITY);
  float* cur = ring;
  float* next = ring + 2 * kv_n;
  backend.Copy(cur, k, kv_n);
  backend.Copy(cur + kv_n, v, kv_n);
  for (int step = 0; step < cp; ++step) {
    const int source = (me + cp - step) % cp;
    // The next step's K/V are on their way while this step computes (NCCL); the host's sends are
    // buffered, so the order does not deadlock.
    if (step + 1 < cp) Pass(group, cur, next, 2 * kv_n);
    for (int qc = 0; qc < 2; ++qc) {
      const LocalChunk cq = ChunkOf(shape, me, cp, qc);
      const int64_t qo = cq.first_row * shape.heads;
      for (int kc = 0; kc < 2; ++kc) {
        const LocalChunk ck = ChunkOf(shape, source, cp, kc);
        if (Unseen(cq, ck, shape.window)) continue;
        const int64_t ko = ck.first_row * shape.kv_heads * hd;
        backend.AttentionBlockForward(block_out + qo * hd, block_lse + qo, q + qo * hd, cur + ko,
                                      cur + kv_n + ko, cq.layout, ck.layout, shape.heads,
                                      shape.kv_heads, hd, shape.scale, shape.window);
        backend.AttentionMergeBlocks(out + qo * hd, lse + qo, block_out + qo * hd, block_lse + qo,
                                     cq.layout, shape.heads, hd);
      }
    }
    std::swap(cur, next);
  }
}

void RingAttentionBackward(Backend& backend, comm::Communicator& group,
                           const RingAttentionShape& shape, float* dq, float* dk, float* dv,
                           const float* dout, const float* out, const float* lse, const float* q,
                           const float* k, const float* v, float* ring) {
  const int cp = group.Size(), me = group.Rank();
  const int64_t q_n = shape.QElements(cp), kv_n = shape.KvElements(cp);
  const int64_t hd = shape.head_dim;
  // Each half of the ring: K, V, and the dK, dV accumulated for them so far.
  float* cur = ring;
  float* next = ring + 4 * kv_n;
  backend.Copy(cur, k, kv_n);
  backend.Copy(cur + kv_n, v, kv_n);
  backend.Fill(cur + 2 * kv_n, 2 * kv_n, 0.0f);
  backend.Fill(dq, q_n, 0.0f);
  for (int step = 0; step < cp; ++step) {
    const int source = (me + cp - step) % cp;
    for (int qc = 0; qc < 2; ++qc) {
      const LocalChunk cq = ChunkOf(shape, me, cp, qc);
      const int64_t qo = cq.first_row * shape.heads;
      for (int kc = 0; kc < 2; ++kc) {
        const LocalChunk ck = ChunkOf(shape, source, cp, kc);
        if (Unseen(cq, ck, shape.window)) continue;
        const int64_t ko = ck.first_row * shape.kv_heads * hd;
        backend.AttentionBlockBackward(dq + qo * hd, cur + 2 * kv_n + ko, cur + 3 * kv_n + ko,
                                       dout + qo * hd, out + qo * hd, lse + qo, q + qo * hd,
                                       cur + ko, cur + kv_n + ko, cq.layout, ck.layout, shape.heads,
                                       shape.kv_heads, hd, shape.scale, shape.window);
      }
    }
    if (step + 1 < cp) {
      Pass(group, cur, next, 4 * kv_n);
      std::swap(cur, next);
    }
  }
  // cur now holds the gradients of member me + 1's K/V: one more pass brings everyone's home.
  if (cp > 1) {
    Pass(group, cur + 2 * kv_n, next + 2 * kv_n, 2 * kv_n);
    cur = next;
  }
  backend.Copy(dk, cur + 2 * kv_n, kv_n);
  backend.Copy(dv, cur + 3 * kv_n, kv_n);
}

}  // namespace paraplan::exec
