// Framework profiles: how one software stack behaves on one GPU generation, for the time model.
//
// A plan names its stack (`framework = megatron_core`, `torchtitan`, `deepspeed`, `llm_foundry`,
// `megatron_lm_2021`, `paraplan`); the GPU record decides the generation (EfficiencyFor: ampere,
// hopper, blackwell, generic). The pair selects one documented parameter set: the behaviour of
// the stack (fused attention, what overlaps with what, how ZeRO-3/FSDP gathers, how context
// parallelism exchanges K/V) and a few fitted numbers (compute efficiency of the stack's kernels,
// fixed costs per layer and per step). Every number is per (stack, GPU generation), never per
// plan or per calibration row; provenance in bench/calibration/README.md ("Framework profiles").
//
// Read by time.cpp (and through it explain, search and the calibration bench).
#ifndef PARAPLAN_COMPILER_ANALYZE_COST_FRAMEWORK_H_
#define PARAPLAN_COMPILER_ANALYZE_COST_FRAMEWORK_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "compiler/analyze/cost_params.h"

namespace paraplan {

// How the ZeRO-3 / FSDP parameter gathers of a stack behave.
enum class ShardStyle : uint8_t {
  kMegatron,   // Megatron distributed optimizer / Megatron-FSDP: bucketed, prefetched per layer
  kDeepSpeed,  // DeepSpeed ZeRO-3 (2021): one synchronous all-gather per parameter tensor
  kFsdp,       // PyTorch FSDP (1 or 2): one gather per layer, prefetch of the next layer;
               // with pipeline parallelism FSDP2 keeps parameters gathered across microbatches
};

// How context parallelism exchanges keys and values.
enum class CpStyle : uint8_t {
  kRing,       // ring of cp - 1 point-to-point K/V steps, each overlapped with one block of the
               // attention core (Megatron-Core / Transformer Engine p2p, torchtitan ring)
  kAllGather,  // one all-gather of K/V before the core and a reduce-scatter of dK/dV after it
               // (Llama 3, TE "all_gather"); not overlapped
  kGatherBehindLocal,  // torch's context_parallel with rotate_method "allgather" (torchtitan's
                       // default): the all-gather of every K/V shard is issued before the local
                       // block and waited on after it, so only that 1/cp of the core hides it
};

// How close a profile came to the published runs it prices, each run predicted with its source
// left out of the fit (bench/calibration, `paraplan_calibrate`, "per profile"): the stack whose
// runs they are, their number, and the median and 90th percentile |error| in percent. No runs:
// the profile's numbers are unmeasured.
struct ProfileCheck {
  std::string_view stack;
  int runs = 0;
  double median_pct = 0, p90_pct = 0;
};

// "checked on N published S runs (each with its source left out of the fit): median error M%,
// p90 P%", or "unchecked: ..." when there are none; no newline.
std::string DescribeCheck(const ProfileCheck& check);
// The check as JSON members: "checked_stack", "checked_runs", "checked_median_error_pct",
// "checked_p90_error_pct" (no braces).
std::string CheckJsonMembers(const ProfileCheck& check);

struct FrameworkProfile {
  std::string_view stack;       // "megatron_core", ...
  std::string_view generation;  // "ampere", "hopper", ... ("" = any)
  std::string_view provenance;  // one line: where the numbers come from

  // Behaviour (documented, not fitted).
  bool flash_attention = true;  // fused attention kernels (no s x s scores)
  bool dropout = false;         // hidden/attention dropout
  bool overlap_grad_reduce = true;
  bool overlap_param_gather = true;
  double tp_overlap = 0;  // share of the GEMM time that hides TP collectives (0: none)
  double ep_overlap = 0;  // share of the expert compute that hides the all-to-all
  ShardStyle shard = ShardStyle::kMegatron;
  double shard_prefetch = 0.9;  // share of a layer's compute that hides its ZeRO-3 gathers
  // What shard_prefetch would be without the profile's own runs, where they set it (< 0: it is
  // documented behaviour); leave-one-source-out falls back to it.
  double shard_prefetch_unfit = -1;
  CpStyle cp = CpStyle::kRing;
  double fp8_gemm_speedup = 1.6;  // FP8 linear GEMM rate over BF16 at the same size (casts,
                                  // amax bookkeeping and scaling included); attention stays bf16
  // Row-wise scaling (torchao's "rowwise") keeps this share of the time tensor-wise scaling saves
  // on the linear GEMMs: its scaled GEMMs and per-row casts are slower. 0.46 from torchao's
  // published Llama 3 8B benchmark on 8 H100 (torch.compile, FSDP2: bf16 6,150 tokens/s,
  // tensor-wise 7,690 (+25.0%), row-wise 6,768 (+10.1%); 0.101/1.101 over 0.250/1.250).
  double fp8_rowwise_share = 0.46;
  double moe_imbalance = 1.0;  // worst-rank routed tokens over the average
  // attention_scale comes from the published rates of the stack's attention kernel (not fitted;
  // the calibration fit leaves it as it is).
  bool attention_documented = false;
  // Head size at which the stack's attention kernel runs at half its large-head rate (0: every
  // head size alike). 32 puts head 64 at 0.83 of head 128: FlashAttention-2 runs head 64 at
  // 0.88 of head 128, FlashAttention-3 at 0.77 and cuDNN at 0.69 (Shah et al. 2024, Fig. 5,
  // H100 forward at 16K). Triton's FlashAttention runs both alike (403 and 395 TFLOP/s there).
  double attention_head_knee = 32;

