// RoleLowering's multi-token prediction (body.h, "Multi-token prediction"): the modules' params,
// forward and backward on the loss chunk. See body_internal.h.
#include <fmt/format.h>

#include <algorithm>

#include "compiler/lower/body_internal.h"

namespace paraplan::lower::detail {

using prog::BatchPart;

// --- multi-token prediction (body.h, "Multi-token prediction") ------------------------------

void RoleLowering::MakeMtpParams(const ChunkLayers& cl, ChunkParams& params) {
  const int64_t h = m_.hidden;
  // The word embedding the modules look their shifted inputs up in: this role's own, the tied
  // copy the output layer already reads, or a copy of its own kept equal the same way.
  if (cl.embedding) {
    params.mtp_word = params.word;
  } else if (m_.tied_embeddings) {
    params.mtp_word = params.out_w;
  } else {
    params.mtp_word = AddParam("embedding.word.mtp_copy", 0, {m_.vocab_padded, h}, 0,
                               prog::InitKind::Normal, 0.02, true, false, false,
                               /*counts_in_norm=*/false);
    output_copy_param_ = params.mtp_word.param;
  }
  for (int32_t depth = 1; depth <= m_.mtp_layers; ++depth) {
    MtpParams mp;
    mp.layer_index = m_.layers + depth - 1;
    layer_ = mp.layer_index;  // one ZeRO bucket group per module, as a layer
    const std::string n = fmt::format("mtp.{}.", depth - 1);
    auto key = [&](int32_t j) { return LayerKey(mp.layer_index, j); };
    mp.enorm = MakeNorm(n + "enorm", key(50));
    mp.hnorm = MakeNorm(n + "hnorm", key(52));
    // Replicated over tp (Megatron-Core splits it by columns; the product is the same): each rank
    // projects its own rows, so under sequence parallelism the gradient is summed over Tp.
    mp.proj = AddParam(n + "eh_proj", key(54), {h, 2 * h}, -1, prog::InitKind::Normal, 0.02, true,
                       true, p_.sp);
    mp.layer = MakeLayerParams(mp.layer_index, m_.layers - 1);
    layer_ = mp.layer_index;
    mp.final_norm = MakeNorm(n + "final_norm", key(56));
    params.mtp.push_back(std::move(mp));
  }
  layer_ = -1;
}

// seq / (seq - depth): the rows over the positions depth k's labels do not ignore.
double RoleLowering::KeptShare(int32_t depth) const {
  const int64_t kept = std::max<int64_t>(1, m_.seq_len - depth);
  return static_cast<double>(m_.seq_len) / static_cast<double>(kept);
}

// Depth k (1-based) reads the rows the previous depth ended with (the model's final norm output
// first), the embedding of the tokens k positions ahead, and predicts the token k + 1 ahead.
void RoleLowering::EmitMtpForward(const ChunkParams& params, ChunkForward& forward) {
  const int64_t h = m_.hidden;
  const double depths = static_cast<double>(m_.mtp_layers);
  int32_t hidden = forward.head.norm.y;
  for (int32_t depth = 1; depth <= m_.mtp_layers; ++depth) {
    const MtpParams& mp = params.mtp[depth - 1];
    MtpForward f;
    f.hidden = hidden;
    const std::string n = fmt::format("mtp{}.", depth - 1);
    f.ids = Buf(Prefix() + n + "tokens", {tokens_}, DType::I32);
    Emit(attrs::LoadBatch{.what = BatchPart::kInputs, .shift = depth}, {}, {f.ids}, cp_comm_);
    const int32_t e = Act(n + "embedding.out", {tokens_, h});
    Emit(attrs::Embedding{}, {f.ids, params.mtp_word.value}, {e}, tp_comm_);
    f.e = ReducePartial(e, n + "embedding.out_sp", h);
    f.en = NormForward(n + "enorm", mp.enorm, f.e);
    f.hn = NormForward(n + "hnorm", mp.hnorm, hidden);
    // [embedding, hidden] side by side, as Megatron-Core concatenates them.
    f.cat = Act(n + "concat", {rows_, 2 * h});
    Emit(Columns(1, h, h, 0, 0, 2 * h, 0, 0), {f.en.y}, {f.cat});
    Emit(Columns(1, h, h, 0, 0, 2 * h, 0, h), {f.hn.y}, {f.cat});
    f.x = Act(n + "proj", {rows_, h});
    Emit(attrs::Linear{}, {f.cat, mp.proj.value}, {f.x});
    layer_ = mp.layer_index;
    const int32_t out = Act("out", {rows_, h});
    f.layer = LayerForward(mp.layer, f.x, out);
    layer_ = -1;
    // The reported MTP loss: the mean over the modules of each one's mean token loss, over the
    // positions not ignored (the kernels divide by every row, the last `depth` of each sequence
    // ignored: whichever Cp rank holds them, the mean is the sequences').
    f.head = EmitHeadForward(n, mp.final_norm, out, params.out_w, depth, mtp_loss_sum_,
                             KeptShare(depth) / (static_cast<double>(s_.microbatches) * depths));
    hidden = f.head.norm.y;
    forward.mtp.push_back(f);
  }
}

int32_t RoleLowering::EmitMtpBackward(const ChunkParams& params, const ChunkForward& forward) {
  const int64_t h = m_.hidden;
  // Each module's loss weighs mtp_loss_scale / mtp_layers beside the model's.
  const double weight = m_.mtp_loss_scale / static_cast<double>(m_.mtp_layers);
  const bool recompute = s_.recompute == ActivationRecompute::kFull && !s_.recompute_layers.block;
  int32_t dnext = -1;  // the gradient of the rows the next module started from
  for (int32_t depth = m_.mtp_layers; depth >= 1; --depth) {
    const MtpParams& mp = params.mtp[depth - 1];
    const MtpForward& f = forward.mtp[depth - 1];
    const std::string n = fmt::format("mtp{}.", depth - 1);
    const int32_t gx = Act(n + "out.grad", {rows_, h});
    EmitHeadBackward(n, f.head, mp.final_norm, params.out_w,
                     weight * KeptShare(depth) / static_cast<double>(s_.microbatches * p_.dp * cp_),
                     dnext, gx);
    layer_ = mp.layer_index;
    LayerBackward(mp.layer, f.layer, gx, recompute);  // gx: now the gradient of f.x
    layer_ = -1;
    const int32_t dcat = Act(n + "concat.grad", {rows_, 2 * h});
    Emit(attrs::LinearBackward{.dx_accumulate = false}, {gx, f.cat, mp.proj.value},
         {dcat, mp.proj.grad});
    const int32_t den = Act(n + "enorm.out.grad", {rows_, h});
    const int32_t dhn = Act(n + "hnorm.out.grad", {rows_, h});
    Emit(Reversed(Columns(1, h, h, 0, 0, 2 * h, 0, 0), false), {dcat}, {den});
    Emit(Reversed(Columns(1, h, h, 0, 0, 2 * h, 0, h), false), {dcat}, {dhn});
    const int32_t de = Act(n + "embedding.out_sp.grad", {rows_, h});
    NormBackward(mp.enorm, f.en, f.e, den, de, /*accumulate=*/false);
    const int32_t dfull = GatherSp(de, n + "embedding.out.grad_full", h);
    Emit(attrs::EmbeddingBackward{}, {dfull, f.ids}, {params.mtp_word.grad}, tp_comm_);
    dnext = Act(n + "hidden.grad", {rows_, h});
    NormBackward(mp.hnorm, f.hn, f.hidden, dhn, dnext, /*accumulate=*/false);
  }
  return dnext;
}

// --- end multi-token prediction ---

}  // namespace paraplan::lower::detail
