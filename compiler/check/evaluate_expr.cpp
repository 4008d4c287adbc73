// Expressions: names, member access, derivation, literals with units, arithmetic with
// overflow and dimension checks, comparisons, logic and the built-in functions.
#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "compiler/ast/names.h"
#include "compiler/base/checked.h"
#include "compiler/check/eval_internal.h"

namespace paraplan::eval {
namespace {

constexpr int kMaxDepth = 200;

struct DepthGuard {
  explicit DepthGuard(int* d) : d_(d) { ++*d_; }
  ~DepthGuard() { --*d_; }
  int* d_;
};

std::string OpWord(const std::string& op) {
  if (op == "*") return "·";
  return op;
}

}  // namespace

Value Evaluator::Eval(const ast::Expr& e, const Scope* scope, Record* self,
                      const FieldInfo* expect) {
  DepthGuard guard(&depth_);
  if (e.kind != ast::ExprKind::kPath || e.path.size() > 1) expected_kind_ = -1;
  if (depth_ > kMaxDepth) {
    Report(Diag(DiagKind::kCyclicDefinition, "evaluation nests too deeply")
               .At(e.range, "reached while evaluating this")
               .Note(fmt::format("more than {} nested evaluations: a `let` or a field that depends "
                                 "on itself, or a derivation chain that long",
                                 kMaxDepth)));
    return Value::Error();
  }
  switch (e.kind) {
    case ast::ExprKind::kInt:
    case ast::ExprKind::kReal:
      return Quantity(e);
    case ast::ExprKind::kString:
      return Value::String(e.text);
    case ast::ExprKind::kBool:
      return Value::Bool(e.bool_value);
    case ast::ExprKind::kAuto:
      return Value::Auto();
    case ast::ExprKind::kList: {
      auto items = std::make_shared<std::vector<Value>>();
      for (const auto& op : e.operands) {
        Value v = Eval(*op, scope, self, expect);
        if (v.IsError()) return v;
        items->push_back(std::move(v));
      }
      Value l;
      l.type = VType::kList;
      l.list = std::move(items);
      return l;
    }
    case ast::ExprKind::kUnary:
      return Unary(e, scope, self);
    case ast::ExprKind::kBinary:
      return Binary(e, scope, self);
    case ast::ExprKind::kCall:
      return Call(e, scope, self);
    case ast::ExprKind::kPath:
      return EvalPath(e, scope, self, expect);
  }
  return Value::Error();
}

Value Evaluator::EvalPath(const ast::Expr& e, const Scope* scope, Record* self,
                          const FieldInfo* expect) {
  // In an enum field, a bare name that is one of the enum's values is that value.
  if (expect && expect->type == FieldType::kEnum && e.path.size() == 1 && !e.block) {
    for (std::string_view v : expect->enum_values) {
      if (v == e.path[0].text) {
        Value s = Value::String(e.path[0].text);
        s.enum_name = true;
        return s;
      }
    }
  }
  // A bare name that names nothing, in an enum field, is an enum value the field will refuse
  // with its list of values (rather than an "unknown name").
  if (expect && expect->type == FieldType::kEnum && e.path.size() == 1 && !e.block &&
      !Resolvable(e.path[0].text, scope, self)) {
    Value s = Value::String(e.path[0].text);
    s.enum_name = true;
    return s;
  }
  Value v = Lookup(e.path[0], scope, self);
  std::string text = e.path[0].text;
  for (size_t i = 1; i < e.path.size() && !v.IsError(); ++i) {
    v = Member(v, e.path[i], text);
    text += "." + e.path[i].text;
  }
  if (e.block && !v.IsError()) return Derive(v, e, self);
  return v;
}

bool Evaluator::Resolvable(const std::string& name, const Scope* scope, Record* self) const {
  const ModuleData* module = nullptr;
  for (const Scope* s = scope; s; s = s->parent) {
    if (s->lets.count(name)) return true;
    module = s->module ? s->module : module;
  }
  for (Record* r = self; r; r = r->parent) {
    if (SchemaOf(r->kind).Find(name) >= 0) return true;
  }
  if (!module) return false;
  if (module->decls.count(name)) return true;
  for (const ModuleData* imp : module->imports) {
    if (imp->decls.count(name)) return true;
  }
  return false;
}

// The stdlib module (`std.models.llama`) whose file declares a top-level record `name`; empty when
// none does. Read only when a name is unknown: a line-start `gpu|cluster|model|plan NAME`.
static std::string StdlibModuleDeclaring(const std::string& root, std::string_view name) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (root.empty() || !fs::is_directory(root, ec)) return {};
  std::vector<fs::path> files;
  for (fs::recursive_directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec))
    if (it->is_regular_file() && it->path().extension() == ".plan") files.push_back(it->path());
  std::sort(files.begin(), files.end());
  for (const fs::path& file : files) {
    std::ifstream in(file);
    std::string line;
    while (std::getline(in, line)) {
      for (std::string_view kind : {"gpu ", "cluster ", "model ", "plan "}) {
        if (line.compare(0, kind.size(), kind) != 0) continue;
        std::string_view rest = std::string_view(line).substr(kind.size());
        size_t end = 0;
        while (end < rest.size() &&
               (std::isalnum(static_cast<unsigned char>(rest[end])) || rest[end] == '_'))
          ++end;
        if (rest.substr(0, end) != name) continue;
        std::string rel = fs::relative(file, root, ec).replace_extension("").generic_string();
        for (char& c : rel) c = c == '/' ? '.' : c;
        return "std." + rel;
      }
    }
  }
  return {};
}

