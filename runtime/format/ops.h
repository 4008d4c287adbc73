// The op registry in C++ (entries in ops.def): per OpKind its name, class, status, named
// operands, allowed communicators, backend entry and typed attributes; from those, the encoding
// of the attributes into the wire fields Op.ints / Op.floats (positions from the registry), the
// one structural check of an op (CheckOp: operand counts and buffers, operand dtypes, attribute
// counts and ranges, indices into the role, the communicator kind) that the runtime's loader and
// `planc dump` share, and the attribute text of dumps.
//
// Typed attributes: prog::attrs::<Kind> is a struct with one field per attribute, e.g.
//   mem::Op op = MakeOp(attrs::LoadBatch{.what = BatchPart::kLabels}, {}, {tokens});
//   attrs::ReduceScatter a = DecodeAttrs<attrs::ReduceScatter>(op);  // a.accumulate
// Decoding a file's op gives the registry's default for positions the file leaves out; values
// out of range are the validator's to refuse (CheckOp), so handlers decode validated ops only.
//
// Made by: nothing (static tables). Read by: runtime/format (DecodeProgram), compiler/lower
// (emitters, VerifyStructure and VerifyWorld, printing, planc dump), runtime/exec (the
// interpreter's dispatch and handlers).
#ifndef PARAPLAN_RUNTIME_FORMAT_OPS_H_
#define PARAPLAN_RUNTIME_FORMAT_OPS_H_

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/format/program.h"
#include "runtime/format/program_model.h"

