#include "compiler/plan/plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <deque>
#include <unordered_map>

#include "compiler/base/checked.h"

namespace paraplan {
namespace {

// How one field is stored in a Plan. Exactly one accessor is set, matching FieldInfo::type.
struct FieldAccess {
  int64_t* (*int_ref)(Plan&) = nullptr;
  std::optional<int64_t>* (*opt_int_ref)(Plan&) = nullptr;
  double* (*real_ref)(Plan&) = nullptr;
  bool* (*bool_ref)(Plan&) = nullptr;
  std::string* (*string_ref)(Plan&) = nullptr;
  std::vector<int64_t>* (*list_ref)(Plan&) = nullptr;
  // Enums: read and write the spelling's index in FieldInfo::enum_values.
  int (*enum_get)(const Plan&) = nullptr;
  void (*enum_set)(Plan&, int) = nullptr;
};

struct FieldTable {
  std::vector<FieldInfo> infos;
  std::vector<FieldAccess> access;
  std::unordered_map<std::string_view, uint16_t> by_path;
};

FieldInfo RealRange(FieldInfo f, double lo, bool lo_open, double hi, bool hi_open) {
  f.real_min = lo;
  f.real_min_open = lo_open;
  f.real_max = hi;
  f.real_max_open = hi_open;
  return f;
}
constexpr double kInf = std::numeric_limits<double>::infinity();

constexpr int64_t kMin = INT64_MIN;
constexpr int64_t kMax = INT64_MAX;

#define PLAN_INT(NAME, PATH, MEMBER, LO, HI, DOC) \
  add({PATH, FieldType::kInt, {}, DOC, LO, HI},   \
      {.int_ref = [](Plan& p) -> int64_t* { return &p.MEMBER; }});
#define PLAN_BYTES(NAME, PATH, MEMBER, LO, DOC)     \
  add({PATH, FieldType::kBytes, {}, DOC, LO, kMax}, \
      {.int_ref = [](Plan& p) -> int64_t* { return &p.MEMBER; }});
#define PLAN_OPT_INT(NAME, PATH, MEMBER, LO, DOC)       \
  add({PATH, FieldType::kInt, {}, DOC, LO, kMax, true}, \
      {.opt_int_ref = [](Plan& p) -> std::optional<int64_t>* { return &p.MEMBER; }});
#define PLAN_REAL_IN(NAME, PATH, TYPE, MEMBER, LO, LO_OPEN, HI, HI_OPEN, DOC) \
  add(RealRange({PATH, TYPE, {}, DOC}, LO, LO_OPEN, HI, HI_OPEN),             \
      {.real_ref = [](Plan& p) -> double* { return &p.MEMBER; }});
#define PLAN_BOOL(NAME, PATH, MEMBER, DOC) \
  add({PATH, FieldType::kBool, {}, DOC}, {.bool_ref = [](Plan& p) -> bool* { return &p.MEMBER; }});
#define PLAN_STRING(NAME, PATH, MEMBER, DOC) \
  add({PATH, FieldType::kString, {}, DOC},   \
      {.string_ref = [](Plan& p) -> std::string* { return &p.MEMBER; }});
#define PLAN_LIST(NAME, PATH, MEMBER, LO, DOC)        \
  add({PATH, FieldType::kIntList, {}, DOC, LO, kMax}, \
      {.list_ref = [](Plan& p) -> std::vector<int64_t>* { return &p.MEMBER; }});
#define PLAN_ENUM(NAME, PATH, ENUM, MEMBER, VALUES, DOC)                     \
  add({PATH, FieldType::kEnum, VALUES, DOC},                                 \
      {.enum_get = [](const Plan& p) { return static_cast<int>(p.MEMBER); }, \
       .enum_set = [](Plan& p, int v) { p.MEMBER = static_cast<ENUM>(v); }});

FieldTable BuildTable() {
  FieldTable t;
  auto add = [&t](FieldInfo info, FieldAccess access) {
    info.index = static_cast<uint16_t>(t.infos.size());
    t.infos.push_back(std::move(info));
    t.access.push_back(access);
  };
#include "compiler/plan/fields.def"
  for (const FieldInfo& f : t.infos) t.by_path.emplace(f.path, f.index);
  return t;
}

#undef PLAN_INT
#undef PLAN_BYTES
#undef PLAN_OPT_INT
#undef PLAN_REAL_IN
#undef PLAN_BOOL
#undef PLAN_STRING
#undef PLAN_LIST
#undef PLAN_ENUM

const FieldTable& Table() {
  static const FieldTable kTable = BuildTable();
  return kTable;
}

const FieldAccess& AccessOf(const FieldInfo& f) { return Table().access[f.index]; }

std::string_view TypeWord(FieldType t) {
  switch (t) {
    case FieldType::kInt:
      return "an integer";
    case FieldType::kReal:
      return "a number";
    case FieldType::kBool:
      return "a boolean";
    case FieldType::kString:
      return "a string";
    case FieldType::kEnum:
      return "one of its names";
    case FieldType::kIntList:
      return "a list of integers";
    case FieldType::kBytes:
      return "a size in bytes";
    case FieldType::kBandwidth:
      return "a bandwidth";
    case FieldType::kFlops:
      return "a compute rate";
  }
  return "a value";
}

std::string_view ValueWord(const FieldValue& v) {
  switch (v.index()) {
    case 0:
      return "an integer";
    case 1:
      return "a real number";
    case 2:
      return "a boolean";
    default:
      return "a string";
  }
}

std::string EnumChoices(const FieldInfo& f) {
  std::string out;
  for (size_t i = 0; i < f.enum_values.size(); ++i) {
    if (i) out += i + 1 == f.enum_values.size() ? " or " : ", ";
    out += fmt::format("`{}`", f.enum_values[i]);
  }
  return out;
}

std::string CheckRange(const FieldInfo& f, int64_t v) {
  if (v < f.min) return fmt::format("must be at least {}, got {}", f.min, v);
  if (v > f.max) return fmt::format("must be at most {}, got {}", f.max, v);
  return {};
}

std::string FormatReal(double v) {
  if (std::isfinite(v) && v == std::floor(v) && std::fabs(v) < 1e18) {
    return fmt::format("{}", static_cast<int64_t>(v));
  }
  return fmt::format("{}", v);
}

std::string FormatList(const std::vector<int64_t>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) out += ", ";
    out += fmt::format("{}", v[i]);
  }
  return out + "]";
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

std::optional<int64_t> ParseInt(std::string_view s) {
  int64_t v = 0;
  if (!s.empty() && s.front() == '+') s.remove_prefix(1);
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || ptr != s.data() + s.size() || s.empty()) return std::nullopt;
  return v;
}

