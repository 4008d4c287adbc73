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
