// A hand-built program for interpreter tests: a one-chunk "model" (embedding, RMSNorm, LM head,
// cross-entropy) on dp data-parallel ranks with ZeRO 0 or 1, written with the FlatBuffers API
// directly, so the interpreter can be tested without the compiler. With `moe`, a mixture-of-experts
// block (router, permutation, grouped expert layer, weighted combine, residual add) sits between
// the norm and the LM head. Header-only; tests only.
#ifndef PARAPLAN_RUNTIME_EXEC_TINY_PROGRAM_H_
#define PARAPLAN_RUNTIME_EXEC_TINY_PROGRAM_H_

#include <string>
#include <vector>

#include "runtime/format/program.h"

namespace paraplan::exec::testing {

struct TinyOptions {
  int dp = 1;
  int zero = 0;
  int64_t global_batch = 4;
  int64_t steps = 6;
  std::string plan_name = "tiny";
  std::string data;
  std::string checkpoint_dir;
  int64_t checkpoint_every = 0;
  bool moe = false;
  double lr = 0.05;
};

namespace tiny_detail {

// The model's sizes, and the batch and bucket sizes that follow from the options.
struct TinyShape {
  explicit TinyShape(const TinyOptions& o)
      : moe(o.moe),
        mbs(o.global_batch / (micro * o.dp)),
        bucket(dense + (moe ? experts * h + experts * h * h : 0)),
        shard(o.zero >= 1 ? bucket / o.dp : bucket) {}
  bool moe;
  int64_t vocab_padded = 16, vocab = 13, h = 8, seq = 4, micro = 2, tokens = seq * micro;
  int64_t experts = 4, topk = 2;
  int64_t mbs;                                              // micro-batches per step
  int64_t dense = vocab_padded * h + h + vocab_padded * h;  // 264
  int64_t bucket;                                           // 264, or 552 with moe: even
  int64_t shard;
};

struct TinyBuffer {
  std::string name;
  prog::BufferKind kind;
  prog::DType dtype;
  std::vector<int64_t> shape;
  int view_of;
  int64_t view_offset;
};

// The role's buffers in program order, and the index of each one the ops name.
struct TinyBuffers {
  explicit TinyBuffers(const TinyShape& s) {
    using prog::BufferKind;
    using prog::DType;
    const int64_t vp = s.vocab_padded, h = s.h, tokens = s.tokens;
    pb = Add("params", BufferKind::Bucket, {s.bucket});
    gb = Add("grads", BufferKind::Bucket, {s.bucket});
    emb = Add("emb", BufferKind::Param, {vp, h}, DType::F32, pb, 0);
    nw = Add("norm", BufferKind::Param, {h}, DType::F32, pb, vp * h);
    head = Add("head", BufferKind::Param, {vp, h}, DType::F32, pb, vp * h + h);
    demb = Add("emb.grad", BufferKind::Grad, {vp, h}, DType::F32, gb, 0);
    dnw = Add("norm.grad", BufferKind::Grad, {h}, DType::F32, gb, vp * h);
    dhead = Add("head.grad", BufferKind::Grad, {vp, h}, DType::F32, gb, vp * h + h);
    master = Add("master", BufferKind::Optimizer, {s.shard});
    m1 = Add("exp_avg", BufferKind::Optimizer, {s.shard});
    m2 = Add("exp_avg_sq", BufferKind::Optimizer, {s.shard});
    ids = Add("ids", BufferKind::Stash, {tokens}, DType::I32);
    labels = Add("labels", BufferKind::Stash, {tokens}, DType::I32);
    x = Add("x", BufferKind::Stash, {tokens, h});
    n = Add("n", BufferKind::Stash, {tokens, h});
    rstd = Add("rstd", BufferKind::Stash, {tokens});
    z = Add("z", BufferKind::Stash, {tokens, vp});
    mx = Add("m", BufferKind::Stash, {tokens});
    st = Add("st", BufferKind::Stash, {tokens, 2});
    dz = Add("dz", BufferKind::Scratch, {tokens, vp});
    dn = Add("dn", BufferKind::Scratch, {tokens, h});
    dx = Add("dx", BufferKind::Scratch, {tokens, h});
    loss = Add("loss_sum", BufferKind::Persistent, {1});
    nsq = Add("nsq", BufferKind::Persistent, {1});
    if (s.moe) AddMoe(s);
  }

