// The CUDA emulation itself: the built-ins behave as CUDA documents them, threads really
// synchronise, and each check of what hardware would punish fires on a small broken kernel.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <doctest/doctest.h>
#include <mma.h>

#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "runtime/backends/cuda/kernels/launch.cuh"

namespace paraplan::cuda {
namespace {

template <typename T>
struct DeviceBuffer {
  T* ptr = nullptr;
  int64_t n = 0;
  explicit DeviceBuffer(int64_t count, T init = T{}) : n(count) {
    REQUIRE(cudaMalloc(reinterpret_cast<void**>(&ptr), n * sizeof(T)) == cudaSuccess);
    std::vector<T> h(n, init);
    REQUIRE(cudaMemcpy(ptr, h.data(), n * sizeof(T), cudaMemcpyHostToDevice) == cudaSuccess);
  }
  ~DeviceBuffer() { cudaFree(ptr); }
  std::vector<T> Get() const {
    std::vector<T> h(n);
    REQUIRE(cudaMemcpy(h.data(), ptr, n * sizeof(T), cudaMemcpyDeviceToHost) == cudaSuccess);
    return h;
  }
};

// Waits for the legacy stream; "" or the fault's message, after which the device is usable again.
std::string Finish() {
  const cudaError_t launch = cudaGetLastError();
  const cudaError_t sync = cudaDeviceSynchronize();
  const cudaError_t e = launch != cudaSuccess ? launch : sync;
  if (e == cudaSuccess) return "";
  std::string what = cudaGetErrorString(e);
  cudaDeviceReset();
  return what;
}

// ---- Built-ins ----------------------------------------------------------------------------------

__global__ void CoordinatesKernel(int* out) {
  const int block = (blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;
  const int thread = (threadIdx.z * blockDim.y + threadIdx.y) * blockDim.x + threadIdx.x;
  out[block * blockDim.x * blockDim.y * blockDim.z + thread] = block * 1000 + thread;
}

TEST_CASE("grids and blocks in three dimensions") {
  DeviceBuffer<int> out(size_t{2} * 3 * 2 * 4 * 2 * 3, -1);
  PARAPLAN_LAUNCH(CoordinatesKernel, dim3(2, 3, 2), dim3(4, 2, 3), 0, nullptr, out.ptr);
  REQUIRE(Finish() == "");
  const auto h = out.Get();
  for (int i = 0; i < static_cast<int>(h.size()); ++i) CHECK(h[i] == (i / 24) * 1000 + i % 24);
}

__global__ void RotateKernel(int* out, int base, bool sync) {
  __shared__ SharedArray<int, 64> s;
  s[threadIdx.x] = base + static_cast<int>(threadIdx.x) * 10;
  if (sync) __syncthreads();
  out[threadIdx.x] = s[(threadIdx.x + 1) % 64];
}

TEST_CASE("__syncthreads orders shared memory; without it a thread reads what is not written yet") {
  DeviceBuffer<int> out(64);
  PARAPLAN_LAUNCH(RotateKernel, 1, 64, 0, nullptr, out.ptr, 0, true);
  REQUIRE(Finish() == "");
  auto h = out.Get();
  for (int t = 0; t < 64; ++t) CHECK(h[t] == ((t + 1) % 64) * 10);
  // Threads run until they block, so the race is visible and deterministic: thread t reads
  // s[t + 1] before thread t + 1 has run, and sees the previous launch's value (a GPU's shared
  // memory is not cleared between blocks either); only thread 63 reads what thread 0 wrote.
  PARAPLAN_LAUNCH(RotateKernel, 1, 64, 0, nullptr, out.ptr, 1000, false);
  REQUIRE(Finish() == "");
  h = out.Get();
  for (int t = 0; t < 63; ++t) CHECK(h[t] == (t + 1) * 10);
  CHECK(h[63] == 1000);
}

__global__ void WarpKernel(float* sums, int* idx, unsigned* votes, int* block_votes) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  float v = static_cast<float>(threadIdx.x);
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  sums[threadIdx.x] = v;
  int x = static_cast<int>(threadIdx.x);
  idx[4 * threadIdx.x + 0] = __shfl_sync(0xffffffffu, x, 5);
  idx[4 * threadIdx.x + 1] = __shfl_down_sync(0xffffffffu, x, 3);
  idx[4 * threadIdx.x + 2] = __shfl_up_sync(0xffffffffu, x, 2);
  idx[4 * threadIdx.x + 3] = __shfl_xor_sync(0xffffffffu, x, 1, 8);
  const unsigned ballot = __ballot_sync(0xffffffffu, lane % 3 == 0);
  const int all = __all_sync(0xffffffffu, lane < 32);
  const int any = __any_sync(0xffffffffu, lane == 7 && warp == 1);
  if (lane == 0) {
    votes[size_t{3} * warp] = ballot;
    votes[3 * warp + 1] = all;
    votes[3 * warp + 2] = any;
  }
  // Half the warp: a partial mask is fine when only those lanes take part.
  if (lane < 16) {
    const int y = __shfl_xor_sync(0x0000ffffu, x, 8);
    idx[4 * threadIdx.x + 3] += 1000 * (y - x);
  }
  const int n = __syncthreads_count(threadIdx.x % 5 == 0);
  const int o = __syncthreads_or(threadIdx.x == 63);
  const int a = __syncthreads_and(threadIdx.x < 1000);
  if (threadIdx.x == 0) {
    block_votes[0] = n;
    block_votes[1] = o;
    block_votes[2] = a;
  }
}

TEST_CASE("warp shuffles and votes, block votes") {
  DeviceBuffer<float> sums(64);
  DeviceBuffer<int> idx(256), bv(3);
  DeviceBuffer<unsigned> votes(6);
  PARAPLAN_LAUNCH(WarpKernel, 1, 64, 0, nullptr, sums.ptr, idx.ptr, votes.ptr, bv.ptr);
  REQUIRE(Finish() == "");
  const auto s = sums.Get();
  CHECK(s[0] == 496.0f);    // 0 + ... + 31
  CHECK(s[40] == 1520.0f);  // 32 + ... + 63
  const auto i = idx.Get();
  for (int t = 0; t < 64; ++t) {
    const int lane = t % 32, base = t - lane;
    CHECK(i[size_t{4} * t] == base + 5);
    CHECK(i[4 * t + 1] == (lane + 3 < 32 ? t + 3 : t));  // past the end: the lane's own value
    CHECK(i[4 * t + 2] == (lane >= 2 ? t - 2 : t));
    const int xor8 = (lane / 8 * 8) + ((lane % 8) ^ 1) + base;  // width 8 segments
    CHECK(i[4 * t + 3] == xor8 + (lane < 16 ? 1000 * ((t ^ 8) - t) : 0));
  }
  const auto v = votes.Get();
  unsigned every_third = 0;
  for (int l = 0; l < 32; l += 3) every_third |= 1u << l;
  CHECK(v[0] == every_third);
  CHECK(v[1] == 1u);
  CHECK(v[2] == 0u);
  CHECK(v[5] == 1u);
  const auto b = bv.Get();
  CHECK(b[0] == 13);
  CHECK(b[1] == 1);
  CHECK(b[2] == 1);
}

__global__ void AtomicKernel(int* count, float* sum, unsigned* maximum) {
  atomicAdd(count, 1);
  atomicAdd(sum, 0.5f);
  atomicMax(maximum, blockIdx.x * blockDim.x + threadIdx.x);
}

TEST_CASE("atomics from every thread of every block") {
  DeviceBuffer<int> count(1);
  DeviceBuffer<float> sum(1);
  DeviceBuffer<unsigned> maximum(1);
  PARAPLAN_LAUNCH(AtomicKernel, 7, 96, 0, nullptr, count.ptr, sum.ptr, maximum.ptr);
  REQUIRE(Finish() == "");
  CHECK(count.Get()[0] == 672);
  CHECK(sum.Get()[0] == 336.0f);
  CHECK(maximum.Get()[0] == 671u);
}

using namespace nvcuda;

// C = A · B (+ C) for one 16×16×16 tile; B column-major when `bt`.
__global__ void WmmaKernel(float* c, const __nv_bfloat16* a, const __nv_bfloat16* b, bool bt) {
  PARAPLAN_DYNAMIC_SHARED(smem);
  auto* as = reinterpret_cast<__nv_bfloat16*>(smem);
  auto* bs = as + ptrdiff_t{16} * 24;
  for (int i = threadIdx.x; i < 256; i += blockDim.x) {
    as[i / 16 * 24 + i % 16] = a[i];
    bs[i / 16 * 24 + i % 16] = b[i];
  }
  __syncthreads();
  wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
  wmma::load_matrix_sync(fa, as, 24);
  wmma::load_matrix_sync(acc, c, 16, wmma::mem_row_major);
  if (bt) {
    wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> fb;
    wmma::load_matrix_sync(fb, bs, 24);
    wmma::mma_sync(acc, fa, fb, acc);
  } else {
    wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> fb;
    wmma::load_matrix_sync(fb, bs, 24);
    wmma::mma_sync(acc, fa, fb, acc);
  }
  wmma::store_matrix_sync(c, acc, 16, wmma::mem_row_major);
}

TEST_CASE("WMMA: bf16 tiles, row- and column-major B, fp32 accumulation") {
  std::vector<__nv_bfloat16> a(256), b(256);
  std::vector<float> af(256), bf(256), c0(256);
  for (int i = 0; i < 256; ++i) {
    a[i] = __float2bfloat16_rn(std::sin(0.37f * i));
    b[i] = __float2bfloat16_rn(std::cos(0.11f * i) * 3.0f);
    af[i] = __bfloat162float(a[i]);
    bf[i] = __bfloat162float(b[i]);
    c0[i] = 0.25f * (i % 7);
  }
  for (bool bt : {false, true}) {
    DeviceBuffer<__nv_bfloat16> da(256), db(256);
    DeviceBuffer<float> dc(256);
    cudaMemcpy(da.ptr, a.data(), 512, cudaMemcpyHostToDevice);
    cudaMemcpy(db.ptr, b.data(), 512, cudaMemcpyHostToDevice);
    cudaMemcpy(dc.ptr, c0.data(), 1024, cudaMemcpyHostToDevice);
    PARAPLAN_LAUNCH(WmmaKernel, 1, 32, size_t{2} * 16 * 24 * 2, nullptr, dc.ptr, da.ptr, db.ptr,
                    bt);
    REQUIRE(Finish() == "");
    const auto c = dc.Get();
    double worst = 0;
    for (int r = 0; r < 16; ++r) {
      for (int col = 0; col < 16; ++col) {
        double want = c0[r * 16 + col];
        for (int k = 0; k < 16; ++k)
          want += static_cast<double>(af[r * 16 + k]) * (bt ? bf[col * 16 + k] : bf[k * 16 + col]);
        worst = std::max(worst, std::abs(want - c[r * 16 + col]));
      }
    }
    CHECK(worst < 1e-5);
  }
}

TEST_CASE("bf16 conversions round to nearest even, as CUDA does") {
  CHECK(__float2bfloat16_rn(1.0f).__x == 0x3f80);
  CHECK(__float2bfloat16_rn(1.00390625f).__x == 0x3f80);  // halfway, 0x3f80 is even
  CHECK(__float2bfloat16_rn(1.01171875f).__x == 0x3f82);  // halfway, rounds up to even
  CHECK(__float2bfloat16_rn(std::nextafter(1.00390625f, 2.0f)).__x ==
        0x3f81);  // just above halfway
  CHECK(__float2bfloat16_rn(-2.5f).__x == 0xc020);
  CHECK(__float2bfloat16_rn(INFINITY).__x == 0x7f80);
  CHECK(__float2bfloat16_rn(3.4e38f).__x == 0x7f80);  // overflows to infinity
  CHECK(__float2bfloat16_rn(NAN).__x == 0x7fff);
  CHECK(__bfloat162float(__float2bfloat16_rn(0.1f)) == 0.10009765625f);
  const __nv_bfloat162 pair = __floats2bfloat162_rn(1.0f, -1.0f);
  CHECK(pair.x.__x == 0x3f80);
  CHECK(pair.y.__x == 0xbf80);
}

// ---- Streams
// --------------------------------------------------------------------------------------

__global__ void FillValueKernel(float* x, int n, float v) {
  for (int i = threadIdx.x; i < n; i += blockDim.x) x[i] = v;
}

TEST_CASE("streams run in order, lazily; events order work across streams") {
  cudaStream_t a, b;
  REQUIRE(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking) == cudaSuccess);
  REQUIRE(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking) == cudaSuccess);
  cudaEvent_t e;
  REQUIRE(cudaEventCreateWithFlags(&e, cudaEventDisableTiming) == cudaSuccess);
  DeviceBuffer<float> x(100), y(100);
  PARAPLAN_LAUNCH(FillValueKernel, 1, 64, 0, a, x.ptr, 100, 3.0f);
  cudaEventRecord(e, a);
  cudaStreamWaitEvent(b, e, 0);
  cudaMemcpyAsync(y.ptr, x.ptr, 400, cudaMemcpyDeviceToDevice, b);
  REQUIRE(cudaStreamSynchronize(b) == cudaSuccess);
  CHECK(y.Get()[99] == 3.0f);
  // Without the wait, b's copy may run before a's kernel: the emulation runs a stream's work
  // only when something waits for it, so the copy sees the old values.
  PARAPLAN_LAUNCH(FillValueKernel, 1, 64, 0, a, x.ptr, 100, 5.0f);
  cudaMemcpyAsync(y.ptr, x.ptr, 400, cudaMemcpyDeviceToDevice, b);
  REQUIRE(cudaStreamSynchronize(b) == cudaSuccess);
  CHECK(y.Get()[99] == 3.0f);
  REQUIRE(cudaStreamSynchronize(a) == cudaSuccess);
  CHECK(x.Get()[99] == 5.0f);
  cudaEventDestroy(e);
  cudaStreamDestroy(a);
  cudaStreamDestroy(b);
}

