// Slot pools (see slot_pool.h).
#include "compiler/analyze/slot_pool.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <numeric>
#include <unordered_set>
#include <utility>

namespace paraplan {

namespace {

int64_t Mod(int64_t x, int64_t m) { return ((x % m) + m) % m; }

// The pairs of uses that may not share a slot, each once (earlier, later by take).
std::vector<std::pair<int32_t, int32_t>> ConflictingPairs(const std::vector<SlotUse>& uses) {
  std::vector<int32_t> order(uses.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return uses[a].take < uses[b].take; });
  std::vector<std::pair<int32_t, int32_t>> pairs;
  std::vector<int32_t> active;
  for (int32_t j : order) {
    const SlotUse& later = uses[j];
    std::erase_if(active, [&](int32_t i) { return uses[i].release < later.take; });
    for (int32_t i : active)
      if (SlotsConflict(uses[i], later)) pairs.emplace_back(i, j);
    active.push_back(j);
  }
  return pairs;
}

// The most uses busy at one position: each use with the earlier uses it conflicts with.
int32_t PeakOf(const std::vector<std::pair<int32_t, int32_t>>& pairs, size_t uses) {
  std::vector<int32_t> degree(uses, 1);
  for (const auto& pair : pairs) ++degree[static_cast<size_t>(pair.second)];
  return uses == 0 ? 0 : *std::max_element(degree.begin(), degree.end());
}

// The modulo problem: classes (chunk, microbatch mod period), each use's class and round, and
// per class the constraints `offset[self] != offset[other] + delta * stride (mod slots)`.
struct ModuloProblem {
  struct Constraint {
    int32_t other;
    int64_t delta;
  };
  std::vector<int32_t> class_of, round_of;           // per use
  std::vector<int32_t> order;                        // classes by first take
  std::vector<std::vector<Constraint>> constraints;  // per class, on other classes
  std::vector<int64_t> self_deltas;          // rounds apart of conflicting uses of one class
  std::vector<std::vector<int32_t>> use_at;  // per class and round, its use (-1: none)
  int32_t peak = 0;                          // PeakSlots of the uses

  ModuloProblem(const std::vector<SlotUse>& uses, int32_t period) {
    std::map<std::pair<int32_t, int64_t>, int32_t> index;
    std::vector<int64_t> first_take;
    for (const SlotUse& u : uses) {
      const auto key = std::make_pair(u.chunk, u.microbatch % period);
      auto [it, added] = index.try_emplace(key, static_cast<int32_t>(first_take.size()));
      if (added) first_take.push_back(u.take);
      first_take[it->second] = std::min(first_take[it->second], u.take);
      class_of.push_back(it->second);
      round_of.push_back(static_cast<int32_t>(u.microbatch / period));
    }
    const auto classes = static_cast<int32_t>(first_take.size());
    use_at.resize(classes);
    for (size_t u = 0; u < uses.size(); ++u) {
      auto& at = use_at[class_of[u]];
      if (at.size() <= static_cast<size_t>(round_of[u])) at.resize(round_of[u] + 1, -1);
      at[round_of[u]] = static_cast<int32_t>(u);
    }
    order.resize(classes);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int32_t a, int32_t b) { return first_take[a] < first_take[b]; });
    constraints.resize(classes);
    // The steady state repeats one pair of classes at one distance in rounds every round: each
    // constraint is kept once (a table of the ones seen, by class pair and distance).
    int32_t rounds = 0;
    for (int32_t r : round_of) rounds = std::max(rounds, r + 1);
    const int64_t span = 2 * int64_t{rounds} + 1;
    const int64_t keys = int64_t{classes} * classes * span;
    const bool table = keys <= (int64_t{1} << 28);  // else a hash set (huge listed schedules)
    std::vector<bool> seen(table ? static_cast<size_t>(keys) : 0, false);
    std::unordered_set<int64_t> seen_set;
    const std::vector<std::pair<int32_t, int32_t>> pairs = ConflictingPairs(uses);
    for (const auto& [i, j] : pairs) {
      const int32_t a = class_of[i], b = class_of[j];
      const int64_t delta = int64_t{round_of[i]} - round_of[j];
      const int64_t key = (int64_t{b} * classes + a) * span + delta + rounds;
      if (table) {
        if (seen[static_cast<size_t>(key)]) continue;
        seen[static_cast<size_t>(key)] = true;
      } else if (!seen_set.insert(key).second) {
        continue;
      }
      if (a == b) {
        self_deltas.push_back(delta);
        continue;
      }
      constraints[b].push_back({a, delta});
      constraints[a].push_back({b, -delta});
    }
    peak = PeakOf(pairs, uses.size());
  }

  // Whether the stride gives the conflicting rounds of one class different slots.
  bool SeparatesRounds(int32_t slots, int32_t stride) const {
    return std::none_of(self_deltas.begin(), self_deltas.end(),
                        [&](int64_t delta) { return Mod(delta * stride, slots) == 0; });
  }

  // Whether the offsets give every two conflicting uses different slots.
  bool Holds(int32_t slots, int32_t stride, const std::vector<int32_t>& offset) const {
    if (!SeparatesRounds(slots, stride)) return false;
    for (size_t b = 0; b < constraints.size(); ++b)
      for (const Constraint& c : constraints[b])
        if (offset[b] == Mod(offset[c.other] + c.delta * stride, slots)) return false;
    return true;
  }

  // One offset per class for `slots` slots advancing by `stride`, first fit in class order.
  std::optional<std::vector<int32_t>> Solve(int32_t slots, int32_t stride) const {
    if (!SeparatesRounds(slots, stride)) return std::nullopt;
    std::vector<int32_t> offset(constraints.size(), -1);
    std::vector<uint8_t> taken(static_cast<size_t>(slots));
    for (int32_t b : order) {
      std::fill(taken.begin(), taken.end(), 0);
      for (const Constraint& c : constraints[b])
        if (offset[c.other] >= 0) taken[Mod(offset[c.other] + c.delta * stride, slots)] = 1;
      const auto free = std::find(taken.begin(), taken.end(), 0);
      if (free == taken.end()) return std::nullopt;
      offset[b] = static_cast<int32_t>(free - taken.begin());
    }
    return offset;
  }

  // Each use's slot: its class's offset advanced by the stride once per round.
  PoolSlots SlotsOf(int32_t slots, int32_t stride, const std::vector<int32_t>& offset) const {
    PoolSlots out;
    out.slots = slots;
    out.stride = stride;
    out.slot_of.reserve(class_of.size());
    for (size_t u = 0; u < class_of.size(); ++u)
      out.slot_of.push_back(
          static_cast<int32_t>(Mod(offset[class_of[u]] + int64_t{round_of[u]} * stride, slots)));
    return out;
  }
};

