// WorldVerifier's checks (verify_world.h): the run of VerifyWorld's phases, messages, the
// per-role counts and landing buffers, collectives inside bodies, and transfer counts.
#include "runtime/verify/verify_world.h"

#include <fmt/format.h>

#include <map>

#include "runtime/format/ops.h"

namespace paraplan::verify::detail {

std::vector<std::string> WorldVerifier::Run() {
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

std::string WorldVerifier::Where(int32_t rank, int64_t v) const {
  const Role& role = p_.roles[p_.ranks[rank].role];
  const RoleStream& st = StreamOf(rank);
  const RoleStream::At a = st.Locate(v);
  const StepView s = StepOf(role, a);
  if (a.item->type == ItemType::kCollective)
    return fmt::format("rank {} ({}) op #{} {} / {}", rank, role.name, st.OpIndex(a),
                       OpName(s.kind), DescribeOp(OpOf(role, *a.item)));
  return fmt::format("rank {} ({}) op #{} {}", rank, role.name, st.OpIndex(a), DescribeStep(s));
}

void WorldVerifier::CheckRole(int32_t ri) {
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
  SlotTracker slots(role);
  BoundaryTracker boundary(role);
  bool slot_error = false, boundary_error = false;  // the first of each kind per role
  ForEachOp(role, [&](size_t i, const StepView& op) {
    bool compute = op.kind == OpKind::Forward || op.kind == OpKind::Backward;
    if (!compute && !IsP2p(op.kind)) {
      (void)slots.Step(op);  // ends a transfer group
      return;
    }
    int64_t mb = op.microbatch, c = op.chunk;
    if (mb < 0 || mb >= m) {
      Error(fmt::format("{} op #{} {}: microbatch outside [0, {})", role.name, i, DescribeStep(op),
                        m));
      return;
    }
    if (c < 0 || c >= nc) return;
    if (const std::string e = landing.Step(op); !e.empty())
      Error(fmt::format("{} op #{} {}: {}", role.name, i, DescribeStep(op), e));
    if (const std::string e = boundary.Step(op); !e.empty() && !boundary_error) {
      Error(fmt::format("{} op #{} {}: {}", role.name, i, DescribeStep(op), e));
      boundary_error = true;
    }
    // The first slot error of a role only: the ones after it follow from it.
    if (const std::string e = slots.Step(op); !e.empty() && !slot_error) {
      Error(fmt::format("{} op #{} {}: {}", role.name, i, DescribeStep(op), e));
      slot_error = true;
    }
    if (compute) {
      auto& count = op.kind == OpKind::Forward ? fwd_count : bwd_count;
      auto& first = op.kind == OpKind::Forward ? fwd_first : bwd_first;
      if (count[mb * nc + c]++ == 0) first[mb * nc + c] = static_cast<int64_t>(i);
      return;
    }
    const Chunk& ch = role.chunks[c];
    const int32_t grad_landing = boundary.grad_landing(c);
    int32_t expect = op.kind == OpKind::SendActivation ? ch.output
                     : op.kind == OpKind::RecvActivation
                         ? (landing.buffer(c) >= 0 ? landing.buffer(c) : ch.input)
                     : op.kind == OpKind::RecvGrad && grad_landing >= 0 ? grad_landing
                                                                        : ch.grad;
    if (expect < 0 || !op.one_operand || op.operand != expect)
      Error(fmt::format("{} op #{} {}: must name the chunk's {} buffer", role.name, i,
                        DescribeStep(op),
                        op.kind == OpKind::SendActivation   ? "output"
                        : op.kind == OpKind::RecvActivation ? "input"
                                                            : "grad"));
    if (op.comm != CommKind::Pp)
      Error(fmt::format("{} op #{} {}: a pipeline transfer must use the pp communicator", role.name,
                        i, DescribeStep(op)));
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
            ranks_of(ri), role.name, mb, c, f, f == 0 ? "" : " (ops " + list(mb, c, false) + ")"));
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

std::vector<std::string> WorldVerifier::BodySignature(int32_t role_index, CommKind kind) const {
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

void WorldVerifier::CheckHomogeneousKinds() {
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
            CommName(comm.kind), c, i, r0, p_.roles[role0].name, i < a.size() ? a[i] : "nothing", m,
            p_.roles[rm].name, i < b.size() ? b[i] : "nothing"));
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
          Error(
              fmt::format("rank {} ({}): body '{}' uses the {} communicator, but the rank has none",
                          r, role.name, body.name, CommName(op.comm)));
          reported = true;
          break;
        }
      if (reported) break;
    }
  }
}

void WorldVerifier::CheckTransferCounts() {
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

}  // namespace paraplan::verify::detail
