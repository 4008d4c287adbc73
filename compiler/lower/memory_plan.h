// The static memory plan of a role: every buffer gets an offset in one arena per rank.
//
// Three regions, in this order:
//   persistent  params and grads (as per-chunk buckets; params are views into them),
//               optimizer state of the local shard, small persistent values; with ZeRO-3 the
//               param shard instead of the param bucket, with ZeRO-2/3 the grad shard instead
//               of the grad bucket (dp · cp > 1)
//   stash       per chunk, a frame of its Stash buffers repeated `slots` times (one slot per
//               in-flight microbatch; slots come from the schedule, see lower.cpp); chunks of
//               one pool (Chunk::pool) share one run of slots, each slot as large as the
//               largest member's frame, every member's frame starting at the slot's start
//   scratch     buffers that live inside one body call; bodies never run at the same time, so
//               all bodies share the region, and inside a body two buffers share bytes when
//               their live ranges (first to last op that touches them) do not overlap. With
//               ZeRO >= 2 (dp · cp > 1) the transient buckets live here too: a layer's full grad
//               bucket from its Fill to its ReduceScatter, and with ZeRO-3 its gathered param
//               bucket from its AllGather to its last use, in each body that uses the layer
// Offsets are aligned to kArenaAlignment. The plan is made twice: for the program's precision
// (Buffer::offset, Role::arena_bytes) and with every floating-point element stored as f32
// (Buffer::fp32_offset, Role::fp32_arena_bytes) for the host backend.
//
// Role::peak_bytes is the exact (unaligned) sum of bytes that are live at the busiest point:
// persistent + every stash slot + the largest high-water mark of any body (scratch and transient
// buckets together).
// Made by Lower after the schedule; read by the verifier, `planc dump`, and the runtime.
#ifndef PARAPLAN_COMPILER_LOWER_MEMORY_PLAN_H_
#define PARAPLAN_COMPILER_LOWER_MEMORY_PLAN_H_

#include <cstdint>
#include <vector>

#include "compiler/lower/program.h"

namespace paraplan::lower {

inline constexpr int64_t kArenaAlignment = 256;

struct MemoryBreakdown {
  int64_t params = 0;           // persistent params: param buckets, or the ZeRO-3 shards
  int64_t grads = 0;            // persistent grads: grad buckets, or the ZeRO-2/3 shards
  int64_t optimizer = 0;        // master + moments of the local shard
  int64_t other = 0;            // small persistent values
  int64_t stash = 0;            // all slots of all chunks
  int64_t scratch = 0;          // largest body high-water mark
  int64_t gathered_params = 0;  // ZeRO-3: largest gathered param buckets live at once in a body
  int64_t full_grads = 0;       // ZeRO-2/3: largest full grad buckets live at once in a body
  int64_t body_peak = 0;        // largest scratch + transient buckets live at one op of a body
  int64_t Total() const { return params + grads + optimizer + other + stash + body_peak; }
};

// Places every buffer of the role (both placements), sets arena_bytes, fp32_arena_bytes and
// peak_bytes. Chunk slots must be final. Returns the exact breakdown for the program's precision.
MemoryBreakdown PlanMemory(Role& role);

// The bytes of one slot of each chunk (its Stash buffers, aligned) in the program's precision.
std::vector<int64_t> StashFrames(const Role& role);

// The breakdown of an already placed role (recomputed from its buffers).
MemoryBreakdown MeasureMemory(const Role& role);

}  // namespace paraplan::lower

#endif  // PARAPLAN_COMPILER_LOWER_MEMORY_PLAN_H_