// The steady state as arcs (AssignPoolSlots): each class's take and length (positions it holds
// its slot) in one round whose next round every class also has, and the positions between a
// class's takes in consecutive rounds (the same for every class, else nullopt).
struct SteadyArcs {
  int64_t period = 0;
  int32_t round = 0;
  std::vector<int64_t> take, length;
};

std::optional<SteadyArcs> ArcsOf(const std::vector<SlotUse>& uses, const ModuloProblem& problem) {
  size_t rounds = SIZE_MAX;
  for (const auto& at : problem.use_at) rounds = std::min(rounds, at.size());
  if (rounds < 2 || rounds == SIZE_MAX) return std::nullopt;
  SteadyArcs a;
  a.round = static_cast<int32_t>((rounds - 2) / 2);
  for (const auto& at : problem.use_at) {
    const int32_t i = at[a.round], next = at[a.round + 1];
    if (i < 0 || next < 0) return std::nullopt;
    const int64_t period = uses[next].take - uses[i].take;
    if (period <= 0 || (a.period > 0 && period != a.period)) return std::nullopt;
    a.period = period;
    a.take.push_back(uses[i].take);
    a.length.push_back(uses[i].release - uses[i].take + 1);
  }
  return a;
}

// Arc packing. With stride 1, slot x at position t stands for the point t - x * period of one
// circle of slots * period positions, and every round of a class for the same arc: offsets are
// valid where the classes' arcs do not overlap. A class's arc may start at its take plus any
// whole number of periods, so the arcs are laid end to end, each followed by the class whose
// take comes soonest after its end modulo the period: the circle needs the arcs' total length
// plus small gaps, and the slots are that over the period, rounded up.
std::optional<PoolSlots> PackArcs(const std::vector<SlotUse>& uses, const ModuloProblem& problem,
                                  int32_t peak, int32_t max_slots) {
  const std::optional<SteadyArcs> arcs = ArcsOf(uses, problem);
  if (!arcs) return std::nullopt;
  const int64_t period = arcs->period;
  const size_t classes = arcs->take.size();
  std::vector<int64_t> place(classes, 0);
  std::vector<bool> placed(classes, false);
  size_t at = static_cast<size_t>(std::min_element(arcs->take.begin(), arcs->take.end()) -
                                  arcs->take.begin());
  const int64_t start = arcs->take[at];
  int64_t pos = start, end = start;
  for (size_t n = 0; n < classes; ++n) {
    place[at] = pos;
    placed[at] = true;
    end = pos + arcs->length[at];
    size_t next = classes;
    int64_t gap = 0;
    for (size_t j = 0; j < classes; ++j) {
      if (placed[j]) continue;
      const int64_t g = Mod(arcs->take[j] - end, period);
      if (next == classes || g < gap) next = j, gap = g;
    }
    if (next == classes) break;
    pos = end + gap;
    at = next;
  }
  const auto fewest = static_cast<int32_t>((end - start + period - 1) / period);
  for (int32_t slots = std::max(fewest, peak); slots <= std::min(max_slots, fewest + 4); ++slots) {
    std::vector<int32_t> offset(classes);
    for (size_t j = 0; j < classes; ++j) {
      const int64_t laps = (place[j] - arcs->take[j]) / period;
      offset[j] = static_cast<int32_t>(Mod(-laps - arcs->round, slots));
    }
    if (problem.Holds(slots, 1, offset)) return problem.SlotsOf(slots, 1, offset);
  }
  return std::nullopt;
}

