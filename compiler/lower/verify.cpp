// Whole-world verification (see verify.h).
#include "compiler/lower/verify.h"

#include <fmt/format.h>

#include <algorithm>
#include <deque>
#include <limits>
#include <map>
#include <unordered_map>

#include "runtime/format/ops.h"
#include "runtime/format/program_model.h"

namespace paraplan::lower {

std::string DescribeOp(const Op& op) {
  const prog::StepAttrs s = prog::DecodeStepAttrs(op);
  switch (op.kind) {
    case OpKind::Forward:
    case OpKind::Backward:
      return fmt::format("{}(microbatch {}, chunk {})", OpName(op.kind), s.microbatch, s.chunk);
    case OpKind::SendActivation:
    case OpKind::RecvActivation:
    case OpKind::SendGrad:
    case OpKind::RecvGrad:
      return fmt::format("{}(microbatch {}, chunk {}, peer {})", OpName(op.kind), s.microbatch,
                         s.chunk, s.peer);
    default:
      if (op.kind == OpKind::AllReduce || op.kind == OpKind::ReduceScatter) {
        const prog::ReduceOp r = op.kind == OpKind::AllReduce
                                     ? prog::DecodeAttrs<prog::attrs::AllReduce>(op).reduce_op
                                     : prog::DecodeAttrs<prog::attrs::ReduceScatter>(op).reduce_op;
        return fmt::format("{}[{}, {}]", OpName(op.kind), CommName(op.comm),
                           r == prog::ReduceOp::kMax   ? "max"
                           : r == prog::ReduceOp::kAvg ? "avg"
                                                       : "sum");
      }
      if (IsCollective(op.kind)) return fmt::format("{}[{}]", OpName(op.kind), CommName(op.comm));
      return std::string(OpName(op.kind));
  }
}

namespace {

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

bool IsSend(OpKind kind) { return kind == OpKind::SendActivation || kind == OpKind::SendGrad; }

// The listed schedule ops of a role: its ops, or its steps with every loop body once.
size_t ScheduleSize(const Role& role) {
  return role.steps.empty() ? role.schedule.size() : role.steps.size();
}

StepView ViewOf(const prog::ScheduleStep& s) {
  StepView v;
  v.kind = s.kind();
  v.comm = s.comm();
  const bool p2p = IsP2p(v.kind);
  if (p2p || v.kind == OpKind::Forward || v.kind == OpKind::Backward) {
    v.microbatch = s.microbatch(), v.chunk = s.chunk(), v.slot = s.slot();
    if (p2p) v.peer = s.peer(), v.group = s.group(), v.operand = s.operand(), v.one_operand = true;
  }
  if (v.kind == OpKind::ZeroGrads || v.kind == OpKind::ReduceGrads ||
      v.kind == OpKind::OptimizerStep || v.kind == OpKind::GatherParams)
    v.body = s.operand();
  return v;
}

StepView ViewOf(const Op& op) {
  StepView v;
  const prog::StepAttrs a = prog::DecodeStepAttrs(op);
  v.kind = op.kind;
  v.comm = op.comm;
  v.microbatch = a.microbatch, v.chunk = a.chunk, v.slot = a.slot, v.peer = a.peer,
  v.group = a.group;
  v.body = prog::StepBody(op);
  if (IsP2p(op.kind)) {
    const auto& operands = IsSend(op.kind) ? op.inputs : op.outputs;
    v.operand = operands.empty() ? -1 : operands[0];
    v.one_operand = operands.size() == 1;
  }
  return v;
}

// Listed op i (a loop body's op as in its first iteration).
StepView StepAt(const Role& role, size_t i) {
  return role.steps.empty() ? ViewOf(role.schedule[i]) : ViewOf(role.steps[i]);
}

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
std::string DescribeStep(const StepView& s) {
  switch (s.kind) {
    case OpKind::Forward:
    case OpKind::Backward:
      return fmt::format("{}(microbatch {}, chunk {})", OpName(s.kind), s.microbatch, s.chunk);
    case OpKind::SendActivation:
    case OpKind::RecvActivation:
    case OpKind::SendGrad:
    case OpKind::RecvGrad:
      return fmt::format("{}(microbatch {}, chunk {}, peer {})", OpName(s.kind), s.microbatch,
                         s.chunk, s.peer);
    default:
      return std::string(OpName(s.kind));
  }
}

// --- context parallelism ---
// An op every member of its communicator runs together: a collective, or ring attention, whose
// K/V exchange passes every member of the Cp group in ring order (a compute op with a group).
bool IsGroupCall(const Op& op) {
  return IsCollective(op.kind) ||
         ((op.kind == OpKind::RingAttention || op.kind == OpKind::RingAttentionBackward) &&
          op.comm == CommKind::Cp);
}
// --- end context parallelism ---

// What the members of a collective must agree on besides its kind and size: the reduction of
// AllReduce / ReduceScatter, the root of Broadcast; -1 for the others.
int64_t CollectiveArgument(const Op& op) {
  switch (op.kind) {
    case OpKind::AllReduce:
      return static_cast<int64_t>(prog::DecodeAttrs<prog::attrs::AllReduce>(op).reduce_op);
    case OpKind::ReduceScatter:
      return static_cast<int64_t>(prog::DecodeAttrs<prog::attrs::ReduceScatter>(op).reduce_op);
    case OpKind::Broadcast:
      return prog::DecodeAttrs<prog::attrs::Broadcast>(op).root;
    default:
      return -1;
  }
}

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
StepView StepOf(const Role& role, const RoleStream::At& a) {
  StepView v = StepAt(role, static_cast<size_t>(a.item->schedule_op));
  if (a.iteration > 0 && v.microbatch >= 0) {
    v.microbatch += a.iteration * a.seg->microbatch_stride;
    const int32_t slots = v.chunk >= 0 && v.chunk < static_cast<int64_t>(role.chunks.size())
                              ? role.chunks[static_cast<size_t>(v.chunk)].slots
                              : 1;
    if (slots > 0) v.slot = (v.slot + a.iteration * a.seg->slot_stride) % slots;
  }
  return v;
}

// The body op of a collective item.
const Op& OpOf(const Role& role, const Item& it) {
  return role.bodies[StepAt(role, it.schedule_op).body].ops[it.body_op];
}

// The bytes a transfer moves or a collective's first input holds (0 for a compute item).
int64_t ItemBytes(const Role& role, const Item& it) {
  if (it.type == ItemType::kP2p) {
    const int32_t b = StepAt(role, it.schedule_op).operand;
    return b < 0 ? 0 : role.buffers[b].bytes;
  }
  if (it.type != ItemType::kCollective) return 0;
  const Op& op = OpOf(role, it);
  return op.inputs.empty() ? 0 : role.buffers[op.inputs[0]].bytes;
}

// The state of the rendezvous simulation (WorldVerifier::Simulate).
struct Rendezvous {
  std::vector<int64_t> pos;        // per rank: its next item (virtual)
  std::vector<int64_t> limit;      // per rank: the position it may not pass in this round
  std::vector<int64_t> head_end;   // per rank: one past its head group (its posted transfers)
  std::vector<int64_t> arrived;    // per communicator: members at its current collective
  std::vector<int64_t> completed;  // per communicator: collectives done
  std::vector<uint8_t> counted;    // rank has registered its arrival at its head collective
  std::vector<uint8_t> queued;     // rank is in the queue
  std::deque<int32_t> queue;       // ranks to advance
  std::vector<int32_t> pp_index;   // per rank: its position in its pipeline communicator
  int64_t ops = 0, transfers = 0, collectives = 0;
};

// What advancing a rank (or entering a collective) did.
enum class Progress : uint8_t { kWaiting, kMoved, kFailed };

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
  std::string Step(const StepView& op) {
    const auto c = static_cast<size_t>(op.chunk);
    if (buffer_[c] < 0) return {};
    std::string error;
    if (op.kind == OpKind::Forward) {
      if (landed_[c] != op.microbatch)
        error = landed_[c] < 0
                    ? "the chunk's landing buffer holds no received activation"
                    : fmt::format("the chunk's landing buffer holds microbatch {}", landed_[c]);
      landed_[c] = -1;
    } else if (op.kind == OpKind::RecvActivation) {
      if (landed_[c] >= 0)
        error = fmt::format(
            "overwrites the chunk's landing buffer before microbatch {} is read by its forward",
            landed_[c]);
      landed_[c] = op.microbatch;
    }
    return error;
  }

