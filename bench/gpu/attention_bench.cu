// paraplan_attention_bench: times the CUDA backend's attention kernels alone on one GPU (causal,
// bf16 tensor cores, fp32 in and out, as the backend runs them) and prints ms and TFLOP/s per
// kernel. Before timing, it checks the kernels against a naive fp32 host computation (the whole
// forward and backward on a small size, sampled output rows on every timed size), so a wrong
// kernel cannot look fast; a failed check ends the run with status 1.
//
//   paraplan_attention_bench [--repeats N]      (see bench/gpu/README.md)
//
// The kernels come from including attention.cu, so that each one is launched and timed on its
// own (the backend's AttentionBackward runs three in a row).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "runtime/backends/cuda/kernels/attention.cu"

namespace paraplan::cuda {
namespace {

struct Problem {
  int64_t batch, seq, heads, head_dim;
};

struct DeviceBuffers {
  float *q, *k, *v, *out, *lse, *dout, *dq, *dk, *dv, *delta;
};

float* DeviceUpload(const std::vector<float>& host) {
  float* p = nullptr;
  PARAPLAN_CUDA_CHECK(
      cudaMalloc(reinterpret_cast<void**>(&p), std::max<size_t>(host.size(), 1) * sizeof(float)));
  PARAPLAN_CUDA_CHECK(
      cudaMemcpy(p, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice));
  return p;
}

std::vector<float> DeviceDownload(const float* p, int64_t n) {
  std::vector<float> host(n);
  PARAPLAN_CUDA_CHECK(cudaMemcpy(host.data(), p, n * sizeof(float), cudaMemcpyDeviceToHost));
  return host;
}

std::vector<float> Random(int64_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(gen);
  return v;
}

// The tensors of one problem in the batch-major layout (row = b · seq + s), heads = kv heads.
struct HostInputs {
  std::vector<float> q, k, v, dout;
};

HostInputs MakeInputs(const Problem& p) {
  const int64_t n = p.batch * p.seq * p.heads * p.head_dim;
  return HostInputs{Random(n, 1), Random(n, 2), Random(n, 3), Random(n, 4)};
}

TokenLayout Layout(const Problem& p) {
  return TokenLayout{p.seq, p.batch, /*seq_stride=*/1, /*batch_stride=*/p.seq, 0};
}

DeviceBuffers Upload(const Problem& p, const HostInputs& in) {
  const int64_t n = p.batch * p.seq * p.heads * p.head_dim;
  const std::vector<float> zeros(n, 0.0f), row_zeros(p.batch * p.heads * p.seq, 0.0f);
  return DeviceBuffers{DeviceUpload(in.q),     DeviceUpload(in.k),      DeviceUpload(in.v),
                       DeviceUpload(zeros),    DeviceUpload(row_zeros), DeviceUpload(in.dout),
                       DeviceUpload(zeros),    DeviceUpload(zeros),     DeviceUpload(zeros),
                       DeviceUpload(row_zeros)};
}

void Free(DeviceBuffers& d) {
  for (float* p : {d.q, d.k, d.v, d.out, d.lse, d.dout, d.dq, d.dk, d.dv, d.delta}) cudaFree(p);
}

// The naive reference of one (sequence, head): probabilities P (seq × seq, causal, fp32 with
// double sums), out, lse, and when `grads` also dq, dk, dv. Index of (s, d): row s of the
// problem's layout.
struct Reference {
  std::vector<float> out, lse, dq, dk, dv;
};

Reference NaiveAttention(const Problem& p, const HostInputs& in, int64_t b, int64_t h, bool grads) {
  const int64_t T = p.seq, D = p.head_dim;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  auto at = [&](const std::vector<float>& x, int64_t s, int64_t d) {
    return x[((b * T + s) * p.heads + h) * D + d];
  };
  Reference r{std::vector<float>(T * D), std::vector<float>(T), {}, {}, {}};
  std::vector<float> prob(T * T, 0.0f);
  for (int64_t i = 0; i < T; ++i) {
    double m = -INFINITY;
    std::vector<double> s(i + 1);
    for (int64_t j = 0; j <= i; ++j) {
      double dot = 0.0;
      for (int64_t d = 0; d < D; ++d) dot += static_cast<double>(at(in.q, i, d)) * at(in.k, j, d);
      s[j] = dot * scale;
      m = std::max(m, s[j]);
    }
    double sum = 0.0;
    for (int64_t j = 0; j <= i; ++j) sum += std::exp(s[j] - m);
    r.lse[i] = static_cast<float>(m + std::log(sum));
    for (int64_t j = 0; j <= i; ++j) prob[i * T + j] = static_cast<float>(std::exp(s[j] - m) / sum);
    for (int64_t d = 0; d < D; ++d) {
      double o = 0.0;
      for (int64_t j = 0; j <= i; ++j) o += prob[i * T + j] * static_cast<double>(at(in.v, j, d));
      r.out[i * D + d] = static_cast<float>(o);
    }
  }
  if (!grads) return r;
  r.dq.assign(T * D, 0.0f);
  r.dk.assign(T * D, 0.0f);
  r.dv.assign(T * D, 0.0f);
  for (int64_t i = 0; i < T; ++i) {
    double delta = 0.0;
    for (int64_t d = 0; d < D; ++d)
      delta += static_cast<double>(at(in.dout, i, d)) * r.out[i * D + d];
    for (int64_t j = 0; j <= i; ++j) {
      double dp = 0.0;
      for (int64_t d = 0; d < D; ++d) dp += static_cast<double>(at(in.dout, i, d)) * at(in.v, j, d);
      const double pij = prob[i * T + j];
      const double ds = pij * (dp - delta) * scale;
      for (int64_t d = 0; d < D; ++d) {
        r.dv[j * D + d] += static_cast<float>(pij * at(in.dout, i, d));
        r.dq[i * D + d] += static_cast<float>(ds * at(in.k, j, d));
        r.dk[j * D + d] += static_cast<float>(ds * at(in.q, i, d));
      }
    }
  }
  return r;
}

// max |got − want| / max |want| over rows `rows` of (b, h); the kernels' bf16 operands give
// about 1e-2 here.
double RelativeError(const Problem& p, const std::vector<float>& got,
                     const std::vector<float>& want, int64_t b, int64_t h,
                     const std::vector<int64_t>& rows) {
  double err = 0.0, scale = 0.0;
  for (int64_t s : rows) {
    for (int64_t d = 0; d < p.head_dim; ++d) {
      const double g = got[((b * p.seq + s) * p.heads + h) * p.head_dim + d];
      const double w = want[s * p.head_dim + d];
      if (!std::isfinite(g)) return INFINITY;
      err = std::max(err, std::fabs(g - w));
      scale = std::max(scale, std::fabs(w));
    }
  }
  return err / std::max(scale, 1e-30);
}

constexpr double kMaxRelativeError = 3e-2;

bool Check(const char* what, double err) {
  const bool ok = err <= kMaxRelativeError;
  std::printf("  check %-28s relative error %.2e %s\n", what, err, ok ? "ok" : "FAILED");
  return ok;
}

void RunForward(const Problem& p, const DeviceBuffers& d) {
  AttentionForward(d.out, d.lse, d.q, d.k, d.v, Layout(p), p.heads, p.heads, p.head_dim,
                   1.0f / std::sqrt(static_cast<float>(p.head_dim)), 0, nullptr);
}

void RunBackward(const Problem& p, const DeviceBuffers& d) {
  AttentionBackward(d.dq, d.dk, d.dv, d.dout, d.out, d.lse, d.q, d.k, d.v, Layout(p), p.heads,
                    p.heads, p.head_dim, 1.0f / std::sqrt(static_cast<float>(p.head_dim)), 0,
                    d.delta, nullptr);
}

// The whole forward and backward of a small problem against the naive reference.
bool CheckSmall() {
  const Problem p{1, 300, 2, 64};
  std::printf("correctness: B=%lld T=%lld H=%lld D=%lld, all rows\n",
              static_cast<long long>(p.batch), static_cast<long long>(p.seq),
              static_cast<long long>(p.heads), static_cast<long long>(p.head_dim));
  const HostInputs in = MakeInputs(p);
  DeviceBuffers d = Upload(p, in);
  RunForward(p, d);
  RunBackward(p, d);
  PARAPLAN_CUDA_CHECK(cudaDeviceSynchronize());
  const int64_t n = p.batch * p.seq * p.heads * p.head_dim;
  const auto out = DeviceDownload(d.out, n), dq = DeviceDownload(d.dq, n),
             dk = DeviceDownload(d.dk, n), dv = DeviceDownload(d.dv, n);
  std::vector<int64_t> rows(p.seq);
  for (int64_t s = 0; s < p.seq; ++s) rows[s] = s;
  bool ok = true;
  for (int64_t h = 0; h < p.heads; ++h) {
    const Reference r = NaiveAttention(p, in, 0, h, true);
    ok &=
        Check(("out, head " + std::to_string(h)).c_str(), RelativeError(p, out, r.out, 0, h, rows));
    ok &= Check(("dq, head " + std::to_string(h)).c_str(), RelativeError(p, dq, r.dq, 0, h, rows));
    ok &= Check(("dk, head " + std::to_string(h)).c_str(), RelativeError(p, dk, r.dk, 0, h, rows));
    ok &= Check(("dv, head " + std::to_string(h)).c_str(), RelativeError(p, dv, r.dv, 0, h, rows));
  }
  Free(d);
  return ok;
}

float Median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Times each kernel of the forward and backward `repeats` times after 3 warm-up runs (median of
// repeats, CUDA events on the default stream around each launch) and checks sampled forward rows.
bool TimeProblem(const Problem& p, int repeats) {
  const TokenLayout l = Layout(p);
  const HostInputs in = MakeInputs(p);
  DeviceBuffers d = Upload(p, in);
  const AttnShape shape{l, p.heads, p.heads, 1.0f / std::sqrt(static_cast<float>(p.head_dim))};
  if (p.head_dim != 64) throw CudaError("the benchmark times head_dim 64");
  // Launches as the backend's LaunchForward and LaunchBackward do, without their per-call
  // cudaFuncSetAttribute (done once here) between the events.
  using K = void (*)(const Problem&, const DeviceBuffers&, const AttnShape&, dim3);
  const dim3 grid = AttentionGrid(l, p.heads);
  PrepareKernel<64>(AttentionForwardKernel<64>, ForwardSmem<64>::kBytes);
  PrepareKernel<64>(AttentionBackwardKeyValueKernel<64>, BackwardSmem<64>::kBytes);
  PrepareKernel<64>(AttentionBackwardQueryKernel<64>, BackwardSmem<64>::kBytes);
  struct Kernel {
    const char* name;
    double flop;  // matrix-product FLOPs the kernel runs (causal half)
    K launch;
  };
  const double half = 0.5 * static_cast<double>(p.batch) * p.heads * p.seq * p.seq * p.head_dim;
  const Kernel kernels[] = {
      {"AttentionForwardKernel", 4 * half,
       [](const Problem& /*pp*/, const DeviceBuffers& dd, const AttnShape& s, dim3 g) {
         PARAPLAN_LAUNCH(AttentionForwardKernel<64>, g, kAttnThreads, ForwardSmem<64>::kBytes,
                         nullptr, dd.out, dd.lse, dd.q, dd.k, dd.v, s);
       }},
      {"AttentionDeltaKernel", 0.0,
       [](const Problem& pp, const DeviceBuffers& dd, const AttnShape& s, dim3 /*g*/) {
         const int64_t items = pp.seq * pp.batch * pp.heads;
         PARAPLAN_LAUNCH(AttentionDeltaKernel<64>, GridFor(items * kDeltaLanes<64>), kThreads, 0,
                         nullptr, dd.delta, dd.dout, dd.out, s);
       }},
      {"AttentionBackwardKeyValueKernel", 8 * half,
       [](const Problem& /*pp*/, const DeviceBuffers& dd, const AttnShape& s, dim3 g) {
         PARAPLAN_LAUNCH(AttentionBackwardKeyValueKernel<64>, g, kAttnThreads,
                         BackwardSmem<64>::kBytes, nullptr, dd.dk, dd.dv, dd.dout, dd.lse, dd.delta,
                         dd.q, dd.k, dd.v, s);
       }},
      {"AttentionBackwardQueryKernel", 6 * half,
       [](const Problem& /*pp*/, const DeviceBuffers& dd, const AttnShape& s, dim3 g) {
         PARAPLAN_LAUNCH(AttentionBackwardQueryKernel<64>, g, kAttnThreads,
                         BackwardSmem<64>::kBytes, nullptr, dd.dq, dd.dout, dd.lse, dd.delta, dd.q,
                         dd.k, dd.v, s);
       }},
  };
  std::printf("B=%lld T=%lld H=%lld D=%lld causal\n", static_cast<long long>(p.batch),
              static_cast<long long>(p.seq), static_cast<long long>(p.heads),
              static_cast<long long>(p.head_dim));
  cudaEvent_t start, stop;
  PARAPLAN_CUDA_CHECK(cudaEventCreate(&start));
  PARAPLAN_CUDA_CHECK(cudaEventCreate(&stop));
  double backward_ms = 0.0;
  for (const Kernel& k : kernels) {
    std::vector<float> ms;
    for (int rep = 0; rep < 3 + repeats; ++rep) {
      PARAPLAN_CUDA_CHECK(cudaEventRecord(start, nullptr));
      k.launch(p, d, shape, grid);
      PARAPLAN_CUDA_CHECK_LAUNCH();
      PARAPLAN_CUDA_CHECK(cudaEventRecord(stop, nullptr));
      PARAPLAN_CUDA_CHECK(cudaEventSynchronize(stop));
      float t = 0.0f;
      PARAPLAN_CUDA_CHECK(cudaEventElapsedTime(&t, start, stop));
      if (rep >= 3) ms.push_back(t);
    }
    const double med = Median(ms);
    if (k.flop > 0.0) {
      std::printf("  %-34s %8.3f ms %8.1f TFLOP/s\n", k.name, med, k.flop / (med * 1e-3) / 1e12);
    } else {
      std::printf("  %-34s %8.3f ms\n", k.name, med);
    }
    if (std::string(k.name) != "AttentionForwardKernel") backward_ms += med;
  }
  // Backward as usually counted: 2.5 forward's FLOPs (five products, S recomputed once).
  std::printf("  %-34s %8.3f ms %8.1f TFLOP/s (2.5 x forward FLOPs)\n", "backward, all kernels",
              backward_ms, 10 * half / (backward_ms * 1e-3) / 1e12);
  PARAPLAN_CUDA_CHECK(cudaEventDestroy(start));
  PARAPLAN_CUDA_CHECK(cudaEventDestroy(stop));

  // Sampled rows of the timed problem: the first, last and a few in between of sequence 0 and
  // the last sequence, head 0 and the last head (full output of those rows against the host).
  const int64_t n = p.batch * p.seq * p.heads * p.head_dim;
  const auto out = DeviceDownload(d.out, n);
  const std::vector<int64_t> rows = {0, 1, 63, 64, 127, 128, p.seq / 2, p.seq - 1};
  bool ok = true;
  for (int64_t b : {int64_t{0}, p.batch - 1}) {
    for (int64_t h : {int64_t{0}, p.heads - 1}) {
      Problem one = p;
      const Reference r = NaiveAttention(one, in, b, h, false);
      ok &= Check(("out, sampled rows b" + std::to_string(b) + " h" + std::to_string(h)).c_str(),
                  RelativeError(p, out, r.out, b, h, rows));
    }
  }
  Free(d);
  return ok;
}

int Main(int argc, char** argv) {
  int repeats = 20;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--repeats" && i + 1 < argc) {
      repeats = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: paraplan_attention_bench [--repeats N]\n");
      return 2;
    }
  }
  if (repeats < 1) {
    std::fprintf(stderr, "paraplan_attention_bench: --repeats must be at least 1\n");
    return 2;
  }
  if (VisibleDeviceCount() == 0) {
    std::fprintf(stderr,
                 "paraplan_attention_bench: no CUDA GPU is visible (%s); this benchmark "
                 "needs one\n",
                 NoDeviceReason().c_str());
    return 1;
  }
  cudaDeviceProp prop{};
  PARAPLAN_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("GPU: %s\n", prop.name);
  if (!CheckSmall()) {
    std::fprintf(stderr, "paraplan_attention_bench: the kernels disagree with the reference\n");
    return 1;
  }
  bool ok = true;
  for (int64_t seq : {1024, 2048}) {
    for (int64_t heads : {12, 16}) ok &= TimeProblem(Problem{8, seq, heads, 64}, repeats);
  }
  if (!ok) {
    std::fprintf(stderr, "paraplan_attention_bench: the kernels disagree with the reference\n");
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace paraplan::cuda

int main(int argc, char** argv) {
  try {
    return paraplan::cuda::Main(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "paraplan_attention_bench: %s\n", e.what());
    return 1;
  }
}