namespace paraplan::prog {

// Reduction of AllReduce / ReduceScatter (the values of kReduceSum, kReduceMax, kReduceAvg).
enum class ReduceOp : int64_t { kSum = 0, kMax = 1, kAvg = 2 };
// What LoadBatch loads: the input ids of the microbatch, or its labels (ids shifted by one).
enum class BatchPart : int64_t { kInputs = 0, kLabels = 1 };

enum class OpClass : uint8_t { kSchedule, kCollective, kCompute };
enum class OpStatus : uint8_t { kEmitted, kRuntimeOnly, kReserved };
enum class AttrWire : uint8_t { kInt, kFloat };
// What an integer attribute indexes in the op's role (kSlot: a slot of the op's chunk).
enum class AttrRef : uint8_t { kNone, kChunk, kBody, kSlot };

// Bit of a CommKind in OpInfo::comms.
constexpr uint32_t In(CommKind kind) { return uint32_t{1} << static_cast<int>(kind); }
inline constexpr uint32_t kNoComm = In(CommKind::None);
inline constexpr uint32_t kAnyGroup = ((uint32_t{1} << kCommKinds) - 1) & ~kNoComm;
// The largest value of an unbounded integer attribute (microbatch, peer, sizes).
inline constexpr int64_t kMaxAttr = int64_t{1} << 40;

struct AttrInfo {
  std::string_view name;
  AttrWire wire = AttrWire::kInt;
  int position = 0;
  bool omittable = false;  // INT_OPT / FLOAT_OPT: may be absent
  AttrRef ref = AttrRef::kNone;
  int64_t lo = 0, hi = 0;  // integer range (refs: checked against the role instead)
  int64_t int_default = 0;
  double float_default = 0;
  std::span<const std::string_view> value_names;  // enum and bool attributes, by value
};

struct OpInfo {
  OpKind kind = OpKind::Forward;
  std::string_view type_name;  // "RmsNormBackward", as in program.fbs
  std::string_view name;       // "rms_norm_backward", for dumps and messages
  OpClass op_class = OpClass::kCompute;
  OpStatus status = OpStatus::kEmitted;
  std::string_view inputs, outputs;  // operand signatures (ops.def)
  uint32_t comms = kNoComm;
  std::string_view backend;  // Backend / Communicator method; empty for schedule ops
  std::span<const AttrInfo> attrs;
};

// One operand of a signature: "x", "b?" (may be -1), "[b]" (may be left out), "grads..."
// (one or more), "ids:i32" (an I32 buffer), "rstd:f32" (an F32 buffer in every precision).
struct OperandInfo {
  std::string_view name;
  bool may_be_none = false, may_be_absent = false, variadic = false, i32 = false, f32 = false;
};

// The registry entry of `kind`; nullptr for a value the registry does not know (a damaged or
// newer file).
const OpInfo* FindOp(OpKind kind);
// Every entry, in OpKind order.
std::span<const OpInfo> AllOps();
// "rms_norm_backward"; "op 200" for a value the registry does not know.
std::string OpDisplayName(OpKind kind);
// The parsed operand signature of an op (inputs or outputs).
std::vector<OperandInfo> ParseOperands(std::string_view signature);

// Where an op stands: in a role's schedule or in a body.
enum class OpPlace : uint8_t { kSchedule, kBody };
// The structural check of one op of `role`, shared by DecodeProgram and `planc dump`: the kind is
// known, not reserved and belongs to `place`; `comm` is one the op takes; operand counts match
// the signature, every operand names a buffer of the role (or -1 where the signature allows it)
// of the right dtype; attribute counts match, integers lie in their ranges, chunk / body / slot
// indices exist. Empty when the op is fine, else the first problem ("has 1 input; it takes 2").
std::string CheckOp(const mem::Role& role, const mem::Op& op, OpPlace place);

// "what=labels", "reduce_op=sum accumulate=true", "heads=4 head_dim=16 theta=10000": the op's
// attributes by name (positions the op lacks show their defaults; unset optional floats are
// left out). Empty for an op without attributes.
std::string FormatAttrs(const mem::Op& op);

// ---- Schedule ops, by what they share -------------------------------------------------------

// The attributes Forward, Backward and the four pipeline transfers share (peer and group stay
// -1 and 0 for Forward / Backward); every field -1 (group 0) for another kind.
struct StepAttrs {
  int64_t microbatch = -1, chunk = -1, slot = -1, peer = -1, group = 0;
};
StepAttrs DecodeStepAttrs(const mem::Op& op);
// Rewrites the slot of a Forward, Backward or transfer op (other kinds are left alone).
void SetStepSlot(mem::Op& op, int64_t slot);
// The body a ZeroGrads, ReduceGrads, OptimizerStep or GatherParams op runs; -1 for other kinds.
int64_t StepBody(const mem::Op& op);

// ---- Typed attributes, generated from ops.def -----------------------------------------------

#define PARAPLAN_OP_UNPAREN(...) __VA_ARGS__

namespace attrs {
#define PARAPLAN_INT(pos, name, Type, def, lo, hi) Type name = def;
#define PARAPLAN_INT_OPT(pos, name, Type, def, lo, hi) Type name = def;
#define PARAPLAN_REF(pos, name, ref) int64_t name = 0;
#define PARAPLAN_FLOAT(pos, name, def) double name = def;
#define PARAPLAN_FLOAT_OPT(pos, name) std::optional<double> name;
#define PARAPLAN_OP(Kind, cls, status, in, out, comms, backend, fields) \
  struct Kind {                                                         \
    static constexpr OpKind kKind = OpKind::Kind;                       \
    PARAPLAN_OP_UNPAREN fields                                          \
  };
#include "runtime/format/ops.def"
#undef PARAPLAN_OP
#undef PARAPLAN_INT
#undef PARAPLAN_INT_OPT
#undef PARAPLAN_REF
#undef PARAPLAN_FLOAT
#undef PARAPLAN_FLOAT_OPT
}  // namespace attrs

// Appends attributes at their positions; positions after the last one that must be written are
// dropped again, so an op keeps exactly the ints / floats the registry asks for.
class AttrWriter {
 public:
  AttrWriter(std::vector<int64_t>& ints, std::vector<double>& floats)
      : ints_(ints), floats_(floats) {}
  ~AttrWriter() {
    ints_.resize(keep_ints_);
    floats_.resize(keep_floats_);
  }
  void Int(int64_t value, bool keep) {
    ints_.push_back(value);
    if (keep) keep_ints_ = ints_.size();
  }
  void Float(std::optional<double> value) {
    floats_.push_back(value.value_or(0.0));
    if (value) keep_floats_ = floats_.size();
  }

