#include "runtime/launch/rendezvous.h"

#include <arpa/inet.h>
#include <doctest/doctest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <thread>

namespace paraplan::launch {
namespace {

using std::chrono::milliseconds;

bool Contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

std::vector<uint8_t> Payload() {
  std::vector<uint8_t> id(128);
  for (size_t i = 0; i < id.size(); ++i) id[i] = static_cast<uint8_t>(i * 7 + 3);
  return id;
}

// A test fixture, called with named values.
// NOLINTNEXTLINE(bugprone-easily-swappable-parameters)
RendezvousOptions Options(int port, int rank, int world,
                          milliseconds timeout = milliseconds(5000)) {
  RendezvousOptions o;
  o.host = "127.0.0.1";
  o.port = port;
  o.rank = rank;
  o.world_size = world;
  o.job_key = 42;
  o.timeout = timeout;
  return o;
}

TEST_CASE("rank 0 hands its payload to every rank") {
  auto server = RendezvousServer::Listen(0);
  REQUIRE(server.ok());
  const int port = server.value()->Port();
  CHECK(port > 0);
  constexpr int kWorld = 5;
  std::vector<Expected<std::vector<uint8_t>>> got(kWorld, Fail("not run"));
  std::vector<std::thread> threads;
  for (int r = kWorld - 1; r >= 1; --r) {  // joining order does not matter
    threads.emplace_back([&, r] { got[r] = JoinRendezvous(Options(port, r, kWorld)); });
  }
  auto served = server.value()->Serve(kWorld, 42, Payload(), milliseconds(5000));
  for (auto& t : threads) t.join();
  REQUIRE(served.ok());
  for (int r = 1; r < kWorld; ++r) {
    INFO("rank " << r << ": " << got[r].error());
    REQUIRE(got[r].ok());
    CHECK(*got[r] == Payload());
  }
}

TEST_CASE("ranks that start before rank 0 retry until it listens") {
  // Find a free port, release it, and start the joiner first.
  int port;
  {
    auto probe = RendezvousServer::Listen(0);
    REQUIRE(probe.ok());
    port = probe.value()->Port();
  }
  Expected<std::vector<uint8_t>> got = Fail("not run");
  std::thread joiner([&] { got = JoinRendezvous(Options(port, 1, 2)); });
  std::this_thread::sleep_for(milliseconds(200));
  auto root = ExchangeRootPayload(Options(port, 0, 2), Payload());
  joiner.join();
  REQUIRE(root.ok());
  REQUIRE(got.ok());
  CHECK(*got == Payload());
}

TEST_CASE("a missing rank ends in a timeout that names it") {
  auto server = RendezvousServer::Listen(0);
  REQUIRE(server.ok());
  const int port = server.value()->Port();
  Expected<std::vector<uint8_t>> one = Fail("not run");
  std::thread t([&] { one = JoinRendezvous(Options(port, 1, 4, milliseconds(3000))); });
  auto served = server.value()->Serve(4, 42, Payload(), milliseconds(300));
  t.join();
  REQUIRE_FALSE(served.ok());
  CHECK(Contains(served.error(),
                 "timed out after 0.3 s: 2 of 4 ranks joined rank 0; missing ranks 2, 3"));
  // The rank that did join hears about it instead of waiting for its own deadline.
  REQUIRE_FALSE(one.ok());
  CHECK(Contains(one.error(), "rank 0 reports: the rendezvous timed out"));
}

TEST_CASE("an unreachable rank 0 ends in a bounded error") {
  int port;
  {
    auto probe = RendezvousServer::Listen(0);
    REQUIRE(probe.ok());
    port = probe.value()->Port();
  }
  auto got = JoinRendezvous(Options(port, 1, 2, milliseconds(300)));
  REQUIRE_FALSE(got.ok());
  CHECK(Contains(got.error(), "rank 1 could not reach rank 0 at 127.0.0.1:"));
  CHECK(Contains(got.error(), "within 0.3 s"));
  CHECK(Contains(got.error(), "`MASTER_ADDR`"));
}

TEST_CASE("an unknown host fails at once") {
  RendezvousOptions o = Options(29500, 1, 2, milliseconds(60000));
  o.host = "no-such-host.invalid";
  auto started = std::chrono::steady_clock::now();
  auto got = JoinRendezvous(o);
  REQUIRE_FALSE(got.ok());
  CHECK(Contains(got.error(), "cannot resolve `no-such-host.invalid`"));
  CHECK(std::chrono::steady_clock::now() - started < std::chrono::seconds(30));
}

TEST_CASE("disagreements fail every rank that joined") {
  auto run = [](std::vector<RendezvousOptions> joiners, int world) {
    auto server = RendezvousServer::Listen(0);
    REQUIRE(server.ok());
    const int port = server.value()->Port();
    std::vector<Expected<std::vector<uint8_t>>> got(joiners.size(), Fail("not run"));
    std::vector<std::thread> threads;
    for (size_t i = 0; i < joiners.size(); ++i) {
      joiners[i].port = port;
      threads.emplace_back([&, i] {
        // Stagger so that the faulty joiner is seen last.
        std::this_thread::sleep_for(milliseconds(100 * static_cast<int>(i)));
        got[i] = JoinRendezvous(joiners[i]);
      });
    }
    auto served = server.value()->Serve(world, 42, Payload(), milliseconds(5000));
    for (auto& t : threads) t.join();
    REQUIRE_FALSE(served.ok());
    for (auto& g : got) {
      REQUIRE_FALSE(g.ok());
      CHECK(Contains(g.error(), served.error()));
    }
    return served.error();
  };
  SUBCASE("world size") {
    auto good = Options(0, 1, 3);
    auto bad = Options(0, 2, 4);
    CHECK(Contains(run({good, bad}, 3),
                   "rank 2 was launched with a world size of 4 but rank 0 with 3"));
  }
  SUBCASE("duplicate rank") {
    CHECK(Contains(run({Options(0, 1, 3), Options(0, 1, 3)}, 3), "two processes claim rank 1"));
  }
  SUBCASE("different program") {
    auto bad = Options(0, 2, 3);
    bad.job_key = 7;
    CHECK(Contains(run({Options(0, 1, 3), bad}, 3), "rank 2 runs a different program than rank 0"));
  }
}

TEST_CASE("stray connections are ignored") {
  auto server = RendezvousServer::Listen(0);
  REQUIRE(server.ok());
  const int port = server.value()->Port();
  Expected<std::vector<uint8_t>> got = Fail("not run");
  std::thread t([&] {
    // Something that is not planrun connects, writes junk and leaves.
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
      const char junk[] = "GET / HTTP/1.0\r\n\r\n\0\0\0\0\0\0";
      (void)::send(fd, junk, sizeof junk, MSG_NOSIGNAL);
    }
    ::close(fd);
    got = JoinRendezvous(Options(port, 1, 2));
  });
  auto served = server.value()->Serve(2, 42, Payload(), milliseconds(5000));
  t.join();
  REQUIRE(served.ok());
  REQUIRE(got.ok());
  CHECK(*got == Payload());
}

TEST_CASE("a port in use is refused clearly") {
  auto first = RendezvousServer::Listen(0);
  REQUIRE(first.ok());
  auto second = RendezvousServer::Listen(first.value()->Port());
  REQUIRE_FALSE(second.ok());
  CHECK(Contains(second.error(), "already in use"));
  CHECK(Contains(second.error(), "`MASTER_PORT`"));
}

TEST_CASE("separate processes meet through the environment") {
  auto probe = RendezvousServer::Listen(0);
  REQUIRE(probe.ok());
  const int port = probe.value()->Port();
  probe.value().reset();
  constexpr int kWorld = 3;
  std::vector<pid_t> children;
  for (int r = 1; r < kWorld; ++r) {
    pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      auto env = ReadLaunchEnvironment(MapEnvironment({{"RANK", std::to_string(r)},
                                                       {"WORLD_SIZE", std::to_string(kWorld)},
                                                       {"MASTER_ADDR", "localhost"},
                                                       {"MASTER_PORT", std::to_string(port)},
                                                       {"PARAPLAN_RENDEZVOUS_TIMEOUT", "10"}}));
      if (!env) ::_exit(2);
      auto lookup = MapEnvironment({{"PARAPLAN_RENDEZVOUS_TIMEOUT", "10"}});
      auto options = RendezvousOptionsFor(*env, 42, lookup);
      if (!options) ::_exit(3);
      auto got = ExchangeRootPayload(*options, {});
      ::_exit(got.ok() && *got == Payload() ? 0 : 1);
    }
    children.push_back(pid);
  }
  auto env = ReadLaunchEnvironment(MapEnvironment({{"RANK", "0"},
                                                   {"WORLD_SIZE", std::to_string(kWorld)},
                                                   {"MASTER_ADDR", "localhost"},
                                                   {"MASTER_PORT", std::to_string(port)}}));
  REQUIRE(env.ok());
  auto options = RendezvousOptionsFor(*env, 42, MapEnvironment({}));
  REQUIRE(options.ok());
  options.value().timeout = milliseconds(10000);
  auto root = ExchangeRootPayload(*options, Payload());
  CHECK(root.ok());
  for (pid_t pid : children) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
  }
}

TEST_CASE("rendezvous timeout from the environment") {
  LaunchEnvironment env;
  auto o = RendezvousOptionsFor(env, 1, MapEnvironment({{"PARAPLAN_RENDEZVOUS_TIMEOUT", "12"}}));
  REQUIRE(o.ok());
  CHECK(o->timeout == std::chrono::seconds(12));
  auto bad =
      RendezvousOptionsFor(env, 1, MapEnvironment({{"PARAPLAN_RENDEZVOUS_TIMEOUT", "soon"}}));
  REQUIRE_FALSE(bad.ok());
  CHECK(Contains(bad.error(), "`PARAPLAN_RENDEZVOUS_TIMEOUT` is `soon`"));
  CHECK(JobKey("abc", 3) != JobKey("abd", 3));
}

}  // namespace
}  // namespace paraplan::launch