  // Memory: what the stack's allocator reserves beyond the bytes the model lists, percent of
  // them (CostOptions::allocator_margin_percent; planrun's static arena has none).
  int64_t allocator_margin_percent = 5;

  // Fitted (bench/calibration --fit): per (stack, generation).
  double compute_scale = 1.0;     // multiplies the GPU's GEMM and attention fractions
  double attention_scale = 1.0;   // multiplies the fused-attention fraction once more (the
                                  // stack's attention kernel against cuDNN/FlashAttention-2)
  double shard_comm_scale = 1.0;  // ZeRO-3/FSDP gathers and reduce-scatters take this many
                                  // times the NCCL ring time (per-module buckets, fp32 reduce)
  // Under `compile = true` (torch.compile) the memory-bound kernels take this share of their
  // eager time: norms, activations, rotary embeddings and residual adds fused.
  double compiled_memory_scale = 1.0;
  double shard_interference = 0;  // the ZeRO-3/FSDP traffic hidden behind compute slows it by
                                  // this share of the hidden seconds (NCCL's SMs and HBM use)
  double layer_overhead_s = 0;    // per layer and microbatch, forward + backward (launches,
                                  // small kernels, Python/dispatcher time)
  // Per MoE layer and microbatch, forward + backward, on top of layer_overhead_s: the router's,
  // permutation's and per-expert GEMMs' small kernels, exposed because the dispatcher copies the
  // token counts to the host before every dispatch (the host cannot queue ahead of the device).
  double moe_layer_overhead_s = 0;
  double step_overhead_s = 0.05;  // per optimizer step (data loader, logging, host sync)
  // Share of the step lost per doubling of the job's nodes: every collective waits for the
  // slowest rank, and the slowest of more ranks is slower (stragglers, clock and network
  // jitter). 0.5% for every stack but Megatron-Core (bench/calibration/README.md, changes 6
  // and 7).
  double node_scaling_loss = 0.005;
  double collective_latency_s = 30e-6;  // per collective launch (ZeRO-3 per-layer traffic)
  double p2p_latency_s = 20e-6;         // per pipeline exchange (synchronisation included)

  // How close the profile came to the published runs it prices (ProfileCheck).
  ProfileCheck checked;
};

// The stacks a plan can name, in a stable order.
const std::vector<std::string_view>& FrameworkStacks();
bool IsFrameworkStack(std::string_view stack);

// The profile of `stack` on the generation of `gpu` (EfficiencyFor(gpu).name); a stack without
// a set for that generation uses its nearest one (hopper for blackwell, ampere for generic).
// An unknown stack name reads as "paraplan".
const FrameworkProfile& ProfileFor(std::string_view stack, const GpuSpec& gpu);
// Every profile, for the calibration bench and the docs table.
const std::vector<FrameworkProfile>& AllProfiles();

// The stack a plan runs on: CostOptions::framework when set, else the plan's `framework` field
// ("paraplan" by default). `named` tells whether a stack other than the default was named
// (then the profile's software flags replace those of CostOptions; the default stack keeps
// the flags it is given, which default to the same behaviour).
std::string_view FrameworkOf(const Plan& plan, const CostOptions& options, bool* named = nullptr);

// The profile that prices the plan: CostOptions::profile when set, else the profile of
// FrameworkOf on the plan's GPU.
const FrameworkProfile& PricingProfile(const Plan& plan, const CostOptions& options);

// `options` with the software flags (fused attention, dropout, DP overlap, MoE imbalance) and
// the allocator margin of the plan's framework when one is named; `options` unchanged otherwise.
CostOptions OptionsForFramework(const Plan& plan, const CostOptions& options);

}  // namespace paraplan

#endif  // PARAPLAN_COMPILER_ANALYZE_COST_FRAMEWORK_H_
