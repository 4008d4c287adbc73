// Whole-world verification of a lowered program, run before it is written (and by `planc
// dump` on files it reads).
//
// Proves, for every rank of the world (ranks of one role share their stream, so the cost is
// the world size times the schedule length, not times the body length):
//   * counts: every (microbatch, chunk) passes forward exactly once and backward exactly once
//     per step, forward first (occurrences are counted, not collected in sets);
//   * transfers: per ordered pair of ranks the k-th send matches the k-th receive (same kind,
//     microbatch, adjacent virtual stages, same bytes), and every send has its receive;
//   * collectives: the members of every communicator enter the same collectives in the same
//     order with the same sizes; collectives inside forward/backward bodies use only kinds
//     whose groups hold ranks of one role (so identical streams order them identically);
//   * progress: a simulation of all ranks where a transfer group completes only when every
//     partner has posted its side (rendezvous) and a collective only when every member has
//     arrived, runs to the end; otherwise the waiting ranks and ops are reported (deadlock).
// Messages name ranks, roles, op positions and ops. Each role's schedule is read in whichever
// form it is held (Role::schedule, or Role::steps on `planc compile`'s path); the messages are
// the same for both. Read by Lower (P0804) and tests.
#ifndef PARAPLAN_COMPILER_LOWER_VERIFY_H_
#define PARAPLAN_COMPILER_LOWER_VERIFY_H_

#include <string>
#include <vector>

#include "compiler/lower/program.h"

namespace paraplan::lower {

struct VerifyStats {
  int64_t ranks = 0;
  int64_t simulated_ops = 0;  // schedule-level items executed in the simulation, all ranks
  int64_t transfers = 0;      // matched send/receive pairs
  int64_t collectives = 0;    // completed collective instances (one per communicator entry)
};

// Empty when the program is correct; otherwise at most `max_errors` messages.
std::vector<std::string> VerifyWorld(const Program& program, VerifyStats* stats = nullptr,
                                     size_t max_errors = 20);

// "send_activation(microbatch 2, chunk 0, peer 1)" for messages and dumps.
std::string DescribeOp(const Op& op);

}  // namespace paraplan::lower

#endif  // PARAPLAN_COMPILER_LOWER_VERIFY_H_