 private:
  std::vector<int64_t>& ints_;
  std::vector<double>& floats_;
  size_t keep_ints_ = 0, keep_floats_ = 0;
};

#define PARAPLAN_INT(pos, name, Type, def, lo, hi) w.Int(static_cast<int64_t>(a.name), true);
// (Type is a type name, which parentheses would break.)
#define PARAPLAN_INT_OPT(pos, name, Type, def, lo, hi) \
  w.Int(static_cast<int64_t>(a.name), a.name != Type{def});  // NOLINT(bugprone-macro-parentheses)
#define PARAPLAN_REF(pos, name, ref) w.Int(a.name, true);
#define PARAPLAN_FLOAT(pos, name, def) w.Float(a.name);
#define PARAPLAN_FLOAT_OPT(pos, name) w.Float(a.name);
#define PARAPLAN_OP(Kind, cls, status, in, out, comms, backend, fields)                      \
  inline void EncodeAttrs([[maybe_unused]] const attrs::Kind& a, std::vector<int64_t>& ints, \
                          std::vector<double>& floats) {                                     \
    ints.clear();                                                                            \
    floats.clear();                                                                          \
    [[maybe_unused]] AttrWriter w(ints, floats);                                             \
    PARAPLAN_OP_UNPAREN fields                                                               \
  }
#include "runtime/format/ops.def"
#undef PARAPLAN_OP
#undef PARAPLAN_INT
#undef PARAPLAN_INT_OPT
#undef PARAPLAN_REF
#undef PARAPLAN_FLOAT
#undef PARAPLAN_FLOAT_OPT

#define PARAPLAN_INT(pos, name, Type, def, lo, hi) \
  a.name = static_cast<Type>(op.Int(pos, static_cast<int64_t>(def)));
#define PARAPLAN_INT_OPT(pos, name, Type, def, lo, hi) \
  a.name = static_cast<Type>(op.Int(pos, static_cast<int64_t>(def)));
#define PARAPLAN_REF(pos, name, ref) a.name = op.Int(pos, -1);
#define PARAPLAN_FLOAT(pos, name, def) a.name = op.Float(pos, def);
#define PARAPLAN_FLOAT_OPT(pos, name) \
  if (size_t{pos} < op.floats.size()) a.name = op.floats[pos];
#define PARAPLAN_OP(Kind, cls, status, in, out, comms, backend, fields)                          \
  inline void DecodeAttrs([[maybe_unused]] const mem::Op& op, [[maybe_unused]] attrs::Kind& a) { \
    PARAPLAN_OP_UNPAREN fields                                                                   \
  }
#include "runtime/format/ops.def"
#undef PARAPLAN_OP
#undef PARAPLAN_INT
#undef PARAPLAN_INT_OPT
#undef PARAPLAN_REF
#undef PARAPLAN_FLOAT
#undef PARAPLAN_FLOAT_OPT

// The attributes of `op`, which must be of kind A::kKind.
template <typename A>
A DecodeAttrs(const mem::Op& op) {
  A a;
  DecodeAttrs(op, a);
  return a;
}

// An op of the attributes' kind with these operands.
template <typename A>
mem::Op MakeOp(const A& a, std::vector<int32_t> inputs, std::vector<int32_t> outputs,
               CommKind comm = CommKind::None) {
  mem::Op op;
  op.kind = A::kKind;
  op.inputs = std::move(inputs);
  op.outputs = std::move(outputs);
  op.comm = comm;
  EncodeAttrs(a, op.ints, op.floats);
  return op;
}

}  // namespace paraplan::prog

#endif  // PARAPLAN_RUNTIME_FORMAT_OPS_H_
