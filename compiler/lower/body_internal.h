// RoleLowering: the class that builds one role's params, buffers, buckets, chunks and bodies
// (body.h's BuildRoleBodies). Internal to compiler/lower: its members are defined in
// body_parts.cpp (the constructor, buffers, params, norms, TP/SP collectives, the attention
// core), body.cpp (layers, dense attention and MLP, buckets, step bodies), body_moe.cpp (mixture
// of experts, expert tensor and expert parallelism) and body_mla.cpp (multi-head latent
// attention). Only those files include this header.
#ifndef PARAPLAN_COMPILER_LOWER_BODY_INTERNAL_H_
#define PARAPLAN_COMPILER_LOWER_BODY_INTERNAL_H_

#include <fmt/format.h>

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "compiler/lower/body.h"
#include "runtime/format/ops.h"

namespace paraplan::lower::detail {

namespace attrs = prog::attrs;

// Builds one role. Buffers are created as Scratch; after all bodies exist, a buffer a chunk's
// forward and backward both touch becomes Stash (kept per microbatch).
class RoleLowering {
 public:
  RoleLowering(const BodyShape& shape, int32_t pipeline_rank, Role& role);

  StepBodies Build(const std::vector<ChunkLayers>& chunks);

 private:
  // --- buffers and ops ---
  int32_t Buf(std::string name, std::vector<int64_t> shape, DType dtype,
              BufferKind kind = BufferKind::Scratch);
  int32_t Act(const std::string& name, std::vector<int64_t> shape) {
    return Buf(Prefix() + name, std::move(shape), act_);
  }
  int32_t Stat(const std::string& name, std::vector<int64_t> shape) {
    return Buf(Prefix() + name, std::move(shape), DType::F32);
  }
  std::string Prefix() const {
    return layer_ >= 0 ? fmt::format("layers.{}.{}", layer_, recompute_prefix_)
                       : fmt::format("chunk{}.", chunk_);
  }

  // Appends the op of the typed attributes `a` (runtime/format/ops.h) to the current body.
  template <typename A>
  Op& Emit(const A& a, std::vector<int32_t> in, std::vector<int32_t> out,
           CommKind comm = CommKind::None) {
    body_->ops.push_back(prog::MakeOp(a, std::move(in), std::move(out), comm));
    return body_->ops.back();
  }

  // A CopyColumns op's attributes (runtime/format/README.md): `groups` groups of `width` columns
  // of x (rows of x_cols, group g at x_offset + g·x_stride) into y (likewise); the column maps
  // between per-head and latent buffers (latent attention) and MTP's concatenation. Reversed:
  // the same copy read backward, from y's columns into x's.
  static prog::attrs::CopyColumns Columns(int64_t groups, int64_t width, int64_t x_cols,
                                          int64_t x_stride, int64_t x_offset, int64_t y_cols,
                                          int64_t y_stride, int64_t y_offset,
                                          bool accumulate = false);
  static prog::attrs::CopyColumns Reversed(const prog::attrs::CopyColumns& c, bool accumulate);

  // Parameters: storage is a view into the chunk's bucket, created when the bucket is built.
  struct ParamRef {
    int32_t param = -1;
    int32_t value = -1;  // buffer
    int32_t grad = -1;   // buffer
  };
  ParamRef AddParam(const std::string& name, int64_t key, std::vector<int64_t> global,
                    int32_t split_dim, prog::InitKind init, double std, bool decay,
                    bool tp_replicated, bool grad_sync_tp, bool counts_in_norm = true,
                    CommKind split_comm = CommKind::Tp);
  // Init std of the output projections (Megatron / GPT-2 scaled init).
  double OutStd() const { return 0.02 / std::sqrt(2.0 * static_cast<double>(m_.layers)); }
  int64_t LayerKey(int32_t layer, int32_t j) const {
    return 1000 + static_cast<int64_t>(layer) * 64 + j;
  }

