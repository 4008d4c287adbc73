// Lowering: the checked plan, its rank layout and pipeline partition -> the program of every
// rank (program.h), verified for the whole world before anyone writes it.
//
// Steps: configs from the plan; one role per pipeline rank with its params, buffers and
// bodies (body.h); the role's schedule from the pipeline program (schedule.h) with step bodies
// around it and per-microbatch slots assigned; the static memory plan (memory_plan.h);
// communicators and ranks from the layout; whole-world verification (verify.h).
//
// Errors the plan's rules did not already catch are reported as P08xx diagnostics and give
// nullopt. Entry point of `planc compile`; also used by tests and bench/compile.
#ifndef PARAPLAN_COMPILER_LOWER_LOWER_H_
#define PARAPLAN_COMPILER_LOWER_LOWER_H_

#include <functional>
#include <limits>
#include <optional>
#include <string>

#include "compiler/analyze/layout.h"
#include "compiler/analyze/partition.h"
#include "compiler/diagnostics/diagnostic.h"
#include "compiler/lower/program.h"
#include "compiler/plan/plan.h"

namespace paraplan::lower {

struct LowerOptions {
  std::string producer = "planc 0.1.0";
  int32_t microbatch_group =
      0;               // interleaved: Megatron's microbatch_group_size_per_vp_stage; 0 = pp
  bool verify = true;  // whole-world verification (tests switch it off to mutate first)
  // Holds each role's schedule as Role::steps (24 bytes an op) instead of Role::schedule (ops
  // with heap vectors): what `planc compile` writes, in a fraction of the memory. Verification
  // and encoding read either form; printing and tracing read Role::schedule.
  bool compact_schedule = false;
  // With compact_schedule: a step of many microbatches (past a few periods of the steady state)
  // holds each schedule's steady state in loop form (Role::loops, format 4), built from a few
  // microbatches and extended (schedule_loops.h), so that neither time nor memory grows with
  // them. A step of fewer microbatches lists its schedule as before (its file unchanged) unless
  // loop_min_saving asks for loops that save at least that many steps (tests).
  // "Many": past a few periods and at least loop_min_microbatches forwards per rank
  // (microbatches times chunks); such a step's slots are assigned first-freed-first, in either
  // form, so that they rotate with a fixed stride per period.
  bool schedule_loops = true;
  int64_t loop_min_microbatches = 1024;
  int64_t loop_min_saving = std::numeric_limits<int64_t>::max();
  // The first pipeline rank of the interleaved schedule receives a chunk's next input into a
  // landing buffer where receiving it into a stash slot would raise the chunk's slots
  // (lower.cpp, LandingChunks). Tests switch it off to compare with the slots-only program.
  bool landing_buffers = true;
  // The chunks of a pipeline rank with several chunks (interleaved 1F1B) share one pool of stash
  // slots where that takes fewer bytes than slots kept per chunk (compiler/analyze/slot_pool.h):
  // the rank then holds the most microbatches in flight at once, not the sum of each chunk's
  // most. Tests switch it off to compare with the per-chunk program.
  bool slot_pools = true;
  // A chunk's `output` and `grad` are one buffer each, not a stash slot per microbatch in
  // flight, where the schedule proves one microbatch at a time holds them (lower.cpp,
  // BoundaryBuffersOf; runtime/format/README.md, "Boundary buffers"). Tests switch it off to
  // compare with the slotted program.
  bool boundary_buffers = true;
  // Tests only: changes the program between building and verification.
  std::function<void(Program&)> before_verify;
};

std::optional<Program> Lower(const Plan& plan, const Layout& layout, const Partition& partition,
                             const LowerOptions& options, DiagnosticSink& sink);

// Convenience for tests and tools: builds layout and partition itself; reports their failures.
std::optional<Program> LowerPlan(const Plan& plan, const LowerOptions& options,
                                 DiagnosticSink& sink);

}  // namespace paraplan::lower

#endif  // PARAPLAN_COMPILER_LOWER_LOWER_H_