Value Evaluator::Lookup(const ast::Name& name, const Scope* scope, Record* self) {
  const int want = expected_kind_;
  expected_kind_ = -1;
  for (const Scope* s = scope; s; s = s->parent) {
    if (auto it = s->lets.find(name.text); it != s->lets.end()) {
      if (!busy_.insert(it->second).second) {
        Report(
            Diag(DiagKind::kCyclicDefinition, fmt::format("`let {}` depends on itself", name.text))
                .At(name.range, "used here while its value is being computed")
                .Label(it->second->range, "defined here"));
        return Value::Error();
      }
      Value v = Eval(*it->second->value, s, self);
      busy_.erase(it->second);
      return v;
    }
  }
  for (Record* r = self; r; r = r->parent) {
    int idx = SchemaOf(r->kind).Find(name.text);
    // A record field that wants a record of one kind passes over fields that cannot be one:
    // `model = moe` names a model called `moe`, not the plan's `moe` block.
    if (idx >= 0 && want >= 0 && SchemaOf(r->kind).fields[idx].sub_kind != want) continue;
    if (idx >= 0) return Field(r, idx, name.range);
  }
  const ModuleData* module = nullptr;
  for (const Scope* s = scope; s; s = s->parent) module = s->module ? s->module : module;
  auto find_decl = [&](const ModuleData* m) -> const ast::Decl* {
    if (!m) return nullptr;
    auto it = m->decls.find(name.text);
    return it == m->decls.end() ? nullptr : it->second;
  };
  // A record field wants a record of one kind: `model = llama3_70b` inside `plan llama3_70b`
  // finds the imported model rather than the plan of the same name.
  auto kind_matches = [&](const ast::Decl* d) {
    if (!d || want < 0 || d->kind == ast::DeclKind::kLet) return true;
    Kind k = d->kind == ast::DeclKind::kGpu       ? Kind::kGpu
             : d->kind == ast::DeclKind::kCluster ? Kind::kCluster
             : d->kind == ast::DeclKind::kModel   ? Kind::kModel
                                                  : Kind::kPlan;
    return static_cast<int>(k) == want;
  };
  const ast::Decl* decl = find_decl(module);
  const ModuleData* decl_module = module;
  if ((!decl || !kind_matches(decl)) && module) {
    for (const ModuleData* imp : module->imports) {
      const ast::Decl* d = find_decl(imp);
      if (d && (!decl || kind_matches(d))) {
        decl = d;
        decl_module = imp;
        if (kind_matches(d)) break;
      }
    }
  }
  if (decl) {
    if (decl->kind != ast::DeclKind::kLet) return Value::OfRecord(DeclRecord(*decl));
    if (auto it = let_values_.find(decl); it != let_values_.end()) return it->second;
    if (!busy_.insert(decl).second) {
      Report(Diag(DiagKind::kCyclicDefinition, fmt::format("`let {}` depends on itself", name.text))
                 .At(name.range, "used here while its value is being computed")
                 .Label(decl->name.range, "defined here"));
      return Value::Error();
    }
    Value v = Eval(*decl->base, &decl_module->scope, nullptr);
    busy_.erase(decl);
    let_values_[decl] = v;
    return v;
  }
  // Not found: suggest the closest name in scope.
  std::vector<std::string_view> candidates;
  for (const Scope* s = scope; s; s = s->parent) {
    for (const auto& [n, m] : s->lets) candidates.push_back(n);
  }
  for (Record* r = self; r; r = r->parent) {
    for (const SchemaField& f : SchemaOf(r->kind).fields) candidates.push_back(f.name);
  }
  if (module) {
    for (const auto& [n, d] : module->decls) candidates.push_back(n);
    for (const ModuleData* imp : module->imports) {
      for (const auto& [n, d] : imp->decls) candidates.push_back(n);
    }
  }
  for (std::string_view fn : {"min", "max", "ceil_div"}) candidates.push_back(fn);
  Diag d(DiagKind::kUnknownName, fmt::format("unknown name `{}`", name.text));
  d.At(name.range, "not a field, a `let`, a record or a function in scope");
  std::string guess = ast::ClosestName(name.text, candidates);
  if (!guess.empty()) d.Help(fmt::format("did you mean `{}`?", guess));
  if (std::string module = StdlibModuleDeclaring(src_.options.stdlib_dir, name.text);
      !module.empty()) {
    d.Help(fmt::format("`{}` is declared in the standard library: add `import {}`", name.text,
                       module));
  } else if (self && self->kind == Kind::kPlan && guess.empty()) {
    d.Note("records from the standard library need an import, e.g. `import std.models.llama`");
  }
  Report(std::move(d));
  return Value::Error();
}

