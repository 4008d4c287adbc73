// Slot pools: conflicts, the peak, modulo assignments on Megatron's interleaved schedule, and the
// choice of the pooled chunks.
#include "compiler/analyze/slot_pool.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <map>
#include <utility>
#include <vector>

namespace paraplan {
namespace {

// Rank r of Megatron's interleaved 1F1B (p ranks, v chunks, m microbatches, groups of p): warm-up
// forwards, then one forward and one backward, then the cool-down. A forward takes its slot, its
// backward gives it back (one position each).
std::vector<SlotUse> InterleavedUses(int64_t p, int64_t v, int64_t r, int64_t m) {
  const int64_t total = m * v;
  const int64_t warmup = std::min(total, 2 * (p - r - 1) + (v - 1) * p);
  std::vector<SlotUse> uses;
  std::map<std::pair<int64_t, int64_t>, size_t> open;
  int64_t pos = 0;
  auto forward = [&](int64_t k) {
    SlotUse u;
    u.chunk = static_cast<int32_t>((k / p) % v);
    u.microbatch = (k / (p * v)) * p + k % p;
    u.take = pos++;
    open[{u.microbatch, u.chunk}] = uses.size();
    uses.push_back(u);
  };
  auto backward = [&](int64_t k) {
    const int64_t chunk = v - 1 - (k / p) % v, mb = (k / (p * v)) * p + k % p;
    SlotUse& u = uses[open.at({mb, chunk})];
    u.free = u.release = pos++;
  };
  for (int64_t k = 0; k < warmup; ++k) forward(k);
  for (int64_t i = 0; i < total - warmup; ++i) {
    forward(warmup + i);
    backward(i);
  }
  for (int64_t i = total - warmup; i < total; ++i) backward(i);
  return uses;
}

// No two uses that conflict hold one slot.
bool Valid(const std::vector<SlotUse>& uses, const PoolSlots& slots) {
  for (size_t i = 0; i < uses.size(); ++i)
    for (size_t j = 0; j < uses.size(); ++j) {
      if (i == j || uses[i].take > uses[j].take) continue;
      if (SlotsConflict(uses[i], uses[j]) && slots.slot_of[i] == slots.slot_of[j]) return false;
    }
  return true;
}

}  // namespace

TEST_CASE("slot conflicts: busy through the release, a receive may reuse its own chunk's slot") {
  SlotUse a{.chunk = 0, .microbatch = 0, .take = 0, .free = 4, .release = 5};
  SlotUse later{.chunk = 0, .microbatch = 1, .take = 6, .free = 8, .release = 8};
  CHECK_FALSE(SlotsConflict(a, later));
  later.take = 5;  // in the group of a's SendGrad
  CHECK(SlotsConflict(a, later));
  later.recv_take = true;  // a receive of its activation: writes the input, the send reads grad
  CHECK_FALSE(SlotsConflict(a, later));
  later.chunk = 1;  // another chunk's receive: its input may lie where a's grad is
  CHECK(SlotsConflict(a, later));
  later.chunk = 0;
  later.take = 4;  // at the send itself: before the free
  CHECK(SlotsConflict(a, later));
}

TEST_CASE("the peak is the most uses busy at once") {
  std::vector<SlotUse> uses = {
      {.chunk = 0, .microbatch = 0, .take = 0, .free = 9, .release = 9},
      {.chunk = 1, .microbatch = 0, .take = 1, .free = 3, .release = 3},
      {.chunk = 1, .microbatch = 1, .take = 4, .free = 6, .release = 6},
      {.chunk = 0, .microbatch = 1, .take = 5, .free = 7, .release = 7},
  };
  CHECK(PeakSlots(uses) == 3);
  CHECK(PeakSlots({}) == 0);
}

TEST_CASE("Megatron's interleaved schedule: the pool holds the peak or one slot more") {
  for (int64_t p : {2, 4, 8})
    for (int64_t v : {2, 3, 5})
      for (int64_t r : {int64_t{0}, p / 2, p - 1}) {
        const int64_t m = 12 * p;
        CAPTURE(p);
        CAPTURE(v);
        CAPTURE(r);
        const std::vector<SlotUse> uses = InterleavedUses(p, v, r, m);
        const int32_t peak = PeakSlots(uses);
        // Megatron's warm-up plus the forward of the steady state.
        CHECK(peak == std::min(m * v, 2 * (p - r - 1) + (v - 1) * p + 1));
        const std::optional<PoolSlots> pool =
            AssignPoolSlots(uses, static_cast<int32_t>(p), static_cast<int32_t>(m * v));
        REQUIRE(pool.has_value());
        CHECK(pool->slots >= peak);
        CHECK(pool->slots <= peak + 1);
        CHECK(Valid(uses, *pool));
        // A microbatch's slot is its class's, advanced by the stride once per period.
        std::map<std::pair<int64_t, int64_t>, int32_t> slot;
        for (size_t u = 0; u < uses.size(); ++u)
          slot[{uses[u].microbatch, uses[u].chunk}] = pool->slot_of[u];
        for (const auto& [key, s] : slot)
          if (slot.count({key.first + p, key.second}))
            CHECK(slot.at({key.first + p, key.second}) == (s + pool->stride) % pool->slots);
      }
}

TEST_CASE("too few rounds for a steady state: the search still assigns valid slots") {
  const std::vector<SlotUse> uses = InterleavedUses(4, 2, 0, 4);
  const std::optional<PoolSlots> pool = AssignPoolSlots(uses, 4, 8);
  REQUIRE(pool.has_value());
  CHECK(pool->slots >= PeakSlots(uses));
  CHECK(Valid(uses, *pool));
  CHECK_FALSE(AssignPoolSlots(uses, 4, PeakSlots(uses) - 1).has_value());
  CHECK_FALSE(AssignPoolSlots({}, 4, 8).has_value());
}

TEST_CASE("the pool leaves out chunks whose frames are too large to share a slot") {
  const std::vector<SlotUse> uses = InterleavedUses(8, 4, 0, 64);
  std::vector<int32_t> own(4, 0);
  // Each chunk's own slots: the most of its microbatches in flight.
  for (int32_t c = 0; c < 4; ++c) {
    std::vector<bool> only(4, false);
    only[c] = true;
    own[c] = PeakSlots(PooledUses(uses, only));
  }
  const SolvePool solve = [&](const std::vector<bool>& pooled, int32_t max_slots) {
    return AssignPoolSlots(PooledUses(uses, pooled), 8, max_slots);
  };
  SUBCASE("equal frames: every chunk in the pool, fewer bytes than apart") {
    const std::optional<PoolChoice> c = ChooseSlotPool({100, 100, 100, 100}, own, solve);
    REQUIRE(c.has_value());
    CHECK(std::count(c->pooled.begin(), c->pooled.end(), true) == 4);
    int64_t apart = 0;
    for (int32_t s : own) apart += int64_t{100} * s;
    CHECK(c->bytes == int64_t{100} * c->slots.slots);
    CHECK(c->bytes < apart);
  }
  SUBCASE("a chunk with a frame ten times the others' keeps its own slots") {
    const std::optional<PoolChoice> c = ChooseSlotPool({100, 100, 100, 1000}, own, solve);
    REQUIRE(c.has_value());
    CHECK(c->pooled == std::vector<bool>{true, true, true, false});
    CHECK(c->bytes == int64_t{100} * c->slots.slots + int64_t{1000} * own[3]);
  }
  SUBCASE("no pool is cheaper: none") {
    const std::vector<SlotUse> two = {
        {.chunk = 0, .microbatch = 0, .take = 0, .free = 3, .release = 3},
        {.chunk = 1, .microbatch = 0, .take = 1, .free = 2, .release = 2},
    };
    const SolvePool solve_two = [&](const std::vector<bool>& pooled, int32_t max_slots) {
      return AssignPoolSlots(PooledUses(two, pooled), 1, max_slots);
    };
    CHECK_FALSE(ChooseSlotPool({100, 100}, {1, 1}, solve_two).has_value());
  }
}

}  // namespace paraplan
