// The in-memory program (program_model.h): FlatBuffers encoding and the plain copy back.
#include "runtime/format/program_model.h"

#include <limits>
#include <string>

#include "runtime/format/ops.h"

namespace paraplan::prog::mem {

namespace {

// How a schedule op's ints and operands map onto a ScheduleStep (ops.def's positions).
enum class StepShape : uint8_t { kNone, kCompute, kSend, kRecv, kBody, kGather, kRelease };

StepShape StepShapeOf(OpKind kind) {
  switch (kind) {
    case OpKind::Forward:
    case OpKind::Backward:
      return StepShape::kCompute;
    case OpKind::SendActivation:
    case OpKind::SendGrad:
      return StepShape::kSend;
    case OpKind::RecvActivation:
    case OpKind::RecvGrad:
      return StepShape::kRecv;
    case OpKind::ZeroGrads:
    case OpKind::ReduceGrads:
    case OpKind::OptimizerStep:
      return StepShape::kBody;
    case OpKind::GatherParams:
      return StepShape::kGather;
    case OpKind::ReleaseParams:
      return StepShape::kRelease;
    default:
      return StepShape::kNone;
  }
}

// The ints a schedule op of this shape writes in full.
size_t StepIntCount(StepShape shape) {
  switch (shape) {
    case StepShape::kCompute:
      return 3;
    case StepShape::kSend:
    case StepShape::kRecv:
      return 5;
    case StepShape::kBody:
    case StepShape::kRelease:
      return 1;
    case StepShape::kGather:
      return 2;
    case StepShape::kNone:
      break;
  }
  return 0;
}

bool FitsInt32(int64_t v) {
  return v >= std::numeric_limits<int32_t>::min() && v <= std::numeric_limits<int32_t>::max();
}

}  // namespace

bool ToScheduleStep(const Op& op, prog::ScheduleStep* step) {
  const StepShape shape = StepShapeOf(op.kind);
  if (shape == StepShape::kNone || !op.floats.empty() || op.ints.size() != StepIntCount(shape))
    return false;
  for (int64_t v : op.ints)
    if (!FitsInt32(v)) return false;
  const bool sends = shape == StepShape::kSend, receives = shape == StepShape::kRecv;
  if (op.inputs.size() != (sends ? 1u : 0u) || op.outputs.size() != (receives ? 1u : 0u))
    return false;
  auto i32 = [&](size_t i) { return static_cast<int32_t>(op.ints[i]); };
  int32_t microbatch = 0, slot = 0, group = 0, operand = 0, peer = 0, chunk = 0;
  switch (shape) {
    case StepShape::kCompute:
    case StepShape::kSend:
    case StepShape::kRecv:
      microbatch = i32(kP2pMicrobatch), chunk = i32(kP2pChunk), slot = i32(kP2pSlot);
      if (sends || receives) {
        peer = i32(kP2pPeer), group = i32(kP2pGroup);
        operand = sends ? op.inputs[0] : op.outputs[0];
      }
      break;
    case StepShape::kBody:
      operand = i32(0);
      break;
    case StepShape::kGather:
      chunk = i32(0), operand = i32(1);
      break;
    case StepShape::kRelease:
      chunk = i32(0);
      break;
    case StepShape::kNone:
      return false;
  }
  if (chunk < std::numeric_limits<int16_t>::min() || chunk > std::numeric_limits<int16_t>::max())
    return false;
  *step = prog::ScheduleStep(microbatch, slot, group, operand, peer, static_cast<int16_t>(chunk),
                             op.kind, op.comm);
  return true;
}

Op FromScheduleStep(const prog::ScheduleStep& step) {
  Op op;
  op.kind = step.kind();
  op.comm = step.comm();
  switch (StepShapeOf(op.kind)) {
    case StepShape::kCompute:
      op.ints = {step.microbatch(), step.chunk(), step.slot()};
      break;
    case StepShape::kSend:
      op.ints = {step.microbatch(), step.chunk(), step.slot(), step.peer(), step.group()};
      op.inputs = {step.operand()};
      break;
    case StepShape::kRecv:
      op.ints = {step.microbatch(), step.chunk(), step.slot(), step.peer(), step.group()};
      op.outputs = {step.operand()};
      break;
    case StepShape::kBody:
      op.ints = {step.operand()};
      break;
    case StepShape::kGather:
      op.ints = {step.chunk(), step.operand()};
      break;
    case StepShape::kRelease:
      op.ints = {step.chunk()};
      break;
    case StepShape::kNone:
      break;  // not a schedule op: the reader's CheckOp refuses it
  }
  return op;
}

std::vector<Op> ScheduleOps(const Role& role) {
  std::vector<Op> ops = role.schedule;
  ops.reserve(ops.size() + role.steps.size());
  ForEachExpandedStep(role.steps, role.loops, ChunkSlots(role),
                      [&](const prog::ScheduleStep& s) { ops.push_back(FromScheduleStep(s)); });
  return ops;
}

std::vector<int32_t> ChunkSlots(const Role& role) {
  std::vector<int32_t> slots;
  slots.reserve(role.chunks.size());
  for (const Chunk& c : role.chunks) slots.push_back(c.slots);
  return slots;
}

std::vector<int32_t> StashChunks(const Role& role) {
  const auto nbuf = static_cast<int32_t>(role.buffers.size());
  const auto nbody = static_cast<int32_t>(role.bodies.size());
  std::vector<int32_t> chunk(role.buffers.size(), -1);
  for (const Chunk& c : role.chunks) {
    for (int32_t b : {c.input, c.output, c.grad})
      if (b >= 0 && b < nbuf) chunk[b] = c.index;
    for (int32_t body : {c.forward, c.backward}) {
      if (body < 0 || body >= nbody) continue;
      for (const Op& op : role.bodies[body].ops)
        for (const auto* list : {&op.inputs, &op.outputs})
          for (int32_t b : *list)
            if (b >= 0 && b < nbuf && role.buffers[b].kind == BufferKind::Stash) chunk[b] = c.index;
    }
  }
  return chunk;
}

prog::ScheduleStep LoopStep(const prog::ScheduleStep& s, const prog::ScheduleLoop& loop, int64_t i,
                            int32_t slots) {
  if (i == 0) return s;
  const int64_t mb = s.microbatch() + i * loop.microbatch_stride();
  const int64_t slot = slots > 0 ? (s.slot() + i * int64_t{loop.slot_stride()}) % slots : s.slot();
  const int64_t group = s.group() == 0 ? 0 : s.group() + i * loop.group_stride();
  return prog::ScheduleStep(static_cast<int32_t>(mb), static_cast<int32_t>(slot),
                            static_cast<int32_t>(group), s.operand(), s.peer(), s.chunk(), s.kind(),
                            s.comm());
}

namespace {

// A FlatBuffers vector of structs (its iterator gives pointers) as a std::vector.
template <typename T>
std::vector<T> CopyStructs(const flatbuffers::Vector<const T*>* v) {
  std::vector<T> out;
  if (!v) return out;
  out.reserve(v->size());
  for (const T* x : *v) out.push_back(*x);
  return out;
}

bool IsLoopKind(OpKind kind) {
  switch (kind) {
    case OpKind::Forward:
    case OpKind::Backward:
    case OpKind::SendActivation:
    case OpKind::RecvActivation:
    case OpKind::SendGrad:
    case OpKind::RecvGrad:
      return true;
    default:
      return false;
  }
}

bool IsTransferKind(OpKind kind) {
  return kind == OpKind::SendActivation || kind == OpKind::RecvActivation ||
         kind == OpKind::SendGrad || kind == OpKind::RecvGrad;
}

}  // namespace

std::string CheckScheduleLoops(const std::vector<prog::ScheduleStep>& steps,
                               const std::vector<prog::ScheduleLoop>& loops,
                               const std::vector<int32_t>& chunk_slots) {
  const auto n = static_cast<int64_t>(steps.size());
  int64_t end_of_previous = 0;
  int64_t expanded = n;
  constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();
  for (size_t k = 0; k < loops.size(); ++k) {
    const prog::ScheduleLoop& l = loops[k];
    const std::string which = "loop " + std::to_string(k);
    const int64_t begin = l.begin(), length = l.length(), count = l.count();
    if (begin < 0 || length < 1 || begin + length > n)
      return which + ": steps [" + std::to_string(begin) + ", " + std::to_string(begin + length) +
             ") are not a non-empty range of the " + std::to_string(n) + " steps";
    if (begin < end_of_previous)
      return which + " begins at step " + std::to_string(begin) +
             ", inside or before the previous loop (which ends at step " +
             std::to_string(end_of_previous) + "); loops must be in order and not overlap";
    if (count < 1) return which + ": iteration count " + std::to_string(count) + " < 1";
    if (l.microbatch_stride() < 0 || l.slot_stride() < 0 || l.group_stride() < 0)
      return which + ": negative stride";
    for (int64_t i = begin; i < begin + length; ++i) {
      const prog::ScheduleStep& s = steps[static_cast<size_t>(i)];
      if (!IsLoopKind(s.kind()))
        return which + ": step " + std::to_string(i) + " (" + OpDisplayName(s.kind()) +
               ") cannot repeat; a loop body holds forwards, backwards and pipeline transfers";
      if (s.chunk() < 0 || static_cast<size_t>(s.chunk()) >= chunk_slots.size() ||
          chunk_slots[static_cast<size_t>(s.chunk())] < 1)
        return which + ": step " + std::to_string(i) + " names chunk " + std::to_string(s.chunk()) +
               ", which the role does not have (or has no slots)";
      if (s.slot() < 0 || s.microbatch() < 0)
        return which + ": step " + std::to_string(i) + " has a negative microbatch or slot";
      if (s.microbatch() + (count - 1) * int64_t{l.microbatch_stride()} > kInt32Max ||
          (s.group() != 0 && s.group() + (count - 1) * int64_t{l.group_stride()} > kInt32Max))
        return which + ": step " + std::to_string(i) + " leaves the int32 range by iteration " +
               std::to_string(count - 1);
    }
    // A transfer group is a run of transfers with one non-zero group: none may run across an
    // iteration's boundary (or the loop's ends), so that every iteration's groups are its own.
    auto same_group = [&](const prog::ScheduleStep& a, int64_t ga, const prog::ScheduleStep& b,
                          int64_t gb) {
      return IsTransferKind(a.kind()) && IsTransferKind(b.kind()) && ga != 0 && ga == gb;
    };
    const prog::ScheduleStep& first = steps[static_cast<size_t>(begin)];
    const prog::ScheduleStep& last = steps[static_cast<size_t>(begin + length - 1)];
    const int64_t last_group_end =
        last.group() == 0 ? 0 : last.group() + (count - 1) * int64_t{l.group_stride()};
    if ((begin > 0 &&
         same_group(steps[static_cast<size_t>(begin - 1)],
                    steps[static_cast<size_t>(begin - 1)].group(), first, first.group())) ||
        (count > 1 && same_group(last, last.group(), first,
                                 first.group() == 0 ? 0 : first.group() + l.group_stride())) ||
        (begin + length < n &&
         same_group(last, last_group_end, steps[static_cast<size_t>(begin + length)],
                    steps[static_cast<size_t>(begin + length)].group())))
      return which +
             ": a transfer group runs across the boundary of an iteration; the body is "
             "not periodic";
    expanded += (count - 1) * length;
    if (expanded > kMaxScheduleOps)
      return which + ": the schedule stands for more than " + std::to_string(kMaxScheduleOps) +
             " ops";
    end_of_previous = begin + length;
  }
  return {};
}

namespace {

// An upper bound of the encoded size of `ops`: each op's table, its vtable offset, its four
// vectors with their lengths and alignment padding, and its offset in the parent vector.
size_t OpsSizeBound(const std::vector<Op>& ops) {
  size_t n = 0;
  for (const Op& op : ops)
    n +=
        96 + 8 * op.ints.size() + 4 * (op.inputs.size() + op.outputs.size()) + 8 * op.floats.size();
  return n;
}

// An upper bound of the encoded size of `p` (generous: a reserve the file does not fill costs
// address space, not memory).
size_t EncodedSizeBound(const Program& p) {
  size_t n = 1 << 16;
  for (const Role& r : p.roles) {
    n += 256 + r.name.size() + OpsSizeBound(r.schedule) +
         sizeof(prog::ScheduleStep) * r.steps.size() + sizeof(prog::ScheduleLoop) * r.loops.size();
    for (const Body& x : r.bodies) n += 64 + x.name.size() + OpsSizeBound(x.ops);
    for (const Buffer& x : r.buffers) n += 160 + x.name.size() + 8 * x.shape.size();
    for (const Param& x : r.params) n += 160 + x.name.size() + 8 * x.global_shape.size();
    n += 96 * (r.buckets.size() + r.chunks.size());
  }
  for (const Communicator& c : p.communicators) n += 48 + 4 * c.members.size();
  n += p.ranks.size() * (64 + 4 * prog::kCommKinds);
  n += 1024 + p.model.name.size() + p.parallel.order.size() + p.train.optimizer.size() +
       p.train.data.size() + p.train.checkpoint_dir.size() + p.producer.size() + p.plan_name.size();
  return n + n / 4;
}

using OpVectorOffset = flatbuffers::Offset<flatbuffers::Vector<flatbuffers::Offset<prog::Op>>>;
using StepVectorOffset = flatbuffers::Offset<flatbuffers::Vector<const prog::ScheduleStep*>>;

OpVectorOffset EncodeOps(flatbuffers::FlatBufferBuilder& b, const std::vector<Op>& ops) {
  std::vector<flatbuffers::Offset<prog::Op>> out;
  out.reserve(ops.size());
  for (const Op& op : ops)
    out.push_back(prog::CreateOpDirect(b, op.kind, op.inputs.empty() ? nullptr : &op.inputs,
                                       op.outputs.empty() ? nullptr : &op.outputs, op.comm,
                                       op.ints.empty() ? nullptr : &op.ints,
                                       op.floats.empty() ? nullptr : &op.floats));
  return b.CreateVector(out);
}

// A role's schedule as steps: the role's own, or its ops' compact forms when every op has one;
// null otherwise. A program of format 2 (read from an older file) keeps its schedules as ops: a
// reader of that format would not see steps.
StepVectorOffset EncodeSteps(flatbuffers::FlatBufferBuilder& b, const Role& r,
                             uint32_t format_version) {
  if (!r.steps.empty()) return b.CreateVectorOfStructs(r.steps);
  if (r.schedule.empty() || format_version < 3) return 0;
  std::vector<prog::ScheduleStep> steps(r.schedule.size());
  for (size_t i = 0; i < r.schedule.size(); ++i)
    if (!ToScheduleStep(r.schedule[i], &steps[i])) return 0;
  return b.CreateVectorOfStructs(steps);
}

// One role; with `release` (the same role as `r`), its schedule and bodies are freed once they
// are in the builder.
flatbuffers::Offset<prog::Role> EncodeRole(flatbuffers::FlatBufferBuilder& b, const Role& r,
                                           uint32_t format_version, Role* release) {
  std::vector<flatbuffers::Offset<prog::Buffer>> buffers;
  for (const Buffer& x : r.buffers)
    buffers.push_back(prog::CreateBufferDirect(
        b, x.name.c_str(), x.kind, x.dtype, &x.shape, x.offset, x.bytes, x.slots, x.slot_stride,
        x.fp32_offset, x.fp32_bytes, x.fp32_slot_stride, x.view_of, x.view_offset));
  std::vector<flatbuffers::Offset<prog::Param>> params;
  for (const Param& x : r.params)
    params.push_back(prog::CreateParamDirect(b, x.name.c_str(), x.key, &x.global_shape, x.split_dim,
                                             x.split_comm, x.init, x.init_std, x.buffer, x.grad,
                                             x.chunk, x.decay, x.tp_replicated, x.counts_in_norm,
                                             x.grad_sync_tp, x.split2_dim, x.split2_comm));
  std::vector<flatbuffers::Offset<prog::BucketInfo>> buckets;
  for (const Bucket& x : r.buckets)
    buckets.push_back(prog::CreateBucketInfo(b, x.chunk, x.params, x.grads, x.elements,
                                             x.shard_elements, x.master, x.exp_avg, x.exp_avg_sq,
                                             x.param_shard, x.grad_shard));
  std::vector<flatbuffers::Offset<prog::Chunk>> chunks;
  for (const Chunk& x : r.chunks)
    chunks.push_back(prog::CreateChunk(b, x.index, x.stage, x.first_layer, x.layers,
                                       x.has_embedding, x.has_loss, x.forward, x.backward, x.input,
                                       x.output, x.grad, x.slots, x.pool));
  std::vector<flatbuffers::Offset<prog::Body>> bodies;
  for (const Body& x : r.bodies) {
    auto name = b.CreateString(x.name);
    auto ops = EncodeOps(b, x.ops);
    bodies.push_back(prog::CreateBody(b, name, ops));
  }
  auto name = b.CreateString(r.name);
  auto bv = b.CreateVector(buffers);
  auto pv = b.CreateVector(params);
  auto kv = b.CreateVector(buckets);
  auto cv = b.CreateVector(chunks);
  auto dv = b.CreateVector(bodies);
  // Steps when the schedule has them; ops otherwise (and when a role holds both, which a reader
  // refuses, both are written).
  const StepVectorOffset steps = EncodeSteps(b, r, format_version);
  OpVectorOffset sv = 0;
  const bool both = !r.steps.empty() && !r.schedule.empty();
  if (steps.IsNull() || both) sv = EncodeOps(b, r.schedule);
  flatbuffers::Offset<flatbuffers::Vector<const prog::ScheduleLoop*>> loops = 0;
  if (!steps.IsNull() && !r.steps.empty() && !r.loops.empty())
    loops = b.CreateVectorOfStructs(r.loops);
  if (release) {
    std::vector<Op>().swap(release->schedule);
    std::vector<prog::ScheduleStep>().swap(release->steps);
    std::vector<prog::ScheduleLoop>().swap(release->loops);
    std::vector<Body>().swap(release->bodies);
  }
  return prog::CreateRole(b, name, r.pipeline_rank, bv, pv, kv, cv, dv, sv, r.arena_bytes,
                          r.fp32_arena_bytes, r.peak_bytes, steps, loops);
}

// The encoder behind EncodeProgramBuffer and EncodeProgramReleasingOps: with `release` (the
// same program as `p`), each role's schedule and bodies are freed once they are in the builder.
flatbuffers::DetachedBuffer Encode(const Program& p, Program* release) {
  flatbuffers::FlatBufferBuilder b(EncodedSizeBound(p));
  // Format 4 only when a role holds loops: every other program stays the format it says.
  uint32_t version = p.format_version;
  for (const Role& r : p.roles)
    if (!r.loops.empty() && !r.steps.empty()) version = std::max(version, kLoopFormatVersion);
  std::vector<flatbuffers::Offset<prog::Role>> roles;
  for (size_t ri = 0; ri < p.roles.size(); ++ri)
    roles.push_back(
        EncodeRole(b, p.roles[ri], p.format_version, release ? &release->roles[ri] : nullptr));
  std::vector<flatbuffers::Offset<prog::Rank>> ranks;
  ranks.reserve(p.ranks.size());
  for (const Rank& r : p.ranks) {
    prog::Coordinates c(r.coords.tp, r.coords.cp, r.coords.ep, r.coords.dp, r.coords.pp);
    auto comms = b.CreateVector(r.comms.data(), r.comms.size());
    ranks.push_back(prog::CreateRank(b, r.role, &c, comms));
  }
  std::vector<flatbuffers::Offset<prog::Communicator>> comms;
  comms.reserve(p.communicators.size());
  for (const Communicator& c : p.communicators)
    comms.push_back(prog::CreateCommunicatorDirect(b, c.kind, &c.members));

  const ModelConfig& m = p.model;
  auto model = prog::CreateModelConfigDirect(
      b, m.name.c_str(), m.layers, m.hidden, m.ffn_hidden, m.heads, m.kv_heads, m.head_dim, m.vocab,
      m.vocab_padded, m.seq_len, m.micro_batch, m.norm, m.activation, m.position, m.tied_embeddings,
      m.norm_eps, m.rope_theta, m.bias, m.q_lora_rank, m.kv_lora_rank, m.qk_nope_head_dim,
      m.qk_rope_head_dim, m.v_head_dim, m.qk_norm, m.window, m.mtp_layers, m.mtp_loss_scale);
  const ParallelConfig& q = p.parallel;
  auto parallel =
      prog::CreateParallelConfigDirect(b, q.tp, q.pp, q.vpp, q.cp, q.ep, q.dp, q.sp, q.zero,
                                       q.schedule, q.order.c_str(), q.replicate);
  const TrainConfig& t = p.train;
  auto train = prog::CreateTrainConfigDirect(
      b, t.steps, t.seed, t.global_batch, t.microbatches, t.precision, t.lr, t.min_lr,
      t.warmup_steps, t.weight_decay, t.beta1, t.beta2, t.eps, t.clip_grad, t.optimizer.c_str(),
      t.data.c_str(), t.checkpoint_dir.c_str(), t.checkpoint_every);
  auto program =
      prog::CreateProgramDirect(b, version, p.producer.c_str(), p.plan_name.c_str(), p.world_size,
                                model, parallel, train, &comms, &ranks, &roles);
  prog::FinishProgramBuffer(b, program);
  return b.Release();
}

}  // namespace

flatbuffers::DetachedBuffer EncodeProgramBuffer(const Program& p) { return Encode(p, nullptr); }

flatbuffers::DetachedBuffer EncodeProgramReleasingOps(Program& p) { return Encode(p, &p); }

std::vector<uint8_t> EncodeProgram(const Program& p) {
  const flatbuffers::DetachedBuffer bytes = EncodeProgramBuffer(p);
  return std::vector<uint8_t>(bytes.data(), bytes.data() + bytes.size());
}

namespace {

template <typename T>
std::vector<T> Vec(const flatbuffers::Vector<T>* v) {
  return prog::CopyScalars(v);
}

std::string Str(const flatbuffers::String* s) { return s ? s->str() : std::string(); }

std::vector<Op> ReadOps(const flatbuffers::Vector<flatbuffers::Offset<prog::Op>>* ops) {
  std::vector<Op> out;
  if (!ops) return out;
  out.reserve(ops->size());
  for (const prog::Op* o : *ops) {
    Op op;
    op.kind = o->kind();
    op.inputs = Vec(o->inputs());
    op.outputs = Vec(o->outputs());
    op.comm = o->comm();
    op.ints = Vec(o->ints());
    op.floats = Vec(o->floats());
    out.push_back(std::move(op));
  }
  return out;
}

// The schedule of file role `r` into `role` (whose chunks are read): its ops, and its steps as
// ops, loops expanded, or with `keep_loops` its steps and loops as listed. Loops are expanded
// only when they are well formed (a reader refuses a file whose loops are not,
// ScheduleLoopProblem, before it decodes); otherwise the steps are copied as listed.
void ReadSchedule(const prog::Role& r, bool keep_loops, Role& role) {
  role.schedule = ReadOps(r.schedule());
  if (!r.steps()) return;
  std::vector<prog::ScheduleStep> listed = CopyStructs(r.steps());
  std::vector<prog::ScheduleLoop> loops = CopyStructs(r.loops());
  if (!loops.empty() && !CheckScheduleLoops(listed, loops, ChunkSlots(role)).empty()) loops.clear();
  if (keep_loops && !loops.empty() && role.schedule.empty()) {
    role.steps = std::move(listed);
    role.loops = std::move(loops);
    return;
  }
  ForEachExpandedStep(listed, loops, ChunkSlots(role), [&](const prog::ScheduleStep& st) {
    role.schedule.push_back(FromScheduleStep(st));
  });
}

// The model record (fields a file of an older format lacks read as their defaults).
ModelConfig ReadModel(const prog::ModelConfig& config) {
  const prog::ModelConfig* m = &config;
  return {Str(m->name()),        m->layers(),       m->hidden(),
          m->ffn_hidden(),       m->heads(),        m->kv_heads(),
          m->head_dim(),         m->vocab(),        m->vocab_padded(),
          m->seq_len(),          m->micro_batch(),  m->norm(),
          m->activation(),       m->position(),     m->tied_embeddings(),
          m->norm_eps(),         m->rope_theta(),   m->bias(),
          m->q_lora_rank(),      m->kv_lora_rank(), m->qk_nope_head_dim(),
          m->qk_rope_head_dim(), m->v_head_dim(),   m->qk_norm(),
          m->window(),           m->mtp_layers(),   m->mtp_loss_scale()};
}

}  // namespace

Program DecodeProgramModel(const prog::Program& file, bool keep_loops) {
  const prog::Program* f = &file;
  Program p;
  p.format_version = f->format_version();
  p.producer = Str(f->producer());
  p.plan_name = Str(f->plan_name());
  p.world_size = f->world_size();
  if (const auto* m = f->model()) p.model = ReadModel(*m);
  if (const auto* q = f->parallel()) {
    p.parallel = {q->tp(), q->pp(),   q->vpp(),      q->cp(),         q->ep(),       q->dp(),
                  q->sp(), q->zero(), q->schedule(), Str(q->order()), q->replicate()};
  }
  if (const auto* t = f->train()) {
    p.train = {t->steps(),           t->seed(),
               t->global_batch(),    t->microbatches(),
               t->precision(),       t->lr(),
               t->min_lr(),          t->warmup_steps(),
               t->weight_decay(),    t->beta1(),
               t->beta2(),           t->eps(),
               t->clip_grad(),       Str(t->optimizer()),
               Str(t->data()),       Str(t->checkpoint_dir()),
               t->checkpoint_every()};
  }
  if (f->communicators())
    for (const prog::Communicator* c : *f->communicators())
      p.communicators.push_back({c->kind(), Vec(c->members())});
  if (f->ranks()) {
    p.ranks.reserve(f->ranks()->size());
    for (const prog::Rank* r : *f->ranks()) {
      Rank rank;
      rank.role = r->role();
      if (const auto* c = r->coords()) rank.coords = *c;
      if (const auto* comms = r->comms())
        for (flatbuffers::uoffset_t k = 0; k < comms->size() && k < rank.comms.size(); ++k)
          rank.comms[k] = comms->Get(k);
      p.ranks.push_back(rank);
    }
  }
  if (f->roles()) {
    for (const prog::Role* r : *f->roles()) {
      Role role;
      role.name = Str(r->name());
      role.pipeline_rank = r->pipeline_rank();
      if (r->buffers())
        for (const prog::Buffer* x : *r->buffers())
          role.buffers.push_back({Str(x->name()), x->kind(), x->dtype(), Vec(x->shape()),
                                  x->offset(), x->bytes(), x->slots(), x->slot_stride(),
                                  x->fp32_offset(), x->fp32_bytes(), x->fp32_slot_stride(),
                                  x->view_of(), x->view_offset()});
      if (r->params())
        for (const prog::Param* x : *r->params())
          role.params.push_back({Str(x->name()), x->key(), Vec(x->global_shape()), x->split_dim(),
                                 x->split_comm(), x->init(), x->init_std(), x->buffer(), x->grad(),
                                 x->chunk(), x->decay(), x->tp_replicated(), x->counts_in_norm(),
                                 x->grad_sync_tp(), x->split2_dim(), x->split2_comm()});
      if (r->buckets())
        for (const prog::BucketInfo* x : *r->buckets())
          role.buckets.push_back({x->chunk(), x->params(), x->grads(), x->elements(),
                                  x->shard_elements(), x->master(), x->exp_avg(), x->exp_avg_sq(),
                                  x->param_shard(), x->grad_shard()});
      if (r->chunks())
        for (const prog::Chunk* x : *r->chunks())
          role.chunks.push_back({x->index(), x->stage(), x->first_layer(), x->layers(),
                                 x->has_embedding(), x->has_loss(), x->forward(), x->backward(),
                                 x->input(), x->output(), x->grad(), x->slots(), x->pool()});
      if (r->bodies())
        for (const prog::Body* x : *r->bodies())
          role.bodies.push_back({Str(x->name()), ReadOps(x->ops())});
      ReadSchedule(*r, keep_loops, role);
      role.arena_bytes = r->arena_bytes();
      role.fp32_arena_bytes = r->fp32_arena_bytes();
      role.peak_bytes = r->peak_bytes();
      p.roles.push_back(std::move(role));
    }
  }
  return p;
}

std::string ScheduleLoopProblem(const prog::Role& role) {
  const auto* loops = role.loops();
  if (!loops || loops->size() == 0) return {};
  const std::string name = role.name() ? role.name()->str() : std::string();
  if (!role.steps() || role.steps()->size() == 0)
    return "role `" + name + "` has loops but no steps for them to repeat";
  std::vector<int32_t> slots;
  if (role.chunks())
    for (const prog::Chunk* c : *role.chunks()) slots.push_back(c->slots());
  std::string why = CheckScheduleLoops(CopyStructs(role.steps()), CopyStructs(loops), slots);
  return why.empty() ? why : "role `" + name + "` " + why;
}

}  // namespace paraplan::prog::mem
