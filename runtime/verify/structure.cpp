// Names, structural checks and the landing-buffer rule of the in-memory program (structure.h).
#include "runtime/verify/structure.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <tuple>

#include "runtime/format/ops.h"

namespace paraplan::verify {

std::string_view OpName(OpKind kind) {
  const prog::OpInfo* info = prog::FindOp(kind);
  return info ? info->name : "unknown";
}

std::string_view CommName(CommKind kind) {
  switch (kind) {
    case CommKind::None:
      return "none";
    case CommKind::World:
      return "world";
    case CommKind::Tp:
      return "tp";
    case CommKind::Pp:
      return "pp";
    case CommKind::Dp:
      return "dp";
    case CommKind::Cp:
      return "cp";
    case CommKind::DpCp:
      return "dp_cp";
    case CommKind::Ep:
      return "ep";
    case CommKind::Etp:
      return "etp";
    case CommKind::Edp:
      return "edp";
    case CommKind::Mp:
      return "mp";
    case CommKind::Embedding:
      return "embd";
    case CommKind::Shard:
      return "shard";
    case CommKind::Replicate:
      return "replicate";
  }
  return "unknown";
}

bool IsP2p(OpKind kind) {
  return kind == OpKind::SendActivation || kind == OpKind::RecvActivation ||
         kind == OpKind::SendGrad || kind == OpKind::RecvGrad;
}

bool IsCollective(OpKind kind) {
  const prog::OpInfo* info = prog::FindOp(kind);
  return info && info->op_class == prog::OpClass::kCollective;
}

// --- structure -------------------------------------------------------------------------------

namespace {

// The registry's check of one op (runtime/format/ops.h), the same the runtime's loader runs.
void CheckRoleOp(const Role& role, const Op& op, prog::OpPlace place, const std::string& where,
                 std::vector<std::string>& out) {
  if (std::string problem = prog::CheckOp(role, op, place); !problem.empty())
    out.push_back(fmt::format("{}: {} {}", where, prog::OpDisplayName(op.kind), problem));
}

// Each rank's role and communicators exist, are of the kind they are listed as, and hold it.
void CheckRanks(const Program& p, std::vector<std::string>& out) {
  const auto ncomm = static_cast<int32_t>(p.communicators.size());
  for (size_t r = 0; r < p.ranks.size() && out.size() < 64; ++r) {
    const Rank& rank = p.ranks[r];
    if (rank.role < 0 || rank.role >= static_cast<int32_t>(p.roles.size())) {
      out.push_back(
          fmt::format("rank {}: role {} out of range [0, {})", r, rank.role, p.roles.size()));
      continue;
    }
    for (int k = 1; k < prog::kCommKinds; ++k) {
      int32_t c = rank.comms[k];
      if (c == -1) continue;
      if (c < 0 || c >= ncomm) {
        out.push_back(fmt::format("rank {}: {} communicator {} out of range [0, {})", r,
                                  CommName(static_cast<CommKind>(k)), c, ncomm));
        continue;
      }
      const auto& comm = p.communicators[c];
      if (comm.kind != static_cast<CommKind>(k))
        out.push_back(fmt::format("rank {}: communicator {} is of kind {}, listed as {}", r, c,
                                  CommName(comm.kind), CommName(static_cast<CommKind>(k))));
      if (std::find(comm.members.begin(), comm.members.end(), static_cast<int32_t>(r)) ==
          comm.members.end())
        out.push_back(fmt::format("rank {}: not a member of its {} communicator {}", r,
                                  CommName(static_cast<CommKind>(k)), c));
    }
  }
}

// A buffer's slots, both placements inside their arenas, and the buffer it is a view of.
void CheckBuffer(const Role& role, const Buffer& buf, std::vector<std::string>& out) {
  const auto nb = static_cast<int32_t>(role.buffers.size());
  if (buf.slots < 1)
    out.push_back(fmt::format("{}: buffer '{}' has {} slots", role.name, buf.name, buf.slots));
  // A damaged file may hold any values: the ends are computed with overflow checks.
  auto span_end = [&](int64_t offset, int64_t stride, int64_t bytes, int64_t* end) {
    return !__builtin_mul_overflow(static_cast<int64_t>(buf.slots) - 1, stride, end) &&
           !__builtin_add_overflow(*end, offset, end) && !__builtin_add_overflow(*end, bytes, end);
  };
  int64_t end = 0;
  if (!span_end(buf.offset, buf.slot_stride, buf.bytes, &end)) end = INT64_MAX;
  if (buf.offset < 0 || buf.bytes < 0 || end > role.arena_bytes)
    out.push_back(fmt::format("{}: buffer '{}' [{}, {}) outside the arena of {} bytes", role.name,
                              buf.name, buf.offset, end, role.arena_bytes));
  int64_t end32 = 0;
  if (!span_end(buf.fp32_offset, buf.fp32_slot_stride, buf.fp32_bytes, &end32)) end32 = INT64_MAX;
  if (buf.fp32_offset < 0 || end32 > role.fp32_arena_bytes)
    out.push_back(
        fmt::format("{}: buffer '{}' f32 placement [{}, {}) outside the f32 arena of {} bytes",
                    role.name, buf.name, buf.fp32_offset, end32, role.fp32_arena_bytes));
  if (buf.view_of != -1 && (buf.view_of < 0 || buf.view_of >= nb))
    out.push_back(fmt::format("{}: buffer '{}' is a view of buffer {} out of range", role.name,
                              buf.name, buf.view_of));
}

// A role's buffers, the indices its params and chunks name, and every op of its schedule and
// bodies.
void CheckRole(const Role& role, std::vector<std::string>& out) {
  const auto nb = static_cast<int32_t>(role.buffers.size());
  for (const Buffer& buf : role.buffers) CheckBuffer(role, buf, out);
  for (const Param& prm : role.params)
    if (prm.buffer < 0 || prm.buffer >= nb || prm.grad < 0 || prm.grad >= nb)
      out.push_back(fmt::format("{}: param '{}' names a buffer out of range", role.name, prm.name));
  for (size_t k = 0; k < role.buckets.size(); ++k) {
    const prog::mem::Bucket& bk = role.buckets[k];
    bool bad = bk.params < 0 || bk.params >= nb || bk.grads < 0 || bk.grads >= nb;
    for (int32_t b : {bk.master, bk.exp_avg, bk.exp_avg_sq, bk.param_shard, bk.grad_shard})
      bad = bad || b < -1 || b >= nb;
    if (bad) out.push_back(fmt::format("{}: bucket {} names a buffer out of range", role.name, k));
  }
  for (const Chunk& c : role.chunks) {
    if (c.forward < 0 || c.forward >= static_cast<int32_t>(role.bodies.size()) || c.backward < 0 ||
        c.backward >= static_cast<int32_t>(role.bodies.size()))
      out.push_back(fmt::format("{}: chunk {} names a body out of range", role.name, c.index));
    for (int32_t b : {c.input, c.output, c.grad})
      if (b < -1 || b >= nb)
        out.push_back(
            fmt::format("{}: chunk {} names buffer {} out of range", role.name, c.index, b));
    if (c.pool < -1)
      out.push_back(fmt::format("{}: chunk {} has pool {} (a pool is >= 0, or -1 for none)",
                                role.name, c.index, c.pool));
  }
  for (size_t i = 0; i < role.schedule.size(); ++i)
    CheckRoleOp(role, role.schedule[i], prog::OpPlace::kSchedule,
                fmt::format("{} schedule op #{}", role.name, i), out);
  if (!role.steps.empty() && !role.schedule.empty())
    out.push_back(fmt::format("{}: the schedule is held twice, as ops and as steps", role.name));
  for (size_t i = 0; i < role.steps.size(); ++i)
    CheckRoleOp(role, prog::mem::FromScheduleStep(role.steps[i]), prog::OpPlace::kSchedule,
                fmt::format("{} schedule op #{}", role.name, i), out);
  if (!role.loops.empty()) {
    if (role.steps.empty())
      out.push_back(fmt::format("{}: loops without steps", role.name));
    else if (std::string why =
                 prog::mem::CheckScheduleLoops(role.steps, role.loops, prog::mem::ChunkSlots(role));
             !why.empty())
      out.push_back(fmt::format("{}: {}", role.name, why));
  }
  for (const Body& body : role.bodies)
    for (size_t i = 0; i < body.ops.size(); ++i)
      CheckRoleOp(role, body.ops[i], prog::OpPlace::kBody,
                  fmt::format("{} body '{}' op #{}", role.name, body.name, i), out);
}

// Stash placement, in both arenas: the slots of a chunk, or of a pool of chunks, are frames of
// one stride side by side in a region no other chunk's stash meets, and a chunk's buffers do not
// overlap inside a frame. Chunks of one pool then share memory only in the same slot, which the
// schedule gives one microbatch at a time (SlotTracker, verify_stream.h).
void CheckStashPlacement(const Role& role, bool fp32, std::vector<std::string>& out) {
  struct Region {
    int64_t lo = INT64_MAX, hi = 0, stride = -1;
    int32_t slots = -1;
    std::string name;
  };
  std::map<int64_t, Region> regions;  // pool, or -1 - chunk for a chunk on its own
  std::map<int32_t, std::vector<std::pair<int64_t, int64_t>>> frames;  // chunk -> slot 0 spans
  const std::vector<int32_t> chunk_of = prog::mem::StashChunks(role);
  std::map<int32_t, const Chunk*> chunks;
  for (const Chunk& c : role.chunks) chunks[c.index] = &c;
  for (size_t b = 0; b < role.buffers.size(); ++b) {
    const Buffer& buf = role.buffers[b];
    if (buf.kind != BufferKind::Stash || buf.view_of >= 0 || chunk_of[b] < 0) continue;
    const Chunk& c = *chunks.at(chunk_of[b]);
    const int64_t offset = fp32 ? buf.fp32_offset : buf.offset;
    const int64_t bytes = fp32 ? buf.fp32_bytes : buf.bytes;
    const int64_t stride = buf.slots > 1 ? (fp32 ? buf.fp32_slot_stride : buf.slot_stride) : 0;
    if (buf.slots != c.slots)
      out.push_back(fmt::format("{}: stash buffer '{}' has {} slots, its chunk {} has {}",
                                role.name, buf.name, buf.slots, c.index, c.slots));
    const int64_t key = c.pool >= 0 ? c.pool : -1 - int64_t{c.index};
    Region& r = regions[key];
    if (r.name.empty())
      r.name = c.pool >= 0 ? fmt::format("pool {}", c.pool) : fmt::format("chunk {}", c.index);
    if (r.stride < 0) r.stride = stride, r.slots = buf.slots;
    if (r.stride != stride || r.slots != buf.slots)
      out.push_back(fmt::format("{}: the stash buffers of {} differ in slots or slot stride{}",
                                role.name, r.name, fp32 ? " (f32 placement)" : ""));
    if (bytes == 0) continue;
    r.lo = std::min(r.lo, offset);
    r.hi = std::max(r.hi, offset + bytes);
    frames[c.index].emplace_back(offset, offset + bytes);
  }
  // Fill writes every slot of a Stash buffer: in a pool, slots other members' microbatches hold.
  for (const Body& body : role.bodies)
    for (const Op& op : body.ops)
      if (op.kind == OpKind::Fill)
        for (int32_t b : op.outputs)
          if (b >= 0 && static_cast<size_t>(b) < chunk_of.size() && chunk_of[b] >= 0 &&
              role.buffers[b].kind == BufferKind::Stash && chunks.at(chunk_of[b])->pool >= 0 &&
              !fp32)
            out.push_back(fmt::format("{}: body '{}' fills stash buffer '{}' of a pooled chunk",
                                      role.name, body.name, role.buffers[b].name));
  std::vector<std::tuple<int64_t, int64_t, std::string>> extents;
  for (const auto& [key, r] : regions) {
    if (r.hi <= r.lo) continue;
    if (r.slots > 1 && r.hi - r.lo > r.stride)
      out.push_back(fmt::format("{}: a slot of {} spans {} bytes, more than its slot stride {}{}",
                                role.name, r.name, r.hi - r.lo, r.stride,
                                fp32 ? " (f32 placement)" : ""));
    extents.emplace_back(r.lo, r.lo + r.stride * (std::max(r.slots, 1) - 1) + (r.hi - r.lo),
                         r.name);
  }
  std::sort(extents.begin(), extents.end());
  for (size_t i = 1; i < extents.size(); ++i)
    if (std::get<0>(extents[i]) < std::get<1>(extents[i - 1]))
      out.push_back(fmt::format("{}: the stash slots of {} and {} overlap{}", role.name,
                                std::get<2>(extents[i - 1]), std::get<2>(extents[i]),
                                fp32 ? " (f32 placement)" : ""));
  for (auto& [c, spans] : frames) {
    std::sort(spans.begin(), spans.end());
    for (size_t i = 1; i < spans.size(); ++i)
      if (spans[i].first < spans[i - 1].second)
        out.push_back(fmt::format("{}: two stash buffers of chunk {} overlap{}", role.name, c,
                                  fp32 ? " (f32 placement)" : ""));
  }
}

// Every (microbatch, chunk) of a role passes its forward once per step, so the role's schedule,
// loops expanded, holds at least microbatches · chunks ops. Checked before the whole-world
// verifier sizes its per-(microbatch, chunk) counters by train.microbatches, which a damaged
// file may set to anything (the runtime itself does not read it).
void CheckMicrobatches(const Program& p, const Role& role, std::vector<std::string>& out) {
  const int64_t m = p.train.microbatches;
  const auto chunks = static_cast<int64_t>(role.chunks.size());
  if (m < 1 || chunks == 0) return;  // VerifyWorld reports m < 1 with the role
  int64_t expanded = static_cast<int64_t>(role.schedule.size() + role.steps.size());
  for (const prog::ScheduleLoop& l : role.loops) {
    int64_t more = 0;
    if (__builtin_mul_overflow(int64_t{l.count()} - 1, int64_t{l.length()}, &more) ||
        __builtin_add_overflow(expanded, more, &expanded)) {
      expanded = INT64_MAX;
      break;
    }
  }
  int64_t needed = 0;
  if (__builtin_mul_overflow(m, chunks, &needed) || needed > expanded)
    out.push_back(fmt::format(
        "{}: the schedule holds {} ops, fewer than the microbatches · chunks = {} · {} forwards "
        "of a step",
        role.name, expanded, m, chunks));
}

}  // namespace

std::vector<std::string> VerifyStructure(const Program& p) {
  std::vector<std::string> out;
  if (!prog::IsReadableFormatVersion(p.format_version))
    out.push_back(
        fmt::format("format version {} is not the supported version {} (nor {}, still read)",
                    p.format_version, prog::kFormatVersion, prog::kOldestFormatVersion));
  if (p.world_size < 1) out.push_back(fmt::format("world size {} < 1", p.world_size));
  if (static_cast<int64_t>(p.ranks.size()) != p.world_size)
    out.push_back(fmt::format("{} rank entries for world size {}", p.ranks.size(), p.world_size));
  for (size_t c = 0; c < p.communicators.size(); ++c)
    for (int32_t m : p.communicators[c].members)
      if (m < 0 || m >= p.world_size) {
        out.push_back(fmt::format("communicator {} has member {} outside the world [0, {})", c, m,
                                  p.world_size));
        break;
      }
  CheckRanks(p, out);
  for (const Role& role : p.roles) {
    const size_t before = out.size();
    CheckRole(role, out);
    if (out.size() == before)
      for (bool fp32 : {false, true}) CheckStashPlacement(role, fp32, out);
    CheckMicrobatches(p, role, out);
  }
  return out;
}

namespace {

// The Persistent buffer the first op of `body` copies into `target`, or -1.
int32_t CopiedFirst(const Role& role, int32_t body, int32_t target) {
  if (target < 0 || body < 0 || body >= static_cast<int32_t>(role.bodies.size())) return -1;
  const std::vector<Op>& ops = role.bodies[body].ops;
  if (ops.empty()) return -1;
  const Op& first = ops.front();
  if (first.kind != OpKind::Copy || first.inputs.size() != 1 || first.outputs.size() != 1 ||
      first.outputs[0] != target)
    return -1;
  const int32_t landing = first.inputs[0];
  if (landing < 0 || landing >= static_cast<int32_t>(role.buffers.size()) ||
      role.buffers[landing].kind != BufferKind::Persistent)
    return -1;
  return landing;
}

}  // namespace

int32_t LandingBuffer(const Role& role, const Chunk& chunk) {
  return CopiedFirst(role, chunk.forward, chunk.input);
}

int32_t GradLandingBuffer(const Role& role, const Chunk& chunk) {
  if (chunk.grad < 0 || chunk.grad >= static_cast<int32_t>(role.buffers.size()) ||
      role.buffers[chunk.grad].kind == BufferKind::Stash)
    return -1;
  return CopiedFirst(role, chunk.backward, chunk.grad);
}

}  // namespace paraplan::verify
