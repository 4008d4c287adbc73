// The loop form of a schedule (see schedule_loops.h).
#include "compiler/lower/schedule_loops.h"

#include <algorithm>
#include <limits>
#include <numeric>

#include "runtime/format/program_model.h"

namespace paraplan::lower {

namespace {

using prog::ScheduleLoop;
using prog::ScheduleStep;

bool IsTransfer(prog::OpKind kind) {
  return kind == prog::OpKind::SendActivation || kind == prog::OpKind::RecvActivation ||
         kind == prog::OpKind::SendGrad || kind == prog::OpKind::RecvGrad;
}

bool IsLoopStep(const ScheduleStep& s) {
  return s.kind() == prog::OpKind::Forward || s.kind() == prog::OpKind::Backward ||
         IsTransfer(s.kind());
}

// Everything but the fields that advance (microbatch, slot, group) is equal.
bool SameShape(const ScheduleStep& a, const ScheduleStep& b) {
  return a.kind() == b.kind() && a.comm() == b.comm() && a.operand() == b.operand() &&
         a.peer() == b.peer() && a.chunk() == b.chunk();
}

int64_t Mod(int64_t x, int64_t m) { return ((x % m) + m) % m; }

// The strides of a candidate period, learnt from the first pairs that name them: the
// microbatch's, the non-zero group's, and per chunk the slot's residue modulo its slot count
// (one slot stride must then meet every chunk's residue).
class StrideMatcher {
 public:
  explicit StrideMatcher(const std::vector<int32_t>& slots)
      : slots_(slots), residue_(slots.size(), -1) {}

  // Whether y is x one period later.
  bool Match(const ScheduleStep& x, const ScheduleStep& y) {
    if (!SameShape(x, y) || !IsLoopStep(x)) return false;
    const auto c = static_cast<size_t>(x.chunk());
    if (c >= slots_.size() || slots_[c] < 1) return false;
    const int64_t dm = int64_t{y.microbatch()} - x.microbatch();
    if (dm < 1 || (dm_ >= 0 && dm != dm_)) return false;
    if ((x.group() == 0) != (y.group() == 0)) return false;
    if (x.group() != 0) {
      const int64_t dg = int64_t{y.group()} - x.group();
      if (dg < 0 || (dg_ >= 0 && dg != dg_)) return false;
      dg_ = dg;
    }
    const int64_t r = Mod(int64_t{y.slot()} - x.slot(), slots_[c]);
    if (residue_[c] >= 0 && r != residue_[c]) return false;
    dm_ = dm, residue_[c] = r;
    return true;
  }

  // The loop's strides; false when no slot stride meets every chunk's residue.
  bool Strides(int32_t* dm, int32_t* ds, int32_t* dg) const {
    int64_t lcm = 1;
    for (size_t c = 0; c < slots_.size(); ++c)
      if (residue_[c] >= 0) {
        lcm = std::lcm(lcm, int64_t{slots_[c]});
        if (lcm > (int64_t{1} << 20)) return false;
      }
    for (int64_t s = 0; s < lcm; ++s) {
      bool ok = true;
      for (size_t c = 0; c < slots_.size() && ok; ++c)
        ok = residue_[c] < 0 || s % slots_[c] == residue_[c];
      if (!ok) continue;
      if (dm_ > std::numeric_limits<int32_t>::max()) return false;
      *dm = static_cast<int32_t>(dm_), *ds = static_cast<int32_t>(s);
      *dg = static_cast<int32_t>(std::max<int64_t>(dg_, 0));
      return true;
    }
    return false;
  }

