#include "compiler/analyze/cost_shape.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace paraplan {
namespace {

constexpr int64_t kMax = std::numeric_limits<int64_t>::max();

int64_t HeadDim(const ModelSpec& m) {
  if (m.head_dim > 0) return m.head_dim;
  return m.heads > 0 ? m.hidden / m.heads : 0;
}
int64_t KvHeads(const ModelSpec& m) { return m.kv_heads > 0 ? m.kv_heads : m.heads; }
bool Gated(const ModelSpec& m) { return m.activation == Activation::kSwiGlu; }
int64_t NormParams(const ModelSpec& m) {
  return m.norm == Norm::kLayerNorm ? 2 * m.hidden : m.hidden;
}
// Weight count of an MLP with hidden width f: up (+gate) and down projections.
int64_t MlpParams(const ModelSpec& m, int64_t f) {
  return SatMul(SatMul(Gated(m) ? 3 : 2, m.hidden), f);
}
// Stored activation elements per token inside an MLP of width f (gate+up outputs and the fc2
// input for SwiGLU = 3f; activation input and fc2 input for GeLU = 2f).
int64_t MlpStoredWidth(const ModelSpec& m, int64_t f) { return SatMul(Gated(m) ? 3 : 2, f); }

}  // namespace

int64_t SatAdd(int64_t a, int64_t b) {
  int64_t r;
  return __builtin_add_overflow(a, b, &r) ? kMax : r;
}
int64_t SatMul(int64_t a, int64_t b) {
  int64_t r;
  return __builtin_mul_overflow(a, b, &r) ? kMax : r;
}
int64_t CeilDiv(int64_t a, int64_t b) {
  if (b <= 0) return a;
  if (a == kMax) return kMax;
  return a / b + (a % b != 0 ? 1 : 0);
}

LayerKind KindOfLayer(const ModelSpec& model, int64_t index) {
  if (!model.IsMoe() || index < model.dense_layers) return LayerKind::kDense;
  return LayerKind::kMoe;
}

LayerParams ParamsOfLayer(const ModelSpec& m, LayerKind kind) {
  LayerParams p;
  const int64_t h = m.hidden;
  p.replicated = SatMul(2, NormParams(m));
  if (m.IsMla()) {
    const int64_t qk = m.qk_nope_head_dim + m.qk_rope_head_dim;
    if (m.q_lora_rank > 0) {
      p.replicated = SatAdd(p.replicated, SatAdd(SatMul(h, m.q_lora_rank), m.q_lora_rank));
      p.tp_sharded = SatAdd(p.tp_sharded, SatMul(SatMul(m.q_lora_rank, m.heads), qk));
    } else {
      p.tp_sharded = SatAdd(p.tp_sharded, SatMul(SatMul(h, m.heads), qk));
    }
    p.replicated = SatAdd(p.replicated,
                          SatAdd(SatMul(h, m.kv_lora_rank + m.qk_rope_head_dim), m.kv_lora_rank));
    p.tp_sharded = SatAdd(
        p.tp_sharded, SatMul(SatMul(m.kv_lora_rank, m.heads), m.qk_nope_head_dim + m.v_head_dim));
    p.tp_sharded = SatAdd(p.tp_sharded, SatMul(SatMul(m.heads, m.v_head_dim), h));
  } else {
    const int64_t d = HeadDim(m);
    const int64_t q = SatMul(m.heads, d), kv = SatMul(KvHeads(m), d);
    p.tp_sharded = SatAdd(SatMul(h, SatAdd(q, SatMul(2, kv))), SatMul(q, h));
  }
  if (kind == LayerKind::kDense) {
    p.tp_sharded = SatAdd(p.tp_sharded, MlpParams(m, m.ffn_hidden));
  } else {
    p.replicated = SatAdd(p.replicated, SatMul(h, m.experts));  // router
    p.expert = SatMul(m.experts, MlpParams(m, m.ExpertFfn()));
    p.tp_sharded = SatAdd(p.tp_sharded, MlpParams(m, SatMul(m.shared_experts, m.ExpertFfn())));
  }
  return p;
}

int64_t LargestTensorOfLayer(const ModelSpec& m, LayerKind kind) {
  const int64_t h = m.hidden;
  int64_t largest = 0;
  auto consider = [&](int64_t n) { largest = std::max(largest, n); };
  if (m.IsMla()) {
    const int64_t qk = m.qk_nope_head_dim + m.qk_rope_head_dim;
    consider(SatMul(SatMul(m.q_lora_rank > 0 ? m.q_lora_rank : h, m.heads), qk));
    consider(SatMul(h, m.q_lora_rank));
    consider(SatMul(h, m.kv_lora_rank + m.qk_rope_head_dim));
    consider(SatMul(SatMul(m.kv_lora_rank, m.heads), m.qk_nope_head_dim + m.v_head_dim));
    consider(SatMul(SatMul(m.heads, m.v_head_dim), h));
  } else {
    const int64_t d = HeadDim(m);
    const int64_t q = SatMul(m.heads, d), kv = SatMul(KvHeads(m), d);
    consider(SatMul(h, SatAdd(q, SatMul(2, kv))));
    consider(SatMul(q, h));
  }
  const int64_t up = Gated(m) ? 2 : 1;
  auto mlp = [&](int64_t f) {
    consider(SatMul(SatMul(up, h), f));
    consider(SatMul(f, h));
  };
  if (kind == LayerKind::kDense) {
    mlp(m.ffn_hidden);
  } else {
    mlp(m.ExpertFfn());
    if (m.shared_experts > 0) mlp(SatMul(m.shared_experts, m.ExpertFfn()));
    consider(SatMul(h, m.experts));
  }
  return largest;
}

