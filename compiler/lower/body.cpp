// Chunk and step bodies (see body.h). Every op written here is described in
// runtime/format/README.md; keep the two in step.
#include "compiler/lower/body.h"

#include <fmt/format.h>

#include <cmath>
#include <map>
#include <set>

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

namespace {

constexpr int64_t kParamAlignElements = 64;  // each param starts 64-element aligned in its bucket

// Builds one role. Buffers are created as Scratch; after all bodies exist, a buffer a chunk's
// forward and backward both touch becomes Stash (kept per microbatch).
class RoleLowering {
 public:
  RoleLowering(const BodyShape& shape, int32_t pipeline_rank, Role& role)
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
    shard_grads_ = p_.zero >= 2 && shard_ > 1;
    gather_params_ = p_.zero >= 3 && shard_ > 1;
    // --- expert parallelism: each Ep rank holds experts / ep experts; the ranks holding the same
    // expert slices (tp · cp · dp / (ep · etp) of them) form the Edp group ---
    ep_ = std::max<int64_t>(1, p_.ep);
    edp_ = std::max<int64_t>(
        1, static_cast<int64_t>(tp_) * cp_ * p_.dp / (ep_ * std::max<int64_t>(1, s_.moe.etp)));
  }

  StepBodies Build(const std::vector<ChunkLayers>& chunks);

 private:
  // --- buffers and ops ---
  int32_t Buf(std::string name, std::vector<int64_t> shape, DType dtype,
              BufferKind kind = BufferKind::Scratch) {
    Buffer b;
    b.name = std::move(name);
    b.kind = kind;
    b.dtype = dtype;
    b.shape = std::move(shape);
    role_.buffers.push_back(std::move(b));
    return static_cast<int32_t>(role_.buffers.size() - 1);
  }
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

  // Parameters: storage is a view into the chunk's bucket, created when the bucket is built.
  struct ParamRef {
    int32_t param = -1;
    int32_t value = -1;  // buffer
    int32_t grad = -1;   // buffer
  };
  ParamRef AddParam(const std::string& name, int64_t key, std::vector<int64_t> global,
                    int32_t split_dim, prog::InitKind init, double std, bool decay,
                    bool tp_replicated, bool grad_sync_tp, bool counts_in_norm = true,
                    CommKind split_comm = CommKind::Tp) {
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
    prm.grad = Buf(name + ".grad", local, DType::F32, BufferKind::Grad);
    role_.params.push_back(prm);
    // Bucket group with ZeRO >= 2: the layer, or one group per chunk-level tensor (the word
    // embedding and its tied copy alone, so both stages' buckets line up for the Embedding sum).
    param_group_.push_back(layer_ >= 0 ? fmt::format("layers.{}", layer_) : name);
    return {static_cast<int32_t>(role_.params.size() - 1), prm.buffer, prm.grad};
  }
  // Init std of the output projections (Megatron / GPT-2 scaled init).
  double OutStd() const { return 0.02 / std::sqrt(2.0 * static_cast<double>(m_.layers)); }
  int64_t LayerKey(int32_t layer, int32_t j) const {
    return 1000 + static_cast<int64_t>(layer) * 64 + j;
  }

