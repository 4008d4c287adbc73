// Bodies: the forward and backward op lists of one model chunk, and the step bodies (zero
// grads, gradient synchronisation, optimizer step) of one role. With ZeRO >= 2 on dp · cp > 1 the
// chunk bodies also hold the per-layer ZeRO collectives: the ZeRO-3 all-gather of a layer's
// params before its first use, the reduce-scatter of its grads after their last write.
//
// A Llama-style decoder (RMSNorm, RoPE, GQA causal attention, SwiGLU, untied or tied
// embeddings) and a GPT-2-style one (LayerNorm with biases, learned positions, GELU, tied
// embeddings), with the tensor-parallel collectives explicit: column-parallel q/k/v, gate/up
// and fc1; row-parallel o and down/fc2 followed by an all-reduce (or, with sequence
// parallelism, a reduce-scatter, and an all-gather before every column-parallel block);
// vocab-parallel embedding and cross-entropy; either with mixture-of-experts layers in place of
// the MLP (MoeShape). Semantics of every op: runtime/format/README.md.
// With context parallelism (cp > 1) a rank holds seq_len / cp tokens of each sequence (chunks r
// and 2·cp-1-r): RingAttention replaces Attention, RoPE and the data loader work over Cp, and
// the loss and the gradients are reduced over DpCp; ZeRO shards over DpCp.
//
// Multi-head latent attention (model kv_lora_rank > 0, DeepSeek-V2/V3) replaces q/k/v: queries
// through a replicated down projection, RMSNorm and a column-parallel up projection (or one
// projection with q_lora_rank = 0); keys and values through a replicated down projection to the
// kv latent and one shared rope head, RMSNorm of the latent and a column-parallel up projection;
// decoupled RoPE on the rope part of each query head and on the shared key head, broadcast to
// every head; values padded with zeros to the query/key head size for Attention
// (runtime/format/README.md, "Multi-head latent attention"). Not beside context parallelism.
//
// Multi-token prediction (model mtp_layers > 0, DeepSeek-V3): the loss chunk runs the modules
// after the model's loss, each the word embedding of the tokens k ahead and the previous rows,
// normed, concatenated and projected (replicated over tp), one layer of the last layer's kind,
// a final norm, the shared output layer and a cross-entropy on labels k ahead (the last k
// positions ignored); runtime/format/README.md, "Multi-token prediction".
//
// BuildRoleBodies fills a Role's params, buffers (shapes, kinds; no placement yet), buckets,
// chunks and bodies. Placement is memory_plan.h's job, the schedule lower.cpp's.
#ifndef PARAPLAN_COMPILER_LOWER_BODY_H_
#define PARAPLAN_COMPILER_LOWER_BODY_H_

#include <cstdint>
#include <string>
#include <vector>

#include "compiler/lower/program.h"