  // --- model pieces ---
  struct NormParams {
    ParamRef w, b;
  };
  // The model's norm over `width` columns (default: hidden), replicated over tp; its gradient is
  // summed over Tp when `grad_sync_tp` (default: under sequence parallelism, where each rank
  // normalises its own rows).
  NormParams MakeNorm(const std::string& name, int64_t key, int64_t width = 0,
                      std::optional<bool> grad_sync_tp = std::nullopt);
  struct NormOut {
    int32_t y = -1, mean = -1, rstd = -1;
  };
  // x as `rows` rows of `width` columns (default: the residual stream's rows_ x hidden).
  NormOut NormForward(const std::string& name, const NormParams& np, int32_t x, int64_t rows = 0,
                      int64_t width = 0);
  void NormBackward(const NormParams& np, const NormOut& o, int32_t x, int32_t dy, int32_t dx,
                    bool accumulate);
  // The activation of a non-gated MLP (GELU or squared ReLU) and its backward.
  bool NonGated() const { return m_.activation != prog::ActivationKind::SwiGlu; }
  void EmitActivation(int32_t x, int32_t y);
  void EmitActivationBackward(int32_t dy, int32_t x, int32_t dx);
  // Sequence-parallel region entry: rows_ -> tokens_ rows.
  int32_t GatherSp(int32_t x, const std::string& name, int64_t cols);
  // Row-parallel exit: a partial [tokens_, cols] -> all-reduce in place, or reduce-scatter to
  // rows_.
  int32_t ReducePartial(int32_t partial, const std::string& name, int64_t cols);
  int32_t ReduceGradToRows(int32_t partial_full, const std::string& name) {
    return ReducePartial(partial_full, name, m_.hidden);
  }