std::optional<double> ParseReal(std::string_view s) {
  if (!s.empty() && s.front() == '+') s.remove_prefix(1);
  double v = 0;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || ptr != s.data() + s.size() || s.empty() || !std::isfinite(v)) {
    return std::nullopt;
  }
  return v;
}

// "80 GiB", "80GiB", "4": the number and the unit (empty when none).
void SplitUnit(std::string_view text, std::string_view* number, std::string_view* unit) {
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.' ||
                             text[i] == '+' || text[i] == '-' ||
                             ((text[i] == 'e' || text[i] == 'E') && i > 0 && i + 1 < text.size() &&
                              (std::isdigit(static_cast<unsigned char>(text[i + 1])) ||
                               text[i + 1] == '-' || text[i + 1] == '+')))) {
    ++i;
  }
  *number = Trim(text.substr(0, i));
  *unit = Trim(text.substr(i));
}

UnitDimension DimensionOf(FieldType t) {
  switch (t) {
    case FieldType::kBandwidth:
      return UnitDimension::kBandwidth;
    case FieldType::kFlops:
      return UnitDimension::kFlops;
    default:
      return UnitDimension::kBytes;
  }
}

// "80 GiB", "900 GB/s", "989 TFLOPS" or a bare number, in the field's canonical unit.
std::string ParseQuantity(const FieldInfo& f, std::string_view text, FieldValue* out) {
  std::string_view number, unit;
  SplitUnit(text, &number, &unit);
  auto v = ParseReal(number);
  if (!v) return fmt::format("expects {}, got `{}`", TypeWord(f.type), text);
  double scale = 1;
  if (!unit.empty()) {
    const UnitInfo* u = FindUnit(unit);
    if (!u) return fmt::format("`{}` is not a unit", unit);
    if (u->dimension != DimensionOf(f.type)) {
      return fmt::format("expects {}, got a {} (`{}`)", TypeWord(f.type), ToString(u->dimension),
                         unit);
    }
    scale = u->scale;
  }
  double value = *v * scale;
  if (f.type == FieldType::kBytes) {
    if (value != std::floor(value) || std::fabs(value) >= 9.2e18) {
      return fmt::format("expects a whole number of bytes, got `{}`", text);
    }
    *out = static_cast<int64_t>(value);
    return {};
  }
  *out = value;
  return {};
}

}  // namespace

