// What the whole-world verifier (verify.h) reads the in-memory program with: the model's names
// in this namespace, op and communicator names for messages, the structural checks, and the
// landing-buffer rule. Only runtime/format/ below it, so the compiler (lower/, planc dump) and
// planrun share one verifier without the runtime linking compiler code.
//
// Made by nobody: free functions over prog::mem::Program. Read by the verifier, and by
// compiler/lower (re-exported in compiler/lower/program.h).
#ifndef PARAPLAN_RUNTIME_VERIFY_STRUCTURE_H_
#define PARAPLAN_RUNTIME_VERIFY_STRUCTURE_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/format/program.h"
#include "runtime/format/program_model.h"

namespace paraplan::verify {

using prog::BufferKind;
using prog::CommKind;
using prog::DType;
using prog::OpKind;

using Op = prog::mem::Op;
using Body = prog::mem::Body;
using Buffer = prog::mem::Buffer;
using Param = prog::mem::Param;
using Chunk = prog::mem::Chunk;
using Role = prog::mem::Role;
using Rank = prog::mem::Rank;
using Communicator = prog::mem::Communicator;
using Program = prog::mem::Program;

// The chunk's landing buffer, or -1: a Persistent buffer that the first op of the chunk's
// forward body copies into the chunk's `input` (a Copy). A chunk that has one receives its
// activations there instead of into an input slot (runtime/format/README.md, "Landing buffers").
int32_t LandingBuffer(const Role& role, const Chunk& chunk);

// The chunk's grad landing buffer, or -1: a Persistent buffer that the first op of the chunk's
// backward body copies into the chunk's `grad`. A chunk whose `grad` is one buffer (not Stash)
// and that both receives and sends gradients receives them there (runtime/format/README.md,
// "Boundary buffers").
int32_t GradLandingBuffer(const Role& role, const Chunk& chunk);

// Structural checks (indices in range, sizes consistent; every op against the op registry with
// prog::CheckOp, the check the runtime's loader runs too). Empty when fine.
std::vector<std::string> VerifyStructure(const Program& program);

// Names used in dumps and messages: "forward", "send_activation", "all_reduce", "tp".
std::string_view OpName(OpKind kind);
std::string_view CommName(CommKind kind);
bool IsP2p(OpKind kind);
bool IsCollective(OpKind kind);

}  // namespace paraplan::verify

#endif  // PARAPLAN_RUNTIME_VERIFY_STRUCTURE_H_
