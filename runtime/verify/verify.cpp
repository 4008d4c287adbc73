// Whole-world verification (see verify.h).
#include "runtime/verify/verify.h"

#include <fmt/format.h>

#include <string>
#include <vector>

#include "runtime/format/ops.h"
#include "runtime/format/program_model.h"
#include "runtime/verify/verify_stream.h"
#include "runtime/verify/verify_world.h"

namespace paraplan::verify {

std::string DescribeOp(const Op& op) {
  switch (op.kind) {
    case OpKind::Forward:
    case OpKind::Backward:
    case OpKind::SendActivation:
    case OpKind::RecvActivation:
    case OpKind::SendGrad:
    case OpKind::RecvGrad:
      return detail::DescribeStep(detail::ViewOf(op));  // the schedule ops' words, one place
    default:
      if (op.kind == OpKind::AllReduce || op.kind == OpKind::ReduceScatter) {
        const prog::ReduceOp r = op.kind == OpKind::AllReduce
                                     ? prog::DecodeAttrs<prog::attrs::AllReduce>(op).reduce_op
                                     : prog::DecodeAttrs<prog::attrs::ReduceScatter>(op).reduce_op;
        return fmt::format("{}[{}, {}]", OpName(op.kind), CommName(op.comm),
                           r == prog::ReduceOp::kMax   ? "max"
                           : r == prog::ReduceOp::kAvg ? "avg"
                                                       : "sum");
      }
      if (IsCollective(op.kind)) return fmt::format("{}[{}]", OpName(op.kind), CommName(op.comm));
      return std::string(OpName(op.kind));
  }
}

std::vector<std::string> VerifyWorld(const Program& program, VerifyStats* stats,
                                     size_t max_errors) {
  detail::WorldVerifier v(program, stats, max_errors);
  return v.Run();
}

}  // namespace paraplan::verify
