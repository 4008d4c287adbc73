#include "runtime/comm/in_process.h"

#include <doctest/doctest.h>

#include <atomic>
#include <thread>
#include <vector>

namespace paraplan::comm {
namespace {

// A group that counts the collectives it saw complete (AllArrived runs once per collective).
class CountingGroup final : public InProcessGroup {
 public:
  using InProcessGroup::InProcessGroup;
  int completed = 0;
  int64_t last_count = -1;

 protected:
  void AllArrived(const CollectivePost& post) override {
    ++completed;
    last_count = post.count;
  }
};

std::shared_ptr<CountingGroup> JoinCounting(InProcessWorld& world, const std::vector<int>& members,
                                            int world_rank, int tag = 0, int* index = nullptr) {
  auto [group, me] = world.Join(members, world_rank, tag, [&]() -> std::shared_ptr<InProcessGroup> {
    return std::make_shared<CountingGroup>(&world, members);
  });
  if (index) *index = me;
  return std::static_pointer_cast<CountingGroup>(group);
}

// Runs body(member) on one thread per member and returns each member's CommError text ("" when
// it returned normally).
template <typename Body>
std::vector<std::string> OnThreads(int n, Body body) {
  std::vector<std::string> errors(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        body(r);
      } catch (const CommError& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

TEST_CASE("joining: members are checked, equal member lists and tags share one group") {
  InProcessWorld world(4, 60.0, "test world");
  CHECK(world.Size() == 4);
  auto make = [&]() -> std::shared_ptr<InProcessGroup> {
    return std::make_shared<CountingGroup>(&world, std::vector<int>{});
  };
  CHECK_THROWS_WITH_AS(world.Join({}, 0, 0, make), doctest::Contains("at least one member"),
                       CommError);
  CHECK_THROWS_WITH_AS(world.Join({1, 1}, 1, 0, make), doctest::Contains("twice"), CommError);
  CHECK_THROWS_WITH_AS(world.Join({0, 4}, 0, 0, make),
                       doctest::Contains("names rank 4 outside the world of 4"), CommError);
  CHECK_THROWS_WITH_AS(world.Join({0, 1}, 2, 0, make),
                       doctest::Contains("rank 2 is not a member of group [0,1]"), CommError);
  CHECK_THROWS_WITH_AS(InProcessWorld(0, 1.0, "test world"),
                       doctest::Contains("a test world needs at least one rank, got 0"), CommError);

  int index = -1;
  auto a = JoinCounting(world, {3, 1}, 1, 0, &index);
  CHECK(index == 1);  // the member list's order gives the group ranks
  auto b = JoinCounting(world, {3, 1}, 3, 0, &index);
  CHECK(index == 0);
  CHECK(a == b);
  CHECK(a->Members() == std::vector<int>{3, 1});
  auto c = JoinCounting(world, {3, 1}, 3, /*tag=*/1);
  CHECK(c != a);
}

TEST_CASE("a collective: every member's post is visible between Arrive and Depart") {
  InProcessWorld world(3, 60.0, "test world");
  std::vector<int> values{10, 20, 30};
  std::vector<int> sums(3, 0);
  auto errors = OnThreads(3, [&](int r) {
    auto g = JoinCounting(world, {0, 1, 2}, r);
    for (int round = 0; round < 50; ++round) {
      g->Arrive(r, CollectivePost{CollectiveKind::kAllGather, 7, DType::kF32, ReduceOp::kSum, 0,
                                  &values[static_cast<size_t>(r)], nullptr});
      int sum = 0;
      for (int m = 0; m < 3; ++m) sum += *static_cast<const int*>(g->PostOf(m).send);
      sums[static_cast<size_t>(r)] += sum;
      g->Depart(r);
    }
  });
  for (const auto& e : errors) CHECK(e.empty());
  for (int s : sums) CHECK(s == 50 * 60);
  auto g = JoinCounting(world, {0, 1, 2}, 0);
  CHECK(g->completed == 50);
  CHECK(g->last_count == 7);
}

TEST_CASE("a mismatch fails every member and names both calls") {
  InProcessWorld world(2, 60.0, "test world");
  auto errors = OnThreads(2, [&](int r) {
    auto g = JoinCounting(world, {0, 1}, r);
    g->Arrive(r, CollectivePost{CollectiveKind::kAllReduce, 4, DType::kF32,
                                r == 0 ? ReduceOp::kSum : ReduceOp::kMax, 0, nullptr, nullptr});
  });
  for (const auto& e : errors)
    CHECK(e.find("collective mismatch on group [0,1]") != std::string::npos);
  CHECK(world.Aborted());
  CHECK(world.AbortReason() ==
        "collective mismatch on group [0,1]: rank 0 called all_reduce(count 4, f32, sum) but rank "
        "1 called all_reduce(count 4, f32, max)");
  // Fields that do not belong to the kind are not compared: a barrier's root is ignored.
  InProcessWorld other(2, 60.0, "test world");
  auto fine = OnThreads(2, [&](int r) {
    auto g = JoinCounting(other, {0, 1}, r);
    CollectivePost post;
    post.root = r;
    g->Arrive(r, post);
  });
  for (const auto& e : fine) CHECK(e.empty());
}

TEST_CASE("a member that never arrives times out every waiter, and the world is aborted") {
  InProcessWorld world(3, 0.3, "test world");
  auto errors = OnThreads(3, [&](int r) {
    if (r == 2) return;
    auto g = JoinCounting(world, {0, 1, 2}, r);
    g->Arrive(r, CollectivePost{});
  });
  const bool one_timed_out = errors[0].find(
                                 "waited more than 0.3 s in barrier on group [0,1,2]: "
                                 "a member never arrived") != std::string::npos ||
                             errors[1].find("a member never arrived") != std::string::npos;
  CHECK(one_timed_out);
  CHECK(!errors[0].empty());
  CHECK(!errors[1].empty());
  CHECK(world.Aborted());
  // Later calls fail at once with the reason.
  auto g = JoinCounting(world, {0, 1, 2}, 0);
  CHECK_THROWS_WITH_AS(g->Arrive(0, CollectivePost{}), doctest::Contains("aborted: rank"),
                       CommError);
}

TEST_CASE("an abort wakes the waiters; Finish gives up, Depart completes") {
  InProcessWorld world(2, 60.0, "test world");
  auto g = JoinCounting(world, {0, 1}, 0);
  std::atomic<bool> waiting{false};
  std::string error;
  std::thread t([&] {
    try {
      waiting = true;
      g->Finish(0, CollectiveKind::kAllReduce);
    } catch (const CommError& e) {
      error = e.what();
    }
  });
  while (!waiting) std::this_thread::yield();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  world.Abort("rank 1 failed");
  world.Abort("a later reason");  // the first reason stays
  t.join();
  CHECK(error == "aborted: rank 1 failed");

  // Depart after an abort still waits for every member and returns normally: members between
  // Arrive and Depart may be reading each other's buffers.
  auto errors = OnThreads(2, [&](int r) { g->Depart(r); });
  for (const auto& e : errors) CHECK(e.empty());
}

TEST_CASE("point to point: parcels arrive in order and are checked against the receive") {
  InProcessWorld world(2, 60.0, "test world");
  auto g = JoinCounting(world, {0, 1}, 0);
  for (int i = 0; i < 3; ++i) {
    g->Deliver(0, 1, Parcel{i + 1, DType::kF32, std::make_shared<int>(100 + i)});
  }
  for (int i = 0; i < 3; ++i) {
    const Parcel p = g->Collect(0, 1, i + 1, DType::kF32);
    CHECK(*static_cast<const int*>(p.payload.get()) == 100 + i);
  }
  g->Deliver(1, 0, Parcel{2, DType::kBF16, nullptr});
  CHECK_THROWS_WITH_AS(g->Collect(1, 0, 2, DType::kF32),
                       doctest::Contains("rank 0 expected 2 f32 from rank 1 but the matching send "
                                         "carried 2 bf16"),
                       CommError);
  CHECK(world.Aborted());
}

TEST_CASE("a receive with no sender times out naming the peer") {
  InProcessWorld world(2, 0.2, "test world");
  auto g = JoinCounting(world, {0, 1}, 0);
  CHECK_THROWS_WITH_AS(g->Collect(0, 1, 1, DType::kF32),
                       doctest::Contains("rank 1 waited more than 0.2 s in recv from rank 0"),
                       CommError);
}

TEST_CASE("names of posts and member lists") {
  CHECK(DescribePost(CollectivePost{CollectiveKind::kBroadcast, 2, DType::kBF16, ReduceOp::kMax, 1,
                                    nullptr, nullptr}) == "broadcast(count 2, bf16, root 1)");
  CHECK(DescribePost(CollectivePost{CollectiveKind::kAllReduce, 3, DType::kF32, ReduceOp::kMax, 1,
                                    nullptr, nullptr}) == "all_reduce(count 3, f32, max)");
  CHECK(MembersText({}) == "[]");
  CHECK(MembersText({4, 0, 2}) == "[4,0,2]");
}

}  // namespace
}  // namespace paraplan::comm
