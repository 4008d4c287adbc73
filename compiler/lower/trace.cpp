// Chrome trace of a simulated step (see trace.h).
#include "compiler/lower/trace.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <map>
#include <optional>

#include "runtime/format/ops.h"
#include "runtime/verify/verify.h"

namespace paraplan::lower {

namespace {

struct Slice {
  int32_t row;
  std::string name, cat;
  double start, dur;
  int64_t microbatch = -1, chunk = -1;
};

bool IsSend(OpKind kind) { return kind == OpKind::SendActivation || kind == OpKind::SendGrad; }

// The traced ranks: all, or one pipeline.
std::vector<int32_t> TracedRanks(const Program& p) {
  std::vector<int32_t> ranks;
  for (int32_t r = 0; r < p.world_size; ++r) {
    const Coordinates& c = p.ranks[r].coords;
    if (p.world_size <= kTraceAllRanksUpTo || (c.tp == 0 && c.cp == 0 && c.dp == 0))
      ranks.push_back(r);
  }
  return ranks;
}

// Replays the schedules of the traced ranks (one row each) with the model's durations and
// records a slice per computation, transfer and step body.
class StepReplay {
 public:
  StepReplay(const Program& p, const TraceDurations& d, const std::vector<int32_t>& ranks)
      : p_(p), d_(d), ranks_(ranks), n_(ranks.size()) {
    for (size_t i = 0; i < n_; ++i) row_of_[ranks_[i]] = static_cast<int32_t>(i);
    pos_.assign(n_, 0);
    clock_.assign(n_, 0.0);
    posted_.resize(n_);
    IndexTransfers();
  }

  void Run() {
    bool progress = true;
    while (!Done() && progress) {
      progress = false;
      for (size_t i = 0; i < n_; ++i)
        while (pos_[i] < RoleOf(i).schedule.size() && Step(i)) progress = true;
    }
  }

  const std::vector<Slice>& slices() const { return slices_; }
  const std::vector<double>& clock() const { return clock_; }

 private:
  const Role& RoleOf(size_t i) const { return p_.roles[p_.ranks[ranks_[i]].role]; }

  bool Done() const {
    for (size_t i = 0; i < n_; ++i)
      if (pos_[i] < RoleOf(i).schedule.size()) return false;
    return true;
  }

  // One past the last op of the transfer group that starts at `at`.
  static size_t GroupEnd(const Role& role, size_t at) {
    const int64_t group = prog::DecodeStepAttrs(role.schedule[at]).group;
    size_t j = at + 1;
    if (group != 0)
      while (j < role.schedule.size() && IsP2p(role.schedule[j].kind) &&
             prog::DecodeStepAttrs(role.schedule[j]).group == group)
        ++j;
    return j;
  }

  // The first op of the transfer group that holds `at`.
  static size_t GroupStart(const Role& role, size_t at) {
    while (at > 0 && IsP2p(role.schedule[at - 1].kind) &&
           prog::DecodeStepAttrs(role.schedule[at]).group != 0 &&
           prog::DecodeStepAttrs(role.schedule[at - 1]).group ==
               prog::DecodeStepAttrs(role.schedule[at]).group)
      --at;
    return at;
  }

  // k-th transfer per (row, peer, send?) -> op position, for partner lookup.
  void IndexTransfers() {
    index_.resize(n_);
    seq_of_.resize(n_);
    for (size_t i = 0; i < n_; ++i) {
      std::map<std::pair<int32_t, bool>, int64_t> count;
      const Role& role = RoleOf(i);
      for (size_t k = 0; k < role.schedule.size(); ++k) {
        const Op& op = role.schedule[k];
        if (!IsP2p(op.kind)) continue;
        const bool send = IsSend(op.kind);
        const auto peer = static_cast<int32_t>(prog::DecodeStepAttrs(op).peer);
        const int64_t s = count[{peer, send}]++;
        index_[i][{peer, send, s}] = k;
        seq_of_[i][k] = s;
      }
    }
  }

  // Runs row i's next op if it can start; returns whether it did.
  bool Step(size_t i) {
    const Op& op = RoleOf(i).schedule[pos_[i]];
    if (op.kind == OpKind::Forward || op.kind == OpKind::Backward) {
      Compute(i, op);
      return true;
    }
    if (IsP2p(op.kind)) return TransferGroup(i);
    if (op.kind == OpKind::ReduceGrads || op.kind == OpKind::OptimizerStep) return StepBody(i, op);
    ++pos_[i];  // zero_grads, gather/release: no modelled time
    return true;
  }

