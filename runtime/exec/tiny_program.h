// A hand-built program for interpreter tests: a one-chunk "model" (embedding, RMSNorm, LM head,
// cross-entropy) on dp data-parallel ranks with ZeRO 0 or 1, written with the FlatBuffers API
// directly, so the interpreter can be tested without the compiler. Header-only; tests only.
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
};

inline std::vector<uint8_t> TinyProgram(const TinyOptions& o) {
  using namespace paraplan::prog;
  flatbuffers::FlatBufferBuilder b;
  const int64_t vocab_padded = 16, vocab = 13, h = 8, seq = 4, micro = 2, tokens = seq * micro;
  const int64_t mbs = o.global_batch / (micro * o.dp);
  const int64_t bucket = vocab_padded * h + h + vocab_padded * h;  // 264, divisible by 2
  const int64_t shard = o.zero >= 1 ? bucket / o.dp : bucket;

  struct Buf {
    std::string name;
    BufferKind kind;
    DType dtype;
    std::vector<int64_t> shape;
    int view_of;
    int64_t view_offset;
  };
  std::vector<Buf> bufs;
  auto add = [&](std::string name, BufferKind kind, std::vector<int64_t> shape,
                 DType dt = DType::F32, int view_of = -1, int64_t view_offset = 0) {
    bufs.push_back({std::move(name), kind, dt, std::move(shape), view_of, view_offset});
    return static_cast<int>(bufs.size() - 1);
  };
  const int pb = add("params", BufferKind::Bucket, {bucket});
  const int gb = add("grads", BufferKind::Bucket, {bucket});
  const int emb = add("emb", BufferKind::Param, {vocab_padded, h}, DType::F32, pb, 0);
  const int nw = add("norm", BufferKind::Param, {h}, DType::F32, pb, vocab_padded * h);
  const int head =
      add("head", BufferKind::Param, {vocab_padded, h}, DType::F32, pb, vocab_padded * h + h);
  const int demb = add("emb.grad", BufferKind::Grad, {vocab_padded, h}, DType::F32, gb, 0);
  const int dnw = add("norm.grad", BufferKind::Grad, {h}, DType::F32, gb, vocab_padded * h);
  const int dhead =
      add("head.grad", BufferKind::Grad, {vocab_padded, h}, DType::F32, gb, vocab_padded * h + h);
  const int master = add("master", BufferKind::Optimizer, {shard});
  const int m1 = add("exp_avg", BufferKind::Optimizer, {shard});
  const int m2 = add("exp_avg_sq", BufferKind::Optimizer, {shard});
  const int ids = add("ids", BufferKind::Stash, {tokens}, DType::I32);
  const int labels = add("labels", BufferKind::Stash, {tokens}, DType::I32);
  const int x = add("x", BufferKind::Stash, {tokens, h});
  const int n = add("n", BufferKind::Stash, {tokens, h});
  const int rstd = add("rstd", BufferKind::Stash, {tokens});
  const int z = add("z", BufferKind::Stash, {tokens, vocab_padded});
  const int mx = add("m", BufferKind::Stash, {tokens});
  const int st = add("st", BufferKind::Stash, {tokens, 2});
  const int dz = add("dz", BufferKind::Scratch, {tokens, vocab_padded});
  const int dn = add("dn", BufferKind::Scratch, {tokens, h});
  const int dx = add("dx", BufferKind::Scratch, {tokens, h});
  const int loss = add("loss_sum", BufferKind::Persistent, {1});
  const int nsq = add("nsq", BufferKind::Persistent, {1});

  auto op = [&](OpKind k, std::vector<int32_t> in, std::vector<int32_t> out,
                CommKind c = CommKind::None, std::vector<int64_t> ints = {},
                std::vector<double> floats = {}) {
    return CreateOpDirect(b, k, &in, &out, c, &ints, &floats);
  };
  std::vector<flatbuffers::Offset<Body>> bodies;
  {
    std::vector<flatbuffers::Offset<Op>> ops = {
        op(OpKind::LoadBatch, {}, {ids}, CommKind::None, {0}),
        op(OpKind::LoadBatch, {}, {labels}, CommKind::None, {1}),
        op(OpKind::Embedding, {ids, emb}, {x}, CommKind::Tp),
        op(OpKind::RmsNorm, {x, nw}, {n, rstd}, CommKind::None, {}, {1e-5}),
        op(OpKind::Linear, {n, head}, {z}),
        op(OpKind::CrossEntropyMax, {z}, {mx}),
        op(OpKind::CrossEntropySumExp, {z, mx, labels}, {st}, CommKind::Tp),
        op(OpKind::CrossEntropyLoss, {mx, st}, {loss}, CommKind::None, {}, {1.0 / mbs}),
    };
    bodies.push_back(CreateBodyDirect(b, "chunk0.forward", &ops));
  }
  {
    std::vector<flatbuffers::Offset<Op>> ops = {
        op(OpKind::CrossEntropyBackward, {z, mx, st, labels}, {dz}, CommKind::Tp, {},
           {1.0 / (mbs * o.dp)}),
        op(OpKind::LinearBackward, {dz, n, head}, {dn, dhead}, CommKind::None, {0}),
        op(OpKind::RmsNormBackward, {dn, x, nw, rstd}, {dx, dnw}, CommKind::None, {0}),
        op(OpKind::EmbeddingBackward, {dx, ids}, {demb}, CommKind::Tp),
    };
    bodies.push_back(CreateBodyDirect(b, "chunk0.backward", &ops));
  }
  {
    std::vector<flatbuffers::Offset<Op>> ops = {
        op(OpKind::Fill, {}, {gb, loss}, CommKind::None, {}, {0.0})};
    bodies.push_back(CreateBodyDirect(b, "zero_grads", &ops));
  }
  {
    std::vector<flatbuffers::Offset<Op>> ops;
    if (o.dp > 1 && o.zero == 0)
      ops.push_back(op(OpKind::AllReduce, {gb}, {gb}, CommKind::Dp, {kReduceSum}));
    if (o.dp > 1 && o.zero >= 1)
      ops.push_back(op(OpKind::ReduceScatter, {gb}, {gb}, CommKind::Dp, {kReduceSum}));
    bodies.push_back(CreateBodyDirect(b, "reduce_grads", &ops));
  }
  {
    std::vector<flatbuffers::Offset<Op>> ops = {
        op(OpKind::GradNormSquare, {gb}, {nsq}, o.zero >= 1 ? CommKind::Dp : CommKind::None)};
    if (o.zero >= 1 && o.dp > 1)
      ops.push_back(op(OpKind::AllReduce, {nsq}, {nsq}, CommKind::World, {kReduceSum}));
    ops.push_back(op(OpKind::AdamW, {pb, gb, master, m1, m2, nsq}, {pb},
                     o.zero >= 1 ? CommKind::Dp : CommKind::None, {0}));
    if (o.zero >= 1 && o.dp > 1) ops.push_back(op(OpKind::AllGather, {pb}, {pb}, CommKind::Dp));
    if (o.dp > 1) ops.push_back(op(OpKind::AllReduce, {loss}, {loss}, CommKind::Dp, {kReduceAvg}));
    bodies.push_back(CreateBodyDirect(b, "optimizer_step", &ops));
  }
  std::vector<flatbuffers::Offset<Op>> schedule;
  schedule.push_back(op(OpKind::ZeroGrads, {}, {}, CommKind::None, {2}));
  for (int64_t mb = 0; mb < mbs; ++mb) {
    schedule.push_back(op(OpKind::Forward, {}, {}, CommKind::None, {mb, 0, 0}));
    schedule.push_back(op(OpKind::Backward, {}, {}, CommKind::None, {mb, 0, 0}));
  }
  schedule.push_back(op(OpKind::ReduceGrads, {}, {}, CommKind::None, {3}));
  schedule.push_back(op(OpKind::OptimizerStep, {}, {}, CommKind::None, {4}));

  // Placement: every non-view buffer after the previous one.
  std::vector<flatbuffers::Offset<Buffer>> fb_bufs;
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
    fb_bufs.push_back(CreateBufferDirect(b, bufs[i].name.c_str(), bufs[i].kind, bufs[i].dtype,
                                         &bufs[i].shape, offsets[i], elements * 4, 1, 0, offsets[i],
                                         elements * 4, 0, bufs[i].view_of, bufs[i].view_offset));
  }
  std::vector<int64_t> emb_shape = {vocab_padded, h}, norm_shape = {h};
  std::vector<flatbuffers::Offset<Param>> params = {
      CreateParamDirect(b, "embedding.word", 1, &emb_shape, -1, CommKind::None, InitKind::Normal,
                        0.5, emb, demb, 0, true),
      CreateParamDirect(b, "final_norm", 2, &norm_shape, -1, CommKind::None, InitKind::Ones, 0, nw,
                        dnw, 0, false),
      CreateParamDirect(b, "output", 3, &emb_shape, -1, CommKind::None, InitKind::Normal, 0.5, head,
                        dhead, 0, true)};
  std::vector<flatbuffers::Offset<BucketInfo>> buckets = {
      CreateBucketInfo(b, 0, pb, gb, bucket, shard, master, m1, m2, -1)};
  std::vector<flatbuffers::Offset<Chunk>> chunks = {
      CreateChunk(b, 0, 0, 0, 1, true, true, 0, 1, -1, -1, -1, 1)};
  std::vector<flatbuffers::Offset<Role>> roles = {
      CreateRoleDirect(b, "stage0", 0, &fb_bufs, &params, &buckets, &chunks, &bodies, &schedule,
                       offset, offset, offset)};
  std::vector<int32_t> all;
  for (int r = 0; r < o.dp; ++r) all.push_back(r);
  std::vector<flatbuffers::Offset<Communicator>> comms = {
      CreateCommunicatorDirect(b, CommKind::World, &all),
      CreateCommunicatorDirect(b, CommKind::Dp, &all)};
  std::vector<flatbuffers::Offset<Rank>> ranks;
  for (int r = 0; r < o.dp; ++r) {
    std::vector<int32_t> c(kCommKinds, -1);
    c[static_cast<int>(CommKind::World)] = 0;
    c[static_cast<int>(CommKind::Dp)] = 1;
    Coordinates coords(0, 0, 0, r, 0);
    ranks.push_back(CreateRankDirect(b, 0, &coords, &c));
  }
  auto model =
      CreateModelConfigDirect(b, "tiny", 1, h, 4 * h, 1, 1, h, vocab, vocab_padded, seq, micro);
  auto par = CreateParallelConfigDirect(b, 1, 1, 1, 1, 1, o.dp, false, o.zero, ScheduleKind::Gpipe,
                                        "tp-cp-ep-dp-pp");
  auto train = CreateTrainConfigDirect(b, o.steps, 7, o.global_batch, mbs, Precision::Fp32, 0.05,
                                       0.005, 2, 0.1, 0.9, 0.95, 1e-8, 1.0, "adamw", o.data.c_str(),
                                       o.checkpoint_dir.c_str(), o.checkpoint_every);
  auto program = CreateProgramDirect(b, kFormatVersion, "test", o.plan_name.c_str(), o.dp, model,
                                     par, train, &comms, &ranks, &roles);
  FinishProgramBuffer(b, program);
  return std::vector<uint8_t>(b.GetBufferPointer(), b.GetBufferPointer() + b.GetSize());
}

}  // namespace paraplan::exec::testing

#endif  // PARAPLAN_RUNTIME_EXEC_TINY_PROGRAM_H_
