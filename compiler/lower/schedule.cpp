// Pipeline schedules (see schedule.h).
#include "compiler/lower/schedule.h"

#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <map>
#include <queue>
#include <tuple>

namespace paraplan::lower {

std::string CheckScheduleShape(const ScheduleShape& s) {
  if (s.pp < 1) return fmt::format("pipeline size {} < 1", s.pp);
  if (s.microbatches < 1)
    return fmt::format("{} microbatches per step; need at least 1", s.microbatches);
  if (s.kind != prog::ScheduleKind::Interleaved1F1B) {
    if (s.vpp != 1) return fmt::format("vpp = {} needs the interleaved_1f1b schedule", s.vpp);
    return {};
  }
  if (s.vpp < 2) return fmt::format("interleaved_1f1b needs vpp >= 2, got {}", s.vpp);
  if (s.pp < 2) return "interleaved_1f1b needs pp >= 2";
  int32_t g = s.Group();
  if (g < s.pp || g > s.microbatches)
    return fmt::format(
        "interleaved_1f1b needs pp <= microbatch group <= microbatches: {} <= {} <= {} does not "
        "hold",
        s.pp, g, s.microbatches);
  int32_t rest = s.microbatches % g;
  if (rest != 0 && rest < s.pp)
    return fmt::format(
        "interleaved_1f1b: microbatches mod group = {} mod {} = {}, which is neither 0 nor >= pp = "
        "{}",
        s.microbatches, g, rest, s.pp);
  return {};
}

int32_t WarmupCount(const ScheduleShape& s, int32_t rank) {
  switch (s.kind) {
    case prog::ScheduleKind::Gpipe:
      return s.microbatches;
    case prog::ScheduleKind::OneFOneB:
      return std::min(s.pp - rank - 1, s.microbatches);
    case prog::ScheduleKind::Interleaved1F1B: {
      int32_t total = s.microbatches * s.vpp;
      int32_t w = 2 * (s.pp - rank - 1) + (s.vpp - 1) * s.Group();
      return std::min(w, total);
    }
  }
  return 0;
}

namespace {

// Megatron's get_schedule_table: (microbatch, chunk) for virtual microbatch k.
std::vector<ComputeStep> GroupTable(const ScheduleShape& s) {
  std::vector<ComputeStep> table;
  int32_t g = s.Group();
  for (int32_t first = 0; first < s.microbatches; first += g) {
    int32_t last = first + g >= s.microbatches ? s.microbatches : first + g;
    for (int32_t c = 0; c < s.vpp; ++c)
      for (int32_t mb = first; mb < last; ++mb) table.push_back({false, mb, c});
  }
  return table;
}

}  // namespace

std::vector<ComputeStep> ComputeOrder(const ScheduleShape& s, int32_t rank) {
  std::vector<ComputeStep> order;
  int32_t m = s.microbatches;
  if (s.kind == prog::ScheduleKind::Gpipe) {
    for (int32_t mb = 0; mb < m; ++mb) order.push_back({false, mb, 0});
    for (int32_t mb = 0; mb < m; ++mb) order.push_back({true, mb, 0});
    return order;
  }
  std::vector<ComputeStep> table;
  if (s.kind == prog::ScheduleKind::OneFOneB) {
    for (int32_t mb = 0; mb < m; ++mb) table.push_back({false, mb, 0});
  } else {
    table = GroupTable(s);
  }
  auto fwd = [&](int32_t k) { return ComputeStep{false, table[k].microbatch, table[k].chunk}; };
  auto bwd = [&](int32_t k) {
    return ComputeStep{true, table[k].microbatch, s.vpp - 1 - table[k].chunk};
  };
  auto total = static_cast<int32_t>(table.size());
  int32_t warmup = WarmupCount(s, rank);
  int32_t steady = total - warmup;
  for (int32_t k = 0; k < warmup; ++k) order.push_back(fwd(k));
  for (int32_t i = 0; i < steady; ++i) {
    order.push_back(fwd(warmup + i));
    order.push_back(bwd(i));
  }
  for (int32_t k = steady; k < total; ++k) order.push_back(bwd(k));
  return order;
}

std::string FormatOrder(const std::vector<ComputeStep>& order) {
  std::string out;
  for (const ComputeStep& c : order) {
    if (!out.empty()) out += ' ';
    out += fmt::format("{}{}{}", c.backward ? 'B' : 'F', c.microbatch, std::string(c.chunk, '\''));
  }
  return out;
}

namespace {

// One transfer between two computations: which compute produces it and which consumes it.
struct Need {
  bool grad = false;
  int32_t microbatch = 0;
  int32_t chunk = 0;  // the consumer's local chunk
};

}  // namespace

// Transfer placement by a discrete-event simulation of all pipeline ranks (forward 1 unit,
// backward 2). A rank alternates between an open group (posted) and a computation. When a
// computation that feeds another rank finishes, its send goes into the producer's new open
// group; the matching receive goes into the group the consumer posts right before the
// computation that needs it (Megatron's placement: a receive never holds a buffer earlier than
// necessary). The producer's group completes when that group is posted. If the simulation
// stalls (every rank waits), the oldest waiting transfer is placed early instead, in the
// consumer's current group: a group then only ever waits for a group that is already posted
// or will be when a running computation ends, so the result is deadlock-free under rendezvous
// semantics. Per rank pair the k-th send meets the k-th receive, as both sides follow one
// global placement order.
std::vector<std::vector<PipelineStep>> PipelinePrograms(const ScheduleShape& s) {
  const int32_t p = s.pp;
  const int32_t stages = s.pp * s.vpp;
  std::vector<std::vector<ComputeStep>> order(p);
  std::vector<std::map<std::tuple<int32_t, int32_t, bool>, size_t>> index_of(
      p);  // (mb, chunk, backward) -> position
  for (int32_t r = 0; r < p; ++r) {
    order[r] = ComputeOrder(s, r);
    for (size_t i = 0; i < order[r].size(); ++i)
      index_of[r][{order[r][i].microbatch, order[r][i].chunk, order[r][i].backward}] = i;
  }
  std::vector<std::vector<PipelineStep>> out(p);
  std::vector<size_t> pos(p, 0);
  std::vector<bool> computing(p, false);
  std::vector<size_t> group_start(p, 0);  // index in out[r] of the open group's first op
  std::vector<std::vector<PipelineStep>> pending(
      p);                                  // receives for the group after the running compute
  std::vector<int32_t> unposted(p, 0);     // partners of the open group not yet posted
  std::vector<std::vector<bool>> have(p);  // (microbatch, chunk, grad) inputs already placed
  std::vector<int32_t> group_id(p, 0);
  struct Deferred {
    int64_t serial;
    int32_t producer;
    size_t consumer_index;  // position of the consuming compute in order[consumer]
    PipelineStep recv;
  };
  std::vector<std::vector<Deferred>> deferred(p);  // per consumer
  int64_t serial = 0;
  for (int32_t r = 0; r < p; ++r)
    have[r].assign(static_cast<size_t>(s.microbatches) * s.vpp * 2, false);
  auto have_index = [&](int32_t mb, int32_t chunk, bool grad) {
    return (static_cast<size_t>(mb) * s.vpp + chunk) * 2 + (grad ? 1 : 0);
  };
  using Event = std::pair<int64_t, int32_t>;  // (finish time, rank)
  std::priority_queue<Event, std::vector<Event>, std::greater<Event>> events;
  int64_t clock = 0;

  auto close_group = [&](int32_t r) {
    size_t n = out[r].size() - group_start[r];
    if (n >= 2) {
      ++group_id[r];
      for (size_t i = group_start[r]; i < out[r].size(); ++i) out[r][i].group = group_id[r];
    }
  };
  auto try_start = [&](int32_t r, int64_t now) {
    if (computing[r] || pos[r] >= order[r].size() || unposted[r] > 0) return;
    const ComputeStep& c = order[r][pos[r]];
    int32_t stage = c.chunk * p + r;
    bool needs = c.backward ? stage < stages - 1 : stage > 0;
    if (needs && !have[r][have_index(c.microbatch, c.chunk, c.backward)]) return;
    close_group(r);
    out[r].push_back({c.backward ? prog::OpKind::Backward : prog::OpKind::Forward, c.microbatch,
                      c.chunk, -1, 0});
    computing[r] = true;
    events.push({now + (c.backward ? 2 : 1), r});
  };
  // Puts a deferred receive into consumer b's open group (b is sitting); frees its producer.
  auto place = [&](int32_t b, const Deferred& d, int64_t now) {
    out[b].push_back(d.recv);
    have[b][have_index(d.recv.microbatch, d.recv.chunk, d.recv.kind == prog::OpKind::RecvGrad)] =
        true;
    --unposted[d.producer];
    try_start(d.producer, now);
  };
  // b posts a new open group: place the receives its next compute needs.
  auto post = [&](int32_t b, int64_t now) {
    auto& list = deferred[b];
    std::vector<Deferred> ready;
    for (size_t i = 0; i < list.size();)
      if (list[i].consumer_index == pos[b]) {
        ready.push_back(list[i]);
        list.erase(list.begin() + static_cast<std::ptrdiff_t>(i));
      } else {
        ++i;
      }
    std::sort(ready.begin(), ready.end(),
              [](const Deferred& x, const Deferred& y) { return x.serial < y.serial; });
    for (const Deferred& d : ready) place(b, d, now);
  };
  for (int32_t r = 0; r < p; ++r) try_start(r, 0);
  bool done = false;
  while (!done) {
    while (!events.empty()) {
      auto [now, r] = events.top();
      events.pop();
      clock = now;
      const ComputeStep c = order[r][pos[r]];
      ++pos[r];
      computing[r] = false;
      group_start[r] = out[r].size();
      int32_t stage = c.chunk * p + r;
      bool sends = c.backward ? stage > 0 : stage < stages - 1;
      if (sends) {
        int32_t peer_stage = c.backward ? stage - 1 : stage + 1;
        int32_t b = peer_stage % p, peer_chunk = peer_stage / p;
        out[r].push_back({c.backward ? prog::OpKind::SendGrad : prog::OpKind::SendActivation,
                          c.microbatch, c.chunk, b, 0});
        PipelineStep recv{c.backward ? prog::OpKind::RecvGrad : prog::OpKind::RecvActivation,
                          c.microbatch, peer_chunk, r, 0};
        size_t consumer = index_of[b].at({c.microbatch, peer_chunk, c.backward});
        ++unposted[r];
        deferred[b].push_back({serial++, r, consumer, recv});
        if (!computing[b] && consumer == pos[b]) {
          post(b, now);
          try_start(b, now);
        }
      }
      post(r, now);
      try_start(r, now);
    }
    // Everyone waits: place the oldest deferred receive early, in its consumer's open group.
    const Deferred* oldest = nullptr;
    int32_t consumer = -1;
    for (int32_t b = 0; b < p; ++b)
      for (const Deferred& d : deferred[b])
        if (!oldest || d.serial < oldest->serial) oldest = &d, consumer = b;
    if (!oldest) {
      done = true;
      break;
    }
    Deferred d = *oldest;
    auto& list = deferred[consumer];
    list.erase(list.begin() + (oldest - list.data()));
    place(consumer, d, clock);
    try_start(consumer, clock);
  }
  for (int32_t r = 0; r < p; ++r) close_group(r);
  return out;
}

}  // namespace paraplan::lower
