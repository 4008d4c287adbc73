// Pipeline schedules: the per-rank order of forward and backward computations (gpipe, 1f1b,
// interleaved 1f1b) and the pipeline transfers between them.
//
// Orders follow Megatron-Core (megatron/core/pipeline_parallel/schedules.py): 1F1B warm-up
// min(p - r - 1, m); interleaved: the group table (groups of G microbatches, every chunk of a
// group in turn; backward mirrors the chunk), warm-up 2(p - r - 1) + (v - 1)G capped at m·v;
// gpipe: all forwards then all backwards in microbatch order (PyTorch's GPipe). Stages are
// placed in a loop: virtual stage s = chunk·p + r.
//
// Transfers are placed by a simulation of all pipeline ranks (PipelinePrograms): a send goes
// into the group right after its producer, the receive into the group the consumer posts at
// that moment; the transfers between two computations form one group (one
// ncclGroupStart/End). Per ordered rank pair, sends and receives are issued in the same order,
// and the result is deadlock-free even when every transfer blocks until its partner is posted;
// the whole-world verifier (verify.h) proves both again on the final program.
//
// Made by lower/ (Lower), read by the verifier and by tests.
#ifndef PARAPLAN_COMPILER_LOWER_SCHEDULE_H_
#define PARAPLAN_COMPILER_LOWER_SCHEDULE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/format/program.h"

namespace paraplan::lower {

struct ScheduleShape {
  prog::ScheduleKind kind = prog::ScheduleKind::OneFOneB;
  int32_t pp = 1;            // pipeline ranks p
  int32_t vpp = 1;           // chunks per rank v (interleaved only)
  int32_t microbatches = 1;  // m
  int32_t group_size = 0;    // interleaved: microbatches per group G; 0 = p (Megatron's default)

  int32_t Group() const { return group_size > 0 ? group_size : pp; }
};

// Why the shape cannot be scheduled (Megatron's rules), or empty.
//   interleaved: v >= 2, p >= 2, p <= G <= m, m mod G == 0 or m mod G >= p.
//   gpipe, 1f1b: v == 1.
std::string CheckScheduleShape(const ScheduleShape& shape);

struct ComputeStep {
  bool backward = false;
  int32_t microbatch = 0;
  int32_t chunk = 0;
  bool operator==(const ComputeStep&) const = default;
};

// Forwards a rank runs before its first backward.
int32_t WarmupCount(const ScheduleShape& shape, int32_t rank);

// The compute order of one pipeline rank. The shape must pass CheckScheduleShape.
std::vector<ComputeStep> ComputeOrder(const ScheduleShape& shape, int32_t rank);

// Short text: "F0 F1 B0 F2' ..." (a prime per chunk index above 0, as in the reference notes).
std::string FormatOrder(const std::vector<ComputeStep>& order);

// One entry of a rank's pipeline program: Forward/Backward or a transfer.
struct PipelineStep {
  prog::OpKind kind = prog::OpKind::Forward;
  int32_t microbatch = 0;
  int32_t chunk = 0;  // local chunk on this rank
  int32_t peer = -1;  // transfers: the peer's pipeline rank
  int32_t group = 0;  // transfers: consecutive steps with the same non-zero group form one group
};

// The compute order of every pipeline rank with the transfers inserted.
std::vector<std::vector<PipelineStep>> PipelinePrograms(const ScheduleShape& shape);

}  // namespace paraplan::lower

#endif  // PARAPLAN_COMPILER_LOWER_SCHEDULE_H_