namespace paraplan::lower {

// One chunk of a pipeline rank, from the pipeline partition.
struct ChunkLayers {
  int32_t first_layer = 0;
  int32_t layers = 0;
  bool embedding = false;  // holds the word embedding (first virtual stage)
  bool loss = false;       // holds the final norm, output layer and loss (last virtual stage)
};

// Activation recompute (the plan's `recompute`), as Megatron-Core does it:
//   kNone       the forward keeps every tensor a backward op reads (Stash buffers)
//   kSelective  the modules BodyShape names are recomputed; the attention core (the default):
//               the forward keeps q, k, v and the attention output but not the softmax
//               statistics (log-sum-exp); the backward body runs Attention again right before
//               AttentionBackward
//   kFull       each layer keeps only its input; the backward body re-runs the layer's forward
//               ops (with their tensor/sequence-parallel collectives) right before its backward
//               ops. The last down-projection, its reduction and residual add are not re-run:
//               nothing in the backward reads them.
enum class ActivationRecompute : uint8_t { kNone, kSelective, kFull };

// Which layers of a chunk full recompute covers (Megatron's --recompute-method and
// --recompute-num-layers; the plan's activations.recompute_method / recompute_layers):
//   layers = 0           every layer, each recomputed from its own input
//   kBlock, layers = n   the first n layers of each chunk, each from its own input; the others
//                        keep every tensor as without recompute
//   kUniform, layers = n the chunk's layers in groups of n: a group keeps only its first layer's
//                        input, and its backward re-runs the whole group's forward first
struct RecomputeLayers {
  bool block = false;
  int32_t layers = 0;
};

// --- mixture of experts ---------------------------------------------------------------------
// The MoE layers of the model (experts == 0: dense). With ep = 1 and etp = 1 every rank holds
// every expert whole (replicated over tp; beside tp > 1 under sequence parallelism and ZeRO 0
// or 1 in a bucket of their own, reduced and sharded over Edp = tp · cp · dp as with ep > 1);
// with ep > 1 it holds experts / ep of them and the dispatch and combine are all-to-alls over Ep
// (runtime/format/README.md, "Expert parallelism"). Each rank routes its own rows of the
// residual stream (rows / tp under sequence parallelism, all tokens otherwise):
//   router    Linear to [rows, experts] logits, MoeRouter (softmax or sigmoid scores, top-k,
//             `normalize` divides the picked weights by their sum), the load-balancing aux loss's
//             gradient (coefficient `aux_coeff`, over the microbatch's tokens) added by
//             MoeRouterBackward; with `bias_rate` > 0 the aux-loss-free expert bias (a State
//             buffer) shifts the top-k choice, each backward adds the microbatch's counts to the
//             step's load (MoeExpertLoad), and the optimizer body sums the load over Dp (the
//             counts are already summed over Tp under sp and over Cp) and moves the bias
//             (MoeExpertBiasUpdate)
//   dispatch  MoePermute: rows·topk rows grouped by expert, the routed buffers at their worst
//             case (every choice of every row); with a capacity factor only the kept pairs
//             (MoeCapacity's mask), the buffers bounded by experts · capacity per segment
//   experts   GroupedLinear gate/up, the model's activation, GroupedLinear down
//   combine   MoeUnpermute weighted by the router weights
//   shared    `shared_ffn` > 0: a dense MLP of that width beside the experts, tensor-parallel as
//   the
//             dense MLP is, added to the combined output
// Expert tensor parallelism (etp > 1; lowering accepts etp = tp with ep = 1, and the Etp groups
// are then the Tp groups): each expert is split as the dense MLP is, gate/up (fc1) by rows of
// ffn / etp and down (fc2) by columns, over the Etp group; the router stays replicated.
//   routing   each rank routes its own rows (the aux loss and the router's gradient as above)
//   gather    under sequence parallelism the Etp group all-gathers the rows and their router
//             logits and routes the gathered logits again (row by row: bit for bit the choices
//             each rank made), so every rank runs its slice of every expert on all the group's
//             tokens, as Megatron-Core's all-gather dispatcher gathers the routing over the
//             tensor-parallel ranks; without sequence parallelism every rank holds every row
//   reduce    the combined partial outputs are reduce-scattered back to the rows (all-reduced
//             without sequence parallelism); the shared experts read the gathered rows
//   backward  the output gradient is gathered; the router weights' and the inputs' gradients,
//             partial sums over the expert slices, are reduce-scattered (all-reduced); the
//             slices' own gradients are complete on each rank and reduced over the
//             data-parallel group, which is the experts' (edp = dp · cp)
struct MoeShape {
  int64_t experts = 0;
  int64_t topk = 0;
  int64_t ffn = 0;         // each expert's hidden width
  int64_t shared_ffn = 0;  // shared experts · ffn (0: none)
  int64_t dense_layers = 0;
  int64_t layer_freq = 1;
  bool normalize = false;  // renormalise the top-k weights
  int64_t score = 0;       // 0 softmax, 1 sigmoid (MoeRouter's `score`)
  double aux_coeff = 0.01;
  double bias_rate = 0;  // aux-loss-free balancing: the expert bias's update rate (0: no bias)
  // Group-limited routing (MoeRouter's `groups`, `group_topk`; 1, 1: none) and the factor of
  // the top-k weights (MoeRouter's `scale`; 1: none).
  int64_t router_groups = 1;
  int64_t router_group_topk = 1;
  double router_scale = 1;
  // Tokens past an expert's capacity ceil(rows · topk / experts · capacity_factor) of the rows a
  // rank routes are dropped (MoeCapacity: weight 0); 0 = dropless. Under expert tensor
  // parallelism with sequence parallelism, the rows of each rank of the Etp group, each with
  // its own capacity.
  double capacity_factor = 0;
  bool drop_by_position = false;  // moe.drop_policy = position
  int64_t etp = 1;  // expert tensor parallelism: each expert's ffn split etp ways (Etp group)
  // Expert parallelism (ep > 1): the routing imbalance the plan states (`moe.imbalance`, the
  // worst rank's routed rows over the average), 0 when it states none. It bounds the dispatch's
  // receive buffers; without it they hold the worst case (lower/body.cpp DispatchCapacity).
  double imbalance = 0;

