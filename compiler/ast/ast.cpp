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

  void PrintBlock(const Block& b, int depth) {
    for (const Member& m : b.members) {
      switch (m.kind) {
        case MemberKind::kAssign:
          Line(depth, "assign " + JoinPath(m.path) + " = " + PrintExpr(*m.value) + Where(m.range));
          if (m.value->block) PrintBlock(*m.value->block, depth + 1);
          break;
        case MemberKind::kAmend:
          Line(depth, "amend " + JoinPath(m.path) + Where(m.range));
          PrintBlock(*m.block, depth + 1);
          break;
        case MemberKind::kLet:
          Line(depth, "let " + JoinPath(m.path) + " = " + PrintExpr(*m.value) + Where(m.range));
          if (m.value->block) PrintBlock(*m.value->block, depth + 1);
          break;
        case MemberKind::kRequire:
          Line(depth, "require " + PrintExpr(*m.value) +
                          (m.message.empty() ? "" : " : " + Quote(m.message)) + Where(m.range));
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
    case DeclKind::kGpu: return "gpu";
    case DeclKind::kCluster: return "cluster";
    case DeclKind::kModel: return "model";
    case DeclKind::kPlan: return "plan";
    case DeclKind::kLet: return "let";
  }
  return "?";
}

std::string PrintExpr(const Expr& e) {
  auto with_unit = [&](std::string s) {
    return e.unit.text.empty() ? s : s + " " + e.unit.text;
  };
  switch (e.kind) {
    case ExprKind::kInt: return with_unit(std::to_string(e.int_value));
    case ExprKind::kReal: return with_unit(FormatReal(e.real_value));
    case ExprKind::kString: return Quote(e.text);
    case ExprKind::kBool: return e.bool_value ? "true" : "false";
    case ExprKind::kAuto: return "auto";
    case ExprKind::kPath: {
      std::string s = JoinPath(e.path);
      if (e.block) s += " { … }";
      return s;
    }
    case ExprKind::kList: {
      std::string s = "[";
      for (size_t i = 0; i < e.operands.size(); ++i) {
        if (i) s += ", ";
        s += PrintExpr(*e.operands[i]);
      }
      return s + "]";
    }
    case ExprKind::kUnary:
      return "(" + e.text + (e.text == "not" ? " " : "") + PrintExpr(*e.operands[0]) + ")";
    case ExprKind::kBinary:
      return "(" + PrintExpr(*e.operands[0]) + " " + e.text + " " + PrintExpr(*e.operands[1]) + ")";
    case ExprKind::kCall: {
      std::string s = JoinPath(e.path) + "(";
      for (size_t i = 0; i < e.operands.size(); ++i) {
        if (i) s += ", ";
        s += PrintExpr(*e.operands[i]);
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
      if (d.base->block) p.PrintBlock(*d.base->block, 2);
      continue;
    }
    std::string head = std::string(ToString(d.kind)) + " " + d.name.text;
    if (d.base) head += " extends " + PrintExpr(*d.base);
    p.Line(1, head + p.Where(d.range));
    p.PrintBlock(*d.body, 2);
  }
  return p.Take();
}

}  // namespace paraplan::ast
