// The in-memory program: names, structural checks, FlatBuffers writing and reading.
#include "compiler/lower/program.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>

namespace paraplan::lower {

int64_t Buffer::Elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

int32_t Program::IndexIn(int32_t rank, CommKind kind) const {
  if (rank < 0 || rank >= static_cast<int32_t>(ranks.size())) return -1;
  int32_t c = ranks[rank].comms[static_cast<int>(kind)];
  if (c < 0 || c >= static_cast<int32_t>(communicators.size())) return -1;
  const auto& m = communicators[c].members;
  auto it = std::find(m.begin(), m.end(), rank);
  return it == m.end() ? -1 : static_cast<int32_t>(it - m.begin());
}

int32_t Program::MemberOf(int32_t rank, CommKind kind, int64_t index) const {
  if (rank < 0 || rank >= static_cast<int32_t>(ranks.size())) return -1;
  int32_t c = ranks[rank].comms[static_cast<int>(kind)];
  if (c < 0 || c >= static_cast<int32_t>(communicators.size())) return -1;
  const auto& m = communicators[c].members;
  if (index < 0 || index >= static_cast<int64_t>(m.size())) return -1;
  return m[index];
}

std::string_view OpName(OpKind kind) {
  switch (kind) {
    case OpKind::Forward: return "forward";
    case OpKind::Backward: return "backward";
    case OpKind::SendActivation: return "send_activation";
    case OpKind::RecvActivation: return "recv_activation";
    case OpKind::SendGrad: return "send_grad";
    case OpKind::RecvGrad: return "recv_grad";
    case OpKind::ZeroGrads: return "zero_grads";
    case OpKind::ReduceGrads: return "reduce_grads";
    case OpKind::OptimizerStep: return "optimizer_step";
    case OpKind::GatherParams: return "gather_params";
    case OpKind::ReleaseParams: return "release_params";
    case OpKind::AllReduce: return "all_reduce";
    case OpKind::ReduceScatter: return "reduce_scatter";
    case OpKind::AllGather: return "all_gather";
    case OpKind::Broadcast: return "broadcast";
    case OpKind::AllToAll: return "all_to_all";
    default: break;
  }
  // Other kinds: the schema's name in snake case (RmsNormBackward -> rms_norm_backward).
  static thread_local std::string name;
  const char* camel = prog::EnumNameOpKind(kind);
  if (!camel || !*camel) return "unknown";
  name.clear();
  for (const char* p = camel; *p; ++p) {
    if (std::isupper(static_cast<unsigned char>(*p))) {
      if (p != camel) name += '_';
      name += static_cast<char>(std::tolower(static_cast<unsigned char>(*p)));
    } else {
      name += *p;
    }
  }
  return name;
}

std::string_view CommName(CommKind kind) {
  switch (kind) {
    case CommKind::None: return "none";
    case CommKind::World: return "world";
    case CommKind::Tp: return "tp";
    case CommKind::Pp: return "pp";
    case CommKind::Dp: return "dp";
    case CommKind::Cp: return "cp";
    case CommKind::DpCp: return "dp_cp";
    case CommKind::Ep: return "ep";
    case CommKind::Etp: return "etp";
    case CommKind::Edp: return "edp";
    case CommKind::Mp: return "mp";
    case CommKind::Embedding: return "embd";
  }
  return "unknown";
}

bool IsP2p(OpKind kind) {
  return kind == OpKind::SendActivation || kind == OpKind::RecvActivation ||
         kind == OpKind::SendGrad || kind == OpKind::RecvGrad;
}

bool IsCollective(OpKind kind) {
  return kind == OpKind::AllReduce || kind == OpKind::ReduceScatter ||
         kind == OpKind::AllGather || kind == OpKind::Broadcast || kind == OpKind::AllToAll;
}

// --- structure -------------------------------------------------------------------------------

namespace {

void CheckOpIndices(const Role& role, const Op& op, const std::string& where,
                    std::vector<std::string>& out) {
  auto nb = static_cast<int32_t>(role.buffers.size());
  for (int32_t b : op.inputs)
    if (b < 0 || b >= nb) out.push_back(fmt::format("{}: input buffer {} out of range [0, {})", where, b, nb));
  for (int32_t b : op.outputs)
    if (b < 0 || b >= nb) out.push_back(fmt::format("{}: output buffer {} out of range [0, {})", where, b, nb));
  auto nbody = static_cast<int64_t>(role.bodies.size());
  auto nchunk = static_cast<int64_t>(role.chunks.size());
  switch (op.kind) {
    case OpKind::Forward:
    case OpKind::Backward:
    case OpKind::SendActivation:
    case OpKind::RecvActivation:
    case OpKind::SendGrad:
    case OpKind::RecvGrad: {
      size_t need = (op.kind == OpKind::Forward || op.kind == OpKind::Backward) ? 3 : 5;
      if (op.ints.size() < need) {
        out.push_back(fmt::format("{}: {} needs {} ints, has {}", where, OpName(op.kind), need, op.ints.size()));
        break;
      }
      int64_t c = op.ints[prog::kP2pChunk];
      if (c < 0 || c >= nchunk) {
        out.push_back(fmt::format("{}: chunk {} out of range [0, {})", where, c, nchunk));
        break;
      }
      int64_t s = op.ints[prog::kP2pSlot];
      if (s < 0 || s >= role.chunks[c].slots)
        out.push_back(fmt::format("{}: slot {} out of range [0, {})", where, s, role.chunks[c].slots));
      break;
    }
    case OpKind::ZeroGrads:
    case OpKind::ReduceGrads:
    case OpKind::OptimizerStep:
      if (op.ints.empty() || op.ints[0] < 0 || op.ints[0] >= nbody)
        out.push_back(fmt::format("{}: {} names no body in [0, {})", where, OpName(op.kind), nbody));
      break;
    case OpKind::GatherParams:
      if (op.ints.size() < 2 || op.ints[1] < 0 || op.ints[1] >= nbody)
        out.push_back(fmt::format("{}: gather_params names no body in [0, {})", where, nbody));
      break;
    default:
      break;
  }
}

}  // namespace

std::vector<std::string> VerifyStructure(const Program& p) {
  std::vector<std::string> out;
  if (p.format_version != prog::kFormatVersion)
    out.push_back(fmt::format("format version {} is not the supported version {}", p.format_version, prog::kFormatVersion));
  if (p.world_size < 1) out.push_back(fmt::format("world size {} < 1", p.world_size));
  if (static_cast<int64_t>(p.ranks.size()) != p.world_size)
    out.push_back(fmt::format("{} rank entries for world size {}", p.ranks.size(), p.world_size));
  auto ncomm = static_cast<int32_t>(p.communicators.size());
  for (int32_t c = 0; c < ncomm; ++c)
    for (int32_t m : p.communicators[c].members)
      if (m < 0 || m >= p.world_size) {
        out.push_back(fmt::format("communicator {} has member {} outside the world [0, {})", c, m, p.world_size));
        break;
      }
  for (size_t r = 0; r < p.ranks.size() && out.size() < 64; ++r) {
    const Rank& rank = p.ranks[r];
    if (rank.role < 0 || rank.role >= static_cast<int32_t>(p.roles.size())) {
      out.push_back(fmt::format("rank {}: role {} out of range [0, {})", r, rank.role, p.roles.size()));
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
      if (std::find(comm.members.begin(), comm.members.end(), static_cast<int32_t>(r)) == comm.members.end())
        out.push_back(fmt::format("rank {}: not a member of its {} communicator {}", r,
                                  CommName(static_cast<CommKind>(k)), c));
    }
  }
  for (size_t ri = 0; ri < p.roles.size(); ++ri) {
    const Role& role = p.roles[ri];
    auto nb = static_cast<int32_t>(role.buffers.size());
    for (size_t b = 0; b < role.buffers.size(); ++b) {
      const Buffer& buf = role.buffers[b];
      if (buf.slots < 1) out.push_back(fmt::format("{}: buffer '{}' has {} slots", role.name, buf.name, buf.slots));
      int64_t end = buf.offset + (buf.slots - 1) * buf.slot_stride + buf.bytes;
      if (buf.offset < 0 || buf.bytes < 0 || end > role.arena_bytes)
        out.push_back(fmt::format("{}: buffer '{}' [{}, {}) outside the arena of {} bytes", role.name,
                                  buf.name, buf.offset, end, role.arena_bytes));
      int64_t end32 = buf.fp32_offset + (buf.slots - 1) * buf.fp32_slot_stride + buf.fp32_bytes;
      if (buf.fp32_offset < 0 || end32 > role.fp32_arena_bytes)
        out.push_back(fmt::format("{}: buffer '{}' f32 placement [{}, {}) outside the f32 arena of {} bytes",
                                  role.name, buf.name, buf.fp32_offset, end32, role.fp32_arena_bytes));
      if (buf.view_of != -1 && (buf.view_of < 0 || buf.view_of >= nb))
        out.push_back(fmt::format("{}: buffer '{}' is a view of buffer {} out of range", role.name, buf.name, buf.view_of));
    }
    for (const Param& prm : role.params)
      if (prm.buffer < 0 || prm.buffer >= nb || prm.grad < 0 || prm.grad >= nb)
        out.push_back(fmt::format("{}: param '{}' names a buffer out of range", role.name, prm.name));
    for (const Chunk& c : role.chunks) {
      if (c.forward < 0 || c.forward >= static_cast<int32_t>(role.bodies.size()) || c.backward < 0 ||
          c.backward >= static_cast<int32_t>(role.bodies.size()))
        out.push_back(fmt::format("{}: chunk {} names a body out of range", role.name, c.index));
      for (int32_t b : {c.input, c.output, c.grad})
        if (b < -1 || b >= nb) out.push_back(fmt::format("{}: chunk {} names buffer {} out of range", role.name, c.index, b));
    }
    for (size_t i = 0; i < role.schedule.size(); ++i)
      CheckOpIndices(role, role.schedule[i], fmt::format("{} schedule op #{}", role.name, i), out);
    for (const Body& body : role.bodies)
      for (size_t i = 0; i < body.ops.size(); ++i)
        CheckOpIndices(role, body.ops[i], fmt::format("{} body '{}' op #{}", role.name, body.name, i), out);
  }
  return out;
}

// --- writing ---------------------------------------------------------------------------------

std::vector<uint8_t> ToFlatBuffer(const Program& p) {
  flatbuffers::FlatBufferBuilder b(1 << 20);
  auto op_vector = [&](const std::vector<Op>& ops) {
    std::vector<flatbuffers::Offset<prog::Op>> out;
    out.reserve(ops.size());
    for (const Op& op : ops)
      out.push_back(prog::CreateOpDirect(b, op.kind, op.inputs.empty() ? nullptr : &op.inputs,
                                        op.outputs.empty() ? nullptr : &op.outputs, op.comm,
                                        op.ints.empty() ? nullptr : &op.ints,
                                        op.floats.empty() ? nullptr : &op.floats));
    return b.CreateVector(out);
  };

  std::vector<flatbuffers::Offset<prog::Role>> roles;
  for (const Role& r : p.roles) {
    std::vector<flatbuffers::Offset<prog::Buffer>> buffers;
    for (const Buffer& x : r.buffers)
      buffers.push_back(prog::CreateBufferDirect(b, x.name.c_str(), x.kind, x.dtype, &x.shape, x.offset, x.bytes,
                                                x.slots, x.slot_stride, x.fp32_offset, x.fp32_bytes,
                                                x.fp32_slot_stride, x.view_of, x.view_offset));
    std::vector<flatbuffers::Offset<prog::Param>> params;
    for (const Param& x : r.params)
      params.push_back(prog::CreateParamDirect(b, x.name.c_str(), x.key, &x.global_shape, x.split_dim, x.split_comm,
                                              x.init, x.init_std, x.buffer, x.grad, x.chunk, x.decay,
                                              x.tp_replicated, x.counts_in_norm, x.grad_sync_tp));
    std::vector<flatbuffers::Offset<prog::BucketInfo>> buckets;
    for (const Bucket& x : r.buckets)
      buckets.push_back(prog::CreateBucketInfo(b, x.chunk, x.params, x.grads, x.elements, x.shard_elements,
                                              x.master, x.exp_avg, x.exp_avg_sq, x.param_shard, x.grad_shard));
    std::vector<flatbuffers::Offset<prog::Chunk>> chunks;
    for (const Chunk& x : r.chunks)
      chunks.push_back(prog::CreateChunk(b, x.index, x.stage, x.first_layer, x.layers, x.has_embedding,
                                        x.has_loss, x.forward, x.backward, x.input, x.output, x.grad, x.slots));
    std::vector<flatbuffers::Offset<prog::Body>> bodies;
    for (const Body& x : r.bodies) {
      auto name = b.CreateString(x.name);
      auto ops = op_vector(x.ops);
      bodies.push_back(prog::CreateBody(b, name, ops));
    }
    auto name = b.CreateString(r.name);
    auto bv = b.CreateVector(buffers);
    auto pv = b.CreateVector(params);
    auto kv = b.CreateVector(buckets);
    auto cv = b.CreateVector(chunks);
    auto dv = b.CreateVector(bodies);
    auto sv = op_vector(r.schedule);
    roles.push_back(prog::CreateRole(b, name, r.pipeline_rank, bv, pv, kv, cv, dv, sv, r.arena_bytes,
                                    r.fp32_arena_bytes, r.peak_bytes));
  }
  std::vector<flatbuffers::Offset<prog::Rank>> ranks;
  ranks.reserve(p.ranks.size());
  for (const Rank& r : p.ranks) {
    prog::Coordinates c(r.coords.tp, r.coords.cp, r.coords.ep, r.coords.dp, r.coords.pp);
    auto comms = b.CreateVector(r.comms.data(), r.comms.size());
    ranks.push_back(prog::CreateRank(b, r.role, &c, comms));
  }
  std::vector<flatbuffers::Offset<prog::Communicator>> comms;
  comms.reserve(p.communicators.size());
  for (const Communicator& c : p.communicators) comms.push_back(prog::CreateCommunicatorDirect(b, c.kind, &c.members));

  const ModelConfig& m = p.model;
  auto model = prog::CreateModelConfigDirect(b, m.name.c_str(), m.layers, m.hidden, m.ffn_hidden, m.heads,
                                            m.kv_heads, m.head_dim, m.vocab, m.vocab_padded, m.seq_len,
                                            m.micro_batch, m.norm, m.activation, m.position,
                                            m.tied_embeddings, m.norm_eps, m.rope_theta, m.bias);
  const ParallelConfig& q = p.parallel;
  auto parallel = prog::CreateParallelConfigDirect(b, q.tp, q.pp, q.vpp, q.cp, q.ep, q.dp, q.sp, q.zero,
                                                  q.schedule, q.order.c_str());
  const TrainConfig& t = p.train;
  auto train = prog::CreateTrainConfigDirect(b, t.steps, t.seed, t.global_batch, t.microbatches, t.precision,
                                            t.lr, t.min_lr, t.warmup_steps, t.weight_decay, t.beta1, t.beta2,
                                            t.eps, t.clip_grad, t.optimizer.c_str(), t.data.c_str(),
                                            t.checkpoint_dir.c_str(), t.checkpoint_every);
  auto program = prog::CreateProgramDirect(b, p.format_version, p.producer.c_str(), p.plan_name.c_str(),
                                          p.world_size, model, parallel, train, &comms, &ranks, &roles);
  prog::FinishProgramBuffer(b, program);
  return std::vector<uint8_t>(b.GetBufferPointer(), b.GetBufferPointer() + b.GetSize());
}

// --- reading ---------------------------------------------------------------------------------

namespace {

template <typename T>
std::vector<T> Vec(const flatbuffers::Vector<T>* v) {
  return v ? std::vector<T>(v->begin(), v->end()) : std::vector<T>{};
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

}  // namespace

std::optional<Program> FromFlatBuffer(const uint8_t* data, size_t size, std::string* error) {
  if (size < 8 || !prog::ProgramBufferHasIdentifier(data)) {
    *error = "not a paraplan program (no 'PPLN' file identifier)";
    return std::nullopt;
  }
  flatbuffers::Verifier verifier(data, size, /*max_depth=*/64, /*max_tables=*/100'000'000);
  if (!prog::VerifyProgramBuffer(verifier)) {
    *error = fmt::format("the file is damaged: the FlatBuffers verifier rejects its {} bytes (truncated or corrupted)", size);
    return std::nullopt;
  }
  const prog::Program* f = prog::GetProgram(data);
  Program p;
  p.format_version = f->format_version();
  if (p.format_version != prog::kFormatVersion) {
    *error = fmt::format("format version {} is not the supported version {}; recompile the plan with this planc",
                         p.format_version, prog::kFormatVersion);
    return std::nullopt;
  }
  p.producer = Str(f->producer());
  p.plan_name = Str(f->plan_name());
  p.world_size = f->world_size();
  if (const auto* m = f->model()) {
    p.model = {Str(m->name()), m->layers(), m->hidden(), m->ffn_hidden(), m->heads(), m->kv_heads(),
               m->head_dim(), m->vocab(), m->vocab_padded(), m->seq_len(), m->micro_batch(), m->norm(),
               m->activation(), m->position(), m->tied_embeddings(), m->norm_eps(), m->rope_theta(), m->bias()};
  }
  if (const auto* q = f->parallel()) {
    p.parallel = {q->tp(), q->pp(), q->vpp(), q->cp(), q->ep(), q->dp(), q->sp(), q->zero(), q->schedule(),
                  Str(q->order())};
  }
  if (const auto* t = f->train()) {
    p.train = {t->steps(), t->seed(), t->global_batch(), t->microbatches(), t->precision(), t->lr(),
               t->min_lr(), t->warmup_steps(), t->weight_decay(), t->beta1(), t->beta2(), t->eps(),
               t->clip_grad(), Str(t->optimizer()), Str(t->data()), Str(t->checkpoint_dir()),
               t->checkpoint_every()};
  }
  if (f->communicators())
    for (const prog::Communicator* c : *f->communicators()) p.communicators.push_back({c->kind(), Vec(c->members())});
  if (f->ranks()) {
    p.ranks.reserve(f->ranks()->size());
    for (const prog::Rank* r : *f->ranks()) {
      Rank rank;
      rank.role = r->role();
      if (const auto* c = r->coords()) rank.coords = {c->tp(), c->cp(), c->ep(), c->dp(), c->pp()};
      auto comms = Vec(r->comms());
      if (comms.size() > rank.comms.size()) {
        *error = fmt::format("rank {} lists {} communicator kinds; this version knows {}", p.ranks.size(),
                             comms.size(), rank.comms.size());
        return std::nullopt;
      }
      std::copy(comms.begin(), comms.end(), rank.comms.begin());
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
          role.buffers.push_back({Str(x->name()), x->kind(), x->dtype(), Vec(x->shape()), x->offset(), x->bytes(),
                                  x->slots(), x->slot_stride(), x->fp32_offset(), x->fp32_bytes(),
                                  x->fp32_slot_stride(), x->view_of(), x->view_offset(), -1});
      if (r->params())
        for (const prog::Param* x : *r->params())
          role.params.push_back({Str(x->name()), x->key(), Vec(x->global_shape()), x->split_dim(), x->split_comm(),
                                 x->init(), x->init_std(), x->buffer(), x->grad(), x->chunk(), x->decay(),
                                 x->tp_replicated(), x->counts_in_norm(), x->grad_sync_tp()});
      if (r->buckets())
        for (const prog::BucketInfo* x : *r->buckets())
          role.buckets.push_back({x->chunk(), x->params(), x->grads(), x->elements(), x->shard_elements(),
                                  x->master(), x->exp_avg(), x->exp_avg_sq(), x->param_shard(), x->grad_shard()});
      if (r->chunks())
        for (const prog::Chunk* x : *r->chunks())
          role.chunks.push_back({x->index(), x->stage(), x->first_layer(), x->layers(), x->has_embedding(),
                                 x->has_loss(), x->forward(), x->backward(), x->input(), x->output(), x->grad(),
                                 x->slots()});
      if (r->bodies())
        for (const prog::Body* x : *r->bodies()) role.bodies.push_back({Str(x->name()), ReadOps(x->ops())});
      role.schedule = ReadOps(r->schedule());
      role.arena_bytes = r->arena_bytes();
      role.fp32_arena_bytes = r->fp32_arena_bytes();
      role.peak_bytes = r->peak_bytes();
      // Stash buffers follow their chunk's slots; recover the chunk from the chunk table and
      // from the chunk's bodies (a Stash buffer is touched by its own chunk's bodies only).
      const auto nbuf = static_cast<int32_t>(role.buffers.size());
      const auto nbody = static_cast<int32_t>(role.bodies.size());
      for (const Chunk& c : role.chunks) {
        for (int32_t b : {c.input, c.output, c.grad})
          if (b >= 0 && b < nbuf) role.buffers[b].chunk = c.index;
        for (int32_t body : {c.forward, c.backward}) {
          if (body < 0 || body >= nbody) continue;
          for (const Op& op : role.bodies[body].ops)
            for (const auto* list : {&op.inputs, &op.outputs})
              for (int32_t b : *list)
                if (b >= 0 && b < nbuf && role.buffers[b].kind == BufferKind::Stash) role.buffers[b].chunk = c.index;
        }
      }
      p.roles.push_back(std::move(role));
    }
  }
  auto problems = VerifyStructure(p);
  if (!problems.empty()) {
    *error = problems.front();
    if (problems.size() > 1) *error += fmt::format(" (and {} more problems)", problems.size() - 1);
    return std::nullopt;
  }
  return p;
}

}  // namespace paraplan::lower
