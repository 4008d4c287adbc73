// The local (several ranks on one GPU) communicator and a one-rank NCCL world, with inputs
// whose sums are exact in fp32 (nccl-tests' trick), so results must match bit for bit. The GPU
// cases are skipped with a message when no GPU is visible; option parsing runs everywhere. The
// same file also runs on the CPU emulation (comm_cuda_emulated_tests), NCCL case excepted.
#include <cuda_runtime_api.h>
#include <doctest/doctest.h>

#include <cmath>
#include <thread>

#include "runtime/backends/cuda/comm/local_cuda_communicator.h"
#include "runtime/backends/cuda/comm/nccl_communicator.h"
#include "runtime/backends/cuda/kernels/cuda_check.h"

namespace paraplan::comm {
namespace {

bool GpuOrSkip() {
  const std::string why = cuda::NoDeviceReason();
  if (!why.empty()) {
    MESSAGE("skipped: " << why << " (this test needs a GPU)");
    return false;
  }
  return true;
}

TEST_CASE("nccl world options from the environment") {
  auto o = NcclWorldOptionsFromEnvironment(launch::MapEnvironment(
      {{"PARAPLAN_NCCL_TIMEOUT", "30"}, {"PARAPLAN_RENDEZVOUS_TIMEOUT", "12"}}));
  CHECK(o.timeout_seconds == 30.0);
  CHECK(o.rendezvous_timeout_seconds == 12.0);
  auto d = NcclWorldOptionsFromEnvironment(launch::MapEnvironment({}));
  CHECK(d.timeout_seconds == 600.0);
  CHECK_THROWS_WITH(
      NcclWorldOptionsFromEnvironment(launch::MapEnvironment({{"PARAPLAN_NCCL_TIMEOUT", "ten"}})),
      doctest::Contains("`PARAPLAN_NCCL_TIMEOUT` is `ten`"));
  CHECK_THROWS_WITH(
      NcclWorldOptionsFromEnvironment(launch::MapEnvironment({{"PARAPLAN_NCCL_TIMEOUT", "0"}})),
      doctest::Contains("must be between 1"));
}

// Runs `body(rank, comm, stream)` on `n` threads sharing one local world on device 0.
template <typename Body>
void RunLocal(int n, Body body, double timeout = 60.0) {
  std::vector<cudaStream_t> streams(n);
  for (auto& s : streams) PARAPLAN_CUDA_CHECK(cudaStreamCreate(&s));
  {
    LocalCudaWorld world(streams, timeout);
    std::vector<int> members(n);
    for (int r = 0; r < n; ++r) members[r] = r;
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r) {
      threads.emplace_back([&, r] {
        cudaSetDevice(0);
        auto comm = world.Join(members, r);
        body(r, *comm, streams[r]);
      });
    }
    for (auto& t : threads) t.join();
  }
  for (auto& s : streams) cudaStreamDestroy(s);
}

std::vector<float> Download(const float* d, int64_t n, cudaStream_t s) {
  std::vector<float> h(n);
  PARAPLAN_CUDA_CHECK(cudaMemcpyAsync(h.data(), d, n * 4, cudaMemcpyDeviceToHost, s));
  PARAPLAN_CUDA_CHECK(cudaStreamSynchronize(s));
  return h;
}

float* Upload(const std::vector<float>& h, cudaStream_t s) {
  float* d = nullptr;
  PARAPLAN_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&d), h.size() * 4));
  PARAPLAN_CUDA_CHECK(cudaMemcpyAsync(d, h.data(), h.size() * 4, cudaMemcpyHostToDevice, s));
  return d;
}

