// RoleLowering's mixture-of-experts layers (body.h MoeShape): expert params, the router, the
// experts' forward and backward, expert tensor parallelism and expert parallelism's token
// dispatch. See body_internal.h.
#include <fmt/format.h>

#include "compiler/lower/body_internal.h"
#include "compiler/plan/plan.h"

namespace paraplan::lower::detail {

using prog::ReduceOp;

// --- mixture of experts (body.h MoeShape) ------------------------------------------------------

RoleLowering::MoeParams RoleLowering::MakeMoeParams(int32_t layer_index) {
  const int64_t h = m_.hidden, e = s_.moe.experts, f = s_.moe.ffn, sf = s_.moe.shared_ffn;
  const bool non_gated = NonGated();
  const std::string n = fmt::format("layers.{}.moe.", layer_index);
  auto key = [&](int32_t j) { return LayerKey(layer_index, j); };
  // Router: replicated over tp; with sequence parallelism each rank routes its own rows, so its
  // gradient is a partial sum over tp. Experts: see AddExpertParam.
  MoeParams params;
  params.router =
      AddParam(n + "router", key(20), {e, h}, -1, prog::InitKind::Normal, 0.02, true, true, p_.sp);
  if (!non_gated) params.gate = AddExpertParam(n + "experts.w_gate", key(21), {e, f, h}, 1, 0.02);
  params.up =
      AddExpertParam(n + (non_gated ? "experts.fc1" : "experts.w_up"), key(22), {e, f, h}, 1, 0.02);
  params.down = AddExpertParam(n + (non_gated ? "experts.fc2" : "experts.w_down"), key(23),
                               {e, h, f}, 2, OutStd());
  if (s_.moe.bias_rate > 0) {
    params.bias = Buf(n + "router.expert_bias", {e}, DType::F32, BufferKind::State);
    params.load = Buf(n + "router.expert_load", {e}, DType::F32, BufferKind::Persistent);
    expert_bias_.push_back({params.bias, params.load});
  }
  if (ExpertsOverEdp()) {
    if (params.gate.param >= 0) ShardExpertParam(params.gate);
    ShardExpertParam(params.up);
    ShardExpertParam(params.down);
  }
  if (sf > 0) {
    // Shared experts: one dense MLP of width shared · ffn, tensor-parallel as the dense MLP.
    if (!non_gated)
      params.shared_gate = AddParam(n + "shared.w_gate", key(24), {sf, h}, 0,
                                    prog::InitKind::Normal, 0.02, true, false, false);
    params.shared_up = AddParam(n + (non_gated ? "shared.fc1" : "shared.w_up"), key(25), {sf, h}, 0,
                                prog::InitKind::Normal, 0.02, true, false, false);
    params.shared_down = AddParam(n + (non_gated ? "shared.fc2" : "shared.w_down"), key(26),
                                  {h, sf}, 1, prog::InitKind::Normal, OutStd(), true, false, false);
  }
  return params;
}

RoleLowering::ParamRef RoleLowering::AddExpertParam(const std::string& name, int64_t key,
                                                    std::vector<int64_t> global, int32_t split_dim,
                                                    double std) {
  if (!SplitsExperts())
    return AddParam(name, key, std::move(global), -1, prog::InitKind::Normal, std, true, true,
                    p_.sp);
  // Expert tensor parallelism: a slice per Etp rank, initialised from the whole tensor's values
  // (the key and the global index), its gradient complete on the rank (every rank of the group
  // sees all the group's tokens).
  return AddParam(name, key, std::move(global), split_dim, prog::InitKind::Normal, std, true, false,
                  false, true, CommKind::Etp);
}

// --- expert tensor parallelism (body.h MoeShape) ---

void RoleLowering::EmitRouter(int32_t logits, int32_t bias, std::vector<int32_t> outputs) {
  Emit(attrs::MoeRouter{.experts = s_.moe.experts,
                        .topk = s_.moe.topk,
                        .score = s_.moe.score,
                        .normalize = s_.moe.normalize,
                        .groups = s_.moe.router_groups,
                        .group_topk = s_.moe.router_group_topk,
                        .scale = RouterScale()},
       bias >= 0 ? std::vector<int32_t>{logits, bias} : std::vector<int32_t>{logits},
       std::move(outputs));
}

RoleLowering::EtpTokens RoleLowering::GatherEtpTokens(int32_t x, const MoeSaved& local,
                                                      int32_t bias) {
  if (!SplitsExperts() || !p_.sp) return {x, local.w, local.idx, rows_};
  const int64_t e = s_.moe.experts, k = s_.moe.topk, rows = EtpRows();
  EtpTokens t{Act("moe.etp.tokens", {rows, m_.hidden}), Act("moe.etp.router.weights", {rows, k}),
              Buf(Prefix() + "moe.etp.router.indices", {rows, k}, DType::I32), rows};
  Emit(attrs::AllGather{}, {x}, {t.x}, CommKind::Etp);
  // The group's choices: its ranks' logits, gathered and routed again. Routing is row by row, so
  // each row gets the weights and experts its own rank chose, bit for bit; the aux loss and the
  // router's gradient stay with the local routing.
  const int32_t logits = Act("moe.etp.router.logits", {rows, e});
  Emit(attrs::AllGather{}, {local.logits}, {logits}, CommKind::Etp);
  EmitRouter(
      logits, bias,
      {t.w, t.idx, Stat("moe.etp.router.scores", {rows, e}), Stat("moe.etp.router.counts", {e})});
  return t;
}

void RoleLowering::DropPastCapacity(MoeSaved& ms) {
  if (s_.moe.capacity_factor <= 0) return;
  const int64_t e = s_.moe.experts, k = s_.moe.topk, rows = ms.etp.rows;
  // Each rank drops past the capacity of its own rows, as Megatron-Core's router does before its
  // dispatcher gathers them over the expert tensor-parallel group: the Etp group's gathered rows
  // are its members' rows_ in member order (AllGather), one segment each.
  const int64_t segments = CapacitySegments(), capacity = ExpertCapacity();
  const int32_t kept = Act("moe.capacity.kept_weights", {rows, k});
  ms.capacity_mask = Stat("moe.capacity.mask", {rows, k});
  Emit(attrs::MoeCapacity{.experts = e,
                          .topk = k,
                          .capacity = capacity,
                          .position = s_.moe.drop_by_position,
                          .segments = segments},
       {ms.etp.w, ms.etp.idx}, {kept, ms.capacity_mask});
  ms.etp.w = kept;
}

int32_t RoleLowering::ReduceEtpPartial(int32_t partial, const std::string& name, int64_t cols) {
  if (!SplitsExperts()) return partial;
  if (!p_.sp) {
    Emit(attrs::AllReduce{}, {partial}, {partial}, CommKind::Etp);
    return partial;
  }
  const int32_t out = Act(name, {rows_, cols});
  Emit(attrs::ReduceScatter{}, {partial}, {out}, CommKind::Etp);
  return out;
}

int32_t RoleLowering::GatherEtpGrad(int32_t grad, const std::string& name, int64_t cols) {
  if (!SplitsExperts() || !p_.sp) return grad;
  const int32_t full = Act(name, {rows_ * s_.moe.etp, cols});
  Emit(attrs::AllGather{}, {grad}, {full}, CommKind::Etp);
  return full;
}

// --- end expert tensor parallelism ---

void RoleLowering::DenseExpertForward(const std::string& name, int32_t xf, const ParamRef& gate,
                                      const ParamRef& up, const ParamRef& down, int64_t ffn,
                                      int32_t* g, int32_t* u, int32_t* a, int32_t* out) {
  const int64_t local = ffn / tp_;
  if (gate.value >= 0) {
    *g = Act(name + ".gate", {tokens_, local});
    *u = Act(name + ".up", {tokens_, local});
    Emit(attrs::Linear{}, {xf, gate.value}, {*g});
    Emit(attrs::Linear{}, {xf, up.value}, {*u});
    *a = Act(name + ".act", {tokens_, local});
    Emit(attrs::SwiGlu{}, {*g, *u}, {*a});
  } else {
    *u = Act(name + ".fc1_out", {tokens_, local});
    Emit(attrs::Linear{}, {xf, up.value}, {*u});
    *a = Act(name + ".act", {tokens_, local});
    EmitActivation(*u, *a);
  }
  if (out == nullptr) return;
  const int32_t d = Act(name + ".down", {tokens_, m_.hidden});
  Emit(attrs::Linear{}, {*a, down.value}, {d});
  *out = ReducePartial(d, name + ".down_sp", m_.hidden);
}

void RoleLowering::MoeForward(const LayerParams& P, LayerSaved& saved, int32_t next) {
  const int64_t h = m_.hidden, e = s_.moe.experts, k = s_.moe.topk, f = s_.moe.ffn / s_.moe.etp;
  const MoeParams& ex = P.experts;
  MoeSaved& ms = saved.moe;
  const int32_t xn = saved.no2.y;  // this rank's rows
  // Router.
  ms.logits = Act("moe.router.logits", {rows_, e});
  Emit(attrs::Linear{}, {xn, ex.router.value}, {ms.logits});
  ms.w = Act("moe.router.weights", {rows_, k});
  ms.idx = Buf(Prefix() + "moe.router.indices", {rows_, k}, DType::I32);
  ms.scores = Stat("moe.router.scores", {rows_, e});
  ms.counts = Stat("moe.router.counts", {e});
  EmitRouter(ms.logits, ex.bias, {ms.w, ms.idx, ms.scores, ms.counts});
  // The aux loss counts the microbatch's tokens: with sequence parallelism sum the counts of
  // every rank's rows, and with context parallelism those of every Cp rank's positions.
  if (p_.sp && tp_ > 1) Emit(attrs::AllReduce{}, {ms.counts}, {ms.counts}, CommKind::Tp);
  // --- context parallelism ---
  if (cp_ > 1) Emit(attrs::AllReduce{}, {ms.counts}, {ms.counts}, cp_comm_);
  // --- end context parallelism ---
  // --- expert tensor parallelism: the Etp group's tokens ---
  ms.etp = GatherEtpTokens(xn, ms, ex.bias);
  // --- end expert tensor parallelism ---
  DropPastCapacity(ms);
  // Dispatch: every choice of every row at worst; with a capacity factor only the kept pairs,
  // at most each expert's capacity per segment (Megatron-Core never dispatches the dropped ones).
  const int64_t routed = RoutedRows();
  ms.xp = Act("moe.permuted", {routed, h});
  ms.row_map = Buf(Prefix() + "moe.row_map", {ms.etp.rows * k}, DType::I32);
  ms.expert_counts = Buf(Prefix() + "moe.expert_counts", {e}, DType::I32);
  std::vector<int32_t> permute_in{ms.etp.x, ms.etp.idx};
  if (ms.capacity_mask >= 0) permute_in.push_back(ms.capacity_mask);
  Emit(attrs::MoePermute{.experts = e, .topk = k}, std::move(permute_in),
       {ms.xp, ms.row_map, ms.expert_counts});
  ms.xe = ms.xp;
  ms.ecounts = ms.expert_counts;
  if (ExpertParallel()) EpDispatch(ms);
  // Experts: all of them on `routed` rows, or (ep > 1) this rank's on the rows dispatched to it.
  const int64_t groups = ExpertParallel() ? LocalExperts() : e;
  const int64_t erows = ExpertParallel() ? DispatchCapacity() : routed;
  if (ex.gate.value >= 0) {
    ms.g = Act("moe.experts.gate", {erows, f});
    ms.u = Act("moe.experts.up", {erows, f});
    Emit(attrs::GroupedLinear{.groups = groups}, {ms.xe, ex.gate.value, ms.ecounts}, {ms.g});
    Emit(attrs::GroupedLinear{.groups = groups}, {ms.xe, ex.up.value, ms.ecounts}, {ms.u});
    ms.a = Act("moe.experts.act", {erows, f});
    Emit(attrs::SwiGlu{}, {ms.g, ms.u}, {ms.a});
  } else {
    ms.u = Act("moe.experts.fc1_out", {erows, f});
    Emit(attrs::GroupedLinear{.groups = groups}, {ms.xe, ex.up.value, ms.ecounts}, {ms.u});
    ms.a = Act("moe.experts.act", {erows, f});
    EmitActivation(ms.u, ms.a);
  }
  ms.y = Act("moe.experts.out", {erows, h});
  Emit(attrs::GroupedLinear{.groups = groups}, {ms.a, ex.down.value, ms.ecounts}, {ms.y});
  if (ExpertParallel()) ms.y = EpCombine(ms, ms.y, "moe.ep.combined");
  // Shared experts read the whole sequence (gathered under sequence parallelism).
  if (ex.shared_up.value >= 0) {
    // (Under expert tensor parallelism the Etp group's rows are already the gathered sequence.)
    saved.n2f = ms.etp.x != xn ? ms.etp.x : GatherSp(xn, "mlp_norm.out_full", h);
    DenseExpertForward("moe.shared", saved.n2f, ex.shared_gate, ex.shared_up, ex.shared_down,
                       s_.moe.shared_ffn, &ms.sg, &ms.su, &ms.sa, nullptr);
  }
  if (next < 0) return;
  // Combine.
  int32_t combined = Act("moe.out", {ms.etp.rows, h});
  Emit(attrs::MoeUnpermute{.topk = k}, {ms.y, ms.row_map, ms.etp.w}, {combined});
  // --- expert tensor parallelism: sum the expert slices' outputs ---
  combined = ReduceEtpPartial(combined, "moe.out_rows", h);
  // --- end expert tensor parallelism ---
  int32_t sum = combined;
  if (ex.shared_up.value >= 0) {
    const int32_t d = Act("moe.shared.down", {tokens_, h});
    Emit(attrs::Linear{}, {ms.sa, ex.shared_down.value}, {d});
    const int32_t dr = ReducePartial(d, "moe.shared.down_sp", h);
    sum = Act("moe.out_with_shared", {rows_, h});
    Emit(attrs::Add{}, {combined, dr}, {sum});
  }
  Emit(attrs::Add{}, {saved.x1, sum}, {next});
}

int32_t RoleLowering::SharedExpertsBackward(const MoeParams& ex, const LayerSaved& saved,
                                            int32_t gx, int32_t gxe, int32_t dn2) {
  const MoeSaved& ms = saved.moe;
  const int64_t h = m_.hidden, sf = s_.moe.shared_ffn / tp_;
  // The shared_experts module of selective recompute: their gate, up and activation made again
  // from their kept input.
  int32_t sg = ms.sg, su = ms.su, sa = ms.sa;
  if (s_.recompute_shared_experts) {
    recompute_prefix_ = "recompute.";
    DenseExpertForward("moe.shared", saved.n2f, ex.shared_gate, ex.shared_up, ex.shared_down,
                       s_.moe.shared_ffn, &sg, &su, &sa, nullptr);
    recompute_prefix_.clear();
  }
  const int32_t gxf = gxe != gx ? gxe : GatherSp(gx, "moe.shared.down.grad_full", h);
  const int32_t dsa = Act("moe.shared.act.grad", {tokens_, sf});
  Emit(attrs::LinearBackward{.dx_accumulate = false}, {gxf, sa, ex.shared_down.value},
       {dsa, ex.shared_down.grad});
  const int32_t dnf = Act("moe.shared.in.grad_full", {tokens_, h});
  if (ex.shared_gate.value >= 0) {
    const int32_t dg = Act("moe.shared.gate.grad", {tokens_, sf});
    const int32_t du = Act("moe.shared.up.grad", {tokens_, sf});
    Emit(attrs::SwiGluBackward{}, {dsa, sg, su}, {dg, du});
    Emit(attrs::LinearBackward{.dx_accumulate = false}, {dg, saved.n2f, ex.shared_gate.value},
         {dnf, ex.shared_gate.grad});
    Emit(attrs::LinearBackward{.dx_accumulate = true}, {du, saved.n2f, ex.shared_up.value},
         {dnf, ex.shared_up.grad});
  } else {
    const int32_t du = Act("moe.shared.fc1_out.grad", {tokens_, sf});
    EmitActivationBackward(dsa, su, du);
    Emit(attrs::LinearBackward{.dx_accumulate = false}, {du, saved.n2f, ex.shared_up.value},
         {dnf, ex.shared_up.grad});
  }
  const int32_t dns = ReduceGradToRows(dnf, "moe.shared.in.grad");
  const int32_t dnorm = Act("mlp_norm.out.grad_sum", {rows_, h});
  Emit(attrs::Add{}, {dn2, dns}, {dnorm});
  return dnorm;
}

int32_t RoleLowering::ExpertActivationForBackward(const MoeParams& ex, const MoeSaved& ms,
                                                  int64_t rows, int64_t width) {
  if (!s_.recompute_moe_act) return ms.a;
  recompute_prefix_ = "recompute.";
  const int32_t act = Act("moe.experts.act", {rows, width});
  recompute_prefix_.clear();
  if (ex.gate.value >= 0)
    Emit(attrs::SwiGlu{}, {ms.g, ms.u}, {act});
  else
    EmitActivation(ms.u, act);
  return act;
}

void RoleLowering::MoeBackward(const LayerParams& P, const LayerSaved& saved, int32_t gx) {
  const int64_t h = m_.hidden, e = s_.moe.experts, k = s_.moe.topk, f = s_.moe.ffn / s_.moe.etp;
  const MoeParams& ex = P.experts;
  const MoeSaved& ms = saved.moe;
  const int64_t routed = RoutedRows();
  const int32_t xn = saved.no2.y;
  // --- expert tensor parallelism: the output gradient of the Etp group's tokens ---
  const int32_t gxe = GatherEtpGrad(gx, "moe.etp.out.grad", h);
  // --- end expert tensor parallelism ---
  // Combine.
  const int32_t dy = Act("moe.experts.out.grad", {routed, h});
  int32_t dw = Act(SplitsExperts() ? "moe.etp.router.weights.grad" : "moe.router.weights.grad",
                   {ms.etp.rows, k});
  Emit(attrs::MoeUnpermuteBackward{.topk = k}, {gxe, ms.y, ms.row_map, ms.etp.w}, {dy, dw});
  if (ms.capacity_mask >= 0)  // the dropped pairs' weights get no gradient
    Emit(attrs::MoeCapacityBackward{}, {dw, ms.capacity_mask}, {dw});
  // --- expert tensor parallelism: the router weights' gradient sums the expert slices ---
  dw = ReduceEtpPartial(dw, "moe.router.weights.grad", k);
  // --- end expert tensor parallelism ---
  // Experts (ep > 1: on the rows dispatched to this rank, the gradient sent there first).
  const int64_t groups = ExpertParallel() ? LocalExperts() : e;
  const int64_t erows = ExpertParallel() ? DispatchCapacity() : routed;
  const int32_t dye = ExpertParallel() ? EpDispatchGrad(ms, dy, "moe.ep.dispatched.out.grad") : dy;
  const int32_t act = ExpertActivationForBackward(ex, ms, erows, f);
  const int32_t da = Act("moe.experts.act.grad", {erows, f});
  Emit(attrs::GroupedLinearBackward{.groups = groups, .dx_accumulate = false},
       {dye, act, ex.down.value, ms.ecounts}, {da, ex.down.grad});
  const int32_t dxe =
      Act(ExpertParallel() ? "moe.ep.dispatched.grad" : "moe.permuted.grad", {erows, h});
  if (ex.gate.value >= 0) {
    const int32_t dg = Act("moe.experts.gate.grad", {erows, f});
    const int32_t du = Act("moe.experts.up.grad", {erows, f});
    Emit(attrs::SwiGluBackward{}, {da, ms.g, ms.u}, {dg, du});
    Emit(attrs::GroupedLinearBackward{.groups = groups, .dx_accumulate = false},
         {dg, ms.xe, ex.gate.value, ms.ecounts}, {dxe, ex.gate.grad});
    Emit(attrs::GroupedLinearBackward{.groups = groups, .dx_accumulate = true},
         {du, ms.xe, ex.up.value, ms.ecounts}, {dxe, ex.up.grad});
  } else {
    const int32_t du = Act("moe.experts.fc1_out.grad", {erows, f});
    EmitActivationBackward(da, ms.u, du);
    Emit(attrs::GroupedLinearBackward{.groups = groups, .dx_accumulate = false},
         {du, ms.xe, ex.up.value, ms.ecounts}, {dxe, ex.up.grad});
  }
  const int32_t dxp = ExpertParallel() ? EpCombine(ms, dxe, "moe.permuted.grad") : dxe;
  // Dispatch: MoeUnpermute without weights is MoePermute's backward.
  int32_t dn2 = Act(SplitsExperts() ? "moe.etp.in.grad" : "mlp_norm.out.grad", {ms.etp.rows, h});
  Emit(attrs::MoeUnpermute{.topk = k}, {dxp, ms.row_map, -1}, {dn2});
  // --- expert tensor parallelism: the inputs' gradient sums the expert slices ---
  dn2 = ReduceEtpPartial(dn2, "mlp_norm.out.grad", h);
  // --- end expert tensor parallelism ---
  // Router, with the aux loss's gradient over the microbatch's tokens (all Cp ranks' positions:
  // each rank adds the gradient of its own rows, summed over DpCp with the weights'), scaled as
  // the loss is.
  const int32_t dz = Act("moe.router.logits.grad", {rows_, e});
  Emit(
      attrs::MoeRouterBackward{.experts = e,
                               .topk = k,
                               .score = s_.moe.score,
                               .normalize = s_.moe.normalize,
                               .aux_rows = tokens_ * cp_,
                               .aux_coeff = s_.moe.aux_coeff,
                               .aux_grad_scale = 1.0 / static_cast<double>(s_.microbatches * p_.dp),
                               .scale = RouterScale()},
      {dw, ms.idx, ms.scores, ms.counts}, {dz});
  if (ex.load >= 0) Emit(attrs::MoeExpertLoad{}, {ms.counts}, {ex.load});
  Emit(attrs::LinearBackward{.dx_accumulate = true}, {dz, xn, ex.router.value},
       {dn2, ex.router.grad});
  int32_t dnorm = dn2;
  if (ex.shared_up.value >= 0) dnorm = SharedExpertsBackward(ex, saved, gx, gxe, dn2);
  NormBackward(P.n2, saved.no2, saved.x1, dnorm, gx, /*accumulate=*/true);
}

// --- expert parallelism (ep > 1): token dispatch over the Ep group ----------------------------
// Rank r of the Ep group holds experts r·L .. (r+1)·L-1 (L = experts / ep). MoePermute's rows are
// grouped by global expert, so each peer's rows are one contiguous block; MoeExchangeCounts tells
// every rank how many rows each peer sends it per local expert, MoeDispatch moves the rows (a
// variable-count all-to-all) into local-expert order, MoeCombine moves the experts' output rows
// back. The backward runs the same exchanges in reverse: the output gradient is dispatched, the
// input gradient combined.

void RoleLowering::ShardExpertParam(const ParamRef& ref) {
  Param& prm = role_.params[ref.param];
  // Split over Etp as well (etp > 1): that split becomes the second one.
  prm.split2_dim = prm.split_dim;
  prm.split2_comm = prm.split_dim >= 0 ? prm.split_comm : CommKind::None;
  prm.split_dim = 0;
  prm.split_comm = CommKind::Ep;
  prm.tp_replicated = false;
  prm.grad_sync_tp = false;  // every rank's rows reach the experts: Edp sums all of them
  role_.buffers[ref.value].shape[0] /= ep_;
  role_.buffers[ref.grad].shape[0] /= ep_;
}

void RoleLowering::EpDispatch(MoeSaved& ms) {
  const int64_t e = s_.moe.experts;
  ms.split = Buf(Prefix() + "moe.ep.split", {ep_, LocalExperts()}, DType::I32);
  ms.ecounts = Buf(Prefix() + "moe.ep.local_counts", {LocalExperts()}, DType::I32);
  Emit(attrs::MoeExchangeCounts{.experts = e}, {ms.expert_counts}, {ms.split, ms.ecounts},
       CommKind::Ep);
  ms.xe = Act("moe.ep.dispatched", {DispatchCapacity(), m_.hidden});
  Emit(attrs::MoeDispatch{.experts = e}, {ms.xp, ms.expert_counts, ms.split}, {ms.xe},
       CommKind::Ep);
}

int32_t RoleLowering::EpCombine(const MoeSaved& ms, int32_t local_rows, const std::string& name) {
  const int32_t out = Act(name, {RoutedRows(), m_.hidden});
  Emit(attrs::MoeCombine{.experts = s_.moe.experts}, {local_rows, ms.expert_counts, ms.split},
       {out}, CommKind::Ep);
  return out;
}

void RoleLowering::EmitExpertGradReduction() {
  // (With sharded grads each bucket was reduced at the end of its backward body.)
  if (edp_ <= 1 || shard_grads_) return;
  for (const Bucket& b : role_.buckets) {
    if (!IsExpertBucket(b)) continue;
    if (p_.zero >= 1)
      Emit(attrs::ReduceScatter{.reduce_op = ReduceOp::kSum}, {b.grads}, {b.grads}, CommKind::Edp);
    else
      Emit(attrs::AllReduce{.reduce_op = ReduceOp::kSum}, {b.grads}, {b.grads}, CommKind::Edp);
  }
}

int32_t RoleLowering::EpDispatchGrad(const MoeSaved& ms, int32_t grad_rows,
                                     const std::string& name) {
  const int32_t out = Act(name, {DispatchCapacity(), m_.hidden});
  Emit(attrs::MoeDispatch{.experts = s_.moe.experts}, {grad_rows, ms.expert_counts, ms.split},
       {out}, CommKind::Ep);
  return out;
}
// --- end expert parallelism ---------------------------------------------------------------------

// --- sizes of the routed path and the expert buckets ---

int64_t RoleLowering::ExpertCapacity() const {
  return paraplan::ExpertCapacity(rows_, s_.moe.topk, s_.moe.experts, s_.moe.capacity_factor);
}

int64_t RoleLowering::RoutedRows() const {
  const int64_t pairs = EtpRows() * s_.moe.topk;
  if (s_.moe.capacity_factor <= 0) return pairs;
  return std::min(pairs,
                  std::max<int64_t>(s_.moe.experts * ExpertCapacity() * CapacitySegments(), 1));
}

int64_t RoleLowering::DispatchCapacity() const {
  const int64_t rows = EtpRows();
  int64_t worst = ep_ * rows * std::min<int64_t>(s_.moe.topk, LocalExperts());
  if (s_.moe.capacity_factor > 0)
    worst = std::min(
        worst, std::max<int64_t>(ep_ * LocalExperts() * ExpertCapacity() * CapacitySegments(), 1));
  if (s_.moe.imbalance <= 0) return worst;
  const auto stated =
      static_cast<int64_t>(std::ceil(s_.moe.imbalance * static_cast<double>(rows * s_.moe.topk)));
  return std::min(worst, std::max<int64_t>(stated, 1));
}

bool RoleLowering::ExpertsOverEdp() const {
  if (s_.moe.experts <= 0) return false;
  if (ep_ > 1) return true;
  return s_.moe.etp <= 1 && tp_ > 1 && p_.sp && p_.zero <= 1;
}

bool RoleLowering::IsExpertBucket(const Bucket& b) const {
  for (size_t i = 0; i < role_.params.size(); ++i)
    if (IsExpertSharded(static_cast<int32_t>(i)) &&
        role_.buffers[role_.params[i].buffer].view_of == b.params)
      return true;
  return false;
}

// --- end mixture of experts --------------------------------------------------------------------

}  // namespace paraplan::lower::detail