Value Evaluator::Member(const Value& base, const ast::Name& name, const std::string& base_text) {
  if (base.IsError()) return base;
  if (base.type != VType::kRecord) {
    Report(Diag(DiagKind::kTypeMismatch, fmt::format("`{}` is {}, which has no field `{}`",
                                                     base_text, Describe(base), name.text))
               .At(name.range, "no such field"));
    return Value::Error();
  }
  const Schema& sc = SchemaOf(base.rec->kind);
  int idx = sc.Find(name.text);
  if (idx < 0) {
    Diag d(DiagKind::kUnknownField,
           fmt::format("a `{}` has no field `{}`", KindName(base.rec->kind), name.text));
    d.At(name.range, "unknown field");
    std::string guess = ast::ClosestName(name.text, sc.Names());
    if (!guess.empty()) d.Help(fmt::format("did you mean `{}.{}`?", base_text, guess));
    Report(std::move(d));
    return Value::Error();
  }
  return Field(base.rec, idx, name.range);
}

Value Evaluator::Derive(const Value& base, const ast::Expr& e, Record* self) {
  if (base.type != VType::kRecord) {
    Report(Diag(DiagKind::kTypeMismatch,
                fmt::format("only records can be derived with `{{ ... }}`; `{}` is {}",
                            Text(e.path.back().range), Describe(base)))
               .At(e.range, "not a record"));
    return Value::Error();
  }
  Record* r = NewRecord(base.rec->kind, base.rec->name, e.range);
  r->entries = base.rec->entries;
  const Scope* bs = src_.ScopeOf(e.block.get());
  for (const ast::Member& m : e.block->members) AddEntry(r, &m, 0, bs);
  r->parent = self;
  return Value::OfRecord(r);
}

