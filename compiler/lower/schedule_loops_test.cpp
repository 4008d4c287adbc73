// Loop-form schedules (format 4): expanded, they are exactly the listed schedules, whatever the
// schedule kind and microbatch count; the file stores them compactly and reads them back as the
// same ops; the whole-world verifier checks them without listing them and still catches
// mutations inside a loop.
#include "compiler/lower/schedule_loops.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <string>
#include <string_view>

#include "compiler/lower/lower.h"
#include "compiler/lower/print.h"
#include "runtime/format/ops.h"
#include "runtime/format/program_model.h"
#include "runtime/verify/verify.h"

namespace paraplan::lower {

Plan TinyPlan(int64_t tp, int64_t pp, int64_t dp, Schedule schedule, int64_t vpp);

namespace {

Plan WithMicrobatches(Plan plan, int64_t m) {
  plan.batch.global = plan.batch.micro * plan.parallel.dp * m;
  return plan;
}

Program LowerWith(const Plan& plan, bool loops, bool verify, int32_t group = 0) {
  DiagnosticSink sink;
  LowerOptions options;
  options.microbatch_group = group;
  options.compact_schedule = true;
  options.schedule_loops = loops;
  options.loop_min_saving = 1;
  options.loop_min_microbatches = 1;
  options.verify = verify;
  std::optional<Program> p = LowerPlan(plan, options, sink);
  REQUIRE(p.has_value());
  return std::move(*p);
}

// The program with its loops expanded into listed steps.
Program Expanded(Program p) {
  for (Role& role : p.roles) {
    role.steps = ExpandLoops({role.steps, role.loops}, prog::mem::ChunkSlots(role));
    role.loops.clear();
  }
  p.format_version = 3;
  return p;
}

size_t LoopCount(const Program& p) {
  size_t n = 0;
  for (const Role& r : p.roles) n += r.loops.size();
  return n;
}

struct Shape {
  Schedule schedule;
  int64_t pp, vpp;
  std::vector<int64_t> microbatches;
};

const std::vector<Shape>& Shapes() {
  static const std::vector<Shape> kShapes = {
      {Schedule::kGpipe, 4, 1, {1, 3, 5, 9, 17, 37, 50}},
      {Schedule::k1F1B, 4, 1, {1, 2, 3, 5, 7, 13, 36, 37, 50, 101}},
      {Schedule::k1F1B, 2, 1, {1, 3, 9, 27, 40}},
      {Schedule::kInterleaved1F1B, 4, 2, {4, 8, 12, 20, 36, 40, 64, 100}},
      {Schedule::kInterleaved1F1B, 2, 4, {2, 6, 14, 26, 42}},
  };
  return kShapes;
}

}  // namespace

TEST_CASE("loop-form schedules expand to exactly the listed schedule, file byte for byte") {
  for (const Shape& s : Shapes())
    for (int64_t m : s.microbatches) {
      CAPTURE(static_cast<int>(s.schedule));
      CAPTURE(s.pp);
      CAPTURE(m);
      const Plan plan = WithMicrobatches(TinyPlan(1, s.pp, 1, s.schedule, s.vpp), m);
      const Program flat = LowerWith(plan, false, false);
      const Program looped = LowerWith(plan, true, false);
      CHECK(LoopCount(flat) == 0);
      if (m >= 4 * s.pp * s.vpp) CHECK(LoopCount(looped) > 0);
      const std::vector<uint8_t> flat_bytes = ToFlatBuffer(flat);
      CHECK(ToFlatBuffer(Expanded(looped)) == flat_bytes);
      // The file of the loop form reads back as the listed ops.
      const std::vector<uint8_t> bytes = ToFlatBuffer(looped);
      if (LoopCount(looped) > 0) CHECK(bytes.size() < flat_bytes.size());
      std::string error;
      std::optional<Program> back = FromFlatBuffer(bytes.data(), bytes.size(), &error);
      REQUIRE_MESSAGE(back.has_value(), error);
      std::optional<Program> back_flat =
          FromFlatBuffer(flat_bytes.data(), flat_bytes.size(), &error);
      REQUIRE(back_flat.has_value());
      REQUIRE(back->roles.size() == back_flat->roles.size());
      // The runtime's reader gives the same ops too.
      const prog::mem::Program run = prog::mem::DecodeProgram(bytes.data(), bytes.size(), "loops");
      const prog::mem::Program run_flat =
          prog::mem::DecodeProgram(flat_bytes.data(), flat_bytes.size(), "flat");
      for (size_t r = 0; r < run.roles.size(); ++r) {
        const auto& a = run.roles[r].schedule;
        const auto& b = run_flat.roles[r].schedule;
        REQUIRE(a.size() == b.size());
        for (size_t i = 0; i < a.size(); ++i) CHECK(a[i].ints == b[i].ints);
      }
      for (size_t r = 0; r < back->roles.size(); ++r) {
        const auto& a = back->roles[r].schedule;
        const auto& b = back_flat->roles[r].schedule;
        REQUIRE(a.size() == b.size());
        for (size_t i = 0; i < a.size(); ++i) {
          CHECK(a[i].kind == b[i].kind);
          CHECK(a[i].ints == b[i].ints);
          CHECK(a[i].inputs == b[i].inputs);
          CHECK(a[i].outputs == b[i].outputs);
        }
      }
    }
}

TEST_CASE("loop forms of interleaved groups other than pp, and of many iterations") {
  struct Case {
    int64_t m;
    int32_t group;
  };
  for (const Case& c : {Case{64, 6}, Case{100, 6}, Case{70, 5}, Case{260, 0}, Case{203, 0}}) {
    CAPTURE(c.m);
    CAPTURE(c.group);
    const int64_t pp = c.group == 0 && c.m % 4 != 0 ? 1 : 4;
    const Schedule kind = pp == 1 ? Schedule::k1F1B : Schedule::kInterleaved1F1B;
    const Plan plan = WithMicrobatches(TinyPlan(1, pp == 1 ? 2 : 4, 1, kind, pp == 1 ? 1 : 2), c.m);
    const Program flat = LowerWith(plan, false, false, c.group);
    const Program looped = LowerWith(plan, true, true, c.group);
    CHECK(LoopCount(looped) > 0);
    CHECK(ToFlatBuffer(Expanded(looped)) == ToFlatBuffer(flat));
  }
}

TEST_CASE("planc dump's reading keeps loops for verification and prints the same ranks") {
  const Plan plan = WithMicrobatches(TinyPlan(1, 4, 2, Schedule::kInterleaved1F1B, 2), 64);
  const Program looped = LowerWith(plan, true, false);
  REQUIRE(LoopCount(looped) > 0);
  const std::vector<uint8_t> bytes = ToFlatBuffer(looped);
  const std::vector<uint8_t> flat_bytes = ToFlatBuffer(Expanded(looped));
  std::string error;
  std::optional<Program> kept = FromFlatBuffer(bytes.data(), bytes.size(), &error, true);
  std::optional<Program> flat = FromFlatBuffer(flat_bytes.data(), flat_bytes.size(), &error);
  REQUIRE(kept.has_value());
  REQUIRE(flat.has_value());
  CHECK(LoopCount(*kept) == LoopCount(looped));
  VerifyStats a, b;
  CHECK(VerifyWorld(*kept, &a).empty());
  CHECK(VerifyWorld(*flat, &b).empty());
  CHECK(a.simulated_ops == b.simulated_ops);
  CHECK(a.skips > 0);
  for (int32_t r = 0; r < kept->world_size; ++r) CHECK(PrintRank(*kept, r) == PrintRank(*flat, r));
  std::string summary = PrintProgram(*kept);
  const std::string flat_summary = PrintProgram(*flat);
  const size_t at = summary.find("(format 4,");
  REQUIRE(at != std::string::npos);
  summary.replace(at, 10, "(format 3,");
  CHECK(summary == flat_summary);
}

TEST_CASE("the verifier checks loop-form programs as it checks listed ones") {
  for (const Shape& s : Shapes())
    for (int64_t m : s.microbatches) {
      CAPTURE(static_cast<int>(s.schedule));
      CAPTURE(s.pp);
      CAPTURE(m);
      const Plan plan = WithMicrobatches(TinyPlan(1, s.pp, 2, s.schedule, s.vpp), m);
      const Program flat = LowerWith(plan, false, false);
      const Program looped = LowerWith(plan, true, false);
      VerifyStats a, b;
      const std::vector<std::string> ea = VerifyWorld(flat, &a);
      const std::vector<std::string> eb = VerifyWorld(looped, &b);
      CHECK(ea.empty());
      CHECK_MESSAGE(eb.empty(), (eb.empty() ? std::string() : eb[0]));
      CHECK(a.simulated_ops == b.simulated_ops);
      CHECK(a.transfers == b.transfers);
      CHECK(a.collectives == b.collectives);
      // Past a few periods the simulation skips the steady state's repeated iterations.
      if (m >= 40) CHECK(b.skips > 0);
    }
}

namespace {

// The 1F1B program of pp 4 with 50 microbatches in loop form, and the role and loop mutated.
Program LoopedProgram() {
  Program p = LowerWith(WithMicrobatches(TinyPlan(1, 4, 1, Schedule::k1F1B, 1), 50), true, false);
  REQUIRE(LoopCount(p) > 0);
  REQUIRE(VerifyWorld(p).empty());
  return p;
}

// The role's loop of the most iterations (the steady state).
size_t SteadyLoop(const Role& role) {
  REQUIRE(!role.loops.empty());
  size_t best = 0;
  for (size_t i = 1; i < role.loops.size(); ++i)
    if (role.loops[i].count() > role.loops[best].count()) best = i;
  return best;
}

// The position in the role's steps of the first step of `kind` inside its steady-state loop.
size_t InLoop(const Role& role, prog::OpKind kind) {
  const prog::ScheduleLoop& l = role.loops[SteadyLoop(role)];
  for (int32_t i = l.begin(); i < l.begin() + l.length(); ++i)
    if (role.steps[static_cast<size_t>(i)].kind() == kind) return static_cast<size_t>(i);
  FAIL("no such step in the loop");
  return 0;
}

std::string FirstError(const Program& p) {
  const std::vector<std::string> e = VerifyWorld(p);
  return e.empty() ? std::string() : e[0];
}

}  // namespace

TEST_CASE("mutations inside a loop are caught") {
  SUBCASE("a receive missing from the loop body") {
    Program p = LoopedProgram();
    Role& role = p.roles[1];
    const size_t at = InLoop(role, prog::OpKind::RecvActivation);
    const prog::ScheduleStep& s = role.steps[at];
    // The receive becomes a second forward-stage send to the same peer: the pair no longer
    // matches and the counts disagree.
    role.steps[at] =
        prog::ScheduleStep(s.microbatch(), s.slot(), s.group(), role.chunks[0].output, s.peer(),
                           s.chunk(), prog::OpKind::SendActivation, s.comm());
    CHECK(!FirstError(p).empty());
  }
  SUBCASE("a wrong peer inside the loop body") {
    Program p = LoopedProgram();
    Role& role = p.roles[1];
    const size_t at = InLoop(role, prog::OpKind::SendActivation);
    const prog::ScheduleStep& s = role.steps[at];
    role.steps[at] = prog::ScheduleStep(s.microbatch(), s.slot(), s.group(), s.operand(), 3,
                                        s.chunk(), s.kind(), s.comm());
    CHECK(!FirstError(p).empty());
  }
  SUBCASE("a loop count that disagrees between pipeline neighbours") {
    for (int delta : {-1, 1}) {
      Program p = LoopedProgram();
      Role& role = p.roles[2];
      prog::ScheduleLoop& l = role.loops[SteadyLoop(role)];
      l = prog::ScheduleLoop(l.begin(), l.length(), l.count() + delta, l.microbatch_stride(),
                             l.slot_stride(), l.group_stride());
      const std::string e = FirstError(p);
      CHECK(!e.empty());
      CHECK(e.find("stage2") != std::string::npos);
    }
  }
  SUBCASE("a forward of the wrong microbatch inside the loop body") {
    Program p = LoopedProgram();
    Role& role = p.roles[1];
    const size_t at = InLoop(role, prog::OpKind::Forward);
    const prog::ScheduleStep& s = role.steps[at];
    role.steps[at] = prog::ScheduleStep(s.microbatch() + 1, s.slot(), s.group(), s.operand(),
                                        s.peer(), s.chunk(), s.kind(), s.comm());
    // The forward names its microbatch's neighbour: counted twice, and it takes the slot the
    // neighbour holds.
    const std::vector<std::string> e = VerifyWorld(p);
    auto said = [&](std::string_view words) {
      return std::any_of(e.begin(), e.end(),
                         [&](const std::string& x) { return x.find(words) != std::string::npos; });
    };
    CHECK(said("runs forward"));
    CHECK(said("still holds"));
  }
  SUBCASE("a loop that is not well formed is refused by the structure check") {
    Program p = LoopedProgram();
    prog::ScheduleLoop& l = p.roles[1].loops[0];
    l = prog::ScheduleLoop(l.begin(), l.length(), 0, l.microbatch_stride(), l.slot_stride(),
                           l.group_stride());
    CHECK(FirstError(p).find("iteration count 0 < 1") != std::string::npos);
  }
}

TEST_CASE("a file with a malformed loop is refused with a message") {
  Program p = LoopedProgram();
  const std::vector<std::pair<prog::ScheduleLoop, std::string>> bad = {
      {prog::ScheduleLoop(0, 1 << 20, 2, 1, 1, 0), "not a non-empty range"},
      {prog::ScheduleLoop(1, 3, -4, 1, 1, 0), "iteration count -4 < 1"},
      {prog::ScheduleLoop(1, 3, 2, -1, 1, 0), "negative stride"},
      {prog::ScheduleLoop(0, 3, 2, 1, 1, 0), "cannot repeat"},
      {prog::ScheduleLoop(1, 3, 1 << 30, 1 << 20, 1, 1), "int32 range"},
  };
  for (const auto& entry : bad) {
    const prog::ScheduleLoop& loop = entry.first;
    const std::string& words = entry.second;
    CAPTURE(words);
    Program q = p;
    q.roles[1].loops = {loop};
    const std::vector<uint8_t> bytes = ToFlatBuffer(q);
    std::string error;
    CHECK(!FromFlatBuffer(bytes.data(), bytes.size(), &error).has_value());
    CHECK(error.find(words) != std::string::npos);
    try {
      (void)prog::mem::DecodeProgram(bytes.data(), bytes.size(), "bad.pplan");
      FAIL("decoded");
    } catch (const prog::mem::ProgramError& e) {
      CHECK(std::string(e.what()).find(words) != std::string::npos);
    }
  }
  // Overlapping loops.
  Program q = p;
  REQUIRE(!q.roles[1].loops.empty());
  const prog::ScheduleLoop l = q.roles[1].loops[0];
  q.roles[1].loops = {l, l};
  const std::vector<uint8_t> bytes = ToFlatBuffer(q);
  std::string error;
  CHECK(!FromFlatBuffer(bytes.data(), bytes.size(), &error).has_value());
  CHECK(error.find("not overlap") != std::string::npos);
}

}  // namespace paraplan::lower
