#include "runtime/backends/host/comm/host_communicator.h"

#include <doctest/doctest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

using namespace paraplan::comm;

namespace {

// Runs fn(rank) on `n` threads; returns the error messages (empty string for success).
std::vector<std::string> RunRanks(int n, const std::function<void(int)>& fn) {
  std::vector<std::string> errors(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        fn(r);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

std::vector<int> All(int n) {
  std::vector<int> v(n);
  std::iota(v.begin(), v.end(), 0);
  return v;
}

void RequireNoErrors(const std::vector<std::string>& errors) {
  for (auto& e : errors) CHECK_MESSAGE(e.empty(), e);
}

}  // namespace

TEST_CASE("all_reduce sums in group order, in place and out of place, repeatedly") {
  for (int n : {1, 2, 3, 4, 8}) {
    HostWorld world(n);
    std::vector<std::vector<float>> results(n);
    RequireNoErrors(RunRanks(n, [&](int r) {
      auto comm = world.Join(All(n), r);
      for (int iter = 0; iter < 20; ++iter) {
        const int64_t count = 37 + iter;
        std::vector<float> buf(count);
        for (int64_t i = 0; i < count; ++i) buf[i] = static_cast<float>(r + 1) * (i + iter) * 0.5f;
        std::vector<float> out(count);
        comm->AllReduce(buf.data(), out.data(), count, DType::kF32);
        comm->AllReduce(buf.data(), buf.data(), count, DType::kF32);
        for (int64_t i = 0; i < count; ++i) {
          float expect = 0;
          for (int s = 0; s < n; ++s) expect += static_cast<float>(s + 1) * (i + iter) * 0.5f;
          REQUIRE(out[i] == expect);
          REQUIRE(buf[i] == expect);
        }
      }
    }));
  }
}

TEST_CASE("all_reduce is bitwise independent of thread timing (fixed order)") {
  // Values whose float sum depends on the order: the result must equal the left-to-right sum.
  const int n = 4;
  const float vals[n] = {1e8f, 1.0f, -1e8f, 1.0f};
  const float expect = ((vals[0] + vals[1]) + vals[2]) + vals[3];
  for (int trial = 0; trial < 20; ++trial) {
    HostWorld world(n);
    std::vector<float> got(n);
    RequireNoErrors(RunRanks(n, [&](int r) {
      auto comm = world.Join(All(n), r);
      if (r == trial % n) std::this_thread::yield();
      float v = vals[r];
      comm->AllReduce(&v, &v, 1, DType::kF32);
      got[r] = v;
    }));
    for (float g : got) CHECK(g == expect);
  }
}

TEST_CASE("all_reduce max") {
  HostWorld world(3);
  RequireNoErrors(RunRanks(3, [&](int r) {
    auto comm = world.Join(All(3), r);
    float v[2] = {static_cast<float>(r), static_cast<float>(-r)};
    comm->AllReduce(v, v, 2, DType::kF32, ReduceOp::kMax);
    REQUIRE(v[0] == 2.0f);
    REQUIRE(v[1] == 0.0f);
  }));
}

TEST_CASE("bf16 all_reduce widens, sums in fp32 and rounds") {
  HostWorld world(2);
  RequireNoErrors(RunRanks(2, [&](int r) {
    auto comm = world.Join(All(2), r);
    uint16_t v = r == 0 ? 0x3f80 : 0x4000;  // 1.0 and 2.0
    comm->AllReduce(&v, &v, 1, DType::kBF16);
    REQUIRE(v == 0x4040);  // 3.0
  }));
}

TEST_CASE("reduce_scatter, all_gather, broadcast, all_to_all") {
  const int64_t n = 4, c = 5;
  HostWorld world(n);
  RequireNoErrors(RunRanks(n, [&](int r) {
    auto comm = world.Join(All(n), r);
    std::vector<float> send(n * c), recv(c);
    for (int i = 0; i < n * c; ++i) send[i] = static_cast<float>(100 * r + i);
    comm->ReduceScatter(send.data(), recv.data(), c, DType::kF32);
    for (int i = 0; i < c; ++i) {
      float e = 0;
      for (int64_t s = 0; s < n; ++s) e += static_cast<float>(100 * s + r * c + i);
      REQUIRE(recv[i] == e);
    }
    std::vector<float> mine(c, static_cast<float>(r)), all(n * c);
    comm->AllGather(mine.data(), all.data(), c, DType::kF32);
    for (int64_t i = 0; i < n * c; ++i) {
      const int64_t owner = i / c;
      REQUIRE(all[i] == static_cast<float>(owner));
    }
    std::vector<float> b(c, static_cast<float>(r * 7));
    comm->Broadcast(b.data(), c, DType::kF32, 2);
    for (float x : b) REQUIRE(x == 14.0f);
    std::vector<float> a2a(n * c);
    comm->AllToAll(send.data(), a2a.data(), c, DType::kF32);
    for (int s = 0; s < n; ++s)
      for (int i = 0; i < c; ++i)
        REQUIRE(a2a[s * c + i] == static_cast<float>(int64_t{100} * s + r * c + i));
    comm->Barrier();
  }));
}

// Rank s sends (s + p) % 3 elements to peer p (zero for some pairs), each element naming
// sender, peer and position; the receiver finds the pieces back to back in sender order.
TEST_CASE("all_to_all_v moves per-peer counts, empty pieces included, repeatedly") {
  const int n = 3;
  HostWorld world(n);
  auto count = [](int s, int p) { return static_cast<int64_t>((s + p) % 3); };
  RequireNoErrors(RunRanks(n, [&](int r) {
    auto comm = world.Join(All(n), r);
    for (int iter = 0; iter < 5; ++iter) {
      std::vector<int64_t> send_counts(n), recv_counts(n);
      std::vector<float> send;
      for (int p = 0; p < n; ++p) {
        send_counts[p] = count(r, p);
        recv_counts[p] = count(p, r);
        for (int64_t i = 0; i < send_counts[p]; ++i)
          send.push_back(static_cast<float>(1000 * iter + 100 * r + 10 * p + i));
      }
      std::vector<float> recv(6, -1.0f);
      comm->AllToAllV(send.data(), send_counts.data(), recv.data(), recv_counts.data(),
                      DType::kF32);
      int64_t at = 0;
      for (int s = 0; s < n; ++s)
        for (int64_t i = 0; i < count(s, r); ++i)
          REQUIRE(recv[at++] == static_cast<float>(1000 * iter + 100 * s + 10 * r + i));
    }
  }));
}

TEST_CASE("all_to_all_v fails clearly when a pair disagrees on its count") {
  HostWorld world(2);
  const auto errors = RunRanks(2, [&](int r) {
    auto comm = world.Join(All(2), r);
    float send[4] = {1, 2, 3, 4}, recv[4] = {};
    const int64_t sends[2] = {1, 1};
    const int64_t recvs[2] = {r == 1 ? 2 : 1, 1};  // rank 1 expects 2 from rank 0, which sends 1
    comm->AllToAllV(send, sends, recv, recvs, DType::kF32);
  });
  CHECK(errors[1].find("expects 2 elements from group rank 0, which sends 1") != std::string::npos);
}

TEST_CASE("send and recv are matched in order per pair and never block the sender") {
  HostWorld world(3);
  RequireNoErrors(RunRanks(3, [&](int r) {
    auto comm = world.Join(All(3), r);
    // Everyone sends first, then receives: would deadlock with blocking sends.
    for (int k = 0; k < 5; ++k) {
      for (int p = 0; p < 3; ++p) {
        if (p == r) continue;
        float v[2] = {static_cast<float>(r), static_cast<float>(k)};
        comm->Send(v, 2, DType::kF32, p);
      }
    }
    for (int k = 0; k < 5; ++k) {
      for (int p = 0; p < 3; ++p) {
        if (p == r) continue;
        float v[2];
        comm->Recv(v, 2, DType::kF32, p);
        REQUIRE(v[0] == static_cast<float>(p));
        REQUIRE(v[1] == static_cast<float>(k));
      }
    }
  }));
}

TEST_CASE("sub-communicators by member lists: group ranks follow the list order") {
  HostWorld world(4);
  RequireNoErrors(RunRanks(4, [&](int r) {
    std::vector<int> members = (r % 2 == 0) ? std::vector<int>{2, 0} : std::vector<int>{1, 3};
    auto comm = world.Join(members, r);
    REQUIRE(comm->Size() == 2);
    REQUIRE(comm->Rank() == (r == 2 || r == 1 ? 0 : 1));
    float v = static_cast<float>(r);
    comm->AllReduce(&v, &v, 1, DType::kF32);
    REQUIRE(v == (r % 2 == 0 ? 2.0f : 4.0f));
  }));
}

TEST_CASE("a mismatched collective fails every member with a clear message") {
  HostWorld world(2);
  auto errors = RunRanks(2, [&](int r) {
    auto comm = world.Join(All(2), r);
    float v[4] = {};
    if (r == 0)
      comm->AllReduce(v, v, 4, DType::kF32);
    else
      comm->AllGather(v, v + 2, 1, DType::kF32);
  });
  for (auto& e : errors) CHECK(e.find("collective mismatch") != std::string::npos);
  CHECK(world.AbortReason().find("all_reduce(count 4") != std::string::npos);
}

TEST_CASE("an aborting rank wakes the others instead of leaving them hanging") {
  HostWorld world(3);
  auto errors = RunRanks(3, [&](int r) {
    auto comm = world.Join(All(3), r);
    auto pair = world.Join(r == 2 ? std::vector<int>{2} : std::vector<int>{0, 1}, r);
    if (r == 2) {
      comm->Abort("rank 2 could not read its data");
    } else {
      float v = 0;
      if (r == 0)
        pair->Recv(&v, 1, DType::kF32, 1);  // rank 1 never sends
      else
        comm->AllReduce(&v, &v, 1, DType::kF32);
    }
  });
  for (auto& e : errors) CHECK(e.find("rank 2 could not read its data") != std::string::npos);
}

TEST_CASE("a missing member times out with the group named") {
  HostWorld world(2, HostWorldOptions{0.2});
  auto errors = RunRanks(2, [&](int r) {
    auto comm = world.Join(All(2), r);
    if (r == 0) comm->Barrier();
  });
  CHECK(errors[0].find("waited more than") != std::string::npos);
  CHECK(errors[0].find("[0,1]") != std::string::npos);
}

TEST_CASE("bad groups and arguments are refused") {
  HostWorld world(2);
  CHECK_THROWS_WITH_AS(world.Join({0, 0}, 0), doctest::Contains("twice"), CommError);
  CHECK_THROWS_WITH_AS(world.Join({0, 5}, 0), doctest::Contains("outside the world"), CommError);
  CHECK_THROWS_WITH_AS(world.Join({1}, 0), doctest::Contains("not a member"), CommError);
  CHECK_THROWS_AS(HostWorld(0), CommError);
  HostWorld solo(1);
  auto comm = solo.Join({0}, 0);
  float v = 1;
  CHECK_THROWS_WITH_AS(comm->Send(&v, 1, DType::kF32, 0), doctest::Contains("peer 0"), CommError);
}

namespace {

// A buffer of its own pages, unmapped when it goes: a read after the owner unwound faults
// instead of reading stale heap memory.
class MappedFloats {
 public:
  explicit MappedFloats(size_t count) : bytes_(count * sizeof(float)) {
    void* p = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    data_ = static_cast<float*>(p);
  }
  ~MappedFloats() { munmap(data_, bytes_); }
  MappedFloats(const MappedFloats&) = delete;
  MappedFloats& operator=(const MappedFloats&) = delete;
  float* Data() { return data_; }

 private:
  size_t bytes_;
  float* data_;
};

}  // namespace

TEST_CASE("an abort while peers are mid-collective never frees a buffer a peer still reads") {
  // Ranks run collectives on buffers that are unmapped as soon as their rank unwinds; the world
  // aborts from outside (as a failed checkpoint commit does) at a varying moment. Every rank must
  // end with CommError (or finish), the process must not fault, and every collective that
  // completed must have the right result.
  const int n = 4;
  const size_t count = 1 << 14;
  for (int trial = 0; trial < 300; ++trial) {
    HostWorld world(n, HostWorldOptions{30});
    std::atomic<int> bad{0};
    std::thread aborter([&] {
      std::this_thread::sleep_for(std::chrono::microseconds(50 * (trial % 40)));
      world.Abort("checkpoint commit failed: No space left on device");
    });
    auto errors = RunRanks(n, [&](int r) {
      auto comm = world.Join(All(n), r);
      for (int iter = 0; iter < 1000; ++iter) {
        MappedFloats send(count * n), recv(count * n);
        for (size_t i = 0; i < count * n; ++i) send.Data()[i] = static_cast<float>(r + 1);
        switch ((iter + trial) % 3) {
          case 0:
            comm->AllReduce(send.Data(), recv.Data(), static_cast<int64_t>(count), DType::kF32);
            if (recv.Data()[count - 1] != n * (n + 1) / 2.0f) ++bad;
            break;
          case 1:
            comm->AllGather(send.Data(), recv.Data(), static_cast<int64_t>(count), DType::kF32);
            if (recv.Data()[count * n - 1] != static_cast<float>(n)) ++bad;
            break;
          default:
            comm->ReduceScatter(send.Data(), recv.Data(), static_cast<int64_t>(count), DType::kF32);
            if (recv.Data()[count - 1] != n * (n + 1) / 2.0f) ++bad;
            break;
        }
      }
    });
    aborter.join();
    CHECK(bad.load() == 0);
    for (const auto& e : errors) {
      if (!e.empty()) CHECK(e.find("No space left on device") != std::string::npos);
    }
  }
}

TEST_CASE("time the process spends stopped does not count toward the timeout") {
  // A child process waits in a barrier with a 1 s timeout; it is stopped for 2.5 s (as a
  // suspended job is), continued, and its peer arrives 0.2 s later: the barrier completes.
  int go[2];
  REQUIRE(pipe(go) == 0);
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    close(go[1]);
    HostWorld world(2, HostWorldOptions{1.0});
    auto errors = RunRanks(2, [&](int r) {
      auto comm = world.Join(All(2), r);
      if (r == 1) {
        char c;
        if (read(go[0], &c, 1) != 1) throw CommError("no go");
      }
      comm->Barrier();
    });
    _exit(errors[0].empty() && errors[1].empty() ? 0 : 1);
  }
  close(go[0]);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  kill(child, SIGSTOP);
  std::this_thread::sleep_for(std::chrono::milliseconds(2500));
  kill(child, SIGCONT);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  REQUIRE(write(go[1], "g", 1) == 1);
  close(go[1]);
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}