TEST_CASE("memory calls check their pointers") {
  float host[4] = {};
  CHECK(cudaMemsetAsync(host, 0, 16, nullptr) == cudaErrorInvalidValue);
  CHECK(std::string(cudaGetErrorString(cudaErrorInvalidValue))
            .find("not inside one device allocation") != std::string::npos);
  DeviceBuffer<float> x(4);
  CHECK(cudaMemcpy(x.ptr, host, 20, cudaMemcpyHostToDevice) ==
        cudaErrorInvalidValue);  // one float too many
  CHECK(cudaFree(host) == cudaErrorInvalidValue);
  cudaGetLastError();
}

// ---- Detections
// -----------------------------------------------------------------------------------

__global__ void EarlyExitBarrierKernel(float* out) {
  if (threadIdx.x >= 40) return;  // a whole warp and a half leave before the barrier
  __syncthreads();
  out[threadIdx.x] = 1.0f;
}

__global__ void TwoBarriersKernel(float* out) {
  // Two barriers that look alike but are distinct: the fault under test.
  if (threadIdx.x < 32) {  // NOLINT(bugprone-branch-clone)
    __syncthreads();
  } else {
    __syncthreads();
  }
  out[threadIdx.x] = 1.0f;
}

TEST_CASE("detects a __syncthreads that not every thread of the block reaches") {
  DeviceBuffer<float> out(64);
  PARAPLAN_LAUNCH(EarlyExitBarrierKernel, 2, 64, 0, nullptr, out.ptr);
  const std::string what = Finish();
  INFO(what);
  CHECK(what.find("EarlyExitBarrierKernel") != std::string::npos);
  CHECK(what.find("block (0,0,0)") != std::string::npos);
  CHECK(what.find("__syncthreads") != std::string::npos);
  CHECK(what.find("not reached by every thread") != std::string::npos);

  PARAPLAN_LAUNCH(TwoBarriersKernel, 1, 64, 0, nullptr, out.ptr);
  const std::string two = Finish();
  INFO(two);
  CHECK(two.find("different barriers") != std::string::npos);
  // After a reset the device works again.
  PARAPLAN_LAUNCH(FillValueKernel, 1, 32, 0, nullptr, out.ptr, 64, 2.0f);
  CHECK(Finish() == "");
}

