// Chrome trace of a simulated step (see trace.h).
#include "compiler/lower/trace.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>

#include "compiler/lower/verify.h"
#include "runtime/format/ops.h"

namespace paraplan::lower {

namespace {

struct Slice {
  int32_t row;
  std::string name, cat;
  double start, dur;
  int64_t microbatch = -1, chunk = -1;
};

}  // namespace

TraceResult ChromeTrace(const Program& p, const TraceDurations& d) {
  // The traced ranks: all, or one pipeline.
  std::vector<int32_t> ranks;
  for (int32_t r = 0; r < p.world_size; ++r) {
    const Coordinates& c = p.ranks[r].coords;
    if (p.world_size <= kTraceAllRanksUpTo || (c.tp == 0 && c.cp == 0 && c.dp == 0))
      ranks.push_back(r);
  }
  std::map<int32_t, int32_t> row_of;
  for (size_t i = 0; i < ranks.size(); ++i) row_of[ranks[i]] = static_cast<int32_t>(i);
  const size_t n = ranks.size();
  std::vector<size_t> pos(n, 0);
  std::vector<double> clock(n, 0.0);
  std::vector<Slice> slices;
  // Post time of each rank's current transfer group, per (rank, schedule op index of its first op).
  auto role_of = [&](size_t i) -> const Role& { return p.roles[p.ranks[ranks[i]].role]; };
  auto group_end = [&](const Role& role, size_t at) {
    const int64_t group = prog::DecodeStepAttrs(role.schedule[at]).group;
    size_t j = at + 1;
    if (group != 0)
      while (j < role.schedule.size() && IsP2p(role.schedule[j].kind) &&
             prog::DecodeStepAttrs(role.schedule[j]).group == group)
        ++j;
    return j;
  };
  // k-th transfer index per (rank, peer, send?) -> op position, for partner lookup.
  std::vector<std::map<std::tuple<int32_t, bool, int64_t>, size_t>> index(n);
  std::vector<std::map<size_t, int64_t>> seq_of(n);
  for (size_t i = 0; i < n; ++i) {
    std::map<std::pair<int32_t, bool>, int64_t> count;
    const Role& role = role_of(i);
    for (size_t k = 0; k < role.schedule.size(); ++k) {
      const Op& op = role.schedule[k];
      if (!IsP2p(op.kind)) continue;
      bool send = op.kind == OpKind::SendActivation || op.kind == OpKind::SendGrad;
      const auto peer = static_cast<int32_t>(prog::DecodeStepAttrs(op).peer);
      int64_t s = count[{peer, send}]++;
      index[i][{peer, send, s}] = k;
      seq_of[i][k] = s;
    }
  }
  // Barrier arrival for cross-rank step bodies (reduce_grads, optimizer_step), per occurrence.
  std::map<std::pair<OpKind, int>, std::vector<double>> arrivals;
  std::vector<std::map<size_t, double>> posted(
      n);  // transfer group start -> time the rank reached it
  bool progress = true;
  auto done = [&]() {
    for (size_t i = 0; i < n; ++i)
      if (pos[i] < role_of(i).schedule.size()) return false;
    return true;
  };
  while (!done() && progress) {
    progress = false;
    for (size_t i = 0; i < n; ++i) {
      const Role& role = role_of(i);
      int32_t rank = ranks[i];
      while (pos[i] < role.schedule.size()) {
        const Op& op = role.schedule[pos[i]];
        int32_t pr = role.pipeline_rank;
        if (op.kind == OpKind::Forward || op.kind == OpKind::Backward) {
          double dur = op.kind == OpKind::Forward ? d.forward_s[pr] : d.backward_s[pr];
          const prog::StepAttrs s = prog::DecodeStepAttrs(op);
          slices.push_back({static_cast<int32_t>(i),
                            fmt::format("{}{}{}", op.kind == OpKind::Forward ? 'F' : 'B',
                                        s.microbatch, std::string(s.chunk, '\'')),
                            "compute", clock[i], dur, s.microbatch, s.chunk});
          clock[i] += dur;
          ++pos[i];
          progress = true;
          continue;
        }
        if (IsP2p(op.kind)) {
          size_t end = group_end(role, pos[i]);
          posted[i].emplace(pos[i], clock[i]);
          double start = clock[i];
          bool ready = true;
          for (size_t k = pos[i]; k < end && ready; ++k) {
            const Op& t = role.schedule[k];
            int32_t peer_rank = p.MemberOf(rank, CommKind::Pp, prog::DecodeStepAttrs(t).peer);
            auto it = row_of.find(peer_rank);
            if (it == row_of.end()) continue;
            size_t j = static_cast<size_t>(it->second);
            bool send = t.kind == OpKind::SendActivation || t.kind == OpKind::SendGrad;
            // planrun posts a group's sends before its receives and a send never blocks
            // (rank_runner.cpp): only a receive waits, for its partner's send to be posted.
            if (send) continue;
            int32_t my_index = p.IndexIn(rank, CommKind::Pp);
            auto f = index[j].find({my_index, !send, seq_of[i][k]});
            if (f == index[j].end()) continue;
            const Role& prole = role_of(j);
            // The partner's group must be posted: its position is at or past the group's start.
            size_t pstart = f->second;
            while (pstart > 0 && IsP2p(prole.schedule[pstart - 1].kind) &&
                   prog::DecodeStepAttrs(prole.schedule[pstart]).group != 0 &&
                   prog::DecodeStepAttrs(prole.schedule[pstart - 1]).group ==
                       prog::DecodeStepAttrs(prole.schedule[pstart]).group)
              --pstart;
            auto when = posted[j].find(pstart);
            if (when == posted[j].end()) {
              ready = false;
              break;
            }
            start = std::max(start, when->second);
          }
          if (!ready) break;
          for (size_t k = pos[i]; k < end; ++k) {
            const Op& t = role.schedule[k];
            const prog::StepAttrs s = prog::DecodeStepAttrs(t);
            slices.push_back({static_cast<int32_t>(i), DescribeOp(t), "pipeline", start,
                              d.transfer_s, s.microbatch, s.chunk});
          }
          clock[i] = start + d.transfer_s;
          pos[i] = end;
          progress = true;
          continue;
        }
        if (op.kind == OpKind::ReduceGrads || op.kind == OpKind::OptimizerStep) {
          auto& arr = arrivals[{op.kind, 0}];
          if (arr.size() < n) arr.resize(n, -1);
          if (arr[i] < 0) arr[i] = clock[i];
          bool all = std::all_of(arr.begin(), arr.end(), [](double t) { return t >= 0; });
          if (!all) break;
          double start = *std::max_element(arr.begin(), arr.end());
          double dur = op.kind == OpKind::ReduceGrads ? d.reduce_grads_s[pr] : d.optimizer_s[pr];
          slices.push_back({static_cast<int32_t>(i), std::string(OpName(op.kind)),
                            op.kind == OpKind::ReduceGrads ? "data-parallel" : "optimizer", start,
                            dur});
          clock[i] = start + dur;
          ++pos[i];
          progress = true;
          continue;
        }
        ++pos[i];  // zero_grads, gather/release: no modelled time
        progress = true;
      }
    }
  }
  TraceResult result;
  for (double c : clock) result.step_s = std::max(result.step_s, c);
  std::string& j = result.json;
  j = "{\"displayTimeUnit\":\"ms\",\"otherData\":{\"plan\":\"" + p.plan_name +
      "\"},\"traceEvents\":[\n";
  j += "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":0,\"args\":{\"name\":\"simulated step\"}}";
  for (size_t i = 0; i < n; ++i) {
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
  return result;
}

}  // namespace paraplan::lower
