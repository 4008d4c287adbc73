// ProgramImage: a program file decoded into the shared in-memory program
// (runtime/format/program_model.h) after the runtime's validation (prog::mem::DecodeProgram: a bad
// file is refused with a clear ProgramError instead of crashing a rank), plus the fingerprint
// checkpoints are keyed by.
//
// Made by: LoadProgramImage (from a file) or DecodeProgramImage (from bytes). Read by: the
// interpreter, checkpoints (fingerprint), planrun. Immutable after decoding.
#ifndef PARAPLAN_RUNTIME_EXEC_PROGRAM_IMAGE_H_
#define PARAPLAN_RUNTIME_EXEC_PROGRAM_IMAGE_H_

#include <cstdint>
#include <string>

#include "runtime/format/program.h"
#include "runtime/format/program_model.h"

namespace paraplan::exec {

using prog::BufferKind;
using prog::CommKind;
using prog::DType;
using prog::OpKind;

using ProgramError = prog::mem::ProgramError;

struct ProgramImage : prog::mem::Program {
  // FNV-1a of the things a checkpoint depends on: world, model, parallel layout, seed, every
  // role's parameters and buckets. Not steps, learning rate or data.
  uint64_t fingerprint = 0;
};

ProgramImage DecodeProgramImage(const uint8_t* data, size_t size, const std::string& origin);
ProgramImage LoadProgramImage(const std::string& path);

}  // namespace paraplan::exec

#endif  // PARAPLAN_RUNTIME_EXEC_PROGRAM_IMAGE_H_