__global__ void SharedOverrunKernel(float* out) {
  __shared__ SharedArray<float, 8, 32> tile;
  tile[threadIdx.x / 32][threadIdx.x % 32] = 1.0f;  // 288 threads: row 8 does not exist
  __syncthreads();
  out[threadIdx.x] = tile[0][threadIdx.x % 32];
}

__global__ void DynamicSharedOverrunKernel(float* out) {
  PARAPLAN_DYNAMIC_SHARED(smem);
  // A tile that starts 16 rows before the end of 64 rows of 16 floats but spans 32 rows.
  auto* tile = reinterpret_cast<float*>(smem) + ptrdiff_t{48} * 16;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
  wmma::fill_fragment(acc, 1.0f);
  wmma::store_matrix_sync(tile, acc, 32, wmma::mem_row_major);
  out[threadIdx.x] = tile[0];
}

__global__ void RawSharedOverrunKernel(float* out, int index) {
  PARAPLAN_DYNAMIC_SHARED(smem);
  auto* s = reinterpret_cast<float*>(smem);
  s[threadIdx.x] = 1.0f;
  __syncthreads();
  out[threadIdx.x] = s[threadIdx.x == 5 ? index : 0];  // thread 5 reads `index`
}

TEST_CASE("detects out-of-bounds shared memory") {
  DeviceBuffer<float> out(288);
  PARAPLAN_LAUNCH(SharedOverrunKernel, 1, 288, 0, nullptr, out.ptr);
  std::string what = Finish();
  INFO(what);
  CHECK(what.find("SharedOverrunKernel") != std::string::npos);
  CHECK(what.find("thread (256,0,0)") != std::string::npos);
  CHECK(what.find("shared array index 8 is out of bounds [0, 8)") != std::string::npos);

  PARAPLAN_LAUNCH(DynamicSharedOverrunKernel, 1, 32, size_t{64} * 16 * 4, nullptr, out.ptr);
  what = Finish();
  INFO(what);
  CHECK(what.find("wmma::store_matrix_sync") != std::string::npos);
  CHECK(what.find("dynamic shared memory, which has 4096 bytes") != std::string::npos);

  // A plain read one element past the end (and one far past it) faults in the guard pages.
  for (int index : {1024, 5000}) {
    PARAPLAN_LAUNCH(RawSharedOverrunKernel, 1, 64, 4096, nullptr, out.ptr, index);
    what = Finish();
    INFO(what);
    CHECK(what.find("RawSharedOverrunKernel") != std::string::npos);
    CHECK(what.find("thread (5,0,0): access at byte " + std::to_string(4 * index)) !=
          std::string::npos);
    CHECK(what.find("which has 4096 bytes (out of bounds)") != std::string::npos);
  }
  PARAPLAN_LAUNCH(RawSharedOverrunKernel, 1, 64, 4096, nullptr, out.ptr, 1023);
  CHECK(Finish() == "");
}