int64_t EmbeddingParams(const ModelSpec& m) { return SatMul(m.vocab, m.hidden); }
int64_t PositionParams(const ModelSpec& m) {
  return m.position == Position::kLearned ? SatMul(m.seq_len, m.hidden) : 0;
}
int64_t FinalNormParams(const ModelSpec& m) { return NormParams(m); }
int64_t OutputParams(const ModelSpec& m) {
  return m.tied_embeddings ? 0 : SatMul(m.vocab, m.hidden);
}

int64_t TotalParams(const ModelSpec& m) {
  int64_t total = SatAdd(SatAdd(EmbeddingParams(m), PositionParams(m)),
                         SatAdd(FinalNormParams(m), OutputParams(m)));
  for (LayerKind kind : {LayerKind::kDense, LayerKind::kMoe}) {
    int64_t count = 0;
    if (kind == LayerKind::kDense)
      count = m.IsMoe() ? std::min(m.dense_layers, m.layers) : m.layers;
    else
      count = m.IsMoe() ? std::max<int64_t>(0, m.layers - m.dense_layers) : 0;
    total = SatAdd(total, SatMul(count, ParamsOfLayer(m, kind).Total()));
  }
  return total;
}

double LayerForwardFlopsPerToken(const ModelSpec& m, LayerKind kind, double context) {
  const double h = static_cast<double>(m.hidden);
  const double a = static_cast<double>(m.heads);
  double flops = 0;
  if (m.IsMla()) {
    const double qk = static_cast<double>(m.qk_nope_head_dim + m.qk_rope_head_dim);
    const double v = static_cast<double>(m.v_head_dim);
    const double ql = static_cast<double>(m.q_lora_rank), kl = static_cast<double>(m.kv_lora_rank);
    flops += ql > 0 ? 2 * (h * ql + ql * a * qk) : 2 * h * a * qk;
    flops += 2 * (h * (kl + static_cast<double>(m.qk_rope_head_dim)) +
                  kl * a * (m.qk_nope_head_dim + v));
    flops += 2 * a * v * h;
    flops += 2 * a * qk * context + 2 * a * v * context;
  } else {
    const double d = static_cast<double>(HeadDim(m));
    const double q = a * d, kv = static_cast<double>(KvHeads(m)) * d;
    flops += 2 * (h * (q + 2 * kv) + q * h);
    flops += 4 * q * context;  // QK^T and attention·V
  }
  const double g = Gated(m) ? 3 : 2;
  if (kind == LayerKind::kDense) {
    flops += 2 * g * h * static_cast<double>(m.ffn_hidden);
  } else {
    const double fe = static_cast<double>(m.ExpertFfn());
    flops += 2 * h * static_cast<double>(m.experts);  // router
    flops += 2 * g * h * fe * static_cast<double>(m.topk + m.shared_experts);
  }
  return flops;
}

double LogitsForwardFlopsPerToken(const ModelSpec& m) {
  return 2.0 * static_cast<double>(m.hidden) * static_cast<double>(m.vocab);
}

