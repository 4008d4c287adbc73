#include "runtime/launch/rendezvous.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <thread>

namespace paraplan::launch {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr uint32_t kMagic = 0x56525050;  // "PPRV" little-endian
constexpr uint32_t kVersion = 1;
constexpr size_t kHelloBytes = 24;
constexpr size_t kReplyHeaderBytes = 12;
// A connected peer must introduce itself within this time (or the overall deadline).
constexpr milliseconds kHelloTimeout{5000};

class Socket {
 public:
  explicit Socket(int fd = -1) : fd_(fd) {}
  ~Socket() { Reset(); }
  Socket(Socket&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  Socket& operator=(Socket&& o) noexcept {
    if (this != &o) {
      Reset();
      fd_ = o.fd_;
      o.fd_ = -1;
    }
    return *this;
  }
  int Fd() const { return fd_; }
  int Release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void Reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_;
};

int RemainingMs(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<int64_t>(left, 0, INT32_MAX));
}

std::string Seconds(milliseconds ms) {
  if (ms.count() % 1000 == 0) return fmt::format("{} s", ms.count() / 1000);
  return fmt::format("{:.1f} s", ms.count() / 1000.0);
}

void SetNonBlocking(int fd) { ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL, 0) | O_NONBLOCK); }

// Writes all bytes before the deadline. Returns an errno-style message on failure.
std::string WriteAll(int fd, const uint8_t* data, size_t size, Clock::time_point deadline) {
  size_t done = 0;
  while (done < size) {
    ssize_t n = ::send(fd, data + done, size - done, MSG_NOSIGNAL);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      return std::strerror(errno);
    }
    pollfd p{fd, POLLOUT, 0};
    int left = RemainingMs(deadline);
    if (left == 0 || ::poll(&p, 1, left) == 0) return "timed out";
  }
  return "";
}

// Reads exactly `size` bytes before the deadline. "closed" when the peer closed first.
std::string ReadAll(int fd, uint8_t* data, size_t size, Clock::time_point deadline) {
  size_t done = 0;
  while (done < size) {
    ssize_t n = ::recv(fd, data + done, size - done, 0);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n == 0) return "closed";
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return std::strerror(errno);
    pollfd p{fd, POLLIN, 0};
    int left = RemainingMs(deadline);
    if (left == 0 || ::poll(&p, 1, left) == 0) return "timed out";
  }
  return "";
}

void Put32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
void Put64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint32_t Get32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(p[i]) << (8 * i);
  return v;
}
uint64_t Get64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
}

void SendReply(int fd, uint32_t status, const uint8_t* body, size_t size,
               Clock::time_point deadline) {
  std::vector<uint8_t> msg(kReplyHeaderBytes + size);
  Put32(msg.data(), kMagic);
  Put32(msg.data() + 4, status);
  Put32(msg.data() + 8, static_cast<uint32_t>(size));
  if (size) std::memcpy(msg.data() + kReplyHeaderBytes, body, size);
  WriteAll(fd, msg.data(), msg.size(), deadline);
}

void SendRefusal(int fd, const std::string& why) {
  // Best effort with a short deadline: the peer may be gone already.
  SendReply(fd, 1, reinterpret_cast<const uint8_t*>(why.data()), why.size(),
            Clock::now() + milliseconds(1000));
}

std::string RankList(const std::vector<int>& ranks) {
  std::string out;
  size_t shown = std::min<size_t>(ranks.size(), 16);
  for (size_t i = 0; i < shown; ++i) out += (i ? ", " : "") + std::to_string(ranks[i]);
  if (ranks.size() > shown) out += fmt::format(" and {} more", ranks.size() - shown);
  return out;
}

}  // namespace

uint64_t JobKey(const void* data, size_t size) {
  uint64_t h = 1469598103934665603ull;
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < size; ++i) {
    h ^= p[i];
    h *= 1099511628211ull;
  }
  return h;
}