Value Evaluator::Quantity(const ast::Expr& e) {
  if (e.out_of_range) return Value::Error();  // reported by the parser
  Value v = e.kind == ast::ExprKind::kInt ? Value::Int(e.int_value) : Value::Real(e.real_value);
  if (e.unit.text.empty()) return v;
  const UnitInfo* u = FindUnit(e.unit.text);
  if (!u) return Value::Error();  // reported by the parser
  double scale = u->scale;
  if (v.type == VType::kInt && scale >= 1 && scale == std::floor(scale) && scale < 9.2e18) {
    auto x = CheckedMul(v.i, static_cast<int64_t>(scale));
    if (!x) {
      Report(Diag(DiagKind::kIntegerOverflow,
                  fmt::format("`{}` is more than 64 bits can hold", Text(e.range)))
                 .At(e.range, fmt::format("{} · {} overflows", v.i, static_cast<int64_t>(scale))));
      return Value::Error();
    }
    return Value::Int(*x, u->dimension);
  }
  double x = v.AsReal() * scale;
  if (u->dimension == UnitDimension::kBytes && std::fabs(x) >= 9.2e18) {
    Report(Diag(DiagKind::kIntegerOverflow,
                fmt::format("`{}` is more than 64 bits can hold", Text(e.range)))
               .At(e.range, fmt::format("{:.6g} bytes; at most 9223372036854775807", x)));
    return Value::Error();
  }
  if (u->dimension == UnitDimension::kBytes && x == std::floor(x)) {
    return Value::Int(static_cast<int64_t>(x), u->dimension);
  }
  return Value::Real(x, u->dimension);
}

Value Evaluator::Unary(const ast::Expr& e, const Scope* scope, Record* self) {
  Value a = Eval(*e.operands[0], scope, self);
  if (a.IsError()) return a;
  if (e.text == "not") {
    if (a.type != VType::kBool) {
      Report(
          Diag(DiagKind::kTypeMismatch, fmt::format("`not` needs a boolean, got {}", Describe(a)))
              .At(e.operands[0]->range, fmt::format("this is {}", Format(a))));
      return Value::Error();
    }
    return Value::Bool(!a.b);
  }
  if (a.type == VType::kInt) {
    if (a.i == INT64_MIN) {
      Report(Diag(DiagKind::kIntegerOverflow, "negating the smallest 64-bit integer overflows")
                 .At(e.range, "-(-9223372036854775808)"));
      return Value::Error();
    }
    return Value::Int(-a.i, a.dim);
  }
  if (a.type == VType::kReal) return Value::Real(-a.r, a.dim);
  Report(Diag(DiagKind::kTypeMismatch, fmt::format("`-` needs a number, got {}", Describe(a)))
             .At(e.operands[0]->range, fmt::format("this is {}", Format(a))));
  return Value::Error();
}

Value Evaluator::Binary(const ast::Expr& e, const Scope* scope, Record* self) {
  const std::string& op = e.text;
  if (op == "and" || op == "or") {
    Value a = Eval(*e.operands[0], scope, self);
    if (a.IsError()) return a;
    auto need_bool = [&](const Value& v, const ast::Expr& x) {
      Report(
          Diag(DiagKind::kTypeMismatch, fmt::format("`{}` needs booleans, got {}", op, Describe(v)))
              .At(x.range, fmt::format("this is {}", Format(v))));
      return Value::Error();
    };
    if (a.type != VType::kBool) return need_bool(a, *e.operands[0]);
    if (op == "and" && !a.b) return a;
    if (op == "or" && a.b) return a;
    Value b = Eval(*e.operands[1], scope, self);
    if (b.IsError()) return b;
    if (b.type != VType::kBool) return need_bool(b, *e.operands[1]);
    return b;
  }
  Value a = Eval(*e.operands[0], scope, self);
  // An enum compared with a bare name: the name is an enum spelling (`schedule == gpipe`).
  const FieldInfo* expect = nullptr;
  if (a.type == VType::kString && a.enum_name) {
    static FieldInfo any_enum{"", FieldType::kEnum, {}, ""};
    const ast::Expr& rhs = *e.operands[1];
    if (rhs.kind == ast::ExprKind::kPath && rhs.path.size() == 1) {
      any_enum.enum_values = {rhs.path[0].text};
      expect = &any_enum;
    }
  }
  Value b = Eval(*e.operands[1], scope, self, expect);
  if (a.IsError() || b.IsError()) return Value::Error();
  if (op == "==" || op == "!=" || op == "<" || op == "<=" || op == ">" || op == ">=") {
    return Compare(e, op, a, b);
  }
  return Arith(e, op, a, b);
}