 private:
  std::vector<int32_t> buffer_;
  std::vector<int64_t> landed_;
};

class WorldVerifier {
 public:
  WorldVerifier(const Program& p, VerifyStats* stats, size_t max_errors)
      : p_(p), stats_(stats), max_errors_(max_errors) {}

  std::vector<std::string> Run() {
    errors_ = VerifyStructure(p_);
    if (!errors_.empty()) return Trim();
    for (size_t r = 0; r < p_.roles.size(); ++r) CheckRole(static_cast<int32_t>(r));
    CheckHomogeneousKinds();
    if (!errors_.empty()) return Trim();
    BuildStreams();
    if (!errors_.empty()) return Trim();
    CheckTransferCounts();
    if (!errors_.empty()) return Trim();
    Simulate();
    return Trim();
  }

 private:
  bool Full() const { return errors_.size() >= max_errors_; }
  void Error(std::string e) {
    if (!Full()) errors_.push_back(std::move(e));
  }
  std::vector<std::string> Trim() {
    if (errors_.size() > max_errors_) errors_.resize(max_errors_);
    return errors_;
  }

  std::string Where(int32_t rank, int64_t v) const {
    const Role& role = p_.roles[p_.ranks[rank].role];
    const RoleStream& st = StreamOf(rank);
    const RoleStream::At a = st.Locate(v);
    const StepView s = StepOf(role, a);
    if (a.item->type == ItemType::kCollective)
      return fmt::format("rank {} ({}) op #{} {} / {}", rank, role.name, st.OpIndex(a),
                         OpName(s.kind), DescribeOp(OpOf(role, *a.item)));
    return fmt::format("rank {} ({}) op #{} {}", rank, role.name, st.OpIndex(a), DescribeStep(s));
  }

