// Compute orders against the orders derived by hand from Megatron-Core's schedules
// (reference/pipeline-schedules.md §3) and the transfer pairing between ranks.
#include "compiler/lower/schedule.h"

#include <doctest/doctest.h>

#include <map>
#include <tuple>

namespace paraplan::lower {
namespace {

using prog::ScheduleKind;

TEST_CASE("1f1b: warm-up p - r - 1, then one forward one backward, then cool-down") {
  ScheduleShape s{ScheduleKind::OneFOneB, 4, 1, 8};
  CHECK(FormatOrder(ComputeOrder(s, 0)) == "F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7");
  CHECK(FormatOrder(ComputeOrder(s, 1)) == "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 F6 B4 F7 B5 B6 B7");
  CHECK(FormatOrder(ComputeOrder(s, 3)) == "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7");
  CHECK(WarmupCount(s, 0) == 3);
  CHECK(WarmupCount(s, 3) == 0);
}

TEST_CASE("1f1b with fewer microbatches than stages caps the warm-up (Megatron allows m < p)") {
  ScheduleShape s{ScheduleKind::OneFOneB, 4, 1, 2};
  CHECK(CheckScheduleShape(s).empty());
  CHECK(WarmupCount(s, 0) == 2);
  CHECK(FormatOrder(ComputeOrder(s, 0)) == "F0 F1 B0 B1");
  CHECK(FormatOrder(ComputeOrder(s, 2)) == "F0 F1 B0 B1");  // warm-up min(1, 2) = 1
  CHECK(FormatOrder(ComputeOrder(s, 3)) == "F0 B0 F1 B1");
}

TEST_CASE("gpipe: all forwards, then all backwards in microbatch order") {
  ScheduleShape s{ScheduleKind::Gpipe, 2, 1, 3};
  CHECK(FormatOrder(ComputeOrder(s, 0)) == "F0 F1 F2 B0 B1 B2");
  CHECK(FormatOrder(ComputeOrder(s, 1)) == "F0 F1 F2 B0 B1 B2");
}

TEST_CASE("interleaved: Megatron's group table, p = 4, v = 2, m = 8") {
  ScheduleShape s{ScheduleKind::Interleaved1F1B, 4, 2, 8};
  REQUIRE(CheckScheduleShape(s).empty());
  // Warm-up 2(p - r - 1) + (v - 1)·p: rank 0 -> 10, rank 3 -> 4.
  CHECK(WarmupCount(s, 0) == 10);
  CHECK(WarmupCount(s, 3) == 4);
  // The notes' example for rank 0, continued by hand: backward k uses table[k] with the chunk
  // mirrored.
  CHECK(FormatOrder(ComputeOrder(s, 0)) ==
        "F0 F1 F2 F3 F0' F1' F2' F3' F4 F5 F6 B0' F7 B1' F4' B2' F5' B3' F6' B0 F7' B1 B2 B3 B4' "
        "B5' B6' B7' B4 B5 B6 B7");
  CHECK(FormatOrder(ComputeOrder(s, 3)) ==
        "F0 F1 F2 F3 F0' B0' F1' B1' F2' B2' F3' B3' F4 B0 F5 B1 F6 B2 F7 B3 F4' B4' F5' B5' F6' "
        "B6' F7' B7' B4 B5 B6 B7");
}

TEST_CASE("interleaved: everything is warm-up when the warm-up reaches m·v") {
  ScheduleShape s{ScheduleKind::Interleaved1F1B, 4, 2, 4};
  REQUIRE(CheckScheduleShape(s).empty());
  CHECK(WarmupCount(s, 0) == 8);
  CHECK(FormatOrder(ComputeOrder(s, 0)) ==
        "F0 F1 F2 F3 F0' F1' F2' F3' B0' B1' B2' B3' B0 B1 B2 B3");
}

TEST_CASE("interleaved microbatch rules (Megatron): pp <= G <= m and m mod G in {0} or >= pp") {
  CHECK(CheckScheduleShape({ScheduleKind::Interleaved1F1B, 4, 2, 6}).find("6 mod 4 = 2") !=
        std::string::npos);
  CHECK(CheckScheduleShape({ScheduleKind::Interleaved1F1B, 4, 2, 3}).find("4 <= 3") !=
        std::string::npos);
  CHECK(CheckScheduleShape({ScheduleKind::Interleaved1F1B, 4, 2, 12}).empty());
  // A group of 6 accepts m = 6 (PyTorch's per_round 6 gives the same order).
  CHECK(CheckScheduleShape({ScheduleKind::Interleaved1F1B, 4, 2, 6, 6}).empty());
  // m = 10 with G = 4: 10 mod 4 = 2 < 4 -> rejected; with G = 5 accepted.
  CHECK(!CheckScheduleShape({ScheduleKind::Interleaved1F1B, 4, 2, 10}).empty());
  CHECK(CheckScheduleShape({ScheduleKind::Interleaved1F1B, 4, 2, 10, 5}).empty());
  CHECK(!CheckScheduleShape({ScheduleKind::Interleaved1F1B, 4, 1, 8}).empty());
  CHECK(!CheckScheduleShape({ScheduleKind::OneFOneB, 4, 2, 8}).empty());
}

TEST_CASE("interleaved with a group of 6 equals PyTorch's Interleaved1F1B order for m = 6") {
  // PyTorch: warm-up (v - 1)·per_round + 2(p - 1 - r) = 6 + 6 = 12 = m·v on rank 0.
  ScheduleShape s{ScheduleKind::Interleaved1F1B, 4, 2, 6, 6};
  CHECK(WarmupCount(s, 0) == 12);
  CHECK(WarmupCount(s, 3) == 6);
  CHECK(FormatOrder(ComputeOrder(s, 3)) ==
        "F0 F1 F2 F3 F4 F5 F0' B0' F1' B1' F2' B2' F3' B3' F4' B4' F5' B5' B0 B1 B2 B3 B4 B5");
}

// Every ordered pair of pipeline ranks: the k-th send matches the k-th receive.
void CheckPairing(const ScheduleShape& s) {
  auto programs = PipelinePrograms(s);
  using Key = std::tuple<int, int, bool>;  // from, to, grad
  std::map<Key, std::vector<std::pair<int, int>>> sends,
      recvs;  // (microbatch, global stage of the data's producer)
  for (int r = 0; r < s.pp; ++r)
    for (const PipelineStep& st : programs[r]) {
      int stage = st.chunk * s.pp + r;
      switch (st.kind) {
        case prog::OpKind::SendActivation:
          sends[{r, st.peer, false}].push_back({st.microbatch, stage});
          break;
        case prog::OpKind::RecvActivation:
          recvs[{st.peer, r, false}].push_back({st.microbatch, stage - 1});
          break;
        case prog::OpKind::SendGrad:
          sends[{r, st.peer, true}].push_back({st.microbatch, stage});
          break;
        case prog::OpKind::RecvGrad:
          recvs[{st.peer, r, true}].push_back({st.microbatch, stage + 1});
          break;
        default:
          break;
      }
    }
  CHECK(sends == recvs);
}

TEST_CASE("transfers pair up in order between every two ranks") {
  CheckPairing({ScheduleKind::OneFOneB, 4, 1, 8});
  CheckPairing({ScheduleKind::OneFOneB, 4, 1, 2});
  CheckPairing({ScheduleKind::Gpipe, 3, 1, 5});
  CheckPairing({ScheduleKind::Interleaved1F1B, 4, 2, 8});
  CheckPairing({ScheduleKind::Interleaved1F1B, 2, 3, 4});
  CheckPairing({ScheduleKind::Interleaved1F1B, 4, 2, 10, 5});
}

TEST_CASE("1f1b transfers: Megatron's steady-state pairing, send output with receive of the grad") {
  auto programs = PipelinePrograms({ScheduleKind::OneFOneB, 2, 1, 2});
  // Rank 0: F0 [send act 0 + recv act? no: rank 0 has no input] F1 [send act 1, recv grad 0] B0
  // [recv grad 1] B1.
  const auto& p0 = programs[0];
  REQUIRE(p0.size() == 8);
  CHECK(p0[0].kind == prog::OpKind::Forward);
  CHECK(p0[1].kind == prog::OpKind::SendActivation);
  CHECK(p0[2].kind == prog::OpKind::Forward);
  CHECK(p0[3].kind == prog::OpKind::SendActivation);
  CHECK(p0[4].kind == prog::OpKind::RecvGrad);
  CHECK(p0[3].group != 0);
  CHECK(p0[3].group == p0[4].group);
  CHECK(p0[1].group == 0);  // a lone transfer
}

}  // namespace
}  // namespace paraplan::lower