Expected<std::unique_ptr<RendezvousServer>> RendezvousServer::Listen(int port) {
  if (port < 0 || port > 65535) {
    return Fail(fmt::format("the rendezvous port {} is not between 1 and 65535", port));
  }
  // Dual-stack IPv6 socket when available, so clients may use IPv4 or IPv6 addresses.
  Socket s(::socket(AF_INET6, SOCK_STREAM, 0));
  bool v6 = s.Fd() >= 0;
  if (!v6) s = Socket(::socket(AF_INET, SOCK_STREAM, 0));
  if (s.Fd() < 0) return Fail(fmt::format("cannot open a socket: {}", std::strerror(errno)));
  int one = 1, zero = 0;
  ::setsockopt(s.Fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  int rc;
  if (v6) {
    ::setsockopt(s.Fd(), IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
    sockaddr_in6 a{};
    a.sin6_family = AF_INET6;
    a.sin6_addr = in6addr_any;
    a.sin6_port = htons(static_cast<uint16_t>(port));
    rc = ::bind(s.Fd(), reinterpret_cast<sockaddr*>(&a), sizeof a);
  } else {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    a.sin_port = htons(static_cast<uint16_t>(port));
    rc = ::bind(s.Fd(), reinterpret_cast<sockaddr*>(&a), sizeof a);
  }
  if (rc != 0) {
    int err = errno;
    if (err == EADDRINUSE) {
      return Fail(
          fmt::format("rank 0 cannot listen on port {}: it is already in use (another job "
                      "on this node?); set `MASTER_PORT` to a free port",
                      port));
    }
    return Fail(fmt::format("rank 0 cannot listen on port {}: {}", port, std::strerror(err)));
  }
  if (::listen(s.Fd(), 1024) != 0) {
    return Fail(fmt::format("rank 0 cannot listen on port {}: {}", port, std::strerror(errno)));
  }
  SetNonBlocking(s.Fd());
  sockaddr_storage bound{};
  socklen_t len = sizeof bound;
  ::getsockname(s.Fd(), reinterpret_cast<sockaddr*>(&bound), &len);
  int actual = bound.ss_family == AF_INET6
                   ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                   : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  return std::unique_ptr<RendezvousServer>(new RendezvousServer(s.Release(), actual));
}

RendezvousServer::~RendezvousServer() {
  if (fd_ >= 0) ::close(fd_);
}

Expected<Ok> RendezvousServer::Serve(int world_size, uint64_t job_key,
                                     const std::vector<uint8_t>& payload, milliseconds timeout) {
  if (payload.size() > kMaxRendezvousPayload) {
    return Fail(fmt::format("the rendezvous payload of {} bytes is too large", payload.size()));
  }
  const auto deadline = Clock::now() + timeout;
  std::map<int, Socket> joined;  // rank -> connection
  std::string failure;
  int stray = 0;

  while (static_cast<int>(joined.size()) < world_size - 1 && failure.empty()) {
    pollfd p{fd_, POLLIN, 0};
    int left = RemainingMs(deadline);
    if (left == 0 || ::poll(&p, 1, left) <= 0) {
      if (RemainingMs(deadline) > 0) continue;  // EINTR
      std::vector<int> missing;
      for (int r = 1; r < world_size; ++r) {
        if (!joined.count(r)) missing.push_back(r);
      }
      failure = fmt::format(
          "the rendezvous timed out after {}: {} of {} ranks joined rank 0; missing rank{} {} "
          "(did they start, and do they use the same `MASTER_ADDR`/`MASTER_PORT`?)",
          Seconds(timeout), joined.size() + 1, world_size, missing.size() == 1 ? "" : "s",
          RankList(missing));
      if (stray) failure += fmt::format("; {} connection(s) were not from planrun", stray);
      break;
    }
    Socket c(::accept(fd_, nullptr, nullptr));
    if (c.Fd() < 0) continue;
    SetNonBlocking(c.Fd());
    uint8_t hello[kHelloBytes];
    auto hello_deadline = std::min(deadline, Clock::now() + kHelloTimeout);
    std::string err = ReadAll(c.Fd(), hello, kHelloBytes, hello_deadline);
    if (!err.empty() || Get32(hello) != kMagic) {
      ++stray;  // a port scanner, a health check, or another program: ignore it
      continue;
    }
    const uint32_t version = Get32(hello + 4);
    const int rank = static_cast<int>(Get32(hello + 8));
    const int world = static_cast<int>(Get32(hello + 12));
    const uint64_t key = Get64(hello + 16);
    if (version != kVersion) {
      failure = fmt::format(
          "a peer speaks rendezvous version {} but rank 0 speaks {}; every rank "
          "must run the same planrun",
          version, kVersion);
    } else if (world != world_size) {
      failure = fmt::format("rank {} was launched with a world size of {} but rank 0 with {}", rank,
                            world, world_size);
    } else if (rank < 1 || rank >= world_size) {
      failure =
          fmt::format("a peer claims rank {}, which is not between 1 and {}", rank, world_size - 1);
    } else if (joined.count(rank)) {
      failure =
          fmt::format("two processes claim rank {}; check the launcher's rank variables", rank);
    } else if (key != job_key) {
      failure = fmt::format(
          "rank {} runs a different program than rank 0 (job key {:016x} vs "
          "{:016x}); every rank must load the same program file",
          rank, key, job_key);
    }
    if (!failure.empty()) {
      SendRefusal(c.Fd(), failure);
      break;
    }
    joined.emplace(rank, std::move(c));
  }

  if (!failure.empty()) {
    for (auto& [rank, sock] : joined) SendRefusal(sock.Fd(), "rank 0 reports: " + failure);
    return Fail(failure);
  }
  for (auto& [rank, sock] : joined) {
    SendReply(sock.Fd(), 0, payload.data(), payload.size(),
              std::max(deadline, Clock::now() + milliseconds(1000)));
  }
  return Ok{};
}

namespace {

// One connection attempt to any address of host:port; empty Socket and a message on failure.
Socket ConnectOnce(const std::string& host, int port, Clock::time_point deadline,
                   std::string& error, bool& permanent) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* list = nullptr;
  std::string service = std::to_string(port);
  int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &list);
  if (rc != 0) {
    error = fmt::format("cannot resolve `{}`: {}", host, ::gai_strerror(rc));
    permanent = rc != EAI_AGAIN;
    return Socket();
  }
  Socket result;
  for (addrinfo* a = list; a != nullptr && result.Fd() < 0; a = a->ai_next) {
    Socket s(::socket(a->ai_family, a->ai_socktype, a->ai_protocol));
    if (s.Fd() < 0) continue;
    SetNonBlocking(s.Fd());
    if (::connect(s.Fd(), a->ai_addr, a->ai_addrlen) != 0 && errno != EINPROGRESS) {
      error = std::strerror(errno);
      continue;
    }
    pollfd p{s.Fd(), POLLOUT, 0};
    int wait = std::min(RemainingMs(deadline), 2000);
    if (::poll(&p, 1, wait) <= 0) {
      error = "connection attempt timed out";
      continue;
    }
    int so_error = 0;
    socklen_t len = sizeof so_error;
    ::getsockopt(s.Fd(), SOL_SOCKET, SO_ERROR, &so_error, &len);
    if (so_error != 0) {
      error = std::strerror(so_error);
      continue;
    }
    result = std::move(s);
  }
  ::freeaddrinfo(list);
  return result;
}

}  // namespace