  // Occurrence counts and order of forward / backward per (microbatch, chunk), and transfer
  // operands, on one role (every rank of the role runs this stream). Loops are expanded one op
  // at a time: the counts cover every microbatch of every iteration.
  void CheckRole(int32_t ri) {
    const Role& role = p_.roles[ri];
    int64_t m = p_.train.microbatches;
    int64_t nc = static_cast<int64_t>(role.chunks.size());
    if (m < 1) {
      Error(fmt::format("{}: {} microbatches per step", role.name, m));
      return;
    }
    // Per (microbatch, chunk): forward and backward counts and their first ops.
    std::vector<int32_t> fwd_count(m * nc, 0), bwd_count(m * nc, 0);
    std::vector<int64_t> fwd_first(m * nc, -1), bwd_first(m * nc, -1);
    LandingTracker landing(role);
    ForEachOp(role, [&](size_t i, const StepView& op) {
      bool compute = op.kind == OpKind::Forward || op.kind == OpKind::Backward;
      if (!compute && !IsP2p(op.kind)) return;
      int64_t mb = op.microbatch, c = op.chunk;
      if (mb < 0 || mb >= m) {
        Error(fmt::format("{} op #{} {}: microbatch outside [0, {})", role.name, i,
                          DescribeStep(op), m));
        return;
      }
      if (c < 0 || c >= nc) return;
      if (const std::string e = landing.Step(op); !e.empty())
        Error(fmt::format("{} op #{} {}: {}", role.name, i, DescribeStep(op), e));
      if (compute) {
        auto& count = op.kind == OpKind::Forward ? fwd_count : bwd_count;
        auto& first = op.kind == OpKind::Forward ? fwd_first : bwd_first;
        if (count[mb * nc + c]++ == 0) first[mb * nc + c] = static_cast<int64_t>(i);
        return;
      }
      const Chunk& ch = role.chunks[c];
      int32_t expect = op.kind == OpKind::SendActivation ? ch.output
                       : op.kind == OpKind::RecvActivation
                           ? (landing.buffer(c) >= 0 ? landing.buffer(c) : ch.input)
                           : ch.grad;
      if (expect < 0 || !op.one_operand || op.operand != expect)
        Error(fmt::format("{} op #{} {}: must name the chunk's {} buffer", role.name, i,
                          DescribeStep(op),
                          op.kind == OpKind::SendActivation   ? "output"
                          : op.kind == OpKind::RecvActivation ? "input"
                                                              : "grad"));
      if (op.comm != CommKind::Pp)
        Error(fmt::format("{} op #{} {}: a pipeline transfer must use the pp communicator",
                          role.name, i, DescribeStep(op)));
    });
    auto ranks_of = [&](int32_t role_index) {
      std::string out;
      int n = 0;
      for (size_t r = 0; r < p_.ranks.size() && n < 4; ++r)
        if (p_.ranks[r].role == role_index) out += (n++ ? ", " : "") + std::to_string(r);
      return out + (n == 4 ? ", ..." : "");
    };
    // The ops of (mb, c) in one direction, for a message (a second pass, only on errors).
    auto list = [&](int64_t mb, int64_t c, bool backward) {
      std::string s;
      ForEachOp(role, [&](size_t i, const StepView& op) {
        if (op.kind == (backward ? OpKind::Backward : OpKind::Forward) && op.microbatch == mb &&
            op.chunk == c)
          s += (s.empty() ? "#" : ", #") + std::to_string(i);
      });
      return s;
    };
    for (int64_t mb = 0; mb < m && !Full(); ++mb)
      for (int64_t c = 0; c < nc; ++c) {
        const int32_t f = fwd_count[mb * nc + c], b = bwd_count[mb * nc + c];
        if (f != 1)
          Error(fmt::format(
              "ranks {} ({}): microbatch {} of chunk {} runs forward {} times{}; it must run "
              "exactly once",
              ranks_of(ri), role.name, mb, c, f,
              f == 0 ? "" : " (ops " + list(mb, c, false) + ")"));
        if (b != 1)
          Error(fmt::format(
              "ranks {} ({}): microbatch {} of chunk {} runs backward {} times{}; it must run "
              "exactly once",
              ranks_of(ri), role.name, mb, c, b, b == 0 ? "" : " (ops " + list(mb, c, true) + ")"));
        if (f == 1 && b == 1 && bwd_first[mb * nc + c] < fwd_first[mb * nc + c])
          Error(fmt::format(
              "ranks {} ({}): microbatch {} of chunk {} runs backward (op #{}) before "
              "forward (op #{})",
              ranks_of(ri), role.name, mb, c, bwd_first[mb * nc + c], fwd_first[mb * nc + c]));
      }
  }

  // Collectives inside forward/backward bodies are not simulated one by one: within every
  // group of a kind they use, all members must issue the same sequence of them (the compute
  // order of their schedule, and per computation the body's collectives of that kind). Members
  // of one role trivially do; members of different roles are compared.
  std::vector<std::string> BodySignature(int32_t role_index, CommKind kind) const {
    const Role& role = p_.roles[role_index];
    std::vector<std::string> sig;
    ForEachOp(role, [&](size_t, const StepView& op) {
      if (op.kind != OpKind::Forward && op.kind != OpKind::Backward) return;
      const Chunk& c = role.chunks[op.chunk];
      const Body& body = role.bodies[op.kind == OpKind::Forward ? c.forward : c.backward];
      for (const Op& bop : body.ops)
        if (IsGroupCall(bop) && bop.comm == kind)
          sig.push_back(fmt::format(
              "{} of {} in {}: {} bytes, op {}", DescribeOp(bop), DescribeStep(op), body.name,
              bop.inputs.empty() ? 0 : role.buffers[bop.inputs[0]].bytes, CollectiveArgument(bop)));
    });
    return sig;
  }

