#include "compiler/ast/ast.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace paraplan::ast {
namespace {

std::string JoinPath(const std::vector<Name>& path) {
  std::string out;
  for (size_t i = 0; i < path.size(); ++i) {
    if (i) out += '.';
    out += path[i].text;
  }
  return out;
}

std::string Quote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

std::string FormatReal(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  // Shortest form that reads back the same.
  for (int p = 1; p <= 17; ++p) {
    char shorter[64];
    std::snprintf(shorter, sizeof shorter, "%.*g", p, v);
    if (std::strtod(shorter, nullptr) == v) {
      std::string s = shorter;
      if (s.find_first_of(".en") == std::string::npos) s += ".0";
      return s;
    }
  }
  return buf;
}

class Printer {
 public:
  explicit Printer(const SourceManager* sm) : sm_(sm) {}

  std::string Where(SourceRange r) const {
    if (!sm_ || !r.IsValid()) return {};
    LineColumn a = sm_->Position(r.buffer, r.begin);
    LineColumn b = sm_->Position(r.buffer, r.end);
    return " @" + std::to_string(a.line) + ":" + std::to_string(a.column) + "-" +
           std::to_string(b.line) + ":" + std::to_string(b.column);
  }

  void Line(int depth, const std::string& text) {
    out_.append(static_cast<size_t>(depth) * 2, ' ');
    out_ += text;
    out_ += '\n';
  }

  // Blocks of derivations (`base { ... }`) anywhere in an expression, in source order.
  void PrintExprBlocks(const Expr& e, int depth) {
    if (e.block) PrintBlock(*e.block, depth);
    for (const auto& op : e.operands) PrintExprBlocks(*op, depth);
  }

  void PrintBlock(const Block& b, int depth) {
    for (const Member& m : b.members) {
      switch (m.kind) {
        case MemberKind::kAssign:
          Line(depth, "assign " + JoinPath(m.path) + " = " + PrintExpr(*m.value) + Where(m.range));
          PrintExprBlocks(*m.value, depth + 1);
          break;
        case MemberKind::kAmend:
          Line(depth, "amend " + JoinPath(m.path) + Where(m.range));
          PrintBlock(*m.block, depth + 1);
          break;
        case MemberKind::kLet:
          Line(depth, "let " + JoinPath(m.path) + " = " + PrintExpr(*m.value) + Where(m.range));
          PrintExprBlocks(*m.value, depth + 1);
          break;
        case MemberKind::kRequire:
          Line(depth, "require " + PrintExpr(*m.value) +
                          (m.message.empty() ? "" : " : " + Quote(m.message)) + Where(m.range));
          PrintExprBlocks(*m.value, depth + 1);
          break;
      }
    }
  }

  std::string Take() { return std::move(out_); }

 private:
  const SourceManager* sm_;
  std::string out_;
};

}  // namespace

std::string_view ToString(DeclKind k) {
  switch (k) {
    case DeclKind::kGpu:
      return "gpu";
    case DeclKind::kCluster:
      return "cluster";
    case DeclKind::kModel:
      return "model";
    case DeclKind::kPlan:
      return "plan";
    case DeclKind::kLet:
      return "let";
  }
  return "?";
}

std::string PrintExpr(const Expr& e) {
  auto with_unit = [&](std::string s) { return e.unit.text.empty() ? s : s + " " + e.unit.text; };
  // The verifier prints malformed trees too: a missing operand prints, never dereferences.
  auto operand = [&](size_t i) {
    return i < e.operands.size() && e.operands[i] ? PrintExpr(*e.operands[i])
                                                  : std::string("<missing>");
  };
  switch (e.kind) {
    case ExprKind::kInt:
      return with_unit(std::to_string(e.int_value));
    case ExprKind::kReal:
      return with_unit(FormatReal(e.real_value));
    case ExprKind::kString:
      return Quote(e.text);
    case ExprKind::kBool:
      return e.bool_value ? "true" : "false";
    case ExprKind::kAuto:
      return "auto";
    case ExprKind::kPath: {
      std::string s = JoinPath(e.path);
      if (e.block) s += " { … }";
      return s;
    }
    case ExprKind::kList: {
      std::string s = "[";
      for (size_t i = 0; i < e.operands.size(); ++i) {
        if (i) s += ", ";
        s += operand(i);
      }
      return s + "]";
    }
    case ExprKind::kUnary:
      return "(" + e.text + (e.text == "not" ? " " : "") + operand(0) + ")";
    case ExprKind::kBinary:
      return "(" + operand(0) + " " + e.text + " " + operand(1) + ")";
    case ExprKind::kCall: {
      std::string s = JoinPath(e.path) + "(";
      for (size_t i = 0; i < e.operands.size(); ++i) {
        if (i) s += ", ";
        s += operand(i);
      }
      return s + ")";
    }
  }
  return "?";
}