// --- Units -----------------------------------------------------------------------------------

const std::vector<UnitInfo>& AllUnits() {
  static const std::vector<UnitInfo> kUnits = [] {
    std::vector<UnitInfo> u;
    using D = UnitDimension;
    const std::pair<std::string_view, double> decimal[] = {{"", 1},    {"K", 1e3},  {"M", 1e6},
                                                           {"G", 1e9}, {"T", 1e12}, {"P", 1e15}};
    const std::pair<std::string_view, double> binary[] = {{"Ki", 1024.0},
                                                          {"Mi", 1048576.0},
                                                          {"Gi", 1073741824.0},
                                                          {"Ti", 1099511627776.0},
                                                          {"Pi", 1125899906842624.0}};
    static std::deque<std::string> names;  // owns the spellings; a deque never moves them
    auto add = [&](std::string name, D d, double scale) {
      names.push_back(std::move(name));
      u.push_back({names.back(), d, scale});
    };
    for (auto [p, s] : decimal) add(fmt::format("{}B", p), D::kBytes, s);
    for (auto [p, s] : binary) add(fmt::format("{}B", p), D::kBytes, s);
    for (auto [p, s] : decimal) add(fmt::format("{}B/s", p), D::kBandwidth, s);
    for (auto [p, s] : binary) add(fmt::format("{}B/s", p), D::kBandwidth, s);
    for (auto [p, s] : decimal) {
      if (!p.empty()) add(fmt::format("{}b/s", p), D::kBandwidth, s / 8);
    }
    for (auto [p, s] : decimal) add(fmt::format("{}FLOPS", p), D::kFlops, s);
    add("s", D::kTime, 1);
    add("ms", D::kTime, 1e-3);
    add("us", D::kTime, 1e-6);
    add("ns", D::kTime, 1e-9);
    return u;
  }();
  return kUnits;
}

const UnitInfo* FindUnit(std::string_view name) {
  for (const UnitInfo& u : AllUnits()) {
    if (u.name == name) return &u;
  }
  return nullptr;
}

std::string_view ToString(UnitDimension d) {
  switch (d) {
    case UnitDimension::kBytes:
      return "bytes";
    case UnitDimension::kBandwidth:
      return "bandwidth";
    case UnitDimension::kFlops:
      return "compute";
    case UnitDimension::kTime:
      return "time";
  }
  return "?";
}

std::string_view ToString(OriginKind k) {
  switch (k) {
    case OriginKind::kDefault:
      return "default";
    case OriginKind::kFile:
      return "file";
    case OriginKind::kStdlib:
      return "stdlib";
    case OriginKind::kCommandLine:
      return "command line";
    case OriginKind::kAuto:
      return "auto";
    case OriginKind::kDerived:
      return "derived";
  }
  return "?";
}

// --- Plan ------------------------------------------------------------------------------------

int64_t Plan::Edp() const {
  auto denom = CheckedProduct({parallel.etp, parallel.ep, parallel.pp});
  int64_t world = 0;
  if (auto w = CheckedMul(cluster.nodes, cluster.gpus_per_node)) world = *w;
  if (!denom || *denom <= 0 || world <= 0 || world % *denom != 0) return 0;
  return world / *denom;
}

int64_t Plan::Microbatches() const {
  auto denom = CheckedMul(batch.micro, parallel.dp);
  if (!denom || *denom <= 0 || batch.global % *denom != 0) return 0;
  return batch.global / *denom;
}

const FieldOrigin& Plan::Origin(FieldId field) const {
  static const FieldOrigin kNone;
  const FieldOrigin* o = origins.Find(field);
  return o ? *o : kNone;
}

