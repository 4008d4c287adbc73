// The in-memory program: FlatBuffers writing and reading, stash chunks. Names and structural
// checks are runtime/verify/structure.cpp.
#include "compiler/lower/program.h"

#include <fmt/format.h>

#include "runtime/format/ops.h"

namespace paraplan::lower {

// --- writing ---------------------------------------------------------------------------------

std::vector<uint8_t> ToFlatBuffer(const Program& p) { return prog::mem::EncodeProgram(p); }

// --- reading ---------------------------------------------------------------------------------

std::optional<Program> FromFlatBuffer(const uint8_t* data, size_t size, std::string* error,
                                      bool keep_loops) {
  if (size < 8 || !prog::ProgramBufferHasIdentifier(data)) {
    *error = "not a paraplan program (no 'PPLN' file identifier)";
    return std::nullopt;
  }
  flatbuffers::Verifier verifier(data, size, /*max_depth=*/64, /*max_tables=*/100'000'000);
  if (!prog::VerifyProgramBuffer(verifier)) {
    *error = fmt::format(
        "the file is damaged: the FlatBuffers verifier rejects its {} bytes (truncated or "
        "corrupted)",
        size);
    return std::nullopt;
  }
  const prog::Program* f = prog::GetProgram(data);
  if (!prog::IsReadableFormatVersion(f->format_version())) {
    *error = fmt::format(
        "format version {} is not the supported version {} (nor {}, still read); recompile the "
        "plan with this planc",
        f->format_version(), prog::kFormatVersion, prog::kOldestFormatVersion);
    return std::nullopt;
  }
  if (f->roles())
    for (const prog::Role* r : *f->roles())
      if (r->schedule() && r->schedule()->size() > 0 && r->steps() && r->steps()->size() > 0) {
        *error = fmt::format("role '{}' holds its schedule twice, as ops and as steps",
                             r->name() ? r->name()->str() : std::string());
        return std::nullopt;
      }
  if (f->roles())
    for (const prog::Role* r : *f->roles())
      if (std::string why = prog::mem::ScheduleLoopProblem(*r); !why.empty()) {
        *error = why;
        return std::nullopt;
      }
  if (f->ranks()) {
    for (flatbuffers::uoffset_t r = 0; r < f->ranks()->size(); ++r) {
      const auto* comms = f->ranks()->Get(r)->comms();
      if (comms && comms->size() > static_cast<flatbuffers::uoffset_t>(prog::kCommKinds)) {
        *error = fmt::format("rank {} lists {} communicator kinds; this version knows {}", r,
                             comms->size(), prog::kCommKinds);
        return std::nullopt;
      }
    }
  }
  Program p = prog::mem::DecodeProgramModel(*f, keep_loops);
  auto problems = VerifyStructure(p);
  if (!problems.empty()) {
    *error = problems.front();
    if (problems.size() > 1) *error += fmt::format(" (and {} more problems)", problems.size() - 1);
    return std::nullopt;
  }
  return p;
}

}  // namespace paraplan::lower
