// Plan assembly: evaluates every canonical path of a plan into a Plan with origins, checks
// that every member names a real field, and runs the `require` rules.
#include <fmt/format.h>

#include "compiler/ast/names.h"
#include "compiler/check/eval_internal.h"

namespace paraplan::eval {
namespace {

// Stores an evaluated (already coerced) value into the plan; returns what went wrong.
std::string Store(Plan& plan, const FieldInfo& f, const Value& v) {
  switch (v.type) {
    case VType::kInt:
      return SetFieldValue(plan, f, v.i);
    case VType::kReal:
      return SetFieldValue(plan, f, v.r);
    case VType::kBool:
      return SetFieldValue(plan, f, v.b);
    case VType::kString:
      if (f.nullable && v.s == "none") {
        ClearField(plan, f);
        return {};
      }
      return SetFieldValue(plan, f, v.s);
    case VType::kList: {
      std::vector<int64_t> items;
      for (const Value& x : *v.list) items.push_back(x.i);
      return SetFieldList(plan, f, items);
    }
    default:
      return "has no value";
  }
}

}  // namespace

void Evaluator::ForEachPlanRecord(Record* r, const std::function<void(Record*)>& fn) {
  fn(r);
  for (Slot& s : r->slots) {
    if (s.state == Slot::kDone && s.value.type == VType::kRecord && s.value.rec->parent == r) {
      ForEachPlanRecord(s.value.rec, fn);
    }
  }
}

std::optional<Plan> Evaluator::EvaluatePlan(const ast::Decl& decl,
                                            std::span<const SetOverride> sets) {
  Record* base = DeclRecord(decl);
  Record* root = NewRecord(Kind::kPlan, decl.name.text, decl.name.range);
  root->entries = base->entries;
  const Scope* body = src_.ScopeOf(decl.body.get());
  for (const SetOverride& s : sets) {
    if (s.member) AddEntry(root, s.member, 0, body);
  }
  root->in_plan = true;

  Plan plan;
  plan.name = decl.name.text;
  plan.declaration = decl.name.range;
  for (const FieldInfo& f : PlanFields()) {
    Record* rec = root;
    std::string_view rest = f.path;
    bool reachable = true;
    for (size_t dot; (dot = rest.find('.')) != std::string_view::npos;
         rest = rest.substr(dot + 1)) {
      Value v = Field(rec, SchemaOf(rec->kind).Find(rest.substr(0, dot)), {});
      if (v.IsError()) {
        reachable = false;
        break;
      }
      rec = v.rec;
    }
    if (!reachable) {
      plan.poisoned.insert(f.id());
      continue;
    }
    int idx = SchemaOf(rec->kind).Find(rest);
    Value v = Field(rec, idx, {});
    plan.origins[f.id()] = rec->slots[idx].origin;
    if (v.IsError()) {
      plan.poisoned.insert(f.id());
      continue;
    }
    if (std::string err = Store(plan, f, v); !err.empty()) {
      Report(Diag(DiagKind::kValueOutOfRange, fmt::format("`{}` {}", f.path, err))
                 .At(rec->slots[idx].origin.range, "this value"));
      plan.poisoned.insert(f.id());
    }
  }
  // Record names and the origins of record-valued paths.
  const Schema& ps = SchemaOf(Kind::kPlan);
  for (FieldId record : {fields::kModel, fields::kCluster}) {
    int idx = ps.Find(record.path);
    Value v = Field(root, idx, {});
    plan.origins[record] = root->slots[idx].origin;
    if (v.IsError()) {
      plan.poisoned.insert(record);
      continue;
    }
    if (v.rec->kind == Kind::kModel) {
      plan.model.name = v.rec->name;
    } else {
      plan.cluster.name = v.rec->name;
      int g = SchemaOf(Kind::kCluster).Find("gpu");
      Value gpu = Field(v.rec, g, {});
      plan.origins[fields::kClusterGpu] = v.rec->slots[g].origin;
      if (gpu.IsError()) {
        plan.poisoned.insert(fields::kClusterGpu);
      } else {
        plan.cluster.gpu.name = gpu.rec->name;
      }
    }
  }
  ForEachPlanRecord(root, [&](Record* r) { Validate(r); });
  ForEachPlanRecord(root, [&](Record* r) { CheckRequires(r, &plan); });
  plan.sweeps = sweeps_;
  return plan;
}

int Evaluator::EvaluateEverything() {
  int count = 0;
  for (const ModuleData& m : src_.modules) {
    if (!m.ast) continue;
    for (const ast::Decl& d : m.ast->decls) {
      if (d.kind == ast::DeclKind::kLet) continue;
      ++count;
      if (d.kind == ast::DeclKind::kPlan) {
        EvaluatePlan(d, {});
        continue;
      }
      Record* base = DeclRecord(d);
      Record* r = NewRecord(base->kind, base->name, base->declared);
      r->entries = base->entries;
      std::function<void(Record*)> all_fields = [&](Record* rec) {
        for (size_t i = 0; i < rec->slots.size(); ++i) {
          Value v = Field(rec, static_cast<int>(i), {});
          if (v.type == VType::kRecord && v.rec->parent == rec) all_fields(v.rec);
        }
      };
      all_fields(r);
      ForEachPlanRecord(r, [&](Record* x) { Validate(x); });
      ForEachPlanRecord(r, [&](Record* x) { CheckRequires(x, nullptr); });
    }
  }
  return count;
}

void Evaluator::Validate(Record* r) {
  const Schema& sc = SchemaOf(r->kind);
  for (const Entry& en : r->entries) {
    const ast::Member* m = en.member;
    if (m->kind != ast::MemberKind::kAssign && m->kind != ast::MemberKind::kAmend) continue;
    if (m->path.size() <= en.depth || !validated_.insert({m, en.depth}).second) continue;
    const ast::Name& name = m->path[en.depth];
    bool from_set = sm_.Kind(name.range.buffer) == BufferKind::kCommandLine;
    int idx = sc.Find(name.text);
    std::string where = r->in_plan && !r->prefix.empty()
                            ? fmt::format("`{}`", r->prefix.substr(0, r->prefix.size() - 1))
                            : fmt::format("a `{}`", KindName(r->kind));
    if (idx < 0) {
      Diag d(DiagKind::kUnknownField,
             from_set ? fmt::format(
                            "unknown field `{}` in `--set`",
                            Text(m->path.front().range.buffer == name.range.buffer
                                     ? SourceRange{name.range.buffer, m->path.front().range.begin,
                                                   m->path.back().range.end}
                                     : name.range))
                      : fmt::format("{} has no field `{}`", where, name.text));
      d.At(name.range, "unknown field");
      std::string guess = ast::ClosestName(name.text, sc.Names());
      if (!guess.empty()) {
        d.Help(fmt::format("did you mean `{}{}`?", r->in_plan ? r->prefix : "", guess));
      } else if (r->kind == Kind::kPlan) {
        // `tp = 4` at the top of a plan: name the block it belongs to.
        for (const FieldInfo& f : PlanFields()) {
          std::string_view p = f.path;
          if (p.size() > name.text.size() && p.substr(p.size() - name.text.size()) == name.text &&
              p[p.size() - name.text.size() - 1] == '.' &&
              p.find('.') == p.size() - name.text.size() - 1) {
            d.Help(fmt::format("did you mean `{}`?", p));
            break;
          }
        }
      }
      std::string names;
      for (const SchemaField& f : sc.fields) names += (names.empty() ? "" : " ") + f.name;
      d.Note(fmt::format("the fields of {} are: {}", where, names));
      Report(std::move(d));
      continue;
    }
    const SchemaField& f = sc.fields[idx];
    if (f.sub_kind < 0 && (m->path.size() > en.depth + 1 || m->kind == ast::MemberKind::kAmend)) {
      SourceRange at =
          m->path.size() > en.depth + 1 ? m->path[en.depth + 1].range : m->block->range;
      Report(Diag(DiagKind::kUnknownField,
                  fmt::format("`{}` is a value, not a record with fields", PathOf(r, f.name)))
                 .At(at, "no fields here"));
    }
  }
}

std::string Evaluator::CanonicalPathOf(const ast::Expr& e, const Scope* scope, Record* self) {
  if (e.kind != ast::ExprKind::kPath || e.block) return {};
  for (const Scope* s = scope; s; s = s->parent) {
    if (s->lets.count(e.path[0].text)) return {};
  }
  Record* r = self;
  int idx = -1;
  for (; r; r = r->parent) {
    idx = SchemaOf(r->kind).Find(e.path[0].text);
    if (idx >= 0) break;
  }
  if (!r) return {};
  for (size_t i = 1; i < e.path.size(); ++i) {
    if (SchemaOf(r->kind).fields[idx].sub_kind < 0) return {};
    Value v = Field(r, idx, {});
    if (v.type != VType::kRecord) return {};
    r = v.rec;
    idx = SchemaOf(r->kind).Find(e.path[i].text);
    if (idx < 0) return {};
  }
  if (!r->in_plan || SchemaOf(r->kind).fields[idx].sub_kind >= 0) return {};
  return r->prefix + e.path.back().text;
}

void Evaluator::CheckRequires(Record* r, const Plan* plan) {
  for (const Entry& en : r->entries) {
    const ast::Member* m = en.member;
    if (m->kind != ast::MemberKind::kRequire) continue;
    const ast::Expr& e = *m->value;
    Value v = Eval(e, en.scope, r);
    if (v.IsError()) continue;
    if (v.type != VType::kBool) {
      Report(Diag(DiagKind::kTypeMismatch,
                  fmt::format("`require` needs a condition, got {}", Describe(v)))
                 .At(e.range, fmt::format("this is {}", Format(v))));
      continue;
    }
    if (v.b) continue;
    Diag d(DiagKind::kRequireFailed,
           m->message.empty() ? fmt::format("requirement `{}` does not hold", Text(e.range))
                              : fmt::format("requirement failed: {}", m->message));
    bool compare =
        e.kind == ast::ExprKind::kBinary && (e.text == "==" || e.text == "!=" || e.text == "<" ||
                                             e.text == "<=" || e.text == ">" || e.text == ">=");
    if (compare) {
      Value a = Eval(*e.operands[0], en.scope, r);
      Value b = Eval(*e.operands[1], en.scope, r);
      d.At(e.range, fmt::format("{} {} {} is false", Format(a), e.text, Format(b)));
      for (int i = 0; i < 2; ++i) {
        const ast::Expr& side = *e.operands[i];
        const Value& val = i == 0 ? a : b;
        d.Value(Text(side.range), Format(val));
        std::string path = CanonicalPathOf(side, en.scope, r);
        if (path.empty() || !plan) continue;
        const FieldOrigin* found = plan->origins.FindPath(path);
        static const FieldOrigin kNone;
        const FieldOrigin& o = found ? *found : kNone;
        if (o.kind == OriginKind::kAuto || o.kind == OriginKind::kDerived) {
          if (!o.derivation.empty()) d.Value(path, o.derivation);
        }
        if (o.range.IsValid() && !(o.range.buffer == e.range.buffer &&
                                   o.range.begin >= e.range.begin && o.range.end <= e.range.end)) {
          d.Label(o.range,
                  fmt::format("`{}` = {} {}", path, Format(val),
                              o.kind == OriginKind::kCommandLine ? "set on the command line"
                              : o.kind == OriginKind::kStdlib    ? "from the stdlib"
                                                                 : "set here"));
        }
      }
    } else {
      d.At(e.range, "this is false");
    }
    Report(std::move(d));
  }
}

std::optional<Plan> EvaluatePlanDecl(const SourceData& src, const SourceManager& sm,
                                     const ast::Decl& decl, std::span<const SetOverride> sets,
                                     const EvalOptions& options, DiagnosticSink& sink) {
  Evaluator ev(src, sm, options, sink);
  return ev.EvaluatePlan(decl, sets);
}

int EvaluateEveryRecord(const SourceData& src, const SourceManager& sm, DiagnosticSink& sink) {
  EvalOptions options;
  Evaluator ev(src, sm, options, sink);
  return ev.EvaluateEverything();
}

}  // namespace paraplan::eval
