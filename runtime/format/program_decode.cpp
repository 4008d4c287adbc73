// DecodeProgram: a program file's bytes to the in-memory program (program_model.h), refusing
// with a ProgramError whatever a runtime executing it would trip over.
#include <algorithm>
#include <string>

#include "runtime/format/checked_size.h"
#include "runtime/format/ops.h"
#include "runtime/format/program_model.h"

namespace paraplan::prog::mem {
namespace {

ProgramError Refusal(const std::string& origin, const std::string& what) {
  return ProgramError("program `" + origin + "`: " + what);
}

// The file's identifier, FlatBuffers structure, format version, world size and sections: what
// must hold before the file can be read at all.
const prog::Program& VerifyProgramFile(const uint8_t* data, size_t size,
                                       const std::string& origin) {
  if (size < 8 || !prog::ProgramBufferHasIdentifier(data)) {
    throw Refusal(origin,
                  "not a paraplan program (no PPLN identifier); compile one with `planc compile "
                  "PLAN -o FILE`");
  }
  flatbuffers::Verifier verifier(data, size, 128, 100000000);
  if (!prog::VerifyProgramBuffer(verifier))
    throw Refusal(origin, "the file is corrupt (FlatBuffers verification failed)");
  const prog::Program* p = prog::GetProgram(data);
  if (!IsReadableFormatVersion(p->format_version())) {
    throw Refusal(origin, "format version " + std::to_string(p->format_version()) +
                              ", this planrun reads version " + std::to_string(kFormatVersion) +
                              " (and " + std::to_string(kOldestFormatVersion) +
                              "); recompile the plan with this release's planc");
  }
  if (p->world_size() <= 0 || p->world_size() > kMaxWorldSize) {
    throw Refusal(origin, "world size " + std::to_string(p->world_size()) + " is outside 1.." +
                              std::to_string(kMaxWorldSize));
  }
  if (!p->model() || !p->parallel() || !p->train())
    throw Refusal(origin, "model, parallel or train section missing");
  if (p->roles())
    for (const prog::Role* r : *p->roles())
      if (r->schedule() && r->schedule()->size() > 0 && r->steps() && r->steps()->size() > 0)
        throw Refusal(origin, "role `" + (r->name() ? r->name()->str() : std::string()) +
                                  "` holds its schedule twice, as ops and as steps");
  if (p->roles())
    for (const prog::Role* r : *p->roles())
      if (std::string why = ScheduleLoopProblem(*r); !why.empty()) throw Refusal(origin, why);
  return *p;
}

// The model and batch shape, and the step counts.
void CheckTrainingShape(const Program& img, const std::string& origin) {
  if (img.model.seq_len <= 0 || img.model.micro_batch <= 0 || img.model.vocab <= 0 ||
      img.train.global_batch <= 0 || img.parallel.dp <= 0) {
    throw Refusal(origin,
                  "model.seq_len, model.micro_batch, model.vocab, train.global_batch and "
                  "parallel.dp must be positive");
  }
  // Step counts feed the learning-rate schedule's arithmetic: bounded so that it cannot overflow.
  constexpr int64_t kMaxSteps = int64_t{1} << 40;
  if (img.train.steps < 0 || img.train.steps > kMaxSteps || img.train.warmup_steps < 0 ||
      img.train.warmup_steps > kMaxSteps || img.train.checkpoint_every < 0 ||
      img.train.checkpoint_every > kMaxSteps) {
    throw Refusal(origin,
                  "train.steps " + std::to_string(img.train.steps) + ", train.warmup_steps " +
                      std::to_string(img.train.warmup_steps) + " and train.checkpoint_every " +
                      std::to_string(img.train.checkpoint_every) + " must lie in 0 .. 2^40");
  }
}

// Communicator members lie in the world; every rank names an existing role and communicators it
// is a member of.
void CheckRankTable(const Program& img, const std::string& origin) {
  for (const Communicator& ci : img.communicators) {
    for (int32_t member : ci.members) {
      if (member < 0 || member >= img.world_size) {
        throw Refusal(origin, "communicator member " + std::to_string(member) +
                                  " outside the world of " + std::to_string(img.world_size));
      }
    }
  }
  if (static_cast<int32_t>(img.ranks.size()) != img.world_size) {
    throw Refusal(origin, "the rank table has " + std::to_string(img.ranks.size()) +
                              " entries for a world of " + std::to_string(img.world_size));
  }
  // Membership by binary search over sorted copies: linear scans cost world x group size, which
  // is 2^28 comparisons for a 16,384-rank data-parallel group.
  std::vector<std::vector<int32_t>> sorted_members;
  sorted_members.reserve(img.communicators.size());
  for (const Communicator& ci : img.communicators) {
    sorted_members.push_back(ci.members);
    std::sort(sorted_members.back().begin(), sorted_members.back().end());
  }
  const int32_t role_count = static_cast<int32_t>(img.roles.size());
  for (int32_t r = 0; r < img.world_size; ++r) {
    const Rank& ri = img.ranks[r];
    if (ri.role < 0 || ri.role >= role_count) {
      throw Refusal(origin, "rank " + std::to_string(r) + " names role " + std::to_string(ri.role));
    }
    for (size_t k = 0; k < ri.comms.size(); ++k) {
      const int32_t c = ri.comms[k];
      if (c < -1 || c >= static_cast<int32_t>(img.communicators.size())) {
        throw Refusal(origin,
                      "rank " + std::to_string(r) + " names communicator " + std::to_string(c));
      }
      if (c >= 0 && !std::binary_search(sorted_members[c].begin(), sorted_members[c].end(), r)) {
        throw Refusal(origin, "rank " + std::to_string(r) + " is not a member of its " +
                                  prog::EnumNameCommKind(static_cast<CommKind>(k)) +
                                  " communicator " + std::to_string(c));
      }
    }
  }
}

// The checks of one role, in the order its refusals are reported: arena, buffers, views,
// params, buckets, bodies, chunks, schedule.
class RoleChecker {
 public:
  RoleChecker(const Program& img, const Role& role, const std::string& origin)
      : img_(img), role_(role), origin_(origin), nbuf_(static_cast<int32_t>(role.buffers.size())) {}