  // --- mixture of experts: params and saved buffers of an MoE layer (body.h MoeShape) ---
  struct MoeParams {
    ParamRef router, gate, up, down;               // gate unused with GELU (up is fc1, down fc2)
    ParamRef shared_gate, shared_up, shared_down;  // shared experts (-1 when none)
    int32_t bias = -1, load = -1;  // aux-loss-free balancing's State buffers (-1 when none)
  };
  struct ExpertBias {
    int32_t bias, load;
  };
  std::vector<ExpertBias> expert_bias_;  // every MoE layer of the role with an expert bias
  // --- expert tensor parallelism ---
  // The tokens the experts of an Etp group see, with their router weights and choices: this
  // rank's rows and routing, or under sequence parallelism the group's rows and their gathered
  // logits routed again (GatherEtpTokens).
  struct EtpTokens {
    int32_t x = -1, w = -1, idx = -1;
    int64_t rows = 0;
  };
  // --- end expert tensor parallelism ---
  struct MoeSaved {
    int32_t logits = -1, w = -1, idx = -1, scores = -1, counts = -1;  // router
    EtpTokens etp;                                                    // the experts' tokens
    int32_t capacity_mask = -1;  // moe.capacity_factor: the kept pairs (etp.w is then the kept)
    int32_t xp = -1, row_map = -1, expert_counts = -1;  // dispatch
    int32_t g = -1, u = -1, a = -1, y = -1;             // experts
    int32_t sg = -1, su = -1, sa = -1;                  // shared experts
    // The experts' input rows and their per-group counts: xp and expert_counts with ep = 1; with
    // ep > 1 the rows dispatched to this rank's experts and their per-local-expert counts.
    int32_t xe = -1, ecounts = -1;
    int32_t split = -1;  // ep > 1: [ep, local experts] rows each peer sends this rank
  };
  // --- end mixture of experts ---
  // --- multi-head latent attention: params and saved buffers (body.h, "Multi-head latent
  // attention") ---
  struct MlaParams {
    ParamRef wq_down, wq_up, wq;  // wq_down / wq_up with q_lora_rank > 0, else wq
    ParamRef wkv_down, wkv_up;
    NormParams q_norm, kv_norm;  // RMSNorm of the latent rows (q_norm with q_lora_rank > 0)
  };
  struct MlaSaved {
    int32_t q_latent = -1, q_normed = -1, q_rstd = -1;  // q_lora_rank > 0
    int32_t kv_latent = -1, kv_normed = -1, kv_rstd = -1;
    int32_t kv_rope = -1;   // the kv latent with the shared rope head's columns, before RoPE
    int32_t core_out = -1;  // the attention core's output, v padded to the qk head size
  };
  // --- end multi-head latent attention ---
  struct LayerParams {
    NormParams n1, n2;
    NormParams qn, kn;  // query and key norms (model.qk_norm)
    bool qk_norm = false;
    ParamRef wq, wk, wv, wo, bq, bk, bv, bo, w1, w3, w2, b1, b2;
    bool moe = false;
    MoeParams experts;
    bool mla = false;
    MlaParams latent;
  };
  // The buffers of one layer's forward that its backward reads.
  struct LayerSaved {
    int32_t x = -1, n1f = -1, q = -1, k = -1, v = -1, o = -1, lse = -1, x1 = -1, n2f = -1, g = -1,
            u = -1, a = -1;
    int32_t q_pre = -1, k_pre = -1;  // the projections before the query and key norms
    NormOut no1, no2, qno, kno;
    MoeSaved moe;
    MlaSaved mla;
  };
  // Emits one layer's forward into body_ from input x. With `next` >= 0 the whole layer, ending
  // in the residual add into `next`; with next = -1 (recompute) it stops after the MLP
  // activation, the last tensor the backward reads.
  LayerSaved LayerForward(const LayerParams& P, int32_t x, int32_t next);
  // What the MLP or MoE backward reads of the MLP norm's output, from the kept rows: gathered
  // again under sequence parallelism, after the norm itself is made again from the residual x1
  // when `norm` (selective recompute's layernorm module).
  void RemakeMlpInput(const LayerParams& params, LayerSaved& saved, bool norm);
  std::vector<int32_t> LinearInputs(int32_t in, const ParamRef& w, const ParamRef& b) const {
    std::vector<int32_t> v = {in, w.value};
    if (b.value >= 0) v.push_back(b.value);
    return v;
  }
  // The attributes of the attention core's ops (Attention, RingAttention and their backward:
  // the same fields). Latent attention (kv_lora_rank > 0) runs every head as its own key/value
  // head at the query/key head size, its values padded to it.
  template <typename A>
  A AttentionAttrs() const {
    const bool mla = m_.kv_lora_rank > 0;
    const int64_t hd = mla ? m_.qk_nope_head_dim + m_.qk_rope_head_dim : m_.head_dim;
    return A{.micro = m_.micro_batch,
             .seq = m_.seq_len,
             .heads = m_.heads / tp_,
             .kv_heads = (mla ? m_.heads : m_.kv_heads) / tp_,
             .head_dim = hd,
             .scale = 1.0 / std::sqrt(static_cast<double>(hd)),
             .window = m_.window};
  }

  // --- context parallelism ---
  // The causal attention core of a layer: Attention, or with cp > 1 RingAttention with its
  // working buffers (K/V travel the Cp ring). `o` and `lse` are created here.
  void EmitAttentionCore(const std::string& name, int32_t q, int32_t k, int32_t v, int32_t& o,
                         int32_t& lse);
  void EmitAttentionCoreBackward(int32_t dout, const LayerSaved& saved, int32_t o, int32_t lse,
                                 int32_t dq, int32_t dk, int32_t dv);
  // The learned position table's add and its backward: with cp > 1 over Cp, taking the
  // positions of the rank's two chunks (and, under sequence parallelism, the rank's rows of
  // them, from its Tp index); else over Tp under sequence parallelism.
  CommKind PositionComm() const {
    if (cp_ > 1) return cp_comm_;
    return p_.sp ? tp_comm_ : CommKind::None;
  }
  // --- end context parallelism ---

  // The gradient outputs of LinearBackward: dx, the weight's grad, and the bias's when present.
  std::vector<int32_t> LinearGrads(int32_t dx, const ParamRef& w, const ParamRef& b) const {
    std::vector<int32_t> v = {dx, w.grad};
    if (b.grad >= 0) v.push_back(b.grad);
    return v;
  }

