#include "runtime/exec/program_image.h"
#include "runtime/format/read_program.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

namespace paraplan::exec {
namespace {

template <typename T>
std::vector<T> Vec(const flatbuffers::Vector<T>* v) {
  return v ? std::vector<T>(v->begin(), v->end()) : std::vector<T>{};
}

std::string Str(const flatbuffers::String* s) { return s ? s->str() : std::string(); }

OpImage DecodeOp(const prog::Op* op) {
  OpImage o;
  o.kind = op->kind();
  o.inputs = Vec(op->inputs());
  o.outputs = Vec(op->outputs());
  o.comm = op->comm();
  o.ints = Vec(op->ints());
  o.floats = Vec(op->floats());
  return o;
}

struct Fnv {
  uint64_t h = 1469598103934665603ull;
  void Bytes(const void* p, size_t n) {
    auto* c = static_cast<const unsigned char*>(p);
    for (size_t i = 0; i < n; ++i) h = (h ^ c[i]) * 1099511628211ull;
  }
  void Int(int64_t v) { Bytes(&v, sizeof v); }
  void Text(const std::string& s) { Int(static_cast<int64_t>(s.size())); Bytes(s.data(), s.size()); }
};

// Minimum operand counts per body op (inputs, outputs); -1: not a body op the runtime runs.
std::pair<int, int> Operands(OpKind k) {
  switch (k) {
    case OpKind::AllReduce: case OpKind::ReduceScatter: case OpKind::AllGather:
    case OpKind::Broadcast: case OpKind::Copy: case OpKind::Gelu: case OpKind::Rope:
    case OpKind::RopeBackward: case OpKind::CrossEntropyMax: return {1, 1};
    case OpKind::LoadBatch: return {0, 1};
    case OpKind::Fill: return {0, 1};
    case OpKind::Embedding: return {2, 1};
    case OpKind::EmbeddingBackward: return {2, 1};
    case OpKind::AddPosition: return {2, 1};
    case OpKind::AddPositionBackward: return {1, 1};
    case OpKind::RmsNorm: return {2, 2};
    case OpKind::RmsNormBackward: return {4, 2};
    case OpKind::LayerNorm: return {3, 3};
    case OpKind::LayerNormBackward: return {5, 3};
    case OpKind::Linear: return {2, 1};
    case OpKind::LinearBackward: return {3, 2};
    case OpKind::AddBias: return {2, 1};
    case OpKind::AddBiasBackward: return {1, 1};
    case OpKind::Attention: return {3, 2};
    case OpKind::AttentionBackward: return {6, 3};
    case OpKind::SwiGlu: return {2, 1};
    case OpKind::SwiGluBackward: return {3, 2};
    case OpKind::GeluBackward: return {2, 1};
    case OpKind::Add: return {2, 1};
    case OpKind::CrossEntropySumExp: return {3, 1};
    case OpKind::CrossEntropyLoss: return {2, 1};
    case OpKind::CrossEntropyBackward: return {4, 1};
    case OpKind::GradNormSquare: return {1, 1};
    case OpKind::AdamW: case OpKind::Sgd: return {6, 1};
    default: return {-1, -1};
  }
}

}  // namespace

ProgramImage DecodeProgramImage(const uint8_t* data, size_t size, const std::string& origin) {
  auto fail = [&](const std::string& what) -> ProgramError {
    return ProgramError("program `" + origin + "`: " + what);
  };
  if (size < 8 || !prog::ProgramBufferHasIdentifier(data)) {
    throw fail("not a paraplan program (no PPLN identifier); compile one with `planc compile PLAN -o FILE`");
  }
  flatbuffers::Verifier verifier(data, size, 128, 100000000);
  if (!prog::VerifyProgramBuffer(verifier)) throw fail("the file is corrupt (FlatBuffers verification failed)");
  const prog::Program* p = prog::GetProgram(data);
  ProgramImage img;
  img.format_version = p->format_version();
  if (img.format_version != prog::kFormatVersion) {
    throw fail("format version " + std::to_string(img.format_version) + ", this planrun reads version " +
               std::to_string(prog::kFormatVersion) + "; recompile the plan with this release's planc");
  }
  img.producer = Str(p->producer());
  img.plan_name = Str(p->plan_name());
  img.world_size = p->world_size();
  if (img.world_size <= 0 || img.world_size > 4096) {
    throw fail("world size " + std::to_string(img.world_size) + " is outside 1..4096 for the host runtime");
  }
  if (!p->model() || !p->parallel() || !p->train()) throw fail("model, parallel or train section missing");
  const auto* m = p->model();
  img.model = {Str(m->name()), m->layers(), m->hidden(), m->ffn_hidden(), m->heads(), m->kv_heads(),
               m->head_dim(), m->vocab(), m->vocab_padded(), m->seq_len(), m->micro_batch(), m->norm(),
               m->activation(), m->position(), m->tied_embeddings(), m->bias(), m->norm_eps(), m->rope_theta()};
  const auto* pa = p->parallel();
  img.parallel = {pa->tp(), pa->pp(), pa->vpp(), pa->cp(), pa->ep(), pa->dp(), pa->zero(), pa->sp(),
                  pa->schedule(), Str(pa->order())};
  const auto* t = p->train();
  img.train = {t->steps(), t->seed(), t->global_batch(), t->microbatches(), t->warmup_steps(), t->lr(),
               t->min_lr(), t->weight_decay(), t->beta1(), t->beta2(), t->eps(), t->clip_grad(),
               Str(t->optimizer()), Str(t->data()), Str(t->checkpoint_dir()), t->checkpoint_every()};
  if (img.model.seq_len <= 0 || img.model.micro_batch <= 0 || img.model.vocab <= 0 ||
      img.train.global_batch <= 0 || img.parallel.dp <= 0) {
    throw fail("model.seq_len, model.micro_batch, model.vocab, train.global_batch and parallel.dp must be positive");
  }

  if (p->communicators()) {
    for (const auto* c : *p->communicators()) {
      CommunicatorImage ci{c->kind(), Vec(c->members())};
      for (int32_t member : ci.members) {
        if (member < 0 || member >= img.world_size) {
          throw fail("communicator member " + std::to_string(member) + " outside the world of " +
                     std::to_string(img.world_size));
        }
      }
      img.communicators.push_back(std::move(ci));
    }
  }
  if (!p->ranks() || static_cast<int32_t>(p->ranks()->size()) != img.world_size) {
    throw fail("the rank table has " + std::to_string(p->ranks() ? p->ranks()->size() : 0) +
               " entries for a world of " + std::to_string(img.world_size));
  }
  const int32_t role_count = p->roles() ? static_cast<int32_t>(p->roles()->size()) : 0;
  for (int32_t r = 0; r < img.world_size; ++r) {
    const auto* rk = p->ranks()->Get(r);
    RankImage ri;
    ri.role = rk->role();
    if (ri.role < 0 || ri.role >= role_count) throw fail("rank " + std::to_string(r) + " names role " + std::to_string(ri.role));
    if (rk->coords()) ri.coords = *rk->coords();
    ri.comms.fill(-1);
    auto comms = Vec(rk->comms());
    if (comms.size() > static_cast<size_t>(prog::kCommKinds)) comms.resize(prog::kCommKinds);
    for (size_t k = 0; k < comms.size(); ++k) {
      const int32_t c = comms[k];
      if (c < -1 || c >= static_cast<int32_t>(img.communicators.size())) {
        throw fail("rank " + std::to_string(r) + " names communicator " + std::to_string(c));
      }
      if (c >= 0) {
        const auto& members = img.communicators[c].members;
        if (std::find(members.begin(), members.end(), r) == members.end()) {
          throw fail("rank " + std::to_string(r) + " is not a member of its " +
                     prog::EnumNameCommKind(static_cast<CommKind>(k)) + " communicator " + std::to_string(c));
        }
      }
      ri.comms[k] = c;
    }
    img.ranks.push_back(ri);
  }

  for (int32_t ri = 0; ri < role_count; ++ri) {
    const auto* r = p->roles()->Get(ri);
    RoleImage role;
    role.name = Str(r->name());
    role.pipeline_rank = r->pipeline_rank();
    role.fp32_arena_bytes = r->fp32_arena_bytes();
    role.peak_bytes = r->peak_bytes();
    if (role.fp32_arena_bytes < 0 || role.fp32_arena_bytes > (int64_t{1} << 40)) {
      throw fail("role `" + role.name + "` asks for an arena of " + std::to_string(role.fp32_arena_bytes) +
                 " bytes, outside 0 .. 1 TiB");
    }
    auto where = [&](const std::string& what) { return "role `" + role.name + "`: " + what; };
    if (r->buffers()) {
      for (const auto* b : *r->buffers()) {
        BufferImage bi;
        bi.name = Str(b->name());
        bi.kind = b->kind();
        bi.dtype = b->dtype();
        bi.shape = Vec(b->shape());
        bi.elements = 1;
        for (int64_t d : bi.shape) {
          if (d < 0 || (d > 0 && bi.elements > (int64_t{1} << 40) / d)) throw fail(where("buffer `" + bi.name + "` has a bad shape"));
          bi.elements *= d;
        }
        bi.slots = b->slots();
        bi.fp32_offset = b->fp32_offset();
        bi.fp32_bytes = b->fp32_bytes();
        bi.fp32_slot_stride = b->fp32_slot_stride();
        bi.view_of = b->view_of();
        bi.view_offset = b->view_offset();
        if (bi.slots < 1) throw fail(where("buffer `" + bi.name + "` has " + std::to_string(bi.slots) + " slots"));
        if (bi.dtype != DType::F32 && bi.dtype != DType::Bf16 && bi.dtype != DType::F16 && bi.dtype != DType::I32) {
          throw fail(where("buffer `" + bi.name + "` has dtype " + prog::EnumNameDType(bi.dtype) + ", which the host runtime does not support"));
        }
        if (bi.fp32_bytes < bi.elements * 4 || bi.fp32_offset < 0 ||
            (bi.slots > 1 && bi.fp32_slot_stride < bi.fp32_bytes) ||
            bi.fp32_offset + (bi.slots - 1) * bi.fp32_slot_stride + bi.fp32_bytes > role.fp32_arena_bytes) {
          throw fail(where("buffer `" + bi.name + "` (" + std::to_string(bi.elements) + " elements, " +
                           std::to_string(bi.slots) + " slots at f32 offset " + std::to_string(bi.fp32_offset) +
                           ") does not fit its placement or the arena of " + std::to_string(role.fp32_arena_bytes) + " bytes"));
        }
        role.buffers.push_back(std::move(bi));
      }
    }
    const int32_t nbuf = static_cast<int32_t>(role.buffers.size());
    for (auto& b : role.buffers) {
      if (b.view_of >= nbuf || (b.view_of >= 0 && (b.view_offset < 0 || b.view_offset + b.elements > role.buffers[b.view_of].elements))) {
        throw fail(where("view `" + b.name + "` lies outside the buffer it views"));
      }
    }
    auto check_buffer = [&](int32_t b, const std::string& what, bool allow_none = false) {
      if ((allow_none && b == -1) || (b >= 0 && b < nbuf)) return;
      throw fail(where(what + " names buffer " + std::to_string(b) + " of " + std::to_string(nbuf)));
    };
    if (r->params()) {
      for (const auto* q : *r->params()) {
        ParamImage pi{Str(q->name()), q->key(), Vec(q->global_shape()), q->split_dim(), q->split_comm(),
                      q->init(), q->init_std(), q->buffer(), q->grad(), q->chunk(), q->decay(),
                      q->tp_replicated(), q->counts_in_norm(), q->grad_sync_tp()};
        check_buffer(pi.buffer, "param `" + pi.name + "`");
        check_buffer(pi.grad, "param `" + pi.name + "` gradient");
        if (pi.split_dim >= static_cast<int32_t>(pi.global_shape.size())) throw fail(where("param `" + pi.name + "` splits a missing dimension"));
        role.params.push_back(std::move(pi));
      }
    }
    if (r->buckets()) {
      for (const auto* q : *r->buckets()) {
        BucketImage bi{q->chunk(), q->params(), q->grads(), q->elements(), q->shard_elements(), q->master(),
                       q->exp_avg(), q->exp_avg_sq(), q->param_shard(), q->grad_shard()};
        check_buffer(bi.params, "bucket");
        check_buffer(bi.grads, "bucket");
        for (int32_t b : {bi.master, bi.exp_avg, bi.exp_avg_sq, bi.param_shard, bi.grad_shard}) check_buffer(b, "bucket", true);
        const std::string what = "the bucket of chunk " + std::to_string(bi.chunk);
        const int64_t dp = img.parallel.zero >= 1 ? img.parallel.dp : 1;
        if (bi.elements <= 0 || bi.shard_elements <= 0 || bi.shard_elements * dp != bi.elements ||
            role.buffers[bi.params].elements < bi.elements || role.buffers[bi.grads].elements < bi.elements) {
          throw fail(where(what + " holds " + std::to_string(bi.elements) + " elements in shards of " +
                           std::to_string(bi.shard_elements) + " over " + std::to_string(dp) +
                           " ranks, which does not match its buffers"));
        }
        for (int32_t b : {bi.master, bi.exp_avg, bi.exp_avg_sq, bi.param_shard, bi.grad_shard}) {
          if (b >= 0 && role.buffers[b].elements < bi.shard_elements) {
            throw fail(where(what + ": buffer `" + role.buffers[b].name + "` is smaller than the shard of " +
                             std::to_string(bi.shard_elements) + " elements"));
          }
        }
        role.buckets.push_back(bi);
      }
    }
    if (r->bodies()) {
      for (const auto* b : *r->bodies()) {
        BodyImage body{Str(b->name()), {}};
        if (b->ops()) {
          for (const auto* op : *b->ops()) {
            OpImage o = DecodeOp(op);
            auto [nin, nout] = Operands(o.kind);
            const std::string what = "op " + std::to_string(body.ops.size()) + " (" + prog::EnumNameOpKind(o.kind) +
                                     ") of body `" + body.name + "`";
            if (nin < 0) throw fail(where(what + " is not supported by this runtime"));
            if (static_cast<int>(o.inputs.size()) < nin || static_cast<int>(o.outputs.size()) < nout) {
              throw fail(where(what + " has " + std::to_string(o.inputs.size()) + " inputs and " +
                               std::to_string(o.outputs.size()) + " outputs; it needs at least " +
                               std::to_string(nin) + " and " + std::to_string(nout)));
            }
            for (int32_t x : o.inputs) check_buffer(x, what, true);
            for (int32_t x : o.outputs) check_buffer(x, what, true);
            if (static_cast<int>(o.comm) < 0 || static_cast<int>(o.comm) >= prog::kCommKinds) throw fail(where(what + " names a bad communicator kind"));
            body.ops.push_back(std::move(o));
          }
        }
        role.bodies.push_back(std::move(body));
      }
    }
    const int32_t nbodies = static_cast<int32_t>(role.bodies.size());
    if (r->chunks()) {
      for (const auto* c : *r->chunks()) {
        ChunkImage ci{c->index(), c->stage(), c->first_layer(), c->layers(), c->has_embedding(), c->has_loss(),
                      c->forward(), c->backward(), c->input(), c->output(), c->grad(), c->slots()};
        if (ci.forward < 0 || ci.forward >= nbodies || ci.backward < 0 || ci.backward >= nbodies) {
          throw fail(where("chunk " + std::to_string(ci.index) + " names a missing body"));
        }
        for (int32_t b : {ci.input, ci.output, ci.grad}) check_buffer(b, "chunk " + std::to_string(ci.index), true);
        role.chunks.push_back(ci);
      }
    }
    const int32_t nchunks = static_cast<int32_t>(role.chunks.size());
    if (r->schedule()) {
      for (const auto* op : *r->schedule()) {
        OpImage o = DecodeOp(op);
        const std::string what = "schedule op " + std::to_string(role.schedule.size()) + " (" + prog::EnumNameOpKind(o.kind) + ")";
        switch (o.kind) {
          case OpKind::Forward: case OpKind::Backward:
          case OpKind::SendActivation: case OpKind::RecvActivation:
          case OpKind::SendGrad: case OpKind::RecvGrad: {
            const bool p2p = o.kind != OpKind::Forward && o.kind != OpKind::Backward;
            if (o.ints.size() < (p2p ? 5u : 3u)) throw fail(where(what + " has too few ints"));
            if (o.ints[1] < 0 || o.ints[1] >= nchunks) throw fail(where(what + " names chunk " + std::to_string(o.ints[1])));
            if (o.ints[2] < 0 || o.ints[2] >= role.chunks[o.ints[1]].slots) throw fail(where(what + " names slot " + std::to_string(o.ints[2])));
            if (p2p) {
              const auto& bufs = (o.kind == OpKind::SendActivation || o.kind == OpKind::SendGrad) ? o.inputs : o.outputs;
              if (bufs.empty()) throw fail(where(what + " names no buffer"));
              check_buffer(bufs[0], what);
            }
            break;
          }
          case OpKind::ZeroGrads: case OpKind::ReduceGrads: case OpKind::OptimizerStep:
            if (o.ints.empty() || o.ints[0] < 0 || o.ints[0] >= nbodies) throw fail(where(what + " names a missing body"));
            break;
          case OpKind::GatherParams:
            if (o.ints.size() < 2 || o.ints[1] < 0 || o.ints[1] >= nbodies) throw fail(where(what + " names a missing body"));
            break;
          case OpKind::ReleaseParams:
            break;
          default:
            throw fail(where(what + " is not a schedule op"));
        }
        role.schedule.push_back(std::move(o));
      }
    }
    img.roles.push_back(std::move(role));
  }

  Fnv f;
  f.Int(img.world_size);
  const auto& md = img.model;
  for (int64_t v : {int64_t{md.layers}, md.hidden, md.ffn_hidden, md.heads, md.kv_heads, md.head_dim, md.vocab,
                    md.vocab_padded, md.seq_len, static_cast<int64_t>(md.norm), static_cast<int64_t>(md.activation),
                    static_cast<int64_t>(md.position), int64_t{md.tied_embeddings}, int64_t{md.bias}}) {
    f.Int(v);
  }
  const auto& pl = img.parallel;
  for (int64_t v : {pl.tp, pl.pp, pl.vpp, pl.cp, pl.ep, pl.dp, pl.zero}) f.Int(v);
  f.Int(pl.sp);
  f.Int(img.train.seed);
  for (const auto& role : img.roles) {
    for (const auto& q : role.params) {
      f.Text(q.name);
      f.Int(q.key);
      for (int64_t d : q.global_shape) f.Int(d);
      f.Int(q.split_dim);
    }
    for (const auto& b : role.buckets) {
      f.Int(b.elements);
      f.Int(b.shard_elements);
    }
  }
  img.fingerprint = f.h;
  return img;
}

ProgramImage LoadProgramImage(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) throw ProgramError("program `" + path + "` does not exist");
  if (std::filesystem::is_directory(path, ec)) throw ProgramError("program `" + path + "` is a directory");
  // FlatBuffers reads need the buffer aligned; std::vector storage is.
  std::vector<uint8_t> bytes;
  std::string error;
  if (!prog::ReadProgramFile(path, &bytes, &error)) throw ProgramError("cannot read program `" + path + "`: " + error);
  return DecodeProgramImage(bytes.data(), bytes.size(), path);
}

}  // namespace paraplan::exec