  void Check() {
    if (role_.fp32_arena_bytes < 0 || role_.fp32_arena_bytes > (int64_t{1} << 40)) {
      throw Refusal(origin_, "role `" + role_.name + "` asks for an arena of " +
                                 std::to_string(role_.fp32_arena_bytes) +
                                 " bytes, outside 0 .. 1 TiB");
    }
    elements_.reserve(role_.buffers.size());
    for (const Buffer& bi : role_.buffers) elements_.push_back(CheckBuffer(bi));
    CheckViews();
    for (const Param& pi : role_.params) CheckParam(pi);
    for (const Bucket& bi : role_.buckets) CheckBucket(bi);
    CheckBodiesAndChunks();
    size_t i = 0;
    auto check = [&](const Op& o) {
      if (const std::string e = CheckOp(role_, o, OpPlace::kSchedule); !e.empty()) {
        throw Fail("schedule op " + std::to_string(i) + " (" + OpDisplayName(o.kind) + ") " + e);
      }
      ++i;
    };
    for (const Op& o : role_.schedule) check(o);
    // A schedule kept in loop form (DecodeProgram's keep_loops) is checked op by op as it
    // expands, without holding the expansion.
    ForEachExpandedStep(role_.steps, role_.loops, ChunkSlots(role_),
                        [&](const prog::ScheduleStep& s) { check(FromScheduleStep(s)); });
  }

 private:
  ProgramError Fail(const std::string& what) const {
    return Refusal(origin_, "role `" + role_.name + "`: " + what);
  }
  int64_t CheckBuffer(const Buffer& bi) const;
  void CheckBufferPlacement(const Buffer& bi, int64_t n) const;
  void CheckViews() const;
  void CheckBufferIndex(int32_t b, const std::string& what, bool allow_none = false) const {
    if ((allow_none && b == -1) || (b >= 0 && b < nbuf_)) return;
    throw Fail(what + " names buffer " + std::to_string(b) + " of " + std::to_string(nbuf_));
  }
  void CheckParam(const Param& pi) const;
  void CheckBucket(const Bucket& bi) const;
  void CheckBodiesAndChunks() const;