// --- Paths and origins -----------------------------------------------------------------------

const FieldInfo& FieldId::info() const { return PlanFields()[index]; }

std::optional<FieldId> FindPlanPath(std::string_view path) {
  if (const FieldInfo* f = FindPlanField(path)) return f->id();
  for (uint16_t i = fields::kFieldCount; i < fields::kPathCount; ++i) {
    if (fields::kPaths[i] == path) return FieldId(i, fields::kPaths[i]);
  }
  return std::nullopt;
}

FieldOrigin& PlanOrigins::operator[](FieldId field) {
  if (slots_.empty()) {
    slots_.resize(fields::kPathCount);
    recorded_.resize(fields::kPathCount);
  }
  recorded_[field.index] = true;
  return slots_[field.index];
}

FieldOrigin* PlanOrigins::Mutable(std::string_view path) {
  std::optional<FieldId> field = FindPlanPath(path);
  return field ? &(*this)[*field] : nullptr;
}

const FieldOrigin* PlanOrigins::Find(FieldId field) const {
  if (slots_.empty() || !recorded_[field.index]) return nullptr;
  return &slots_[field.index];
}

FieldOrigin& PlanOrigins::operator[](const FieldInfo& field) { return (*this)[field.id()]; }

const FieldOrigin* PlanOrigins::FindPath(std::string_view path) const {
  std::optional<FieldId> field = FindPlanPath(path);
  return field ? Find(*field) : nullptr;
}

size_t PlanOrigins::size() const {
  size_t n = 0;
  for (bool r : recorded_) n += r;
  return n;
}

// --- Field access ----------------------------------------------------------------------------

const std::vector<FieldInfo>& PlanFields() { return Table().infos; }

const FieldInfo* FindPlanField(std::string_view path) {
  const FieldTable& t = Table();
  auto it = t.by_path.find(path);
  return it == t.by_path.end() ? nullptr : &t.infos[it->second];
}

bool IsRecordPath(std::string_view path) {
  std::optional<FieldId> field = FindPlanPath(path);
  return field && field->IsRecord();
}

FieldValue GetFieldValue(const Plan& plan, const FieldInfo& f) {
  const FieldAccess& a = AccessOf(f);
  Plan& p = const_cast<Plan&>(plan);  // accessors only read here
  if (a.int_ref) return *a.int_ref(p);
  if (a.opt_int_ref) {
    const auto& v = *a.opt_int_ref(p);
    return v ? FieldValue(*v) : FieldValue(std::string("none"));
  }
  if (a.real_ref) return *a.real_ref(p);
  if (a.bool_ref) return *a.bool_ref(p);
  if (a.string_ref) return *a.string_ref(p);
  if (a.list_ref) return FormatList(*a.list_ref(p));
  int i = a.enum_get(plan);
  if (i < 0 || static_cast<size_t>(i) >= f.enum_values.size()) return std::string("?");
  return std::string(f.enum_values[i]);
}

std::string SetFieldValue(Plan& plan, const FieldInfo& f, const FieldValue& value) {
  const FieldAccess& a = AccessOf(f);
  if (a.int_ref || a.opt_int_ref) {
    int64_t v;
    if (const int64_t* i = std::get_if<int64_t>(&value)) {
      v = *i;
    } else if (const double* d = std::get_if<double>(&value);
               d && std::isfinite(*d) && *d == std::floor(*d) && std::fabs(*d) < 9.2e18) {
      v = static_cast<int64_t>(*d);
    } else if (const double* d = std::get_if<double>(&value)) {
      return fmt::format("expects {}, got {}",
                         f.type == FieldType::kBytes ? "a whole number of bytes" : "an integer",
                         FormatReal(*d));
    } else {
      return fmt::format("expects {}, got {}", TypeWord(f.type), ValueWord(value));
    }
    if (std::string e = CheckRange(f, v); !e.empty()) return e;
    if (a.int_ref) {
      *a.int_ref(plan) = v;
    } else {
      *a.opt_int_ref(plan) = v;
    }
    return {};
  }
  if (a.real_ref) {
    if (const double* d = std::get_if<double>(&value)) {
      *a.real_ref(plan) = *d;
    } else if (const int64_t* i = std::get_if<int64_t>(&value)) {
      *a.real_ref(plan) = static_cast<double>(*i);
    } else {
      return fmt::format("expects {}, got {}", TypeWord(f.type), ValueWord(value));
    }
    return {};
  }
  if (a.bool_ref) {
    const bool* b = std::get_if<bool>(&value);
    if (!b) return fmt::format("expects `true` or `false`, got {}", ValueWord(value));
    *a.bool_ref(plan) = *b;
    return {};
  }
  if (a.string_ref) {
    const std::string* s = std::get_if<std::string>(&value);
    if (!s) return fmt::format("expects a string, got {}", ValueWord(value));
    *a.string_ref(plan) = *s;
    return {};
  }
  if (a.list_ref) return fmt::format("expects a list of integers, got {}", ValueWord(value));
  const std::string* s = std::get_if<std::string>(&value);
  if (!s) return fmt::format("expects {}, got {}", EnumChoices(f), ValueWord(value));
  for (size_t i = 0; i < f.enum_values.size(); ++i) {
    if (f.enum_values[i] == *s) {
      a.enum_set(plan, static_cast<int>(i));
      return {};
    }
  }
  return fmt::format("expects {}, got `{}`", EnumChoices(f), *s);
}

