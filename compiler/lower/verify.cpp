// Whole-world verification (see verify.h).
#include "compiler/lower/verify.h"

#include <fmt/format.h>

#include <algorithm>
#include <deque>
#include <map>
#include <unordered_map>

#include "runtime/format/ops.h"

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

size_t ScheduleSize(const Role& role) {
  return role.steps.empty() ? role.schedule.size() : role.steps.size();
}

StepView StepAt(const Role& role, size_t i) {
  StepView v;
  if (!role.steps.empty()) {
    const prog::ScheduleStep& s = role.steps[i];
    v.kind = s.kind();
    v.comm = s.comm();
    const bool p2p = IsP2p(v.kind);
    if (p2p || v.kind == OpKind::Forward || v.kind == OpKind::Backward) {
      v.microbatch = s.microbatch(), v.chunk = s.chunk(), v.slot = s.slot();
      if (p2p)
        v.peer = s.peer(), v.group = s.group(), v.operand = s.operand(), v.one_operand = true;
    }
    if (v.kind == OpKind::ZeroGrads || v.kind == OpKind::ReduceGrads ||
        v.kind == OpKind::OptimizerStep || v.kind == OpKind::GatherParams)
      v.body = s.operand();
    return v;
  }
  const Op& op = role.schedule[i];
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

// One schedule-level step of a role's stream; step bodies are expanded into their collectives.
// There is one per schedule op of every role (hundreds of thousands in a large world), so it
// holds 24 bytes: what the simulation reads at every step, and positions to find the rest
// (ItemBytes, OpOf, StepAt) when a check or a message needs it.
struct Item {
  int32_t seq =
      0;  // p2p: k-th transfer in its direction to/from that peer; collective: k-th on its kind
  int32_t schedule_op = 0;  // position in the role's schedule
  int32_t body_op = -1;     // position inside the step body (collectives)
  int32_t group_end = 0;    // p2p: one past the last item of its group
  int32_t peer = -1;        // p2p: index in the Pp communicator
  ItemType type = ItemType::kCompute;
  bool send = false;
  CommKind comm = CommKind::None;
};
static_assert(sizeof(Item) == 24);

struct RoleStream {
  std::vector<Item> items;
  // p2p lookup: (peer, send?) -> the stream positions of that direction's transfers, in order
  std::map<std::pair<int32_t, bool>, std::vector<int32_t>> p2p_items;
  std::map<std::pair<int32_t, bool>, int64_t> p2p_count;  // (peer, send?) -> transfers
  std::vector<int32_t> peers;  // the distinct pipeline peers the role's transfers name

  // The stream position of the k-th transfer to (send) or from `peer`; -1 when there is none.
  int32_t P2pItem(int32_t peer, bool send, int64_t k) const {
    auto f = p2p_items.find({peer, send});
    if (f == p2p_items.end() || k < 0 || k >= static_cast<int64_t>(f->second.size())) return -1;
    return f->second[static_cast<size_t>(k)];
  }
};

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

std::string Where(const Program& p, int32_t rank, const Item& it) {
  const Role& role = p.roles[p.ranks[rank].role];
  const StepView s = StepAt(role, it.schedule_op);
  if (it.type == ItemType::kCollective)
    return fmt::format("rank {} ({}) op #{} {} / {}", rank, role.name, it.schedule_op,
                       OpName(s.kind), DescribeOp(OpOf(role, it)));
  return fmt::format("rank {} ({}) op #{} {}", rank, role.name, it.schedule_op, DescribeStep(s));
}

// The state of the rendezvous simulation (WorldVerifier::Simulate).
struct Rendezvous {
  std::vector<int32_t> pos;        // per rank: its next item
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

  // Occurrence counts and order of forward / backward per (microbatch, chunk), and transfer
  // operands, on one role (every rank of the role runs this stream).
  void CheckRole(int32_t ri) {
    const Role& role = p_.roles[ri];
    int64_t m = p_.train.microbatches;
    int64_t nc = static_cast<int64_t>(role.chunks.size());
    if (m < 1) {
      Error(fmt::format("{}: {} microbatches per step", role.name, m));
      return;
    }
    std::vector<std::vector<int32_t>> fwd(m * nc), bwd(m * nc);
    for (int32_t i = 0; i < static_cast<int32_t>(ScheduleSize(role)); ++i) {
      const StepView op = StepAt(role, i);
      bool compute = op.kind == OpKind::Forward || op.kind == OpKind::Backward;
      if (!compute && !IsP2p(op.kind)) continue;
      int64_t mb = op.microbatch, c = op.chunk;
      if (mb < 0 || mb >= m) {
        Error(fmt::format("{} op #{} {}: microbatch outside [0, {})", role.name, i,
                          DescribeStep(op), m));
        continue;
      }
      if (compute) {
        (op.kind == OpKind::Forward ? fwd : bwd)[mb * nc + c].push_back(i);
        continue;
      }
      const Chunk& ch = role.chunks[c];
      int32_t expect = op.kind == OpKind::SendActivation   ? ch.output
                       : op.kind == OpKind::RecvActivation ? ch.input
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
    }
    auto ranks_of = [&](int32_t role_index) {
      std::string out;
      int n = 0;
      for (size_t r = 0; r < p_.ranks.size() && n < 4; ++r)
        if (p_.ranks[r].role == role_index) out += (n++ ? ", " : "") + std::to_string(r);
      return out + (n == 4 ? ", ..." : "");
    };
    auto list = [](const std::vector<int32_t>& v) {
      std::string s;
      for (int32_t x : v) s += (s.empty() ? "#" : ", #") + std::to_string(x);
      return s;
    };
    for (int64_t mb = 0; mb < m; ++mb)
      for (int64_t c = 0; c < nc; ++c) {
        const auto& f = fwd[mb * nc + c];
        const auto& b = bwd[mb * nc + c];
        if (f.size() != 1)
          Error(fmt::format(
              "ranks {} ({}): microbatch {} of chunk {} runs forward {} times{}; it must run "
              "exactly once",
              ranks_of(ri), role.name, mb, c, f.size(), f.empty() ? "" : " (ops " + list(f) + ")"));
        if (b.size() != 1)
          Error(fmt::format(
              "ranks {} ({}): microbatch {} of chunk {} runs backward {} times{}; it must run "
              "exactly once",
              ranks_of(ri), role.name, mb, c, b.size(), b.empty() ? "" : " (ops " + list(b) + ")"));
        if (f.size() == 1 && b.size() == 1 && b[0] < f[0])
          Error(
              fmt::format("ranks {} ({}): microbatch {} of chunk {} runs backward (op #{}) before "
                          "forward (op #{})",
                          ranks_of(ri), role.name, mb, c, b[0], f[0]));
      }
  }

  // Collectives inside forward/backward bodies are not simulated one by one: within every
  // group of a kind they use, all members must issue the same sequence of them (the compute
  // order of their schedule, and per computation the body's collectives of that kind). Members
  // of one role trivially do; members of different roles are compared.
  std::vector<std::string> BodySignature(int32_t role_index, CommKind kind) const {
    const Role& role = p_.roles[role_index];
    std::vector<std::string> sig;
    for (size_t i = 0; i < ScheduleSize(role); ++i) {
      const StepView op = StepAt(role, i);
      if (op.kind != OpKind::Forward && op.kind != OpKind::Backward) continue;
      const Chunk& c = role.chunks[op.chunk];
      const Body& body = role.bodies[op.kind == OpKind::Forward ? c.forward : c.backward];
      for (const Op& bop : body.ops)
        if (IsGroupCall(bop) && bop.comm == kind)
          sig.push_back(fmt::format(
              "{} of {} in {}: {} bytes, op {}", DescribeOp(bop), DescribeStep(op), body.name,
              bop.inputs.empty() ? 0 : role.buffers[bop.inputs[0]].bytes, CollectiveArgument(bop)));
    }
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

  // Items in a role's stream: one per schedule op, a step body's op by its collectives.
  static size_t StreamLength(const Role& role) {
    size_t n = 0;
    for (size_t i = 0; i < ScheduleSize(role); ++i) {
      const StepView op = StepAt(role, i);
      if (IsP2p(op.kind) || op.body < 0) {
        ++n;
        continue;
      }
      const Body& b = role.bodies[op.body];
      n += static_cast<size_t>(std::count_if(b.ops.begin(), b.ops.end(), IsGroupCall));
    }
    return n;
  }

  void BuildStreams() {
    streams_.resize(p_.roles.size());
    for (size_t ri = 0; ri < p_.roles.size(); ++ri) {
      const Role& role = p_.roles[ri];
      RoleStream& st = streams_[ri];
      std::map<int, int64_t> coll_seq;
      std::map<std::pair<int32_t, bool>, int64_t> p2p_seq;
      st.items.reserve(StreamLength(role));
      for (int32_t i = 0; i < static_cast<int32_t>(ScheduleSize(role)); ++i) {
        const StepView op = StepAt(role, i);
        if (IsP2p(op.kind)) {
          Item it;
          it.type = ItemType::kP2p;
          it.schedule_op = i;
          it.send = IsSend(op.kind);
          it.peer = static_cast<int32_t>(op.peer);
          it.seq = static_cast<int32_t>(p2p_seq[{it.peer, it.send}]++);
          st.p2p_items[{it.peer, it.send}].push_back(static_cast<int32_t>(st.items.size()));
          if (std::find(st.peers.begin(), st.peers.end(), it.peer) == st.peers.end())
            st.peers.push_back(it.peer);
          st.items.push_back(it);
          continue;
        }
        const int64_t body = op.body;
        if (body >= 0) {
          const Body& b = role.bodies[body];
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
          continue;
        }
        Item it;
        it.type = ItemType::kCompute;
        it.schedule_op = i;
        st.items.push_back(it);
      }
      st.p2p_count = p2p_seq;
      // Group extents: consecutive p2p items with the same non-zero group.
      for (size_t i = 0; i < st.items.size();) {
        if (st.items[i].type != ItemType::kP2p) {
          st.items[i].group_end = static_cast<int32_t>(i + 1);
          ++i;
          continue;
        }
        int64_t g = StepAt(role, st.items[i].schedule_op).group;
        size_t j = i + 1;
        if (g != 0)
          while (j < st.items.size() && st.items[j].type == ItemType::kP2p &&
                 StepAt(role, st.items[j].schedule_op).group == g)
            ++j;
        for (size_t k = i; k < j; ++k) st.items[k].group_end = static_cast<int32_t>(j);
        i = j;
      }
    }
  }

  int32_t PeerRank(int32_t rank, int32_t peer_index) const {
    return p_.MemberOf(rank, CommKind::Pp, peer_index);
  }

  // Every transfer a -> b has a partner, and partners agree on kind, microbatch, stage, bytes.
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
        if (other != count) {
          Error(fmt::format("rank {} ({}) {} {} transfers {} rank {} ({}), which {} {}", a, ra.name,
                            send ? "sends" : "receives", count, send ? "to" : "from", b,
                            p_.roles[p_.ranks[b].role].name, send ? "receives" : "sends", other));
          continue;
        }
        if (!send) continue;
        const Role& rb = p_.roles[p_.ranks[b].role];
        for (int64_t k = 0; k < count && !Full(); ++k) {
          const Item& is = sa.items[static_cast<size_t>(sa.P2pItem(peer, true, k))];
          const Item& ir = sb.items[static_cast<size_t>(sb.P2pItem(my_index, false, k))];
          const StepView as = StepAt(ra, is.schedule_op), ar = StepAt(rb, ir.schedule_op);
          bool act = as.kind == OpKind::SendActivation;
          bool kind_ok = ar.kind == (act ? OpKind::RecvActivation : OpKind::RecvGrad);
          int64_t ss = ra.chunks[as.chunk].stage, rs = rb.chunks[ar.chunk].stage;
          bool stage_ok = act ? rs == ss + 1 : rs == ss - 1;
          const int64_t sent = ItemBytes(ra, is), received = ItemBytes(rb, ir);
          if (!kind_ok || as.microbatch != ar.microbatch || !stage_ok || sent != received) {
            Error(fmt::format(
                "transfer {} from rank {} to rank {} does not match: {} (stage {}, {} bytes) is "
                "received "
                "by {} (stage {}, {} bytes)",
                k, a, b, Where(p_, a, is), ss, sent, Where(p_, b, ir), rs, received));
          }
        }
      }
    }
  }

  // Rendezvous simulation of all ranks.
  void Simulate() {
    const int32_t world = p_.world_size;
    sim_.pos.assign(world, 0);
    sim_.arrived.assign(p_.communicators.size(), 0);
    sim_.completed.assign(p_.communicators.size(), 0);
    sim_.counted.assign(world, 0);
    sim_.queued.assign(world, 1);
    sim_.pp_index.resize(static_cast<size_t>(world));
    for (int32_t r = 0; r < world; ++r)
      sim_.pp_index[static_cast<size_t>(r)] = p_.IndexIn(r, CommKind::Pp);
    for (int32_t r = 0; r < world; ++r) sim_.queue.push_back(r);
    while (!sim_.queue.empty() && !Full()) {
      const int32_t r = sim_.queue.front();
      sim_.queue.pop_front();
      sim_.queued[r] = 0;
      const Progress progress = AdvanceRank(r);
      if (progress == Progress::kFailed) return;
      if (progress == Progress::kMoved) PushPeers(r);
    }
    if (Full()) return;
    ReportStuck();
    if (stats_) {
      stats_->ranks = world;
      stats_->simulated_ops = sim_.ops;
      stats_->transfers = sim_.transfers / 2;
      stats_->collectives = sim_.collectives;
    }
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

  // Is the partner of rank r's p2p item posted (in the partner's head group) or done?
  bool PartnerReady(int32_t r, const Item& it) const {
    const int32_t b = PeerRank(r, it.peer);
    const int32_t my_index = sim_.pp_index[static_cast<size_t>(r)];
    const RoleStream& sb = StreamOf(b);
    const int32_t item = sb.P2pItem(my_index, !it.send, it.seq);
    if (item < 0) return false;
    if (sim_.pos[b] >= static_cast<int32_t>(sb.items.size())) return item < sim_.pos[b];
    return item < sb.items[sim_.pos[b]].group_end;
  }

  // Runs rank r's stream as far as it goes without waiting.
  Progress AdvanceRank(int32_t r) {
    const RoleStream& st = StreamOf(r);
    bool moved = false;
    while (sim_.pos[r] < static_cast<int32_t>(st.items.size())) {
      const Item& it = st.items[sim_.pos[r]];
      if (it.type == ItemType::kCompute) {
        ++sim_.pos[r], ++sim_.ops, moved = true;
        continue;
      }
      if (it.type == ItemType::kP2p) {
        bool all = true;
        for (int32_t k = sim_.pos[r]; k < it.group_end && all; ++k)
          all = PartnerReady(r, st.items[k]);
        if (!all) break;
        const int32_t n = it.group_end - sim_.pos[r];
        sim_.ops += n, sim_.transfers += n;
        sim_.pos[r] = it.group_end;
        moved = true;
        continue;
      }
      const Progress collective = EnterCollective(r, it);
      if (collective == Progress::kFailed) return Progress::kFailed;
      if (collective == Progress::kWaiting) break;
      moved = true;
    }
    return moved ? Progress::kMoved : Progress::kWaiting;
  }

  // Collective: register arrival once; the last member to arrive completes it for all.
  Progress EnterCollective(int32_t r, const Item& it) {
    const int32_t c = p_.ranks[r].comms[static_cast<int>(it.comm)];
    const Communicator& comm = p_.communicators[c];
    if (comm.members.size() == 1) {
      ++sim_.pos[r], ++sim_.ops;
      return Progress::kMoved;
    }
    if (!sim_.counted[r]) {
      sim_.counted[r] = 1;
      ++sim_.arrived[c];
      if (it.seq != sim_.completed[c]) {
        Error(
            fmt::format("{} enters collective #{} of {} communicator {}, but its members are "
                        "at collective #{}",
                        Where(p_, r, it), it.seq, CommName(comm.kind), c, sim_.completed[c]));
        return Progress::kFailed;
      }
    }
    if (sim_.arrived[c] < static_cast<int64_t>(comm.members.size())) return Progress::kWaiting;
    if (!MembersAgree(c, it)) return Progress::kFailed;
    for (int32_t mrank : comm.members) {
      ++sim_.pos[mrank];
      sim_.counted[mrank] = 0;
      ++sim_.ops;
      Push(mrank);
    }
    sim_.arrived[c] = 0;
    ++sim_.completed[c];
    ++sim_.collectives;
    return Progress::kMoved;
  }

  // Everyone is at collective `it` of communicator c: their collectives must agree.
  bool MembersAgree(int32_t c, const Item& it) {
    const Communicator& comm = p_.communicators[c];
    const Item* first = nullptr;
    int32_t first_rank = -1;
    int64_t first_bytes = 0;
    for (int32_t mrank : comm.members) {
      const Item& mi = StreamOf(mrank).items[sim_.pos[mrank]];
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
                        it.seq, CommName(comm.kind), c, Where(p_, first_rank, *first), first_bytes,
                        Where(p_, mrank, mi), bytes));
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
      if (sim_.pos[r] >= static_cast<int32_t>(st.items.size())) continue;
      if (reported++ == 0) Error("the programs deadlock: ranks wait for each other forever");
      if (reported > 6) {
        Error("(more ranks are stuck)");
        break;
      }
      const Item& it = st.items[sim_.pos[r]];
      if (it.type == ItemType::kP2p)
        Error(fmt::format("{} waits{}", Where(p_, r, it), UnpostedPartner(r, it)));
      else
        Error(fmt::format("{} waits for the other members of its {} communicator", Where(p_, r, it),
                          CommName(it.comm)));
    }
  }

  // "; its partner is not posted: ..." for the first transfer of rank r's group `it` whose
  // partner is not posted, or empty.
  std::string UnpostedPartner(int32_t r, const Item& it) const {
    const RoleStream& st = StreamOf(r);
    for (int32_t k = sim_.pos[r]; k < it.group_end; ++k) {
      if (PartnerReady(r, st.items[k])) continue;
      const int32_t b = PeerRank(r, st.items[k].peer);
      const RoleStream& sb = StreamOf(b);
      const std::string at = sim_.pos[b] < static_cast<int32_t>(sb.items.size())
                                 ? Where(p_, b, sb.items[sim_.pos[b]])
                                 : fmt::format("rank {} (finished)", b);
      return fmt::format("; its partner is not posted: {} is at {}",
                         DescribeStep(StepAt(p_.roles[p_.ranks[r].role], st.items[k].schedule_op)),
                         at);
    }
    return {};
  }

  const Program& p_;
  VerifyStats* stats_;
  size_t max_errors_;
  std::vector<std::string> errors_;
  std::vector<RoleStream> streams_;
  Rendezvous sim_;
};

}  // namespace

std::vector<std::string> VerifyWorld(const Program& program, VerifyStats* stats,
                                     size_t max_errors) {
  WorldVerifier v(program, stats, max_errors);
  return v.Run();
}

}  // namespace paraplan::lower
