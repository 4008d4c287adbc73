// Builder (parse_builder.h): expressions and literals, with the nesting limit and the checks on
// numbers and units.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "compiler/ast/names.h"
#include "compiler/base/checked.h"
#include "compiler/parse/parse_builder.h"
#include "compiler/plan/plan.h"

namespace paraplan::parse_internal {

Diag TooDeep(SourceRange range, std::string_view what, std::string_view label) {
  return Diag(DiagKind::kNestingTooDeep,
              fmt::format("{} nests more than {} levels deep", what, kMaxNesting))
      .At(range, std::string(label))
      .Note(
          "every bracket, block, unary `-` or `not` and binary operator is a level; plans need a "
          "few")
      .Help("name parts of it with `let` (`let a = ...`), or write the value itself");
}

std::unique_ptr<ast::Expr> Builder::Binary(std::string op, std::unique_ptr<ast::Expr> a,
                                           std::unique_ptr<ast::Expr> b) {
  auto e = std::make_unique<ast::Expr>();
  e->kind = ast::ExprKind::kBinary;
  e->range = Join(a->range, b->range);
  e->text = std::move(op);
  e->operands.push_back(std::move(a));
  e->operands.push_back(std::move(b));
  return Tracked(std::move(e));
}

std::unique_ptr<ast::Expr> Builder::Tracked(std::unique_ptr<ast::Expr> e) {
  int depth = 1;
  for (const auto& op : e->operands) {
    auto it = depth_.find(op.get());
    depth = std::max(depth, 1 + (it == depth_.end() ? 1 : it->second));
    // Each expression is the operand of one parent only: its entry is not needed again.
    if (it != depth_.end()) depth_.erase(it);
  }
  if (depth > 1) depth_[e.get()] = depth;  // a missing entry reads as depth 1
  if (depth > kMaxNesting && !too_deep_) {
    too_deep_ = true;
    Report(TooDeep(e->range, "this expression",
                   fmt::format("{} levels of operators and brackets", depth)));
  }
  return e;
}

std::unique_ptr<ast::Expr> Builder::Expr(PlanParser::ExprContext* ctx) {
  if (streaming_) {
    auto it = exprs_.find(ctx);
    if (it != exprs_.end()) {
      for (Diagnostic& d : it->second.diags) Report(std::move(d));
      auto e = std::move(it->second.expr);
      exprs_.erase(it);
      return e;
    }
  }
  return Or(ctx->orExpr());
}

std::unique_ptr<ast::Expr> Builder::Or(PlanParser::OrExprContext* ctx) {
  auto parts = ctx->andExpr();
  auto e = And(parts[0]);
  for (size_t i = 1; i < parts.size() && !too_deep_; ++i)
    e = Binary("or", std::move(e), And(parts[i]));
  return e;
}

std::unique_ptr<ast::Expr> Builder::And(PlanParser::AndExprContext* ctx) {
  auto parts = ctx->notExpr();
  auto e = Not(parts[0]);
  for (size_t i = 1; i < parts.size() && !too_deep_; ++i)
    e = Binary("and", std::move(e), Not(parts[i]));
  return e;
}

std::unique_ptr<ast::Expr> Builder::Not(PlanParser::NotExprContext* ctx) {
  if (ctx->NOT()) {
    auto e = std::make_unique<ast::Expr>();
    e->kind = ast::ExprKind::kUnary;
    e->range = Range(ctx);
    e->text = "not";
    e->operands.push_back(Not(ctx->notExpr()));
    return Tracked(std::move(e));
  }
  return Compare(ctx->compareExpr());
}

std::unique_ptr<ast::Expr> Builder::Compare(PlanParser::CompareExprContext* ctx) {
  auto parts = ctx->addExpr();
  auto e = Add(parts[0]);
  if (parts.size() > 1) e = Binary(ctx->op->getText(), std::move(e), Add(parts[1]));
  return e;
}

std::unique_ptr<ast::Expr> Builder::Add(PlanParser::AddExprContext* ctx) {
  auto parts = ctx->mulExpr();
  auto e = Mul(parts[0]);
  for (size_t i = 1; i < parts.size() && !too_deep_; ++i) {
    e = Binary(ctx->ops[i - 1]->getText(), std::move(e), Mul(parts[i]));
  }
  return e;
}

std::unique_ptr<ast::Expr> Builder::Mul(PlanParser::MulExprContext* ctx) {
  auto parts = ctx->unaryExpr();
  auto e = Unary(parts[0]);
  for (size_t i = 1; i < parts.size() && !too_deep_; ++i) {
    e = Binary(ctx->ops[i - 1]->getText(), std::move(e), Unary(parts[i]));
  }
  return e;
}

void Builder::ReportTooLarge(SourceRange range, const std::string& text) {
  Report(Diag(DiagKind::kNumberTooLarge,
              fmt::format("integer literal `{}` does not fit in 64 bits", text))
             .At(range, "larger than 9223372036854775807")
             .Note("integers are signed 64-bit; sizes past that are not meaningful"));
}

std::unique_ptr<ast::Expr> Builder::Unary(PlanParser::UnaryExprContext* ctx) {
  auto e = UnaryOrMinLiteral(ctx);
  if (e->kind == ast::ExprKind::kInt && e->text == "min") {
    ReportTooLarge(e->range, "9223372036854775808");
    e->text.clear();
    e->out_of_range = true;
  }
  return e;
}

std::unique_ptr<ast::Expr> Builder::UnaryOrMinLiteral(PlanParser::UnaryExprContext* ctx) {
  if (ctx->primary()) return Primary(ctx->primary());
  auto inner = UnaryOrMinLiteral(ctx->unaryExpr());
  // `-9223372036854775808` is a literal, not the negation of an out-of-range one.
  if (inner->kind == ast::ExprKind::kInt && inner->text == "min") {
    inner->int_value = INT64_MIN;
    inner->text.clear();
    inner->range = Range(ctx);
    return inner;
  }
  auto e = std::make_unique<ast::Expr>();
  e->kind = ast::ExprKind::kUnary;
  e->range = Range(ctx);
  e->text = "-";
  e->operands.push_back(std::move(inner));
  return Tracked(std::move(e));
}

std::vector<std::unique_ptr<ast::Expr>> Builder::Exprs(
    const std::vector<PlanParser::ExprContext*>& v) {
  std::vector<std::unique_ptr<ast::Expr>> out;
  for (auto* x : v) out.push_back(Expr(x));
  return out;
}

std::unique_ptr<ast::Expr> Builder::Primary(PlanParser::PrimaryContext* ctx) {
  auto e = std::make_unique<ast::Expr>();
  e->range = Range(ctx);
  if (auto* n = dynamic_cast<PlanParser::NumberPrimaryContext*>(ctx)) {
    Number(n, e.get());
  } else if (auto* s = dynamic_cast<PlanParser::StringPrimaryContext*>(ctx)) {
    e->kind = ast::ExprKind::kString;
    e->text = Unescape(s->STRING()->getSymbol());
  } else if (auto* b = dynamic_cast<PlanParser::BoolPrimaryContext*>(ctx)) {
    e->kind = ast::ExprKind::kBool;
    e->bool_value = b->TRUE() != nullptr;
  } else if (dynamic_cast<PlanParser::AutoPrimaryContext*>(ctx)) {
    e->kind = ast::ExprKind::kAuto;
  } else if (auto* l = dynamic_cast<PlanParser::ListPrimaryContext*>(ctx)) {
    e->kind = ast::ExprKind::kList;
    if (streaming_) {
      auto it = lists_.find(l);
      if (it != lists_.end()) {
        for (Diagnostic& d : it->second.diags) Report(std::move(d));
        e->operands = std::move(it->second.elements);
        lists_.erase(it);
      }
    } else {
      for (auto* x : l->expr()) {
        e->operands.push_back(Expr(x));
        AppendRun(x, &e->operands);
      }
    }
  } else if (auto* p = dynamic_cast<PlanParser::ParenPrimaryContext*>(ctx)) {
    auto inner = Expr(p->expr());
    inner->range = e->range;  // the parentheses belong to what the reader sees
    return inner;
  } else if (auto* c = dynamic_cast<PlanParser::CallPrimaryContext*>(ctx)) {
    e->kind = ast::ExprKind::kCall;
    e->path.push_back(NameOf(c->NAME()));
    e->operands = Exprs(c->expr());
  } else if (auto* p = dynamic_cast<PlanParser::PathPrimaryContext*>(ctx)) {
    e->kind = ast::ExprKind::kPath;
    e->path = Path(p->path());
    if (p->block()) e->block = Block(p->block());
  }
  return Tracked(std::move(e));
}

namespace {
// Whether `text` is one of the spellings of some enum field of the plan.
bool SpellsEnumValue(std::string_view text) {
  for (const FieldInfo& f : PlanFields()) {
    if (f.type != FieldType::kEnum) continue;
    for (std::string_view v : f.enum_values)
      if (v == text) return true;
  }
  return false;
}
}  // namespace

void Builder::Number(PlanParser::NumberPrimaryContext* ctx, ast::Expr* e) {
  antlr4::Token* t = ctx->number()->getStart();
  // An enum value spelled with a leading digit (`1f1b`) lexes as a number and a unit. Written
  // without a space and not a unit, it is that value as a bare name, which an enum field reads
  // as itself and anything else reports as an unknown name.
  if (auto* u = ctx->unit(); u && u->NAME().size() == 1 &&
                             u->getStart()->getStartIndex() == t->getStopIndex() + 1 &&
                             !FindUnit(u->getText())) {
    std::string glued = t->getText() + u->getText();
    if (SpellsEnumValue(glued)) {
      e->kind = ast::ExprKind::kPath;
      e->path.push_back(ast::Name{std::move(glued), Range(ctx)});
      return;
    }
  }
  NumberValue(t->getType(), t->getText(), Range(t), e);
  Unit(ctx, e);
}

void Builder::NumberValue(size_t type, const std::string& text, SourceRange range, ast::Expr* e) {
  std::string digits;
  for (char c : text) {
    if (c != '_') digits += c;
  }
  if (type == PlanParser::INT) {
    e->kind = ast::ExprKind::kInt;
    int64_t v = 0;
    bool overflow = false;
    for (char c : digits) {
      auto m = CheckedMul(v, 10);
      auto a = m ? CheckedAdd(*m, c - '0') : std::nullopt;
      if (!a) {
        overflow = true;
        break;
      }
      v = *a;
    }
    e->int_value = v;
    if (overflow) {
      if (digits == "9223372036854775808") {
        e->text = "min";  // fine under a unary minus; Unary reports it anywhere else
        e->int_value = INT64_MIN;
      } else {
        ReportTooLarge(range, text);
        e->out_of_range = true;
      }
    }
  } else {
    e->kind = ast::ExprKind::kReal;
    e->real_value = std::strtod(digits.c_str(), nullptr);
    if (!std::isfinite(e->real_value)) {
      Report(Diag(DiagKind::kNumberTooLarge, fmt::format("real literal `{}` is out of range", text))
                 .At(range, "not a finite number"));
      e->real_value = 0;
      e->out_of_range = true;
    }
  }
}

void Builder::Unit(PlanParser::NumberPrimaryContext* ctx, ast::Expr* e) {
  if (auto* u = ctx->unit()) {
    auto names = u->NAME();
    e->unit.text = names[0]->getText();
    if (names.size() > 1) e->unit.text += "/" + names[1]->getText();
    e->unit.range = Range(u);
    if (!FindUnit(e->unit.text)) {
      std::vector<std::string_view> all;
      for (const UnitInfo& info : AllUnits()) all.push_back(info.name);
      Diag d(DiagKind::kUnknownUnit, fmt::format("`{}` is not a unit", e->unit.text));
      d.At(e->unit.range, "unknown unit");
      std::string guess = ast::ClosestName(e->unit.text, all);
      if (!guess.empty()) d.Help(fmt::format("did you mean `{}`?", guess));
      d.Note(
          "units: B KB MB GB TB KiB MiB GiB TiB (bytes); GB/s Gb/s GiB/s TB/s ... "
          "(bandwidth); GFLOPS TFLOPS PFLOPS (compute); s ms us ns (time)");
      Report(std::move(d));
    }
  }
}

void Builder::AppendRun(PlanParser::ExprContext* x, std::vector<std::unique_ptr<ast::Expr>>* out) {
  if (runs_.empty() || x->getStart() != x->getStop()) return;
  auto it = runs_.find(x->getStart()->getStartIndex());
  if (it == runs_.end()) return;
  out->reserve(out->size() + it->second.size());
  for (const parse_internal::LiteralRef& r : it->second) out->push_back(RunElement(r));
}

std::unique_ptr<ast::Expr> Builder::RunElement(const parse_internal::LiteralRef& r) {
  auto e = std::make_unique<ast::Expr>();
  e->range = {buffer_, offsets_.Byte(r.start), offsets_.Byte(size_t{r.stop} + 1)};
  const std::string text(text_.substr(e->range.begin, e->range.end - e->range.begin));
  switch (r.type) {
    case PlanLexer::INT:
    case PlanLexer::REAL:
      NumberValue(r.type, text, e->range, e.get());
      break;
    case PlanLexer::STRING:
      e->kind = ast::ExprKind::kString;
      e->text = Unescape(text);
      break;
    case PlanLexer::TRUE:
    case PlanLexer::FALSE:
      e->kind = ast::ExprKind::kBool;
      e->bool_value = r.type == PlanLexer::TRUE;
      break;
    default:
      e->kind = ast::ExprKind::kAuto;
      break;
  }
  e = Tracked(std::move(e));
  if (e->kind == ast::ExprKind::kInt && e->text == "min") {
    ReportTooLarge(e->range, "9223372036854775808");
    e->text.clear();
    e->out_of_range = true;
  }
  return e;
}

}  // namespace paraplan::parse_internal
