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

// The discrete-event simulation behind PipelinePrograms (see there).
class TransferPlacement {
 public:
  explicit TransferPlacement(const ScheduleShape& s)
      : s_(s),
        p_(s.pp),
        stages_(s.pp * s.vpp),
        order_(p_),
        index_of_(p_),
        out_(p_),
        pos_(p_, 0),
        computing_(p_, false),
        group_start_(p_, 0),
        unposted_(p_, 0),
        have_(p_),
        group_id_(p_, 0),
        deferred_(p_) {
    for (int32_t r = 0; r < p_; ++r) {
      order_[r] = ComputeOrder(s, r);
      for (size_t i = 0; i < order_[r].size(); ++i)
        index_of_[r][{order_[r][i].microbatch, order_[r][i].chunk, order_[r][i].backward}] = i;
      have_[r].assign(static_cast<size_t>(s.microbatches) * s.vpp * 2, false);
    }
  }

  std::vector<std::vector<PipelineStep>> Run() {
    for (int32_t r = 0; r < p_; ++r) TryStart(r, 0);
    do {
      while (!events_.empty()) {
        auto [now, r] = events_.top();
        events_.pop();
        clock_ = now;
        Finish(r, now);
      }
    } while (PlaceOldestEarly());
    for (int32_t r = 0; r < p_; ++r) CloseGroup(r);
    return std::move(out_);
  }

 private:
  struct Deferred {
    int64_t serial;
    int32_t producer;
    size_t consumer_index;  // position of the consuming compute in order_[consumer]
    PipelineStep recv;
  };

  size_t HaveIndex(int32_t mb, int32_t chunk, bool grad) const {
    return (static_cast<size_t>(mb) * s_.vpp + chunk) * 2 + (grad ? 1 : 0);
  }

  // Numbers rank r's open group when it holds two or more transfers.
  void CloseGroup(int32_t r) {
    const size_t n = out_[r].size() - group_start_[r];
    if (n >= 2) {
      ++group_id_[r];
      for (size_t i = group_start_[r]; i < out_[r].size(); ++i) out_[r][i].group = group_id_[r];
    }
  }

  // Starts rank r's next computation when it is idle, its open group's partners are posted and
  // its input has been placed.
  void TryStart(int32_t r, int64_t now) {
    if (computing_[r] || pos_[r] >= order_[r].size() || unposted_[r] > 0) return;
    const ComputeStep& c = order_[r][pos_[r]];
    const int32_t stage = c.chunk * p_ + r;
    const bool needs = c.backward ? stage < stages_ - 1 : stage > 0;
    if (needs && !have_[r][HaveIndex(c.microbatch, c.chunk, c.backward)]) return;
    CloseGroup(r);
    out_[r].push_back({c.backward ? prog::OpKind::Backward : prog::OpKind::Forward, c.microbatch,
                       c.chunk, -1, 0});
    computing_[r] = true;
    events_.push({now + (c.backward ? 2 : 1), r});
  }

  // Puts a deferred receive into consumer b's open group (b is sitting); frees its producer.
  void Place(int32_t b, const Deferred& d, int64_t now) {
    out_[b].push_back(d.recv);
    have_[b][HaveIndex(d.recv.microbatch, d.recv.chunk, d.recv.kind == prog::OpKind::RecvGrad)] =
        true;
    --unposted_[d.producer];
    TryStart(d.producer, now);
  }

  // b posts a new open group: place the receives its next compute needs.
  void Post(int32_t b, int64_t now) {
    auto& list = deferred_[b];
    std::vector<Deferred> ready;
    for (size_t i = 0; i < list.size();)
      if (list[i].consumer_index == pos_[b]) {
        ready.push_back(list[i]);
        list.erase(list.begin() + static_cast<std::ptrdiff_t>(i));
      } else {
        ++i;
      }
    std::sort(ready.begin(), ready.end(),
              [](const Deferred& x, const Deferred& y) { return x.serial < y.serial; });
    for (const Deferred& d : ready) Place(b, d, now);
  }

  // Rank r's computation ends: it opens a group with the send of its result (whose receive is
  // deferred to the consumer) and the receives its next computation needs.
  void Finish(int32_t r, int64_t now) {
    const ComputeStep c = order_[r][pos_[r]];
    ++pos_[r];
    computing_[r] = false;
    group_start_[r] = out_[r].size();
    const int32_t stage = c.chunk * p_ + r;
    const bool sends = c.backward ? stage > 0 : stage < stages_ - 1;
    if (sends) {
      const int32_t peer_stage = c.backward ? stage - 1 : stage + 1;
      const int32_t b = peer_stage % p_, peer_chunk = peer_stage / p_;
      out_[r].push_back({c.backward ? prog::OpKind::SendGrad : prog::OpKind::SendActivation,
                         c.microbatch, c.chunk, b, 0});
      const PipelineStep recv{c.backward ? prog::OpKind::RecvGrad : prog::OpKind::RecvActivation,
                              c.microbatch, peer_chunk, r, 0};
      const size_t consumer = index_of_[b].at({c.microbatch, peer_chunk, c.backward});
      ++unposted_[r];
      deferred_[b].push_back({serial_++, r, consumer, recv});
      if (!computing_[b] && consumer == pos_[b]) {
        Post(b, now);
        TryStart(b, now);
      }
    }
    Post(r, now);
    TryStart(r, now);
  }

  // Everyone waits: places the oldest deferred receive early, in its consumer's open group.
  // Returns false when nothing is deferred (the simulation is over).
  bool PlaceOldestEarly() {
    const Deferred* oldest = nullptr;
    int32_t consumer = -1;
    for (int32_t b = 0; b < p_; ++b)
      for (const Deferred& d : deferred_[b])
        if (!oldest || d.serial < oldest->serial) oldest = &d, consumer = b;
    if (!oldest) return false;
    const Deferred d = *oldest;
    auto& list = deferred_[consumer];
    list.erase(list.begin() + (oldest - list.data()));
    Place(consumer, d, clock_);
    TryStart(consumer, clock_);
    return true;
  }

  const ScheduleShape& s_;
  const int32_t p_;
  const int32_t stages_;
  std::vector<std::vector<ComputeStep>> order_;
  std::vector<std::map<std::tuple<int32_t, int32_t, bool>, size_t>>
      index_of_;  // (mb, chunk, backward) -> position
  std::vector<std::vector<PipelineStep>> out_;
  std::vector<size_t> pos_;
  std::vector<bool> computing_;
  std::vector<size_t> group_start_;      // index in out_[r] of the open group's first op
  std::vector<int32_t> unposted_;        // partners of the open group not yet posted
  std::vector<std::vector<bool>> have_;  // (microbatch, chunk, grad) inputs already placed
  std::vector<int32_t> group_id_;
  std::vector<std::vector<Deferred>> deferred_;  // per consumer
  int64_t serial_ = 0;
  using Event = std::pair<int64_t, int32_t>;  // (finish time, rank)
  std::priority_queue<Event, std::vector<Event>, std::greater<Event>> events_;
  int64_t clock_ = 0;
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
  return TransferPlacement(s).Run();
}

}  // namespace paraplan::lower