__global__ void InactiveLaneShuffleKernel(float* out) {
  if (threadIdx.x % 32 >= 24) return;  // lanes 24..31 have exited
  float v = static_cast<float>(threadIdx.x);
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  out[threadIdx.x] = v;
}

__global__ void DivergentShuffleKernel(float* out) {
  float v = 1.0f;
  if (threadIdx.x % 2 == 0) v = __shfl_xor_sync(0xffffffffu, v, 1);  // odd lanes never come
  __syncthreads();
  out[threadIdx.x] = v;
}

__global__ void MaskWithoutCallerKernel(float* out) {
  out[threadIdx.x] = __shfl_sync(0x0000ffffu, 1.0f, 0);  // lanes 16..31 are not in their own mask
}

TEST_CASE("detects a warp shuffle whose mask names inactive lanes") {
  DeviceBuffer<float> out(64);
  PARAPLAN_LAUNCH(InactiveLaneShuffleKernel, 1, 64, 0, nullptr, out.ptr);
  std::string what = Finish();
  INFO(what);
  CHECK(what.find("InactiveLaneShuffleKernel") != std::string::npos);
  CHECK(what.find("__shfl_xor_sync") != std::string::npos);
  CHECK(what.find("mask 0xffffffff") != std::string::npos);
  CHECK(what.find("the mask names a lane that is inactive there") != std::string::npos);

  PARAPLAN_LAUNCH(DivergentShuffleKernel, 1, 32, 0, nullptr, out.ptr);
  what = Finish();
  INFO(what);
  CHECK(what.find("reached __syncthreads") != std::string::npos);
  CHECK(what.find("inactive") != std::string::npos);

  PARAPLAN_LAUNCH(MaskWithoutCallerKernel, 1, 32, 0, nullptr, out.ptr);
  what = Finish();
  INFO(what);
  CHECK(what.find("does not include the calling lane 16") != std::string::npos);
}

