// The host backend: fp32 reference kernels on the CPU, one Backend per rank thread, and the
// in-process communicator world the rank threads share.
//
// Made by: planrun (--backend=host, the default) and tests. Read by: the interpreter.
#ifndef PARAPLAN_RUNTIME_BACKENDS_HOST_HOST_BACKEND_H_
#define PARAPLAN_RUNTIME_BACKENDS_HOST_HOST_BACKEND_H_

#include <memory>

#include "runtime/backends/host/comm/host_communicator.h"
#include "runtime/exec/backend.h"

namespace paraplan::exec {

std::unique_ptr<Backend> MakeHostBackend();

// A CommWorld over HostWorld: all ranks are threads of this process.
class HostCommWorld final : public CommWorld {
 public:
  explicit HostCommWorld(int size, comm::HostWorldOptions options = {}) : world_(size, options) {}
  int Size() const override { return world_.Size(); }
  std::unique_ptr<comm::Communicator> Join(const std::vector<int>& members, int world_rank,
                                           int tag) override {
    return world_.Join(members, world_rank, tag);
  }
  void Abort(const std::string& reason) override { world_.Abort(reason); }
  comm::HostWorld& world() { return world_; }

 private:
  comm::HostWorld world_;
};

}  // namespace paraplan::exec

#endif  // PARAPLAN_RUNTIME_BACKENDS_HOST_HOST_BACKEND_H_
