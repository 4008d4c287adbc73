// The assumptions of the memory and time models, in one place.
//
// CostOptions: software behaviour that the plan does not state (FlashAttention, dropout,
// which communications overlap, MoE routing imbalance, the allocator margin). The defaults
// describe a current Megatron-Core run; a plan that names another framework gets that
// framework's flags instead (OptionsForFramework, cost_framework.h).
//
// GpuEfficiency: the calibrated efficiency parameters of one GPU type (how close GEMMs,
// memory-bound kernels and NCCL come to the peaks in the plan's `gpu` and `cluster` records).
// One set per GPU generation, chosen from the GPU record's name (EfficiencyFor); documented with
// its provenance in bench/calibration/README.md. Never per plan, never per calibration row.
//
// Read by memory.cpp, time.cpp and search; nothing here depends on a plan.
#ifndef PARAPLAN_COMPILER_ANALYZE_COST_PARAMS_H_
#define PARAPLAN_COMPILER_ANALYZE_COST_PARAMS_H_

#include <cstdint>
#include <string_view>

#include "compiler/plan/plan.h"

namespace paraplan {

struct CostOptions {
  // Attention core without materialised s x s scores (FlashAttention / cuDNN fused attention):
  // no 5as score bytes per token, only fp32 softmax statistics; causal masks skip half the work.
  bool flash_attention = true;
  // Hidden and attention dropout on (1-byte masks stored, as in Korthikanti's GPT).
  bool dropout = false;
  // DP gradient reduce-scatter/all-reduce overlapped with the last microbatch's backward
  // (--overlap-grad-reduce); parameter all-gather with the next forward (--overlap-param-gather).
  bool overlap_grad_reduce = true;
  bool overlap_param_gather = true;
  // TP/SP collectives overlapped with GEMMs (--tp-comm-overlap) even where the plan's
  // `parallel.tp_comm_overlap` is false (the two are OR'ed). Off: as the plan says.
  bool tp_comm_overlap = false;
  // Worst-rank routed tokens over the average (1.0 = balanced routing, as NVIDIA's published
  // MoE numbers use). Multiplies routed-token activations, buffers and expert compute.
  double moe_imbalance = 1.0;
  // Megatron-Core >= 0.13 applies the router probabilities inside the experts' activation
  // ("memory efficient token permutation", MoE README), so the combine keeps no copy of the
  // experts' output: a routed (token, expert) pair stores its expert input (h) and the expert MLP
  // intermediates. Earlier releases multiplied by the probabilities in unpermute and kept the
  // experts' output for that gradient: one more hidden-width copy per pair (false).
  bool moe_probs_in_activation = true;
  // Allocator margin, percent of everything else (caching-allocator fragmentation, transient
  // peaks that the model does not list one by one).
  int64_t allocator_margin_percent = 5;
  // Replaces the GPU's calibrated efficiency set (used when fitting the set itself).
  const struct GpuEfficiency* efficiency = nullptr;
  // The software stack to price the plan as (cost_framework.h); empty: the plan's `framework`.
  std::string_view framework;
  // Replaces the framework profile (used when fitting the profile itself).
  const struct FrameworkProfile* profile = nullptr;
};

struct GpuEfficiency {
  std::string_view name;          // "ampere", "hopper", ...
  std::string_view provenance;    // where the numbers come from, one line
  double gemm_max_fraction;       // achieved / peak for very large GEMMs
  double gemm_half_flops;         // GEMM size (FLOP) at which the fraction is half the max
  double attention_fraction;      // achieved / peak of the fused attention kernels
                                  // (FlashAttention / cuDNN, forward and backward together);
                                  // used when CostOptions::flash_attention is on
  double hbm_fraction;            // achieved / peak HBM bandwidth in memory-bound kernels
  double elementwise_passes;      // HBM bytes moved per stored activation byte, forward
                                  // (backward moves twice as many)
  double nvlink_bus_fraction;     // NCCL bus bandwidth / nvlink_bandwidth
  double network_bus_fraction;    // NCCL bus bandwidth / network_bandwidth
  double collective_latency_s;    // per ring step
  double p2p_latency_s;           // per pipeline send/receive
  int64_t runtime_reserve_bytes;  // CUDA context, cuBLAS/TE workspaces
  int64_t nccl_bytes_per_communicator;
  double pcie_bandwidth;         // bytes/s per GPU, for CPU offload
  double cpu_adam_params_per_s;  // host optimizer throughput per GPU's share of the CPU
  double step_overhead_s;        // per optimizer step: data loader, logging, launch gaps
};

// The efficiency set for a GPU record: by its name ("a100..." -> ampere, "h100"/"h200"/"h800"
// -> hopper, "b200"/"gb200" -> blackwell), else a conservative generic set.
const GpuEfficiency& EfficiencyFor(const GpuSpec& gpu);
// The override in `options` when set, else EfficiencyFor(gpu).
const GpuEfficiency& EfficiencyFor(const GpuSpec& gpu, const CostOptions& options);

// Peak dense FLOP/s of the plan's precision on its GPU (fp32 uses peak_bf16 / 2 when no fp32
// peak is given; fp8 falls back to bf16 when peak_fp8 is 0).
double PeakFlops(const Plan& plan);

// Bytes of one activation element for the plan's precision (2 for bf16/fp16/fp8, 4 for fp32).
int64_t ActivationElementBytes(Precision precision);

}  // namespace paraplan

#endif  // PARAPLAN_COMPILER_ANALYZE_COST_PARAMS_H_
