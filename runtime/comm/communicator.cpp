#include "runtime/comm/communicator.h"

namespace paraplan::comm {

int64_t DTypeBytes(DType dtype) { return dtype == DType::kBF16 ? 2 : 4; }
const char* DTypeName(DType dtype) { return dtype == DType::kBF16 ? "bf16" : "f32"; }
const char* CollectiveKindName(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::kAllReduce:
      return "all_reduce";
    case CollectiveKind::kReduceScatter:
      return "reduce_scatter";
    case CollectiveKind::kAllGather:
      return "all_gather";
    case CollectiveKind::kBroadcast:
      return "broadcast";
    case CollectiveKind::kAllToAll:
      return "all_to_all";
    case CollectiveKind::kBarrier:
      return "barrier";
    case CollectiveKind::kAllToAllV:
      return "all_to_all_v";
  }
  return "?";
}
const char* ReduceOpName(ReduceOp op) { return op == ReduceOp::kMax ? "max" : "sum"; }

}  // namespace paraplan::comm