  // --- model pieces ---
  struct NormParams {
    ParamRef w, b;
  };
  NormParams MakeNorm(const std::string& name, int64_t key) {
    NormParams n;
    bool ln = m_.norm == prog::NormKind::LayerNorm;
    n.w = AddParam(name + ".weight", key, {m_.hidden}, -1, prog::InitKind::Ones, 0, false, true,
                   p_.sp);
    if (ln)
      n.b = AddParam(name + ".bias", key + 1, {m_.hidden}, -1, prog::InitKind::Zeros, 0, false,
                     true, p_.sp);
    return n;
  }
  struct NormOut {
    int32_t y = -1, mean = -1, rstd = -1;
  };
  NormOut NormForward(const std::string& name, const NormParams& np, int32_t x) {
    NormOut o;
    o.y = Act(name + ".out", {rows_, m_.hidden});
    o.rstd = Stat(name + ".rstd", {rows_});
    if (m_.norm == prog::NormKind::LayerNorm) {
      o.mean = Stat(name + ".mean", {rows_});
      Emit(attrs::LayerNorm{.eps = m_.norm_eps}, {x, np.w.value, np.b.value},
           {o.y, o.mean, o.rstd});
    } else {
      Emit(attrs::RmsNorm{.eps = m_.norm_eps}, {x, np.w.value}, {o.y, o.rstd});
    }
    return o;
  }
  void NormBackward(const NormParams& np, const NormOut& o, int32_t x, int32_t dy, int32_t dx,
                    bool accumulate) {
    if (m_.norm == prog::NormKind::LayerNorm)
      Emit(attrs::LayerNormBackward{.dx_accumulate = accumulate},
           {dy, x, np.w.value, o.mean, o.rstd}, {dx, np.w.grad, np.b.grad});
    else
      Emit(attrs::RmsNormBackward{.dx_accumulate = accumulate}, {dy, x, np.w.value, o.rstd},
           {dx, np.w.grad});
  }
  // Sequence-parallel region entry: rows_ -> tokens_ rows.
  int32_t GatherSp(int32_t x, const std::string& name, int64_t cols) {
    if (!p_.sp || tp_ == 1) return x;
    int32_t full = Act(name, {tokens_, cols});
    Emit(attrs::AllGather{}, {x}, {full}, CommKind::Tp);
    return full;
  }
  // Row-parallel exit: a partial [tokens_, cols] -> all-reduce in place, or reduce-scatter to
  // rows_.
  int32_t ReducePartial(int32_t partial, const std::string& name, int64_t cols) {
    if (tp_ == 1) return partial;
    if (!p_.sp) {
      Emit(attrs::AllReduce{}, {partial}, {partial}, CommKind::Tp);
      return partial;
    }
    int32_t out = Act(name, {rows_, cols});
    Emit(attrs::ReduceScatter{}, {partial}, {out}, CommKind::Tp);
    return out;
  }
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
    int32_t core_out = -1;  // the attention core's output, v padded to the qk head size
  };
  // --- end multi-head latent attention ---
  struct LayerParams {
    NormParams n1, n2;
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
    NormOut no1, no2;
    MoeSaved moe;
    MlaSaved mla;
  };
  // Emits one layer's forward into body_ from input x. With `next` >= 0 the whole layer, ending
  // in the residual add into `next`; with next = -1 (recompute) it stops after the MLP
  // activation, the last tensor the backward reads.
  LayerSaved LayerForward(const LayerParams& P, int32_t x, int32_t next);
  std::vector<int32_t> LinearInputs(int32_t in, const ParamRef& w, const ParamRef& b) const {
    std::vector<int32_t> v = {in, w.value};
    if (b.value >= 0) v.push_back(b.value);
    return v;
  }
  // The attributes of Attention and AttentionBackward (the same fields).
  template <typename A>
  A AttentionAttrs() const {
    return A{.micro = m_.micro_batch,
             .seq = m_.seq_len,
             .heads = m_.heads / tp_,
             .kv_heads = m_.kv_heads / tp_,
             .head_dim = m_.head_dim,
             .scale = 1.0 / std::sqrt(static_cast<double>(m_.head_dim))};
  }

  // --- context parallelism ---
  // The causal attention core of a layer: Attention, or with cp > 1 RingAttention with its
  // working buffers (K/V travel the Cp ring). `o` and `lse` are created here.
  void EmitAttentionCore(const std::string& name, int32_t q, int32_t k, int32_t v, int32_t& o,
                         int32_t& lse) {
    const int64_t heads = m_.heads / tp_, kv = m_.kv_heads / tp_, hd = m_.head_dim;
    o = Act(name + ".out", {tokens_, heads * hd});
    if (cp_ == 1) {
      lse = Stat(name + ".lse", {m_.micro_batch, heads, m_.seq_len});
      Emit(AttentionAttrs<attrs::Attention>(), {q, k, v}, {o, lse});
      return;
    }
    lse = Stat(name + ".lse", {tokens_, heads});
    const int32_t ring = Act(name + ".ring", {4 * tokens_ * kv * hd});
    const int32_t block_o = Act(name + ".block_o", {tokens_, heads * hd});
    const int32_t block_lse = Stat(name + ".block_lse", {tokens_, heads});
    Emit(AttentionAttrs<attrs::RingAttention>(), {q, k, v}, {o, lse, ring, block_o, block_lse},
         cp_comm_);
  }
  void EmitAttentionCoreBackward(int32_t dout, const LayerSaved& saved, int32_t o, int32_t lse,
                                 int32_t dq, int32_t dk, int32_t dv) {
    const std::vector<int32_t> in = {dout, saved.q, saved.k, saved.v, o, lse};
    if (cp_ == 1) {
      Emit(AttentionAttrs<attrs::AttentionBackward>(), in, {dq, dk, dv});
      return;
    }
    const int64_t kv = m_.kv_heads / tp_, hd = m_.head_dim;
    const int32_t ring = Act("attention.ring.grad", {8 * tokens_ * kv * hd});
    Emit(AttentionAttrs<attrs::RingAttentionBackward>(), in, {dq, dk, dv, ring}, cp_comm_);
  }
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

  // The params of one chunk, in the order they are created.
  struct ChunkParams {
    ParamRef word, pos, out_w;
    NormParams final_norm;
    std::vector<LayerParams> layers;
  };
  // The buffers of a chunk's forward that its backward reads.
  struct ChunkForward {
    int32_t ids = -1;  // token ids (the chunk with the embedding)
    int32_t x = -1;    // the residual stream after the last layer
    std::vector<LayerSaved> layers;
    NormOut final_norm;
    int32_t nff = -1, logits = -1, labels = -1, cmax = -1, cst = -1;  // the chunk with the loss
  };

  void BuildChunk(int32_t index, const ChunkLayers& layers, Chunk& chunk);
  ChunkParams MakeChunkParams(const ChunkLayers& cl);
  LayerParams MakeLayerParams(int32_t layer_index);
  // q, k, v (biases), o of ordinary attention.
  void MakeDenseAttentionParams(int32_t layer_index, LayerParams& params);
  // The output layer's weight: the word embedding itself when this role holds it, the last
  // stage's tied copy of it, or an untied output weight.
  ParamRef MakeOutputWeight(bool embedding);
  ChunkForward EmitChunkForward(const ChunkLayers& cl, const ChunkParams& params, Chunk& chunk);
  void EmitEmbeddingForward(const ChunkParams& params, ChunkForward& forward);
  void EmitLossForward(const ChunkParams& params, ChunkForward& forward);
  void EmitChunkBackward(const ChunkLayers& cl, const ChunkParams& params,
                         const ChunkForward& forward, Chunk& chunk);
  void EmitLossBackward(const ChunkParams& params, const ChunkForward& forward, int32_t gx);
  // One layer's backward, accumulating into gx; with full recompute its forward runs first.
  void LayerBackward(const LayerParams& params, const LayerSaved& stashed, int32_t gx);
  void MlpBackward(const LayerParams& params, const LayerSaved& saved, int32_t gx);
  // --- mixture of experts ---
  MoeParams MakeMoeParams(int32_t layer_index);
  // The MoE block's forward from the normed rows; with next >= 0 it adds the combined output
  // (and the shared experts') to the residual into `next`, with next = -1 (recompute) it stops
  // after the experts' down projection, the last tensor the backward reads.
  void MoeForward(const LayerParams& params, LayerSaved& saved, int32_t next);
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
  EtpTokens GatherEtpTokens(int32_t x, const MoeSaved& local, int32_t bias);
  // moe.capacity_factor > 0: replaces the dispatch weights by the kept ones (MoeCapacity).
  void DropPastCapacity(MoeSaved& ms);
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
  // min(topk, local experts) of them; or, when the plan states a routing imbalance, that many
  // times the balanced share (rows · topk), if smaller. The dispatch fails the run when more
  // rows arrive than the buffer holds.
  // (Under expert tensor parallelism with sequence parallelism a rank dispatches the Etp group's
  // gathered rows.)
  int64_t DispatchCapacity() const {
    const int64_t rows = EtpRows();
    const int64_t worst = ep_ * rows * std::min<int64_t>(s_.moe.topk, LocalExperts());
    if (s_.moe.imbalance <= 0) return worst;
    const auto stated =
        static_cast<int64_t>(std::ceil(s_.moe.imbalance * static_cast<double>(rows * s_.moe.topk)));
    return std::min(worst, std::max<int64_t>(stated, 1));
  }
  // Splits the expert param just added over Ep: dimension 0 (the expert) is sharded, the init
  // stays keyed by the global expert index; its gradient is reduced over Edp, not Tp or Dp.
  void ShardExpertParam(const ParamRef& ref);
  bool IsExpertSharded(int32_t param) const {
    return role_.params[param].split_comm == CommKind::Ep;
  }
  bool IsExpertBucket(const Bucket& b) const {
    for (size_t i = 0; i < role_.params.size(); ++i)
      if (IsExpertSharded(static_cast<int32_t>(i)) &&
          role_.buffers[role_.params[i].buffer].view_of == b.params)
        return true;
    return false;
  }
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
  void MlaAttentionCore(const std::string& name, int32_t q, int32_t k, int32_t v, int32_t& o,
                        int32_t& lse);
  void MlaBackward(const LayerParams& params, const LayerSaved& saved, int32_t gx);
  // The column maps between the per-head buffers (local heads) and the latent ones.
  prog::attrs::CopyColumns MlaMap(int64_t groups, int64_t width, int64_t x_cols, int64_t x_stride,
                                  int64_t x_offset, int64_t y_cols, int64_t y_stride,
                                  int64_t y_offset, bool accumulate = false) const {
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
  static prog::attrs::CopyColumns Reversed(const prog::attrs::CopyColumns& c, bool accumulate) {
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
  // --- end multi-head latent attention ---
  void BuildBuckets();
  void ScopeBucketsInBodies();
  StepBodies BuildStepBodies();
  void EmitGradNormSquare(int32_t nsq, bool sharded);
  void ClassifyStash();

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
  CommKind shard_comm_ = CommKind::Dp;  // DpCp when cp > 1, else Dp
  // --- end context parallelism ---
  bool shard_grads_ = false;    // ZeRO >= 2, dp · cp > 1: grads reduce-scattered per backward
  bool gather_params_ = false;  // ZeRO >= 3, dp · cp > 1: params gathered in the bodies, per layer
  int64_t ep_ = 1;              // expert parallelism: Ep ranks sharing the experts of a layer
  int64_t edp_ = 1;             // ranks holding the same experts (Edp), tp · cp · dp / ep
  std::vector<std::string> param_group_;  // per param: its bucket group with ZeRO >= 2
  int32_t chunk_ = -1, layer_ = -1;
  std::string recompute_prefix_;  // "recompute." while re-emitting a forward in a backward body
  Body* body_ = nullptr;
  int32_t loss_sum_ = -1;
  int32_t word_embedding_param_ = -1;  // on this role, -1 when absent
  int32_t output_copy_param_ = -1;     // the last stage's tied copy (pp > 1)
};

RoleLowering::LayerSaved RoleLowering::LayerForward(const LayerParams& P, int32_t x, int32_t next) {
  const int64_t h = m_.hidden, hd = m_.head_dim;
  const int64_t heads = m_.heads / tp_, kv = m_.kv_heads / tp_, ffn = m_.ffn_hidden / tp_;
  const bool gpt = m_.activation == prog::ActivationKind::Gelu;
  LayerSaved layer_saved;
  layer_saved.x = x;
  layer_saved.no1 = NormForward("attention_norm", P.n1, x);
  layer_saved.n1f = GatherSp(layer_saved.no1.y, "attention_norm.out_full", h);
  if (P.mla) {
    MlaForward(P, layer_saved);
  } else {
    layer_saved.q = Act("q", {tokens_, heads * hd});
    layer_saved.k = Act("k", {tokens_, kv * hd});
    layer_saved.v = Act("v", {tokens_, kv * hd});
    Emit(attrs::Linear{}, LinearInputs(layer_saved.n1f, P.wq, P.bq), {layer_saved.q});
    Emit(attrs::Linear{}, LinearInputs(layer_saved.n1f, P.wk, P.bk), {layer_saved.k});
    Emit(attrs::Linear{}, LinearInputs(layer_saved.n1f, P.wv, P.bv), {layer_saved.v});
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
  layer_saved.n2f = GatherSp(layer_saved.no2.y, "mlp_norm.out_full", h);
  if (gpt) {
    layer_saved.g = Act("mlp.fc1_out", {tokens_, ffn});
    Emit(attrs::Linear{}, LinearInputs(layer_saved.n2f, P.w1, P.b1), {layer_saved.g});
    layer_saved.a = Act("mlp.act", {tokens_, ffn});
    Emit(attrs::Gelu{}, {layer_saved.g}, {layer_saved.a});
  } else {
    layer_saved.g = Act("mlp.gate", {tokens_, ffn});
    layer_saved.u = Act("mlp.up", {tokens_, ffn});
    Emit(attrs::Linear{}, {layer_saved.n2f, P.w1.value}, {layer_saved.g});
    Emit(attrs::Linear{}, {layer_saved.n2f, P.w3.value}, {layer_saved.u});
    layer_saved.a = Act("mlp.act", {tokens_, ffn});
    Emit(attrs::SwiGlu{}, {layer_saved.g, layer_saved.u}, {layer_saved.a});
  }
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
  if (bias)
    params.bo =
        AddParam(n + "attention.bo", key(9), {h}, -1, prog::InitKind::Zeros, 0, false, true, p_.sp);
}

RoleLowering::LayerParams RoleLowering::MakeLayerParams(int32_t layer_index) {
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
  if (s_.moe.IsMoeLayer(layer_index)) {
    params.moe = true;
    params.experts = MakeMoeParams(layer_index);
    return params;
  }
  if (m_.activation == prog::ActivationKind::Gelu) {
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
  if (cl.loss)
    EmitLossForward(params, forward);
  else
    chunk.output = forward.x;
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
  const int64_t h = m_.hidden, vocab_local = m_.vocab_padded / tp_;
  forward.final_norm = NormForward("final_norm", params.final_norm, forward.x);
  forward.nff = GatherSp(forward.final_norm.y, "final_norm.out_full", h);
  forward.logits = Act("logits", {tokens_, vocab_local});
  Emit(attrs::Linear{}, {forward.nff, params.out_w.value}, {forward.logits});
  forward.labels = Buf(Prefix() + "labels", {tokens_}, DType::I32);
  Emit(attrs::LoadBatch{.what = BatchPart::kLabels}, {}, {forward.labels}, cp_comm_);
  forward.cmax = Stat("loss.max", {tokens_});
  Emit(attrs::CrossEntropyMax{}, {forward.logits}, {forward.cmax});
  if (tp_ > 1)
    Emit(attrs::AllReduce{.reduce_op = ReduceOp::kMax}, {forward.cmax}, {forward.cmax},
         CommKind::Tp);
  forward.cst = Stat("loss.sumexp_target", {tokens_, 2});
  Emit(attrs::CrossEntropySumExp{}, {forward.logits, forward.cmax, forward.labels}, {forward.cst},
       tp_comm_);
  if (tp_ > 1) Emit(attrs::AllReduce{}, {forward.cst}, {forward.cst}, CommKind::Tp);
  Emit(attrs::CrossEntropyLoss{.scale = 1.0 / static_cast<double>(s_.microbatches)},
       {forward.cmax, forward.cst}, {loss_sum_});
}

void RoleLowering::EmitChunkBackward(const ChunkLayers& cl, const ChunkParams& params,
                                     const ChunkForward& forward, Chunk& chunk) {
  const int64_t h = m_.hidden;
  const int32_t gx = Buf(fmt::format("chunk{}.grad", chunk.index), {rows_, h}, act_);
  chunk.grad = gx;
  if (cl.loss) EmitLossBackward(params, forward, gx);
  for (int32_t i = cl.layers - 1; i >= 0; --i) {
    layer_ = cl.first_layer + i;
    LayerBackward(params.layers[i], forward.layers[i], gx);
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
  const int64_t h = m_.hidden, vocab_local = m_.vocab_padded / tp_;
  const int32_t dz = Act("logits.grad", {tokens_, vocab_local});
  Emit(attrs::CrossEntropyBackward{.grad_scale =
                                       1.0 / static_cast<double>(s_.microbatches * p_.dp * cp_)},
       {forward.logits, forward.cmax, forward.cst, forward.labels}, {dz}, tp_comm_);
  const int32_t dnf = Act("final_norm.out_full.grad", {tokens_, h});
  Emit(attrs::LinearBackward{.dx_accumulate = false}, {dz, forward.nff, params.out_w.value},
       {dnf, params.out_w.grad});
  const int32_t dn = ReduceGradToRows(dnf, "final_norm.out.grad");
  NormBackward(params.final_norm, forward.final_norm, forward.x, dn, gx, /*accumulate=*/false);
}

void RoleLowering::LayerBackward(const LayerParams& params, const LayerSaved& stashed, int32_t gx) {
  LayerSaved saved = stashed;
  if (s_.recompute == ActivationRecompute::kFull) {
    // Re-run the layer's forward from its stashed input, then its backward.
    recompute_prefix_ = "recompute.";
    saved = LayerForward(params, stashed.x, /*next=*/-1);
    recompute_prefix_.clear();
  }
  if (params.moe)
    MoeBackward(params, saved, gx);
  else
    MlpBackward(params, saved, gx);
  if (params.mla)
    MlaBackward(params, saved, gx);
  else
    AttentionBackward(params, saved, gx);
}

void RoleLowering::MlpBackward(const LayerParams& params, const LayerSaved& saved, int32_t gx) {
  const int64_t h = m_.hidden, ffn = m_.ffn_hidden / tp_;
  const int32_t gxf = GatherSp(gx, "mlp.down.grad_full", h);
  if (params.b2.value >= 0) Emit(attrs::AddBiasBackward{}, {gx}, {params.b2.grad});
  const int32_t da = Act("mlp.act.grad", {tokens_, ffn});
  Emit(attrs::LinearBackward{.dx_accumulate = false}, {gxf, saved.a, params.w2.value},
       {da, params.w2.grad});
  const int32_t dn2f = Act("mlp_norm.out_full.grad", {tokens_, h});
  if (m_.activation == prog::ActivationKind::Gelu) {
    const int32_t dg = Act("mlp.fc1_out.grad", {tokens_, ffn});
    Emit(attrs::GeluBackward{}, {da, saved.g}, {dg});
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

// --- mixture of experts (body.h MoeShape) ------------------------------------------------------

RoleLowering::MoeParams RoleLowering::MakeMoeParams(int32_t layer_index) {
  const int64_t h = m_.hidden, e = s_.moe.experts, f = s_.moe.ffn, sf = s_.moe.shared_ffn;
  const bool gpt = m_.activation == prog::ActivationKind::Gelu;
  const std::string n = fmt::format("layers.{}.moe.", layer_index);
  auto key = [&](int32_t j) { return LayerKey(layer_index, j); };
  // Router: replicated over tp; with sequence parallelism each rank routes its own rows, so its
  // gradient is a partial sum over tp. Experts: see AddExpertParam.
  MoeParams params;
  params.router =
      AddParam(n + "router", key(20), {e, h}, -1, prog::InitKind::Normal, 0.02, true, true, p_.sp);
  if (!gpt) params.gate = AddExpertParam(n + "experts.w_gate", key(21), {e, f, h}, 1, 0.02);
  params.up =
      AddExpertParam(n + (gpt ? "experts.fc1" : "experts.w_up"), key(22), {e, f, h}, 1, 0.02);
  params.down =
      AddExpertParam(n + (gpt ? "experts.fc2" : "experts.w_down"), key(23), {e, h, f}, 2, OutStd());
  if (s_.moe.bias_rate > 0) {
    params.bias = Buf(n + "router.expert_bias", {e}, DType::F32, BufferKind::State);
    params.load = Buf(n + "router.expert_load", {e}, DType::F32, BufferKind::Persistent);
    expert_bias_.push_back({params.bias, params.load});
  }
  if (ExpertParallel()) {
    if (params.gate.param >= 0) ShardExpertParam(params.gate);
    ShardExpertParam(params.up);
    ShardExpertParam(params.down);
  }
  if (sf > 0) {
    // Shared experts: one dense MLP of width shared · ffn, tensor-parallel as the dense MLP.
    if (!gpt)
      params.shared_gate = AddParam(n + "shared.w_gate", key(24), {sf, h}, 0,
                                    prog::InitKind::Normal, 0.02, true, false, false);
    params.shared_up = AddParam(n + (gpt ? "shared.fc1" : "shared.w_up"), key(25), {sf, h}, 0,
                                prog::InitKind::Normal, 0.02, true, false, false);
    params.shared_down = AddParam(n + (gpt ? "shared.fc2" : "shared.w_down"), key(26), {h, sf}, 1,
                                  prog::InitKind::Normal, OutStd(), true, false, false);
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
  Emit(
      attrs::MoeRouter{
          .experts = e, .topk = k, .score = s_.moe.score, .normalize = s_.moe.normalize},
      bias >= 0 ? std::vector<int32_t>{logits, bias} : std::vector<int32_t>{logits},
      {t.w, t.idx, Stat("moe.etp.router.scores", {rows, e}), Stat("moe.etp.router.counts", {e})});
  return t;
}

void RoleLowering::DropPastCapacity(MoeSaved& ms) {
  if (s_.moe.capacity_factor <= 0) return;
  const int64_t e = s_.moe.experts, k = s_.moe.topk, rows = ms.etp.rows;
  // Megatron-Core's get_capacity over the routed pairs: ceil(rows · topk / experts · factor).
  const auto capacity = static_cast<int64_t>(
      std::ceil(static_cast<double>(rows * k) / static_cast<double>(e) * s_.moe.capacity_factor));
  const int32_t kept = Act("moe.capacity.kept_weights", {rows, k});
  ms.capacity_mask = Stat("moe.capacity.mask", {rows, k});
  Emit(
      attrs::MoeCapacity{
          .experts = e, .topk = k, .capacity = capacity, .position = s_.moe.drop_by_position},
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
    Emit(attrs::Gelu{}, {*u}, {*a});
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
  Emit(
      attrs::MoeRouter{
          .experts = e, .topk = k, .score = s_.moe.score, .normalize = s_.moe.normalize},
      ex.bias >= 0 ? std::vector<int32_t>{ms.logits, ex.bias} : std::vector<int32_t>{ms.logits},
      {ms.w, ms.idx, ms.scores, ms.counts});
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
  // Dispatch.
  const int64_t routed = ms.etp.rows * k;  // worst case: every choice of every row lands here
  ms.xp = Act("moe.permuted", {routed, h});
  ms.row_map = Buf(Prefix() + "moe.row_map", {routed}, DType::I32);
  ms.expert_counts = Buf(Prefix() + "moe.expert_counts", {e}, DType::I32);
  Emit(attrs::MoePermute{.experts = e, .topk = k}, {ms.etp.x, ms.etp.idx},
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
    Emit(attrs::Gelu{}, {ms.u}, {ms.a});
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

void RoleLowering::MoeBackward(const LayerParams& P, const LayerSaved& saved, int32_t gx) {
  const int64_t h = m_.hidden, e = s_.moe.experts, k = s_.moe.topk, f = s_.moe.ffn / s_.moe.etp;
  const MoeParams& ex = P.experts;
  const MoeSaved& ms = saved.moe;
  const int64_t routed = ms.etp.rows * k;
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
  const int32_t da = Act("moe.experts.act.grad", {erows, f});
  Emit(attrs::GroupedLinearBackward{.groups = groups, .dx_accumulate = false},
       {dye, ms.a, ex.down.value, ms.ecounts}, {da, ex.down.grad});
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
    Emit(attrs::GeluBackward{}, {da, ms.u}, {du});
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
  Emit(attrs::MoeRouterBackward{.experts = e,
                                .topk = k,
                                .score = s_.moe.score,
                                .normalize = s_.moe.normalize,
                                .aux_rows = tokens_ * cp_,
                                .aux_coeff = s_.moe.aux_coeff,
                                .aux_grad_scale =
                                    1.0 / static_cast<double>(s_.microbatches * p_.dp)},
       {dw, ms.idx, ms.scores, ms.counts}, {dz});
  if (ex.load >= 0) Emit(attrs::MoeExpertLoad{}, {ms.counts}, {ex.load});
  Emit(attrs::LinearBackward{.dx_accumulate = true}, {dz, xn, ex.router.value},
       {dn2, ex.router.grad});
  int32_t dnorm = dn2;
  if (ex.shared_up.value >= 0) {
    const int64_t sf = s_.moe.shared_ffn / tp_;
    const int32_t gxf = gxe != gx ? gxe : GatherSp(gx, "moe.shared.down.grad_full", h);
    const int32_t dsa = Act("moe.shared.act.grad", {tokens_, sf});
    Emit(attrs::LinearBackward{.dx_accumulate = false}, {gxf, ms.sa, ex.shared_down.value},
         {dsa, ex.shared_down.grad});
    const int32_t dnf = Act("moe.shared.in.grad_full", {tokens_, h});
    if (ex.shared_gate.value >= 0) {
      const int32_t dg = Act("moe.shared.gate.grad", {tokens_, sf});
      const int32_t du = Act("moe.shared.up.grad", {tokens_, sf});
      Emit(attrs::SwiGluBackward{}, {dsa, ms.sg, ms.su}, {dg, du});
      Emit(attrs::LinearBackward{.dx_accumulate = false}, {dg, saved.n2f, ex.shared_gate.value},
           {dnf, ex.shared_gate.grad});
      Emit(attrs::LinearBackward{.dx_accumulate = true}, {du, saved.n2f, ex.shared_up.value},
           {dnf, ex.shared_up.grad});
    } else {
      const int32_t du = Act("moe.shared.fc1_out.grad", {tokens_, sf});
      Emit(attrs::GeluBackward{}, {dsa, ms.su}, {du});
      Emit(attrs::LinearBackward{.dx_accumulate = false}, {du, saved.n2f, ex.shared_up.value},
           {dnf, ex.shared_up.grad});
    }
    const int32_t dns = ReduceGradToRows(dnf, "moe.shared.in.grad");
    dnorm = Act("mlp_norm.out.grad_sum", {rows_, h});
    Emit(attrs::Add{}, {dn2, dns}, {dnorm});
  }
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
  const int32_t out = Act(name, {ms.etp.rows * s_.moe.topk, m_.hidden});
  Emit(attrs::MoeCombine{.experts = s_.moe.experts}, {local_rows, ms.expert_counts, ms.split},
       {out}, CommKind::Ep);
  return out;
}

void RoleLowering::EmitExpertGradReduction() {
  if (edp_ <= 1) return;
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

// --- end mixture of experts --------------------------------------------------------------------

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
  if (s_.recompute == ActivationRecompute::kSelective) {
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
  const int32_t dn1f = Act("attention_norm.out_full.grad", {tokens_, h});
  Emit(attrs::LinearBackward{.dx_accumulate = false}, {dq, saved.n1f, params.wq.value},
       LinearGrads(dn1f, params.wq, params.bq));
  Emit(attrs::LinearBackward{.dx_accumulate = true}, {dk, saved.n1f, params.wk.value},
       LinearGrads(dn1f, params.wk, params.bk));
  Emit(attrs::LinearBackward{.dx_accumulate = true}, {dv, saved.n1f, params.wv.value},
       LinearGrads(dn1f, params.wv, params.bv));
  const int32_t dn1 = ReduceGradToRows(dn1f, "attention_norm.out.grad");
  NormBackward(params.n1, saved.no1, saved.x, dn1, gx, /*accumulate=*/true);
}

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

void RoleLowering::MlaAttentionCore(const std::string& name, int32_t q, int32_t k, int32_t v,
                                    int32_t& o, int32_t& lse) {
  const int64_t heads = m_.heads / tp_, qk = m_.qk_nope_head_dim + m_.qk_rope_head_dim;
  o = Act(name + ".out_padded", {tokens_, heads * qk});
  lse = Stat(name + ".lse", {m_.micro_batch, heads, m_.seq_len});
  Emit(attrs::Attention{.micro = m_.micro_batch,
                        .seq = m_.seq_len,
                        .heads = heads,
                        .kv_heads = heads,
                        .head_dim = qk,
                        .scale = 1.0 / std::sqrt(static_cast<double>(qk))},
       {q, k, v}, {o, lse});
}

void RoleLowering::MlaForward(const LayerParams& P, LayerSaved& saved) {
  const MlaParams& lp = P.latent;
  MlaSaved& ms = saved.mla;
  const int64_t heads = m_.heads / tp_, nope = m_.qk_nope_head_dim, rope = m_.qk_rope_head_dim;
  const int64_t qk = nope + rope, vd = m_.v_head_dim, kvl = m_.kv_lora_rank;
  const auto rope_attrs = [&](int64_t n) {
    return attrs::Rope{.heads = n, .head_dim = rope, .theta = m_.rope_theta};
  };
  // Queries: through the q latent (down, RMSNorm, up) or projected directly.
  saved.q = Act("q", {tokens_, heads * qk});
  if (m_.q_lora_rank > 0) {
    const int64_t ql = m_.q_lora_rank;
    ms.q_latent = Act("attention.q_latent", {tokens_, ql});
    Emit(attrs::Linear{}, {saved.n1f, lp.wq_down.value}, {ms.q_latent});
    ms.q_normed = Act("attention.q_norm.out", {tokens_, ql});
    ms.q_rstd = Stat("attention.q_norm.rstd", {tokens_});
    Emit(attrs::RmsNorm{.eps = m_.norm_eps}, {ms.q_latent, lp.q_norm.w.value},
         {ms.q_normed, ms.q_rstd});
    Emit(attrs::Linear{}, {ms.q_normed, lp.wq_up.value}, {saved.q});
  } else {
    Emit(attrs::Linear{}, {saved.n1f, lp.wq.value}, {saved.q});
  }
  // Keys and values: the kv latent and the shared rope head in one projection.
  const int32_t kv_a = Act("attention.kv_latent_rope", {tokens_, kvl + rope});
  Emit(attrs::Linear{}, {saved.n1f, lp.wkv_down.value}, {kv_a});
  ms.kv_latent = Act("attention.kv_latent", {tokens_, kvl});
  Emit(MlaMap(1, kvl, kvl + rope, 0, 0, kvl, 0, 0), {kv_a}, {ms.kv_latent});
  ms.kv_normed = Act("attention.kv_norm.out", {tokens_, kvl});
  ms.kv_rstd = Stat("attention.kv_norm.rstd", {tokens_});
  Emit(attrs::RmsNorm{.eps = m_.norm_eps}, {ms.kv_latent, lp.kv_norm.w.value},
       {ms.kv_normed, ms.kv_rstd});
  const int32_t kv = Act("attention.kv", {tokens_, heads * (nope + vd)});
  Emit(attrs::Linear{}, {ms.kv_normed, lp.wkv_up.value}, {kv});
  // Decoupled RoPE: the rope part of each query head, and the one shared key head.
  const int32_t q_pe = Act("attention.q_rope", {tokens_, heads * rope});
  const auto q_rope_part = MlaMap(heads, rope, heads * qk, qk, nope, heads * rope, rope, 0);
  Emit(q_rope_part, {saved.q}, {q_pe});
  Emit(rope_attrs(heads), {q_pe}, {q_pe});
  Emit(Reversed(q_rope_part, false), {q_pe}, {saved.q});
  const int32_t k_pe = Act("attention.k_rope", {tokens_, rope});
  Emit(MlaMap(1, rope, kvl + rope, 0, kvl, rope, 0, 0), {kv_a}, {k_pe});
  Emit(rope_attrs(1), {k_pe}, {k_pe});
  // k = [k_nope of each head, the shared rope head]; v padded with zeros to the qk head size so
  // that one Attention runs it (the padded output columns are zeros). The zeros come from a
  // scratch buffer: Fill writes every slot of a buffer, and v is kept per microbatch.
  saved.k = Act("k", {tokens_, heads * qk});
  Emit(MlaMap(heads, nope, heads * (nope + vd), nope + vd, 0, heads * qk, qk, 0), {kv}, {saved.k});
  Emit(MlaMap(heads, rope, rope, 0, 0, heads * qk, qk, nope), {k_pe}, {saved.k});
  saved.v = Act("v_padded", {tokens_, heads * qk});
  Emit(MlaMap(heads, vd, heads * (nope + vd), nope + vd, nope, heads * qk, qk, 0), {kv}, {saved.v});
  if (qk > vd) {
    const int32_t zeros = Act("attention.v_padding", {tokens_, qk - vd});
    Emit(attrs::Fill{.value = 0.0}, {}, {zeros});
    Emit(MlaMap(heads, qk - vd, qk - vd, 0, 0, heads * qk, qk, vd), {zeros}, {saved.v});
  }
  MlaAttentionCore("attention", saved.q, saved.k, saved.v, ms.core_out, saved.lse);
  saved.o = Act("attention.out", {tokens_, heads * vd});
  Emit(MlaMap(heads, vd, heads * qk, qk, 0, heads * vd, vd, 0), {ms.core_out}, {saved.o});
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
  Emit(MlaMap(heads, vd, heads * vd, vd, 0, heads * qk, qk, 0), {dout}, {dout_padded});
  // Attention core (recomputed from the stashed q, k, v under selective recompute).
  int32_t o = ms.core_out, lse = saved.lse;
  if (s_.recompute == ActivationRecompute::kSelective)
    MlaAttentionCore("recompute.attention", saved.q, saved.k, saved.v, o, lse);
  const int32_t dq = Act("q.grad", {tokens_, heads * qk});
  const int32_t dk = Act("k.grad", {tokens_, heads * qk});
  const int32_t dv = Act("v_padded.grad", {tokens_, heads * qk});
  Emit(attrs::AttentionBackward{.micro = m_.micro_batch,
                                .seq = m_.seq_len,
                                .heads = heads,
                                .kv_heads = heads,
                                .head_dim = qk,
                                .scale = 1.0 / std::sqrt(static_cast<double>(qk))},
       {dout_padded, saved.q, saved.k, saved.v, o, lse}, {dq, dk, dv});
  // Back through the head layouts: dk's nope part and dv into the up projection's output; dk's
  // rope part summed over the heads into the shared head; RoPE's inverse rotations.
  const int32_t dkv = Act("attention.kv.grad", {tokens_, heads * (nope + vd)});
  Emit(MlaMap(heads, nope, heads * qk, qk, 0, heads * (nope + vd), nope + vd, 0), {dk}, {dkv});
  Emit(MlaMap(heads, vd, heads * qk, qk, 0, heads * (nope + vd), nope + vd, nope), {dv}, {dkv});
  const int32_t dk_pe = Act("attention.k_rope.grad", {tokens_, rope});
  Emit(attrs::Fill{.value = 0.0}, {}, {dk_pe});
  Emit(MlaMap(heads, rope, heads * qk, qk, nope, rope, 0, 0, /*accumulate=*/true), {dk}, {dk_pe});
  Emit(rope_attrs(1), {dk_pe}, {dk_pe});
  const int32_t dq_pe = Act("attention.q_rope.grad", {tokens_, heads * rope});
  const auto q_rope_part = MlaMap(heads, rope, heads * qk, qk, nope, heads * rope, rope, 0);
  Emit(q_rope_part, {dq}, {dq_pe});
  Emit(rope_attrs(heads), {dq_pe}, {dq_pe});
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
  Emit(MlaMap(1, kvl, kvl, 0, 0, kvl + rope, 0, 0), {dkvl}, {dkv_a});
  Emit(MlaMap(1, rope, rope, 0, 0, kvl + rope, 0, kvl), {dk_pe}, {dkv_a});
  Emit(attrs::LinearBackward{.dx_accumulate = true}, {dkv_a, saved.n1f, lp.wkv_down.value},
       {dn1f, lp.wkv_down.grad});
  const int32_t dn1 = ReduceGradToRows(dn1f, "attention_norm.out.grad");
  NormBackward(params.n1, saved.no1, saved.x, dn1, gx, /*accumulate=*/true);
}

// --- end multi-head latent attention -----------------------------------------------------------

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
    // The ZeRO group: dp · cp, or for expert-parallel params the Edp group.
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
    bucket.grads = Buf(name + ".grads", {elements}, DType::F32, BufferKind::Bucket);
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
          Buf(name + ".grad_shard", {bucket.shard_elements}, DType::F32, BufferKind::Grad);
    role_.buckets.push_back(bucket);
  };
  for (const Chunk& c : role_.chunks) {
    std::vector<std::string> groups;  // in param order
    std::map<std::string, std::vector<int32_t>> members;
    for (int32_t i = 0; i < static_cast<int32_t>(role_.params.size()); ++i) {
      if (role_.params[i].chunk != c.index) continue;
      // Ep-sharded experts keep a bucket of their own: their grads reduce over Edp.
      const std::string group = shard_grads_         ? param_group_[i]
                                : IsExpertSharded(i) ? std::string("experts")
                                                     : std::string();
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
            if (!is_grad[x] && gathered.insert(k).second)
              Emit(attrs::AllGather{}, {b.param_shard}, {b.params}, shard_comm_);
          }
        }
        body.ops.push_back(ops[i]);
        for (const auto& [k, last] : last_grad) {
          if (last != i) continue;
          const Bucket& b = role_.buckets[k];
          for (const Param& prm : role_.params)
            if (prm.grad_sync_tp && role_.buffers[prm.grad].view_of == b.grads)
              Emit(attrs::AllReduce{}, {prm.grad}, {prm.grad}, CommKind::Tp);
          Emit(attrs::ReduceScatter{.reduce_op = ReduceOp::kSum, .accumulate = true}, {b.grads},
               {b.grad_shard}, shard_comm_);
        }
      }
    }
  }
  body_ = nullptr;
}

// The global gradient norm's square into nsq (the optimizer body's first ops).
void RoleLowering::EmitGradNormSquare(int32_t nsq, bool sharded) {
  std::vector<int32_t> grads;
  for (const Bucket& b : role_.buckets) grads.push_back(shard_grads_ ? b.grad_shard : b.grads);
  int64_t world = static_cast<int64_t>(p_.tp) * p_.pp * p_.dp * p_.cp;
  if (ExpertParallel()) {
    // Experts are split over Ep and replicated over Edp: each element is counted on one rank
    // of those holding it (under ZeRO 1 by the owned shards), then summed over the world.
    Emit(attrs::GradNormSquare{.count_once = true}, grads, {nsq});
    Emit(attrs::AllReduce{.reduce_op = ReduceOp::kSum}, {nsq}, {nsq}, CommKind::World);
  } else {
    Emit(attrs::GradNormSquare{}, grads, {nsq}, sharded ? shard_comm_ : CommKind::None);
    if (sharded) {
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
  if (m_.tied_embeddings && p_.pp > 1) {
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
  const CommKind grad_comm = shard_comm_;
  if (p_.dp * cp_ > 1 && !shard_grads_) {
    for (const Bucket& b : role_.buckets) {
      if (IsExpertBucket(b)) continue;
      if (sharded)
        Emit(attrs::ReduceScatter{.reduce_op = ReduceOp::kSum}, {b.grads}, {b.grads}, grad_comm);
      else
        Emit(attrs::AllReduce{.reduce_op = ReduceOp::kSum}, {b.grads}, {b.grads}, grad_comm);
    }
  }
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
    // Expert-parallel buckets shard over Edp (ZeRO 1; ZeRO >= 2 is refused beside ep > 1).
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
    Emit(attrs::AllReduce{.reduce_op = ReduceOp::kAvg}, {loss_sum_}, {loss_sum_},
         cp_ > 1 ? CommKind::DpCp : CommKind::Dp);
  // ZeRO-3 gathers inside the chunk bodies (ScopeBucketsInBodies); no GatherParams bodies.
  body_ = nullptr;
  return sb;
}

StepBodies RoleLowering::Build(const std::vector<ChunkLayers>& chunks) {
  role_.pipeline_rank = pipeline_rank_;
  role_.name = fmt::format("stage{}", pipeline_rank_);
  loss_sum_ = Buf("loss_sum", {1}, DType::F32, BufferKind::Persistent);
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

}  // namespace

StepBodies BuildRoleBodies(const BodyShape& shape, int32_t pipeline_rank,
                           const std::vector<ChunkLayers>& chunks, Role& role) {
  RoleLowering lowering(shape, pipeline_rank, role);
  return lowering.Build(chunks);
}

}  // namespace paraplan::lower
