#include "compiler/analyze/cost_params.h"

#include <algorithm>
#include <cctype>
#include <string>

namespace paraplan {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;

// Calibrated on the 20 published Megatron-LM A100 runs (bench/calibration): one set for all rows.
constexpr GpuEfficiency kAmpere = {
    "ampere",
    "fit to Narayanan SC21 Table 1 and Korthikanti MLSys23 Tables 4-5 (A100-SXM4-80GB, 2021-22 "
    "Megatron-LM)",
    /*gemm_max_fraction=*/0.80,
    /*gemm_half_flops=*/2.0e9,
    // Not fit (the calibration rows predate fused attention): FlashAttention-2 reaches 50-73% of
    // the A100's peak forward and less backward (Dao 2023). Like every attention rate here, it
    // counts the backward as 2.5x the forward's FLOPs, as FlashAttention's benchmarks do
    // (LayerCost::backward_extra_s in time.cpp).
    /*attention_fraction=*/0.55,
    /*hbm_fraction=*/0.85,
    /*elementwise_passes=*/2.0,
    /*nvlink_bus_fraction=*/0.75,
    /*network_bus_fraction=*/0.70,
    /*collective_latency_s=*/10e-6,
    // Fitted; stands for the synchronisation around each pipeline exchange in the 2021-22
    // Megatron-LM p2p code (batched isend/irecv, then a device synchronize), not wire latency.
    /*p2p_latency_s=*/1.5e-3,
    /*runtime_reserve_bytes=*/1024 * kMiB,
    /*nccl_bytes_per_communicator=*/64 * kMiB,
    /*pcie_bandwidth=*/20e9,
    /*cpu_adam_params_per_s=*/1.0e9,
    /*step_overhead_s=*/0.05,
};

// Hopper: the GEMM curve and the attention rate come from published H100 numbers and the H100
// runs (bench/calibration/README.md, "GPU efficiency sets"); the rest as on Ampere. The H100
// calibration runs are fit through the framework profiles' scales (cost_framework.cpp), which
// multiply these fractions.
//   gemm_max_fraction 0.70: a sustained large GEMM, below the 0.80 of the 989 TFLOP/s peak
//     (792-798 TFLOP/s) that short unthrottled benchmarks reach. Each stack's profile scales it
//     by its fitted compute scale (Megatron-Core's 0.95 on its 19 H100 runs, which reach 41-48%
//     MFU end to end).
//   gemm_half_flops 3e10: a GEMM loses about half a wave of output tiles at its tail. With 132
//     SMs and 128 x 256 tiles a wave is 8.7e6 x K FLOP, so half a wave is 1.8e10 to 3.5e10 for
//     contraction sizes K = 4096 to 8192; the H100 runs of all three stacks prefer the upper end
//     (`paraplan_calibrate --fit` prints the fit, and leave-one-source-out refits it). A 4096^3
//     GEMM runs at 0.57 of peak, an 8192^3 at 0.68.
//   attention_fraction 0.35: FlashAttention-2 reaches about 35% of the H100 peak, forward and
//     backward counted as 3.5x the forward's FLOPs (Shah et al. 2024, Sec. 4; its backward
//     computes the scores again): the kernel PyTorch's SDPA runs, and the rate the
//     other kernels are stated against (FlashAttention-1 at 1/1.8 of it, Dao 2023).
//     FlashAttention-3 reaches 75% forward only, and its backward much less; a faster kernel
//     is its stack's attention_scale above 1, fitted where the runs determine it.
constexpr GpuEfficiency kHopper = {
    "hopper",
    "sustained large-GEMM ceiling 0.70 of 989 TFLOP/s (scaled per stack by its fitted compute "
    "scale, Megatron-Core's 0.95); half-size 3e10 FLOP, half a wave "
    "of 128x256 tiles on 132 SMs at K ~ 7K, fit on the H100 runs; fused attention at 0.35 of "
    "peak (FlashAttention-2); NVLink4/NDR bus efficiencies as on Ampere",
    0.70,
    3.0e10,
    0.35,
    0.80,
    2.0,
    0.75,
    0.85,
    10e-6,
    20e-6,
    1024 * kMiB,
    64 * kMiB,
    50e9,
    1.5e9,
    0.05,
};

constexpr GpuEfficiency kBlackwell = {
    "blackwell",
    "not fit: large-GEMM ceiling 0.70, the other fractions as on Hopper, applied to Blackwell "
    "peaks",
    0.70,
    8.0e9,
    0.35,
    0.80,
    2.0,
    0.75,
    0.85,
    10e-6,
    20e-6,
    1024 * kMiB,
    64 * kMiB,
    50e9,
    1.5e9,
    0.05,
};

constexpr GpuEfficiency kGeneric = {
    "generic", "not fit: conservative fractions for an unknown GPU",
    0.60,      2.0e9,
    0.40,      0.70,
    2.0,       0.70,
    0.80,      15e-6,
    30e-6,     1024 * kMiB,
    64 * kMiB, 16e9,
    1.0e9,     0.05,
};

bool Contains(const std::string& haystack, std::string_view needle) {
  return haystack.find(needle) != std::string::npos;
}

}  // namespace

const GpuEfficiency& EfficiencyFor(const GpuSpec& gpu) {
  std::string name = gpu.name;
  std::transform(name.begin(), name.end(), name.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (Contains(name, "a100") || Contains(name, "a800")) return kAmpere;
  if (Contains(name, "h100") || Contains(name, "h200") || Contains(name, "h800") ||
      Contains(name, "gh200"))
    return kHopper;
  if (Contains(name, "b200") || Contains(name, "b100") || Contains(name, "gb200") ||
      Contains(name, "b300"))
    return kBlackwell;
  return kGeneric;
}

const GpuEfficiency& EfficiencyFor(const GpuSpec& gpu, const CostOptions& options) {
  return options.efficiency ? *options.efficiency : EfficiencyFor(gpu);
}

double PeakFlops(const Plan& plan) {
  const GpuSpec& g = plan.cluster.gpu;
  switch (plan.precision) {
    case Precision::kBf16:
      return g.peak_bf16;
    case Precision::kFp16:
      return g.peak_fp16 > 0 ? g.peak_fp16 : g.peak_bf16;
    case Precision::kFp8:
      return g.peak_fp8 >= kMinFp8Peak ? g.peak_fp8 : g.peak_bf16;
    case Precision::kFp32:
      return g.peak_bf16 / 2;  // TF32 tensor cores
  }
  return g.peak_bf16;
}

int64_t ActivationElementBytes(Precision precision) {
  return precision == Precision::kFp32 ? 4 : 2;
}

}  // namespace paraplan
