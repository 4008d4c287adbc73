// The registry's tables (from ops.def), the structural check of an op and its attribute text.
#include "runtime/format/ops.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <cstdio>
#include <iterator>
#include <type_traits>

namespace paraplan::prog {
namespace {

constexpr std::string_view kReduceNames[] = {"sum", "max", "avg"};
constexpr std::string_view kBatchNames[] = {"inputs", "labels"};
constexpr std::string_view kBoolNames[] = {"false", "true"};

template <typename T>
constexpr std::span<const std::string_view> ValueNames() {
  if constexpr (std::is_same_v<T, ReduceOp>) return kReduceNames;
  if constexpr (std::is_same_v<T, BatchPart>) return kBatchNames;
  if constexpr (std::is_same_v<T, bool>) return kBoolNames;
  return {};
}

#define PARAPLAN_INT(pos, name, Type, def, lo, hi)                                             \
  AttrInfo{                                                                                    \
      #name, AttrWire::kInt,    pos, false, AttrRef::kNone, lo, hi, static_cast<int64_t>(def), \
      0,     ValueNames<Type>()},
#define PARAPLAN_INT_OPT(pos, name, Type, def, lo, hi)                                             \
  AttrInfo{#name, AttrWire::kInt,    pos, true, AttrRef::kNone, lo, hi, static_cast<int64_t>(def), \
           0,     ValueNames<Type>()},
#define PARAPLAN_REF(pos, name, ref) \
  AttrInfo{#name, AttrWire::kInt, pos, false, AttrRef::ref, 0, kMaxAttr, -1, 0, {}},
#define PARAPLAN_FLOAT(pos, name, def) \
  AttrInfo{#name, AttrWire::kFloat, pos, false, AttrRef::kNone, 0, 0, 0, def, {}},
#define PARAPLAN_FLOAT_OPT(pos, name) \
  AttrInfo{#name, AttrWire::kFloat, pos, true, AttrRef::kNone, 0, 0, 0, 0, {}},
// Each list ends with an empty entry so that ops without attributes have an array too.
#define PARAPLAN_OP(Kind, cls, status, in, out, comms, backend, fields) \
  constexpr AttrInfo kAttrs##Kind[] = {PARAPLAN_OP_UNPAREN fields AttrInfo{}};
#include "runtime/format/ops.def"
#undef PARAPLAN_OP
#undef PARAPLAN_INT
#undef PARAPLAN_INT_OPT
#undef PARAPLAN_REF
#undef PARAPLAN_FLOAT
#undef PARAPLAN_FLOAT_OPT

std::string SnakeCase(std::string_view camel) {
  std::string name;
  for (char c : camel) {
    if (std::isupper(static_cast<unsigned char>(c))) {
      if (!name.empty()) name += '_';
      name += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    } else {
      name += c;
    }
  }
  return name;
}

struct Registry {
  std::vector<OpInfo> ops;
  std::vector<std::string> names;  // storage of ops[i].name
  std::vector<std::vector<OperandInfo>> inputs, outputs;
  std::array<int16_t, 256> index{};  // OpKind value -> position in ops, -1 when unknown
};

Registry Build() {
  Registry r;
#define PARAPLAN_OP(Kind, cls, status, in, out, comms, backend, fields) \
  r.ops.push_back(OpInfo{OpKind::Kind,                                  \
                         #Kind,                                         \
                         {},                                            \
                         OpClass::cls,                                  \
                         OpStatus::status,                              \
                         in,                                            \
                         out,                                           \
                         comms,                                         \
                         backend,                                       \
                         std::span(kAttrs##Kind, std::size(kAttrs##Kind) - 1)});
#include "runtime/format/ops.def"
#undef PARAPLAN_OP
  r.index.fill(-1);
  r.names.reserve(r.ops.size());
  for (size_t i = 0; i < r.ops.size(); ++i) {
    OpInfo& op = r.ops[i];
    r.names.push_back(SnakeCase(op.type_name));
    op.name = r.names.back();
    r.index[static_cast<uint8_t>(op.kind)] = static_cast<int16_t>(i);
    r.inputs.push_back(ParseOperands(op.inputs));
    r.outputs.push_back(ParseOperands(op.outputs));
  }
  return r;
}

const Registry& TheRegistry() {
  static const Registry kRegistry = Build();
  return kRegistry;
}

std::string Plural(size_t n, const char* what) {
  return std::to_string(n) + " " + what + (n == 1 ? "" : "s");
}

// Operand counts and buffers of one list against its signature.
std::string CheckOperands(const mem::Role& role, const std::vector<int32_t>& list,
                          const std::vector<OperandInfo>& sig, const char* what) {
  size_t min = 0;
  const bool variadic = !sig.empty() && sig.back().variadic;
  for (const OperandInfo& o : sig) min += o.may_be_absent ? 0 : 1;
  if (list.size() < min || (!variadic && list.size() > sig.size())) {
    const std::string wanted = variadic ? "at least " + std::to_string(min)
                               : min == sig.size()
                                   ? std::to_string(min)
                                   : std::to_string(min) + " to " + std::to_string(sig.size());
    return "has " + Plural(list.size(), what) + "; it takes " + wanted;
  }
  const auto nbuf = static_cast<int32_t>(role.buffers.size());
  for (size_t i = 0; i < list.size(); ++i) {
    const OperandInfo& o = sig[std::min(i, sig.size() - 1)];
    const int32_t b = list[i];
    const std::string which =
        std::string(what) + " " + std::to_string(i) + " (" + std::string(o.name) + ")";
    if (b == -1 && o.may_be_none) continue;
    if (b < 0 || b >= nbuf)
      return which + " names buffer " + std::to_string(b) + " of " + std::to_string(nbuf);
    const DType dtype = role.buffers[b].dtype;
    if (o.i32 != (dtype == DType::I32) || (o.f32 && dtype != DType::F32)) {
      return which + " `" + role.buffers[b].name + "` holds " + EnumNameDType(dtype) +
             "; the op takes " +
             (o.i32   ? "I32 token ids"
              : o.f32 ? "F32 values (statistics and optimizer state are F32 in every precision)"
                      : "floating-point values");
    }
  }
  return "";
}

std::string CheckAttrs(const mem::Role& role, const mem::Op& op, const OpInfo& info) {
  size_t min_ints = 0, max_ints = 0, min_floats = 0, max_floats = 0;
  for (const AttrInfo& a : info.attrs) {
    size_t& max = a.wire == AttrWire::kInt ? max_ints : max_floats;
    size_t& min = a.wire == AttrWire::kInt ? min_ints : min_floats;
    max = std::max(max, static_cast<size_t>(a.position) + 1);
    if (!a.omittable) min = std::max(min, static_cast<size_t>(a.position) + 1);
  }
  if (op.ints.size() < min_ints || op.ints.size() > max_ints) {
    return "has " + Plural(op.ints.size(), "integer attribute") + "; it takes " +
           (min_ints == max_ints ? std::to_string(min_ints)
                                 : std::to_string(min_ints) + " to " + std::to_string(max_ints));
  }
  if (op.floats.size() < min_floats || op.floats.size() > max_floats) {
    return "has " + Plural(op.floats.size(), "float attribute") + "; it takes " +
           (min_floats == max_floats
                ? std::to_string(min_floats)
                : std::to_string(min_floats) + " to " + std::to_string(max_floats));
  }
  int64_t chunk = -1;
  for (const AttrInfo& a : info.attrs) {
    if (a.wire != AttrWire::kInt || static_cast<size_t>(a.position) >= op.ints.size()) continue;
    const int64_t v = op.ints[a.position];
    int64_t lo = a.lo, hi = a.hi;
    switch (a.ref) {
      case AttrRef::kNone:
        break;
      case AttrRef::kChunk:
        lo = 0, hi = static_cast<int64_t>(role.chunks.size()) - 1;
        chunk = v;
        break;
      case AttrRef::kBody:
        lo = 0, hi = static_cast<int64_t>(role.bodies.size()) - 1;
        break;
      case AttrRef::kSlot:  // the chunk attribute comes first (checked by the registry's test)
        lo = 0, hi = chunk >= 0 ? int64_t{role.chunks[chunk].slots} - 1 : -1;
        break;
    }
    if (v < lo || v > hi) {
      return std::string(a.name) + " = " + std::to_string(v) +
             (hi < lo ? ", but the role has none"
                      : " lies outside " + std::to_string(lo) + " .. " + std::to_string(hi));
    }
  }
  return "";
}

}  // namespace

std::vector<OperandInfo> ParseOperands(std::string_view sig) {
  std::vector<OperandInfo> out;
  size_t i = 0;
  while (i < sig.size()) {
    if (sig[i] == ' ') {
      ++i;
      continue;
    }
    size_t j = sig.find(' ', i);
    if (j == std::string_view::npos) j = sig.size();
    std::string_view t = sig.substr(i, j - i);
    i = j;
    OperandInfo o;
    if (t.size() > 2 && t.front() == '[' && t.back() == ']') {
      o.may_be_absent = true;
      t = t.substr(1, t.size() - 2);
    }
    if (t.size() > 3 && t.substr(t.size() - 3) == "...") {
      o.variadic = true;
      t.remove_suffix(3);
    }
    if (t.size() > 4 && t.substr(t.size() - 4) == ":i32") {
      o.i32 = true;
      t.remove_suffix(4);
    } else if (t.size() > 4 && t.substr(t.size() - 4) == ":f32") {
      o.f32 = true;
      t.remove_suffix(4);
    }
    if (!t.empty() && t.back() == '?') {
      o.may_be_none = true;
      t.remove_suffix(1);
    }
    o.name = t;
    out.push_back(o);
  }
  return out;
}

const OpInfo* FindOp(OpKind kind) {
  const Registry& r = TheRegistry();
  const int16_t i = r.index[static_cast<uint8_t>(kind)];
  return i < 0 ? nullptr : &r.ops[i];
}

std::span<const OpInfo> AllOps() { return TheRegistry().ops; }

std::string OpDisplayName(OpKind kind) {
  const OpInfo* info = FindOp(kind);
  return info ? std::string(info->name) : "op " + std::to_string(static_cast<int>(kind));
}

std::string CheckOp(const mem::Role& role, const mem::Op& op, OpPlace place) {
  const OpInfo* info = FindOp(op.kind);
  if (!info) return "is not an op this version knows (a newer or damaged file)";
  if (info->status == OpStatus::kReserved)
    return "is reserved for context and expert parallelism and not supported yet";
  if ((info->op_class == OpClass::kSchedule) != (place == OpPlace::kSchedule))
    return place == OpPlace::kSchedule ? "is not a schedule op" : "is a schedule op, not a body op";
  const int comm = static_cast<int>(op.comm);
  if (comm < 0 || comm >= kCommKinds) return "names a bad communicator kind";
  if ((info->comms & In(op.comm)) == 0) {
    std::string allowed;
    for (int k = 0; k < kCommKinds; ++k)
      if (info->comms & In(static_cast<CommKind>(k)))
        allowed += (allowed.empty() ? "" : ", ") + std::string(EnumNameCommKind(CommKind(k)));
    return std::string("runs over communicator kind ") + EnumNameCommKind(op.comm) + "; it takes " +
           allowed;
  }
  const Registry& r = TheRegistry();
  const size_t at = static_cast<size_t>(info - r.ops.data());
  if (std::string e = CheckOperands(role, op.inputs, r.inputs[at], "input"); !e.empty()) return e;
  if (std::string e = CheckOperands(role, op.outputs, r.outputs[at], "output"); !e.empty())
    return e;
  return CheckAttrs(role, op, *info);
}

std::string FormatAttrs(const mem::Op& op) {
  const OpInfo* info = FindOp(op.kind);
  if (!info) return "";
  std::string out;
  for (const AttrInfo& a : info->attrs) {
    std::string value;
    if (a.wire == AttrWire::kInt) {
      const int64_t v = op.Int(a.position, a.int_default);
      value = v >= 0 && static_cast<size_t>(v) < a.value_names.size()
                  ? std::string(a.value_names[v])
                  : std::to_string(v);
    } else {
      if (static_cast<size_t>(a.position) >= op.floats.size() && a.omittable) continue;
      char buf[32];
      std::snprintf(buf, sizeof buf, "%g", op.Float(a.position, a.float_default));
      value = buf;
    }
    out += (out.empty() ? "" : " ") + std::string(a.name) + "=" + value;
  }
  return out;
}

namespace {

template <typename A>
StepAttrs StepFrom(const mem::Op& op) {
  const A a = DecodeAttrs<A>(op);
  StepAttrs s{a.microbatch, a.chunk, a.slot};
  if constexpr (requires { a.peer; }) {
    s.peer = a.peer;
    s.group = a.group;
  }
  return s;
}

template <typename A>
void ReslotAs(mem::Op& op, int64_t slot) {
  A a = DecodeAttrs<A>(op);
  a.slot = slot;
  EncodeAttrs(a, op.ints, op.floats);
}

}  // namespace

StepAttrs DecodeStepAttrs(const mem::Op& op) {
  switch (op.kind) {
    case OpKind::Forward:
      return StepFrom<attrs::Forward>(op);
    case OpKind::Backward:
      return StepFrom<attrs::Backward>(op);
    case OpKind::SendActivation:
      return StepFrom<attrs::SendActivation>(op);
    case OpKind::RecvActivation:
      return StepFrom<attrs::RecvActivation>(op);
    case OpKind::SendGrad:
      return StepFrom<attrs::SendGrad>(op);
    case OpKind::RecvGrad:
      return StepFrom<attrs::RecvGrad>(op);
    default:
      return {};
  }
}

void SetStepSlot(mem::Op& op, int64_t slot) {
  switch (op.kind) {
    case OpKind::Forward:
      return ReslotAs<attrs::Forward>(op, slot);
    case OpKind::Backward:
      return ReslotAs<attrs::Backward>(op, slot);
    case OpKind::SendActivation:
      return ReslotAs<attrs::SendActivation>(op, slot);
    case OpKind::RecvActivation:
      return ReslotAs<attrs::RecvActivation>(op, slot);
    case OpKind::SendGrad:
      return ReslotAs<attrs::SendGrad>(op, slot);
    case OpKind::RecvGrad:
      return ReslotAs<attrs::RecvGrad>(op, slot);
    default:
      return;
  }
}

int64_t StepBody(const mem::Op& op) {
  switch (op.kind) {
    case OpKind::ZeroGrads:
      return DecodeAttrs<attrs::ZeroGrads>(op).body;
    case OpKind::ReduceGrads:
      return DecodeAttrs<attrs::ReduceGrads>(op).body;
    case OpKind::OptimizerStep:
      return DecodeAttrs<attrs::OptimizerStep>(op).body;
    case OpKind::GatherParams:
      return DecodeAttrs<attrs::GatherParams>(op).body;
    default:
      return -1;
  }
}

}  // namespace paraplan::prog
