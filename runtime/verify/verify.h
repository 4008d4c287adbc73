// Whole-world verification of a lowered program, run by the compiler before it writes one, by
// `planc dump` on files it reads, and by planrun on every program it loads.
//
// Proves, for every rank of the world (ranks of one role share their stream, so the cost is
// the world size times the schedule length, not times the body length):
//   * counts: every (microbatch, chunk) passes forward exactly once and backward exactly once
//     per step, forward first (occurrences are counted, not collected in sets);
//   * landing buffers: a chunk's receives into its landing buffer alternate with its forwards,
//     each forward reading its own microbatch's activation, never overwritten unread;
//   * transfers: per ordered pair of ranks the k-th send matches the k-th receive (same kind,
//     microbatch, adjacent virtual stages, same bytes), and every send has its receive;
//   * collectives: the members of every communicator enter the same collectives in the same
//     order with the same sizes; collectives inside forward/backward bodies use only kinds
//     whose groups hold ranks of one role (so identical streams order them identically);
//   * progress: a simulation of all ranks where a transfer group completes only when every
//     partner has posted its side (rendezvous) and a collective only when every member has
//     arrived, runs to the end; otherwise the waiting ranks and ops are reported (deadlock).
// Loops (Role::loops, program format 4) are not listed for the simulation: each role's stream is
// its listed items in segments (runs of listed ops, loop bodies once), and a rank's position
// is a number in the expanded stream that maps onto them, so memory is bounded by the ranks and
// the listed steps, not by the microbatches. Why the simulation may skip iterations:
//   1. The system is a set of deterministic sequential streams whose steps are enabled
//      monotonically (a transfer group completes once every partner has posted its side, i.e.
//      reached or passed it; a collective once every member has arrived; passing only moves
//      ranks forward and never disables a step of another rank). The state that runs to
//      quiescence from any state is therefore unique whatever order ranks are advanced in, and
//      so are the verdicts (deadlock or not) and the pairs of transfers and collectives that
//      meet (the k-th send of a to b always meets b's k-th receive from a).
//   2. The simulation runs in rounds: every rank may advance up to a limit, first the end of
//      the first iteration of its first loop, then one iteration further per round (up to the
//      stream's end). By 1 the quiescent state of each round is a function F(positions,
//      limits), and continuing from it with raised limits reaches the same final state.
//   3. When after a round every rank is inside a loop without collectives, has moved exactly
//      one iteration since the previous round, has its limit inside the loop, and every pair of
//      pipeline peers exchanges equally many transfers per iteration in each direction with the
//      same microbatch stride, then the state is the previous one shifted by one iteration on
//      every rank. F commutes with that shift while all positions and limits stay inside the
//      loops (the items between them are the same body items, sequence numbers and microbatches
//      advance equally on both sides of each pair, so every readiness test and every match
//      check gives the same answer), so each further round repeats the last one shifted. The
//      rounds every rank's loop can still take but one (kept as a margin so that the partners of
//      the next round's transfers are loop items too) are skipped by adding them to the
//      positions and limits; the matches they would check are the shifts of the last round's,
//      which were checked.
//   4. "Every microbatch once forward and backward per chunk" is counted over the expanded
//      schedule of each role (one counter per microbatch and chunk), so it covers every
//      iteration.
// Transfer pairs are compared (kind, microbatch, stages, bytes) as the simulation passes them.
// Messages name ranks, roles, op positions (in the expanded schedule) and ops. Each role's schedule
// is read in whichever form it is held (Role::schedule, or Role::steps on `planc compile`'s path);
// the messages are the same for both. Read by Lower (P0804), `planc dump`, planrun and tests.
#ifndef PARAPLAN_RUNTIME_VERIFY_VERIFY_H_
#define PARAPLAN_RUNTIME_VERIFY_VERIFY_H_

#include <string>
#include <vector>

#include "runtime/verify/structure.h"

namespace paraplan::verify {

struct VerifyStats {
  int64_t ranks = 0;
  int64_t simulated_ops = 0;  // schedule-level items executed in the simulation, all ranks
  int64_t transfers = 0;      // matched send/receive pairs
  int64_t collectives = 0;    // completed collective instances (one per communicator entry)
  int64_t skips = 0;          // times the simulation skipped repeated loop iterations
};

// Empty when the program is correct; otherwise at most `max_errors` messages.
std::vector<std::string> VerifyWorld(const Program& program, VerifyStats* stats = nullptr,
                                     size_t max_errors = 20);

// "send_activation(microbatch 2, chunk 0, peer 1)" for messages and dumps.
std::string DescribeOp(const Op& op);

}  // namespace paraplan::verify

#endif  // PARAPLAN_RUNTIME_VERIFY_VERIFY_H_