TEST_CASE("local CUDA collectives: exact results on one GPU") {
  if (!GpuOrSkip()) return;
  constexpr int kRanks = 3;
  constexpr int64_t kCount = 1000;
  std::vector<std::string> failures(kRanks);
  RunLocal(kRanks, [&](int r, Communicator& comm, cudaStream_t s) {
    std::vector<float> mine(kRanks * kCount);
    for (int64_t i = 0; i < kRanks * kCount; ++i) mine[i] = static_cast<float>((r + 1) * (i % 7));
    float* buf = Upload(mine, s);
    float* out = Upload(std::vector<float>(kRanks * kCount, -1.0f), s);
    comm.AllReduce(buf, buf, kRanks * kCount, DType::kF32);  // in place
    auto all = Download(buf, kRanks * kCount, s);
    for (int64_t i = 0; i < kRanks * kCount; ++i) {
      if (all[i] != 6.0f * (i % 7)) failures[r] += "all_reduce ";
    }
    std::vector<float> peaks(kCount);
    for (int64_t i = 0; i < kCount; ++i) peaks[i] = static_cast<float>((i + r) % kRanks) - 0.5f * r;
    float* peak = Upload(peaks, s);
    comm.AllReduce(peak, peak, kCount, DType::kF32, ReduceOp::kMax);
    auto maxed = Download(peak, kCount, s);
    for (int64_t i = 0; i < kCount; ++i) {
      float want = -INFINITY;
      for (int q = 0; q < kRanks; ++q)
        want = std::max(want, static_cast<float>((i + q) % kRanks) - 0.5f * q);
      if (maxed[i] != want) failures[r] += "all_reduce_max ";
    }
    cudaFree(peak);
    comm.ReduceScatter(buf, out, kCount, DType::kF32);
    auto part = Download(out, kCount, s);
    for (int64_t i = 0; i < kCount; ++i) {
      if (part[i] != 3.0f * 6.0f * ((r * kCount + i) % 7)) failures[r] += "reduce_scatter ";
    }
    comm.AllGather(out, buf, kCount, DType::kF32);
    auto gathered = Download(buf, kRanks * kCount, s);
    for (int64_t i = 0; i < kRanks * kCount; ++i) {
      if (gathered[i] != 18.0f * (i % 7)) failures[r] += "all_gather ";
    }
    std::vector<float> root_value(kCount, static_cast<float>(r));
    float* b = Upload(root_value, s);
    comm.Broadcast(b, kCount, DType::kF32, 1);
    if (Download(b, kCount, s)[kCount - 1] != 1.0f) failures[r] += "broadcast ";
    // Variable counts: rank q sends (q + p) % 3 elements to peer p, each naming q, p and i.
    {
      auto count = [](int q, int p) { return static_cast<int64_t>((q + p) % 3); };
      std::vector<int64_t> sends(kRanks), recvs(kRanks);
      std::vector<float> pieces;
      int64_t expected = 0;
      for (int p = 0; p < kRanks; ++p) {
        sends[p] = count(r, p);
        recvs[p] = count(p, r);
        expected += recvs[p];
        for (int64_t i = 0; i < sends[p]; ++i)
          pieces.push_back(static_cast<float>(100 * r + 10 * p + i));
      }
      float* v_send = Upload(pieces, s);
      float* v_recv = Upload(std::vector<float>(std::max<int64_t>(expected, 1), -1.0f), s);
      comm.AllToAllV(v_send, sends.data(), v_recv, recvs.data(), DType::kF32);
      const auto v = Download(v_recv, std::max<int64_t>(expected, 1), s);
      int64_t at = 0;
      for (int q = 0; q < kRanks; ++q)
        for (int64_t i = 0; i < count(q, r); ++i)
          if (v[at++] != static_cast<float>(100 * q + 10 * r + i)) failures[r] += "all_to_all_v ";
      cudaFree(v_send);
      cudaFree(v_recv);
    }
    // Ring of point-to-point messages.
    float* msg = Upload(std::vector<float>(4, static_cast<float>(10 * r)), s);
    float* got = Upload(std::vector<float>(4, 0.0f), s);
    comm.Send(msg, 4, DType::kF32, (r + 1) % kRanks);
    comm.Recv(got, 4, DType::kF32, (r + kRanks - 1) % kRanks);
    if (Download(got, 4, s)[3] != 10.0f * ((r + kRanks - 1) % kRanks)) failures[r] += "send_recv ";
    comm.Barrier();
    cudaFree(buf);
    cudaFree(out);
    cudaFree(b);
    cudaFree(msg);
    cudaFree(got);
  });
  for (int r = 0; r < kRanks; ++r)
    CHECK_MESSAGE(failures[r].empty(), "rank " << r << ": " << failures[r]);
}

TEST_CASE("local CUDA collectives: a missing rank times out on every member, a mismatch fails") {
  if (!GpuOrSkip()) return;
  std::vector<std::string> errors(3);
  RunLocal(
      3,
      [&](int r, Communicator& comm, cudaStream_t s) {
        if (r == 2) return;  // never arrives
        float* x = Upload({1.0f}, s);
        try {
          comm.AllReduce(x, x, 1, DType::kF32);
        } catch (const CommError& e) {
          errors[r] = e.what();
        }
        cudaFree(x);
      },
      /*timeout=*/0.5);
  CHECK(errors[0].find("a member never arrived") != std::string::npos);
  CHECK(!errors[1].empty());

  std::vector<std::string> mismatch(2);
  RunLocal(2, [&](int r, Communicator& comm, cudaStream_t s) {
    float* x = Upload({1.0f, 2.0f}, s);
    try {
      comm.AllReduce(x, x, r == 0 ? 1 : 2, DType::kF32);
    } catch (const CommError& e) {
      mismatch[r] = e.what();
    }
    cudaFree(x);
  });
  CHECK(mismatch[0].find("collective mismatch") != std::string::npos);
  CHECK(mismatch[1].find("collective mismatch") != std::string::npos);
}

TEST_CASE("a one-rank NCCL world runs collectives and aborts cleanly") {
  if (!GpuOrSkip()) return;
#ifdef PARAPLAN_CUDA_EMULATION
  MESSAGE("skipped: NCCL itself is not emulated (it needs a GPU and its driver)");
  return;
#endif
  cudaStream_t s;
  PARAPLAN_CUDA_CHECK(cudaStreamCreate(&s));
  launch::LaunchEnvironment env;  // rank 0 of 1
  auto world = NcclWorld::Create(env, s, 1, NcclWorldOptions{});
  world->CreateGroups({{2, {0}}});  // a one-member tp group needs no NCCL communicator
  auto comm = world->Join({0}, 0, 0);
  float* x = Upload({1.0f, 2.0f}, s);
  comm->AllReduce(x, x, 2, DType::kF32);
  CHECK(Download(x, 2, s)[1] == 2.0f);
  world->Abort("test abort");
  CHECK_THROWS_WITH(comm->AllReduce(x, x, 2, DType::kF32), doctest::Contains("test abort"));
  cudaFree(x);
  world.reset();
  cudaStreamDestroy(s);
}

}  // namespace
}  // namespace paraplan::comm
