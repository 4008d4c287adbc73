// The loop form of a schedule (program format 4, runtime/format/README.md section 3 "Loops"):
// finding the periodic steady state in a role's compact schedule, and extending a schedule
// built for a few microbatches to many without listing them.
//
// A pipeline schedule is a warm-up, a steady state that repeats one period (1F1B: a forward and
// a backward with their transfers; interleaved: every chunk of a microbatch group; gpipe: a
// forward, then later a backward) with the microbatch, slot and transfer group advancing by
// fixed strides, and a cool-down. FindScheduleLoops finds such periods in listed steps.
// ExtrapolateLoops takes the loop forms of one rank's schedule at m, m + D and m + 2D
// microbatches and, when they differ by constant amounts (longer loops, later microbatches in
// the cool-down), gives the form at m + kD.
//
// Made by: lower/ (Lower); read by tests.
#ifndef PARAPLAN_COMPILER_LOWER_SCHEDULE_LOOPS_H_
#define PARAPLAN_COMPILER_LOWER_SCHEDULE_LOOPS_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "runtime/format/program.h"

namespace paraplan::lower {

struct LoopForm {
  std::vector<prog::ScheduleStep> steps;
  std::vector<prog::ScheduleLoop> loops;
};

// The loop form of the listed steps `flat`: loops that each save at least `min_saving` steps
// ((count - 1) * length) and pass prog::mem::CheckScheduleLoops. `chunk_slots[c]`: chunk c's
// slot count. Expanding the result gives `flat` exactly.
LoopForm FindScheduleLoops(const std::vector<prog::ScheduleStep>& flat,
                           const std::vector<int32_t>& chunk_slots, int64_t min_saving);

// The form k steps of D microbatches past `a`, given the forms `a`, `b`, `c` at m, m + D, m + 2D:
// nullopt unless b and c differ from a by constant amounts (same steps and loops but for the
// loop counts, the microbatches, slots and non-zero groups of steps; c - b == b - a).
std::optional<LoopForm> ExtrapolateLoops(const LoopForm& a, const LoopForm& b, const LoopForm& c,
                                         int64_t k, const std::vector<int32_t>& chunk_slots);

// Expands a loop form into its listed steps (tests and fallbacks).
std::vector<prog::ScheduleStep> ExpandLoops(const LoopForm& form,
                                            const std::vector<int32_t>& chunk_slots);

}  // namespace paraplan::lower

#endif  // PARAPLAN_COMPILER_LOWER_SCHEDULE_LOOPS_H_