std::string SetFieldList(Plan& plan, const FieldInfo& f, const std::vector<int64_t>& values) {
  const FieldAccess& a = AccessOf(f);
  if (!a.list_ref) return fmt::format("expects {}, got a list", TypeWord(f.type));
  for (int64_t v : values) {
    if (std::string e = CheckRange(f, v); !e.empty()) return "every element " + e;
  }
  *a.list_ref(plan) = values;
  return {};
}

bool ClearField(Plan& plan, const FieldInfo& f) {
  const FieldAccess& a = AccessOf(f);
  if (!a.opt_int_ref) return false;
  a.opt_int_ref(plan)->reset();
  return true;
}

std::optional<std::string> GetFieldText(const Plan& plan, std::string_view path) {
  if (path == "model") return plan.model.name;
  if (path == "cluster") return plan.cluster.name;
  if (path == "cluster.gpu") return plan.cluster.gpu.name;
  const FieldInfo* f = FindPlanField(path);
  if (!f) return std::nullopt;
  FieldValue v = GetFieldValue(plan, *f);
  if (const int64_t* i = std::get_if<int64_t>(&v)) return fmt::format("{}", *i);
  if (const double* d = std::get_if<double>(&v)) return FormatReal(*d);
  if (const bool* b = std::get_if<bool>(&v)) return std::string(*b ? "true" : "false");
  const std::string& s = std::get<std::string>(v);
  if (f->type == FieldType::kString) {
    // Quoted, so that SetFieldText (and --set) read it back as a string.
    std::string out = "\"";
    for (char c : s) {
      if (c == '"' || c == '\\') out += '\\';
      out += c;
    }
    return out + "\"";
  }
  return s;
}

std::string ParseFieldText(const FieldInfo& f, std::string_view raw, FieldValue* out) {
  std::string_view text = Trim(raw);
  if (text.empty()) return fmt::format("expects {}, got nothing", TypeWord(f.type));
  switch (f.type) {
    case FieldType::kInt: {
      auto v = ParseInt(text);
      if (!v) return fmt::format("expects an integer, got `{}`", text);
      *out = *v;
      return {};
    }
    case FieldType::kReal: {
      auto v = ParseReal(text);
      if (!v) return fmt::format("expects a number, got `{}`", text);
      *out = *v;
      return {};
    }
    case FieldType::kBool:
      if (text != "true" && text != "false") {
        return fmt::format("expects `true` or `false`, got `{}`", text);
      }
      *out = text == "true";
      return {};
    case FieldType::kString:
    case FieldType::kEnum: {
      std::string s(text);
      if (s.size() >= 2 && s.front() == '"' && s.back() == '"') {
        std::string unquoted;
        for (size_t i = 1; i + 1 < s.size(); ++i) {
          if (s[i] == '\\' && i + 2 < s.size()) ++i;
          unquoted += s[i];
        }
        s = std::move(unquoted);
      }
      *out = std::move(s);
      return {};
    }
    case FieldType::kIntList:
      return fmt::format("expects a list of integers such as `[2, 3]`, got `{}`", text);
    case FieldType::kBytes:
    case FieldType::kBandwidth:
    case FieldType::kFlops:
      return ParseQuantity(f, text, out);
  }
  return "unsupported field type";
}