  void Compute(size_t i, const Op& op) {
    const int32_t pr = RoleOf(i).pipeline_rank;
    const double dur = op.kind == OpKind::Forward ? d_.forward_s[pr] : d_.backward_s[pr];
    const prog::StepAttrs s = prog::DecodeStepAttrs(op);
    slices_.push_back({static_cast<int32_t>(i),
                       fmt::format("{}{}{}", op.kind == OpKind::Forward ? 'F' : 'B', s.microbatch,
                                   std::string(s.chunk, '\'')),
                       "compute", clock_[i], dur, s.microbatch, s.chunk});
    ExpertAllToAlls(i, op, dur);
    clock_[i] += dur;
    ++pos_[i];
  }

  // --- expert parallelism: the body's all-to-alls over Ep, each at its place among the body's
  // ops, inside the computation's slice ---
  void ExpertAllToAlls(size_t i, const Op& op, double dur) {
    const Role& role = RoleOf(i);
    const prog::StepAttrs s = prog::DecodeStepAttrs(op);
    const Chunk& chunk = role.chunks[s.chunk];
    const Body& body = role.bodies[op.kind == OpKind::Forward ? chunk.forward : chunk.backward];
    const size_t n = body.ops.size();
    if (n == 0) return;
    const double share = dur / static_cast<double>(n);
    const size_t pr = static_cast<size_t>(role.pipeline_rank);
    const double modelled = pr < d_.ep_all_to_all_s.size() ? d_.ep_all_to_all_s[pr] : 0.0;
    const double each = modelled > 0 ? std::min(modelled, share) : share;
    for (size_t k = 0; k < n; ++k) {
      const Op& bop = body.ops[k];
      if (bop.comm != CommKind::Ep || !IsCollective(bop.kind)) continue;
      slices_.push_back({static_cast<int32_t>(i), DescribeOp(bop), "expert-parallel",
                         clock_[i] + share * static_cast<double>(k), each, s.microbatch, s.chunk});
    }
  }

  // When the partner of row i's transfer at position k posted its group: nullopt while it has
  // not; the lowest double when nothing is waited for (a send, or a partner outside the trace).
  // planrun posts a group's sends before its receives and a send never blocks
  // (rank_runner.cpp): only a receive waits, for its partner's send to be posted.
  std::optional<double> PartnerPosted(size_t i, size_t k) const {
    constexpr double kNoWait = std::numeric_limits<double>::lowest();
    const Op& t = RoleOf(i).schedule[k];
    const int32_t rank = ranks_[i];
    const int32_t peer_rank = p_.MemberOf(rank, CommKind::Pp, prog::DecodeStepAttrs(t).peer);
    auto it = row_of_.find(peer_rank);
    if (it == row_of_.end()) return kNoWait;
    const auto j = static_cast<size_t>(it->second);
    const bool send = IsSend(t.kind);
    if (send) return kNoWait;
    const int32_t my_index = p_.IndexIn(rank, CommKind::Pp);
    auto f = index_[j].find({my_index, !send, seq_of_[i].at(k)});
    if (f == index_[j].end()) return kNoWait;
    // The partner's group must be posted: its position is at or past the group's start.
    auto when = posted_[j].find(GroupStart(RoleOf(j), f->second));
    if (when == posted_[j].end()) return std::nullopt;
    return when->second;
  }

  bool TransferGroup(size_t i) {
    const Role& role = RoleOf(i);
    const size_t end = GroupEnd(role, pos_[i]);
    posted_[i].emplace(pos_[i], clock_[i]);
    double start = clock_[i];
    for (size_t k = pos_[i]; k < end; ++k) {
      const std::optional<double> when = PartnerPosted(i, k);
      if (!when) return false;
      start = std::max(start, *when);
    }
    for (size_t k = pos_[i]; k < end; ++k) {
      const Op& t = role.schedule[k];
      const prog::StepAttrs s = prog::DecodeStepAttrs(t);
      slices_.push_back({static_cast<int32_t>(i), DescribeOp(t), "pipeline", start, d_.transfer_s,
                         s.microbatch, s.chunk});
    }
    clock_[i] = start + d_.transfer_s;
    pos_[i] = end;
    return true;
  }

