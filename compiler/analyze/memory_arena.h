// planrun's static arena (framework = paraplan): the memory model of a plan planrun lowers.
//
// What compiler/lower allocates, term by term, so that `check` and `compile` tell one truth:
// the buffers a chunk's forward and backward both touch are stashed once per in-flight
// microbatch (body.cpp, ClassifyStash), the slots per chunk are the most microbatches of that
// chunk in flight at once in the schedule (lower.cpp, AssignSlots) or, under interleaved 1F1B,
// those of the pool the rank's chunks share (slot_pool.h, ArenaPooledSlots), a chunk's output
// and gradient are one buffer each (lower.cpp, BoundaryBuffersOf), and everything else lives in
// a scratch region as large as the busiest op of any body (memory_plan.cpp).
//
// Invariants: pure functions of the plan; sizes are bytes and saturate at INT64_MAX (SatAdd,
// SatMul). Made by memory_arena.cpp; read by memory.cpp only (EstimateMemory, when
// ArenaModelApplies).
#ifndef PARAPLAN_COMPILER_ANALYZE_MEMORY_ARENA_H_
#define PARAPLAN_COMPILER_ANALYZE_MEMORY_ARENA_H_

#include <cstdint>
#include <vector>

#include "compiler/plan/plan.h"

namespace paraplan {

// The sizes the arena's buffers are made of, on one rank (ArenaSizesOf).
struct ArenaSizes {
  int64_t t = 1;  // tensor parallel
  int64_t T = 0;  // tokens of a microbatch on one context-parallel rank: micro · seq / cp
  int64_t R = 0;  // rows a TP rank holds between layers: T / t under SP, else T
  int64_t h = 0, hd = 0, heads = 0, kv = 0, ffn = 0, vocab = 0;  // per TP rank where split
  int64_t a = 2;  // activation element bytes of the program's precision
  int64_t g = 4;  // gradient element bytes (mixed_precision.grads: 4, or 2 for bf16 and fp16)
  bool gelu = false, layernorm = false;
  bool ring = false;     // cp > 1: ring attention and its working buffers
  bool qk_norm = false;  // queries and keys normalised per head (model.qk_norm)
  // Selective recompute's modules: the attention core kept (modules without core_attn), the
  // experts' activation recomputed (moe_act).
  bool core_kept = false, moe_act = false;
  bool mlp_recomputed = false;     // selective's mlp module: a dense MLP kept as its norm's output
  bool shared_recomputed = false;  // selective's shared_experts module
  bool norm_recomputed = false;    // selective's layernorm module: both norms made again
  bool moe_recomputed = false;     // selective's moe module: the MoE block made again
  bool mla_up_recomputed = false;  // selective's mla_up_proj module: latent attention's q, k, v
  // Multi-head latent attention (kv_lora_rank > 0): query/key and value head sizes, latent ranks.
  bool mla = false;
  int64_t qk = 0, vd = 0, nope = 0, ql = 0, kvl = 0;
  // Mixture of experts (ArenaMoeSizesOf; zero on a dense model).
  int64_t experts = 0, topk = 0;
  int64_t expert_ffn = 0;     // each expert's width on one Etp rank
  int64_t shared_ffn = 0;     // the shared experts' width on one TP rank
  int64_t expert_rows = 0;    // rows the rank's experts run: the Etp group's under sp, else R
  bool etp_gathered = false;  // etp > 1 under sp: the group's rows and choices gathered
  bool expert_bias = false;   // aux-loss-free balancing (model.router_bias_rate > 0)
  // With a capacity factor: the pairs one expert keeps at most from one rank's expert_rows, its
  // capacity per segment (each rank's R rows drop past their own capacity); 0 without one.
  int64_t expert_kept = 0;
  // Expert parallelism (ArenaEpSizesOf; ep = 1 and zero otherwise).
  int64_t ep = 1;             // Ep ranks sharing a layer's experts
  int64_t local_experts = 0;  // experts / ep on each Ep rank
  int64_t dispatch_rows = 0;  // rows the rank's experts may receive (ArenaEpDispatchRows)
};

ArenaSizes ArenaSizesOf(const Plan& plan);
// Bytes of one gradient element in planrun's program: the precision record's gradients (bf16 or
// fp16: 2), else f32.
int64_t ArenaGradBytes(const Plan& plan);

// Stashed bytes of one dense layer per microbatch.
int64_t ArenaLayerStash(const ArenaSizes& z, Recompute recompute);
// Stashed bytes of a chunk's `layers` dense layers per microbatch, and the busiest op of their
// backward, with full recompute by layers (activations.recompute_layers: block or uniform).
// With the block method `block_recomputed` says how many of them are among the chunk's first
// recompute_layers layers (a chunk with MoE layers counts those apart).
int64_t ArenaDenseLayersStash(const ArenaSizes& z, const Plan& plan, int64_t layers,
                              int64_t block_recomputed);
int64_t ArenaDenseLayersPeak(const ArenaSizes& z, const Plan& plan, int64_t layers,
                             int64_t block_recomputed);
// Stashed bytes of a chunk beyond its layers, per microbatch.
int64_t ArenaChunkExtra(const ArenaSizes& z, bool embedding, bool loss);
// A chunk's output, gradient and gradient landing buffer, one each (bytes).
int64_t ArenaBoundaryBytes(const ArenaSizes& z, bool embedding, bool loss);
// Multi-token prediction (compiler/lower/body_mtp.cpp): what one module stashes per microbatch
// beside its layer's stash: the shifted ids, the embedding rows, the norms' statistics (and the
// rows the hidden norm reads where they are not the gathered output already kept), the
// concatenation, the layer's output, its final norm's statistics and gathered output, the logits,
// labels and cross-entropy statistics.
int64_t ArenaMtpExtra(const ArenaSizes& z);
// How the module's layer recomputes: as the plan's layers, but full recompute by blocks leaves
// it whole (Megatron-Core does not checkpoint an MTP module under the block method).
Recompute ArenaMtpRecompute(const Plan& plan);
// The loss chunk's busiest op.
int64_t ArenaLossPeak(const ArenaSizes& z);
// The busiest op of a chunk's bodies (scratch).
int64_t ArenaBodyPeak(const ArenaSizes& z, Recompute recompute, bool loss);
// Bytes one layer's recomputed forward holds (full recompute by layers): what it keeps without
// recompute, with the norms' outputs gathered over the whole sequence under sp.
int64_t ArenaRecomputedLayer(const ArenaSizes& z, bool moe);
// Selective recompute's layernorm module: one recomputed norm's output (gathered under sequence
// parallelism) and statistics, live through the backward that reads them.
int64_t ArenaRecomputedNorm(const ArenaSizes& z);

// Stashed bytes of one MoE layer per microbatch.
int64_t ArenaMoeLayerStash(const ArenaSizes& z, Recompute recompute);

// The transient buckets live in an MoE layer's backward body under ZeRO >= 2 on dp · cp > 1
// (bytes; zero otherwise): the layer's full fp32 gradients, from its first gradient (the down
// projection's) to the end of the layer, and with ZeRO 3 its gathered weights, from the first
// weight read (the recomputed forward's under full recompute, else the down projection's). A
// tied word embedding on a chunk that also holds the loss keeps its gradient bucket open from
// the output layer's backward to the embedding's, across every layer.
struct ArenaMoeBuckets {
  int64_t grads = 0, params = 0, held = 0;
};

// The busiest op of an MoE layer's backward (scratch and the transient buckets).
int64_t ArenaMoeLayerPeak(const ArenaSizes& z, Recompute recompute, const ArenaMoeBuckets& k);
// The router's expert bias State buffers of one MoE layer, in bytes.
int64_t ArenaMoeStateBuffers(const ArenaSizes& z);

// Microbatches of each local chunk in flight at once on pipeline rank r, `m` per step.
std::vector<int64_t> ArenaSlots(const Plan& plan, int64_t r, int64_t m);
// The stash slots of pipeline rank r's chunks, `m` per step, given each chunk's frame (the bytes
// of one slot): each chunk's own (ArenaSlots), but under the interleaved schedule those of the
// chunks that share one pool (compiler/analyze/slot_pool.h) where compiler/lower pools them
// (lower.cpp, PoolChunkSlots): the pool's slot count, each slot as large as the largest
// member's frame.
struct ArenaStashSlots {
  std::vector<int64_t> slots;  // per chunk; a pooled chunk's is the pool's
  std::vector<bool> pooled;
};
ArenaStashSlots ArenaPooledSlots(const Plan& plan, int64_t r, int64_t m,
                                 const std::vector<int64_t>& frames);
// The landing buffer of local chunk c on pipeline rank r, `m` per step (bytes; zero when it has
// none): one received activation outside the chunk's stash slots, where the first rank of the
// interleaved schedule would otherwise take a slot for its next input before the backward frees
// one (compiler/lower/lower.cpp, LandingChunks).
int64_t ArenaLandingBytes(const Plan& plan, const ArenaSizes& z, int64_t r, int64_t m, int64_t c);

// The ranks the experts' gradients and optimizer state shard over: Edp with ep > 1, and with
// ep = 1, etp = 1 beside tp > 1 under sequence parallelism and ZeRO 0 or 1; else `dense_shard`.
int64_t ArenaExpertShardGroup(const Plan& plan, int64_t dense_shard);

}  // namespace paraplan

#endif  // PARAPLAN_COMPILER_ANALYZE_MEMORY_ARENA_H_
