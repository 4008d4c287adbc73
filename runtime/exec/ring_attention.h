// Ring attention: causal attention of a context-parallel group, each member holding two of the
// 2·cp chunks of every sequence (load-balanced: member r holds chunks r and 2·cp-1-r), with the
// K/V chunks passed around the group (member r sends to r+1 and receives from r-1).
//
// Buffers are the backend's, batch-major: [micro, 2·chunk] rows, local position p < chunk being
// global position r·chunk + p, and p >= chunk being (2·cp-1-r)·chunk + p - chunk. q, out and dq
// hold rows × heads × head_dim; k, v, dk, dv rows × kv_heads × head_dim; lse rows × heads.
// `ring` is the double-buffered room for what travels: 4 · kv_elements floats forward (K and V,
// twice), 8 · kv_elements backward (K, V, dK, dV, twice); block_out and block_lse have the sizes
// of out and lse. Forward: cp-1 transfers of K/V; backward: cp-1 of K, V, dK, dV, then one of
// dK, dV back to their owner. Results are written; the chunk pairs are taken in a fixed order,
// so runs are deterministic.
//
// Made by: this file. Read by: the handlers of RingAttention and RingAttentionBackward
// (rank_ops.cpp) and their tests.
#ifndef PARAPLAN_RUNTIME_EXEC_RING_ATTENTION_H_
#define PARAPLAN_RUNTIME_EXEC_RING_ATTENTION_H_

#include <cstdint>

#include "runtime/comm/communicator.h"
#include "runtime/exec/backend.h"

namespace paraplan::exec {

struct RingAttentionShape {
  int64_t micro = 1;     // sequences in the buffers
  int64_t seq = 1;       // global sequence length, a multiple of 2·cp
  int64_t heads = 1;     // query heads on this rank
  int64_t kv_heads = 1;  // K/V heads on this rank (heads is a multiple)
  int64_t head_dim = 1;
  float scale = 1.0f;
  int64_t window = 0;  // sliding window in keys (0 = every earlier key)
  // Elements of this rank's share of q (and out, dq) and of k (and v, dk, dv).
  int64_t QElements(int cp) const { return micro * (seq / cp) * heads * head_dim; }
  int64_t KvElements(int cp) const { return micro * (seq / cp) * kv_heads * head_dim; }
};

// The global chunk that local chunk `local` (0 or 1) of member `member` holds.
inline int64_t RingChunk(int member, int cp, int local) {
  return local == 0 ? member : 2 * static_cast<int64_t>(cp) - 1 - member;
}

void RingAttentionForward(Backend& backend, comm::Communicator& group,
                          const RingAttentionShape& shape, float* out, float* lse, const float* q,
                          const float* k, const float* v, float* ring, float* block_out,
                          float* block_lse);

void RingAttentionBackward(Backend& backend, comm::Communicator& group,
                           const RingAttentionShape& shape, float* dq, float* dk, float* dv,
                           const float* dout, const float* out, const float* lse, const float* q,
                           const float* k, const float* v, float* ring);

}  // namespace paraplan::exec

#endif  // PARAPLAN_RUNTIME_EXEC_RING_ATTENTION_H_