  // The output head of the model and of each MTP module: a norm of the rows `x`, its output
  // gathered over the sequence, the logits of the (shared) output layer, the labels and the
  // cross-entropy statistics; the backward reads all of them.
  struct OutputHead {
    NormOut norm;
    int32_t x = -1, nff = -1, logits = -1, labels = -1, cmax = -1, cst = -1;
  };
  // Forward of a head named by `stem` ("" for the model's, "mtp{k}." for a module's): labels
  // `shift` positions further ahead than the next token, the loss added into `loss_sum` with
  // `scale`.
  OutputHead EmitHeadForward(const std::string& stem, const NormParams& norm, int32_t x,
                             const ParamRef& out_w, int64_t shift, int32_t loss_sum, double scale);
  // Its backward, the loss's gradient scaled by `grad_scale`: the gradient of x into `dx`
  // (written), with `more` (>= 0), the gradient of the norm's output from elsewhere, added first.
  void EmitHeadBackward(const std::string& stem, const OutputHead& head, const NormParams& norm,
                        const ParamRef& out_w, double grad_scale, int32_t more, int32_t dx);
  // --- multi-token prediction (body.h, "Multi-token prediction") ---
  // One module's params: the norms of the embedding and of the hidden rows, the 2h -> h
  // projection of their concatenation, one layer of the last layer's kind, its final norm.
  struct MtpParams {
    NormParams enorm, hnorm, final_norm;
    ParamRef proj;
    LayerParams layer;
    int32_t layer_index = 0;  // model.layers + depth - 1: its params' names and init keys
  };
  // One module's forward buffers its backward reads.
  struct MtpForward {
    int32_t hidden = -1;  // the rows it starts from: the previous depth's final norm output
    int32_t ids = -1, e = -1, cat = -1, x = -1;
    NormOut en, hn;
    LayerSaved layer;
    OutputHead head;  // from the layer's output (head.x)
  };
  // --- end multi-token prediction ---
  // The params of one chunk, in the order they are created.
  struct ChunkParams {
    ParamRef word, pos, out_w;
    NormParams final_norm;
    std::vector<LayerParams> layers;
    ParamRef mtp_word;  // the word embedding the MTP modules read (this role's or its copy)
    std::vector<MtpParams> mtp;
  };
  // The buffers of a chunk's forward that its backward reads.
  struct ChunkForward {
    int32_t ids = -1;  // token ids (the chunk with the embedding)
    int32_t x = -1;    // the residual stream after the last layer
    std::vector<LayerSaved> layers;
    OutputHead head;  // the chunk with the loss
    std::vector<MtpForward> mtp;
  };

