// The verifier's model of one role's schedule (verify.h): StepView, one schedule op read from
// either form a role holds its schedule in, and RoleStream, the role's listed stream of items in
// segments (runs of listed ops, loop bodies listed once) onto which a rank's position in the
// expanded stream maps, plus the landing-buffer rule checked per role. WorldVerifier
// (verify_world.h) builds one RoleStream per role and reads them in its checks and its
// simulation. Internal to runtime/verify: only the verify*.cpp files include this header.
#ifndef PARAPLAN_RUNTIME_VERIFY_VERIFY_STREAM_H_
#define PARAPLAN_RUNTIME_VERIFY_VERIFY_STREAM_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "runtime/format/program_model.h"
#include "runtime/verify/structure.h"

namespace paraplan::verify::detail {

// A schedule op as the verifier reads it, from either form a role holds its schedule in
// (Role::schedule, or Role::steps on the compiler's writing path): the fields
// prog::DecodeStepAttrs and prog::StepBody give, and a transfer's operand.
struct StepView {
  OpKind kind = OpKind::Forward;
  CommKind comm = CommKind::None;
  int64_t microbatch = -1, chunk = -1, slot = -1, peer = -1, group = 0;
  int64_t body = -1;         // ZeroGrads, ReduceGrads, OptimizerStep, GatherParams
  int32_t operand = -1;      // transfers: the first buffer on the side the kind names; -1: none
  bool one_operand = false;  // transfers: exactly one buffer on that side
};

inline bool IsSend(OpKind kind) {
  return kind == OpKind::SendActivation || kind == OpKind::SendGrad;
}

// The listed schedule ops of a role: its ops, or its steps with every loop body once.
inline size_t ScheduleSize(const Role& role) {
  return role.steps.empty() ? role.schedule.size() : role.steps.size();
}

StepView ViewOf(const prog::ScheduleStep& s);
StepView ViewOf(const Op& op);

// Listed op i (a loop body's op as in its first iteration).
StepView StepAt(const Role& role, size_t i);

// Calls fn(index, view) for every op of the schedule in order, loops expanded (the index is
// the op's position in the expanded schedule).
template <typename Fn>
void ForEachOp(const Role& role, Fn&& fn) {
  if (role.steps.empty()) {
    for (size_t i = 0; i < role.schedule.size(); ++i) fn(i, ViewOf(role.schedule[i]));
    return;
  }
  size_t i = 0;
  prog::mem::ForEachExpandedStep(role.steps, role.loops, prog::mem::ChunkSlots(role),
                                 [&](const prog::ScheduleStep& s) { fn(i++, ViewOf(s)); });
}

// DescribeOp's words for a schedule op.
std::string DescribeStep(const StepView& s);

// --- context parallelism ---
// An op every member of its communicator runs together: a collective, or ring attention, whose
// K/V exchange passes every member of the Cp group in ring order (a compute op with a group).
bool IsGroupCall(const Op& op);
// --- end context parallelism ---

// What the members of a collective must agree on besides its kind and size: the reduction of
// AllReduce / ReduceScatter, the root of Broadcast; -1 for the others.
int64_t CollectiveArgument(const Op& op);

enum class ItemType : uint8_t { kCompute, kP2p, kCollective };

// One schedule-level step of a role's listed stream (a loop body's once); step bodies are
// expanded into their collectives. Positions in the running stream ("virtual" positions, loops
// expanded) are int64 and map onto items through the role's segments.
struct Item {
  int32_t seq = 0;  // in the body's first iteration: p2p: k-th transfer in its direction to/from
                    // that peer; collective: k-th on its kind
  int32_t seq_stride = 0;   // what seq advances by per iteration of its loop
  int32_t schedule_op = 0;  // position in the role's listed schedule
  int32_t body_op = -1;     // position inside the step body (collectives)
  int32_t group_end = 0;    // p2p: one past the last item of its group (listed position)
  int32_t peer = -1;        // p2p: index in the Pp communicator
  ItemType type = ItemType::kCompute;
  bool send = false;
  CommKind comm = CommKind::None;
};
static_assert(sizeof(Item) == 28);

// A run of the stream: listed items [item_begin, item_begin + item_len) once (count 1) or a loop
// body repeated `count` times, at virtual positions [vbegin, vbegin + item_len * count).
struct Segment {
  int64_t vbegin = 0;
  int32_t item_begin = 0, item_len = 0;
  int64_t count = 1;
  int32_t loop = -1;  // index in Role::loops; -1: listed ops
  int64_t op_vbegin = 0;
  int32_t op_begin = 0, op_len = 0;
  int32_t microbatch_stride = 0, slot_stride = 0;
  bool collectives = false;  // the body holds collectives
  // (peer, send?) -> transfers per iteration
  std::map<std::pair<int32_t, bool>, int32_t> per_iteration;
  int64_t vend() const { return vbegin + int64_t{item_len} * count; }
};

// The transfers of one direction within one segment: seq [seq_begin, seq_begin + per * count).
struct P2pRun {
  int64_t seq_begin = 0;
  int32_t segment = 0;
  std::vector<int32_t> items;  // listed items of that direction, in order
};

struct RoleStream {
  std::vector<Item> items;
  std::vector<Segment> segments;
  int64_t length = 0;  // virtual
  // (peer, send?) -> the runs of that direction, in stream order (a few directions per role)
  std::vector<std::pair<std::pair<int32_t, bool>, std::vector<P2pRun>>> p2p_runs;
  std::vector<P2pRun>& Runs(std::pair<int32_t, bool> key) {
    for (auto& [k, runs] : p2p_runs)
      if (k == key) return runs;
    p2p_runs.push_back({key, {}});
    return p2p_runs.back().second;
  }
  std::map<std::pair<int32_t, bool>, int64_t> p2p_count;  // (peer, send?) -> transfers
  std::vector<int32_t> peers;  // the distinct pipeline peers the role's transfers name
  bool loops = false;

