// RoleLowering's multi-head latent attention (body.h, "Multi-head latent attention"): params,
// forward, attention core and backward. See body_internal.h.
#include <fmt/format.h>

#include <cmath>

#include "compiler/lower/body_internal.h"

namespace paraplan::lower::detail {

// --- multi-head latent attention (body.h, "Multi-head latent attention") ----------------------

RoleLowering::MlaParams RoleLowering::MakeMlaParams(int32_t layer_index, ParamRef* wo) {
  const int64_t h = m_.hidden, heads = m_.heads;
  const int64_t qk = m_.qk_nope_head_dim + m_.qk_rope_head_dim;
  const int64_t ql = m_.q_lora_rank, kvl = m_.kv_lora_rank, rope = m_.qk_rope_head_dim;
  const std::string n = fmt::format("layers.{}.attention.", layer_index);
  auto key = [&](int32_t j) { return LayerKey(layer_index, j); };
  auto latent_norm = [&](const std::string& name, int64_t dim, int32_t j) {
    // Replicated over tp like the down projections; the gradient each rank computes is the part
    // of its own heads, summed over Tp.
    NormParams np;
    np.w = AddParam(n + name + ".weight", key(j), {dim}, -1, prog::InitKind::Ones, 0, false, true,
                    true);
    return np;
  };
  MlaParams params;
  // Down projections and their norms: replicated (every rank needs the whole latent rows);
  // up projections column-parallel by heads.
  if (ql > 0) {
    params.wq_down = AddParam(n + "wq_down", key(30), {ql, h}, -1, prog::InitKind::Normal, 0.02,
                              true, true, true);
    params.q_norm = latent_norm("q_norm", ql, 31);
    params.wq_up = AddParam(n + "wq_up", key(32), {heads * qk, ql}, 0, prog::InitKind::Normal, 0.02,
                            true, false, false);
  } else {
    params.wq = AddParam(n + "wq", key(2), {heads * qk, h}, 0, prog::InitKind::Normal, 0.02, true,
                         false, false);
  }
  params.wkv_down = AddParam(n + "wkv_down", key(33), {kvl + rope, h}, -1, prog::InitKind::Normal,
                             0.02, true, true, true);
  params.kv_norm = latent_norm("kv_norm", kvl, 34);
  params.wkv_up =
      AddParam(n + "wkv_up", key(35), {heads * (m_.qk_nope_head_dim + m_.v_head_dim), kvl}, 0,
               prog::InitKind::Normal, 0.02, true, false, false);
  *wo = AddParam(n + "wo", key(8), {h, heads * m_.v_head_dim}, 1, prog::InitKind::Normal, OutStd(),
                 true, false, false);
  return params;
}

void RoleLowering::MlaForward(const LayerParams& P, LayerSaved& saved) {
  const MlaParams& lp = P.latent;
  MlaSaved& ms = saved.mla;
  const int64_t heads = m_.heads / tp_, qk = m_.qk_nope_head_dim + m_.qk_rope_head_dim;
  const int64_t vd = m_.v_head_dim, kvl = m_.kv_lora_rank, rope = m_.qk_rope_head_dim;
  // The q latent (down, RMSNorm) when queries go through one.
  if (m_.q_lora_rank > 0) {
    const int64_t ql = m_.q_lora_rank;
    ms.q_latent = Act("attention.q_latent", {tokens_, ql});
    Emit(attrs::Linear{}, {saved.n1f, lp.wq_down.value}, {ms.q_latent});
    ms.q_normed = Act("attention.q_norm.out", {tokens_, ql});
    ms.q_rstd = Stat("attention.q_norm.rstd", {tokens_});
    Emit(attrs::RmsNorm{.eps = m_.norm_eps}, {ms.q_latent, lp.q_norm.w.value},
         {ms.q_normed, ms.q_rstd});
  }
  // Keys and values: the kv latent and the shared rope head in one projection.
  ms.kv_rope = Act("attention.kv_latent_rope", {tokens_, kvl + rope});
  Emit(attrs::Linear{}, {saved.n1f, lp.wkv_down.value}, {ms.kv_rope});
  ms.kv_latent = Act("attention.kv_latent", {tokens_, kvl});
  Emit(Columns(1, kvl, kvl + rope, 0, 0, kvl, 0, 0), {ms.kv_rope}, {ms.kv_latent});
  ms.kv_normed = Act("attention.kv_norm.out", {tokens_, kvl});
  ms.kv_rstd = Stat("attention.kv_norm.rstd", {tokens_});
  Emit(attrs::RmsNorm{.eps = m_.norm_eps}, {ms.kv_latent, lp.kv_norm.w.value},
       {ms.kv_normed, ms.kv_rstd});
  MlaUpProjections(P, saved);
  EmitAttentionCore("attention", saved.q, saved.k, saved.v, ms.core_out, saved.lse);
  saved.o = Act("attention.out", {tokens_, heads * vd});
  Emit(Columns(heads, vd, heads * qk, qk, 0, heads * vd, vd, 0), {ms.core_out}, {saved.o});
}

void RoleLowering::MlaUpProjections(const LayerParams& P, LayerSaved& saved) {
  const MlaParams& lp = P.latent;
  const MlaSaved& ms = saved.mla;
  const int64_t heads = m_.heads / tp_, nope = m_.qk_nope_head_dim, rope = m_.qk_rope_head_dim;
  const int64_t qk = nope + rope, vd = m_.v_head_dim, kvl = m_.kv_lora_rank;
  const auto rope_attrs = [&](int64_t n) {
    return attrs::Rope{.heads = n, .head_dim = rope, .theta = m_.rope_theta};
  };
  // Queries: up from the q latent, or projected directly from the norm's output.
  saved.q = Act("q", {tokens_, heads * qk});
  if (m_.q_lora_rank > 0)
    Emit(attrs::Linear{}, {ms.q_normed, lp.wq_up.value}, {saved.q});
  else
    Emit(attrs::Linear{}, {saved.n1f, lp.wq.value}, {saved.q});
  const int32_t kv = Act("attention.kv", {tokens_, heads * (nope + vd)});
  Emit(attrs::Linear{}, {ms.kv_normed, lp.wkv_up.value}, {kv});
  // Decoupled RoPE: the rope part of each query head, and the one shared key head.
  const int32_t q_pe = Act("attention.q_rope", {tokens_, heads * rope});
  const auto q_rope_part = Columns(heads, rope, heads * qk, qk, nope, heads * rope, rope, 0);
  Emit(q_rope_part, {saved.q}, {q_pe});
  Emit(rope_attrs(heads), {q_pe}, {q_pe}, cp_comm_);
  Emit(Reversed(q_rope_part, false), {q_pe}, {saved.q});
  const int32_t k_pe = Act("attention.k_rope", {tokens_, rope});
  Emit(Columns(1, rope, kvl + rope, 0, kvl, rope, 0, 0), {ms.kv_rope}, {k_pe});
  Emit(rope_attrs(1), {k_pe}, {k_pe}, cp_comm_);
  // k = [k_nope of each head, the shared rope head]; v padded with zeros to the qk head size so
  // that one Attention runs it (the padded output columns are zeros). The zeros come from a
  // scratch buffer: Fill writes every slot of a buffer, and v is kept per microbatch.
  saved.k = Act("k", {tokens_, heads * qk});
  Emit(Columns(heads, nope, heads * (nope + vd), nope + vd, 0, heads * qk, qk, 0), {kv}, {saved.k});
  Emit(Columns(heads, rope, rope, 0, 0, heads * qk, qk, nope), {k_pe}, {saved.k});
  saved.v = Act("v_padded", {tokens_, heads * qk});
  Emit(Columns(heads, vd, heads * (nope + vd), nope + vd, nope, heads * qk, qk, 0), {kv},
       {saved.v});
  if (qk > vd) {
    const int32_t zeros = Act("attention.v_padding", {tokens_, qk - vd});
    Emit(attrs::Fill{.value = 0.0}, {}, {zeros});
    Emit(Columns(heads, qk - vd, qk - vd, 0, 0, heads * qk, qk, vd), {zeros}, {saved.v});
  }
}

void RoleLowering::MlaBackward(const LayerParams& params, const LayerSaved& saved, int32_t gx) {
  const MlaParams& lp = params.latent;
  const MlaSaved& ms = saved.mla;
  const int64_t h = m_.hidden, heads = m_.heads / tp_, nope = m_.qk_nope_head_dim;
  const int64_t rope = m_.qk_rope_head_dim, qk = nope + rope, vd = m_.v_head_dim;
  const int64_t kvl = m_.kv_lora_rank;
  const auto rope_attrs = [&](int64_t n) {
    return attrs::RopeBackward{.heads = n, .head_dim = rope, .theta = m_.rope_theta};
  };
  // Output projection (row-parallel), into the padded head layout.
  const int32_t gxf = GatherSp(gx, "attention.proj.grad_full", h);
  const int32_t dout = Act("attention.out.grad", {tokens_, heads * vd});
  Emit(attrs::LinearBackward{.dx_accumulate = false}, {gxf, saved.o, params.wo.value},
       {dout, params.wo.grad});
  const int32_t dout_padded = Act("attention.out_padded.grad", {tokens_, heads * qk});
  Emit(attrs::Fill{.value = 0.0}, {}, {dout_padded});
  Emit(Columns(heads, vd, heads * vd, vd, 0, heads * qk, qk, 0), {dout}, {dout_padded});
  // The mla_up_proj module: q, k and v made again from the kept latents.
  LayerSaved up = saved;
  if (s_.recompute_mla_up_proj) {
    recompute_prefix_ = "recompute.";
    MlaUpProjections(params, up);
    recompute_prefix_.clear();
  }
  // Attention core (recomputed from q, k, v under selective recompute).
  int32_t o = ms.core_out, lse = saved.lse;
  if (s_.recompute_core_attention)
    EmitAttentionCore("recompute.attention", up.q, up.k, up.v, o, lse);
  const int32_t dq = Act("q.grad", {tokens_, heads * qk});
  const int32_t dk = Act("k.grad", {tokens_, heads * qk});
  const int32_t dv = Act("v_padded.grad", {tokens_, heads * qk});
  EmitAttentionCoreBackward(dout_padded, up, o, lse, dq, dk, dv);
  // Back through the head layouts: dk's nope part and dv into the up projection's output; dk's
  // rope part summed over the heads into the shared head; RoPE's inverse rotations.
  const int32_t dkv = Act("attention.kv.grad", {tokens_, heads * (nope + vd)});
  Emit(Columns(heads, nope, heads * qk, qk, 0, heads * (nope + vd), nope + vd, 0), {dk}, {dkv});
  Emit(Columns(heads, vd, heads * qk, qk, 0, heads * (nope + vd), nope + vd, nope), {dv}, {dkv});
  const int32_t dk_pe = Act("attention.k_rope.grad", {tokens_, rope});
  Emit(attrs::Fill{.value = 0.0}, {}, {dk_pe});
  Emit(Columns(heads, rope, heads * qk, qk, nope, rope, 0, 0, /*accumulate=*/true), {dk}, {dk_pe});
  Emit(rope_attrs(1), {dk_pe}, {dk_pe}, cp_comm_);
  const int32_t dq_pe = Act("attention.q_rope.grad", {tokens_, heads * rope});
  const auto q_rope_part = Columns(heads, rope, heads * qk, qk, nope, heads * rope, rope, 0);
  Emit(q_rope_part, {dq}, {dq_pe});
  Emit(rope_attrs(heads), {dq_pe}, {dq_pe}, cp_comm_);
  Emit(Reversed(q_rope_part, false), {dq_pe}, {dq});
  // Latent paths. The up projections' input gradients are partial sums over Tp (each rank has
  // its own heads); they stay partial through the replicated norms and down projections, whose
  // weight gradients are summed over Tp with the step (grad_sync_tp), and the layer input's
  // gradient is reduced over Tp once, as ordinary attention's is.
  const int32_t dn1f = Act("attention_norm.out_full.grad", {tokens_, h});
  if (m_.q_lora_rank > 0) {
    const int64_t ql = m_.q_lora_rank;
    const int32_t dqn = Act("attention.q_norm.out.grad", {tokens_, ql});
    Emit(attrs::LinearBackward{.dx_accumulate = false}, {dq, ms.q_normed, lp.wq_up.value},
         {dqn, lp.wq_up.grad});
    const int32_t dql = Act("attention.q_latent.grad", {tokens_, ql});
    Emit(attrs::RmsNormBackward{.dx_accumulate = false},
         {dqn, ms.q_latent, lp.q_norm.w.value, ms.q_rstd}, {dql, lp.q_norm.w.grad});
    Emit(attrs::LinearBackward{.dx_accumulate = false}, {dql, saved.n1f, lp.wq_down.value},
         {dn1f, lp.wq_down.grad});
  } else {
    Emit(attrs::LinearBackward{.dx_accumulate = false}, {dq, saved.n1f, lp.wq.value},
         {dn1f, lp.wq.grad});
  }
  const int32_t dkvn = Act("attention.kv_norm.out.grad", {tokens_, kvl});
  Emit(attrs::LinearBackward{.dx_accumulate = false}, {dkv, ms.kv_normed, lp.wkv_up.value},
       {dkvn, lp.wkv_up.grad});
  const int32_t dkvl = Act("attention.kv_latent.grad", {tokens_, kvl});
  Emit(attrs::RmsNormBackward{.dx_accumulate = false},
       {dkvn, ms.kv_latent, lp.kv_norm.w.value, ms.kv_rstd}, {dkvl, lp.kv_norm.w.grad});
  const int32_t dkv_a = Act("attention.kv_latent_rope.grad", {tokens_, kvl + rope});
  Emit(Columns(1, kvl, kvl, 0, 0, kvl + rope, 0, 0), {dkvl}, {dkv_a});
  Emit(Columns(1, rope, rope, 0, 0, kvl + rope, 0, kvl), {dk_pe}, {dkv_a});
  Emit(attrs::LinearBackward{.dx_accumulate = true}, {dkv_a, saved.n1f, lp.wkv_down.value},
       {dn1f, lp.wkv_down.grad});
  const int32_t dn1 = ReduceGradToRows(dn1f, "attention_norm.out.grad");
  NormBackward(params.n1, saved.no1, saved.x, dn1, gx, /*accumulate=*/true);
}

// --- end multi-head latent attention -----------------------------------------------------------

}  // namespace paraplan::lower::detail