__global__ void BigSharedKernel(float* out) {
  PARAPLAN_DYNAMIC_SHARED(smem);
  out[threadIdx.x] = static_cast<float>(smem[0] != 0);
}

TEST_CASE("launch limits: block size and dynamic shared memory beyond 48 KiB without opting in") {
  DeviceBuffer<float> out(32);
  PARAPLAN_LAUNCH(FillValueKernel, 1, 2048, 0, nullptr, out.ptr, 32, 1.0f);
  std::string what = Finish();
  CHECK(what.find("cudaErrorInvalidConfiguration") != std::string::npos);
  PARAPLAN_LAUNCH(BigSharedKernel, 1, 32, size_t{64} * 1024, nullptr, out.ptr);
  what = Finish();
  CHECK(what.find("65536 bytes of dynamic shared memory") != std::string::npos);
  REQUIRE(cudaFuncSetAttribute(BigSharedKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               64 * 1024) == cudaSuccess);
  PARAPLAN_LAUNCH(BigSharedKernel, 1, 32, size_t{64} * 1024, nullptr, out.ptr);
  CHECK(Finish() == "");
  CHECK(cudaFuncSetAttribute(BigSharedKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             300 * 1024) == cudaErrorInvalidValue);
  cudaGetLastError();
}

}  // namespace
}  // namespace paraplan::cuda