  void BuildChunk(int32_t index, const ChunkLayers& layers, Chunk& chunk);
  ChunkParams MakeChunkParams(const ChunkLayers& cl);
  // Layer `layer_index`'s params, of the kind (dense or MoE) of layer `kind_of` (default: itself).
  LayerParams MakeLayerParams(int32_t layer_index, int32_t kind_of = -1);
  // q, k, v (biases), o of ordinary attention.
  void MakeDenseAttentionParams(int32_t layer_index, LayerParams& params);
  // The output layer's weight: the word embedding itself when this role holds it, the last
  // stage's tied copy of it, or an untied output weight.
  ParamRef MakeOutputWeight(bool embedding);
  ChunkForward EmitChunkForward(const ChunkLayers& cl, const ChunkParams& params, Chunk& chunk);
  void EmitEmbeddingForward(const ChunkParams& params, ChunkForward& forward);
  void EmitLossForward(const ChunkParams& params, ChunkForward& forward);
  // The cross-entropy of `logits` against `labels` (vocab-parallel: the max and sums over Tp),
  // its loss added into `loss_sum` with `scale`; sets cmax and cst (named `stem`loss.*).
  void EmitCrossEntropy(const std::string& stem, int32_t logits, int32_t labels, int32_t loss_sum,
                        double scale, int32_t& cmax, int32_t& cst);
  void EmitChunkBackward(const ChunkLayers& cl, const ChunkParams& params,
                         const ChunkForward& forward, Chunk& chunk);
  void EmitLossBackward(const ChunkParams& params, const ChunkForward& forward, int32_t gx);
  // --- multi-token prediction ---
  void MakeMtpParams(const ChunkLayers& cl, ChunkParams& params);
  void EmitMtpForward(const ChunkParams& params, ChunkForward& forward);
  // The factor from the mean over all rows to the mean over the positions depth k does not ignore.
  double KeptShare(int32_t depth) const;
  // The modules' backward, last first; returns the gradient of the rows the first module started
  // from (the model's final norm output), which the model's loss backward adds to its own.
  int32_t EmitMtpBackward(const ChunkParams& params, const ChunkForward& forward);
  // --- end multi-token prediction ---
  // One layer's backward, accumulating into gx; with `recompute` its forward runs first, from the
  // layer's stashed input; `fresh` when `stashed` was just recomputed (uniform groups: nothing to
  // gather again).
  void LayerBackward(const LayerParams& params, const LayerSaved& stashed, int32_t gx,
                     bool recompute, bool fresh = false);
  // The layers' backward of one chunk under full recompute (BodyShape::recompute_layers).
  void RecomputedLayersBackward(const ChunkLayers& cl, const ChunkParams& params,
                                const ChunkForward& forward, int32_t gx);
  // The dense MLP's forward from the norm's output saved.no2.y up to its activation: sets
  // saved.n2f, g, u (gated) and a.
  void MlpActivations(const LayerParams& P, LayerSaved& saved);
  void MlpBackward(const LayerParams& params, const LayerSaved& stashed, int32_t gx);
  // --- mixture of experts ---
  MoeParams MakeMoeParams(int32_t layer_index);
  // The MoE block's forward from the normed rows; with next >= 0 it adds the combined output
  // (and the shared experts') to the residual into `next`, with next = -1 (recompute) it stops
  // after the experts' down projection, the last tensor the backward reads.
  void MoeForward(const LayerParams& params, LayerSaved& saved, int32_t next);
  // The experts' activation the down projection's backward reads: the forward's, or with the
  // moe_act module of selective recompute, made again from gate and up right there.
  int32_t ExpertActivationForBackward(const MoeParams& ex, const MoeSaved& ms, int64_t rows,
                                      int64_t width);
  // The shared experts' backward from the layer output's gradient gx (gxe: its Etp-gathered
  // rows, or gx): returns the MLP norm output's gradient, dn2 (the routed path's) plus theirs.
  int32_t SharedExpertsBackward(const MoeParams& ex, const LayerSaved& saved, int32_t gx,
                                int32_t gxe, int32_t dn2);
  void MoeBackward(const LayerParams& params, const LayerSaved& saved, int32_t gx);
  // An expert weight of global shape `global`: whole on every rank (etp = 1, replicated over tp,
  // its gradient a partial sum over tp under sequence parallelism), or split on `split_dim`
  // over the Etp group.
  ParamRef AddExpertParam(const std::string& name, int64_t key, std::vector<int64_t> global,
                          int32_t split_dim, double std);
  // --- expert tensor parallelism (body.h MoeShape) ---
  bool SplitsExperts() const { return s_.moe.etp > 1; }
  // The rows the experts of an Etp group see: the group's gathered rows under sequence
  // parallelism, else this rank's.
  int64_t EtpRows() const { return SplitsExperts() && p_.sp ? rows_ * s_.moe.etp : rows_; }
  // Before dispatch: the tokens (rows x with their router weights and choices) every rank of the
  // Etp group runs its expert slices on, from this rank's rows x and their routing.
  // MoeRouter on `logits` with the model's score function, group-limited choice,
  // renormalisation and scale, the expert bias when there is one (bias >= 0); outputs: weights,
  // indices, scores, counts.
  void EmitRouter(int32_t logits, int32_t bias, std::vector<int32_t> outputs);
  // MoeRouter's and MoeRouterBackward's `scale`: unset when the model's factor is 1, so that
  // programs without one keep their bytes.
  std::optional<double> RouterScale() const {
    return s_.moe.router_scale != 1 ? std::optional<double>(s_.moe.router_scale) : std::nullopt;
  }
  EtpTokens GatherEtpTokens(int32_t x, const MoeSaved& local, int32_t bias);
  // moe.capacity_factor > 0: replaces the dispatch weights by the kept ones (MoeCapacity).
  void DropPastCapacity(MoeSaved& ms);
  // moe.capacity_factor > 0: the pairs each expert keeps from one rank's rows, Megatron-Core's
  // get_capacity ceil(rows · topk / experts · factor); 0 without a capacity factor.
  int64_t ExpertCapacity() const;
  // The runs of rows that each drop past their own capacity: the Etp group's members' rows when
  // gathered, else this rank's rows.
  int64_t CapacitySegments() const { return EtpRows() / rows_; }
  // Rows of the routed buffers (MoePermute's rows, the combined rows and, with ep = 1, the
  // experts' rows): every routed pair, or with a capacity factor at most every expert's
  // capacity in every segment, when smaller (the dropped pairs are never permuted).
  int64_t RoutedRows() const;
  // After the combine: a partial sum over the expert slices, [etp rows, cols], reduced over the
  // Etp group to this rank's rows (reduce-scatter, or all-reduce in place without sequence
  // parallelism).
  int32_t ReduceEtpPartial(int32_t partial, const std::string& name, int64_t cols);
  // The backward's entry: the gradient of this rank's rows, gathered to the Etp group's tokens.
  int32_t GatherEtpGrad(int32_t grad, const std::string& name, int64_t cols);
  // --- end expert tensor parallelism ---
  // A dense gated (or GELU) MLP of width `ffn` (global), tensor-parallel, no biases: gate/up into
  // *g, *u and the activation into *a; the down projection reduced to rows when `out` >= 0.
  void DenseExpertForward(const std::string& name, int32_t xf, const ParamRef& gate,
                          const ParamRef& up, const ParamRef& down, int64_t ffn, int32_t* g,
                          int32_t* u, int32_t* a, int32_t* out);
  // --- expert parallelism (ep > 1): token dispatch over the Ep group ---
  bool ExpertParallel() const { return ep_ > 1 && s_.moe.experts > 0; }
  int64_t LocalExperts() const { return s_.moe.experts / ep_; }
  // Rows a rank's experts may receive: the worst case, every row of each Ep peer choosing
  // min(topk, local experts) of them, or with a capacity factor every peer sending each local
  // expert its capacity from every segment, if fewer; or, when the plan states a routing
  // imbalance, that many times the balanced share (rows · topk), if smaller. The dispatch fails
  // the run when more rows arrive than the buffer holds.
  // (Under expert tensor parallelism with sequence parallelism a rank dispatches the Etp group's
  // gathered rows.)
  int64_t DispatchCapacity() const;
  // Whether the routed experts sit in a bucket of their own per chunk, their gradients reduced
  // once over Edp and, from ZeRO 1, their optimizer state sharded over it, as Megatron-Core's
  // expert data-parallel group: with ep > 1, and with ep = 1 and etp = 1 beside tp > 1 under
  // sequence parallelism and ZeRO 0 or 1. There each Tp rank routes its own rows, so its expert
  // gradients are partial sums over Tp, and Edp = tp · cp · dp spans the stage's ranks. Otherwise
  // (ep = 1) the experts stay in the chunk's buckets beside the dense params, sharded over
  // dp · cp: with etp = tp Edp is DpCp anyway; without sequence parallelism every Tp rank holds
  // the whole gradient, which a sum over Tp would count tp times; ZeRO 2 and 3 reduce per layer.
  bool ExpertsOverEdp() const;
  // Marks the expert param just added as the experts' (ExpertsOverEdp): split over Ep, dimension
  // 0 (the expert) sharded (one way with ep = 1), the init keyed by the global expert index; its
  // gradient is reduced over Edp, not Tp or Dp.
  void ShardExpertParam(const ParamRef& ref);
  bool IsExpertSharded(int32_t param) const {
    return role_.params[param].split_comm == CommKind::Ep;
  }
  bool IsExpertBucket(const Bucket& b) const;
  // Forward: exchanges the counts and sends each row to the rank of its expert; sets ms.split,
  // ms.xe and ms.ecounts. EpCombine returns the experts' output rows to their senders.
  void EpDispatch(MoeSaved& ms);
  int32_t EpCombine(const MoeSaved& ms, int32_t local_rows, const std::string& name);
  // Backward: the combine's gradient goes to the experts' ranks (a dispatch), the experts' input
  // gradient comes back (a combine).
  int32_t EpDispatchGrad(const MoeSaved& ms, int32_t grad_rows, const std::string& name);
  // ReduceGrads: the ranks holding the same experts sum their grads over Edp (reduce-scatter
  // them under ZeRO 1).
  void EmitExpertGradReduction();
  // --- end expert parallelism ---
  // --- end mixture of experts ---
  void AttentionBackward(const LayerParams& params, const LayerSaved& saved, int32_t gx);
  // --- multi-head latent attention ---
  MlaParams MakeMlaParams(int32_t layer_index, ParamRef* wo);
  // From the gathered normed rows saved.n1f: the latent projections, decoupled RoPE, the
  // attention core; sets saved.q, k, v (v padded), o (v head size), lse and saved.mla.
  void MlaForward(const LayerParams& params, LayerSaved& saved);
  // The up projections and RoPE: q, k and v (padded) from the latents (or q from the norm's
  // output), what the mla_up_proj module of selective recompute makes again.
  void MlaUpProjections(const LayerParams& params, LayerSaved& saved);
  void MlaBackward(const LayerParams& params, const LayerSaved& saved, int32_t gx);
  // --- end multi-head latent attention ---
  void BuildBuckets();
  void ScopeBucketsInBodies();
  StepBodies BuildStepBodies();
  void EmitGradNormSquare(int32_t nsq, bool sharded);
  void ClassifyStash();
  // ZeRO 3's gather of a bucket's params and ZeRO 2/3's reduction of its grads into the shard,
  // over the bucket's ZeRO group (Dp, DpCp, or Edp for the experts').
  void GatherBucket(const Bucket& b);
  void ReduceBucketIntoShard(const Bucket& b);