  // Layer `index` (0-based) is an MoE layer (compiler/plan IsMoeLayer).
  bool IsMoeLayer(int64_t index) const {
    if (experts <= 0 || index < dense_layers) return false;
    return (index - dense_layers) % (layer_freq > 0 ? layer_freq : 1) == 0;
  }
};
// --- end mixture of experts -----------------------------------------------------------------

// The sizes bodies are built for (from Program::model / parallel / train).
struct BodyShape {
  ModelConfig model;
  ParallelConfig parallel;
  int64_t microbatches = 1;
  prog::Precision precision = prog::Precision::Bf16;
  // The gradients' element type (mixed_precision.grads): the params' grads, the grad buckets and
  // their ZeRO shards; f32 unless the plan states bf16 or fp16 (Megatron's bf16 grad reduce).
  prog::DType grad_type = prog::DType::F32;
  bool sgd = false;  // optimizer.type = sgd: Sgd ops instead of AdamW
  ActivationRecompute recompute = ActivationRecompute::kNone;
  RecomputeLayers recompute_layers;  // with kFull
  // What kSelective recomputes (Megatron's --recompute-modules; all false otherwise): the
  // attention core (core_attn, the default), the experts' activation from their gate and up
  // (moe_act), the dense layers' MLP from its norm's output (mlp) and the MoE layers' shared
  // experts from their input (shared_experts), both norms' outputs and statistics from their
  // inputs (layernorm), and the MoE layers' whole MoE block from its input (moe: then neither
  // moe_act nor shared_experts is set, the block covering both).
  // Latent attention's q, k and v from the kept latents (mla_up_proj).
  bool recompute_core_attention = false, recompute_moe_act = false, recompute_mlp = false,
       recompute_shared_experts = false, recompute_layernorm = false, recompute_moe = false,
       recompute_mla_up_proj = false;
  MoeShape moe;  // mixture of experts (experts == 0: dense)
};

// Indices of the step bodies BuildRoleBodies adds after the chunk bodies.
struct StepBodies {
  int32_t zero_grads = -1;
  int32_t reduce_grads = -1;
  int32_t optimizer_step = -1;
};

// Builds everything of a role but placement and schedule. `chunks` is this pipeline rank's
// chunks in local order.
StepBodies BuildRoleBodies(const BodyShape& shape, int32_t pipeline_rank,
                           const std::vector<ChunkLayers>& chunks, Role& role);

// The element type of activations for a precision (bf16 for bf16 and fp8, f16, f32).
prog::DType ActivationType(prog::Precision precision);

}  // namespace paraplan::lower

#endif  // PARAPLAN_COMPILER_LOWER_BODY_H_