std::string SetFieldText(Plan& plan, std::string_view path, std::string_view raw) {
  const FieldInfo* f = FindPlanField(path);
  if (!f) {
    if (IsRecordPath(path)) {
      return fmt::format("`{}` names a record; set its fields (`{}.…`) or derive it in the plan",
                         path, path);
    }
    return fmt::format("`{}` is not a field of a plan", path);
  }
  std::string_view text = Trim(raw);
  if (f->nullable && text == "none") {
    ClearField(plan, *f);
    return {};
  }
  if (f->type == FieldType::kIntList && !text.empty()) {
    if (text.front() != '[' || text.back() != ']') {
      return fmt::format("expects a list of integers such as `[2, 3]`, got `{}`", text);
    }
    std::vector<int64_t> values;
    std::string_view body = Trim(text.substr(1, text.size() - 2));
    while (!body.empty()) {
      size_t comma = body.find(',');
      std::string_view item = Trim(body.substr(0, comma));
      auto v = ParseInt(item);
      if (!v) return fmt::format("expects a list of integers, got `{}` in it", item);
      values.push_back(*v);
      if (comma == std::string_view::npos) break;
      body = Trim(body.substr(comma + 1));
    }
    return SetFieldList(plan, *f, values);
  }
  FieldValue value;
  if (std::string error = ParseFieldText(*f, text, &value); !error.empty()) return error;
  return SetFieldValue(plan, *f, value);
}

// --- Enums -----------------------------------------------------------------------------------

std::string_view ToString(Precision v) {
  switch (v) {
    case Precision::kBf16:
      return "bf16";
    case Precision::kFp16:
      return "fp16";
    case Precision::kFp32:
      return "fp32";
    case Precision::kFp8:
      return "fp8";
  }
  return "?";
}
std::string_view ToString(Recompute v) {
  switch (v) {
    case Recompute::kNone:
      return "none";
    case Recompute::kSelective:
      return "selective";
    case Recompute::kFull:
      return "full";
  }
  return "?";
}
std::string_view ToString(Schedule v) {
  switch (v) {
    case Schedule::kGpipe:
      return "gpipe";
    case Schedule::k1F1B:
      return "1f1b";
    case Schedule::kInterleaved1F1B:
      return "interleaved_1f1b";
  }
  return "?";
}
std::string_view ToString(Balance v) {
  switch (v) {
    case Balance::kEven:
      return "even";
    case Balance::kCost:
      return "cost";
    case Balance::kNanotron:
      return "nanotron";
  }
  return "even";
}
std::string_view ToString(OptimizerType v) { return v == OptimizerType::kAdamW ? "adamw" : "sgd"; }
std::string_view ToString(Offload v) { return v == Offload::kNone ? "none" : "cpu"; }
std::string_view ToString(Norm v) { return v == Norm::kRmsNorm ? "rmsnorm" : "layernorm"; }
std::string_view ToString(Activation v) {
  switch (v) {
    case Activation::kSwiGlu:
      return "swiglu";
    case Activation::kGelu:
      return "gelu";
    case Activation::kSquaredRelu:
      return "squared_relu";
  }
  return "?";
}
std::string_view ToString(ElementType v) {
  switch (v) {
    case ElementType::kFp32:
      return "fp32";
    case ElementType::kBf16:
      return "bf16";
    case ElementType::kFp16:
      return "fp16";
    case ElementType::kFp8:
      return "fp8";
  }
  return "?";
}
std::string_view ToString(Fp8Recipe v) {
  switch (v) {
    case Fp8Recipe::kNone:
      return "none";
    case Fp8Recipe::kDelayed:
      return "delayed";
    case Fp8Recipe::kCurrent:
      return "current";
    case Fp8Recipe::kBlockwise:
      return "blockwise";
    case Fp8Recipe::kMxfp8:
      return "mxfp8";
    case Fp8Recipe::kRowwise:
      return "rowwise";
  }
  return "?";
}
std::string_view ToString(RecomputeMethod v) {
  return v == RecomputeMethod::kUniform ? "uniform" : "block";
}
std::string_view ToString(RouterScore v) {
  return v == RouterScore::kSoftmax ? "softmax" : "sigmoid";
}
std::string_view ToString(DropPolicy v) { return v == DropPolicy::kProbs ? "probs" : "position"; }
std::string_view ToString(Dispatcher v) {
  switch (v) {
    case Dispatcher::kAllToAll:
      return "alltoall";
    case Dispatcher::kAllGather:
      return "allgather";
    case Dispatcher::kFlex:
      return "flex";
  }
  return "?";
}

