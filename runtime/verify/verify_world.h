// WorldVerifier: VerifyWorld's checks and rendezvous simulation of every rank of a program
// (verify.h says what they prove and why the simulation may skip loop iterations). Made and run
// once per VerifyWorld call; it reads the program and keeps its own streams (verify_stream.h)
// and simulation state. Internal to runtime/verify: its members are defined in verify_world.cpp
// (the checks on each role and on transfer counts, messages), verify_stream.cpp (building the
// streams) and verify_simulate.cpp (the simulation); only the verify*.cpp files include this
// header.
#ifndef PARAPLAN_RUNTIME_VERIFY_VERIFY_WORLD_H_
#define PARAPLAN_RUNTIME_VERIFY_VERIFY_WORLD_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "runtime/verify/structure.h"
#include "runtime/verify/verify.h"
#include "runtime/verify/verify_stream.h"

namespace paraplan::verify::detail {

// The state of the rendezvous simulation (WorldVerifier::Simulate).
struct Rendezvous {
  std::vector<int64_t> pos;        // per rank: its next item (virtual)
  std::vector<int64_t> limit;      // per rank: the position it may not pass in this round
  std::vector<int64_t> head_end;   // per rank: one past its head group (its posted transfers)
  std::vector<int64_t> arrived;    // per communicator: members at its current collective
  std::vector<int64_t> completed;  // per communicator: collectives done
  std::vector<uint8_t> counted;    // rank has registered its arrival at its head collective
  std::vector<uint8_t> queued;     // rank is in the queue
  std::deque<int32_t> queue;       // ranks to advance
  std::vector<int32_t> pp_index;   // per rank: its position in its pipeline communicator
  int64_t ops = 0, transfers = 0, collectives = 0;
};

// What advancing a rank (or entering a collective) did.
enum class Progress : uint8_t { kWaiting, kMoved, kFailed };

class WorldVerifier {
 public:
  WorldVerifier(const Program& p, VerifyStats* stats, size_t max_errors)
      : p_(p), stats_(stats), max_errors_(max_errors) {}

  std::vector<std::string> Run();

 private:
  bool Full() const { return errors_.size() >= max_errors_; }
  void Error(std::string e) {
    if (!Full()) errors_.push_back(std::move(e));
  }
  std::vector<std::string> Trim() {
    if (errors_.size() > max_errors_) errors_.resize(max_errors_);
    return errors_;
  }

  std::string Where(int32_t rank, int64_t v) const;

  // Occurrence counts and order of forward / backward per (microbatch, chunk), and transfer
  // operands, on one role (every rank of the role runs this stream). Loops are expanded one op
  // at a time: the counts cover every microbatch of every iteration.
  void CheckRole(int32_t ri);

  // Collectives inside forward/backward bodies are not simulated one by one: within every
  // group of a kind they use, all members must issue the same sequence of them (the compute
  // order of their schedule, and per computation the body's collectives of that kind). Members
  // of one role trivially do; members of different roles are compared.
  std::vector<std::string> BodySignature(int32_t role_index, CommKind kind) const;

  void CheckHomogeneousKinds();

  // The listed items of one schedule op (a step body's op by its collectives).
  void AppendItems(const Role& role, int32_t i, std::map<int, int64_t>& coll_seq,
                   std::map<std::pair<int32_t, bool>, int64_t>& p2p_seq, RoleStream& st);

  // Group extents of items [begin, end) of one segment: consecutive p2p items with the same
  // non-zero group (a loop's groups never cross an iteration's boundary).
  static void MarkGroups(const Role& role, int32_t begin, int32_t end, RoleStream& st);

  // Each role's listed stream in segments: runs of listed ops, and loop bodies listed once with
  // their strides (what an item's sequence number advances by per iteration).
  void BuildStreams();

  int32_t PeerRank(int32_t rank, int32_t peer_index) const {
    return p_.MemberOf(rank, CommKind::Pp, peer_index);
  }

  // Every transfer a -> b has a partner (counts per direction agree); the partners themselves
  // are compared as the simulation passes them (CheckMatch).
  void CheckTransferCounts();

  // The send at virtual position v of rank a and the receive it meets: same kind, microbatch,
  // adjacent stages and bytes.
  bool CheckMatch(int32_t a, int64_t v, const RoleStream::At& ia);

  // --- the limit of a round (Simulate) ---
  // The next iteration boundary of a loop past `limit` (the end of the first iteration of the
  // next loop when `limit` is at or past a loop's end), or the stream's end.
  // Only a role's long loops (an eighth of its stream or more: the steady state, and in gpipe
  // its forward and its backward half) bound a round; short ones (a warm-up's) run freely.
  static bool Governs(const RoleStream& st, const Segment& s) {
    return s.loop >= 0 && s.count > 2 && (s.vend() - s.vbegin) * 8 >= st.length;
  }
  static int64_t NextLimit(const RoleStream& st, int64_t limit);

  // Rendezvous simulation of all ranks, in rounds when loops are present (see verify.h).
  void Simulate();

  // Records rank r's new position: the end of its head group, which partners test against.
  void Moved(int32_t r);

  // Advances queued ranks until none moves; false on a failed check.
  bool RunQueue();

  // The state after the last round is the state before it shifted by one iteration on every
  // rank: skip the iterations every rank's loop has left but one, as they repeat it (see the
  // verify.h for why).
  void Skip(const std::vector<int64_t>& last_pos, const std::vector<int64_t>& last_limit);

  const RoleStream& StreamOf(int32_t r) const { return streams_[p_.ranks[r].role]; }

  void Push(int32_t r) {
    if (r >= 0 && !sim_.queued[r]) {
      sim_.queued[r] = 1;
      sim_.queue.push_back(r);
    }
  }
  // A rank that moved can only unblock the pipeline peers its transfers name (a blocked
  // transfer waits for its partner; collectives push their members when they complete).
  void PushPeers(int32_t r) {
    for (int32_t peer : StreamOf(r).peers) Push(PeerRank(r, peer));
  }

  // Is the partner of rank r's p2p item at v posted (in the partner's head group) or done?
  bool PartnerReady(int32_t r, int64_t v) const { return PartnerReady(r, StreamOf(r).Locate(v)); }
  bool PartnerReady(int32_t r, const RoleStream::At& a) const;

  // Runs rank r's stream as far as it goes without waiting, up to its limit.
  Progress AdvanceRank(int32_t r);

  // Collective: register arrival once; the last member to arrive completes it for all.
  Progress EnterCollective(int32_t r, const RoleStream::At& a);

  // Everyone is at collective `seq` of communicator c: their collectives must agree.
  bool MembersAgree(int32_t c, int64_t seq);

  // Stuck ranks: report the first few with what they wait for.
  void ReportStuck();

  // "; its partner is not posted: ..." for the first transfer of rank r's head group whose
  // partner is not posted, or empty.
  std::string UnpostedPartner(int32_t r) const;

  const Program& p_;
  VerifyStats* stats_;
  size_t max_errors_;
  std::vector<std::string> errors_;
  std::vector<RoleStream> streams_;
  Rendezvous sim_;
  int64_t skips_ = 0;
};

}  // namespace paraplan::verify::detail

#endif  // PARAPLAN_RUNTIME_VERIFY_VERIFY_WORLD_H_