std::string PrintAst(const Module& module, const SourceManager* sm) {
  Printer p(sm);
  p.Line(0, "module");
  for (const Import& i : module.imports) {
    p.Line(1, "import " + (i.file.empty() ? JoinPath(i.module) : Quote(i.file)) + p.Where(i.range));
  }
  for (const Decl& d : module.decls) {
    if (d.kind == DeclKind::kLet) {
      p.Line(1, "let " + d.name.text + " = " + PrintExpr(*d.base) + p.Where(d.range));
      p.PrintExprBlocks(*d.base, 2);
      continue;
    }
    std::string head = std::string(ToString(d.kind)) + " " + d.name.text;
    if (d.base) head += " extends " + PrintExpr(*d.base);
    p.Line(1, head + p.Where(d.range));
    p.PrintBlock(*d.body, 2);
  }
  return p.Take();
}

namespace {

class Verifier {
 public:
  explicit Verifier(uint32_t buffer) : buffer_(buffer) {}

  // `r` is a well-formed range of the module's buffer inside `outer` (when outer is given).
  void Range(SourceRange r, const std::string& what, const SourceRange* outer = nullptr) {
    if (r.buffer != buffer_) {
      Problem(what + ": range in buffer " + std::to_string(r.buffer) + ", not the module's " +
              std::to_string(buffer_));
      return;
    }
    if (r.begin > r.end) {
      Problem(what + ": range begins at " + std::to_string(r.begin) + " after its end " +
              std::to_string(r.end));
    }
    if (outer && outer->buffer == buffer_ && (r.begin < outer->begin || r.end > outer->end)) {
      Problem(what + ": range " + Span(r) + " outside its parent's " + Span(*outer));
    }
  }

  void Name(const ast::Name& n, const std::string& what, const SourceRange* outer) {
    if (n.text.empty()) Problem(what + ": empty name");
    Range(n.range, what, outer);
  }

  void Path(const std::vector<ast::Name>& path, const std::string& what, const SourceRange* outer) {
    if (path.empty()) Problem(what + ": empty path");
    for (const ast::Name& n : path) Name(n, what + " `" + n.text + "`", outer);
  }

  void Expression(const Expr* e, const std::string& what, const SourceRange* outer) {
    if (!e) {
      Problem(what + ": missing expression");
      return;
    }
    std::string here = what + " `" + PrintExpr(*e) + "`";
    Range(e->range, here, outer);
    auto operands = [&](size_t n) {
      if (e->operands.size() != n) {
        Problem(here + ": " + std::to_string(e->operands.size()) + " operands, expected " +
                std::to_string(n));
      }
    };
    switch (e->kind) {
      case ExprKind::kInt:
      case ExprKind::kReal:
        operands(0);
        if (!e->unit.text.empty()) Range(e->unit.range, here + " unit", &e->range);
        break;
      case ExprKind::kString:
      case ExprKind::kBool:
      case ExprKind::kAuto:
        operands(0);
        break;
      case ExprKind::kPath:
        operands(0);
        Path(e->path, here, &e->range);
        break;
      case ExprKind::kList:
        break;
      case ExprKind::kUnary:
        operands(1);
        if (e->text != "-" && e->text != "not")
          Problem(here + ": unary operator `" + e->text + "`");
        break;
      case ExprKind::kBinary:
        operands(2);
        if (e->text.empty()) Problem(here + ": binary operator without its operator");
        break;
      case ExprKind::kCall:
        if (e->path.size() != 1) Problem(here + ": a call names one function");
        Path(e->path, here, &e->range);
        break;
    }
    if (e->kind != ExprKind::kInt && e->kind != ExprKind::kReal && !e->unit.text.empty()) {
      Problem(here + ": a unit on something that is not a number");
    }
    if (e->block && e->kind != ExprKind::kPath)
      Problem(here + ": a block on something that is not a path");
    for (const auto& op : e->operands) Expression(op.get(), what, &e->range);
    if (e->block) BlockOf(*e->block, here, &e->range);
  }

