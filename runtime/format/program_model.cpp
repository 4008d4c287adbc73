// The in-memory program (program_model.h): FlatBuffers encoding and the plain copy back.
#include "runtime/format/program_model.h"

namespace paraplan::prog::mem {

std::vector<uint8_t> EncodeProgram(const Program& p) {
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
      buffers.push_back(prog::CreateBufferDirect(
          b, x.name.c_str(), x.kind, x.dtype, &x.shape, x.offset, x.bytes, x.slots, x.slot_stride,
          x.fp32_offset, x.fp32_bytes, x.fp32_slot_stride, x.view_of, x.view_offset));
    std::vector<flatbuffers::Offset<prog::Param>> params;
    for (const Param& x : r.params)
      params.push_back(prog::CreateParamDirect(
          b, x.name.c_str(), x.key, &x.global_shape, x.split_dim, x.split_comm, x.init, x.init_std,
          x.buffer, x.grad, x.chunk, x.decay, x.tp_replicated, x.counts_in_norm, x.grad_sync_tp));
    std::vector<flatbuffers::Offset<prog::BucketInfo>> buckets;
    for (const Bucket& x : r.buckets)
      buckets.push_back(prog::CreateBucketInfo(b, x.chunk, x.params, x.grads, x.elements,
                                               x.shard_elements, x.master, x.exp_avg, x.exp_avg_sq,
                                               x.param_shard, x.grad_shard));
    std::vector<flatbuffers::Offset<prog::Chunk>> chunks;
    for (const Chunk& x : r.chunks)
      chunks.push_back(prog::CreateChunk(b, x.index, x.stage, x.first_layer, x.layers,
                                         x.has_embedding, x.has_loss, x.forward, x.backward,
                                         x.input, x.output, x.grad, x.slots));
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
    roles.push_back(prog::CreateRole(b, name, r.pipeline_rank, bv, pv, kv, cv, dv, sv,
                                     r.arena_bytes, r.fp32_arena_bytes, r.peak_bytes));
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
  for (const Communicator& c : p.communicators)
    comms.push_back(prog::CreateCommunicatorDirect(b, c.kind, &c.members));

  const ModelConfig& m = p.model;
  auto model = prog::CreateModelConfigDirect(
      b, m.name.c_str(), m.layers, m.hidden, m.ffn_hidden, m.heads, m.kv_heads, m.head_dim, m.vocab,
      m.vocab_padded, m.seq_len, m.micro_batch, m.norm, m.activation, m.position, m.tied_embeddings,
      m.norm_eps, m.rope_theta, m.bias, m.q_lora_rank, m.kv_lora_rank, m.qk_nope_head_dim,
      m.qk_rope_head_dim, m.v_head_dim);
  const ParallelConfig& q = p.parallel;
  auto parallel = prog::CreateParallelConfigDirect(b, q.tp, q.pp, q.vpp, q.cp, q.ep, q.dp, q.sp,
                                                   q.zero, q.schedule, q.order.c_str());
  const TrainConfig& t = p.train;
  auto train = prog::CreateTrainConfigDirect(
      b, t.steps, t.seed, t.global_batch, t.microbatches, t.precision, t.lr, t.min_lr,
      t.warmup_steps, t.weight_decay, t.beta1, t.beta2, t.eps, t.clip_grad, t.optimizer.c_str(),
      t.data.c_str(), t.checkpoint_dir.c_str(), t.checkpoint_every);
  auto program =
      prog::CreateProgramDirect(b, p.format_version, p.producer.c_str(), p.plan_name.c_str(),
                                p.world_size, model, parallel, train, &comms, &ranks, &roles);
  prog::FinishProgramBuffer(b, program);
  return std::vector<uint8_t>(b.GetBufferPointer(), b.GetBufferPointer() + b.GetSize());
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

}  // namespace

Program DecodeProgramModel(const prog::Program& file) {
  const prog::Program* f = &file;
  Program p;
  p.format_version = f->format_version();
  p.producer = Str(f->producer());
  p.plan_name = Str(f->plan_name());
  p.world_size = f->world_size();
  if (const auto* m = f->model()) {
    p.model = {Str(m->name()),        m->layers(),       m->hidden(),
               m->ffn_hidden(),       m->heads(),        m->kv_heads(),
               m->head_dim(),         m->vocab(),        m->vocab_padded(),
               m->seq_len(),          m->micro_batch(),  m->norm(),
               m->activation(),       m->position(),     m->tied_embeddings(),
               m->norm_eps(),         m->rope_theta(),   m->bias(),
               m->q_lora_rank(),      m->kv_lora_rank(), m->qk_nope_head_dim(),
               m->qk_rope_head_dim(), m->v_head_dim()};
  }
  if (const auto* q = f->parallel()) {
    p.parallel = {q->tp(), q->pp(), q->vpp(),  q->cp(),       q->ep(),
                  q->dp(), q->sp(), q->zero(), q->schedule(), Str(q->order())};
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
                                 x->grad_sync_tp()});
      if (r->buckets())
        for (const prog::BucketInfo* x : *r->buckets())
          role.buckets.push_back({x->chunk(), x->params(), x->grads(), x->elements(),
                                  x->shard_elements(), x->master(), x->exp_avg(), x->exp_avg_sq(),
                                  x->param_shard(), x->grad_shard()});
      if (r->chunks())
        for (const prog::Chunk* x : *r->chunks())
          role.chunks.push_back({x->index(), x->stage(), x->first_layer(), x->layers(),
                                 x->has_embedding(), x->has_loss(), x->forward(), x->backward(),
                                 x->input(), x->output(), x->grad(), x->slots()});
      if (r->bodies())
        for (const prog::Body* x : *r->bodies())
          role.bodies.push_back({Str(x->name()), ReadOps(x->ops())});
      role.schedule = ReadOps(r->schedule());
      role.arena_bytes = r->arena_bytes();
      role.fp32_arena_bytes = r->fp32_arena_bytes();
      role.peak_bytes = r->peak_bytes();
      p.roles.push_back(std::move(role));
    }
  }
  return p;
}

}  // namespace paraplan::prog::mem