  void CheckHomogeneousKinds() {
    std::vector<bool> used(prog::kCommKinds, false);
    for (const Role& role : p_.roles)
      for (const Chunk& c : role.chunks)
        for (int32_t bi : {c.forward, c.backward})
          for (const Op& op : role.bodies[bi].ops)
            if (IsGroupCall(op)) used[static_cast<int>(op.comm)] = true;
    for (int k = 1; k < prog::kCommKinds && !Full(); ++k) {
      if (!used[k]) continue;
      std::map<std::pair<int32_t, int32_t>, bool> compared;
      for (size_t c = 0; c < p_.communicators.size() && !Full(); ++c) {
        const Communicator& comm = p_.communicators[c];
        if (static_cast<int>(comm.kind) != k) continue;
        int32_t r0 = comm.members[0];
        int32_t role0 = p_.ranks[r0].role;
        for (int32_t m : comm.members) {
          int32_t rm = p_.ranks[m].role;
          if (rm == role0 || compared.count({role0, rm})) continue;
          compared[{role0, rm}] = true;
          auto a = BodySignature(role0, static_cast<CommKind>(k));
          auto b = BodySignature(rm, static_cast<CommKind>(k));
          if (a == b) continue;
          size_t i = 0;
          while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
          Error(fmt::format(
              "{} communicator {}: collective #{} inside the bodies differs between rank {} ({}): "
              "{} and "
              "rank {} ({}): {}",
              CommName(comm.kind), c, i, r0, p_.roles[role0].name, i < a.size() ? a[i] : "nothing",
              m, p_.roles[rm].name, i < b.size() ? b[i] : "nothing"));
        }
      }
    }
    // Every rank must have a communicator of each kind its role's bodies name.
    for (size_t r = 0; r < p_.ranks.size() && !Full(); ++r) {
      const Role& role = p_.roles[p_.ranks[r].role];
      bool reported = false;
      for (const Body& body : role.bodies) {
        for (const Op& op : body.ops)
          if (op.comm != CommKind::None && p_.ranks[r].comms[static_cast<int>(op.comm)] < 0) {
            Error(fmt::format(
                "rank {} ({}): body '{}' uses the {} communicator, but the rank has none", r,
                role.name, body.name, CommName(op.comm)));
            reported = true;
            break;
          }
        if (reported) break;
      }
    }
  }

  // The listed items of one schedule op (a step body's op by its collectives).
  void AppendItems(const Role& role, int32_t i, std::map<int, int64_t>& coll_seq,
                   std::map<std::pair<int32_t, bool>, int64_t>& p2p_seq, RoleStream& st) {
    const StepView op = StepAt(role, static_cast<size_t>(i));
    if (IsP2p(op.kind)) {
      Item it;
      it.type = ItemType::kP2p;
      it.schedule_op = i;
      it.send = IsSend(op.kind);
      it.peer = static_cast<int32_t>(op.peer);
      it.seq = static_cast<int32_t>(p2p_seq[{it.peer, it.send}]++);
      if (std::find(st.peers.begin(), st.peers.end(), it.peer) == st.peers.end())
        st.peers.push_back(it.peer);
      st.items.push_back(it);
      return;
    }
    if (op.body >= 0) {
      const Body& b = role.bodies[op.body];
      for (int32_t j = 0; j < static_cast<int32_t>(b.ops.size()); ++j) {
        const Op& bop = b.ops[j];
        if (!IsGroupCall(bop)) continue;
        Item it;
        it.type = ItemType::kCollective;
        it.schedule_op = i;
        it.body_op = j;
        it.comm = bop.comm;
        it.seq = static_cast<int32_t>(coll_seq[static_cast<int>(bop.comm)]++);
        st.items.push_back(it);
      }
      return;
    }
    Item it;
    it.type = ItemType::kCompute;
    it.schedule_op = i;
    st.items.push_back(it);
  }

  // Group extents of items [begin, end) of one segment: consecutive p2p items with the same
  // non-zero group (a loop's groups never cross an iteration's boundary).
  static void MarkGroups(const Role& role, int32_t begin, int32_t end, RoleStream& st) {
    for (int32_t i = begin; i < end;) {
      Item& head = st.items[static_cast<size_t>(i)];
      if (head.type != ItemType::kP2p) {
        head.group_end = i + 1;
        ++i;
        continue;
      }
      const int64_t g = StepAt(role, static_cast<size_t>(head.schedule_op)).group;
      int32_t j = i + 1;
      auto group_of = [&](int32_t k) {
        return StepAt(role, static_cast<size_t>(st.items[static_cast<size_t>(k)].schedule_op))
            .group;
      };
      if (g != 0)
        while (j < end && st.items[static_cast<size_t>(j)].type == ItemType::kP2p &&
               group_of(j) == g)
          ++j;
      for (int32_t k = i; k < j; ++k) st.items[static_cast<size_t>(k)].group_end = j;
      i = j;
    }
  }

