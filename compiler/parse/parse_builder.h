// Builder: turns the parse tree of one buffer into the AST (compiler/ast/), as a whole tree or
// streaming (each member, expression and top-level item built as the parser leaves it, see
// Released), reporting the problems it finds inside well-formed syntax (unknown units, literals
// out of range, unknown kinds of record, expressions nested too deep). Made by Parse (parse.cpp)
// for each buffer; fed by LeanParser. Internal to compiler/parse: its members are defined in
// parse_builder.cpp (blocks, members, top-level items, streaming) and parse_builder_expr.cpp
// (expressions and literals).
#ifndef PARAPLAN_COMPILER_PARSE_PARSE_BUILDER_H_
#define PARAPLAN_COMPILER_PARSE_PARSE_BUILDER_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "PlanLexer.h"
#include "PlanParser.h"
#include "antlr4-runtime.h"
#include "compiler/ast/ast.h"
#include "compiler/diagnostics/diagnostic.h"
#include "compiler/parse/lean_runtime.h"
#include "compiler/source/source.h"

namespace paraplan::parse_internal {

using paraplan_grammar::PlanLexer;
using paraplan_grammar::PlanParser;

// ANTLR indexes characters by code point; ranges are bytes. ANTLR's input stream drops a
// leading UTF-8 byte order mark, so code point 0 is then the character after it.
class OffsetMap {
 public:
  explicit OffsetMap(std::string_view text) {
    bool ascii = true;
    for (char c : text) ascii &= static_cast<unsigned char>(c) < 0x80;
    if (ascii) return;
    const uint32_t first = text.substr(0, 3) == "\xEF\xBB\xBF" ? 3 : 0;
    for (uint32_t i = first; i < text.size(); ++i) {
      if ((static_cast<unsigned char>(text[i]) & 0xC0) != 0x80) starts_.push_back(i);
    }
    starts_.push_back(static_cast<uint32_t>(text.size()));
  }
  uint32_t Byte(size_t code_point) const {
    if (starts_.empty()) return static_cast<uint32_t>(code_point);
    if (code_point >= starts_.size()) return starts_.back();
    return starts_[code_point];
  }

 private:
  std::vector<uint32_t> starts_;
};

// How deep brackets, blocks, unary operators and chains of binary operators may nest. Real plans
// stay below 10; the limit keeps the recursive parser and evaluator far from the end of the stack.
constexpr int kMaxNesting = 100;

// The error for text or an expression nested more than kMaxNesting levels deep.
Diag TooDeep(SourceRange range, std::string_view what, std::string_view label);

// A list literal `[a, b, c]`: the parse-tree node whose elements LeanParser releases one by one.
// Every parent in the tree is a rule context; the rule index is checked before the (slower)
// cast.
inline bool IsList(const antlr4::tree::ParseTree* node) {
  const auto* ctx = static_cast<const antlr4::RuleContext*>(node);
  return ctx && ctx->getRuleIndex() == PlanParser::RulePrimary &&
         dynamic_cast<const PlanParser::ListPrimaryContext*>(node) != nullptr;
}

using Runs = std::unordered_map<size_t, std::vector<parse_internal::LiteralRef>>;

class Builder {
 public:
  // `runs`: the list elements ListRunSource took out of the token stream.
  Builder(const SourceManager& sm, uint32_t buffer, DiagnosticSink& sink, const Runs& runs)
      : buffer_(buffer), text_(sm.Text(buffer)), offsets_(text_), sink_(sink), runs_(runs) {}

  SourceRange Range(antlr4::Token* t) const {
    if (!t || t->getType() == antlr4::Token::EOF) {
      uint32_t end = static_cast<uint32_t>(text_.size());
      return {buffer_, end, end};
    }
    return {buffer_, offsets_.Byte(t->getStartIndex()), offsets_.Byte(t->getStopIndex() + 1)};
  }
  SourceRange Range(antlr4::ParserRuleContext* ctx) const {
    SourceRange a = Range(ctx->getStart());
    antlr4::Token* stop = ctx->getStop();
    if (!stop || stop->getTokenIndex() < ctx->getStart()->getTokenIndex())
      return {buffer_, a.begin, a.begin};
    SourceRange b = Range(stop);
    return {buffer_, a.begin, std::max(a.begin, b.end)};
  }
  SourceRange Join(SourceRange a, SourceRange b) const { return {buffer_, a.begin, b.end}; }

  ast::Name NameOf(antlr4::Token* t) const { return {t->getText(), Range(t)}; }
  ast::Name NameOf(antlr4::tree::TerminalNode* n) const { return NameOf(n->getSymbol()); }

  std::vector<ast::Name> Path(PlanParser::PathContext* ctx) const {
    std::vector<ast::Name> out;
    for (auto* n : ctx->NAME()) out.push_back(NameOf(n));
    return out;
  }

  std::string Unescape(antlr4::Token* t) const { return Unescape(t->getText()); }
  static std::string Unescape(const std::string& raw);