Expected<std::vector<uint8_t>> JoinRendezvous(const RendezvousOptions& o) {
  if (o.rank < 1 || o.rank >= o.world_size) {
    return Fail(fmt::format("rank {} cannot join a rendezvous of {} ranks", o.rank, o.world_size));
  }
  const auto deadline = Clock::now() + o.timeout;
  const std::string where = fmt::format("{}:{}", o.host, o.port);
  std::string last_error = "no attempt";
  Socket s;
  milliseconds backoff{50};
  while (true) {
    bool permanent = false;
    s = ConnectOnce(o.host, o.port, deadline, last_error, permanent);
    if (s.Fd() >= 0) break;
    if (permanent) {
      return Fail(fmt::format("rank {} cannot reach rank 0 at {}: {}", o.rank, where, last_error));
    }
    if (RemainingMs(deadline) == 0) {
      return Fail(
          fmt::format("rank {} could not reach rank 0 at {} within {} (last error: {}); "
                      "is rank 0 running, and are `MASTER_ADDR` and `MASTER_PORT` right?",
                      o.rank, where, Seconds(o.timeout), last_error));
    }
    std::this_thread::sleep_for(std::min(backoff, milliseconds(RemainingMs(deadline))));
    backoff = std::min(backoff * 2, milliseconds(1000));
  }
  int one = 1;
  ::setsockopt(s.Fd(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);

  uint8_t hello[kHelloBytes];
  Put32(hello, kMagic);
  Put32(hello + 4, kVersion);
  Put32(hello + 8, static_cast<uint32_t>(o.rank));
  Put32(hello + 12, static_cast<uint32_t>(o.world_size));
  Put64(hello + 16, o.job_key);
  if (auto err = WriteAll(s.Fd(), hello, kHelloBytes, deadline); !err.empty()) {
    return Fail(
        fmt::format("rank {} lost rank 0 at {} while introducing itself: {}", o.rank, where, err));
  }
  uint8_t header[kReplyHeaderBytes];
  if (auto err = ReadAll(s.Fd(), header, kReplyHeaderBytes, deadline); !err.empty()) {
    if (err == "timed out") {
      return Fail(
          fmt::format("rank {} reached rank 0 at {} but the other ranks did not all join "
                      "within {}",
                      o.rank, where, Seconds(o.timeout)));
    }
    return Fail(
        fmt::format("rank 0 at {} closed the connection before the rendezvous completed "
                    "({}); see rank 0's log",
                    where, err));
  }
  const uint32_t size = Get32(header + 8);
  if (Get32(header) != kMagic || size > kMaxRendezvousPayload) {
    return Fail(
        fmt::format("the process at {} is not a planrun rendezvous (another program on "
                    "`MASTER_PORT`?)",
                    where));
  }
  std::vector<uint8_t> body(size);
  if (size > 0) {
    if (auto err = ReadAll(s.Fd(), body.data(), size,
                           std::max(deadline, Clock::now() + milliseconds(1000)));
        !err.empty()) {
      return Fail(fmt::format("rank {} lost rank 0 at {} while receiving: {}", o.rank, where, err));
    }
  }
  if (Get32(header + 4) != 0) {
    return Fail(std::string(body.begin(), body.end()));
  }
  return body;
}

Expected<std::vector<uint8_t>> ExchangeRootPayload(const RendezvousOptions& o,
                                                   const std::vector<uint8_t>& root_payload) {
  if (o.world_size < 1 || o.rank < 0 || o.rank >= o.world_size) {
    return Fail(
        fmt::format("rank {} of {} cannot take part in a rendezvous", o.rank, o.world_size));
  }
  if (o.world_size == 1) return root_payload;
  if (o.rank != 0) return JoinRendezvous(o);
  auto server = RendezvousServer::Listen(o.port);
  if (!server) return Fail(server.error());
  auto served = server.value()->Serve(o.world_size, o.job_key, root_payload, o.timeout);
  if (!served) return Fail(served.error());
  return root_payload;
}

Expected<RendezvousOptions> RendezvousOptionsFor(const LaunchEnvironment& env, uint64_t job_key,
                                                 const EnvLookup& lookup) {
  RendezvousOptions o;
  o.host = env.master_addr;
  o.port = env.master_port;
  o.rank = env.rank;
  o.world_size = env.world_size;
  o.job_key = job_key;
  if (auto text = lookup("PARAPLAN_RENDEZVOUS_TIMEOUT"); text && !text->empty()) {
    auto seconds = ParseIntVariable("PARAPLAN_RENDEZVOUS_TIMEOUT", *text, 1, int64_t{24} * 3600);
    if (!seconds) return Fail(seconds.error());
    o.timeout = std::chrono::seconds(*seconds);
  }
  return o;
}

}  // namespace paraplan::launch
