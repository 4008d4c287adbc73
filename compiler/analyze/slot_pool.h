// Stash slots shared by the chunks of one pipeline rank (a slot pool).
//
// Under the interleaved schedule each chunk of a rank stashes the microbatches it has in flight,
// and the chunks reach their most in flight at different times: chunk 0's microbatches wait
// longest for their backward, the last chunk's shortest. Slots kept per chunk sum the chunks'
// separate maxima (p = 8, v = 5 on the first rank: 63 microbatches); one pool of slots shared by
// the chunks needs only the most in flight on the rank at once (47, Megatron's warm-up plus one),
// as PyTorch's allocator gives Megatron. Every slot of a pool is as large as its largest chunk's
// frame (the stashed buffers of one microbatch), so chunks with a much larger frame (the loss
// chunk's logits) are better kept on their own: ChooseSlotPool prices the choices.
//
// A schedule held in loop form (program format 4) names each step's slot as
// `(slot + i * slot_stride) mod slots`: the slots of a pool must advance by one stride per
// period of the steady state. AssignPoolSlots therefore gives every microbatch of a chunk the
// slot `(offset[chunk, mb mod period] + (mb / period) * stride) mod slots` (modulo allocation,
// as rotating register files do for software-pipelined loops), searching the fewest slots from
// the peak up and the stride for which one offset per class avoids every conflict. In practice
// it needs the peak or one or two slots more.
//
// Made by slot_pool.cpp; read by compiler/lower (AssignSlots) and the arena model
// (memory_arena.cpp), so that `check` and `compile` count the same slots.
#ifndef PARAPLAN_COMPILER_ANALYZE_SLOT_POOL_H_
#define PARAPLAN_COMPILER_ANALYZE_SLOT_POOL_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

namespace paraplan {

// One microbatch of one chunk holding a stash slot: from its first slotted op (`take`, a
// position in the rank's schedule) through `release` (the last position its slot is busy: the
// end of the transfer group of its last use). A use that takes its slot at a receive of an
// activation (`recv_take`) may take a slot of its own chunk that a use freed earlier in the same
// group (`free`: the position of that use's last op; the receive writes the chunk's input, the
// send of the grad reads only its grad).
struct SlotUse {
  int32_t chunk = 0;
  int64_t microbatch = 0;
  int64_t take = 0, free = 0, release = 0;
  bool recv_take = false;
};

// Whether `later` (taken at or after `earlier`'s take) may not share a slot with `earlier`.
bool SlotsConflict(const SlotUse& earlier, const SlotUse& later);

// The most uses busy at one position: no assignment has fewer slots.
int32_t PeakSlots(const std::vector<SlotUse>& uses);

struct PoolSlots {
  int32_t slots = 0;             // the pool's slot count
  int32_t stride = 0;            // slot advance per period
  std::vector<int32_t> slot_of;  // per use, its slot
};

// A modulo assignment of `uses` (chunks' microbatches) to at most `max_slots` slots, classes
// (chunk, microbatch mod `period`) advancing by one stride per period; nullopt when none is
// found. Deterministic: the same uses give the same slots.
std::optional<PoolSlots> AssignPoolSlots(const std::vector<SlotUse>& uses, int32_t period,
                                         int32_t max_slots);

// The uses of the chunks `pooled` names, in their order in `uses`.
std::vector<SlotUse> PooledUses(const std::vector<SlotUse>& uses, const std::vector<bool>& pooled);

struct PoolChoice {
  std::vector<bool> pooled;  // per chunk: in the pool (at least two chunks are)
  PoolSlots slots;           // of the pool's uses (PooledUses), as `solve` gave them
  int64_t bytes = 0;         // the stash of every chunk: the pool's and the others'
};

// Gives the slots of a pool of the chunks `pooled` names, at most `max_slots` of them, or
// nullopt (AssignPoolSlots on their uses; the arena model counts them only).
using SolvePool =
    std::function<std::optional<PoolSlots>(const std::vector<bool>& pooled, int32_t max_slots)>;

// The cheapest pool of the chunks, by stash bytes: `frames[c]` one slot of chunk c, `own[c]`
// its slot count kept on its own. Candidates leave out the chunks of the largest frames, one
// frame size at a time; nullopt when no pool is cheaper than every chunk on its own.
std::optional<PoolChoice> ChooseSlotPool(const std::vector<int64_t>& frames,
                                         const std::vector<int32_t>& own, const SolvePool& solve);

}  // namespace paraplan

#endif  // PARAPLAN_COMPILER_ANALYZE_SLOT_POOL_H_