 private:
  const std::vector<int32_t>& slots_;
  std::vector<int64_t> residue_;
  int64_t dm_ = -1, dg_ = -1;
};

struct Candidate {
  int64_t begin = 0, length = 0, count = 0;
  int32_t dm = 0, ds = 0, dg = 0;
  int64_t Saving() const { return (count - 1) * length; }
};

bool JoinsGroup(const ScheduleStep& a, const ScheduleStep& b) {
  return IsTransfer(a.kind()) && IsTransfer(b.kind()) && a.group() != 0 && a.group() == b.group();
}

// No transfer group runs across the loop's start, an iteration's boundary or its end.
bool BoundariesHold(const std::vector<ScheduleStep>& flat, int64_t begin, int64_t length,
                    int64_t count) {
  auto at = [&](int64_t i) -> const ScheduleStep& { return flat[static_cast<size_t>(i)]; };
  const int64_t end = begin + length * count, n = static_cast<int64_t>(flat.size());
  if (begin > 0 && JoinsGroup(at(begin - 1), at(begin))) return false;
  if (count > 1 && JoinsGroup(at(begin + length - 1), at(begin + length))) return false;
  return end >= n || !JoinsGroup(at(end - 1), at(end));
}

// The best loop (largest saving) through `anchor` inside [lo, hi).
Candidate BestLoopAt(const std::vector<ScheduleStep>& flat, const std::vector<int32_t>& slots,
                     int64_t lo, int64_t hi, int64_t anchor) {
  Candidate best;
  auto at = [&](int64_t i) -> const ScheduleStep& { return flat[static_cast<size_t>(i)]; };
  if (!IsLoopStep(at(anchor))) return best;
  for (int64_t period = 1; anchor + 2 * period <= hi; ++period) {
    if (hi - lo - period <= best.Saving()) break;  // cannot save more than the best so far
    if (!SameShape(at(anchor), at(anchor + period))) continue;
    StrideMatcher m(slots);
    bool one_period = true;
    for (int64_t x = anchor; x < anchor + period && one_period; ++x)
      one_period = m.Match(at(x), at(x + period));
    if (!one_period) continue;
    int64_t last = anchor + period - 1;  // every x in [first, last] matches x + period
    while (last + 1 + period < hi && m.Match(at(last + 1), at(last + 1 + period))) ++last;
    int64_t first = anchor;
    while (first - 1 >= lo && m.Match(at(first - 1), at(first - 1 + period))) --first;
    Candidate c;
    c.length = period;
    if (!m.Strides(&c.dm, &c.ds, &c.dg)) continue;
    const int64_t end = last + period + 1;
    for (c.begin = first; c.begin + 2 * period <= end; ++c.begin) {
      c.count = (end - c.begin) / period;
      if (BoundariesHold(flat, c.begin, period, c.count)) break;
    }
    if (c.begin + 2 * period > end) continue;
    if (c.Saving() > best.Saving()) best = c;
  }
  return best;
}

void FindIn(const std::vector<ScheduleStep>& flat, const std::vector<int32_t>& slots, int64_t lo,
            int64_t hi, int64_t min_saving, std::vector<Candidate>* out) {
  if (hi - lo < 4) return;
  Candidate best;
  for (int64_t anchor : {lo + (hi - lo) / 2, lo + (hi - lo) / 4, lo + 3 * (hi - lo) / 4,
                         lo + (hi - lo) / 8, lo + 3 * (hi - lo) / 8}) {
    Candidate c = BestLoopAt(flat, slots, lo, hi, anchor);
    if (c.Saving() > best.Saving()) best = c;
  }
  if (best.count < 2 || best.Saving() < std::max<int64_t>(min_saving, 1)) return;
  FindIn(flat, slots, lo, best.begin, min_saving, out);
  out->push_back(best);
  FindIn(flat, slots, best.begin + best.length * best.count, hi, min_saving, out);
}

}  // namespace

LoopForm FindScheduleLoops(const std::vector<ScheduleStep>& flat,
                           const std::vector<int32_t>& chunk_slots, int64_t min_saving) {
  std::vector<Candidate> found;
  FindIn(flat, chunk_slots, 0, static_cast<int64_t>(flat.size()), min_saving, &found);
  LoopForm form;
  int64_t at = 0;
  for (const Candidate& c : found) {
    form.steps.insert(form.steps.end(), flat.begin() + at, flat.begin() + c.begin + c.length);
    form.loops.emplace_back(static_cast<int32_t>(form.steps.size() - c.length),
                            static_cast<int32_t>(c.length), static_cast<int32_t>(c.count), c.dm,
                            c.ds, c.dg);
    at = c.begin + c.length * c.count;
  }
  form.steps.insert(form.steps.end(), flat.begin() + at, flat.end());
  if (!prog::mem::CheckScheduleLoops(form.steps, form.loops, chunk_slots).empty())
    return {flat, {}};
  return form;
}

std::optional<LoopForm> ExtrapolateLoops(const LoopForm& a, const LoopForm& b, const LoopForm& c,
                                         int64_t k, const std::vector<int32_t>& chunk_slots) {
  if (a.steps.size() != b.steps.size() || a.steps.size() != c.steps.size() ||
      a.loops.size() != b.loops.size() || a.loops.size() != c.loops.size() || k < 0)
    return std::nullopt;
  constexpr int64_t kMax = std::numeric_limits<int32_t>::max();
  LoopForm out;
  out.loops.reserve(a.loops.size());
  for (size_t i = 0; i < a.loops.size(); ++i) {
    const ScheduleLoop &la = a.loops[i], &lb = b.loops[i], &lc = c.loops[i];
    auto same = [&](const ScheduleLoop& x) {
      return x.begin() == la.begin() && x.length() == la.length() &&
             x.microbatch_stride() == la.microbatch_stride() &&
             x.slot_stride() == la.slot_stride() && x.group_stride() == la.group_stride();
    };
    const int64_t dc = int64_t{lb.count()} - la.count();
    if (!same(lb) || !same(lc) || int64_t{lc.count()} - lb.count() != dc) return std::nullopt;
    const int64_t count = la.count() + k * dc;
    if (count < 1 || count > kMax) return std::nullopt;
    out.loops.emplace_back(la.begin(), la.length(), static_cast<int32_t>(count),
                           la.microbatch_stride(), la.slot_stride(), la.group_stride());
  }
  out.steps.reserve(a.steps.size());
  for (size_t i = 0; i < a.steps.size(); ++i) {
    const ScheduleStep &sa = a.steps[i], &sb = b.steps[i], &sc = c.steps[i];
    if (!SameShape(sa, sb) || !SameShape(sa, sc)) return std::nullopt;
    const int64_t dm = int64_t{sb.microbatch()} - sa.microbatch();
    if (int64_t{sc.microbatch()} - sb.microbatch() != dm) return std::nullopt;
    if ((sa.group() == 0) != (sb.group() == 0) || (sa.group() == 0) != (sc.group() == 0))
      return std::nullopt;
    const int64_t dg = int64_t{sb.group()} - sa.group();
    if (int64_t{sc.group()} - sb.group() != dg) return std::nullopt;
    int64_t slot = sa.slot();
    const bool slotted = sa.kind() == prog::OpKind::Forward ||
                         sa.kind() == prog::OpKind::Backward || IsTransfer(sa.kind());
    if (slotted) {
      const auto ch = static_cast<size_t>(sa.chunk());
      if (ch >= chunk_slots.size() || chunk_slots[ch] < 1) return std::nullopt;
      const int64_t s = chunk_slots[ch];
      const int64_t ds = Mod(int64_t{sb.slot()} - sa.slot(), s);
      if (Mod(int64_t{sc.slot()} - sb.slot(), s) != ds) return std::nullopt;
      slot = Mod(sa.slot() + k * ds, s);
    } else if (sb.slot() != sa.slot() || sc.slot() != sa.slot()) {
      return std::nullopt;
    }
    const int64_t mb = sa.microbatch() + k * dm, group = sa.group() + k * dg;
    if (mb < 0 || mb > kMax || group < 0 || group > kMax) return std::nullopt;
    out.steps.emplace_back(static_cast<int32_t>(mb), static_cast<int32_t>(slot),
                           static_cast<int32_t>(group), sa.operand(), sa.peer(), sa.chunk(),
                           sa.kind(), sa.comm());
  }
  if (!prog::mem::CheckScheduleLoops(out.steps, out.loops, chunk_slots).empty())
    return std::nullopt;
  return out;
}

std::vector<ScheduleStep> ExpandLoops(const LoopForm& form,
                                      const std::vector<int32_t>& chunk_slots) {
  std::vector<ScheduleStep> out;
  prog::mem::ForEachExpandedStep(form.steps, form.loops, chunk_slots,
                                 [&](const ScheduleStep& s) { out.push_back(s); });
  return out;
}

}  // namespace paraplan::lower
