// The time model: step time, tokens/s per GPU and MFU of a plan, each with its breakdown.
//
// Priced per framework profile (cost_framework.h: the plan's `framework` on its GPU generation).
// Per pipeline rank and microbatch: linear GEMMs at a size-dependent efficiency
// (GpuEfficiency: fraction = max · g / (g + g_half) for a GEMM of g FLOP, times the profile's
// compute_scale; FP8 multiplies the 16-bit rate by the profile's fp8_gemm_speedup), the
// attention core (fused: at the GPU's attention fraction, lower for short key blocks and small
// heads, always in bf16; unfused: batched GEMMs per head), memory-bound time (stored activation
// bytes × passes / achieved HBM bandwidth, MoE permute/unpermute, the profile's fixed cost per
// layer), and the exposed communication of every layer: TP/SP collectives (2 forward + 2
// backward per layer, +2 under full recompute; the profile's overlap share hides them behind
// the linear GEMMs), CP (ring: cp - 1 K/V steps, each overlapped with 1/cp of the core;
// all-gather: exposed), EP all-to-all (dispatch + combine, forward and backward; the profile's
// overlap share), pipeline sends. Recompute adds the forward again (full) or the attention core
// (selective) to the backward. ZeRO 2/3 traffic is priced per layer inside every microbatch
// (gathers prefetched behind the layer's compute, a launch latency per collective, the
// profile's bandwidth factor), except FSDP2 with pipeline parallelism, which keeps parameters
// gathered over the step.
// The pipeline: t = m · U_max + (ΣU − U_max) / v over the per-rank microbatch times U (1F1B and
// GPipe: (m + p − 1) · U when balanced; interleaved: bubble (p − 1)/v). The DP gradient sync
// (all-reduce, or reduce-scatter + all-gather from ZeRO 1) is overlapped with the last
// microbatch's backward when the profile (or CostOptions) overlaps it, else fully exposed;
// plus the profile's fixed cost per step.
//
// FLOP convention (MFU): model FLOPs without recompute, matrix multiplications only, causal
// attention counted as half of s² (Megatron-Core's convention since 2025). The executed
// attention work is half of s² with fused attention and the full s² without it.
// Made by EstimateTime for explain and search; read by the ranking and the OOM helps.
#ifndef PARAPLAN_COMPILER_ANALYZE_TIME_H_
#define PARAPLAN_COMPILER_ANALYZE_TIME_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "compiler/analyze/cost_framework.h"
#include "compiler/analyze/cost_params.h"
#include "compiler/plan/plan.h"

namespace paraplan {

// Seconds per microbatch on one pipeline rank (all its chunks).
struct StageTime {
  int64_t stage = 0;
  double flops = 0;         // model FLOPs of one microbatch on one GPU of the stage, fwd + bwd
  double gemm_s = 0;        // forward + backward GEMMs
  double memory_s = 0;      // memory-bound kernels (norms, activations, softmax, loss)
  double recompute_s = 0;   // extra forward work in the backward
  double tp_comm_s = 0;     // exposed TP/SP collectives
  double cp_comm_s = 0;     // exposed CP ring exchange
  double ep_comm_s = 0;     // EP all-to-all
  double pp_comm_s = 0;     // pipeline sends and receives
  double forward_s = 0;     // parts of the above in the forward pass
  double microbatch_s = 0;  // U: everything above
  double dp_sync_s = 0;     // per step: DP gradient (and parameter) collectives, unhidden (ZeRO 2/3
                            // move theirs every microbatch, inside microbatch_s)
  double dp_exposed_s = 0;  // per step: what the overlap does not hide
  double optimizer_s = 0;   // per step
};

struct TimeEstimate {
  bool valid = false;
  int64_t microbatches = 0;
  std::vector<StageTime> stages;
  int64_t critical_stage = 0;  // the rank with the largest microbatch time
  // Step breakdown (seconds): compute, communication, bubble, DP, optimizer, overhead.
  double compute_s = 0;  // m × (GEMM + memory-bound + recompute) on the critical rank
  double comm_s = 0;     // m × exposed TP/CP/EP/PP communication on the critical rank
  double bubble_s = 0;   // pipeline fill and drain
  double dp_exposed_s = 0;
  double optimizer_s = 0;
  double overhead_s = 0;  // the framework's fixed cost per step and the loss to stragglers
  double step_s = 0;
  double tokens_per_s = 0;  // whole job
  double tokens_per_s_per_gpu = 0;
  double model_flops_per_step = 0;
  double mfu = 0;  // model FLOPs / (step · world · peak)
  // The framework profile that priced it (cost_framework.h): stack and GPU generation, and how
  // close it came to the published runs of its stack.
  std::string_view framework, generation;
  ProfileCheck checked;
};

TimeEstimate EstimateTime(const Plan& plan, const CostOptions& options = {});
// The same with the plan's memory estimate already at hand (search: one partition per candidate
// less). `memory` must be EstimateMemory(plan, options).
struct MemoryEstimate;
TimeEstimate EstimateTime(const Plan& plan, const CostOptions& options,
                          const MemoryEstimate& memory);

// Model FLOPs per token for training (forward + backward = 3 × forward), without recompute.
// causal_halved: attention core over s/2 keys (our MFU convention) or all s (PaLM, NeMo 24.07).
double ModelFlopsPerToken(const ModelSpec& model, bool causal_halved);

// A stable text report of the estimate.
std::string PrintTime(const TimeEstimate& estimate);

}  // namespace paraplan

#endif  // PARAPLAN_COMPILER_ANALYZE_TIME_H_
