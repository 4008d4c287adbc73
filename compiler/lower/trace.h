// A Chrome / Perfetto timeline of one simulated training step (`planc compile --trace`).
//
// The program's schedules are replayed on one pipeline (the ranks with tp = cp = dp = 0; or
// every rank when the world has at most kTraceAllRanksUpTo ranks) with durations from the time
// model: each computation, each transfer group (sends never block, as in planrun's rank runner;
// a group ends when the partner of each of its receives has posted the matching send and the
// data has moved) and the gradient reduction and optimizer bodies (cross-pipeline
// collectives start when every member has arrived), then the step's fixed host cost on every
// rank. One row per rank; compute and communication slices in separate categories, with
// microbatch and chunk in their args. With expert parallelism the all-to-alls over Ep inside a
// forward or backward body are slices of their own (category "expert-parallel") nested in that
// computation's slice.
#ifndef PARAPLAN_COMPILER_LOWER_TRACE_H_
#define PARAPLAN_COMPILER_LOWER_TRACE_H_

#include <string>
#include <vector>

#include "compiler/lower/program.h"

namespace paraplan::lower {

inline constexpr int32_t kTraceAllRanksUpTo = 64;

struct TraceDurations {
  // Per role (pipeline rank): seconds of one chunk's forward and backward for one microbatch.
  std::vector<double> forward_s, backward_s;
  double transfer_s = 0;                            // one pipeline transfer
  std::vector<double> reduce_grads_s, optimizer_s;  // per role
  // Once per step after the optimizer, on every rank: the host's fixed cost (data loading,
  // logging, synchronisation), the time model's step overhead.
  double step_overhead_s = 0;
  // Per role: seconds of one expert-parallel all-to-all (MoeDispatch, MoeCombine,
  // MoeExchangeCounts over Ep). Each is drawn inside its computation's slice, at its place among
  // the body's ops; empty or 0 when the model has no figure (then a slice of the op's share).
  std::vector<double> ep_all_to_all_s;
};

struct TraceResult {
  std::string json;
  double step_s = 0;  // simulated step time
};

TraceResult ChromeTrace(const Program& program, const TraceDurations& durations);

}  // namespace paraplan::lower

#endif  // PARAPLAN_COMPILER_LOWER_TRACE_H_