  // Each role's listed stream in segments: runs of listed ops, and loop bodies listed once with
  // their strides (what an item's sequence number advances by per iteration).
  void BuildStreams() {
    streams_.resize(p_.roles.size());
    for (size_t ri = 0; ri < p_.roles.size(); ++ri) {
      const Role& role = p_.roles[ri];
      RoleStream& st = streams_[ri];
      std::map<int, int64_t> coll_seq;
      std::map<std::pair<int32_t, bool>, int64_t> p2p_seq;
      const auto listed = static_cast<int32_t>(ScheduleSize(role));
      const std::vector<prog::ScheduleLoop> none;
      const std::vector<prog::ScheduleLoop>& loops = role.steps.empty() ? none : role.loops;
      st.loops = !loops.empty();
      int64_t vpos = 0, op_vpos = 0;
      auto add_segment = [&](int32_t op_begin, int32_t op_end, int32_t loop) {
        if (op_end <= op_begin) return;
        Segment seg;
        seg.vbegin = vpos;
        seg.op_vbegin = op_vpos;
        seg.op_begin = op_begin;
        seg.op_len = op_end - op_begin;
        seg.item_begin = static_cast<int32_t>(st.items.size());
        seg.loop = loop;
        if (loop >= 0) {
          const prog::ScheduleLoop& l = loops[static_cast<size_t>(loop)];
          seg.count = l.count();
          seg.microbatch_stride = l.microbatch_stride();
          seg.slot_stride = l.slot_stride();
        }
        const auto before_p2p = p2p_seq;
        const auto before_coll = coll_seq;
        for (int32_t i = op_begin; i < op_end; ++i) AppendItems(role, i, coll_seq, p2p_seq, st);
        seg.item_len = static_cast<int32_t>(st.items.size()) - seg.item_begin;
        if (seg.item_len == 0) {  // step bodies without collectives
          op_vpos += int64_t{seg.op_len} * seg.count;
          return;
        }
        // Per-iteration advances, the runs of each direction, and the counters past the loop.
        for (auto& [key, n] : p2p_seq) {
          auto f = before_p2p.find(key);
          const int64_t start = f == before_p2p.end() ? 0 : f->second;
          const int64_t per = n - start;
          if (per == 0) continue;
          seg.per_iteration[key] = static_cast<int32_t>(per);
          P2pRun run;
          run.seq_begin = start;
          run.segment = static_cast<int32_t>(st.segments.size());
          n = start + per * seg.count;
          st.Runs(key).push_back(std::move(run));
        }
        for (auto& [kind, n] : coll_seq) {
          auto f = before_coll.find(kind);
          const int64_t start = f == before_coll.end() ? 0 : f->second;
          if (n - start > 0 && seg.count > 1) seg.collectives = true;
          n = start + (n - start) * seg.count;
        }
        for (int32_t k = seg.item_begin; k < seg.item_begin + seg.item_len; ++k) {
          Item& it = st.items[static_cast<size_t>(k)];
          if (it.type == ItemType::kP2p) {
            it.seq_stride = seg.per_iteration[{it.peer, it.send}];
            for (P2pRun& run : st.Runs({it.peer, it.send}))
              if (run.segment == static_cast<int32_t>(st.segments.size())) run.items.push_back(k);
          } else if (it.type == ItemType::kCollective && seg.count > 1) {
            int32_t per = 0;
            for (int32_t j = seg.item_begin; j < seg.item_begin + seg.item_len; ++j)
              per += st.items[static_cast<size_t>(j)].type == ItemType::kCollective &&
                     st.items[static_cast<size_t>(j)].comm == it.comm;
            it.seq_stride = per;
          }
        }
        MarkGroups(role, seg.item_begin, seg.item_begin + seg.item_len, st);
        vpos += int64_t{seg.item_len} * seg.count;
        op_vpos += int64_t{seg.op_len} * seg.count;
        st.segments.push_back(std::move(seg));
      };
      int32_t at = 0;
      for (size_t k = 0; k < loops.size(); ++k) {
        const prog::ScheduleLoop& l = loops[k];
        add_segment(at, l.begin(), -1);
        add_segment(l.begin(), l.begin() + l.length(), static_cast<int32_t>(k));
        at = l.begin() + l.length();
      }
      add_segment(at, listed, -1);
      st.length = vpos;
      st.p2p_count = p2p_seq;
      if (st.segments.empty()) st.segments.push_back(Segment{});
    }
  }

  int32_t PeerRank(int32_t rank, int32_t peer_index) const {
    return p_.MemberOf(rank, CommKind::Pp, peer_index);
  }

  // Every transfer a -> b has a partner (counts per direction agree); the partners themselves
  // are compared as the simulation passes them (CheckMatch).
  void CheckTransferCounts() {
    for (int32_t a = 0; a < p_.world_size && !Full(); ++a) {
      const Role& ra = p_.roles[p_.ranks[a].role];
      const RoleStream& sa = streams_[p_.ranks[a].role];
      int32_t my_index = p_.IndexIn(a, CommKind::Pp);
      for (const auto& [key, count] : sa.p2p_count) {
        auto [peer, send] = key;
        int32_t b = PeerRank(a, peer);
        if (b < 0 || my_index < 0) {
          Error(fmt::format("rank {} ({}): transfers to pipeline peer {}, which does not exist", a,
                            ra.name, peer));
          continue;
        }
        const RoleStream& sb = streams_[p_.ranks[b].role];
        auto it = sb.p2p_count.find({my_index, !send});
        int64_t other = it == sb.p2p_count.end() ? 0 : it->second;
        if (other != count)
          Error(fmt::format("rank {} ({}) {} {} transfers {} rank {} ({}), which {} {}", a, ra.name,
                            send ? "sends" : "receives", count, send ? "to" : "from", b,
                            p_.roles[p_.ranks[b].role].name, send ? "receives" : "sends", other));
      }
    }
  }