  const Program& img_;
  const Role& role_;
  const std::string& origin_;
  const int32_t nbuf_;
  // Element counts, checked here once; Buffer::Elements() gives the same numbers afterwards.
  std::vector<int64_t> elements_;
};

// A buffer's shape, slots and dtype; returns its element count.
int64_t RoleChecker::CheckBuffer(const Buffer& bi) const {
  int64_t n = 1;
  for (int64_t d : bi.shape) {
    if (d < 0 || (d > 0 && n > (int64_t{1} << 40) / d))
      throw Fail("buffer `" + bi.name + "` has a bad shape");
    n *= d;
  }
  if (bi.slots < 1)
    throw Fail("buffer `" + bi.name + "` has " + std::to_string(bi.slots) + " slots");
  if (bi.dtype != DType::F32 && bi.dtype != DType::Bf16 && bi.dtype != DType::F16 &&
      bi.dtype != DType::I32) {
    throw Fail("buffer `" + bi.name + "` has dtype " + prog::EnumNameDType(bi.dtype) +
               ", which the host runtime does not support");
  }
  CheckBufferPlacement(bi, n);
  return n;
}

// The buffer's slots of `n` elements are aligned and lie inside the role's arena.
void RoleChecker::CheckBufferPlacement(const Buffer& bi, int64_t n) const {
  if (bi.fp32_offset % 4 != 0 || (bi.slots > 1 && bi.fp32_slot_stride % 4 != 0)) {
    throw Fail("buffer `" + bi.name + "` at f32 offset " + std::to_string(bi.fp32_offset) +
               " (slot stride " + std::to_string(bi.fp32_slot_stride) +
               ") is not aligned to its 4-byte elements");
  }
  // Every term is checked before it is added, so hostile values cannot overflow.
  int64_t end = 0;
  const bool overflow =
      bi.fp32_offset < 0 || bi.fp32_bytes < 0 || bi.fp32_slot_stride < 0 ||
      __builtin_mul_overflow(static_cast<int64_t>(bi.slots - 1), bi.fp32_slot_stride, &end) ||
      __builtin_add_overflow(end, bi.fp32_offset, &end) ||
      __builtin_add_overflow(end, bi.fp32_bytes, &end);
  if (overflow || bi.fp32_bytes < n * 4 || (bi.slots > 1 && bi.fp32_slot_stride < bi.fp32_bytes) ||
      end > role_.fp32_arena_bytes) {
    throw Fail("buffer `" + bi.name + "` (" + std::to_string(n) + " elements, " +
               std::to_string(bi.slots) + " slots at f32 offset " + std::to_string(bi.fp32_offset) +
               ") does not fit its placement or the arena of " +
               std::to_string(role_.fp32_arena_bytes) + " bytes");
  }
}

void RoleChecker::CheckViews() const {
  for (int32_t i = 0; i < nbuf_; ++i) {
    const Buffer& b = role_.buffers[i];
    const std::optional<int64_t> view_end =
        CheckedAdd(b.view_offset, elements_[i]);  // an offset near 2^63 wraps
    if (b.view_of >= nbuf_ ||
        (b.view_of >= 0 && (b.view_offset < 0 || !view_end || *view_end > elements_[b.view_of]))) {
      throw Fail("view `" + b.name + "` lies outside the buffer it views");
    }
  }
}

void RoleChecker::CheckParam(const Param& pi) const {
  int64_t global = 1;
  for (int64_t d : pi.global_shape) {
    if (d < 1 || global > (int64_t{1} << 40) / d)
      throw Fail("param `" + pi.name + "` has a bad global shape");
    global *= d;
  }
  CheckBufferIndex(pi.buffer, "param `" + pi.name + "`");
  CheckBufferIndex(pi.grad, "param `" + pi.name + "` gradient");
  if (pi.split_dim >= static_cast<int32_t>(pi.global_shape.size()))
    throw Fail("param `" + pi.name + "` splits a missing dimension");
  if (static_cast<int>(pi.split_comm) < 0 || static_cast<int>(pi.split_comm) >= kCommKinds) {
    throw Fail("param `" + pi.name + "` is split over a bad communicator kind");
  }
  if (pi.split2_dim >= static_cast<int32_t>(pi.global_shape.size()) ||
      (pi.split2_dim >= 0 && (pi.split_dim < 0 || pi.split2_dim == pi.split_dim)))
    throw Fail("param `" + pi.name + "` has a bad second split");
  if (static_cast<int>(pi.split2_comm) < 0 || static_cast<int>(pi.split2_comm) >= kCommKinds)
    throw Fail("param `" + pi.name + "` is split over a bad communicator kind");
}

// A bucket's buffers exist and hold its elements, and its shards match the ZeRO degree (dp · cp,
// or one replica's share of it under hybrid sharding).
void RoleChecker::CheckBucket(const Bucket& bi) const {
  CheckBufferIndex(bi.params, "bucket");
  CheckBufferIndex(bi.grads, "bucket");
  for (int32_t b : {bi.master, bi.exp_avg, bi.exp_avg_sq, bi.param_shard, bi.grad_shard})
    CheckBufferIndex(b, "bucket", true);
  const std::string what = "the bucket of chunk " + std::to_string(bi.chunk);
  // ZeRO shards over the ranks holding the same weights: dp · cp, or for a bucket of
  // expert-parallel params (split over Ep) their Edp group, tp · cp · dp / ep (etp = 1), or
  // cp · dp / ep when the experts are also split over Etp (etp = tp).
  bool experts = false, split_experts = false;
  for (const Param& p : role_.params)
    if (p.split_comm == CommKind::Ep && p.buffer >= 0 &&
        p.buffer < static_cast<int32_t>(role_.buffers.size()) &&
        role_.buffers[p.buffer].view_of == bi.params) {
      experts = true;
      split_experts = split_experts || p.split2_comm == CommKind::Etp;
    }
  const int64_t dp_cp = int64_t{img_.parallel.dp} * std::max<int64_t>(1, img_.parallel.cp);
  const int64_t expert_tp = split_experts ? 1 : std::max<int64_t>(1, img_.parallel.tp);
  const int64_t edp = dp_cp * expert_tp / std::max<int64_t>(1, img_.parallel.ep);
  // Hybrid sharding: the dense buckets shard over one replica's dp · cp / replicate ranks.
  const int64_t dense = std::max<int64_t>(1, dp_cp / std::max<int64_t>(1, img_.parallel.replicate));
  const int64_t dp = img_.parallel.zero >= 1 ? (experts ? std::max<int64_t>(1, edp) : dense) : 1;
  const std::optional<int64_t> sharded = CheckedMul(bi.shard_elements, dp);
  if (bi.elements <= 0 || bi.shard_elements <= 0 || !sharded || *sharded != bi.elements ||
      elements_[bi.params] < bi.elements || elements_[bi.grads] < bi.elements) {
    throw Fail(what + " holds " + std::to_string(bi.elements) + " elements in shards of " +
               std::to_string(bi.shard_elements) + " over " + std::to_string(dp) +
               " ranks, which does not match its buffers");
  }
  for (int32_t b : {bi.master, bi.exp_avg, bi.exp_avg_sq, bi.param_shard, bi.grad_shard}) {
    if (b >= 0 && elements_[b] < bi.shard_elements) {
      throw Fail(what + ": buffer `" + role_.buffers[b].name + "` is smaller than the shard of " +
                 std::to_string(bi.shard_elements) + " elements");
    }
  }
}

// Every op of every body, then the chunks that name the bodies and their buffers.
void RoleChecker::CheckBodiesAndChunks() const {
  for (const Body& body : role_.bodies) {
    for (size_t i = 0; i < body.ops.size(); ++i) {
      const Op& o = body.ops[i];
      if (const std::string e = CheckOp(role_, o, OpPlace::kBody); !e.empty()) {
        throw Fail("op " + std::to_string(i) + " (" + OpDisplayName(o.kind) + ") of body `" +
                   body.name + "` " + e);
      }
    }
  }
  const int32_t nbodies = static_cast<int32_t>(role_.bodies.size());
  for (const Chunk& ci : role_.chunks) {
    if (ci.forward < 0 || ci.forward >= nbodies || ci.backward < 0 || ci.backward >= nbodies) {
      throw Fail("chunk " + std::to_string(ci.index) + " names a missing body");
    }
    for (int32_t b : {ci.input, ci.output, ci.grad})
      CheckBufferIndex(b, "chunk " + std::to_string(ci.index), true);
  }
}

}  // namespace

Program DecodeProgram(const uint8_t* data, size_t size, const std::string& origin,
                      bool keep_loops) {
  Program img = DecodeProgramModel(VerifyProgramFile(data, size, origin), keep_loops);
  CheckTrainingShape(img, origin);
  CheckRankTable(img, origin);
  for (const Role& role : img.roles) RoleChecker(img, role, origin).Check();
  return img;
}

}  // namespace paraplan::prog::mem