  // The mixture-of-experts block's parameters (after the dense ones in the bucket) and tensors.
  void AddMoe(const TinyShape& s) {
    using prog::BufferKind;
    using prog::DType;
    const int64_t e = s.experts, h = s.h, t = s.tokens, p = s.tokens * s.topk;
    wr = Add("router", BufferKind::Param, {e, h}, DType::F32, pb, s.dense);
    we = Add("experts", BufferKind::Param, {e, h, h}, DType::F32, pb, s.dense + e * h);
    dwr = Add("router.grad", BufferKind::Grad, {e, h}, DType::F32, gb, s.dense);
    dwe = Add("experts.grad", BufferKind::Grad, {e, h, h}, DType::F32, gb, s.dense + e * h);
    zr = Add("router.logits", BufferKind::Stash, {t, e});
    rw = Add("router.weights", BufferKind::Stash, {t, s.topk});
    ridx = Add("router.indices", BufferKind::Stash, {t, s.topk}, DType::I32);
    rs = Add("router.scores", BufferKind::Stash, {t, e});
    rc = Add("router.counts", BufferKind::Stash, {e});
    pn = Add("moe.permuted", BufferKind::Stash, {p, h});
    rmap = Add("moe.row_map", BufferKind::Stash, {p}, DType::I32);
    ecnt = Add("moe.counts", BufferKind::Stash, {e}, DType::I32);
    pe = Add("moe.expert_out", BufferKind::Stash, {p, h});
    mo = Add("moe.out", BufferKind::Stash, {t, h});
    n2 = Add("moe.residual", BufferKind::Stash, {t, h});
    dn2 = Add("moe.residual.grad", BufferKind::Scratch, {t, h});
    dpe = Add("moe.expert_out.grad", BufferKind::Scratch, {p, h});
    drw = Add("router.weights.grad", BufferKind::Scratch, {t, s.topk});
    dpn = Add("moe.permuted.grad", BufferKind::Scratch, {p, h});
    dmo = Add("moe.in.grad", BufferKind::Scratch, {t, h});
    dzr = Add("router.logits.grad", BufferKind::Scratch, {t, e});
  }

  std::vector<TinyBuffer> list;
  int pb, gb, emb, nw, head, demb, dnw, dhead, master, m1, m2;
  int ids, labels, x, n, rstd, z, mx, st, dz, dn, dx, loss, nsq;
  int wr = -1, we = -1, dwr = -1, dwe = -1, zr = -1, rw = -1, ridx = -1, rs = -1, rc = -1, pn = -1,
      rmap = -1, ecnt = -1, pe = -1, mo = -1, n2 = -1, dn2 = -1, dpe = -1, drw = -1, dpn = -1,
      dmo = -1, dzr = -1;