  // The send at virtual position v of rank a and the receive it meets: same kind, microbatch,
  // adjacent stages and bytes.
  bool CheckMatch(int32_t a, int64_t v, const RoleStream::At& ia) {
    const RoleStream& sa = StreamOf(a);
    const int32_t b = PeerRank(a, ia.item->peer);
    const RoleStream& sb = StreamOf(b);
    const int64_t k = sa.Seq(ia);
    const int64_t w = sb.P2pPos(sim_.pp_index[static_cast<size_t>(a)], false, k);
    if (w < 0) return true;  // counted already (CheckTransferCounts)
    const RoleStream::At ib = sb.Locate(w);
    const Role& ra = p_.roles[p_.ranks[a].role];
    const Role& rb = p_.roles[p_.ranks[b].role];
    const StepView as = StepOf(ra, ia), ar = StepOf(rb, ib);
    bool act = as.kind == OpKind::SendActivation;
    bool kind_ok = ar.kind == (act ? OpKind::RecvActivation : OpKind::RecvGrad);
    int64_t ss = ra.chunks[as.chunk].stage, rs = rb.chunks[ar.chunk].stage;
    bool stage_ok = act ? rs == ss + 1 : rs == ss - 1;
    const int64_t sent = ItemBytes(ra, *ia.item), received = ItemBytes(rb, *ib.item);
    if (kind_ok && as.microbatch == ar.microbatch && stage_ok && sent == received) return true;
    Error(
        fmt::format("transfer {} from rank {} to rank {} does not match: {} (stage {}, {} bytes) "
                    "is received by {} (stage {}, {} bytes)",
                    k, a, b, Where(a, v), ss, sent, Where(b, w), rs, received));
    return false;
  }

  // --- the limit of a round (Simulate) ---
  // The next iteration boundary of a loop past `limit` (the end of the first iteration of the
  // next loop when `limit` is at or past a loop's end), or the stream's end.
  // Only a role's long loops (an eighth of its stream or more: the steady state, and in gpipe
  // its forward and its backward half) bound a round; short ones (a warm-up's) run freely.
  static bool Governs(const RoleStream& st, const Segment& s) {
    return s.loop >= 0 && s.count > 2 && (s.vend() - s.vbegin) * 8 >= st.length;
  }
  static int64_t NextLimit(const RoleStream& st, int64_t limit) {
    for (const Segment& s : st.segments) {
      if (!Governs(st, s) || s.vend() <= limit) continue;
      if (limit < s.vbegin + s.item_len) return s.vbegin + s.item_len;
      const int64_t next = limit + s.item_len - (limit - s.vbegin) % s.item_len;
      return std::min(next, s.vend());
    }
    return st.length;
  }

  // Rendezvous simulation of all ranks, in rounds when loops are present (see the header).
  void Simulate() {
    const int32_t world = p_.world_size;
    sim_.pos.assign(world, 0);
    sim_.limit.assign(world, 0);
    sim_.head_end.assign(world, 0);
    sim_.arrived.assign(p_.communicators.size(), 0);
    sim_.completed.assign(p_.communicators.size(), 0);
    sim_.counted.assign(world, 0);
    sim_.queued.assign(world, 0);
    sim_.pp_index.resize(static_cast<size_t>(world));
    for (int32_t r = 0; r < world; ++r)
      sim_.pp_index[static_cast<size_t>(r)] = p_.IndexIn(r, CommKind::Pp);
    for (int32_t r = 0; r < world; ++r) Moved(r);
    bool loops = false;
    for (const RoleStream& st : streams_) loops = loops || st.loops;
    std::vector<int64_t> last_pos, last_limit;
    while (!Full()) {
      bool raised = last_pos.empty();  // the first round always runs
      for (int32_t r = 0; r < world; ++r) {
        const RoleStream& st = StreamOf(r);
        const int64_t next = loops ? NextLimit(st, sim_.limit[r]) : st.length;
        if (next != sim_.limit[r]) raised = true;
        sim_.limit[r] = next;
        Push(r);
      }
      if (!raised) break;
      if (!RunQueue()) return;
      if (!loops) break;
      bool done = true;
      for (int32_t r = 0; r < world && done; ++r) done = sim_.pos[r] >= StreamOf(r).length;
      if (done) break;
      if (!last_pos.empty()) Skip(last_pos, last_limit);
      last_pos = sim_.pos, last_limit = sim_.limit;
    }
    if (Full()) return;
    ReportStuck();
    if (stats_) {
      stats_->ranks = world;
      stats_->simulated_ops = sim_.ops;
      stats_->transfers = sim_.transfers / 2;
      stats_->collectives = sim_.collectives;
      stats_->skips = skips_;
    }
  }

  // Records rank r's new position: the end of its head group, which partners test against.
  void Moved(int32_t r) {
    const RoleStream& st = StreamOf(r);
    sim_.head_end[static_cast<size_t>(r)] =
        sim_.pos[r] < st.length ? st.GroupEnd(sim_.pos[r]) : sim_.pos[r];
  }

  // Advances queued ranks until none moves; false on a failed check.
  bool RunQueue() {
    while (!sim_.queue.empty() && !Full()) {
      const int32_t r = sim_.queue.front();
      sim_.queue.pop_front();
      sim_.queued[r] = 0;
      const Progress progress = AdvanceRank(r);
      if (progress == Progress::kFailed) return false;
      if (progress == Progress::kMoved) PushPeers(r);
    }
    return !Full();
  }

