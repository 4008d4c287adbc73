// Chunk and step bodies (see body.h). Every op written here is described in
// runtime/format/README.md; keep the two in step. The mixture-of-experts layers are in
// body_moe.cpp, multi-head latent attention in body_mla.cpp (RoleLowering: body_internal.h).
#include "compiler/lower/body.h"

#include <fmt/format.h>

#include <cmath>
#include <map>
#include <set>

#include "compiler/lower/body_internal.h"
#include "runtime/format/ops.h"

namespace paraplan::lower {

namespace attrs = prog::attrs;
using prog::BatchPart;
using prog::ReduceOp;

prog::DType ActivationType(prog::Precision precision) {
  switch (precision) {
    case prog::Precision::Fp32:
      return DType::F32;
    case prog::Precision::Fp16:
      return DType::F16;
    default:
      return DType::Bf16;
  }
}

constexpr int64_t kParamAlignElements = 64;  // each param starts 64-element aligned in its bucket

namespace detail {

RoleLowering::LayerSaved RoleLowering::LayerForward(const LayerParams& P, int32_t x, int32_t next) {
  const int64_t h = m_.hidden, hd = m_.head_dim;
  const int64_t heads = m_.heads / tp_, kv = m_.kv_heads / tp_;
  LayerSaved layer_saved;
  layer_saved.x = x;
  layer_saved.no1 = NormForward("attention_norm", P.n1, x);
  layer_saved.n1f = GatherSp(layer_saved.no1.y, "attention_norm.out_full", h);
  if (P.mla) {
    MlaForward(P, layer_saved);
  } else {
    // With query/key norms the projections land in q_pre / k_pre and the norms (each head's
    // head_dim columns a row) write q and k.
    const char* q_name = P.qk_norm ? "q.pre_norm" : "q";
    const char* k_name = P.qk_norm ? "k.pre_norm" : "k";
    layer_saved.q = Act(q_name, {tokens_, heads * hd});
    layer_saved.k = Act(k_name, {tokens_, kv * hd});
    layer_saved.v = Act("v", {tokens_, kv * hd});
    Emit(attrs::Linear{}, LinearInputs(layer_saved.n1f, P.wq, P.bq), {layer_saved.q});
    Emit(attrs::Linear{}, LinearInputs(layer_saved.n1f, P.wk, P.bk), {layer_saved.k});
    Emit(attrs::Linear{}, LinearInputs(layer_saved.n1f, P.wv, P.bv), {layer_saved.v});
    if (P.qk_norm) {
      layer_saved.q_pre = layer_saved.q;
      layer_saved.k_pre = layer_saved.k;
      layer_saved.qno =
          NormForward("attention.q_norm", P.qn, layer_saved.q_pre, tokens_ * heads, hd);
      layer_saved.kno = NormForward("attention.k_norm", P.kn, layer_saved.k_pre, tokens_ * kv, hd);
      layer_saved.q = layer_saved.qno.y;
      layer_saved.k = layer_saved.kno.y;
    }
    if (m_.position == prog::PositionKind::Rope) {
      Emit(attrs::Rope{.heads = heads, .head_dim = hd, .theta = m_.rope_theta}, {layer_saved.q},
           {layer_saved.q}, cp_comm_);
      Emit(attrs::Rope{.heads = kv, .head_dim = hd, .theta = m_.rope_theta}, {layer_saved.k},
           {layer_saved.k}, cp_comm_);
    }
    EmitAttentionCore("attention", layer_saved.q, layer_saved.k, layer_saved.v, layer_saved.o,
                      layer_saved.lse);
  }
  int32_t proj = Act("attention.proj", {tokens_, h});
  Emit(attrs::Linear{}, {layer_saved.o, P.wo.value}, {proj});
  int32_t pr = ReducePartial(proj, "attention.proj_sp", h);
  if (P.bo.value >= 0) Emit(attrs::AddBias{}, {pr, P.bo.value}, {pr});
  layer_saved.x1 = Act("residual1", {rows_, h});
  Emit(attrs::Add{}, {x, pr}, {layer_saved.x1});
  layer_saved.no2 = NormForward("mlp_norm", P.n2, layer_saved.x1);
  if (P.moe) {
    MoeForward(P, layer_saved, next);
    return layer_saved;
  }
  MlpActivations(P, layer_saved);
  if (next < 0) return layer_saved;
  int32_t down = Act("mlp.down", {tokens_, h});
  Emit(attrs::Linear{}, {layer_saved.a, P.w2.value}, {down});
  int32_t dr = ReducePartial(down, "mlp.down_sp", h);
  if (P.b2.value >= 0) Emit(attrs::AddBias{}, {dr, P.b2.value}, {dr});
  Emit(attrs::Add{}, {layer_saved.x1, dr}, {next});
  return layer_saved;
}

void RoleLowering::BuildChunk(int32_t index, const ChunkLayers& cl, Chunk& chunk) {
  chunk_ = index;
  layer_ = -1;
  chunk.index = index;
  chunk.stage = index * p_.pp + pipeline_rank_;
  chunk.first_layer = cl.first_layer;
  chunk.layers = cl.layers;
  chunk.has_embedding = cl.embedding;
  chunk.has_loss = cl.loss;
  const ChunkParams params = MakeChunkParams(cl);
  role_.bodies.push_back({fmt::format("chunk{}.forward", index), {}});
  chunk.forward = static_cast<int32_t>(role_.bodies.size() - 1);
  role_.bodies.push_back({fmt::format("chunk{}.backward", index), {}});
  chunk.backward = static_cast<int32_t>(role_.bodies.size() - 1);
  body_ = &role_.bodies[chunk.forward];
  const ChunkForward forward = EmitChunkForward(cl, params, chunk);
  body_ = &role_.bodies[chunk.backward];
  EmitChunkBackward(cl, params, forward, chunk);
  body_ = nullptr;
}

RoleLowering::ChunkParams RoleLowering::MakeChunkParams(const ChunkLayers& cl) {
  const int64_t h = m_.hidden;
  ChunkParams params;
  if (cl.embedding) {
    params.word = AddParam("embedding.word", 0, {m_.vocab_padded, h}, 0, prog::InitKind::Normal,
                           0.02, true, false, false);
    word_embedding_param_ = params.word.param;
    if (m_.position == prog::PositionKind::Learned)
      params.pos = AddParam("embedding.position", 1, {m_.seq_len, h}, -1, prog::InitKind::Normal,
                            0.02, true, true, p_.sp);
  }
  params.layers.resize(cl.layers);
  for (int32_t i = 0; i < cl.layers; ++i) params.layers[i] = MakeLayerParams(cl.first_layer + i);
  layer_ = -1;
  if (cl.loss) {
    params.final_norm = MakeNorm("final_norm", 2);
    params.out_w = MakeOutputWeight(cl.embedding);
    if (m_.mtp_layers > 0) MakeMtpParams(cl, params);
  }
  return params;
}

void RoleLowering::MakeDenseAttentionParams(int32_t layer_index, LayerParams& params) {
  const int64_t h = m_.hidden, hd = m_.head_dim;
  const bool bias = m_.bias;
  const std::string n = fmt::format("layers.{}.", layer_index);
  auto key = [&](int32_t j) { return LayerKey(layer_index, j); };
  params.wq = AddParam(n + "attention.wq", key(2), {m_.heads * hd, h}, 0, prog::InitKind::Normal,
                       0.02, true, false, false);
  params.wk = AddParam(n + "attention.wk", key(3), {m_.kv_heads * hd, h}, 0, prog::InitKind::Normal,
                       0.02, true, false, false);
  params.wv = AddParam(n + "attention.wv", key(4), {m_.kv_heads * hd, h}, 0, prog::InitKind::Normal,
                       0.02, true, false, false);
  if (bias) {
    params.bq = AddParam(n + "attention.bq", key(5), {m_.heads * hd}, 0, prog::InitKind::Zeros, 0,
                         false, false, false);
    params.bk = AddParam(n + "attention.bk", key(6), {m_.kv_heads * hd}, 0, prog::InitKind::Zeros,
                         0, false, false, false);
    params.bv = AddParam(n + "attention.bv", key(7), {m_.kv_heads * hd}, 0, prog::InitKind::Zeros,
                         0, false, false, false);
  }
  params.wo = AddParam(n + "attention.wo", key(8), {h, m_.heads * hd}, 1, prog::InitKind::Normal,
                       OutStd(), true, false, false);
  if (m_.qk_norm) {
    // One weight over head_dim for all heads, replicated over tp; each rank normalises its own
    // heads, so the gradient is the sum over Tp of every rank's part.
    params.qk_norm = true;
    params.qn = MakeNorm(n + "attention.q_norm", key(16), hd, /*grad_sync_tp=*/true);
    params.kn = MakeNorm(n + "attention.k_norm", key(18), hd, /*grad_sync_tp=*/true);
  }
  if (bias)
    params.bo =
        AddParam(n + "attention.bo", key(9), {h}, -1, prog::InitKind::Zeros, 0, false, true, p_.sp);
}

RoleLowering::LayerParams RoleLowering::MakeLayerParams(int32_t layer_index, int32_t kind_of) {
  const int64_t h = m_.hidden;
  const bool bias = m_.bias;
  layer_ = layer_index;
  const std::string n = fmt::format("layers.{}.", layer_index);
  auto key = [&](int32_t j) { return LayerKey(layer_index, j); };
  LayerParams params;
  params.n1 = MakeNorm(n + "attention_norm", key(0));
  if (m_.kv_lora_rank > 0) {
    params.mla = true;
    params.latent = MakeMlaParams(layer_index, &params.wo);
  } else {
    MakeDenseAttentionParams(layer_index, params);
  }
  params.n2 = MakeNorm(n + "mlp_norm", key(10));
  if (s_.moe.IsMoeLayer(kind_of >= 0 ? kind_of : layer_index)) {
    params.moe = true;
    params.experts = MakeMoeParams(layer_index);
    return params;
  }
  if (NonGated()) {
    params.w1 = AddParam(n + "mlp.fc1", key(12), {m_.ffn_hidden, h}, 0, prog::InitKind::Normal,
                         0.02, true, false, false);
    if (bias)
      params.b1 = AddParam(n + "mlp.b1", key(13), {m_.ffn_hidden}, 0, prog::InitKind::Zeros, 0,
                           false, false, false);
    params.w2 = AddParam(n + "mlp.fc2", key(14), {h, m_.ffn_hidden}, 1, prog::InitKind::Normal,
                         OutStd(), true, false, false);
  } else {
    params.w1 = AddParam(n + "mlp.w_gate", key(12), {m_.ffn_hidden, h}, 0, prog::InitKind::Normal,
                         0.02, true, false, false);
    params.w3 = AddParam(n + "mlp.w_up", key(13), {m_.ffn_hidden, h}, 0, prog::InitKind::Normal,
                         0.02, true, false, false);
    params.w2 = AddParam(n + "mlp.w_down", key(14), {h, m_.ffn_hidden}, 1, prog::InitKind::Normal,
                         OutStd(), true, false, false);
  }
  if (bias)
    params.b2 =
        AddParam(n + "mlp.b2", key(15), {h}, -1, prog::InitKind::Zeros, 0, false, true, p_.sp);
  return params;
}

RoleLowering::ParamRef RoleLowering::MakeOutputWeight(bool embedding) {
  const int64_t h = m_.hidden;
  if (!m_.tied_embeddings)
    return AddParam("output.weight", 4, {m_.vocab_padded, h}, 0, prog::InitKind::Normal, 0.02, true,
                    false, false);
  if (embedding || word_embedding_param_ >= 0) {
    const Param& word = role_.params[word_embedding_param_];
    return {word_embedding_param_, word.buffer, word.grad};
  }
  // The last stage's copy of the word embedding: same key (same initial values), its gradient
  // is summed with the first stage's over the Embedding group, counted once in the norm.
  const ParamRef copy =
      AddParam("embedding.word.tied_copy", 0, {m_.vocab_padded, h}, 0, prog::InitKind::Normal, 0.02,
               true, false, false, /*counts_in_norm=*/false);
  output_copy_param_ = copy.param;
  return copy;
}

RoleLowering::ChunkForward RoleLowering::EmitChunkForward(const ChunkLayers& cl,
                                                          const ChunkParams& params, Chunk& chunk) {
  const int64_t h = m_.hidden;
  ChunkForward forward;
  if (cl.embedding) {
    EmitEmbeddingForward(params, forward);
    chunk.input = -1;
  } else {
    forward.x = Act("input", {rows_, h});
    chunk.input = forward.x;
  }
  forward.layers.resize(cl.layers);
  for (int32_t i = 0; i < cl.layers; ++i) {
    layer_ = cl.first_layer + i;
    const bool last_of_chunk = i + 1 == cl.layers;
    const int32_t next = (last_of_chunk && !cl.loss)
                             ? Buf(fmt::format("chunk{}.output", chunk.index), {rows_, h}, act_)
                             : Act("out", {rows_, h});
    forward.layers[i] = LayerForward(params.layers[i], forward.x, next);
    forward.x = next;
  }
  layer_ = -1;
  chunk.output = -1;
  if (cl.loss) {
    EmitLossForward(params, forward);
    EmitMtpForward(params, forward);
  } else {
    chunk.output = forward.x;
  }
  return forward;
}

void RoleLowering::EmitEmbeddingForward(const ChunkParams& params, ChunkForward& forward) {
  const int64_t h = m_.hidden;
  forward.ids = Buf(Prefix() + "tokens", {tokens_}, DType::I32);
  Emit(attrs::LoadBatch{.what = BatchPart::kInputs}, {}, {forward.ids}, cp_comm_);
  const int32_t e = Act("embedding.out", {tokens_, h});
  Emit(attrs::Embedding{}, {forward.ids, params.word.value}, {e}, tp_comm_);
  forward.x = ReducePartial(e, "embedding.out_sp", h);
  if (params.pos.value >= 0)
    Emit(attrs::AddPosition{}, {forward.x, params.pos.value}, {forward.x}, PositionComm());
}

void RoleLowering::EmitLossForward(const ChunkParams& params, ChunkForward& forward) {
  forward.head = EmitHeadForward("", params.final_norm, forward.x, params.out_w, /*shift=*/0,
                                 loss_sum_, 1.0 / static_cast<double>(s_.microbatches));
}

RoleLowering::OutputHead RoleLowering::EmitHeadForward(const std::string& stem,
                                                       const NormParams& norm, int32_t x,
                                                       const ParamRef& out_w, int64_t shift,
                                                       int32_t loss_sum, double scale) {
  const int64_t h = m_.hidden, vocab_local = m_.vocab_padded / tp_;
  OutputHead head;
  head.x = x;
  head.norm = NormForward(stem + "final_norm", norm, x);
  head.nff = GatherSp(head.norm.y, stem + "final_norm.out_full", h);
  head.logits = Act(stem + "logits", {tokens_, vocab_local});
  Emit(attrs::Linear{}, {head.nff, out_w.value}, {head.logits});
  head.labels = Buf(Prefix() + stem + "labels", {tokens_}, DType::I32);
  Emit(attrs::LoadBatch{.what = BatchPart::kLabels, .shift = shift}, {}, {head.labels}, cp_comm_);
  EmitCrossEntropy(stem, head.logits, head.labels, loss_sum, scale, head.cmax, head.cst);
  return head;
}

void RoleLowering::EmitHeadBackward(const std::string& stem, const OutputHead& head,
                                    const NormParams& norm, const ParamRef& out_w,
                                    double grad_scale, int32_t more, int32_t dx) {
  const int64_t h = m_.hidden, vocab_local = m_.vocab_padded / tp_;
  const int32_t dz = Act(stem + "logits.grad", {tokens_, vocab_local});
  Emit(attrs::CrossEntropyBackward{.grad_scale = grad_scale},
       {head.logits, head.cmax, head.cst, head.labels}, {dz}, tp_comm_);
  const int32_t dnf = Act(stem + "final_norm.out_full.grad", {tokens_, h});
  Emit(attrs::LinearBackward{.dx_accumulate = false}, {dz, head.nff, out_w.value},
       {dnf, out_w.grad});
  const int32_t dn = ReduceGradToRows(dnf, stem + "final_norm.out.grad");
  if (more >= 0) Emit(attrs::Add{}, {dn, more}, {dn});
  NormBackward(norm, head.norm, head.x, dn, dx, /*accumulate=*/false);
}

void RoleLowering::EmitCrossEntropy(const std::string& stem, int32_t logits, int32_t labels,
                                    int32_t loss_sum, double scale, int32_t& cmax, int32_t& cst) {
  const int64_t rows = tokens_;
  cmax = Stat(stem + "loss.max", {rows});
  Emit(attrs::CrossEntropyMax{}, {logits}, {cmax});
  if (tp_ > 1) Emit(attrs::AllReduce{.reduce_op = ReduceOp::kMax}, {cmax}, {cmax}, CommKind::Tp);
  cst = Stat(stem + "loss.sumexp_target", {rows, 2});
  Emit(attrs::CrossEntropySumExp{}, {logits, cmax, labels}, {cst}, tp_comm_);
  if (tp_ > 1) Emit(attrs::AllReduce{}, {cst}, {cst}, CommKind::Tp);
  Emit(attrs::CrossEntropyLoss{.scale = scale}, {cmax, cst}, {loss_sum});
}

void RoleLowering::EmitChunkBackward(const ChunkLayers& cl, const ChunkParams& params,
                                     const ChunkForward& forward, Chunk& chunk) {
  const int64_t h = m_.hidden;
  const int32_t gx = Buf(fmt::format("chunk{}.grad", chunk.index), {rows_, h}, act_);
  chunk.grad = gx;
  if (cl.loss) EmitLossBackward(params, forward, gx);
  if (s_.recompute == ActivationRecompute::kFull) {
    RecomputedLayersBackward(cl, params, forward, gx);
  } else {
    for (int32_t i = cl.layers - 1; i >= 0; --i) {
      layer_ = cl.first_layer + i;
      LayerBackward(params.layers[i], forward.layers[i], gx, /*recompute=*/false);
    }
  }
  layer_ = -1;
  if (cl.embedding) {
    if (params.pos.value >= 0)
      Emit(attrs::AddPositionBackward{}, {gx}, {params.pos.grad}, PositionComm());
    const int32_t gfull = GatherSp(gx, "embedding.out.grad_full", h);
    Emit(attrs::EmbeddingBackward{}, {gfull, forward.ids}, {params.word.grad}, tp_comm_);
  }
}

void RoleLowering::EmitLossBackward(const ChunkParams& params, const ChunkForward& forward,
                                    int32_t gx) {
  // The MTP modules run after the model's loss; their backward comes first and hands back the
  // gradient of the final norm's output they read.
  const int32_t dmtp = m_.mtp_layers > 0 ? EmitMtpBackward(params, forward) : -1;
  EmitHeadBackward("", forward.head, params.final_norm, params.out_w,
                   1.0 / static_cast<double>(s_.microbatches * p_.dp * cp_), dmtp, gx);
}

void RoleLowering::RecomputedLayersBackward(const ChunkLayers& cl, const ChunkParams& params,
                                            const ChunkForward& forward, int32_t gx) {
  const RecomputeLayers& r = s_.recompute_layers;
  const int32_t n = cl.layers;
  if (r.layers <= 0 || r.block) {
    // Each layer from its own input: every layer, or the first r.layers of the chunk (block).
    for (int32_t i = n - 1; i >= 0; --i) {
      layer_ = cl.first_layer + i;
      LayerBackward(params.layers[i], forward.layers[i], gx, r.layers <= 0 || i < r.layers);
    }
    return;
  }
  // Uniform: groups of r.layers layers, last group first. The group's forward runs again from
  // its first layer's input, each layer's output feeding the next, then the group's backward.
  const int32_t groups = (n + r.layers - 1) / r.layers;
  for (int32_t g = groups - 1; g >= 0; --g) {
    const int32_t begin = g * r.layers, end = std::min(n, begin + r.layers);
    std::vector<LayerSaved> saved(static_cast<size_t>(end - begin));
    recompute_prefix_ = "recompute.";
    int32_t x = forward.layers[begin].x;
    for (int32_t i = begin; i < end; ++i) {
      layer_ = cl.first_layer + i;
      const bool last = i + 1 == end;
      const int32_t next = last ? -1 : Act("out", {rows_, m_.hidden});
      saved[i - begin] = LayerForward(params.layers[i], x, next);
      x = next;
    }
    recompute_prefix_.clear();
    for (int32_t i = end - 1; i >= begin; --i) {
      layer_ = cl.first_layer + i;
      LayerBackward(params.layers[i], saved[i - begin], gx, /*recompute=*/false, /*fresh=*/true);
    }
  }
}

void RoleLowering::LayerBackward(const LayerParams& params, const LayerSaved& stashed, int32_t gx,
                                 bool recompute, bool fresh) {
  LayerSaved saved = stashed;
  if (recompute) {
    // Re-run the layer's forward from its stashed input, then its backward.
    recompute_prefix_ = "recompute.";
    saved = LayerForward(params, stashed.x, /*next=*/-1);
    recompute_prefix_.clear();
  }
  // What the forward kept: each norm's output on the rank's rows, gathered again (under sequence
  // parallelism) just before the backward that reads the whole sequence, as Megatron's linears
  // keep their sharded input; with the layernorm module of selective recompute the norm's output
  // and statistics are made again from its input first.
  const bool kept = !recompute && !fresh;
  const bool norms = s_.recompute_layernorm && kept;
  if (kept) RemakeMlpInput(params, saved, norms);
  if (params.moe && s_.recompute_moe && !recompute) {
    // The moe module: the MoE block (router, dispatch, experts, shared experts) made again from
    // its kept input, up to the experts' output its backward starts from.
    recompute_prefix_ = "recompute.";
    MoeForward(params, saved, /*next=*/-1);
    recompute_prefix_.clear();
  }
  if (params.moe)
    MoeBackward(params, saved, gx);
  else
    MlpBackward(params, saved, gx);
  if (kept) {
    recompute_prefix_ = "recompute.";
    if (norms) saved.no1 = NormForward("attention_norm", params.n1, saved.x);
    saved.n1f = GatherSp(saved.no1.y, "attention_norm.out_full", m_.hidden);
    recompute_prefix_.clear();
  }
  if (params.mla)
    MlaBackward(params, saved, gx);
  else
    AttentionBackward(params, saved, gx);
}

void RoleLowering::RemakeMlpInput(const LayerParams& params, LayerSaved& saved, bool norm) {
  const int64_t h = m_.hidden;
  recompute_prefix_ = "recompute.";
  const int32_t old = saved.no2.y;
  if (norm) saved.no2 = NormForward("mlp_norm", params.n2, saved.x1);
  const int32_t xn = saved.no2.y;
  if (!params.moe) {
    // The MLP's gathered input (the mlp module gathers it again itself).
    if (!s_.recompute_mlp) saved.n2f = GatherSp(xn, "mlp_norm.out_full", h);
  } else if (s_.recompute_moe) {
    // The moe module's recomputed block derives what it reads from the norm's output itself.
  } else if (saved.n2f == old) {
    saved.n2f = xn;  // the shared experts read the norm's output itself
  } else if (saved.n2f >= 0 && saved.n2f != saved.moe.etp.x) {
    saved.n2f = GatherSp(xn, "mlp_norm.out_full", h);  // ... or its gathered sequence
  }
  recompute_prefix_.clear();
}

void RoleLowering::MlpActivations(const LayerParams& P, LayerSaved& saved) {
  const int64_t h = m_.hidden, ffn = m_.ffn_hidden / tp_;
  saved.n2f = GatherSp(saved.no2.y, "mlp_norm.out_full", h);
  if (NonGated()) {
    saved.g = Act("mlp.fc1_out", {tokens_, ffn});
    Emit(attrs::Linear{}, LinearInputs(saved.n2f, P.w1, P.b1), {saved.g});
    saved.a = Act("mlp.act", {tokens_, ffn});
    EmitActivation(saved.g, saved.a);
  } else {
    saved.g = Act("mlp.gate", {tokens_, ffn});
    saved.u = Act("mlp.up", {tokens_, ffn});
    Emit(attrs::Linear{}, {saved.n2f, P.w1.value}, {saved.g});
    Emit(attrs::Linear{}, {saved.n2f, P.w3.value}, {saved.u});
    saved.a = Act("mlp.act", {tokens_, ffn});
    Emit(attrs::SwiGlu{}, {saved.g, saved.u}, {saved.a});
  }
}

void RoleLowering::MlpBackward(const LayerParams& params, const LayerSaved& stashed, int32_t gx) {
  const int64_t h = m_.hidden, ffn = m_.ffn_hidden / tp_;
  // The mlp module of selective recompute: the MLP's tensors made again from its norm's output.
  LayerSaved saved = stashed;
  if (s_.recompute_mlp) {
    recompute_prefix_ = "recompute.";
    MlpActivations(params, saved);
    recompute_prefix_.clear();
  }
  const int32_t gxf = GatherSp(gx, "mlp.down.grad_full", h);
  if (params.b2.value >= 0) Emit(attrs::AddBiasBackward{}, {gx}, {params.b2.grad});
  const int32_t da = Act("mlp.act.grad", {tokens_, ffn});
  Emit(attrs::LinearBackward{.dx_accumulate = false}, {gxf, saved.a, params.w2.value},
       {da, params.w2.grad});
  const int32_t dn2f = Act("mlp_norm.out_full.grad", {tokens_, h});
  if (NonGated()) {
    const int32_t dg = Act("mlp.fc1_out.grad", {tokens_, ffn});
    EmitActivationBackward(da, saved.g, dg);
    Emit(attrs::LinearBackward{.dx_accumulate = false}, {dg, saved.n2f, params.w1.value},
         LinearGrads(dn2f, params.w1, params.b1));
  } else {
    const int32_t dg = Act("mlp.gate.grad", {tokens_, ffn});
    const int32_t du = Act("mlp.up.grad", {tokens_, ffn});
    Emit(attrs::SwiGluBackward{}, {da, saved.g, saved.u}, {dg, du});
    Emit(attrs::LinearBackward{.dx_accumulate = false}, {dg, saved.n2f, params.w1.value},
         {dn2f, params.w1.grad});
    Emit(attrs::LinearBackward{.dx_accumulate = true}, {du, saved.n2f, params.w3.value},
         {dn2f, params.w3.grad});
  }
  const int32_t dn2 = ReduceGradToRows(dn2f, "mlp_norm.out.grad");
  NormBackward(params.n2, saved.no2, saved.x1, dn2, gx, /*accumulate=*/true);
}

void RoleLowering::AttentionBackward(const LayerParams& params, const LayerSaved& saved,
                                     int32_t gx) {
  const int64_t h = m_.hidden, hd = m_.head_dim;
  const int64_t heads = m_.heads / tp_, kv = m_.kv_heads / tp_;
  const int32_t gxf = GatherSp(gx, "attention.proj.grad_full", h);
  if (params.bo.value >= 0) Emit(attrs::AddBiasBackward{}, {gx}, {params.bo.grad});
  const int32_t dout = Act("attention.out.grad", {tokens_, heads * hd});
  Emit(attrs::LinearBackward{.dx_accumulate = false}, {gxf, saved.o, params.wo.value},
       {dout, params.wo.grad});
  const int32_t dq = Act("q.grad", {tokens_, heads * hd});
  const int32_t dk = Act("k.grad", {tokens_, kv * hd});
  const int32_t dv = Act("v.grad", {tokens_, kv * hd});
  int32_t o = saved.o, lse = saved.lse;
  if (s_.recompute_core_attention) {
    // Recompute the attention core (its softmax statistics) from the stashed q, k, v.
    EmitAttentionCore("recompute.attention", saved.q, saved.k, saved.v, o, lse);
  }
  EmitAttentionCoreBackward(dout, saved, o, lse, dq, dk, dv);
  if (m_.position == prog::PositionKind::Rope) {
    Emit(attrs::RopeBackward{.heads = heads, .head_dim = hd, .theta = m_.rope_theta}, {dq}, {dq},
         cp_comm_);
    Emit(attrs::RopeBackward{.heads = kv, .head_dim = hd, .theta = m_.rope_theta}, {dk}, {dk},
         cp_comm_);
  }
  int32_t dq_in = dq, dk_in = dk;  // the gradients of the projections' outputs
  if (params.qk_norm) {
    dq_in = Act("q.pre_norm.grad", {tokens_, heads * hd});
    dk_in = Act("k.pre_norm.grad", {tokens_, kv * hd});
    NormBackward(params.qn, saved.qno, saved.q_pre, dq, dq_in, /*accumulate=*/false);
    NormBackward(params.kn, saved.kno, saved.k_pre, dk, dk_in, /*accumulate=*/false);
  }
  const int32_t dn1f = Act("attention_norm.out_full.grad", {tokens_, h});
  Emit(attrs::LinearBackward{.dx_accumulate = false}, {dq_in, saved.n1f, params.wq.value},
       LinearGrads(dn1f, params.wq, params.bq));
  Emit(attrs::LinearBackward{.dx_accumulate = true}, {dk_in, saved.n1f, params.wk.value},
       LinearGrads(dn1f, params.wk, params.bk));
  Emit(attrs::LinearBackward{.dx_accumulate = true}, {dv, saved.n1f, params.wv.value},
       LinearGrads(dn1f, params.wv, params.bv));
  const int32_t dn1 = ReduceGradToRows(dn1f, "attention_norm.out.grad");
  NormBackward(params.n1, saved.no1, saved.x, dn1, gx, /*accumulate=*/true);
}

// Classify: a non-parameter buffer that both bodies of its chunk touch is kept per microbatch.
void RoleLowering::ClassifyStash() {
  std::vector<uint8_t> seen(role_.buffers.size(), 0);  // bit 0: forward, bit 1: backward
  for (const Chunk& c : role_.chunks) {
    for (int which = 0; which < 2; ++which) {
      const Body& body = role_.bodies[which == 0 ? c.forward : c.backward];
      for (const Op& op : body.ops) {
        for (const auto* list : {&op.inputs, &op.outputs})
          for (int32_t b : *list)
            if (b >= 0) seen[b] |= static_cast<uint8_t>(1 << which);  // -1: operand left out
      }
    }
    for (int32_t b : {c.input, c.output, c.grad})
      if (b >= 0) seen[b] = 3;
  }
  for (size_t b = 0; b < role_.buffers.size(); ++b) {
    Buffer& buf = role_.buffers[b];
    if (buf.kind == BufferKind::Scratch && seen[b] == 3) buf.kind = BufferKind::Stash;
  }
}

// Buckets: with ZeRO 0/1 (or dp · cp = 1) one flat region of a chunk's params and one of its grads.
// With ZeRO >= 2 on dp · cp > 1 one bucket per layer and per chunk-level tensor (word embedding or
// its tied copy, position table, final norm, output layer), so that a layer's full grads (and with
// ZeRO-3 its gathered params) exist only while the layer runs; the word embedding and its tied
// copy then have buckets of the same size on both stages, and their grad shards line up for
// the Embedding-group all-reduce.
void RoleLowering::BuildBuckets() {
  auto make = [&](int32_t chunk, const std::vector<int32_t>& members, const std::string& name) {
    // The ZeRO group: dp · cp, or for the experts' params (ExpertsOverEdp) the Edp group.
    const bool experts = !members.empty() && IsExpertSharded(members.front());
    const int64_t dp = experts ? edp_ : shard_;
    Bucket bucket;
    bucket.chunk = chunk;
    int64_t elements = 0;
    for (int32_t i : members) {
      const Param& prm = role_.params[i];
      elements = (elements + kParamAlignElements - 1) / kParamAlignElements * kParamAlignElements;
      role_.buffers[prm.buffer].view_offset = elements;
      role_.buffers[prm.grad].view_offset = elements;
      elements += role_.buffers[prm.buffer].Elements();
    }
    elements = std::max<int64_t>(elements, 1);
    elements = (elements + dp - 1) / dp * dp;
    bucket.elements = elements;
    bucket.shard_elements = p_.zero >= 1 ? elements / dp : elements;
    chunk_ = chunk;
    layer_ = -1;
    bucket.params = Buf(name + ".params", {elements}, act_, BufferKind::Bucket);
    bucket.grads = Buf(name + ".grads", {elements}, s_.grad_type, BufferKind::Bucket);
    for (int32_t i : members) {
      role_.buffers[role_.params[i].buffer].view_of = bucket.params;
      role_.buffers[role_.params[i].grad].view_of = bucket.grads;
    }
    bucket.master =
        Buf(name + ".master", {bucket.shard_elements}, DType::F32, BufferKind::Optimizer);
    bucket.exp_avg =
        Buf(name + ".exp_avg", {bucket.shard_elements}, DType::F32, BufferKind::Optimizer);
    bucket.exp_avg_sq =
        Buf(name + ".exp_avg_sq", {bucket.shard_elements}, DType::F32, BufferKind::Optimizer);
    if (gather_params_)
      bucket.param_shard =
          Buf(name + ".param_shard", {bucket.shard_elements}, act_, BufferKind::Param);
    if (shard_grads_)
      bucket.grad_shard =
          Buf(name + ".grad_shard", {bucket.shard_elements}, s_.grad_type, BufferKind::Grad);
    role_.buckets.push_back(bucket);
  };
  for (const Chunk& c : role_.chunks) {
    std::vector<std::string> groups;  // in param order
    std::map<std::string, std::vector<int32_t>> members;
    for (int32_t i = 0; i < static_cast<int32_t>(role_.params.size()); ++i) {
      if (role_.params[i].chunk != c.index) continue;
      // The experts (ExpertsOverEdp) keep a bucket of their own (with ZeRO >= 2 one per layer):
      // their grads reduce over Edp.
      const std::string experts = IsExpertSharded(i) ? "experts" : "";
      const std::string group =
          shard_grads_ ? param_group_[i] + (experts.empty() ? "" : "." + experts) : experts;
      if (!members.count(group)) groups.push_back(group);
      members[group].push_back(i);
    }
    if (groups.empty()) groups.push_back(std::string());
    for (const std::string& g : groups)
      make(c.index, members[g],
           g.empty() ? fmt::format("chunk{}", c.index) : fmt::format("chunk{}.{}", c.index, g));
  }
  chunk_ = -1;
}

// ZeRO >= 2 on dp · cp > 1: the buckets' full forms live only inside the bodies. Before the first
// op of a body that reads a param of a ZeRO-3 bucket, the bucket is all-gathered from the shards;
// before the first op that writes a grad of a bucket, the grad bucket is zeroed; after the last
// op that writes it, the sequence-parallel partial sums of its params are completed over Tp
// and the bucket is reduce-scattered over Dp (DpCp with cp > 1), adding the owned piece to the
// persistent shard (the gradient is reduced per microbatch and layer, as DeepSpeed's ZeRO-2/3 do).
void RoleLowering::ScopeBucketsInBodies() {
  std::vector<int32_t> bucket_of(role_.buffers.size(), -1);  // view or bucket buffer -> bucket
  std::vector<uint8_t> is_grad(role_.buffers.size(), 0);
  for (int32_t k = 0; k < static_cast<int32_t>(role_.buckets.size()); ++k) {
    const Bucket& b = role_.buckets[k];
    if (gather_params_) bucket_of[b.params] = k;
    bucket_of[b.grads] = k;
    is_grad[b.grads] = 1;
  }
  for (size_t i = 0; i < role_.buffers.size(); ++i) {
    const Buffer& buf = role_.buffers[i];
    if (buf.view_of >= 0 && bucket_of[buf.view_of] >= 0) {
      bucket_of[i] = bucket_of[buf.view_of];
      is_grad[i] = is_grad[buf.view_of];
    }
  }
  chunk_ = -1;
  layer_ = -1;
  for (const Chunk& c : role_.chunks) {
    for (int32_t body_index : {c.forward, c.backward}) {
      Body& body = role_.bodies[body_index];
      std::vector<Op> ops = std::move(body.ops);
      body.ops.clear();
      body_ = &body;
      // Last op that touches each grad bucket.
      std::map<int32_t, size_t> last_grad;
      for (size_t i = 0; i < ops.size(); ++i)
        for (const auto* list : {&ops[i].inputs, &ops[i].outputs})
          for (int32_t x : *list)
            if (x >= 0 && bucket_of[x] >= 0 && is_grad[x]) last_grad[bucket_of[x]] = i;
      std::set<int32_t> gathered, opened;
      for (size_t i = 0; i < ops.size(); ++i) {
        for (const auto* list : {&ops[i].inputs, &ops[i].outputs}) {
          for (int32_t x : *list) {
            if (x < 0 || bucket_of[x] < 0) continue;
            const int32_t k = bucket_of[x];
            const Bucket& b = role_.buckets[k];
            if (is_grad[x] && opened.insert(k).second)
              Emit(attrs::Fill{.value = 0.0}, {}, {b.grads});
            if (!is_grad[x] && gathered.insert(k).second) GatherBucket(b);
          }
        }
        body.ops.push_back(ops[i]);
        for (const auto& [k, last] : last_grad) {
          if (last != i) continue;
          const Bucket& b = role_.buckets[k];
          for (const Param& prm : role_.params)
            if (prm.grad_sync_tp && role_.buffers[prm.grad].view_of == b.grads)
              Emit(attrs::AllReduce{}, {prm.grad}, {prm.grad}, CommKind::Tp);
          ReduceBucketIntoShard(b);
        }
      }
    }
  }
  body_ = nullptr;
}

// ZeRO 3: a bucket's full params from the shards, over its ZeRO group (an expert bucket's Edp
// group, which may be one rank: then the shard is the whole bucket).
void RoleLowering::GatherBucket(const Bucket& b) {
  if (IsExpertBucket(b) && edp_ <= 1)
    Emit(attrs::Copy{}, {b.param_shard}, {b.params});
  else
    Emit(attrs::AllGather{}, {b.param_shard}, {b.params},
         IsExpertBucket(b) ? CommKind::Edp : shard_comm_);
}

// ZeRO >= 2: a bucket's full grads reduced into the rank's persistent shard, added to it.
void RoleLowering::ReduceBucketIntoShard(const Bucket& b) {
  if (IsExpertBucket(b) && edp_ <= 1)
    Emit(attrs::Add{}, {b.grad_shard, b.grads}, {b.grad_shard});
  else
    Emit(attrs::ReduceScatter{.reduce_op = ReduceOp::kSum, .accumulate = true}, {b.grads},
         {b.grad_shard}, IsExpertBucket(b) ? CommKind::Edp : shard_comm_);
}

// The global gradient norm's square into nsq (the optimizer body's first ops).
void RoleLowering::EmitGradNormSquare(int32_t nsq, bool sharded) {
  std::vector<int32_t> grads;
  for (const Bucket& b : role_.buckets) grads.push_back(shard_grads_ ? b.grad_shard : b.grads);
  int64_t world = static_cast<int64_t>(p_.tp) * p_.pp * p_.dp * p_.cp;
  // Hybrid sharding: the replicas hold the same shards; sum one replica's (the Shard group's) and
  // the model-parallel ranks'.
  auto sum_one_replica = [&](int32_t x) {
    Emit(attrs::AllReduce{.reduce_op = ReduceOp::kSum}, {x}, {x}, CommKind::Shard);
    if (p_.tp * p_.pp > 1)
      Emit(attrs::AllReduce{.reduce_op = ReduceOp::kSum}, {x}, {x}, CommKind::Mp);
  };
  if (ExpertsOverEdp() && replicate_ > 1) {
    // Hybrid sharding beside experts over Edp: the dense shards repeat on every replica (summed
    // over one replica's Shard group and the model-parallel ranks), the experts' shards partition
    // their buckets over Edp (summed over the world); every rank runs both sums.
    std::vector<int32_t> dense, experts;
    for (size_t i = 0; i < role_.buckets.size(); ++i)
      (IsExpertBucket(role_.buckets[i]) ? experts : dense).push_back(grads[i]);
    Emit(attrs::GradNormSquare{}, dense, {nsq}, shard_comm_);
    sum_one_replica(nsq);
    const int32_t expert_nsq =
        Buf("grad_norm_square.experts", {1}, DType::F32, BufferKind::Persistent);
    if (experts.empty())
      Emit(attrs::Fill{.value = 0.0}, {}, {expert_nsq});
    else
      Emit(attrs::GradNormSquare{.count_once = true}, experts, {expert_nsq});
    Emit(attrs::AllReduce{.reduce_op = ReduceOp::kSum}, {expert_nsq}, {expert_nsq},
         CommKind::World);
    Emit(attrs::Add{}, {nsq, expert_nsq}, {nsq});
  } else if (ExpertsOverEdp()) {
    // Experts are split over Ep and replicated over Edp: each element is counted on one rank
    // of those holding it (under ZeRO 1 by the owned shards), then summed over the world.
    Emit(attrs::GradNormSquare{.count_once = true}, grads, {nsq});
    Emit(attrs::AllReduce{.reduce_op = ReduceOp::kSum}, {nsq}, {nsq}, CommKind::World);
  } else {
    Emit(attrs::GradNormSquare{}, grads, {nsq}, sharded ? shard_comm_ : CommKind::None);
    if (sharded && replicate_ > 1) {
      sum_one_replica(nsq);
    } else if (sharded) {
      if (world > 1)
        Emit(attrs::AllReduce{.reduce_op = ReduceOp::kSum}, {nsq}, {nsq}, CommKind::World);
    } else if (p_.tp * p_.pp > 1) {
      Emit(attrs::AllReduce{.reduce_op = ReduceOp::kSum}, {nsq}, {nsq}, CommKind::Mp);
    }
  }
}

StepBodies RoleLowering::BuildStepBodies() {
  StepBodies sb;
  const bool sharded = p_.zero >= 1 && shard_ > 1;
  chunk_ = -1;
  layer_ = -1;
  // Zero grads.
  role_.bodies.push_back({"zero_grads", {}});
  sb.zero_grads = static_cast<int32_t>(role_.bodies.size() - 1);
  body_ = &role_.bodies.back();
  {
    std::vector<int32_t> outs;
    for (const Bucket& b : role_.buckets) outs.push_back(shard_grads_ ? b.grad_shard : b.grads);
    outs.push_back(loss_sum_);
    if (mtp_loss_sum_ >= 0) outs.push_back(mtp_loss_sum_);
    Emit(attrs::Fill{.value = 0.0}, {}, outs);
  }
  // Reduce grads: sequence-parallel partials over Tp, tied embedding over Embedding, then Dp.
  role_.bodies.push_back({"reduce_grads", {}});
  sb.reduce_grads = static_cast<int32_t>(role_.bodies.size() - 1);
  body_ = &role_.bodies.back();
  // (With sharded grads the Tp and Dp reductions already ran at the end of every backward body.)
  if (!shard_grads_)
    for (const Param& prm : role_.params)
      if (prm.grad_sync_tp) Emit(attrs::AllReduce{}, {prm.grad}, {prm.grad}, CommKind::Tp);
  if ((m_.tied_embeddings || m_.mtp_layers > 0) && p_.pp > 1) {
    int32_t prm = word_embedding_param_ >= 0 ? word_embedding_param_ : output_copy_param_;
    if (prm >= 0) {
      int32_t g = role_.params[prm].grad;
      if (shard_grads_) {
        // The embedding's own bucket: the same shard layout on the first and the last stage.
        for (const Bucket& b : role_.buckets)
          if (role_.buffers[g].view_of == b.grads) g = b.grad_shard;
      }
      Emit(attrs::AllReduce{.reduce_op = ReduceOp::kSum}, {g}, {g}, CommKind::Embedding);
    }
  }
  // Context-parallel ranks hold the same weights: grads are summed (or reduce-scattered under
  // ZeRO) over DpCp.
  // Under hybrid sharding the replicas' sums first (ZeRO 1: over the whole bucket, then the
  // Shard group's reduce-scatter; ZeRO 2/3: over the shards the bodies reduced into).
  const CommKind grad_comm = shard_comm_;
  if (p_.dp * cp_ > 1 && !shard_grads_) {
    for (const Bucket& b : role_.buckets) {
      if (IsExpertBucket(b)) continue;
      if (replicate_ > 1) Emit(attrs::AllReduce{}, {b.grads}, {b.grads}, CommKind::Replicate);
      if (sharded)
        Emit(attrs::ReduceScatter{.reduce_op = ReduceOp::kSum}, {b.grads}, {b.grads}, grad_comm);
      else
        Emit(attrs::AllReduce{.reduce_op = ReduceOp::kSum}, {b.grads}, {b.grads}, grad_comm);
    }
  }
  if (shard_grads_ && replicate_ > 1)
    for (const Bucket& b : role_.buckets)
      if (!IsExpertBucket(b))
        Emit(attrs::AllReduce{}, {b.grad_shard}, {b.grad_shard}, CommKind::Replicate);
  EmitExpertGradReduction();
  // Optimizer step.
  role_.bodies.push_back({"optimizer_step", {}});
  sb.optimizer_step = static_cast<int32_t>(role_.bodies.size() - 1);
  body_ = &role_.bodies.back();
  const int32_t nsq = Buf("grad_norm_square", {1}, DType::F32, BufferKind::Persistent);
  EmitGradNormSquare(nsq, sharded);
  for (const Bucket& b : role_.buckets) {
    // ZeRO-3: the gathered bucket is released here; the update reads and writes shards only.
    int32_t params = gather_params_ ? b.param_shard : b.params;
    int32_t grads = shard_grads_ ? b.grad_shard : b.grads;
    const std::vector<int32_t> in = {params, grads, b.master, b.exp_avg, b.exp_avg_sq, nsq};
    // The experts' buckets shard over Edp (with ep = 1, ZeRO >= 2 keeps the experts beside the
    // dense params).
    const bool experts = IsExpertBucket(b);
    const bool shards = experts ? p_.zero >= 1 && edp_ > 1 : sharded;
    const CommKind group = experts ? CommKind::Edp : shard_comm_;
    const CommKind comm = shards ? group : CommKind::None;
    if (s_.sgd)
      Emit(attrs::Sgd{.chunk = b.chunk}, in, {params}, comm);
    else
      Emit(attrs::AdamW{.chunk = b.chunk}, in, {params}, comm);
    if (shards && !gather_params_) Emit(attrs::AllGather{}, {b.params}, {b.params}, group);
  }
  // Aux-loss-free balancing: every rank of a stage moves its layers' biases by the step's load
  // over all its tokens (each microbatch's counts already cover Tp under sp and Cp).
  for (const ExpertBias& eb : expert_bias_) {
    if (p_.dp > 1) Emit(attrs::AllReduce{}, {eb.load}, {eb.load}, CommKind::Dp);
    Emit(attrs::MoeExpertBiasUpdate{.experts = s_.moe.experts, .rate = s_.moe.bias_rate},
         {eb.bias, eb.load}, {eb.bias, eb.load});
  }
  bool has_loss = false;
  for (const Chunk& c : role_.chunks) has_loss |= c.has_loss;
  // Each Cp rank's loss is the mean over its part of the tokens: the step's loss averages DpCp.
  if (has_loss && p_.dp * cp_ > 1)
    for (int32_t sum : {loss_sum_, mtp_loss_sum_})
      if (sum >= 0)
        Emit(attrs::AllReduce{.reduce_op = ReduceOp::kAvg}, {sum}, {sum},
             cp_ > 1 ? CommKind::DpCp : CommKind::Dp);
  // ZeRO-3 gathers inside the chunk bodies (ScopeBucketsInBodies); no GatherParams bodies.
  body_ = nullptr;
  return sb;
}

StepBodies RoleLowering::Build(const std::vector<ChunkLayers>& chunks) {
  role_.pipeline_rank = pipeline_rank_;
  role_.name = fmt::format("stage{}", pipeline_rank_);
  loss_sum_ = Buf("loss_sum", {1}, DType::F32, BufferKind::Persistent);
  bool loss_role = false;
  for (const ChunkLayers& c : chunks) loss_role |= c.loss;
  if (m_.mtp_layers > 0 && loss_role)
    mtp_loss_sum_ = Buf("mtp_loss_sum", {1}, DType::F32, BufferKind::Persistent);
  for (size_t i = 0; i < chunks.size(); ++i) {
    Chunk c;
    BuildChunk(static_cast<int32_t>(i), chunks[i], c);
    role_.chunks.push_back(c);
  }
  chunk_ = -1;
  ClassifyStash();
  BuildBuckets();
  if (shard_grads_) ScopeBucketsInBodies();
  return BuildStepBodies();
}

}  // namespace detail

StepBodies BuildRoleBodies(const BodyShape& shape, int32_t pipeline_rank,
                           const std::vector<ChunkLayers>& chunks, Role& role) {
  detail::RoleLowering lowering(shape, pipeline_rank, role);
  return lowering.Build(chunks);
}

}  // namespace paraplan::lower
