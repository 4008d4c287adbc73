// The op registry: complete and consistent with program.fbs, attributes encoded at the positions
// it gives, the shared structural check, and the coverage rule of docs/adding-an-op.md (every op
// the runtime runs has a host kernel test and a CUDA kernel; tests/equivalence checks that every
// emitted op is trained by an equivalence case).
#include "runtime/format/ops.h"

#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

namespace paraplan::prog {
namespace {

namespace fs = std::filesystem;

TEST_CASE("the registry lists every OpKind once, in order, with consistent attributes") {
  std::set<int> seen;
  int previous = -1;
  for (const OpInfo& op : AllOps()) {
    CAPTURE(op.type_name);
    CHECK(static_cast<int>(op.kind) > previous);
    previous = static_cast<int>(op.kind);
    CHECK(op.type_name == EnumNameOpKind(op.kind));
    seen.insert(static_cast<int>(op.kind));
    int next[2] = {0, 0};
    bool chunk = false;
    for (const AttrInfo& a : op.attrs) {
      CAPTURE(a.name);
      CHECK(a.position == next[static_cast<int>(a.wire)]++);  // dense, in order
      if (a.ref == AttrRef::kChunk) chunk = true;
      if (a.ref == AttrRef::kSlot) CHECK(chunk);
      if (a.wire == AttrWire::kInt && a.omittable)  // a default a file may rely on is valid
        CHECK((a.lo <= a.int_default && a.int_default <= a.hi));
    }
    for (std::string_view sig : {op.inputs, op.outputs}) {
      const std::vector<OperandInfo> ops = ParseOperands(sig);
      for (size_t i = 0; i < ops.size(); ++i) {
        CHECK(!ops[i].name.empty());
        if (ops[i].variadic) CHECK(i + 1 == ops.size());
        if (i > 0 && ops[i - 1].may_be_absent) CHECK(ops[i].may_be_absent);
      }
    }
    if (op.op_class != OpClass::kSchedule && op.status != OpStatus::kReserved)
      CHECK(!op.backend.empty());
  }
  for (OpKind k : EnumValuesOpKind())
    CHECK_MESSAGE(seen.count(static_cast<int>(k)), EnumNameOpKind(k));
  CHECK(seen.size() == std::size(EnumValuesOpKind()));
  CHECK(FindOp(static_cast<OpKind>(200)) == nullptr);
  CHECK(OpDisplayName(OpKind::RmsNormBackward) == "rms_norm_backward");
  CHECK(OpDisplayName(static_cast<OpKind>(200)) == "op 200");
}

TEST_CASE("typed attributes are written at the registry's positions and read back") {
  mem::Op labels = MakeOp(attrs::LoadBatch{.what = BatchPart::kLabels}, {}, {3});
  CHECK(labels.kind == OpKind::LoadBatch);
  CHECK(labels.ints == std::vector<int64_t>{1});
  CHECK(DecodeAttrs<attrs::LoadBatch>(labels).what == BatchPart::kLabels);
  // An omittable attribute at its default is left out; set, it is written after the others.
  CHECK(MakeOp(attrs::ReduceScatter{}, {0}, {1}, CommKind::Tp).ints == std::vector<int64_t>{0});
  mem::Op acc = MakeOp(attrs::ReduceScatter{.reduce_op = ReduceOp::kAvg, .accumulate = true}, {0},
                       {1}, CommKind::Dp);
  CHECK(acc.ints == std::vector<int64_t>{2, 1});
  CHECK(DecodeAttrs<attrs::ReduceScatter>(acc).accumulate);
  CHECK(DecodeAttrs<attrs::ReduceScatter>(acc).reduce_op == ReduceOp::kAvg);
  // Unset optional floats are not written; the handler falls back to the model's value.
  CHECK(MakeOp(attrs::RmsNorm{}, {0, 1}, {2, 3}).floats.empty());
  CHECK(MakeOp(attrs::RmsNorm{.eps = 1e-6}, {0, 1}, {2, 3}).floats == std::vector<double>{1e-6});
  CHECK(!DecodeAttrs<attrs::RmsNorm>(MakeOp(attrs::RmsNorm{}, {0, 1}, {2, 3})).eps.has_value());
  mem::Op att = MakeOp(
      attrs::Attention{
          .micro = 2, .seq = 16, .heads = 4, .kv_heads = 2, .head_dim = 8, .scale = 0.5},
      {0, 1, 2}, {3, 4});
  CHECK(att.ints == std::vector<int64_t>{2, 16, 4, 2, 8});
  CHECK(att.floats == std::vector<double>{0.5});
  CHECK(FormatAttrs(att) == "micro=2 seq=16 heads=4 kv_heads=2 head_dim=8 scale=0.5 window=0");
  CHECK(FormatAttrs(acc) == "reduce_op=avg accumulate=true");
  // Positions a file leaves out read as defaults.
  mem::Op short_rs;
  short_rs.kind = OpKind::ReduceScatter;
  short_rs.ints = {1};
  CHECK(!DecodeAttrs<attrs::ReduceScatter>(short_rs).accumulate);
  CHECK(FormatAttrs(short_rs) == "reduce_op=max accumulate=false");
}

TEST_CASE("the positions program.h names agree with the registry") {
  for (OpKind k :
       {OpKind::SendActivation, OpKind::RecvActivation, OpKind::SendGrad, OpKind::RecvGrad}) {
    const auto attrs = FindOp(k)->attrs;
    REQUIRE(attrs.size() == 5);
    CHECK(attrs[kP2pMicrobatch].name == "microbatch");
    CHECK(attrs[kP2pChunk].name == "chunk");
    CHECK(attrs[kP2pSlot].name == "slot");
    CHECK(attrs[kP2pPeer].name == "peer");
    CHECK(attrs[kP2pGroup].name == "group");
  }
  CHECK(static_cast<int64_t>(ReduceOp::kSum) == kReduceSum);
  CHECK(static_cast<int64_t>(ReduceOp::kMax) == kReduceMax);
  CHECK(static_cast<int64_t>(ReduceOp::kAvg) == kReduceAvg);
}

TEST_CASE("schedule ops by what they share: step attributes, slots and bodies") {
  mem::Op send =
      MakeOp(attrs::SendGrad{.microbatch = 5, .chunk = 1, .slot = 0, .peer = 2, .group = 7}, {3},
             {}, CommKind::Pp);
  const StepAttrs s = DecodeStepAttrs(send);
  CHECK(s.microbatch == 5);
  CHECK(s.chunk == 1);
  CHECK(s.peer == 2);
  CHECK(s.group == 7);
  SetStepSlot(send, 3);
  CHECK(send.ints == std::vector<int64_t>{5, 1, 3, 2, 7});
  mem::Op fwd = MakeOp(attrs::Forward{.microbatch = 4, .chunk = 0, .slot = 1}, {}, {});
  CHECK(DecodeStepAttrs(fwd).peer == -1);
  CHECK(DecodeStepAttrs(fwd).group == 0);
  SetStepSlot(fwd, 0);
  CHECK(fwd.ints == std::vector<int64_t>{4, 0, 0});
  CHECK(StepBody(MakeOp(attrs::GatherParams{.chunk = 1, .body = 6}, {}, {})) == 6);
  CHECK(StepBody(MakeOp(attrs::OptimizerStep{.body = 2}, {}, {})) == 2);
  CHECK(StepBody(fwd) == -1);
  CHECK(DecodeStepAttrs(MakeOp(attrs::ZeroGrads{.body = 1}, {}, {})).chunk == -1);
}

mem::Role SmallRole() {
  mem::Role role;
  role.name = "stage0";
  auto add = [&](const char* name, DType t) {
    mem::Buffer b;
    b.name = name;
    b.dtype = t;
    b.shape = {4};
    role.buffers.push_back(b);
  };
  add("x", DType::F32);      // 0
  add("w", DType::F32);      // 1
  add("y", DType::F32);      // 2
  add("ids", DType::I32);    // 3
  add("rstd", DType::F32);   // 4
  add("half", DType::Bf16);  // 5
  role.bodies.resize(2);
  mem::Chunk c;
  c.slots = 2;
  role.chunks.push_back(c);
  return role;
}

TEST_CASE("CheckOp refuses what the registry rules out, with the rule in the message") {
  const mem::Role role = SmallRole();
  auto check = [&](const mem::Op& op, OpPlace place = OpPlace::kBody) {
    return CheckOp(role, op, place);
  };
  CHECK(check(MakeOp(attrs::RmsNorm{.eps = 1e-5}, {0, 1}, {2, 4})) == "");
  CHECK(check(MakeOp(attrs::RmsNorm{}, {0}, {2, 4})) == "has 1 input; it takes 2");
  CHECK(check(MakeOp(attrs::Linear{}, {0, 1, 2, 4}, {2})) == "has 4 inputs; it takes 2 to 3");
  CHECK(check(MakeOp(attrs::Linear{}, {0, 1, -1}, {2})) == "");  // the bias may be none
  CHECK(check(MakeOp(attrs::Linear{}, {0, -1}, {2})) == "input 1 (w) names buffer -1 of 6");
  CHECK(check(MakeOp(attrs::Linear{}, {0, 9}, {2})) == "input 1 (w) names buffer 9 of 6");
  CHECK(check(MakeOp(attrs::LoadBatch{}, {}, {2})) ==
        "output 0 (tokens) `y` holds F32; the op takes I32 token ids");
  CHECK(check(MakeOp(attrs::Add{}, {3, 0}, {2})) ==
        "input 0 (a) `ids` holds I32; the op takes floating-point values");
  CHECK(check(MakeOp(attrs::RmsNorm{}, {5, 1}, {5, 4})) == "");  // activations in any precision
  CHECK(check(MakeOp(attrs::RmsNorm{}, {0, 1}, {2, 5})) ==
        "output 1 (rstd) `half` holds Bf16; the op takes F32 values (statistics and optimizer "
        "state are F32 in every precision)");
  CHECK(check(MakeOp(attrs::Fill{}, {}, {0, 1, 2})) == "");
  CHECK(check(MakeOp(attrs::Fill{}, {}, {})) == "has 0 outputs; it takes at least 1");
  CHECK(check(MakeOp(attrs::Add{}, {0, 1}, {2}, CommKind::Tp)) ==
        "runs over communicator kind Tp; it takes None");
  CHECK(check(MakeOp(attrs::AllReduce{}, {0}, {0})) ==
        "runs over communicator kind None; it takes World, Tp, Pp, Dp, Cp, DpCp, Ep, Etp, Edp, "
        "Mp, Embedding, Shard, Replicate");
  mem::Op bad_reduce = MakeOp(attrs::AllReduce{}, {0}, {0}, CommKind::Tp);
  bad_reduce.ints = {7};
  CHECK(check(bad_reduce) == "reduce_op = 7 lies outside 0 .. 2");
  bad_reduce.ints = {0, 0};
  CHECK(check(bad_reduce) == "has 2 integer attributes; it takes 1");
  mem::Op no_scale = MakeOp(attrs::CrossEntropyLoss{}, {0, 1}, {2});
  no_scale.floats.clear();
  CHECK(check(no_scale) == "has 0 float attributes; it takes 1");
  // Schedule ops: placement, chunk, slot and body indices.
  CHECK(check(MakeOp(attrs::Forward{.microbatch = 3, .chunk = 0, .slot = 1}, {}, {}),
              OpPlace::kSchedule) == "");
  CHECK(check(MakeOp(attrs::Forward{.microbatch = 3, .chunk = 0, .slot = 2}, {}, {}),
              OpPlace::kSchedule) == "slot = 2 lies outside 0 .. 1");
  CHECK(check(MakeOp(attrs::Forward{.microbatch = 3, .chunk = 1, .slot = 0}, {}, {}),
              OpPlace::kSchedule) == "chunk = 1 lies outside 0 .. 0");
  CHECK(check(MakeOp(attrs::ZeroGrads{.body = 2}, {}, {}), OpPlace::kSchedule) ==
        "body = 2 lies outside 0 .. 1");
  CHECK(check(MakeOp(attrs::ZeroGrads{.body = 1}, {}, {})) == "is a schedule op, not a body op");
  CHECK(check(MakeOp(attrs::Add{}, {0, 1}, {2}), OpPlace::kSchedule) == "is not a schedule op");
  for (const OpInfo& info : AllOps()) {  // every op still reserved is refused
    if (info.status != OpStatus::kReserved) continue;
    mem::Op reserved;
    reserved.kind = info.kind;
    CAPTURE(info.name);
    CHECK(check(reserved) ==
          "is reserved for context and expert parallelism and not supported yet");
  }
  mem::Op ring;  // a ring attention op is checked like any other: here its communicator
  ring.kind = OpKind::RingAttention;
  CHECK(check(ring) == "runs over communicator kind None; it takes Cp");
  mem::Op unknown;
  unknown.kind = static_cast<OpKind>(99);
  CHECK(check(unknown) == "is not an op this version knows (a newer or damaged file)");
}

// --- coverage --------------------------------------------------------------------------------

// The runtime's sources by role, found by path so that the check holds whatever the folders
// are called: a file is CUDA when its path under runtime/ names `cuda`, communicator code when
// it names `comm`, a test when it ends in `_test.cpp`. runtime/format (this test) is left out.
struct RuntimeSources {
  std::string host_tests, host_comm_tests, cuda, cuda_comm;
};

RuntimeSources ScanRuntime(const fs::path& runtime) {
  RuntimeSources out;
  for (const auto& e : fs::recursive_directory_iterator(runtime)) {
    if (!e.is_regular_file()) continue;
    const std::string rel = fs::relative(e.path(), runtime).generic_string();
    const std::string name = e.path().filename().string();
    const bool source = name.ends_with(".cpp") || name.ends_with(".cu") || name.ends_with(".h") ||
                        name.ends_with(".cuh");
    if (!source || rel.starts_with("format/")) continue;
    std::ifstream in(e.path());
    std::ostringstream text;
    text << in.rdbuf();
    const bool test = name.ends_with("_test.cpp");
    const bool cuda = rel.find("cuda") != std::string::npos;
    const bool comm = rel.find("comm") != std::string::npos;
    if (test && !cuda) out.host_tests += text.str();
    if (test && !cuda && comm) out.host_comm_tests += text.str();
    if (!test && cuda) out.cuda += text.str();
    if (!test && cuda && comm) out.cuda_comm += text.str();
  }
  return out;
}

TEST_CASE("coverage: every op the runtime runs has a host kernel test and a CUDA kernel") {
  const char* src = std::getenv("PARAPLAN_SOURCE_DIR");
  REQUIRE_MESSAGE(src, "PARAPLAN_SOURCE_DIR names the source tree (set by CTest)");
  // Kernels: the Backend method's host kernel is called by a host test, and a CUDA file defines
  // the method. Collectives and transfers: the Communicator method is exercised by a host
  // communicator test and implemented by the CUDA (NCCL) communicator.
  const RuntimeSources found = ScanRuntime(fs::path(src) / "runtime");
  REQUIRE(!found.host_tests.empty());
  REQUIRE(!found.host_comm_tests.empty());
  REQUIRE(!found.cuda.empty());
  REQUIRE(!found.cuda_comm.empty());
  const std::string& host_tests = found.host_tests;
  const std::string& comm_tests = found.host_comm_tests;
  const std::string& cuda = found.cuda;
  const std::string& cuda_comm = found.cuda_comm;
  for (const OpInfo& op : AllOps()) {
    if (op.status == OpStatus::kReserved || op.backend.empty()) continue;  // exempt, see ops.def
    CAPTURE(op.type_name);
    CAPTURE(op.backend);
    const std::string call = std::string(op.backend) + "(";
    const bool communicator = op.op_class != OpClass::kCompute;
    if (communicator) {
      CHECK_MESSAGE(comm_tests.find(call) != std::string::npos,
                    "no host communicator test calls " << call);
      CHECK_MESSAGE(cuda_comm.find(call) != std::string::npos,
                    "no CUDA communicator implements " << call);
    } else {
      CHECK_MESSAGE(host_tests.find(call) != std::string::npos,
                    "no host kernel test calls " << call);
      CHECK_MESSAGE(cuda.find(" " + call) != std::string::npos, "no CUDA backend method " << call);
    }
  }
}

// --- mixture of experts ----------------------------------------------------------------------
TEST_CASE("mixture-of-experts ops: typed attributes round trip; the runtime runs them") {
  mem::Op router = MakeOp(attrs::MoeRouter{.experts = 8, .topk = 2, .score = 1, .normalize = true},
                          {0}, {1, 2, 3, 4});
  CHECK(router.ints == std::vector<int64_t>{8, 2, 1, 1});
  CHECK(router.floats.empty());
  CHECK(FormatAttrs(router) == "experts=8 topk=2 score=1 normalize=true groups=1 group_topk=1");
  // Group-limited routing and the scale are written only when set, so ungrouped routers keep
  // their encoding.
  mem::Op grouped = MakeOp(attrs::MoeRouter{.experts = 8,
                                            .topk = 2,
                                            .score = 1,
                                            .normalize = true,
                                            .groups = 4,
                                            .group_topk = 2,
                                            .scale = 2.5},
                           {0}, {1, 2, 3, 4});
  CHECK(grouped.ints == std::vector<int64_t>{8, 2, 1, 1, 4, 2});
  CHECK(grouped.floats == std::vector<double>{2.5});
  CHECK(FormatAttrs(grouped) ==
        "experts=8 topk=2 score=1 normalize=true groups=4 group_topk=2 scale=2.5");
  CHECK(DecodeAttrs<attrs::MoeRouter>(grouped).group_topk == 2);
  CHECK(!DecodeAttrs<attrs::MoeRouter>(router).scale.has_value());
  mem::Op back = MakeOp(
      attrs::MoeRouterBackward{
          .experts = 8, .topk = 2, .aux_rows = 64, .aux_coeff = 0.01, .aux_grad_scale = 0.5},
      {0, 1, 2, 3}, {4});
  CHECK(back.ints == std::vector<int64_t>{8, 2, 0, 0, 64});
  CHECK(back.floats == std::vector<double>{0.01, 0.5});
  CHECK(MakeOp(attrs::MoeRouterBackward{.experts = 8, .topk = 2, .scale = 16.0}, {0, 1, 2, 3}, {4})
            .floats == std::vector<double>{0.0, 0.0, 16.0});
  CHECK(DecodeAttrs<attrs::MoeRouterBackward>(back).aux_rows == 64);
  CHECK(DecodeAttrs<attrs::GroupedLinearBackward>(
            MakeOp(attrs::GroupedLinearBackward{.groups = 4, .dx_accumulate = true}, {0, 1, 2, 3},
                   {4, 5}))
            .dx_accumulate);
  for (OpKind k :
       {OpKind::MoeRouter, OpKind::MoeRouterBackward, OpKind::MoePermute, OpKind::MoeUnpermute,
        OpKind::MoeUnpermuteBackward, OpKind::GroupedLinear, OpKind::GroupedLinearBackward}) {
    CAPTURE(EnumNameOpKind(k));
    const OpInfo* info = FindOp(k);
    REQUIRE(info != nullptr);
    CHECK(info->status == OpStatus::kEmitted);
    CHECK(!info->backend.empty());
  }
}
// --- expert parallelism: collectives over Ep whose backend entry is the Communicator method ---
TEST_CASE("expert-parallel dispatch ops: collectives of the Ep group, experts attribute") {
  for (OpKind k : {OpKind::MoeExchangeCounts, OpKind::MoeDispatch, OpKind::MoeCombine}) {
    CAPTURE(EnumNameOpKind(k));
    const OpInfo* info = FindOp(k);
    REQUIRE(info != nullptr);
    CHECK(info->op_class == OpClass::kCollective);
    CHECK(info->status == OpStatus::kEmitted);
    CHECK(info->comms == In(CommKind::Ep));
  }
  CHECK(FindOp(OpKind::MoeExchangeCounts)->backend == "AllToAll");
  CHECK(FindOp(OpKind::MoeDispatch)->backend == "AllToAllV");
  const mem::Op dispatch = MakeOp(attrs::MoeDispatch{.experts = 8}, {0, 1, 2}, {3}, CommKind::Ep);
  CHECK(dispatch.ints == std::vector<int64_t>{8});
  CHECK(FormatAttrs(dispatch) == "experts=8");
  // count_once is left out at its default: earlier programs decode unchanged.
  CHECK(MakeOp(attrs::GradNormSquare{}, {0}, {1}).ints.empty());
  CHECK(MakeOp(attrs::GradNormSquare{.count_once = true}, {0}, {1}).ints ==
        std::vector<int64_t>{1});
}
// --- end expert parallelism ---
// --- end mixture of experts ------------------------------------------------------------------

}  // namespace
}  // namespace paraplan::prog
