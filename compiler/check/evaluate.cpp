// The evaluator: records, fields, names and expressions (see evaluate.h for the language
// semantics and eval_internal.h for the data). Loading lives in plan_source.cpp.
#include "compiler/check/evaluate.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <tuple>

#include "compiler/ast/names.h"
#include "compiler/base/checked.h"
#include "compiler/check/eval_internal.h"

namespace paraplan::eval {

// --- Kinds and schemas ---------------------------------------------------------------------

std::string_view KindName(Kind k) {
  static constexpr std::string_view kNames[] = {
      "gpu",   "cluster", "model",           "plan",        "parallel", "pipeline", "optimizer",
      "batch", "train",   "mixed_precision", "activations", "fsdp",     "moe"};
  return kNames[static_cast<int>(k)];
}

int Schema::Find(std::string_view name) const {
  for (size_t i = 0; i < fields.size(); ++i) {
    if (fields[i].name == name) return static_cast<int>(i);
  }
  return -1;
}

std::vector<std::string_view> Schema::Names() const {
  std::vector<std::string_view> out;
  for (const SchemaField& f : fields) out.push_back(f.name);
  return out;
}

namespace {

std::vector<Schema> BuildSchemas() {
  std::vector<Schema> s(kKindCount);
  const std::pair<Kind, std::string> prefixes[] = {{Kind::kGpu, "cluster.gpu."},
                                                   {Kind::kCluster, "cluster."},
                                                   {Kind::kModel, "model."},
                                                   {Kind::kPlan, ""},
                                                   {Kind::kParallel, "parallel."},
                                                   {Kind::kPipeline, "pipeline."},
                                                   {Kind::kOptimizer, "optimizer."},
                                                   {Kind::kBatch, "batch."},
                                                   {Kind::kTrain, "train."},
                                                   {Kind::kMixedPrecision, "mixed_precision."},
                                                   {Kind::kActivations, "activations."},
                                                   {Kind::kFsdp, "fsdp."},
                                                   {Kind::kMoe, "moe."}};
  for (const auto& [kind, prefix] : prefixes) {
    Schema& sc = s[static_cast<int>(kind)];
    sc.kind = kind;
    sc.prefix = prefix;
    for (const FieldInfo& f : PlanFields()) {
      if (f.path.substr(0, prefix.size()) != prefix) continue;
      std::string_view rest = f.path.substr(prefix.size());
      if (rest.find('.') != std::string_view::npos) continue;
      sc.fields.push_back({std::string(rest), &f, -1, false});
    }
  }
  auto sub = [&](Kind in, std::string name, Kind kind, bool required) {
    Schema& sc = s[static_cast<int>(in)];
    sc.fields.insert(sc.fields.begin(),
                     {std::move(name), nullptr, static_cast<int>(kind), required});
  };
  sub(Kind::kCluster, "gpu", Kind::kGpu, true);
  for (auto [name, kind] : {std::pair{"moe", Kind::kMoe},
                            {"fsdp", Kind::kFsdp},
                            {"activations", Kind::kActivations},
                            {"mixed_precision", Kind::kMixedPrecision},
                            {"train", Kind::kTrain},
                            {"batch", Kind::kBatch},
                            {"optimizer", Kind::kOptimizer},
                            {"pipeline", Kind::kPipeline},
                            {"parallel", Kind::kParallel}}) {
    sub(Kind::kPlan, name, kind, false);
  }
  sub(Kind::kPlan, "cluster", Kind::kCluster, true);
  sub(Kind::kPlan, "model", Kind::kModel, true);
  auto require = [&](Kind k, std::initializer_list<const char*> names) {
    Schema& sc = s[static_cast<int>(k)];
    for (const char* n : names) sc.fields[sc.Find(n)].required = true;
  };
  require(Kind::kModel, {"layers", "hidden", "heads", "vocab", "seq_len"});
  require(Kind::kGpu, {"memory", "peak_bf16", "hbm_bandwidth"});
  require(Kind::kCluster, {"nvlink_bandwidth", "network_bandwidth"});
  return s;
}

}  // namespace

const Schema& SchemaOf(Kind k) {
  static const std::vector<Schema> kSchemas = BuildSchemas();
  return kSchemas[static_cast<int>(k)];
}

// --- The evaluator -------------------------------------------------------------------------

namespace {

std::optional<UnitDimension> DimOf(FieldType t) {
  switch (t) {
    case FieldType::kBytes:
      return UnitDimension::kBytes;
    case FieldType::kBandwidth:
      return UnitDimension::kBandwidth;
    case FieldType::kFlops:
      return UnitDimension::kFlops;
    default:
      return std::nullopt;
  }
}

std::string DimWord(std::optional<UnitDimension> d) {
  if (!d) return "a plain number";
  switch (*d) {
    case UnitDimension::kBytes:
      return "bytes";
    case UnitDimension::kBandwidth:
      return "a bandwidth";
    case UnitDimension::kFlops:
      return "a compute rate";
    case UnitDimension::kTime:
      return "a time";
  }
  return "?";
}

bool IsAxis(const Record* r, std::string_view name) {
  return r->kind == Kind::kParallel && (name == "tp" || name == "pp" || name == "cp" ||
                                        name == "ep" || name == "etp" || name == "vpp");
}

constexpr int kMaxDepth = 200;

}  // namespace

// --- Records and fields --------------------------------------------------------------------

Record* Evaluator::DeclRecord(const ast::Decl& d) {
  if (auto it = decl_records_.find(&d); it != decl_records_.end()) {
    // Met again while its own base is being evaluated: `plan a extends b`, `plan b extends a`.
    if (d.base && busy_.count(&d)) {
      Report(Diag(DiagKind::kCyclicDefinition,
                  fmt::format("`{}` extends itself through `{}`", d.name.text, Text(d.base->range)))
                 .At(d.base->range, "the chain of `extends` comes back here")
                 .Note("a record cannot be derived from itself, directly or through others"));
    }
    return it->second;
  }
  Kind kind = d.kind == ast::DeclKind::kGpu       ? Kind::kGpu
              : d.kind == ast::DeclKind::kCluster ? Kind::kCluster
              : d.kind == ast::DeclKind::kModel   ? Kind::kModel
                                                  : Kind::kPlan;
  Record* r = NewRecord(kind, d.name.text, d.name.range);
  decl_records_[&d] = r;
  if (d.base) {
    if (!busy_.insert(&d).second) {
      Report(Diag(DiagKind::kCyclicDefinition,
                  fmt::format("`{}` extends itself through `{}`", d.name.text, Text(d.base->range)))
                 .At(d.base->range, "the chain of `extends` comes back here"));
    } else {
      Value base = Eval(*d.base, d.body ? src_.ScopeOf(d.body.get())->parent : nullptr, nullptr);
      busy_.erase(&d);
      if (base.type == VType::kRecord && base.rec->kind == kind) {
        r->entries = base.rec->entries;
      } else if (!base.IsError()) {
        Report(Diag(DiagKind::kTypeMismatch,
                    fmt::format("`{} {}` extends `{}`, which is {}", KindName(kind), d.name.text,
                                Text(d.base->range), Describe(base)))
                   .At(d.base->range, fmt::format("expected a `{}` record", KindName(kind))));
      }
    }
  }
  const Scope* body_scope = src_.ScopeOf(d.body.get());
  for (const ast::Member& m : d.body->members) AddEntry(r, &m, 0, body_scope);
  return r;
}

Value Evaluator::Field(Record* r, int idx, SourceRange use) {
  Slot& slot = r->slots[idx];
  if (slot.state == Slot::kDone) return slot.value;
  const SchemaField& f = SchemaOf(r->kind).fields[idx];
  if (slot.state == Slot::kBusy) {
    Report(
        Diag(DiagKind::kCyclicDefinition, fmt::format("`{}` depends on itself", PathOf(r, f.name)))
            .At(use, "this reads the field while its value is being computed")
            .Note("a field's value cannot depend on the field itself"));
    return Value::Error();
  }
  slot.state = Slot::kBusy;
  int k = -1;
  for (int e = static_cast<int>(r->entries.size()) - 1; e >= 0; --e) {
    const Entry& en = r->entries[e];
    const ast::Member* m = en.member;
    if (m->kind != ast::MemberKind::kAssign || m->path.size() != en.depth + 1) continue;
    if (en.field == idx) {
      k = e;
      break;
    }
  }
  FieldOrigin origin;
  Value v = f.sub_kind >= 0 ? RecordField(r, idx, k, &origin) : ScalarField(r, idx, k, &origin);
  Slot& done = r->slots[idx];
  done.value = std::move(v);
  done.origin = std::move(origin);
  done.state = Slot::kDone;
  return done.value;
}

Value Evaluator::RecordField(Record* r, int idx, int k, FieldOrigin* origin) {
  const SchemaField& f = SchemaOf(r->kind).fields[idx];
  const Kind sub = static_cast<Kind>(f.sub_kind);
  Record* base = nullptr;
  bool poisoned = false;
  if (k >= 0) {
    const Entry& en = r->entries[k];
    const ast::Expr& e = *en.member->value;
    int saved = expected_kind_;
    expected_kind_ = e.kind == ast::ExprKind::kPath ? f.sub_kind : -1;
    Value bv = Eval(e, en.scope, r);
    expected_kind_ = saved;
    *origin = {OriginOf(e.range), e.range, {}, {}};
    if (bv.IsError()) {
      poisoned = true;
    } else if (bv.type != VType::kRecord || bv.rec->kind != sub) {
      Report(
          Diag(DiagKind::kTypeMismatch, fmt::format("`{}` must be a `{}` record, not {}",
                                                    PathOf(r, f.name), KindName(sub), Describe(bv)))
              .At(e.range, bv.type == VType::kRecord
                               ? fmt::format("`{}` is a `{}`", Format(bv), KindName(bv.rec->kind))
                               : fmt::format("this is {}", Describe(bv))));
      poisoned = true;
    } else {
      base = bv.rec;
    }
  }
  Record* out =
      NewRecord(sub, base ? base->name : std::string(), base ? base->declared : origin->range);
  if (base) out->entries = base->entries;
  bool written = base != nullptr;
  for (size_t e = static_cast<size_t>(k) + 1; e < r->entries.size(); ++e) {
    const Entry& en = r->entries[e];
    const ast::Member* m = en.member;
    if (m->kind != ast::MemberKind::kAssign && m->kind != ast::MemberKind::kAmend) continue;
    if (en.field != idx) continue;
    if (m->path.size() > en.depth + 1) {
      AddEntry(out, m, en.depth + 1, en.scope);
    } else if (m->kind == ast::MemberKind::kAmend) {
      const Scope* bs = src_.ScopeOf(m->block.get());
      for (const ast::Member& mm : m->block->members) AddEntry(out, &mm, 0, bs);
    } else {
      continue;
    }
    if (!origin->range.IsValid()) *origin = {OriginOf(m->range), m->range, {}, {}};
    written = true;
  }
  out->parent = r;
  out->in_plan = r->in_plan;
  out->prefix = r->prefix + f.name + ".";
  if (poisoned) return Value::Error();
  if (!written && f.required) {
    Diag d(DiagKind::kMissingField, fmt::format("`{}` is not set", PathOf(r, f.name)));
    d.At(r->declared, fmt::format("this {} has no `{}`", KindName(r->kind), f.name));
    d.Help(fmt::format("write `{} = ...` in it, or derive it from a record that has one", f.name));
    Report(std::move(d));
    return Value::Error();
  }
  return Value::OfRecord(out);
}

Value Evaluator::ScalarField(Record* r, int idx, int k, FieldOrigin* origin) {
  const SchemaField& f = SchemaOf(r->kind).fields[idx];
  if (k < 0) return DefaultValue(r, idx, origin);
  const Entry& en = r->entries[k];
  const ast::Expr& e = *en.member->value;
  *origin = {OriginOf(e.range), e.range, {}, {}};
  Value v = Eval(e, en.scope, r, f.info);
  if (v.IsError()) return v;
  if (v.type == VType::kAuto) return AutoField(r, idx, e.range, origin);
  if (v.type == VType::kList && f.info->type != FieldType::kIntList) {
    return SweepField(r, idx, v, e, origin);
  }
  return Coerce(v, *f.info, e.range, PathOf(r, f.name));
}

Value Evaluator::DefaultValue(Record* r, int idx, FieldOrigin* origin) {
  const SchemaField& f = SchemaOf(r->kind).fields[idx];
  const Schema& sc = SchemaOf(r->kind);
  auto derived = [&](std::string_view from, std::string derivation) {
    *origin = {OriginKind::kDerived,
               r->slots[sc.Find(from)].origin.range,
               {PathOf(r, from)},
               std::move(derivation)};
  };
  if (r->kind == Kind::kParallel && f.name == "etp") {
    Value tp = Field(r, sc.Find("tp"), {});
    derived("tp", fmt::format("etp = tp = {}", Format(tp)));
    return tp;
  }
  if (r->kind == Kind::kParallel && f.name == "dp") return SolveDp(r, {}, origin);
  if (r->kind == Kind::kModel && f.name == "kv_heads") {
    Value heads = Field(r, sc.Find("heads"), {});
    derived("heads", fmt::format("kv_heads = heads = {}", Format(heads)));
    return heads;
  }
  if (r->kind == Kind::kModel && f.name == "head_dim") {
    Value hidden = Field(r, sc.Find("hidden"), {});
    Value heads = Field(r, sc.Find("heads"), {});
    if (hidden.IsError() || heads.IsError() || heads.i <= 0) return Value::Error();
    derived("hidden", hidden.i % heads.i == 0
                          ? fmt::format("head_dim = hidden / heads = {} / {} = {}", hidden.i,
                                        heads.i, hidden.i / heads.i)
                          : fmt::format("head_dim = hidden / heads = {} / {} is not whole",
                                        hidden.i, heads.i));
    origin->derived_from.push_back(PathOf(r, "heads"));
    // A remainder is the rules' to report (hidden-not-divisible-by-heads); keep the quotient.
    return Value::Int(std::max<int64_t>(1, hidden.i / heads.i));
  }
  if (r->kind == Kind::kModel && f.name == "ffn_hidden") {
    Value hidden = Field(r, sc.Find("hidden"), {});
    if (hidden.IsError()) return hidden;
    auto v = CheckedMul(4, hidden.i);
    if (!v) return Value::Error();
    derived("hidden", fmt::format("ffn_hidden = 4 · hidden = 4 · {} = {}", hidden.i, *v));
    return Value::Int(*v);
  }
  if (r->kind == Kind::kMixedPrecision && r->parent && r->parent->kind == Kind::kPlan &&
      f.name != "optimizer_state" && f.name != "fp8_params") {
    // Follows the `precision` shorthand of the plan (EffectiveMixedPrecision).
    const int pi = SchemaOf(Kind::kPlan).Find("precision");
    Value precision = Field(r->parent, pi, {});
    if (precision.IsError()) return precision;
    Plan probe;
    SetFieldValue(probe, *SchemaOf(Kind::kPlan).fields[pi].info, precision.s);
    const MixedPrecisionSpec mp = EffectiveMixedPrecision(probe);
    Value out;
    if (f.name == "params")
      out = Value::String(std::string(ToString(mp.params)));
    else if (f.name == "grads")
      out = Value::String(std::string(ToString(mp.grads)));
    else if (f.name == "fp8")
      out = Value::String(std::string(ToString(mp.fp8)));
    else
      out = Value::Bool(mp.main_params);
    out.enum_name = out.type == VType::kString;
    *origin = {OriginKind::kDerived,
               r->parent->slots[pi].origin.range,
               {std::string(fields::kPrecision.path)},
               fmt::format("{} follows precision = {}", f.name, precision.s)};
    return out;
  }
  if (r->kind == Kind::kGpu && f.name == "peak_fp16") {
    Value bf16 = Field(r, sc.Find("peak_bf16"), {});
    derived("peak_bf16", fmt::format("peak_fp16 = peak_bf16 = {}", Format(bf16)));
    return bf16;
  }
  if (f.required) {
    Diag d(DiagKind::kMissingField, fmt::format("`{}` is not set", PathOf(r, f.name)));
    d.At(r->declared, r->name.empty()
                          ? fmt::format("this {} has no `{}`", KindName(r->kind), f.name)
                          : fmt::format("{} `{}` has no `{}`", KindName(r->kind), r->name, f.name));
    d.Help(fmt::format("set it: `{} = ...`", f.name));
    Report(std::move(d));
    return Value::Error();
  }
  static const Plan kDefaults;
  FieldValue dv = GetFieldValue(kDefaults, *f.info);
  *origin = {};
  std::optional<UnitDimension> dim = DimOf(f.info->type);
  if (auto* i = std::get_if<int64_t>(&dv)) return Value::Int(*i, dim);
  if (auto* d = std::get_if<double>(&dv)) return Value::Real(*d, dim);
  if (auto* b = std::get_if<bool>(&dv)) return Value::Bool(*b);
  Value s = Value::String(std::get<std::string>(dv));
  if (f.info->type == FieldType::kIntList) {
    s = Value();
    s.type = VType::kList;
    s.list = std::make_shared<std::vector<Value>>();
  }
  s.enum_name = f.info->type == FieldType::kEnum || f.info->nullable;
  return s;
}

Value Evaluator::SolveDp(Record* parallel, SourceRange range, FieldOrigin* origin) {
  const Schema& sc = SchemaOf(Kind::kParallel);
  Value tp = Field(parallel, sc.Find("tp"), {});
  Value pp = Field(parallel, sc.Find("pp"), {});
  Value cp = Field(parallel, sc.Find("cp"), {});
  *origin = {OriginKind::kAuto, range, {}, {}};
  Record* plan = parallel->parent;
  if (!plan || plan->kind != Kind::kPlan) return Value::Error();
  Value cluster = Field(plan, SchemaOf(Kind::kPlan).Find("cluster"), {});
  if (cluster.IsError()) return Value::Error();
  const Schema& cs = SchemaOf(Kind::kCluster);
  Value nodes = Field(cluster.rec, cs.Find("nodes"), {});
  Value gpn = Field(cluster.rec, cs.Find("gpus_per_node"), {});
  std::string c = plan->in_plan ? "cluster." : "";
  std::string p = plan->in_plan ? "parallel." : "";
  origin->derived_from = {c + "nodes", c + "gpus_per_node", p + "tp", p + "pp", p + "cp"};
  if (tp.IsError() || pp.IsError() || cp.IsError() || nodes.IsError() || gpn.IsError()) {
    origin->derivation = "dp = world / (tp·pp·cp), with an input that failed";
    return Value::Error();
  }
  auto world = CheckedMul(nodes.i, gpn.i);
  auto denom = CheckedProduct({tp.i, pp.i, cp.i});
  if (!world || !denom || *denom <= 0) return Value::Error();
  std::string head =
      fmt::format("dp = world / (tp·pp·cp) = {} / ({}·{}·{})", *world, tp.i, pp.i, cp.i);
  if (*world % *denom != 0) {
    // Poisoned: the mesh rule reports it once, with this derivation.
    origin->derivation = fmt::format("{} = {} / {} is not whole", head, *world, *denom);
    return Value::Error();
  }
  origin->derivation = fmt::format("{} = {}", head, *world / *denom);
  return Value::Int(*world / *denom);
}

Value Evaluator::AutoField(Record* r, int idx, SourceRange range, FieldOrigin* origin) {
  const SchemaField& f = SchemaOf(r->kind).fields[idx];
  if (r->kind == Kind::kParallel && f.name == "dp") return SolveDp(r, range, origin);
  if (IsAxis(r, f.name) && options_.allow_sweeps && r->in_plan) {
    std::vector<int64_t> values = {1};
    if (Record* plan = r->parent) {
      Value cluster = Field(plan, SchemaOf(Kind::kPlan).Find("cluster"), {});
      if (!cluster.IsError()) {
        const Schema& cs = SchemaOf(Kind::kCluster);
        Value nodes = Field(cluster.rec, cs.Find("nodes"), {});
        Value gpn = Field(cluster.rec, cs.Find("gpus_per_node"), {});
        if (!nodes.IsError() && !gpn.IsError()) {
          if (auto world = CheckedMul(nodes.i, gpn.i)) values = Divisors(*world);
        }
      }
    }
    Sweep s{PathOf(r, f.name), {}, range};
    for (int64_t v : values) s.values.push_back(fmt::format("{}", v));
    sweeps_.push_back(std::move(s));
    origin->kind = OriginKind::kAuto;
    origin->derivation =
        fmt::format("{} = auto: searched over the divisors of the world size", f.name);
    return Value::Int(values.front());
  }
  Diag d(DiagKind::kAutoUnsupported, fmt::format("`{}` cannot be `auto` here", PathOf(r, f.name)));
  d.At(range, IsAxis(r, f.name) ? "an axis other than dp is solved only by `planc search`"
                                : "the compiler solves `auto` only for mesh axes");
  d.Note(
      "`planc check` solves `dp = auto` as world / (tp·pp·cp); `planc search` also "
      "enumerates tp, pp, cp, ep, etp and vpp");
  if (IsAxis(r, f.name))
    d.Help(fmt::format("give a value (`{} = 1`), or run `planc search`", f.name));
  Report(std::move(d));
  return Value::Error();
}

Value Evaluator::SweepField(Record* r, int idx, const Value& list, const ast::Expr& e,
                            FieldOrigin* origin) {
  const SchemaField& f = SchemaOf(r->kind).fields[idx];
  std::string path = PathOf(r, f.name);
  if (!options_.allow_sweeps || !r->in_plan) {
    Diag d(DiagKind::kSweepOutsideSearch,
           fmt::format("`{}` ranges over {} values; checking needs one", path, list.list->size()));
    d.At(e.range, "a list of candidates is a sweep for `planc search`");
    if (!list.list->empty()) {
      d.Help(fmt::format(
          "check one candidate with `--set {}={}`, or search them all with `planc search`", path,
          FormatForSet(list.list->front())));
    }
    Report(std::move(d));
    return Value::Error();
  }
  if (list.list->empty()) {
    Report(Diag(DiagKind::kTypeMismatch, fmt::format("`{}` ranges over an empty list", path))
               .At(e.range, "no candidate to search"));
    return Value::Error();
  }
  Sweep s{path, {}, e.range};
  Value first;
  for (size_t i = 0; i < list.list->size(); ++i) {
    const Value& item = (*list.list)[i];
    Value c = Coerce(item, *f.info,
                     e.operands.size() == list.list->size() ? e.operands[i]->range : e.range, path);
    if (c.IsError()) return c;
    if (i == 0) first = c;
    std::string text = FormatForSet(c);
    if (std::find(s.values.begin(), s.values.end(), text) != s.values.end()) {
      ++s.repeats;  // `[2, 2, 4]`: a repeated candidate is one candidate
      continue;
    }
    s.values.push_back(std::move(text));
  }
  sweeps_.push_back(std::move(s));
  origin->derivation = fmt::format("{} is swept over {}", f.name, Format(list));
  return first;
}

Value Evaluator::Coerce(const Value& v, const FieldInfo& info, SourceRange range,
                        const std::string& path) {
  if (v.IsError()) return v;
  const CoerceSite site{info, range, path};
  switch (info.type) {
    case FieldType::kInt:
    case FieldType::kBytes:
      return CoerceInt(v, site);
    case FieldType::kReal:
    case FieldType::kBandwidth:
    case FieldType::kFlops:
      return CoerceReal(v, site);
    case FieldType::kBool:
      if (v.type != VType::kBool) return TypeMismatch(v, site, "`true` or `false`");
      return v;
    case FieldType::kString:
      if (v.type != VType::kString) return TypeMismatch(v, site, "a string");
      return v;
    case FieldType::kEnum:
      return CoerceEnum(v, site);
    case FieldType::kIntList:
      return CoerceIntList(v, site);
  }
  return v;
}

Value Evaluator::TypeMismatch(const Value& v, const CoerceSite& site, const std::string& expected) {
  Report(
      Diag(DiagKind::kTypeMismatch,
           fmt::format("`{}` expects {}, got {}", site.path, expected, Describe(v)))
          .At(site.range, fmt::format("this is {}", Format(v).size() <= 40 ? "`" + Format(v) + "`"
                                                                           : Describe(v))));
  return Value::Error();
}

bool Evaluator::InIntRange(int64_t x, const CoerceSite& site) {
  const FieldInfo& info = site.info;
  if (x >= info.min && x <= info.max) return true;
  Diag d(DiagKind::kValueOutOfRange,
         fmt::format("`{}` must be {}, got {}", site.path,
                     info.max == INT64_MAX ? fmt::format("at least {}", info.min)
                                           : fmt::format("between {} and {}", info.min, info.max),
                     x));
  d.At(site.range, "out of range");
  if (info.max == INT64_MAX && info.min == 1) d.Note("sizes and counts start at 1");
  Report(std::move(d));
  return false;
}

bool Evaluator::UnitMatches(const Value& v, const CoerceSite& site) {
  const std::optional<UnitDimension> want = DimOf(site.info.type);
  if (!v.dim || v.dim == want) return true;
  Report(Diag(DiagKind::kUnitMismatch,
              fmt::format("`{}` expects {}, got {}", site.path, DimWord(want), DimWord(v.dim)))
             .At(site.range, fmt::format("this is {}", Format(v)))
             .Note("values of different dimensions never convert into each other"));
  return false;
}

Value Evaluator::CoerceInt(const Value& v, const CoerceSite& site) {
  const FieldInfo& info = site.info;
  if (info.nullable && v.type == VType::kString && v.s == "none") return v;
  const bool bytes = info.type == FieldType::kBytes;
  if (!v.IsNumber()) return TypeMismatch(v, site, bytes ? "a size in bytes" : "an integer");
  if (!UnitMatches(v, site)) return Value::Error();
  int64_t x;
  if (v.type == VType::kInt) {
    x = v.i;
  } else if (std::isfinite(v.r) && v.r == std::floor(v.r) && std::fabs(v.r) < 9.2e18) {
    x = static_cast<int64_t>(v.r);
  } else {
    return TypeMismatch(v, site, bytes ? "a whole number of bytes" : "an integer");
  }
  if (!InIntRange(x, site)) return Value::Error();
  return Value::Int(x, DimOf(info.type));
}

namespace {

// The interval a real field accepts, in words: "at least 0", "in (0, 1]".
// A real field's range, its bounds in the field's unit (FLOP/s, bytes/s) where it has one.
std::string RealRangeText(const FieldInfo& info) {
  const std::optional<UnitDimension> dim = DimOf(info.type);
  const auto bound = [&](double v) {
    return dim ? Format(Value::Real(v, dim)) : fmt::format("{}", v);
  };
  if (std::isinf(info.real_max)) {
    return fmt::format("{} {}", info.real_min_open ? "greater than" : "at least",
                       bound(info.real_min));
  }
  return fmt::format("in {}{}, {}{}", info.real_min_open ? "(" : "[", bound(info.real_min),
                     bound(info.real_max), info.real_max_open ? ")" : "]");
}

// An enum field's values joined by ", ", each between `quote`s.
std::string EnumValuesText(const FieldInfo& info, std::string_view quote) {
  std::string names;
  for (size_t i = 0; i < info.enum_values.size(); ++i) {
    if (i) names += ", ";
    names += fmt::format("{}{}{}", quote, info.enum_values[i], quote);
  }
  return names;
}

}  // namespace

Value Evaluator::CoerceReal(const Value& v, const CoerceSite& site) {
  const FieldInfo& info = site.info;
  const std::optional<UnitDimension> want = DimOf(info.type);
  if (!v.IsNumber()) return TypeMismatch(v, site, want ? DimWord(want) : "a number");
  if (!UnitMatches(v, site)) return Value::Error();
  const double x = v.AsReal();
  const bool low = info.real_min_open ? !(x > info.real_min) : !(x >= info.real_min);
  const bool high = info.real_max_open ? !(x < info.real_max) : !(x <= info.real_max);
  if (std::isfinite(x) && !low && !high) return Value::Real(x, want);
  Diag d(DiagKind::kValueOutOfRange,
         fmt::format("`{}` must be {}, got {}", site.path, RealRangeText(info), Format(v)));
  d.At(site.range, "out of range");
  if (want) {
    d.Note(
        "device rates run from 1 GFLOP/s or 1 MB/s (a CPU core's) to 10^18: a rate near zero "
        "would make every time estimate infinite");
  }
  Report(std::move(d));
  return Value::Error();
}

Value Evaluator::CoerceEnum(const Value& v, const CoerceSite& site) {
  const FieldInfo& info = site.info;
  if (v.type != VType::kString) return TypeMismatch(v, site, "one of " + EnumValuesText(info, ""));
  for (std::string_view name : info.enum_values) {
    if (name == v.s) {
      Value out = Value::String(v.s);
      out.enum_name = true;
      return out;
    }
  }
  Diag d(DiagKind::kUnknownEnumValue, fmt::format("`{}` is not a value of `{}`", v.s, site.path));
  d.At(site.range, "unknown value");
  d.Note(fmt::format("`{}` is one of {}", site.path, EnumValuesText(info, "`")));
  std::string guess = ast::ClosestName(v.s, info.enum_values);
  if (!guess.empty()) d.Help(fmt::format("did you mean `{}`?", guess));
  Report(std::move(d));
  return Value::Error();
}

Value Evaluator::CoerceIntList(const Value& v, const CoerceSite& site) {
  if (v.type != VType::kList) return TypeMismatch(v, site, "a list of integers");
  auto out = std::make_shared<std::vector<Value>>();
  for (const Value& item : *v.list) {
    if (item.IsError()) return item;
    if (item.type != VType::kInt || item.dim) {
      Report(
          Diag(DiagKind::kTypeMismatch, fmt::format("`{}` expects a list of integers, got {} in it",
                                                    site.path, Describe(item)))
              .At(site.range, fmt::format("`{}` is {}", Format(item), Describe(item))));
      return Value::Error();
    }
    if (!InIntRange(item.i, site)) return Value::Error();
    out->push_back(item);
  }
  Value l;
  l.type = VType::kList;
  l.list = std::move(out);
  return l;
}

}  // namespace paraplan::eval