// --- Records that follow shorthands ----------------------------------------------------------

const std::vector<std::string_view>& RecomputeModuleNames() {
  static const std::vector<std::string_view> kNames = {
      "core_attn", "mlp", "moe_act", "layernorm", "mla_up_proj", "moe", "shared_experts"};
  return kNames;
}

std::optional<uint32_t> ParseRecomputeModules(std::string_view text, std::string* bad) {
  uint32_t bits = 0;
  size_t i = 0;
  while (i < text.size()) {
    while (i < text.size() && (text[i] == ',' || text[i] == ' ' || text[i] == '\t')) ++i;
    size_t j = i;
    while (j < text.size() && text[j] != ',' && text[j] != ' ' && text[j] != '\t') ++j;
    if (j == i) break;
    std::string_view name = text.substr(i, j - i);
    const auto& names = RecomputeModuleNames();
    auto it = std::find(names.begin(), names.end(), name);
    if (it == names.end()) {
      if (bad) *bad = std::string(name);
      return std::nullopt;
    }
    bits |= 1u << (it - names.begin());
    i = j;
  }
  return bits;
}

namespace {

// A field keeps its stored value when the plan wrote it; otherwise it follows its shorthand.
bool Written(const Plan& plan, FieldId field) {
  const OriginKind k = plan.Origin(field).kind;
  return k == OriginKind::kFile || k == OriginKind::kStdlib || k == OriginKind::kCommandLine;
}

}  // namespace

MixedPrecisionSpec EffectiveMixedPrecision(const Plan& plan) {
  MixedPrecisionSpec out = plan.mixed_precision;
  const Precision p = plan.precision;
  if (!Written(plan, fields::kMixedPrecisionParams))
    out.params = p == Precision::kFp32   ? ElementType::kFp32
                 : p == Precision::kFp16 ? ElementType::kFp16
                                         : ElementType::kBf16;
  if (!Written(plan, fields::kMixedPrecisionGrads))
    out.grads = p == Precision::kFp16 ? ElementType::kFp16 : ElementType::kFp32;
  if (!Written(plan, fields::kMixedPrecisionMainParams)) out.main_params = p != Precision::kFp32;
  if (!Written(plan, fields::kMixedPrecisionFp8))
    out.fp8 = p == Precision::kFp8 ? Fp8Recipe::kDelayed : Fp8Recipe::kNone;
  return out;
}

uint32_t EffectiveRecomputeModules(const Plan& plan) {
  if (plan.recompute != Recompute::kSelective) return 0;
  auto bits = ParseRecomputeModules(plan.activations.recompute_modules);
  if (!bits || *bits == 0) return kRecomputeCoreAttn;
  return *bits;
}

uint32_t LoweredRecomputeModules(const Plan& plan) {
  uint32_t modules = EffectiveRecomputeModules(plan);
  if (modules & kRecomputeMoe) modules &= ~(kRecomputeMoeAct | kRecomputeSharedExperts);
  return modules;
}

double StatedMoeImbalance(const Plan& plan) {
  return Written(plan, fields::kMoeImbalance) ? std::max(1.0, plan.moe.imbalance) : 0;
}

int64_t ShardGroup(const Plan& plan) {
  if (plan.fsdp.shard > 0) return plan.fsdp.shard;
  auto group =
      CheckedMul(std::max<int64_t>(1, plan.parallel.dp), std::max<int64_t>(1, plan.parallel.cp));
  if (!group) return 1;
  return std::max<int64_t>(1, *group / std::max<int64_t>(1, plan.fsdp.replicate));
}

bool UsesFp8(const Plan& plan) {
  return plan.precision == Precision::kFp8 && EffectiveMixedPrecision(plan).fp8 != Fp8Recipe::kNone;
}