Value Evaluator::Compare(const ast::Expr& e, const std::string& op, const Value& a,
                         const Value& b) {
  auto fail = [&](std::string why) {
    Report(Diag(a.dim != b.dim && a.IsNumber() && b.IsNumber() ? DiagKind::kUnitMismatch
                                                               : DiagKind::kTypeMismatch,
                fmt::format("cannot compare {} with {}", Describe(a), Describe(b)))
               .At(e.range, std::move(why)));
    return Value::Error();
  };
  if (a.IsNumber() && b.IsNumber()) {
    if (a.dim != b.dim)
      return fail(fmt::format("`{}` and `{}` have different dimensions", Format(a), Format(b)));
    int c;
    if (a.type == VType::kInt && b.type == VType::kInt) {
      c = a.i < b.i ? -1 : a.i > b.i ? 1 : 0;
    } else {
      c = a.AsReal() < b.AsReal() ? -1 : a.AsReal() > b.AsReal() ? 1 : 0;
    }
    bool r = op == "=="   ? c == 0
             : op == "!=" ? c != 0
             : op == "<"  ? c < 0
             : op == "<=" ? c <= 0
             : op == ">"  ? c > 0
                          : c >= 0;
    return Value::Bool(r);
  }
  if (op != "==" && op != "!=") return fail(fmt::format("`{}` orders numbers only", op));
  bool eq;
  if (a.type == VType::kBool && b.type == VType::kBool) {
    eq = a.b == b.b;
  } else if (a.type == VType::kString && b.type == VType::kString) {
    eq = a.s == b.s;
  } else if (a.type == VType::kRecord && b.type == VType::kRecord) {
    eq = a.rec->name == b.rec->name && a.rec->kind == b.rec->kind;
  } else {
    return fail("the two sides have different types");
  }
  return Value::Bool(op == "==" ? eq : !eq);
}

Value Evaluator::Arith(const ast::Expr& e, const std::string& op, const Value& a, const Value& b) {
  if (op == "+" && a.type == VType::kString && b.type == VType::kString)
    return Value::String(a.s + b.s);
  if (!a.IsNumber() || !b.IsNumber()) {
    const Value& bad = a.IsNumber() ? b : a;
    const ast::Expr& where = a.IsNumber() ? *e.operands[1] : *e.operands[0];
    Report(
        Diag(DiagKind::kTypeMismatch, fmt::format("`{}` needs numbers, got {}", op, Describe(bad)))
            .At(where.range, fmt::format("this is {}", Format(bad))));
    return Value::Error();
  }
  // Dimensions.
  std::optional<UnitDimension> dim;
  bool ok = true;
  using D = UnitDimension;
  if (op == "+" || op == "-") {
    ok = a.dim == b.dim;
    dim = a.dim;
  } else if (op == "*") {
    if (!a.dim || !b.dim) {
      dim = a.dim ? a.dim : b.dim;
    } else if ((a.dim == D::kBandwidth && b.dim == D::kTime) ||
               (a.dim == D::kTime && b.dim == D::kBandwidth)) {
      dim = D::kBytes;
    } else {
      ok = false;
    }
  } else if (op == "/") {
    if (!b.dim) {
      dim = a.dim;
    } else if (a.dim == b.dim) {
      dim = std::nullopt;
    } else if (a.dim == D::kBytes && b.dim == D::kTime) {
      dim = D::kBandwidth;
    } else if (a.dim == D::kBytes && b.dim == D::kBandwidth) {
      dim = D::kTime;
    } else {
      ok = false;
    }
  } else if (op == "%") {
    ok = !b.dim || a.dim == b.dim;
    dim = a.dim;
  }
  if (!ok) {
    Report(Diag(DiagKind::kUnitMismatch,
                fmt::format("`{}` mixes {} and {}", Text(e.range), Describe(a), Describe(b)))
               .At(e.range, fmt::format("{} {} {}", Format(a), OpWord(op), Format(b)))
               .Note("+ and - need the same dimension; bytes / time is a bandwidth and "
                     "bandwidth · time is bytes"));
    return Value::Error();
  }
  if ((op == "/" || op == "%") && b.AsReal() == 0) {
    Report(Diag(DiagKind::kDivisionByZero, fmt::format("`{}` divides by zero", Text(e.range)))
               .At(e.operands[1]->range, "this is 0"));
    return Value::Error();
  }
  if (a.type == VType::kInt && b.type == VType::kInt) {
    std::optional<int64_t> r;
    if (op == "+") r = CheckedAdd(a.i, b.i);
    if (op == "-") r = CheckedSub(a.i, b.i);
    if (op == "*") r = CheckedMul(a.i, b.i);
    if (op == "%") r = CheckedMod(a.i, b.i);
    if (op == "/") {
      // INT64_MIN / -1 does not fit (and its remainder traps on x86): CheckedMod reports it.
      const std::optional<int64_t> rem = CheckedMod(a.i, b.i);
      if (rem && *rem != 0)
        return Value::Real(static_cast<double>(a.i) / static_cast<double>(b.i), dim);
      if (rem) r = CheckedDiv(a.i, b.i);
    }
    if (!r) {
      Report(
          Diag(DiagKind::kIntegerOverflow, fmt::format("integer overflow in `{}`", Text(e.range)))
              .At(e.range, fmt::format("{} {} {} does not fit in 64 bits", a.i, OpWord(op), b.i))
              .Note("integers are signed 64-bit: at most 9223372036854775807"));
      return Value::Error();
    }
    return Value::Int(*r, dim);
  }
  if (op == "%") {
    Report(Diag(DiagKind::kTypeMismatch, "`%` needs integers")
               .At(e.range, fmt::format("{} % {}", Format(a), Format(b))));
    return Value::Error();
  }
  double x = a.AsReal(), y = b.AsReal();
  double r = op == "+" ? x + y : op == "-" ? x - y : op == "*" ? x * y : x / y;
  return Value::Real(r, dim);
}