  std::unique_ptr<ast::Block> Block(PlanParser::BlockContext* ctx);

  // Streaming: the parser calls this as it leaves a member, an expression or a top-level item,
  // before it releases the parse tree below it. The node is built into the AST at once and kept
  // until its parent is built; the diagnostics building it reported wait with it, so that they
  // come in the same order as from a walk over the whole tree.
  void Released(antlr4::ParserRuleContext* ctx);
  // Starts a streaming parse (or, with `on` false, a parse whose tree is kept whole), forgetting
  // what an earlier attempt built.
  void StartParse(bool on);

  ast::Member Member(PlanParser::MemberContext* ctx);

  std::unique_ptr<ast::Expr> Binary(std::string op, std::unique_ptr<ast::Expr> a,
                                    std::unique_ptr<ast::Expr> b);

  // True once an expression nested past kMaxNesting levels was reported; the builder then stops
  // growing it, and Parse refuses the buffer.
  bool too_deep() const { return too_deep_; }

  // Records the depth of `e` (1 + its deepest operand); past kMaxNesting, reports it once.
  std::unique_ptr<ast::Expr> Tracked(std::unique_ptr<ast::Expr> e);

  std::unique_ptr<ast::Expr> Expr(PlanParser::ExprContext* ctx);

  std::unique_ptr<ast::Expr> Or(PlanParser::OrExprContext* ctx);
  std::unique_ptr<ast::Expr> And(PlanParser::AndExprContext* ctx);
  std::unique_ptr<ast::Expr> Not(PlanParser::NotExprContext* ctx);
  std::unique_ptr<ast::Expr> Compare(PlanParser::CompareExprContext* ctx);
  std::unique_ptr<ast::Expr> Add(PlanParser::AddExprContext* ctx);
  std::unique_ptr<ast::Expr> Mul(PlanParser::MulExprContext* ctx);
  void ReportTooLarge(SourceRange range, const std::string& text);

  // A unary expression; 9223372036854775808 (2^63) is an error unless negated right here.
  std::unique_ptr<ast::Expr> Unary(PlanParser::UnaryExprContext* ctx);
  std::unique_ptr<ast::Expr> UnaryOrMinLiteral(PlanParser::UnaryExprContext* ctx);

  std::vector<std::unique_ptr<ast::Expr>> Exprs(const std::vector<PlanParser::ExprContext*>& v);

  std::unique_ptr<ast::Expr> Primary(PlanParser::PrimaryContext* ctx);

  void Number(PlanParser::NumberPrimaryContext* ctx, ast::Expr* e);

  // The value of an INT or REAL token with text `text` at `range`.
  void NumberValue(size_t type, const std::string& text, SourceRange range, ast::Expr* e);

  void Unit(PlanParser::NumberPrimaryContext* ctx, ast::Expr* e);

  // After list element `x`: the elements ListRunSource took out after it, if any.
  void AppendRun(PlanParser::ExprContext* x, std::vector<std::unique_ptr<ast::Expr>>* out);

  // A literal element as Unary(Primary(...)) builds it from the parse tree.
  std::unique_ptr<ast::Expr> RunElement(const parse_internal::LiteralRef& r);

  void Module(PlanParser::FileContext* ctx, ast::Module* module);

  // Adds one top-level item to `module` (an unknown kind of record is reported and skipped).
  void Item(PlanParser::TopItemContext* item, ast::Module* module);

 private:
  uint32_t buffer_;
  std::string_view text_;
  OffsetMap offsets_;
  DiagnosticSink& sink_;
  const Runs& runs_;
  std::unordered_map<const ast::Expr*, int> depth_;
  bool too_deep_ = false;

  void Report(Diagnostic d) {
    if (collector_) {
      collector_->push_back(std::move(d));
    } else {
      sink_.Report(std::move(d));
    }
  }
  void Report(Diag d) { Report(std::move(d).Take()); }

  // Streaming state (see Released): built nodes waiting for their parents.
  struct PendingExpr {
    std::unique_ptr<ast::Expr> expr;
    std::vector<Diagnostic> diags;
  };
  struct PendingBlock {
    std::vector<ast::Member> members;
    std::vector<Diagnostic> diags;
  };
  struct PendingList {
    std::vector<std::unique_ptr<ast::Expr>> elements;
    std::vector<Diagnostic> diags;
  };
  bool streaming_ = false;
  std::vector<Diagnostic>* collector_ = nullptr;  // where Report goes while building a node
  std::unordered_map<const antlr4::ParserRuleContext*, PendingExpr> exprs_;
  std::unordered_map<const antlr4::tree::ParseTree*, PendingBlock> blocks_;
  std::unordered_map<const antlr4::tree::ParseTree*, PendingList> lists_;
  ast::Module items_;                   // the top-level items built so far
  std::vector<Diagnostic> item_diags_;  // and what building them reported
};

}  // namespace paraplan::parse_internal

#endif  // PARAPLAN_COMPILER_PARSE_PARSE_BUILDER_H_
