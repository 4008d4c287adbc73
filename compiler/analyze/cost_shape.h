// What one transformer layer of a model costs, per token and per rank: parameters (split by
// how they are sharded), FLOPs and stored activation bytes. The architecture-aware template
// of reference cost-models.md Section 2.2, extended to GQA, SwiGLU, MLA and MoE.
//
// Invariants: pure functions of (ModelSpec, sizes); integers are element counts or bytes and
// saturate at INT64_MAX instead of wrapping (a saturated size is reported as out of memory).
// Read by memory.cpp (bytes), time.cpp (FLOPs, GEMM sizes) and the Korthikanti unit test.
#ifndef PARAPLAN_COMPILER_ANALYZE_COST_SHAPE_H_
#define PARAPLAN_COMPILER_ANALYZE_COST_SHAPE_H_

#include <cstdint>

#include "compiler/analyze/cost_params.h"
#include "compiler/plan/plan.h"

namespace paraplan {

// Saturating arithmetic for byte counts (sizes here are products of plan fields).
int64_t SatAdd(int64_t a, int64_t b);
int64_t SatMul(int64_t a, int64_t b);
int64_t CeilDiv(int64_t a, int64_t b);  // b > 0

enum class LayerKind : uint8_t { kDense, kMoe };

// Layer `index` (0-based) is dense when the model is dense or index < dense_layers.
LayerKind KindOfLayer(const ModelSpec& model, int64_t index);

// Parameter counts of one layer (whole model, before any sharding), by sharding class
// (Megatron's accounting): tp_sharded is divided by tp, replicated by nothing, expert by ep·etp.
struct LayerParams {
  int64_t tp_sharded = 0;  // attention projections, dense MLP, shared experts
  int64_t replicated = 0;  // norms, router, MLA down-projections and latent norms
  int64_t expert = 0;      // routed experts
  int64_t Total() const { return tp_sharded + replicated + expert; }
};
LayerParams ParamsOfLayer(const ModelSpec& model, LayerKind kind);
// The largest single weight tensor of a layer, unsharded: the fused QKV, the output projection,
// the (gate+up) and down projections of the dense MLP or of one expert; MLA's projections.
int64_t LargestTensorOfLayer(const ModelSpec& model, LayerKind kind);
// Input embedding (vocab · hidden, vocab-parallel over tp) and learned positions (replicated).
int64_t EmbeddingParams(const ModelSpec& model);
int64_t PositionParams(const ModelSpec& model);
// Final norm (on the loss stage) and the output projection (vocab · hidden, vocab-parallel).
int64_t FinalNormParams(const ModelSpec& model);
int64_t OutputParams(const ModelSpec& model);
// Total parameters of the model (embedding and head counted once when tied).
int64_t TotalParams(const ModelSpec& model);

// Model FLOPs of one token through one layer, forward, whole layer (before TP), with the
// attention core over `context` keys (pass seq_len for full attention, seq_len/2 for causal).
// Only matrix multiplications, as Megatron counts; backward is twice the forward.
double LayerForwardFlopsPerToken(const ModelSpec& model, LayerKind kind, double context);
double LogitsForwardFlopsPerToken(const ModelSpec& model);

// Sizes that decide activation bytes on one rank.
struct ActivationShape {
  int64_t seq = 0;    // sequence length s
  int64_t micro = 1;  // micro batch b
  int64_t tp = 1;     // t
  int64_t cp = 1;     // c
  int64_t etp = 1;    // expert tensor parallel
  bool sp = false;    // sequence parallel
  Recompute recompute = Recompute::kNone;
  int64_t element_bytes = 2;
  CostOptions options;
};

// Stored activation bytes of one layer for one microbatch on one rank (what is kept from the
// forward until the backward). Under full recompute this is the layer input only; the
// transient working set of the recomputed layer is RecomputeWorkspaceBytes.
int64_t LayerActivationBytes(const ModelSpec& model, LayerKind kind, const ActivationShape& shape);
// Bytes of a layer's activations with no recompute (the working set while it is recomputed).
int64_t RecomputeWorkspaceBytes(const ModelSpec& model, LayerKind kind,
                                const ActivationShape& shape);
// Outside the layer stack, per microbatch: input ids and the embedding-output dropout mask on
// the embedding stage; final-norm input, output-projection input and the fp32 logits kept by
// the vocab-parallel cross entropy on the loss stage.
int64_t EmbeddingActivationBytes(const ModelSpec& model, const ActivationShape& shape);
int64_t LossActivationBytes(const ModelSpec& model, const ActivationShape& shape);
// Routed (token, expert) pairs one rank's experts process per microbatch and MoE layer.
int64_t RoutedPairsPerRank(const ModelSpec& model, const ActivationShape& shape);

}  // namespace paraplan

#endif  // PARAPLAN_COMPILER_ANALYZE_COST_SHAPE_H_
