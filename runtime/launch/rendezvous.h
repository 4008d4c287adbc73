// A small TCP rendezvous: rank 0 hands one opaque payload (NCCL's 128-byte unique id) to every
// other rank of the job, and the exchange doubles as a start-up barrier.
//
// Rank 0 listens on MASTER_PORT, waits until ranks 1..world-1 have each connected once and
// introduced themselves (rank, world size, a job key that every rank derives from the program
// it runs), checks that they agree, then sends the payload to all of them. Every step is
// bounded by one deadline: a missing rank, an unreachable rank 0, a peer that connects and
// says nothing, or a stray connection ends in an error that says who and what, never a hang.
// Disagreements (two processes claiming the same rank, different world sizes, different
// programs) fail the whole rendezvous on every rank that has joined.
//
// Wire format (little-endian): hello = magic "PPRV", version, rank, world (u32 each), job key
// (u64); reply = magic, status (0 ok, 1 refused), length (u32), then the payload or the
// refusal message.
//
// Made by planrun (the CUDA backend's world communicator set-up); tested on loopback.
#ifndef PARAPLAN_RUNTIME_LAUNCH_RENDEZVOUS_H_
#define PARAPLAN_RUNTIME_LAUNCH_RENDEZVOUS_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/launch/environment.h"
#include "runtime/launch/expected.h"

namespace paraplan::launch {

inline constexpr std::chrono::milliseconds kDefaultRendezvousTimeout{std::chrono::seconds(300)};
inline constexpr size_t kMaxRendezvousPayload = 1 << 20;

struct RendezvousOptions {
  std::string host;  // rank 0's host name or address
  int port = 0;      // rank 0's port (0 only for a server that lets the system choose)
  int rank = 0;
  int world_size = 1;
  uint64_t job_key = 0;  // every rank must pass the same value (e.g. a hash of the program)
  std::chrono::milliseconds timeout = kDefaultRendezvousTimeout;
};

// Rank 0's side. Listen() binds at once, so a port chosen by the system (port 0) is known
// before any other rank starts.
class RendezvousServer {
 public:
  static Expected<std::unique_ptr<RendezvousServer>> Listen(int port);
  ~RendezvousServer();
  RendezvousServer(const RendezvousServer&) = delete;
  RendezvousServer& operator=(const RendezvousServer&) = delete;

  int Port() const { return port_; }

  // Waits for ranks 1..world_size-1, checks them, sends `payload` to each.
  Expected<Ok> Serve(int world_size, uint64_t job_key, const std::vector<uint8_t>& payload,
                     std::chrono::milliseconds timeout);

 private:
  RendezvousServer(int fd, int port) : fd_(fd), port_(port) {}
  int fd_;
  int port_;
};

// A non-zero rank's side: connects to rank 0 (retrying until the deadline while rank 0 is not
// up yet), introduces itself and returns rank 0's payload.
Expected<std::vector<uint8_t>> JoinRendezvous(const RendezvousOptions& options);

// Either side, by options.rank: rank 0 listens on options.port and serves `root_payload`;
// the others join. Every rank returns the payload.
Expected<std::vector<uint8_t>> ExchangeRootPayload(const RendezvousOptions& options,
                                                   const std::vector<uint8_t>& root_payload);

// Options for this process from its launch environment; the timeout comes from
// PARAPLAN_RENDEZVOUS_TIMEOUT (seconds) when set.
Expected<RendezvousOptions> RendezvousOptionsFor(const LaunchEnvironment& env, uint64_t job_key,
                                                 const EnvLookup& lookup);

// FNV-1a over bytes: a stable job key from the program file's contents.
uint64_t JobKey(const void* data, size_t size);

}  // namespace paraplan::launch

#endif  // PARAPLAN_RUNTIME_LAUNCH_RENDEZVOUS_H_