namespace {

struct TokenCounts {
  int64_t tokens;      // tokens of one microbatch on the rank's sequence slice: s·b/c
  int64_t rep_tokens;  // tokens whose replicated terms a TP rank stores: /t under SP
};

TokenCounts Tokens(const ActivationShape& s) {
  TokenCounts t;
  t.tokens = CeilDiv(SatMul(s.seq, s.micro), std::max<int64_t>(1, s.cp));
  t.rep_tokens = s.sp ? CeilDiv(t.tokens, std::max<int64_t>(1, s.tp)) : t.tokens;
  return t;
}

int64_t LayerBytes(const ModelSpec& m, LayerKind kind, const ActivationShape& s,
                   Recompute recompute) {
  const int64_t x = s.element_bytes;
  const int64_t h = m.hidden;
  const int64_t t = std::max<int64_t>(1, s.tp);
  const TokenCounts tok = Tokens(s);
  if (recompute == Recompute::kFull) return SatMul(tok.rep_tokens, SatMul(x, h));

  const int64_t mask = s.options.dropout ? h : 0;  // one 1-byte mask per dropout
  int64_t rep = 0;    // bytes per token, replicated under TP (split under SP)
  int64_t split = 0;  // bytes per token summed over the TP group (divided by t)
  // Attention block.
  rep += 2 * x * h + mask;  // norm input, QKV (or down-projection) input; output dropout mask
  int64_t heads_rank_x_dim_score = 0;  // a/t, for the score terms
  if (m.IsMla()) {
    const int64_t qk = m.qk_nope_head_dim + m.qk_rope_head_dim;
    if (m.q_lora_rank > 0) rep += 2 * x * m.q_lora_rank;  // q norm input, q up input
    rep += x * (m.kv_lora_rank + m.qk_rope_head_dim) + x * m.kv_lora_rank;  // kv norm in, kv up in
    split = SatAdd(split, SatMul(x * m.heads, 2 * qk + 2 * m.v_head_dim));  // Q, K, V, output
  } else {
    const int64_t d = HeadDim(m);
    const int64_t kv_heads_rank = std::max<int64_t>(1, KvHeads(m) / t);
    split = SatAdd(split, SatMul(2 * x * m.heads, d));               // Q and attention output
    const int64_t kv_bytes_rank = SatMul(2 * x * kv_heads_rank, d);  // K and V, per rank
    split = SatAdd(split, SatMul(kv_bytes_rank, t));  // (GQA below t heads: replicated)
  }
  heads_rank_x_dim_score = CeilDiv(m.heads, t);
  // MLP block.
  rep += 2 * x * h + mask;  // norm input, fc1 (or router) input; output dropout mask
  int64_t routed_bytes = 0;
  if (kind == LayerKind::kDense) {
    split = SatAdd(split, SatMul(x, MlpStoredWidth(m, m.ffn_hidden)));
  } else {
    rep += int64_t{8} * m.experts;  // router logits and probabilities: 2 × 4 bytes (fp32)
    split = SatAdd(split, SatMul(x, MlpStoredWidth(m, SatMul(m.shared_experts, m.ExpertFfn()))));
    // Per routed (token, expert) pair: the expert's input (the all-to-all output), the expert MLP
    // intermediates split by etp, and with probabilities applied in unpermute (Megatron-Core before
    // 0.13) the expert's output kept for their gradient.
    const int64_t copies = s.options.moe_probs_in_activation ? 1 : 2;
    const int64_t per_pair =
        SatAdd(copies * x * h,
               SatMul(x, CeilDiv(MlpStoredWidth(m, m.ExpertFfn()), std::max<int64_t>(1, s.etp))));
    routed_bytes = SatMul(RoutedPairsPerRank(m, s), per_pair);
  }
  int64_t bytes = SatAdd(SatMul(tok.rep_tokens, rep), CeilDiv(SatMul(tok.tokens, split), t));
  bytes = SatAdd(bytes, routed_bytes);
  // Attention core: scores, softmax and dropout (5as per token in Korthikanti's count) without
  // fused attention; fp32 softmax statistics with it. Selective recompute drops them.
  if (recompute != Recompute::kSelective) {
    int64_t per_head;
    if (s.options.flash_attention) {
      per_head = 4;
    } else {
      per_head = SatMul(s.options.dropout ? 2 * x + 1 : x, s.seq);
    }
    bytes = SatAdd(bytes, SatMul(SatMul(tok.tokens, heads_rank_x_dim_score), per_head));
  }
  return bytes;
}

}  // namespace

int64_t LayerActivationBytes(const ModelSpec& model, LayerKind kind, const ActivationShape& shape) {
  return LayerBytes(model, kind, shape, shape.recompute);
}

int64_t RecomputeWorkspaceBytes(const ModelSpec& model, LayerKind kind,
                                const ActivationShape& shape) {
  if (shape.recompute == Recompute::kNone) return 0;
  if (shape.recompute == Recompute::kFull) return LayerBytes(model, kind, shape, Recompute::kNone);
  // Selective: the recomputed attention core of one layer.
  return LayerBytes(model, kind, shape, Recompute::kNone) -
         LayerBytes(model, kind, shape, Recompute::kSelective);
}

int64_t EmbeddingActivationBytes(const ModelSpec& m, const ActivationShape& s) {
  const TokenCounts tok = Tokens(s);
  int64_t bytes = SatMul(8, tok.tokens);  // int64 input ids
  if (s.options.dropout) bytes = SatAdd(bytes, SatMul(tok.rep_tokens, m.hidden));
  return bytes;
}

int64_t LossActivationBytes(const ModelSpec& m, const ActivationShape& s) {
  const TokenCounts tok = Tokens(s);
  int64_t bytes = SatMul(tok.rep_tokens, SatMul(2 * s.element_bytes, m.hidden));
  return SatAdd(bytes, SatMul(SatMul(4, tok.tokens), CeilDiv(m.vocab, std::max<int64_t>(1, s.tp))));
}

int64_t RoutedPairsPerRank(const ModelSpec& m, const ActivationShape& s) {
  if (!m.IsMoe()) return 0;
  const TokenCounts tok = Tokens(s);
  const double pairs = s.options.moe_imbalance * static_cast<double>(m.topk) *
                       static_cast<double>(tok.tokens) *
                       static_cast<double>(std::max<int64_t>(1, s.etp)) /
                       static_cast<double>(std::max<int64_t>(1, s.tp));
  if (!(pairs < 9.0e18)) return kMax;
  return static_cast<int64_t>(std::ceil(pairs));
}

}  // namespace paraplan