bool IdleFp8Recipe(const Plan& plan) {
  return plan.precision != Precision::kFp8 && EffectiveMixedPrecision(plan).fp8 != Fp8Recipe::kNone;
}

bool IsMoeLayer(const ModelSpec& m, int64_t index) {
  if (!m.IsMoe() || index < m.dense_layers) return false;
  return (index - m.dense_layers) % std::max<int64_t>(1, m.moe_layer_freq) == 0;
}
int64_t ExpertCapacity(int64_t rows, int64_t topk, int64_t experts, double factor) {
  if (factor <= 0 || experts <= 0) return 0;
  // A token reaches an expert at most once, so no expert receives more than `rows` pairs: a
  // larger capacity drops nothing, and is held at `rows` (a factor of 1e12 would otherwise ask
  // for buffers of 10^13 rows).
  const double capacity = std::ceil(static_cast<double>(rows) * static_cast<double>(topk) /
                                    static_cast<double>(experts) * factor);
  return capacity >= static_cast<double>(rows) ? rows : static_cast<int64_t>(capacity);
}
std::string_view ToString(Position v) { return v == Position::kRope ? "rope" : "learned"; }
std::string_view ToString(Framework v) {
  switch (v) {
    case Framework::kParaplan:
      return "paraplan";
    case Framework::kMegatronCore:
      return "megatron_core";
    case Framework::kTorchtitan:
      return "torchtitan";
    case Framework::kDeepSpeed:
      return "deepspeed";
    case Framework::kLlmFoundry:
      return "llm_foundry";
    case Framework::kMegatronLm2021:
      return "megatron_lm_2021";
  }
  return "?";
}

// --- Dump and verifier -----------------------------------------------------------------------

std::string PrintPlan(const Plan& plan) {
  std::string out = fmt::format("plan {}\n", plan.name);
  auto line = [&](FieldId field, const std::string& value) {
    const FieldOrigin& o = plan.Origin(field);
    std::string origin(ToString(o.kind));
    if (!o.derivation.empty()) origin += ": " + o.derivation;
    out += fmt::format("  {:<34} = {:<24} # {}{}\n", field.path, value, origin,
                       plan.IsPoisoned(field) ? " (poisoned)" : "");
  };
  line(fields::kModel, plan.model.name);
  line(fields::kCluster, plan.cluster.name);
  line(fields::kClusterGpu, plan.cluster.gpu.name);
  for (const FieldInfo& f : PlanFields()) line(f.id(), *GetFieldText(plan, f.path));
  out += fmt::format("  world = {}, edp = {}, microbatches = {}\n", plan.World(), plan.Edp(),
                     plan.Microbatches());
  for (const Sweep& s : plan.sweeps) {
    out += fmt::format("  sweep {} over [", s.path);
    for (size_t i = 0; i < s.values.size(); ++i) out += (i ? ", " : "") + s.values[i];
    out += "]\n";
  }
  return out;
}

std::vector<std::string> VerifyPlan(const Plan& plan) {
  std::vector<std::string> problems;
  for (const FieldInfo& f : PlanFields()) {
    if (plan.IsPoisoned(f.id())) continue;
    FieldValue v = GetFieldValue(plan, f);
    if (const int64_t* i = std::get_if<int64_t>(&v)) {
      if (std::string e = CheckRange(f, *i); !e.empty()) {
        problems.push_back(fmt::format("`{}` {}", f.path, e));
      }
    }
  }
  for (int64_t l : plan.pipeline.stage_layers) {
    if (l < 0) problems.push_back(fmt::format("`pipeline.stage_layers` holds {} < 0", l));
  }
  if (!CheckedMul(plan.cluster.nodes, plan.cluster.gpus_per_node)) {
    problems.push_back("world size overflows 64 bits");
  }
  if (plan.model.name.empty()) problems.push_back("the plan has no model");
  if (plan.cluster.name.empty()) problems.push_back("the plan has no cluster");
  if (plan.model.kv_heads > plan.model.heads && plan.model.heads > 0) {
    problems.push_back(fmt::format("`model.kv_heads` = {} > `model.heads` = {}",
                                   plan.model.kv_heads, plan.model.heads));
  }
  return problems;
}

}  // namespace paraplan
