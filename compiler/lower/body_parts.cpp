// RoleLowering's building blocks (body_internal.h): the constructor, buffers and params, norms,
// the tensor/sequence-parallel collectives and the attention core (ring attention under cp).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "compiler/lower/body_internal.h"

namespace paraplan::lower::detail {

RoleLowering::RoleLowering(const BodyShape& shape, int32_t pipeline_rank, Role& role)
    : s_(shape), m_(shape.model), p_(shape.parallel), role_(role), pipeline_rank_(pipeline_rank) {
  tp_ = p_.tp;
  act_ = ActivationType(shape.precision);
  // --- context parallelism: a rank holds seq_len / cp positions of each sequence ---
  cp_ = p_.cp;
  cp_comm_ = cp_ > 1 ? CommKind::Cp : CommKind::None;
  tokens_ = m_.micro_batch * (m_.seq_len / cp_);
  rows_ = p_.sp ? tokens_ / tp_ : tokens_;
  tp_comm_ = tp_ > 1 ? CommKind::Tp : CommKind::None;
  // --- context parallelism: Cp ranks hold the same weights; ZeRO shards over dp · cp ---
  shard_ = static_cast<int64_t>(p_.dp) * cp_;
  shard_comm_ = cp_ > 1 ? CommKind::DpCp : CommKind::Dp;
  // --- end context parallelism ---
  // --- hybrid sharding: ZeRO over one replica's Shard group, the gradients summed over the
  // replicas (a Shard group of one rank: every rank holds the whole, summed over DpCp) ---
  replicate_ = std::max(1, p_.replicate);
  if (replicate_ > 1 && shard_ / replicate_ > 1) {
    shard_ /= replicate_;
    shard_comm_ = CommKind::Shard;
  } else if (replicate_ > 1) {
    replicate_ = 1;  // shard of one: plain data parallelism over Dp (DpCp)
    shard_ = 1;
  }
  shard_grads_ = p_.zero >= 2 && shard_ > 1;
  gather_params_ = p_.zero >= 3 && shard_ > 1;
  // --- expert parallelism: each Ep rank holds experts / ep experts; the ranks holding the same
  // expert slices (tp · cp · dp / (ep · etp) of them) form the Edp group ---
  ep_ = std::max<int64_t>(1, p_.ep);
  edp_ = std::max<int64_t>(
      1, static_cast<int64_t>(tp_) * cp_ * p_.dp / (ep_ * std::max<int64_t>(1, s_.moe.etp)));
}

int32_t RoleLowering::Buf(std::string name, std::vector<int64_t> shape, DType dtype,
                          BufferKind kind) {
  Buffer b;
  b.name = std::move(name);
  b.kind = kind;
  b.dtype = dtype;
  b.shape = std::move(shape);
  role_.buffers.push_back(std::move(b));
  return static_cast<int32_t>(role_.buffers.size() - 1);
}

RoleLowering::ParamRef RoleLowering::AddParam(const std::string& name, int64_t key,
                                              std::vector<int64_t> global, int32_t split_dim,
                                              prog::InitKind init, double std, bool decay,
                                              bool tp_replicated, bool grad_sync_tp,
                                              bool counts_in_norm, CommKind split_comm) {
  Param prm;
  prm.name = name;
  prm.key = key;
  prm.global_shape = global;
  std::vector<int64_t> local = global;
  const int64_t ways = split_comm == CommKind::Etp ? s_.moe.etp : tp_;
  if (split_dim >= 0 && ways > 1) {
    prm.split_dim = split_dim;
    prm.split_comm = split_comm;
    local[split_dim] /= ways;
  }
  prm.init = init;
  prm.init_std = init == prog::InitKind::Normal ? std : 0.0;
  prm.chunk = chunk_;
  prm.decay = decay;
  prm.tp_replicated = tp_replicated && tp_ > 1;
  prm.counts_in_norm = counts_in_norm;
  prm.grad_sync_tp = grad_sync_tp && tp_ > 1;
  DType pdt = act_;
  prm.buffer = Buf(name, local, pdt, BufferKind::Param);
  prm.grad = Buf(name + ".grad", local, s_.grad_type, BufferKind::Grad);
  role_.params.push_back(prm);
  // Bucket group with ZeRO >= 2: the layer, or one group per chunk-level tensor (the word
  // embedding and its tied copy alone, so both stages' buckets line up for the Embedding sum).
  param_group_.push_back(layer_ >= 0 ? fmt::format("layers.{}", layer_) : name);
  return {static_cast<int32_t>(role_.params.size() - 1), prm.buffer, prm.grad};
}

prog::attrs::CopyColumns RoleLowering::Columns(int64_t groups, int64_t width, int64_t x_cols,
                                               int64_t x_stride, int64_t x_offset, int64_t y_cols,
                                               int64_t y_stride, int64_t y_offset,
                                               bool accumulate) {
  return {.groups = groups,
          .width = width,
          .x_cols = x_cols,
          .x_stride = x_stride,
          .x_offset = x_offset,
          .y_cols = y_cols,
          .y_stride = y_stride,
          .y_offset = y_offset,
          .accumulate = accumulate};
}

prog::attrs::CopyColumns RoleLowering::Reversed(const prog::attrs::CopyColumns& c,
                                                bool accumulate) {
  return {.groups = c.groups,
          .width = c.width,
          .x_cols = c.y_cols,
          .x_stride = c.y_stride,
          .x_offset = c.y_offset,
          .y_cols = c.x_cols,
          .y_stride = c.x_stride,
          .y_offset = c.x_offset,
          .accumulate = accumulate};
}

RoleLowering::NormParams RoleLowering::MakeNorm(const std::string& name, int64_t key, int64_t width,
                                                std::optional<bool> grad_sync_tp) {
  NormParams n;
  bool ln = m_.norm == prog::NormKind::LayerNorm;
  const int64_t cols = width > 0 ? width : m_.hidden;
  const bool sync = grad_sync_tp.value_or(p_.sp);
  n.w = AddParam(name + ".weight", key, {cols}, -1, prog::InitKind::Ones, 0, false, true, sync);
  if (ln)
    n.b =
        AddParam(name + ".bias", key + 1, {cols}, -1, prog::InitKind::Zeros, 0, false, true, sync);
  return n;
}

RoleLowering::NormOut RoleLowering::NormForward(const std::string& name, const NormParams& np,
                                                int32_t x, int64_t rows, int64_t width) {
  NormOut o;
  const int64_t r = rows > 0 ? rows : rows_, cols = width > 0 ? width : m_.hidden;
  o.y = Act(name + ".out", {r, cols});
  o.rstd = Stat(name + ".rstd", {r});
  if (m_.norm == prog::NormKind::LayerNorm) {
    o.mean = Stat(name + ".mean", {r});
    Emit(attrs::LayerNorm{.eps = m_.norm_eps}, {x, np.w.value, np.b.value}, {o.y, o.mean, o.rstd});
  } else {
    Emit(attrs::RmsNorm{.eps = m_.norm_eps}, {x, np.w.value}, {o.y, o.rstd});
  }
  return o;
}

void RoleLowering::NormBackward(const NormParams& np, const NormOut& o, int32_t x, int32_t dy,
                                int32_t dx, bool accumulate) {
  if (m_.norm == prog::NormKind::LayerNorm)
    Emit(attrs::LayerNormBackward{.dx_accumulate = accumulate}, {dy, x, np.w.value, o.mean, o.rstd},
         {dx, np.w.grad, np.b.grad});
  else
    Emit(attrs::RmsNormBackward{.dx_accumulate = accumulate}, {dy, x, np.w.value, o.rstd},
         {dx, np.w.grad});
}

void RoleLowering::EmitActivation(int32_t x, int32_t y) {
  if (m_.activation == prog::ActivationKind::SquaredRelu)
    Emit(attrs::SquaredRelu{}, {x}, {y});
  else
    Emit(attrs::Gelu{}, {x}, {y});
}

void RoleLowering::EmitActivationBackward(int32_t dy, int32_t x, int32_t dx) {
  if (m_.activation == prog::ActivationKind::SquaredRelu)
    Emit(attrs::SquaredReluBackward{}, {dy, x}, {dx});
  else
    Emit(attrs::GeluBackward{}, {dy, x}, {dx});
}

int32_t RoleLowering::GatherSp(int32_t x, const std::string& name, int64_t cols) {
  if (!p_.sp || tp_ == 1) return x;
  int32_t full = Act(name, {tokens_, cols});
  Emit(attrs::AllGather{}, {x}, {full}, CommKind::Tp);
  return full;
}

int32_t RoleLowering::ReducePartial(int32_t partial, const std::string& name, int64_t cols) {
  if (tp_ == 1) return partial;
  if (!p_.sp) {
    Emit(attrs::AllReduce{}, {partial}, {partial}, CommKind::Tp);
    return partial;
  }
  int32_t out = Act(name, {rows_, cols});
  Emit(attrs::ReduceScatter{}, {partial}, {out}, CommKind::Tp);
  return out;
}

void RoleLowering::EmitAttentionCore(const std::string& name, int32_t q, int32_t k, int32_t v,
                                     int32_t& o, int32_t& lse) {
  const auto core = AttentionAttrs<attrs::Attention>();
  const int64_t heads = core.heads, kv = core.kv_heads, hd = core.head_dim;
  // Latent attention's output is at the padded query/key head size.
  o = Act(name + (m_.kv_lora_rank > 0 ? ".out_padded" : ".out"), {tokens_, heads * hd});
  if (cp_ == 1) {
    lse = Stat(name + ".lse", {m_.micro_batch, heads, m_.seq_len});
    Emit(core, {q, k, v}, {o, lse});
    return;
  }
  lse = Stat(name + ".lse", {tokens_, heads});
  const int32_t ring = Act(name + ".ring", {4 * tokens_ * kv * hd});
  const int32_t block_o = Act(name + ".block_o", {tokens_, heads * hd});
  const int32_t block_lse = Stat(name + ".block_lse", {tokens_, heads});
  Emit(AttentionAttrs<attrs::RingAttention>(), {q, k, v}, {o, lse, ring, block_o, block_lse},
       cp_comm_);
}

void RoleLowering::EmitAttentionCoreBackward(int32_t dout, const LayerSaved& saved, int32_t o,
                                             int32_t lse, int32_t dq, int32_t dk, int32_t dv) {
  const std::vector<int32_t> in = {dout, saved.q, saved.k, saved.v, o, lse};
  if (cp_ == 1) {
    Emit(AttentionAttrs<attrs::AttentionBackward>(), in, {dq, dk, dv});
    return;
  }
  const auto core = AttentionAttrs<attrs::RingAttentionBackward>();
  const int32_t ring = Act("attention.ring.grad", {8 * tokens_ * core.kv_heads * core.head_dim});
  Emit(core, in, {dq, dk, dv, ring}, cp_comm_);
}

}  // namespace paraplan::lower::detail
