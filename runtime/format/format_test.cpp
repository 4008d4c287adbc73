// The generated format builds, round-trips through the FlatBuffers verifier and keeps the
// constants the README documents.
#include <doctest/doctest.h>

#include "runtime/format/program.h"
#include "runtime/format/program_model.h"

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

TEST_CASE("a schedule step stands for its op exactly; ops without a compact form are told apart") {
  using mem::FromScheduleStep;
  using mem::Op;
  using mem::ToScheduleStep;
  const std::vector<Op> ops = {
      {OpKind::Forward, {}, {}, CommKind::None, {7, 1, 3}, {}},
      {OpKind::Backward, {}, {}, CommKind::None, {7, 1, 3}, {}},
      {OpKind::SendActivation, {12}, {}, CommKind::Pp, {7, 1, 3, 2, 41}, {}},
      {OpKind::RecvActivation, {}, {10}, CommKind::Pp, {8, 0, 0, 63, 0}, {}},
      {OpKind::SendGrad, {11}, {}, CommKind::Pp, {2147483647, 1, 2, 0, 9}, {}},
      {OpKind::RecvGrad, {}, {11}, CommKind::Pp, {0, 1, 2, 1, 9}, {}},
      {OpKind::ZeroGrads, {}, {}, CommKind::None, {4}, {}},
      {OpKind::ReduceGrads, {}, {}, CommKind::None, {5}, {}},
      {OpKind::OptimizerStep, {}, {}, CommKind::None, {6}, {}},
      {OpKind::GatherParams, {}, {}, CommKind::None, {1, 7}, {}},
      {OpKind::ReleaseParams, {}, {}, CommKind::None, {1}, {}},
  };
  for (const Op& op : ops) {
    CAPTURE(EnumNameOpKind(op.kind));
    ScheduleStep step;
    REQUIRE(ToScheduleStep(op, &step));
    const Op back = FromScheduleStep(step);
    CHECK(back.kind == op.kind);
    CHECK(back.comm == op.comm);
    CHECK(back.ints == op.ints);
    CHECK(back.inputs == op.inputs);
    CHECK(back.outputs == op.outputs);
    CHECK(back.floats.empty());
  }
  CHECK(sizeof(ScheduleStep) == 24);
  // Ops a step cannot hold: the whole schedule is then written as ops.
  const std::vector<Op> general = {
      {OpKind::AllReduce, {1}, {1}, CommKind::Tp, {0}, {}},                     // a body op
      {OpKind::Forward, {}, {}, CommKind::None, {7, 1}, {}},                    // ints left out
      {OpKind::Forward, {}, {}, CommKind::None, {7, 1, 3}, {0.5}},              // floats
      {OpKind::Forward, {}, {}, CommKind::None, {int64_t{1} << 32, 1, 3}, {}},  // past int32
      {OpKind::Forward, {}, {}, CommKind::None, {7, 40000, 3}, {}},             // chunk past int16
      {OpKind::SendGrad, {}, {11}, CommKind::Pp, {0, 1, 2, 1, 9}, {}},  // operand on the wrong side
      {OpKind::RecvGrad, {}, {11, 12}, CommKind::Pp, {0, 1, 2, 1, 9}, {}},  // two operands
      {OpKind::ZeroGrads, {3}, {}, CommKind::None, {4}, {}},                // an operand
  };
  for (const Op& op : general) {
    ScheduleStep step(1, 2, 3, 4, 5, 6, OpKind::Backward, CommKind::Tp);
    CHECK_FALSE(ToScheduleStep(op, &step));
    CHECK(step.microbatch() == 1);  // untouched
  }
}

TEST_CASE("format 3 writes schedules as steps, reads them back as ops, and still reads format 2") {
  mem::Program p;
  p.world_size = 1;
  mem::Role role;
  role.name = "stage0";
  role.schedule = {{OpKind::ZeroGrads, {}, {}, CommKind::None, {0}, {}},
                   {OpKind::Forward, {}, {}, CommKind::None, {0, 0, 0}, {}},
                   {OpKind::Backward, {}, {}, CommKind::None, {0, 0, 0}, {}}};
  p.roles.push_back(role);
  const std::vector<uint8_t> bytes = mem::EncodeProgram(p);
  const Program* f = GetProgram(bytes.data());
  CHECK(f->format_version() == 3);
  REQUIRE(f->roles()->Get(0)->steps());
  CHECK(f->roles()->Get(0)->steps()->size() == 3);
  CHECK((!f->roles()->Get(0)->schedule() || f->roles()->Get(0)->schedule()->size() == 0));
  const mem::Program back = mem::DecodeProgramModel(*f);
  REQUIRE(back.roles[0].schedule.size() == 3);
  CHECK(back.roles[0].steps.empty());
  CHECK(back.roles[0].schedule[1].ints == role.schedule[1].ints);
  // A schedule with an op a step cannot hold stays ops.
  p.roles[0].schedule[1].floats = {1.0};
  const std::vector<uint8_t> general = mem::EncodeProgram(p);
  const Program* g = GetProgram(general.data());
  CHECK(!g->roles()->Get(0)->steps());
  CHECK(g->roles()->Get(0)->schedule()->size() == 3);
  // A role that holds its schedule both ways is refused.
  mem::Program twice = p;
  twice.roles[0].schedule[1].floats.clear();
  twice.roles[0].steps = {ScheduleStep(0, 0, 0, 0, 0, 0, OpKind::Forward, CommKind::None)};
  const std::vector<uint8_t> both = mem::EncodeProgram(twice);
  std::string refusal;
  try {
    mem::DecodeProgram(both.data(), both.size(), "twice.pplan");
  } catch (const mem::ProgramError& e) {
    refusal = e.what();
  }
  CHECK(refusal ==
        "program `twice.pplan`: role `stage0` holds its schedule twice, as ops and as "
        "steps");
  // Format 2 (every schedule as ops) is still written as it was, and still read.
  mem::Program old = p;
  old.format_version = 2;
  old.roles[0].schedule[1].floats.clear();
  const std::vector<uint8_t> v2 = mem::EncodeProgram(old);
  const Program* o = GetProgram(v2.data());
  CHECK(o->format_version() == 2);
  CHECK(!o->roles()->Get(0)->steps());
  CHECK(o->roles()->Get(0)->schedule()->size() == 3);
  std::string v2_refusal;
  try {
    mem::DecodeProgram(v2.data(), v2.size(), "v2.pplan");
  } catch (const mem::ProgramError& e) {
    v2_refusal = e.what();  // the minimal program has no model shape; its version is fine
  }
  CHECK(v2_refusal.find("format version") == std::string::npos);
  CHECK(v2_refusal.find("model.seq_len") != std::string::npos);
  CHECK(IsReadableFormatVersion(2));
  CHECK(IsReadableFormatVersion(kFormatVersion));
  CHECK_FALSE(IsReadableFormatVersion(1));
  CHECK_FALSE(IsReadableFormatVersion(kFormatVersion + 1));
}

TEST_CASE("every comm kind has a slot in Rank.comms") {
  CHECK(kCommKinds == static_cast<int>(CommKind::Replicate) + 1);
  CHECK(DTypeBytes(DType::Bf16) == 2);
  CHECK(DTypeBytes(DType::F32) == 4);
}

}  // namespace
}  // namespace paraplan::prog