 private:
  int Add(std::string name, prog::BufferKind kind, std::vector<int64_t> shape,
          prog::DType dt = prog::DType::F32, int view_of = -1, int64_t view_offset = 0) {
    list.push_back({std::move(name), kind, dt, std::move(shape), view_of, view_offset});
    return static_cast<int>(list.size() - 1);
  }
};

inline flatbuffers::Offset<prog::Op> TinyOp(flatbuffers::FlatBufferBuilder& b, prog::OpKind k,
                                            std::vector<int32_t> in, std::vector<int32_t> out,
                                            prog::CommKind c = prog::CommKind::None,
                                            std::vector<int64_t> ints = {},
                                            std::vector<double> floats = {}) {
  return prog::CreateOpDirect(b, k, &in, &out, c, &ints, &floats);
}

// The chunk's forward and backward bodies: embedding, RMSNorm, LM head, cross-entropy.
inline void AddTinyChunkBodies(flatbuffers::FlatBufferBuilder& b, const TinyOptions& o,
                               const TinyShape& s, const TinyBuffers& t,
                               std::vector<flatbuffers::Offset<prog::Body>>& bodies) {
  using prog::CommKind;
  using prog::OpKind;
  {
    std::vector<flatbuffers::Offset<prog::Op>> ops = {
        TinyOp(b, OpKind::LoadBatch, {}, {t.ids}, CommKind::None, {0}),
        TinyOp(b, OpKind::LoadBatch, {}, {t.labels}, CommKind::None, {1}),
        TinyOp(b, OpKind::Embedding, {t.ids, t.emb}, {t.x}, CommKind::Tp),
        TinyOp(b, OpKind::RmsNorm, {t.x, t.nw}, {t.n, t.rstd}, CommKind::None, {}, {1e-5})};
    if (s.moe) {
      const int64_t e = s.experts, k = s.topk;
      for (auto op : {
               TinyOp(b, OpKind::Linear, {t.n, t.wr}, {t.zr}),
               TinyOp(b, OpKind::MoeRouter, {t.zr}, {t.rw, t.ridx, t.rs, t.rc}, CommKind::None,
                      {e, k, 0, 1}),
               TinyOp(b, OpKind::MoePermute, {t.n, t.ridx}, {t.pn, t.rmap, t.ecnt}, CommKind::None,
                      {e, k}),
               TinyOp(b, OpKind::GroupedLinear, {t.pn, t.we, t.ecnt}, {t.pe}, CommKind::None, {e}),
               TinyOp(b, OpKind::MoeUnpermute, {t.pe, t.rmap, t.rw}, {t.mo}, CommKind::None, {k}),
               TinyOp(b, OpKind::Add, {t.n, t.mo}, {t.n2}),
           })
        ops.push_back(op);
    }
    for (auto op : {
             TinyOp(b, OpKind::Linear, {s.moe ? t.n2 : t.n, t.head}, {t.z}),
             TinyOp(b, OpKind::CrossEntropyMax, {t.z}, {t.mx}),
             TinyOp(b, OpKind::CrossEntropySumExp, {t.z, t.mx, t.labels}, {t.st}, CommKind::Tp),
             TinyOp(b, OpKind::CrossEntropyLoss, {t.mx, t.st}, {t.loss}, CommKind::None, {},
                    {1.0 / s.mbs}),
         })
      ops.push_back(op);
    bodies.push_back(prog::CreateBodyDirect(b, "chunk0.forward", &ops));
  }
  std::vector<flatbuffers::Offset<prog::Op>> ops = {
      TinyOp(b, OpKind::CrossEntropyBackward, {t.z, t.mx, t.st, t.labels}, {t.dz}, CommKind::Tp, {},
             {1.0 / (s.mbs * o.dp)}),
      TinyOp(b, OpKind::LinearBackward, {t.dz, s.moe ? t.n2 : t.n, t.head},
             {s.moe ? t.dn2 : t.dn, t.dhead}, CommKind::None, {0})};
  if (s.moe) {
    const int64_t e = s.experts, k = s.topk;
    for (auto op : {
             TinyOp(b, OpKind::MoeUnpermuteBackward, {t.dn2, t.pe, t.rmap, t.rw}, {t.dpe, t.drw},
                    CommKind::None, {k}),
             TinyOp(b, OpKind::GroupedLinearBackward, {t.dpe, t.pn, t.we, t.ecnt}, {t.dpn, t.dwe},
                    CommKind::None, {e, 0}),
             TinyOp(b, OpKind::MoeUnpermute, {t.dpn, t.rmap, -1}, {t.dmo}, CommKind::None, {k}),
             TinyOp(b, OpKind::Add, {t.dn2, t.dmo}, {t.dn}),
             TinyOp(b, OpKind::MoeRouterBackward, {t.drw, t.ridx, t.rs, t.rc}, {t.dzr},
                    CommKind::None, {e, k, 0, 1, s.tokens}, {0.01, 1.0 / (s.mbs * o.dp)}),
             TinyOp(b, OpKind::LinearBackward, {t.dzr, t.n, t.wr}, {t.dn, t.dwr}, CommKind::None,
                    {1}),
         })
      ops.push_back(op);
  }
  for (auto op : {
           TinyOp(b, OpKind::RmsNormBackward, {t.dn, t.x, t.nw, t.rstd}, {t.dx, t.dnw},
                  CommKind::None, {0}),
           TinyOp(b, OpKind::EmbeddingBackward, {t.dx, t.ids}, {t.demb}, CommKind::Tp),
       })
    ops.push_back(op);
  bodies.push_back(prog::CreateBodyDirect(b, "chunk0.backward", &ops));
}

// The bodies of the step's fixed ops: zeroing gradients, reducing them over dp, the optimizer.
inline void AddTinyStepBodies(flatbuffers::FlatBufferBuilder& b, const TinyOptions& o,
                              const TinyBuffers& t,
                              std::vector<flatbuffers::Offset<prog::Body>>& bodies) {
  using prog::CommKind;
  using prog::kReduceAvg;
  using prog::kReduceSum;
  using prog::OpKind;
  {
    std::vector<flatbuffers::Offset<prog::Op>> ops = {
        TinyOp(b, OpKind::Fill, {}, {t.gb, t.loss}, CommKind::None, {}, {0.0})};
    bodies.push_back(prog::CreateBodyDirect(b, "zero_grads", &ops));
  }
  {
    std::vector<flatbuffers::Offset<prog::Op>> ops;
    if (o.dp > 1 && o.zero == 0)
      ops.push_back(TinyOp(b, OpKind::AllReduce, {t.gb}, {t.gb}, CommKind::Dp, {kReduceSum}));
    if (o.dp > 1 && o.zero >= 1)
      ops.push_back(TinyOp(b, OpKind::ReduceScatter, {t.gb}, {t.gb}, CommKind::Dp, {kReduceSum}));
    bodies.push_back(prog::CreateBodyDirect(b, "reduce_grads", &ops));
  }
  const CommKind shard_comm = o.zero >= 1 ? CommKind::Dp : CommKind::None;
  std::vector<flatbuffers::Offset<prog::Op>> ops = {
      TinyOp(b, OpKind::GradNormSquare, {t.gb}, {t.nsq}, shard_comm)};
  if (o.zero >= 1 && o.dp > 1)
    ops.push_back(TinyOp(b, OpKind::AllReduce, {t.nsq}, {t.nsq}, CommKind::World, {kReduceSum}));
  ops.push_back(
      TinyOp(b, OpKind::AdamW, {t.pb, t.gb, t.master, t.m1, t.m2, t.nsq}, {t.pb}, shard_comm, {0}));
  if (o.zero >= 1 && o.dp > 1)
    ops.push_back(TinyOp(b, OpKind::AllGather, {t.pb}, {t.pb}, CommKind::Dp));
  if (o.dp > 1)
    ops.push_back(TinyOp(b, OpKind::AllReduce, {t.loss}, {t.loss}, CommKind::Dp, {kReduceAvg}));
  bodies.push_back(prog::CreateBodyDirect(b, "optimizer_step", &ops));
}

// One step: zero the gradients, forward and backward per micro-batch, reduce, update.
inline std::vector<flatbuffers::Offset<prog::Op>> TinySchedule(flatbuffers::FlatBufferBuilder& b,
                                                               int64_t mbs) {
  using prog::CommKind;
  using prog::OpKind;
  std::vector<flatbuffers::Offset<prog::Op>> schedule;
  schedule.push_back(TinyOp(b, OpKind::ZeroGrads, {}, {}, CommKind::None, {2}));
  for (int64_t mb = 0; mb < mbs; ++mb) {
    schedule.push_back(TinyOp(b, OpKind::Forward, {}, {}, CommKind::None, {mb, 0, 0}));
    schedule.push_back(TinyOp(b, OpKind::Backward, {}, {}, CommKind::None, {mb, 0, 0}));
  }
  schedule.push_back(TinyOp(b, OpKind::ReduceGrads, {}, {}, CommKind::None, {3}));
  schedule.push_back(TinyOp(b, OpKind::OptimizerStep, {}, {}, CommKind::None, {4}));
  return schedule;
}

// Placement: every non-view buffer after the previous one. Sets `arena_bytes` to the total.
inline std::vector<flatbuffers::Offset<prog::Buffer>> PlaceTinyBuffers(
    flatbuffers::FlatBufferBuilder& b, const TinyBuffers& t, int64_t& arena_bytes) {
  std::vector<flatbuffers::Offset<prog::Buffer>> fb_bufs;
  const std::vector<TinyBuffer>& bufs = t.list;
  int64_t offset = 0;
  std::vector<int64_t> offsets(bufs.size());
  for (size_t i = 0; i < bufs.size(); ++i) {
    int64_t elements = 1;
    for (int64_t d : bufs[i].shape) elements *= d;
    if (bufs[i].view_of >= 0) {
      offsets[i] = offsets[bufs[i].view_of] + bufs[i].view_offset * 4;
    } else {
      offsets[i] = offset;
      offset += (elements * 4 + 63) / 64 * 64;
    }
    fb_bufs.push_back(prog::CreateBufferDirect(
        b, bufs[i].name.c_str(), bufs[i].kind, bufs[i].dtype, &bufs[i].shape, offsets[i],
        elements * 4, 1, 0, offsets[i], elements * 4, 0, bufs[i].view_of, bufs[i].view_offset));
  }
  arena_bytes = offset;
  return fb_bufs;
}

// The one role: its placed buffers, three parameters in one bucket, one chunk.
inline flatbuffers::Offset<prog::Role> TinyRole(
    flatbuffers::FlatBufferBuilder& b, const TinyShape& s, const TinyBuffers& t,
    const std::vector<flatbuffers::Offset<prog::Body>>& bodies,
    const std::vector<flatbuffers::Offset<prog::Op>>& schedule) {
  using prog::CommKind;
  using prog::InitKind;
  int64_t arena = 0;
  std::vector<flatbuffers::Offset<prog::Buffer>> fb_bufs = PlaceTinyBuffers(b, t, arena);
  std::vector<int64_t> emb_shape = {s.vocab_padded, s.h}, norm_shape = {s.h};
  std::vector<flatbuffers::Offset<prog::Param>> params = {
      prog::CreateParamDirect(b, "embedding.word", 1, &emb_shape, -1, CommKind::None,
                              InitKind::Normal, 0.5, t.emb, t.demb, 0, true),
      prog::CreateParamDirect(b, "final_norm", 2, &norm_shape, -1, CommKind::None, InitKind::Ones,
                              0, t.nw, t.dnw, 0, false),
      prog::CreateParamDirect(b, "output", 3, &emb_shape, -1, CommKind::None, InitKind::Normal, 0.5,
                              t.head, t.dhead, 0, true)};
  std::vector<int64_t> router_shape = {s.experts, s.h}, experts_shape = {s.experts, s.h, s.h};
  if (s.moe) {
    params.push_back(prog::CreateParamDirect(b, "moe.router", 4, &router_shape, -1, CommKind::None,
                                             InitKind::Normal, 0.5, t.wr, t.dwr, 0, true));
    params.push_back(prog::CreateParamDirect(b, "moe.experts", 5, &experts_shape, -1,
                                             CommKind::None, InitKind::Normal, 0.3, t.we, t.dwe, 0,
                                             true));
  }
  std::vector<flatbuffers::Offset<prog::BucketInfo>> buckets = {
      prog::CreateBucketInfo(b, 0, t.pb, t.gb, s.bucket, s.shard, t.master, t.m1, t.m2, -1)};
  std::vector<flatbuffers::Offset<prog::Chunk>> chunks = {
      prog::CreateChunk(b, 0, 0, 0, 1, true, true, 0, 1, -1, -1, -1, 1)};
  return prog::CreateRoleDirect(b, "stage0", 0, &fb_bufs, &params, &buckets, &chunks, &bodies,
                                &schedule, arena, arena, arena);
}

}  // namespace tiny_detail

inline std::vector<uint8_t> TinyProgram(const TinyOptions& o) {
  using namespace paraplan::prog;
  flatbuffers::FlatBufferBuilder b;
  const tiny_detail::TinyShape s(o);
  const tiny_detail::TinyBuffers t(s);
  std::vector<flatbuffers::Offset<Body>> bodies;
  tiny_detail::AddTinyChunkBodies(b, o, s, t, bodies);
  tiny_detail::AddTinyStepBodies(b, o, t, bodies);
  const std::vector<flatbuffers::Offset<Op>> schedule = tiny_detail::TinySchedule(b, s.mbs);
  std::vector<flatbuffers::Offset<Role>> roles = {tiny_detail::TinyRole(b, s, t, bodies, schedule)};
  std::vector<int32_t> all;
  for (int r = 0; r < o.dp; ++r) all.push_back(r);
  std::vector<flatbuffers::Offset<Communicator>> comms = {
      CreateCommunicatorDirect(b, CommKind::World, &all),
      CreateCommunicatorDirect(b, CommKind::Dp, &all)};
  // tp = 1: each rank alone in its tp communicator, which the bodies' tp ops name (as in a
  // compiled program, so the whole-world verifier accepts it).
  for (int r = 0; r < o.dp; ++r) {
    const std::vector<int32_t> alone = {r};
    comms.push_back(CreateCommunicatorDirect(b, CommKind::Tp, &alone));
  }
  std::vector<flatbuffers::Offset<Rank>> ranks;
  for (int r = 0; r < o.dp; ++r) {
    std::vector<int32_t> c(kCommKinds, -1);
    c[static_cast<int>(CommKind::World)] = 0;
    c[static_cast<int>(CommKind::Dp)] = 1;
    c[static_cast<int>(CommKind::Tp)] = 2 + r;
    Coordinates coords(0, 0, 0, r, 0);
    ranks.push_back(CreateRankDirect(b, 0, &coords, &c));
  }
  auto model = CreateModelConfigDirect(b, "tiny", 1, s.h, 4 * s.h, 1, 1, s.h, s.vocab,
                                       s.vocab_padded, s.seq, s.micro);
  auto par = CreateParallelConfigDirect(b, 1, 1, 1, 1, 1, o.dp, false, o.zero, ScheduleKind::Gpipe,
                                        "tp-cp-ep-dp-pp");
  auto train = CreateTrainConfigDirect(
      b, o.steps, 7, o.global_batch, s.mbs, prog::Precision::Fp32, o.lr, 0.005, 2, 0.1, 0.9, 0.95,
      1e-8, 1.0, "adamw", o.data.c_str(), o.checkpoint_dir.c_str(), o.checkpoint_every);
  auto program = CreateProgramDirect(b, kFormatVersion, "test", o.plan_name.c_str(), o.dp, model,
                                     par, train, &comms, &ranks, &roles);
  FinishProgramBuffer(b, program);
  return std::vector<uint8_t>(b.GetBufferPointer(), b.GetBufferPointer() + b.GetSize());
}

}  // namespace paraplan::exec::testing

#endif  // PARAPLAN_RUNTIME_EXEC_TINY_PROGRAM_H_