  void BlockOf(const ast::Block& b, const std::string& what, const SourceRange* outer) {
    Range(b.range, what + " block", outer);
    for (const Member& m : b.members) MemberOf(m, &b.range);
  }

  void MemberOf(const Member& m, const SourceRange* outer) {
    std::string what = std::string(MemberWord(m.kind)) + " `" + JoinPath(m.path) + "`";
    Range(m.range, what, outer);
    switch (m.kind) {
      case MemberKind::kAssign:
        Path(m.path, what, &m.range);
        Expression(m.value.get(), what, &m.range);
        if (m.block) Problem(what + ": an assignment with a block");
        break;
      case MemberKind::kAmend:
        Path(m.path, what, &m.range);
        if (m.value) Problem(what + ": an amendment with a value");
        if (!m.block) {
          Problem(what + ": an amendment without its block");
        } else {
          BlockOf(*m.block, what, &m.range);
        }
        break;
      case MemberKind::kLet:
        if (m.path.size() != 1) Problem(what + ": a let binds one name");
        Path(m.path, what, &m.range);
        Expression(m.value.get(), what, &m.range);
        break;
      case MemberKind::kRequire:
        if (!m.path.empty()) Problem(what + ": a require with a path");
        Expression(m.value.get(), what, &m.range);
        if (!m.message.empty()) Range(m.message_range, what + " message", &m.range);
        break;
    }
    if (m.kind != MemberKind::kRequire && !m.message.empty())
      Problem(what + ": a message on a non-require");
  }

  void DeclOf(const Decl& d) {
    std::string what = std::string(ToString(d.kind)) + " `" + d.name.text + "`";
    Range(d.range, what);
    Name(d.keyword, what + " keyword", &d.range);
    Name(d.name, what + " name", &d.range);
    if (d.kind == DeclKind::kLet) {
      if (d.keyword.text != "let") Problem(what + ": keyword `" + d.keyword.text + "`");
      if (d.body) Problem(what + ": a let with a body");
      Expression(d.base.get(), what, &d.range);
      return;
    }
    if (d.keyword.text != ToString(d.kind)) {
      Problem(what + ": keyword `" + d.keyword.text + "` for a " + std::string(ToString(d.kind)));
    }
    if (d.base) {
      Expression(d.base.get(), what + " base", &d.range);
      if (d.base->kind != ExprKind::kPath || d.base->block)
        Problem(what + ": the base is not a plain name");
    }
    if (!d.body) {
      Problem(what + ": a record without its body");
    } else {
      BlockOf(*d.body, what, &d.range);
    }
  }

  void ImportOf(const Import& i) {
    std::string what = "import " + (i.file.empty() ? JoinPath(i.module) : Quote(i.file));
    Range(i.range, what);
    if (i.file.empty() == i.module.empty())
      Problem(what + ": needs exactly one of a module and a file");
    for (const ast::Name& n : i.module) Name(n, what, &i.range);
    Range(i.file_range, what + " name", &i.range);
  }

  std::vector<std::string> Take() { return std::move(problems_); }

 private:
  static std::string_view MemberWord(MemberKind k) {
    switch (k) {
      case MemberKind::kAssign:
        return "assign";
      case MemberKind::kAmend:
        return "amend";
      case MemberKind::kLet:
        return "let";
      case MemberKind::kRequire:
        return "require";
    }
    return "?";
  }
  static std::string Span(SourceRange r) {
    return "[" + std::to_string(r.begin) + ", " + std::to_string(r.end) + ")";
  }
  void Problem(std::string p) { problems_.push_back(std::move(p)); }

  uint32_t buffer_;
  std::vector<std::string> problems_;
};

}  // namespace

std::vector<std::string> VerifyAst(const Module& module) {
  Verifier v(module.buffer);
  if (module.buffer == 0) return {"module: no buffer"};
  for (const Import& i : module.imports) v.ImportOf(i);
  for (const Decl& d : module.decls) v.DeclOf(d);
  return v.Take();
}

}  // namespace paraplan::ast
