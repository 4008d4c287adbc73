// The lowered program in memory: the shared model of runtime/format/program_model.h (aliased
// here), plus writing and reading for planc; the names, structural checks and whole-world
// verifier it re-exports live in runtime/verify/, shared with planrun.
//
// lower/ builds it (Lower), verifies the whole world on it (VerifyWorld), writes it with
// ToFlatBuffer (= prog::mem::EncodeProgram); `planc dump` reads a file back with FromFlatBuffer
// and prints it. The fields mean exactly what runtime/format/README.md says of their
// FlatBuffers counterparts.
//
// Invariants after Lower: every index (buffer, body, chunk, communicator, role) is in range;
// ranks.size() == world_size; Rank::comms has prog::kCommKinds entries. FromFlatBuffer checks
// these for files from outside and refuses a file that breaks them.
#ifndef PARAPLAN_COMPILER_LOWER_PROGRAM_H_
#define PARAPLAN_COMPILER_LOWER_PROGRAM_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/format/program.h"
#include "runtime/format/program_model.h"
#include "runtime/verify/structure.h"
#include "runtime/verify/verify.h"

namespace paraplan::lower {

using prog::BufferKind;
using prog::CommKind;
using prog::DType;
using prog::OpKind;

// The model itself is the runtime's (runtime/format/program_model.h); lower/ adds no fields.
using Op = prog::mem::Op;
using Body = prog::mem::Body;
using Buffer = prog::mem::Buffer;
using Param = prog::mem::Param;
using Bucket = prog::mem::Bucket;
using Chunk = prog::mem::Chunk;
using Role = prog::mem::Role;
using Coordinates = prog::mem::Coordinates;
using Rank = prog::mem::Rank;
using Communicator = prog::mem::Communicator;
using ModelConfig = prog::mem::ModelConfig;
using ParallelConfig = prog::mem::ParallelConfig;
using TrainConfig = prog::mem::TrainConfig;
using Program = prog::mem::Program;

// Names, structural checks, the landing-buffer rule and the whole-world verifier are shared
// with planrun (runtime/verify/).
using verify::CommName;
using verify::DescribeOp;
using verify::GradLandingBuffer;
using verify::IsCollective;
using verify::IsP2p;
using verify::LandingBuffer;
using verify::OpName;
using verify::VerifyStats;
using verify::VerifyStructure;
using verify::VerifyWorld;

using prog::mem::StashChunks;

// Serialisation. ToFlatBuffer never fails; FromFlatBuffer runs the FlatBuffers verifier and
// VerifyStructure and returns nullopt with *error set when the bytes are not a valid program.
std::vector<uint8_t> ToFlatBuffer(const Program& program);
// With `keep_loops` a role whose schedule has loops keeps them (Role::steps and Role::loops,
// as prog::mem::DecodeProgramModel): `planc dump` verifies that form, then expands one role at
// a time to print it (prog::mem::ScheduleOps).
std::optional<Program> FromFlatBuffer(const uint8_t* data, size_t size, std::string* error,
                                      bool keep_loops = false);

}  // namespace paraplan::lower

#endif  // PARAPLAN_COMPILER_LOWER_PROGRAM_H_
