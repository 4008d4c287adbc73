// WorldVerifier's rendezvous simulation of all ranks (verify_world.h; verify.h says why it may
// skip loop iterations): rounds, readiness of transfers, collectives, transfer matching, and the
// report of stuck ranks.
#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <string>
#include <vector>

#include "runtime/verify/verify_world.h"

namespace paraplan::verify::detail {

bool WorldVerifier::CheckMatch(int32_t a, int64_t v, const RoleStream::At& ia) {
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

int64_t WorldVerifier::NextLimit(const RoleStream& st, int64_t limit) {
  for (const Segment& s : st.segments) {
    if (!Governs(st, s) || s.vend() <= limit) continue;
    if (limit < s.vbegin + s.item_len) return s.vbegin + s.item_len;
    const int64_t next = limit + s.item_len - (limit - s.vbegin) % s.item_len;
    return std::min(next, s.vend());
  }
  return st.length;
}

void WorldVerifier::Simulate() {
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

void WorldVerifier::Moved(int32_t r) {
  const RoleStream& st = StreamOf(r);
  sim_.head_end[static_cast<size_t>(r)] =
      sim_.pos[r] < st.length ? st.GroupEnd(sim_.pos[r]) : sim_.pos[r];
}

bool WorldVerifier::RunQueue() {
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

void WorldVerifier::Skip(const std::vector<int64_t>& last_pos,
                         const std::vector<int64_t>& last_limit) {
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

bool WorldVerifier::PartnerReady(int32_t r, const RoleStream::At& a) const {
  const RoleStream& st = StreamOf(r);
  const int32_t b = PeerRank(r, a.item->peer);
  const int32_t my_index = sim_.pp_index[static_cast<size_t>(r)];
  const RoleStream& sb = StreamOf(b);
  const int64_t item = sb.P2pPos(my_index, !a.item->send, st.Seq(a));
  if (item < 0) return false;
  if (sim_.pos[b] >= sb.length) return item < sim_.pos[b];
  return item < sim_.head_end[static_cast<size_t>(b)];
}

Progress WorldVerifier::AdvanceRank(int32_t r) {
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

Progress WorldVerifier::EnterCollective(int32_t r, const RoleStream::At& a) {
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

bool WorldVerifier::MembersAgree(int32_t c, int64_t seq) {
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

void WorldVerifier::ReportStuck() {
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

std::string WorldVerifier::UnpostedPartner(int32_t r) const {
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

}  // namespace paraplan::verify::detail