  size_t SegmentOf(int64_t v) const {
    size_t lo = 0, hi = segments.size();
    while (hi - lo > 1) {
      const size_t mid = (lo + hi) / 2;
      if (segments[mid].vbegin <= v)
        lo = mid;
      else
        hi = mid;
    }
    return lo;
  }
  // The item at virtual position v (< length) and its iteration.
  struct At {
    const Item* item;
    const Segment* seg;
    int64_t iteration;
    int32_t index;  // listed item
  };
  At Locate(int64_t v) const {
    const Segment& s = segments[SegmentOf(v)];
    const int64_t off = v - s.vbegin;
    if (s.count == 1) {
      const auto index = static_cast<int32_t>(s.item_begin + off);
      return {&items[static_cast<size_t>(index)], &s, 0, index};
    }
    const int64_t it = off / s.item_len;
    const int32_t index = s.item_begin + static_cast<int32_t>(off % s.item_len);
    return {&items[static_cast<size_t>(index)], &s, it, index};
  }
  int64_t Seq(const At& a) const { return a.item->seq + a.iteration * a.item->seq_stride; }
  // Virtual position of the k-th transfer to (send) or from `peer`; -1 when there is none.
  int64_t P2pPos(int32_t peer, bool send, int64_t k) const {
    const std::vector<P2pRun>* runs = nullptr;
    for (const auto& [key, r] : p2p_runs)
      if (key.first == peer && key.second == send) runs = &r;
    if (!runs || k < 0 || runs->empty()) return -1;
    // The last run that begins at or before k (runs are in sequence order).
    auto next = std::upper_bound(runs->begin(), runs->end(), k,
                                 [](int64_t x, const P2pRun& run) { return x < run.seq_begin; });
    if (next == runs->begin()) return -1;
    const P2pRun& run = *(next - 1);
    const Segment& s = segments[static_cast<size_t>(run.segment)];
    const auto per = static_cast<int64_t>(run.items.size());
    if (k >= run.seq_begin + per * s.count) return -1;
    const int64_t off = k - run.seq_begin;
    if (s.count == 1) return s.vbegin + (run.items[static_cast<size_t>(off)] - s.item_begin);
    return s.vbegin + (off / per) * s.item_len +
           (run.items[static_cast<size_t>(off % per)] - s.item_begin);
  }
  // One past the last item of the group at v.
  int64_t GroupEnd(int64_t v) const {
    const At a = Locate(v);
    return v + (a.item->group_end - a.index);
  }
  // The expanded schedule op of the item at v.
  int64_t OpIndex(const At& a) const {
    return a.seg->op_vbegin + a.iteration * a.seg->op_len + (a.item->schedule_op - a.seg->op_begin);
  }
};

// The schedule op of the item at `a`, its microbatch and slot advanced to its iteration.
StepView StepOf(const Role& role, const RoleStream::At& a);

// The body op of a collective item.
const Op& OpOf(const Role& role, const Item& it);

// The bytes a transfer moves or a collective's first input holds (0 for a compute item).
int64_t ItemBytes(const Role& role, const Item& it);

// Landing buffers (runtime/format/README.md): per chunk of one role the buffer (or -1) and the
// microbatch whose activation it holds unread (-1 when none). A receive may not overwrite it
// before that microbatch's forward has copied it out, and a forward of the chunk copies whatever
// it holds: it must hold that forward's microbatch.
class LandingTracker {
 public:
  explicit LandingTracker(const Role& role)
      : buffer_(role.chunks.size(), -1), landed_(role.chunks.size(), -1) {
    for (size_t c = 0; c < role.chunks.size(); ++c)
      buffer_[c] = LandingBuffer(role, role.chunks[c]);
  }
  int32_t buffer(int64_t chunk) const { return buffer_[static_cast<size_t>(chunk)]; }
  // The next op of the role's stream (its chunk in range); a message when it breaks the rule.
  std::string Step(const StepView& op);