// Attempts of the search (AssignPoolSlots) per pool: each costs a pass over the constraints.
constexpr int64_t kSearchBudget = 96;

// The strides the search tries for `slots` slots and `classes` classes, likeliest first: those
// that split the slots into several circles of arcs (half the slots; twice the classes, modulo
// the slots: Megatron's schedules pack there where one circle leaves a slot over), then 1 and
// slots - 1, then every other.
std::vector<int32_t> SearchStrides(int32_t slots, int64_t classes) {
  std::vector<int32_t> out;
  std::vector<bool> seen(static_cast<size_t>(slots), false);
  auto add = [&](int64_t d) {
    const auto x = static_cast<int32_t>(Mod(d, slots));
    if (seen[static_cast<size_t>(x)]) return;
    seen[static_cast<size_t>(x)] = true;
    out.push_back(x);
  };
  if (slots % 2 == 0) add(slots / 2);
  for (int64_t k : {2, 1}) {
    add(k * classes);
    add(-k * classes);
  }
  for (int32_t k = 1; k <= slots; ++k)  // 1, slots - 1, 2, slots - 2, ..., 0
    add(k == slots ? 0 : (k % 2 == 1 ? (k + 1) / 2 : slots - k / 2));
  return out;
}

}  // namespace

bool SlotsConflict(const SlotUse& earlier, const SlotUse& later) {
  if (later.take > earlier.release) return false;
  const bool reuse_in_group =
      later.recv_take && later.chunk == earlier.chunk && later.take > earlier.free;
  return !reuse_in_group;
}

int32_t PeakSlots(const std::vector<SlotUse>& uses) {
  return PeakOf(ConflictingPairs(uses), uses.size());
}

std::optional<PoolSlots> AssignPoolSlots(const std::vector<SlotUse>& uses, int32_t period,
                                         int32_t max_slots) {
  if (uses.empty() || period < 1) return std::nullopt;
  const ModuloProblem problem(uses, period);
  const int32_t peak = problem.peak;
  std::optional<PoolSlots> packed = PackArcs(uses, problem, peak, max_slots);
  if (packed && packed->slots == peak) return packed;
  // Fewer slots than the packing's (or too few rounds for a steady state): a search of slot
  // counts from the peak and strides, each class at its first free offset, within a budget of
  // attempts. A few slots past the peak always sufficed on Megatron's schedules; past that the
  // search would cost more than it saves.
  const int32_t last = packed ? packed->slots - 1 : std::min(max_slots, peak + 16);
  const auto classes = static_cast<int64_t>(problem.constraints.size());
  int64_t budget = kSearchBudget;
  for (int32_t slots = peak; slots <= last && budget > 0; ++slots) {
    for (int32_t stride : SearchStrides(slots, classes)) {
      if (budget-- <= 0) break;
      const std::optional<std::vector<int32_t>> offset = problem.Solve(slots, stride);
      if (offset) return problem.SlotsOf(slots, stride, *offset);
    }
  }
  return packed;
}

std::vector<SlotUse> PooledUses(const std::vector<SlotUse>& uses, const std::vector<bool>& pooled) {
  std::vector<SlotUse> out;
  for (const SlotUse& u : uses)
    if (pooled[static_cast<size_t>(u.chunk)]) out.push_back(u);
  return out;
}

std::optional<PoolChoice> ChooseSlotPool(const std::vector<int64_t>& frames,
                                         const std::vector<int32_t>& own, const SolvePool& solve) {
  const size_t nc = frames.size();
  int64_t apart = 0;
  for (size_t c = 0; c < nc; ++c) apart += frames[c] * own[c];
  std::vector<int64_t> sizes(frames);
  std::sort(sizes.begin(), sizes.end(), std::greater<>());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  std::optional<PoolChoice> best;
  for (int64_t largest : sizes) {
    PoolChoice choice;
    choice.pooled.assign(nc, false);
    int64_t outside = 0;
    int32_t members = 0, own_slots = 0;
    for (size_t c = 0; c < nc; ++c) {
      if (frames[c] <= largest) {
        choice.pooled[c] = true;
        ++members;
        own_slots += own[c];
      } else {
        outside += frames[c] * own[c];
      }
    }
    if (members < 2) break;
    std::optional<PoolSlots> slots = solve(choice.pooled, own_slots - 1);
    if (!slots) continue;
    choice.bytes = outside + largest * slots->slots;
    choice.slots = std::move(*slots);
    if (choice.bytes < apart && (!best || choice.bytes < best->bytes)) best = std::move(choice);
  }
  return best;
}

}  // namespace paraplan