  const BodyShape& s_;
  const ModelConfig& m_;
  const ParallelConfig& p_;
  Role& role_;
  int32_t pipeline_rank_;
  int64_t tp_ = 1, tokens_ = 0, rows_ = 0;
  int64_t cp_ = 1;                     // context-parallel ranks sharing each sequence
  CommKind cp_comm_ = CommKind::None;  // Cp when cp > 1: ring attention, RoPE, data
  DType act_ = DType::Bf16;
  CommKind tp_comm_ = CommKind::None;
  // --- context parallelism ---
  int64_t shard_ = 1;                   // the ZeRO group: dp · cp ranks
  CommKind shard_comm_ = CommKind::Dp;  // DpCp when cp > 1, else Dp; Shard under hybrid sharding
  int64_t replicate_ = 1;               // hybrid sharding's replicas (Replicate group), else 1
  // --- end context parallelism ---
  bool shard_grads_ = false;    // ZeRO >= 2, dp · cp > 1: grads reduce-scattered per backward
  bool gather_params_ = false;  // ZeRO >= 3, dp · cp > 1: params gathered in the bodies, per layer
  int64_t ep_ = 1;              // expert parallelism: Ep ranks sharing the experts of a layer
  int64_t edp_ = 1;             // the Edp group: tp · cp · dp / (ep · etp) ranks
  std::vector<std::string> param_group_;  // per param: its bucket group with ZeRO >= 2
  int32_t chunk_ = -1, layer_ = -1;
  std::string recompute_prefix_;  // "recompute." while re-emitting a forward in a backward body
  Body* body_ = nullptr;
  int32_t loss_sum_ = -1;
  int32_t mtp_loss_sum_ = -1;          // the MTP modules' mean loss (model.mtp_layers > 0)
  int32_t word_embedding_param_ = -1;  // on this role, -1 when absent
  // The last stage's copy of the word embedding (pp > 1), for tied output weights or the MTP
  // modules: its gradient is summed with the first stage's over the Embedding group.
  int32_t output_copy_param_ = -1;
};

}  // namespace paraplan::lower::detail

#endif  // PARAPLAN_COMPILER_LOWER_BODY_INTERNAL_H_
