#include "runtime/backends/host/host_backend.h"

#include <doctest/doctest.h>

#include <thread>
#include <vector>

using namespace paraplan::exec;

TEST_CASE("host backend: memory accounting and kernels through the interface") {
  auto be = MakeHostBackend();
  CHECK(std::string(be->Name()) == "host");
  float* x = static_cast<float*>(be->Allocate(4 * sizeof(float)));
  CHECK(be->BytesInUse() == 16);
  CHECK(x[0] == 0.0f);  // zero-filled
  float host[4] = {1, 2, 3, 4};
  be->CopyToDevice(x, host, sizeof host);
  CHECK(be->SumOfSquares(x, 4) == 30.0);
  float* y = static_cast<float*>(be->Allocate(sizeof(float)));
  be->Free(x);
  be->Free(y);
  CHECK(be->BytesInUse() == 0);
  CHECK(be->PeakBytes() == 20);
}

TEST_CASE("host backend: the elementwise kernels of Fill, Copy, Add, AddBias and the reductions") {
  auto be = MakeHostBackend();
  const int64_t n = 37;  // not a multiple of any vector width
  float* a = static_cast<float*>(be->Allocate(n * sizeof(float)));
  float* b = static_cast<float*>(be->Allocate(n * sizeof(float)));
  float* y = static_cast<float*>(be->Allocate(n * sizeof(float)));
  std::vector<float> ha(n), hb(n), got(n);
  for (int64_t i = 0; i < n; ++i) {
    ha[i] = 0.25f * static_cast<float>(i) - 3.0f;
    hb[i] = 1.5f - 0.125f * static_cast<float>(i);
  }
  be->CopyToDevice(a, ha.data(), n * 4);
  be->CopyToDevice(b, hb.data(), n * 4);
  be->Fill(y, n, 2.5f);
  be->CopyToHost(got.data(), y, n * 4);
  for (int64_t i = 0; i < n; ++i) CHECK(got[i] == 2.5f);
  be->Copy(y, a, n);
  be->CopyToHost(got.data(), y, n * 4);
  CHECK(got == ha);
  be->Add(y, a, b, n);  // y = a + b
  be->CopyToHost(got.data(), y, n * 4);
  for (int64_t i = 0; i < n; ++i) CHECK(got[i] == ha[i] + hb[i]);
  be->Accumulate(y, b, n);  // y += b
  be->CopyToHost(got.data(), y, n * 4);
  for (int64_t i = 0; i < n; ++i) CHECK(got[i] == (ha[i] + hb[i]) + hb[i]);
  be->Scale(y, n, 0.5f);
  be->CopyToHost(got.data(), y, n * 4);
  for (int64_t i = 0; i < n; ++i) CHECK(got[i] == 0.5f * ((ha[i] + hb[i]) + hb[i]));
  be->Free(a);
  be->Free(b);
  be->Free(y);
}

TEST_CASE("host comm world: ranks as threads share one world") {
  HostCommWorld world(2);
  std::vector<float> result(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      auto comm = world.Join({0, 1}, r, 0);
      float v = static_cast<float>(r + 1);
      comm->AllReduce(&v, &v, 1, paraplan::comm::DType::kF32);
      result[r] = v;
    });
  }
  for (auto& t : threads) t.join();
  CHECK(result[0] == 3.0f);
  CHECK(result[1] == 3.0f);
}