  // reduce_grads and optimizer_step: cross-rank collectives start when every row has arrived.
  bool StepBody(size_t i, const Op& op) {
    auto& arr = arrivals_[{op.kind, 0}];
    if (arr.size() < n_) arr.resize(n_, -1);
    if (arr[i] < 0) arr[i] = clock_[i];
    const bool all = std::all_of(arr.begin(), arr.end(), [](double t) { return t >= 0; });
    if (!all) return false;
    const int32_t pr = RoleOf(i).pipeline_rank;
    const double start = *std::max_element(arr.begin(), arr.end());
    const double dur = op.kind == OpKind::ReduceGrads ? d_.reduce_grads_s[pr] : d_.optimizer_s[pr];
    slices_.push_back({static_cast<int32_t>(i), std::string(OpName(op.kind)),
                       op.kind == OpKind::ReduceGrads ? "data-parallel" : "optimizer", start, dur});
    clock_[i] = start + dur;
    ++pos_[i];
    return true;
  }

  const Program& p_;
  const TraceDurations& d_;
  const std::vector<int32_t>& ranks_;
  const size_t n_;
  std::map<int32_t, int32_t> row_of_;  // traced rank -> row
  std::vector<size_t> pos_;
  std::vector<double> clock_;
  std::vector<Slice> slices_;
  std::vector<std::map<std::tuple<int32_t, bool, int64_t>, size_t>> index_;
  std::vector<std::map<size_t, int64_t>> seq_of_;  // transfer position -> its k
  // Barrier arrival for cross-rank step bodies (reduce_grads, optimizer_step), per occurrence.
  std::map<std::pair<OpKind, int>, std::vector<double>> arrivals_;
  std::vector<std::map<size_t, double>> posted_;  // transfer group start -> time the row reached it
};

std::string TraceJson(const Program& p, const std::vector<int32_t>& ranks,
                      const std::vector<Slice>& slices) {
  std::string j = "{\"displayTimeUnit\":\"ms\",\"otherData\":{\"plan\":\"" + p.plan_name +
                  "\"},\"traceEvents\":[\n";
  j += "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":0,\"args\":{\"name\":\"simulated step\"}}";
  for (size_t i = 0; i < ranks.size(); ++i) {
    const Coordinates& c = p.ranks[ranks[i]].coords;
    j += fmt::format(
        ",\n{{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":0,\"tid\":{},\"args\":{{\"name\":"
        "\"rank {} (pp {} tp {} dp {})\"}}}}",
        i, ranks[i], c.pp, c.tp, c.dp);
    j += fmt::format(
        ",\n{{\"name\":\"thread_sort_index\",\"ph\":\"M\",\"pid\":0,\"tid\":{},\"args\":{{\"sort_"
        "index\":{}}}}}",
        i, i);
  }
  for (const Slice& s : slices) {
    j += fmt::format(
        ",\n{{\"name\":\"{}\",\"cat\":\"{}\",\"ph\":\"X\",\"pid\":0,\"tid\":{},\"ts\":{:.3f},"
        "\"dur\":{:.3f}",
        s.name, s.cat, s.row, s.start * 1e6, s.dur * 1e6);
    if (s.microbatch >= 0)
      j += fmt::format(",\"args\":{{\"microbatch\":{},\"chunk\":{}}}", s.microbatch, s.chunk);
    j += "}";
  }
  j += "\n]}\n";
  return j;
}

}  // namespace

TraceResult ChromeTrace(const Program& p, const TraceDurations& d) {
  const std::vector<int32_t> ranks = TracedRanks(p);
  StepReplay replay(p, d, ranks);
  replay.Run();
  TraceResult result;
  double end = 0;
  for (double c : replay.clock()) end = std::max(end, c);
  // The step's fixed host cost follows the last rank's optimizer on every rank.
  std::vector<Slice> slices = replay.slices();
  if (d.step_overhead_s > 0)
    for (size_t i = 0; i < ranks.size(); ++i)
      slices.push_back({static_cast<int32_t>(i), "step overhead", "host", end, d.step_overhead_s});
  result.step_s = end + std::max(0.0, d.step_overhead_s);
  result.json = TraceJson(p, ranks, slices);
  return result;
}

}  // namespace paraplan::lower
