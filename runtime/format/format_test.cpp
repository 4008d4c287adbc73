// The generated format builds, round-trips through the FlatBuffers verifier and keeps the
// constants the README documents.
#include <doctest/doctest.h>

#include "runtime/format/program.h"

namespace paraplan::prog {
namespace {

TEST_CASE("a minimal program round-trips through the verifier") {
  flatbuffers::FlatBufferBuilder b;
  std::vector<flatbuffers::Offset<Op>> ops;
  std::vector<int64_t> ints = {3, 0, 1};
  ops.push_back(CreateOpDirect(b, OpKind::Forward, nullptr, nullptr, CommKind::None, &ints));
  std::vector<flatbuffers::Offset<Role>> roles;
  roles.push_back(
      CreateRoleDirect(b, "stage0", 0, nullptr, nullptr, nullptr, nullptr, nullptr, &ops));
  auto program =
      CreateProgramDirect(b, kFormatVersion, "test", "p", 1, 0, 0, 0, nullptr, nullptr, &roles);
  FinishProgramBuffer(b, program);

  flatbuffers::Verifier verifier(b.GetBufferPointer(), b.GetSize());
  REQUIRE(VerifyProgramBuffer(verifier));
  const Program* p = GetProgram(b.GetBufferPointer());
  CHECK(p->format_version() == kFormatVersion);
  CHECK(p->roles()->Get(0)->schedule()->Get(0)->kind() == OpKind::Forward);
  CHECK(p->roles()->Get(0)->schedule()->Get(0)->ints()->Get(0) == 3);
  CHECK(std::string(EnumNameOpKind(OpKind::SendGrad)) == "SendGrad");
  CHECK(ProgramBufferHasIdentifier(b.GetBufferPointer()));
}

TEST_CASE("every comm kind has a slot in Rank.comms") {
  CHECK(kCommKinds == static_cast<int>(CommKind::Embedding) + 1);
  CHECK(DTypeBytes(DType::Bf16) == 2);
  CHECK(DTypeBytes(DType::F32) == 4);
}

}  // namespace
}  // namespace paraplan::prog