  // The state after the last round is the state before it shifted by one iteration on every
  // rank: skip the iterations every rank's loop has left but one, as they repeat it (see the
  // header for why).
  void Skip(const std::vector<int64_t>& last_pos, const std::vector<int64_t>& last_limit) {
    const int32_t world = p_.world_size;
    int64_t skip = std::numeric_limits<int64_t>::max();
    int64_t ops = 0, transfers = 0;
    for (int32_t r = 0; r < world; ++r) {
      const RoleStream& st = StreamOf(r);
      if (sim_.counted[r] || sim_.pos[r] >= st.length) return;
      const size_t si = st.SegmentOf(sim_.pos[r]);
      const Segment& s = st.segments[si];
      if (!Governs(st, s) || s.collectives || last_pos[r] < s.vbegin ||
          sim_.pos[r] - last_pos[r] != s.item_len || sim_.limit[r] - last_limit[r] != s.item_len ||
          sim_.limit[r] > s.vend()) {
        return;
      }
      // Every pipeline peer runs a loop with as many transfers each way per iteration and the
      // same microbatch stride.
      for (const auto& [key, per] : s.per_iteration) {
        const int32_t b = PeerRank(r, key.first);
        const RoleStream& sb = StreamOf(b);
        if (sim_.pos[b] >= sb.length) return;
        const Segment& t = sb.segments[sb.SegmentOf(sim_.pos[b])];
        auto f = t.per_iteration.find({sim_.pp_index[static_cast<size_t>(r)], !key.second});
        if (t.loop < 0 || f == t.per_iteration.end() || f->second != per ||
            t.microbatch_stride != s.microbatch_stride)
          return;
      }
      skip = std::min(skip, (s.vend() - sim_.limit[r]) / s.item_len - 1);
      ops += s.item_len;
      for (const auto& [key, per] : s.per_iteration) transfers += per;
    }
    if (skip < 1) return;
    for (int32_t r = 0; r < world; ++r) {
      const int64_t len = StreamOf(r).Locate(sim_.pos[r]).seg->item_len;
      sim_.pos[r] += skip * len;
      sim_.limit[r] += skip * len;
      Moved(r);
    }
    sim_.ops += skip * ops;
    sim_.transfers += skip * transfers;
    ++skips_;
  }

  const RoleStream& StreamOf(int32_t r) const { return streams_[p_.ranks[r].role]; }

  void Push(int32_t r) {
    if (r >= 0 && !sim_.queued[r]) {
      sim_.queued[r] = 1;
      sim_.queue.push_back(r);
    }
  }
  // A rank that moved can only unblock the pipeline peers its transfers name (a blocked
  // transfer waits for its partner; collectives push their members when they complete).
  void PushPeers(int32_t r) {
    for (int32_t peer : StreamOf(r).peers) Push(PeerRank(r, peer));
  }

  // Is the partner of rank r's p2p item at v posted (in the partner's head group) or done?
  bool PartnerReady(int32_t r, int64_t v) const { return PartnerReady(r, StreamOf(r).Locate(v)); }
  bool PartnerReady(int32_t r, const RoleStream::At& a) const {
    const RoleStream& st = StreamOf(r);
    const int32_t b = PeerRank(r, a.item->peer);
    const int32_t my_index = sim_.pp_index[static_cast<size_t>(r)];
    const RoleStream& sb = StreamOf(b);
    const int64_t item = sb.P2pPos(my_index, !a.item->send, st.Seq(a));
    if (item < 0) return false;
    if (sim_.pos[b] >= sb.length) return item < sim_.pos[b];
    return item < sim_.head_end[static_cast<size_t>(b)];
  }

  // Runs rank r's stream as far as it goes without waiting, up to its limit.
  Progress AdvanceRank(int32_t r) {
    const RoleStream& st = StreamOf(r);
    bool moved = false;
    const int64_t end = std::min(st.length, sim_.limit[r]);
    while (sim_.pos[r] < end) {
      const RoleStream::At a = st.Locate(sim_.pos[r]);
      const Item& it = *a.item;
      if (it.type == ItemType::kCompute) {
        // A run of compute items inside this iteration.
        const int32_t seg_end = a.seg->item_begin + a.seg->item_len;
        int32_t i = a.index;
        int64_t n = 0;
        while (i < seg_end && sim_.pos[r] + n < end &&
               st.items[static_cast<size_t>(i)].type == ItemType::kCompute)
          ++i, ++n;
        sim_.pos[r] += n, sim_.ops += n, moved = true;
        continue;
      }
      if (it.type == ItemType::kP2p) {
        const int64_t group_end = sim_.pos[r] + (it.group_end - a.index);
        // The group's items: the same segment and iteration as its head.
        auto at = [&](int64_t k) {
          RoleStream::At x = a;
          x.index = a.index + static_cast<int32_t>(k - sim_.pos[r]);
          x.item = &st.items[static_cast<size_t>(x.index)];
          return x;
        };
        bool all = true;
        for (int64_t k = sim_.pos[r]; k < group_end && all; ++k) all = PartnerReady(r, at(k));
        if (!all) break;
        for (int64_t k = sim_.pos[r]; k < group_end; ++k)
          if (const RoleStream::At x = at(k); x.item->send && !CheckMatch(r, k, x))
            return Progress::kFailed;
        const int64_t n = group_end - sim_.pos[r];
        sim_.ops += n, sim_.transfers += n;
        sim_.pos[r] = group_end;
        moved = true;
        continue;
      }
      const Progress collective = EnterCollective(r, a);
      if (collective == Progress::kFailed) return Progress::kFailed;
      if (collective == Progress::kWaiting) break;
      moved = true;
    }
    if (moved) Moved(r);
    return moved ? Progress::kMoved : Progress::kWaiting;
  }