 private:
  std::vector<int32_t> buffer_;
  std::vector<int64_t> landed_;
};

// Stash slots (runtime/format/README.md, "Slots"): a (microbatch, chunk) takes its slot at its
// first forward or transfer (a receive into a landing buffer takes none) and holds it through
// its last use (its SendGrad, or its Backward on the first virtual stage) and the rest of that
// op's transfer group. Chunks of one pool share their slot numbers. Nothing may take a slot that
// is held, but for a receive of an activation into a slot of its own chunk freed earlier in its
// own group (the receive writes the chunk's input, the send read its grad); every op of a
// (microbatch, chunk) names the slot it took.
class SlotTracker {
 public:
  explicit SlotTracker(const Role& role);
  // The next op of the role's stream (any op; chunk in range for steps); a message when it
  // breaks the rule.
  std::string Step(const StepView& op);

 private:
  struct Holder {
    int64_t microbatch = -1, chunk = -1;
    uint8_t state = 0;  // 0 free, 1 held, 2 freed inside the current group
  };
  void Flush();

  std::vector<int32_t> region_;              // per chunk: the index of its slots (pool or own)
  std::vector<bool> landing_, first_stage_;  // per chunk
  std::vector<std::vector<Holder>> slots_;   // per region, per slot
  std::map<std::pair<int64_t, int64_t>, int64_t> held_;  // (microbatch, chunk) -> slot
  std::vector<std::pair<int32_t, int64_t>> freed_;       // (region, slot) in state 2
  int64_t group_ = 0;
};

// Boundary buffers kept once per chunk (runtime/format/README.md, "Boundary buffers"): an
// `output` that is not Stash holds one forward's result until its SendActivation, which comes
// before the chunk's next forward; a `grad` that is not Stash holds one microbatch's gradient
// at a time: received (into the grad landing buffer when the chunk has one, which its backward
// copies in), made by the backward, sent before the next backward.
class BoundaryTracker {
 public:
  explicit BoundaryTracker(const Role& role);
  int32_t grad_landing(int64_t chunk) const { return landing_[static_cast<size_t>(chunk)]; }
  // The next op of the role's stream (a step of a chunk in range); a message when it breaks the
  // rule.
  std::string Step(const StepView& op);

 private:
  std::vector<bool> output_single_, grad_single_, receives_, sends_;
  std::vector<int32_t> landing_;
  std::vector<int64_t> output_, landed_, received_, computed_;  // the microbatch held, or -1
};

}  // namespace paraplan::verify::detail

#endif  // PARAPLAN_RUNTIME_VERIFY_VERIFY_STREAM_H_
