// Stable text dumps of a lowered program (`planc dump PROG --format=text`, tests).
//
// PrintProgram: configs, communicator counts, one block per role (chunks, memory, the schedule
// in short form). PrintRank: one rank's coordinates, communicators and peers, its full schedule
// (one op per line, peers as global ranks) and every body op with buffer names.
#ifndef PARAPLAN_COMPILER_LOWER_PRINT_H_
#define PARAPLAN_COMPILER_LOWER_PRINT_H_

#include <string>

#include "compiler/lower/program.h"

namespace paraplan::lower {

std::string PrintProgram(const Program& program);
std::string PrintRank(const Program& program, int32_t rank);
// One op with buffer names, e.g. "linear(layers.0.attention_norm.out, layers.0.attention.wq) ->
// layers.0.q".
std::string PrintOp(const Role& role, const Op& op);

}  // namespace paraplan::lower

#endif  // PARAPLAN_COMPILER_LOWER_PRINT_H_