  // Collective: register arrival once; the last member to arrive completes it for all.
  Progress EnterCollective(int32_t r, const RoleStream::At& a) {
    const Item& it = *a.item;
    const int32_t c = p_.ranks[r].comms[static_cast<int>(it.comm)];
    const Communicator& comm = p_.communicators[c];
    if (comm.members.size() == 1) {
      ++sim_.pos[r], ++sim_.ops;
      return Progress::kMoved;
    }
    const int64_t seq = StreamOf(r).Seq(a);
    if (!sim_.counted[r]) {
      sim_.counted[r] = 1;
      ++sim_.arrived[c];
      if (seq != sim_.completed[c]) {
        Error(
            fmt::format("{} enters collective #{} of {} communicator {}, but its members are "
                        "at collective #{}",
                        Where(r, sim_.pos[r]), seq, CommName(comm.kind), c, sim_.completed[c]));
        return Progress::kFailed;
      }
    }
    if (sim_.arrived[c] < static_cast<int64_t>(comm.members.size())) return Progress::kWaiting;
    // Every member must be at the collective and within its round's limit.
    for (int32_t mrank : comm.members)
      if (sim_.pos[mrank] >= sim_.limit[mrank]) return Progress::kWaiting;
    if (!MembersAgree(c, seq)) return Progress::kFailed;
    for (int32_t mrank : comm.members) {
      ++sim_.pos[mrank];
      Moved(mrank);
      sim_.counted[mrank] = 0;
      ++sim_.ops;
      Push(mrank);
    }
    sim_.arrived[c] = 0;
    ++sim_.completed[c];
    ++sim_.collectives;
    return Progress::kMoved;
  }

  // Everyone is at collective `seq` of communicator c: their collectives must agree.
  bool MembersAgree(int32_t c, int64_t seq) {
    const Communicator& comm = p_.communicators[c];
    const Item* first = nullptr;
    int32_t first_rank = -1;
    int64_t first_bytes = 0;
    for (int32_t mrank : comm.members) {
      const Item& mi = *StreamOf(mrank).Locate(sim_.pos[mrank]).item;
      const Role& mrole = p_.roles[p_.ranks[mrank].role];
      const Op& mop = OpOf(mrole, mi);
      const int64_t bytes = ItemBytes(mrole, mi);
      if (!first) {
        first = &mi, first_rank = mrank, first_bytes = bytes;
        continue;
      }
      const Op& fop = OpOf(p_.roles[p_.ranks[first_rank].role], *first);
      if (mop.kind != fop.kind || bytes != first_bytes ||
          CollectiveArgument(mop) != CollectiveArgument(fop)) {
        Error(
            fmt::format("collective #{} of {} communicator {} differs between its members: {} "
                        "({} bytes) vs {} "
                        "({} bytes)",
                        seq, CommName(comm.kind), c, Where(first_rank, sim_.pos[first_rank]),
                        first_bytes, Where(mrank, sim_.pos[mrank]), bytes));
        return false;
      }
    }
    return true;
  }

  // Stuck ranks: report the first few with what they wait for.
  void ReportStuck() {
    int reported = 0;
    for (int32_t r = 0; r < p_.world_size; ++r) {
      const RoleStream& st = StreamOf(r);
      if (sim_.pos[r] >= st.length) continue;
      if (reported++ == 0) Error("the programs deadlock: ranks wait for each other forever");
      if (reported > 6) {
        Error("(more ranks are stuck)");
        break;
      }
      const Item& it = *st.Locate(sim_.pos[r]).item;
      if (it.type == ItemType::kP2p)
        Error(fmt::format("{} waits{}", Where(r, sim_.pos[r]), UnpostedPartner(r)));
      else
        Error(fmt::format("{} waits for the other members of its {} communicator",
                          Where(r, sim_.pos[r]), CommName(it.comm)));
    }
  }

  // "; its partner is not posted: ..." for the first transfer of rank r's head group whose
  // partner is not posted, or empty.
  std::string UnpostedPartner(int32_t r) const {
    const RoleStream& st = StreamOf(r);
    const int64_t end = st.GroupEnd(sim_.pos[r]);
    for (int64_t k = sim_.pos[r]; k < end; ++k) {
      if (PartnerReady(r, k)) continue;
      const RoleStream::At a = st.Locate(k);
      const int32_t b = PeerRank(r, a.item->peer);
      const RoleStream& sb = StreamOf(b);
      const std::string at =
          sim_.pos[b] < sb.length ? Where(b, sim_.pos[b]) : fmt::format("rank {} (finished)", b);
      return fmt::format("; its partner is not posted: {} is at {}",
                         DescribeStep(StepOf(p_.roles[p_.ranks[r].role], a)), at);
    }
    return {};
  }

  const Program& p_;
  VerifyStats* stats_;
  size_t max_errors_;
  std::vector<std::string> errors_;
  std::vector<RoleStream> streams_;
  Rendezvous sim_;
  int64_t skips_ = 0;
};

}  // namespace

std::vector<std::string> VerifyWorld(const Program& program, VerifyStats* stats,
                                     size_t max_errors) {
  WorldVerifier v(program, stats, max_errors);
  return v.Run();
}

}  // namespace paraplan::lower