Value Evaluator::Call(const ast::Expr& e, const Scope* scope, Record* self) {
  const std::string& fn = e.path[0].text;
  std::vector<Value> args;
  for (const auto& op : e.operands) {
    Value v = Eval(*op, scope, self);
    if (v.IsError()) return v;
    args.push_back(std::move(v));
  }
  if (fn == "min" || fn == "max") {
    if (args.empty()) {
      Report(Diag(DiagKind::kTypeMismatch, fmt::format("`{}` needs at least one argument", fn))
                 .At(e.range, "no arguments"));
      return Value::Error();
    }
    Value best = args[0];
    for (size_t i = 1; i < args.size(); ++i) {
      Value less = Compare(e, "<", args[i], best);
      if (less.IsError()) return less;
      if (less.b == (fn == "min")) best = args[i];
    }
    return best;
  }
  if (fn == "ceil_div") {
    if (args.size() != 2 || args[0].type != VType::kInt || args[1].type != VType::kInt) {
      Report(Diag(DiagKind::kTypeMismatch, "`ceil_div` takes two integers")
                 .At(e.range, fmt::format("{} argument(s)", args.size())));
      return Value::Error();
    }
    if (args[1].i == 0) {
      Report(Diag(DiagKind::kDivisionByZero, fmt::format("`{}` divides by zero", Text(e.range)))
                 .At(e.operands[1]->range, "this is 0"));
      return Value::Error();
    }
    const std::optional<int64_t> quotient = CheckedDiv(args[0].i, args[1].i);
    if (!quotient) {
      Report(
          Diag(DiagKind::kIntegerOverflow, fmt::format("integer overflow in `{}`", Text(e.range)))
              .At(e.range,
                  fmt::format("ceil_div({}, {}) does not fit in 64 bits", args[0].i, args[1].i))
              .Note("integers are signed 64-bit: at most 9223372036854775807"));
      return Value::Error();
    }
    int64_t q = *quotient;
    if ((args[0].i % args[1].i != 0) && ((args[0].i < 0) == (args[1].i < 0))) ++q;
    return Value::Int(q, args[0].dim);
  }
  Diag d(DiagKind::kUnknownName, fmt::format("unknown function `{}`", fn));
  d.At(e.path[0].range, "not a function");
  d.Note("the functions are `min`, `max` and `ceil_div`");
  std::string guess = ast::ClosestName(fn, {"min", "max", "ceil_div"});
  if (!guess.empty()) d.Help(fmt::format("did you mean `{}`?", guess));
  Report(std::move(d));
  return Value::Error();
}

}  // namespace paraplan::eval
