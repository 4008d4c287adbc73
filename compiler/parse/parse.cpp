#include "compiler/parse/parse.h"

#include <fmt/format.h>

#include <cmath>
#include <cstdlib>
#include <exception>
#include <new>
#include <optional>
#include <string>
#include <unordered_map>

#include "PlanLexer.h"
#include "PlanParser.h"
#include "antlr4-runtime.h"
#include "compiler/ast/names.h"
#include "compiler/base/checked.h"
#include "compiler/parse/lean_runtime.h"
#include "compiler/plan/plan.h"

namespace paraplan {
namespace {

using paraplan_grammar::PlanLexer;
using paraplan_grammar::PlanParser;

// Returns the byte offset of the first byte that is not valid UTF-8, or npos.
size_t FirstInvalidUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    if (n == 0 || i + n > s.size()) return i;
    uint32_t cp = n == 1 ? c : n == 2 ? (c & 0x1F) : n == 3 ? (c & 0x0F) : (c & 0x07);
    for (size_t k = 1; k < n; ++k) {
      unsigned char cc = static_cast<unsigned char>(s[i + k]);
      if ((cc >> 6) != 0x2) return i;
      cp = (cp << 6) | (cc & 0x3F);
    }
    // Overlong forms, surrogates and values past U+10FFFF are not UTF-8.
    if ((n == 2 && cp < 0x80) || (n == 3 && cp < 0x800) || (n == 4 && cp < 0x10000) ||
        cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
      return i;
    }
    i += n;
  }
  return std::string_view::npos;
}

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

// The first syntax error of one parse; the strategy below stops parsing right after it.
struct SyntaxErrorInfo {
  bool seen = false;
  antlr4::Token* token = nullptr;
  std::vector<size_t> expected;
  // Where recovery starts skipping (a token index): the start of the member or top-level item
  // the error is in, or the offending token itself when it is between members or items.
  size_t skip_from = 0;
  bool in_block = false;  // the error is inside a `{ ... }` block (members), not at top level
  // Set when the error is between members or declarations, where ANTLR would only name `}` or
  // end of file: what can really come there, in words.
  std::string expected_text;
};

// The token type of a one-character token such as `{`, `}`, `[` or `,`.
size_t CharToken(char c) {
  static antlr4::ANTLRInputStream empty("");
  static PlanLexer lexer(&empty);
  const auto& vocab = lexer.getVocabulary();
  const std::string literal = std::string("'") + c + "'";
  for (size_t t = 1; t <= vocab.getMaxTokenType(); ++t) {
    if (vocab.getLiteralName(t) == literal) return t;
  }
  return 0;
}

// Fills the recovery site of `info` from the rule contexts the parser is in at the error.
void FindRecoverySite(antlr4::Parser* parser, antlr4::Token* offending, SyntaxErrorInfo* info) {
  size_t at = offending ? offending->getTokenIndex() : 0;
  info->skip_from = at;
  info->in_block = false;
  for (antlr4::tree::ParseTree* c = parser->getContext(); c; c = c->parent) {
    auto* ctx = dynamic_cast<antlr4::ParserRuleContext*>(c);
    if (!ctx) break;
    size_t rule = ctx->getRuleIndex();
    if (rule == PlanParser::RuleMember || rule == PlanParser::RuleTopItem) {
      if (ctx->getStart()) info->skip_from = std::min(at, ctx->getStart()->getTokenIndex());
      info->in_block = rule == PlanParser::RuleMember;
      return;
    }
    if (rule == PlanParser::RuleBlock) {
      info->in_block = true;
      if (info->expected == std::vector<size_t>{CharToken('}')})
        info->expected_text = "`}` or another member";
      return;
    }
    if (rule == PlanParser::RuleFile) {
      if (info->expected == std::vector<size_t>{antlr4::Token::EOF}) {
        info->expected_text = "a declaration or `import`";
      }
      return;
    }
  }
}

class StopAtFirstError : public antlr4::DefaultErrorStrategy {
 public:
  explicit StopAtFirstError(SyntaxErrorInfo* info) : info_(info) {}
  void reportError(antlr4::Parser* parser, const antlr4::RecognitionException& e) override {
    antlr4::Token* offending =
        e.getOffendingToken() ? e.getOffendingToken() : parser->getCurrentToken();
    // After a lookahead that consumed part of an alternative, the expected set of the decision
    // is what could start it, not what could follow the part that was read: say that instead.
    if (auto* nva = dynamic_cast<const antlr4::NoViableAltException*>(&e)) {
      if (auto expected = AfterPrefix(parser, nva, offending)) {
        if (info_->seen) return;
        info_->seen = true;
        info_->token = offending;
        info_->expected = *expected;
        FindRecoverySite(parser, offending, info_);
        return;
      }
    }
    Record(parser, offending, e.getExpectedTokens());
  }
  void recover(antlr4::Parser*, std::exception_ptr) override {
    throw antlr4::ParseCancellationException();
  }
  antlr4::Token* recoverInline(antlr4::Parser* parser) override {
    Record(parser, parser->getCurrentToken(), parser->getExpectedTokens());
    throw antlr4::ParseCancellationException();
  }
  void sync(antlr4::Parser*) override {}

 private:
  static std::optional<std::vector<size_t>> AfterPrefix(antlr4::Parser* parser,
                                                        const antlr4::NoViableAltException* e,
                                                        antlr4::Token* offending) {
    antlr4::Token* start = e->getStartToken();
    if (!start || !offending || start->getTokenIndex() >= offending->getTokenIndex()) {
      return std::nullopt;
    }
    auto* stream = parser->getTokenStream();
    std::vector<size_t> prefix;
    for (size_t i = start->getTokenIndex(); i < offending->getTokenIndex(); ++i) {
      prefix.push_back(stream->get(i)->getType());
    }
    bool path = prefix.size() % 2 == 1;
    for (size_t i = 0; i < prefix.size() && path; ++i) {
      path = prefix[i] == (i % 2 == 0 ? static_cast<size_t>(PlanParser::NAME) : DotToken());
    }
    auto* ctx = dynamic_cast<antlr4::ParserRuleContext*>(e->getCtx());
    size_t rule = ctx ? ctx->getRuleIndex() : SIZE_MAX;
    if (rule == PlanParser::RuleMember && path) {
      return std::vector<size_t>{DotToken(), Literal("'='"), Literal("'{'")};
    }
    if (rule == PlanParser::RuleTopItem && prefix == std::vector<size_t>{PlanParser::NAME}) {
      return std::vector<size_t>{PlanParser::NAME};
    }
    if (rule == PlanParser::RuleTopItem &&
        prefix == std::vector<size_t>{PlanParser::NAME, PlanParser::NAME}) {
      return std::vector<size_t>{PlanParser::EXTENDS, Literal("'{'")};
    }
    return std::nullopt;
  }
  static size_t Literal(std::string_view literal) {
    const auto& vocab = VocabularyOf();
    for (size_t t = 1; t <= vocab.getMaxTokenType(); ++t) {
      if (vocab.getLiteralName(t) == literal) return t;
    }
    return 0;
  }
  static size_t DotToken() { return Literal("'.'"); }
  static const antlr4::dfa::Vocabulary& VocabularyOf() {
    static antlr4::ANTLRInputStream empty("");
    static PlanLexer lexer(&empty);
    return lexer.getVocabulary();
  }

  void Record(antlr4::Parser* parser, antlr4::Token* token,
              const antlr4::misc::IntervalSet& expected) {
    if (info_->seen) return;
    info_->seen = true;
    info_->token = token;
    for (ssize_t t : expected.toList()) info_->expected.push_back(static_cast<size_t>(t));
    FindRecoverySite(parser, token, info_);
  }
  SyntaxErrorInfo* info_;
};

std::string Describe(const antlr4::dfa::Vocabulary& vocab, size_t type) {
  if (type == antlr4::Token::EOF) return "end of file";
  switch (type) {
    case PlanParser::NAME:
      return "a name";
    case PlanParser::INT:
    case PlanParser::REAL:
      return "a number";
    case PlanParser::STRING:
      return "a string";
    default:
      break;
  }
  std::string literal = vocab.getLiteralName(type);
  if (literal.size() >= 2 && literal.front() == '\'') {
    return "`" + literal.substr(1, literal.size() - 2) + "`";
  }
  return vocab.getSymbolicName(type);
}

std::string ExpectedList(const antlr4::dfa::Vocabulary& vocab, const std::vector<size_t>& types) {
  auto has = [&](size_t t) { return std::find(types.begin(), types.end(), t) != types.end(); };
  std::vector<std::string> words;
  bool expression = has(PlanParser::INT) && has(PlanParser::STRING) && has(PlanParser::AUTO);
  if (expression) words.push_back("an expression");
  for (size_t t : types) {
    if (expression &&
        (t == PlanParser::INT || t == PlanParser::REAL || t == PlanParser::STRING ||
         t == PlanParser::AUTO || t == PlanParser::TRUE || t == PlanParser::FALSE ||
         t == PlanParser::NAME || t == PlanParser::NOT || vocab.getLiteralName(t) == "'-'" ||
         vocab.getLiteralName(t) == "'('" || vocab.getLiteralName(t) == "'['")) {
      continue;
    }
    std::string w = Describe(vocab, t);
    if (std::find(words.begin(), words.end(), w) == words.end()) words.push_back(w);
  }
  if (words.size() > 8) return "something else";
  std::string out;
  for (size_t i = 0; i < words.size(); ++i) {
    if (i) out += i + 1 == words.size() ? " or " : ", ";
    out += words[i];
  }
  return out;
}

std::string Printable(std::string_view s) {
  if (s.size() == 1 && (static_cast<unsigned char>(s[0]) < 0x20 || s[0] == 0x7F)) {
    return fmt::format("U+{:04X}", static_cast<unsigned>(static_cast<unsigned char>(s[0])));
  }
  return std::string(s);
}

// How deep brackets, blocks, unary operators and chains of binary operators may nest. Real plans
// stay below 10; the limit keeps the recursive parser and evaluator far from the end of the stack.
constexpr int kMaxNesting = 100;

Diag TooDeep(SourceRange range, std::string_view what, std::string_view label) {
  return Diag(DiagKind::kNestingTooDeep,
              fmt::format("{} nests more than {} levels deep", what, kMaxNesting))
      .At(range, std::string(label))
      .Note(
          "every bracket, block, unary `-` or `not` and binary operator is a level; plans need a "
          "few")
      .Help("name parts of it with `let` (`let a = ...`), or write the value itself");
}

// The tokens of a filled stream by index, read in place (getTokens() would copy its vector).
class TokenList {
 public:
  explicit TokenList(antlr4::BufferedTokenStream& stream) : stream_(&stream) {}
  size_t size() const { return stream_->size(); }
  antlr4::Token* operator[](size_t i) const { return stream_->get(i); }

  class Iterator {
   public:
    Iterator(const TokenList* list, size_t i) : list_(list), i_(i) {}
    antlr4::Token* operator*() const { return (*list_)[i_]; }
    Iterator& operator++() {
      ++i_;
      return *this;
    }
    bool operator!=(const Iterator& o) const { return i_ != o.i_; }

   private:
    const TokenList* list_;
    size_t i_;
  };
  Iterator begin() const { return {this, 0}; }
  Iterator end() const { return {this, size()}; }

 private:
  antlr4::BufferedTokenStream* stream_;
};

// The first token at which brackets, braces and runs of prefix operators open more than
// kMaxNesting levels, or nullptr. Checked before ANTLR parses, whose recursion follows them.
antlr4::Token* FirstTooDeep(const TokenList& tokens) {
  int open = 0, prefix = 0;
  for (antlr4::Token* t : tokens) {
    const std::string text = t->getType() == PlanLexer::NAME ? "" : t->getText();
    if (text == "(" || text == "[" || text == "{") {
      ++open;
    } else if (text == ")" || text == "]" || text == "}") {
      open = std::max(0, open - 1);
      prefix = 0;
    } else if (text == "-" || t->getType() == PlanLexer::NOT) {
      ++prefix;
    } else {
      prefix = 0;
    }
    if (open + prefix > kMaxNesting) return t;
  }
  return nullptr;
}

// A list literal `[a, b, c]`: the parse-tree node whose elements LeanParser releases one by one.
// Every parent in the tree is a rule context; the rule index is checked before the (slower)
// cast.
bool IsList(const antlr4::tree::ParseTree* node) {
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
  static std::string Unescape(const std::string& raw) {
    std::string out;
    for (size_t i = 1; i + 1 < raw.size(); ++i) {
      if (raw[i] == '\\' && i + 2 < raw.size()) {
        char c = raw[++i];
        out += c == 'n' ? '\n' : c == 't' ? '\t' : c;
      } else {
        out += raw[i];
      }
    }
    return out;
  }

  std::unique_ptr<ast::Block> Block(PlanParser::BlockContext* ctx) {
    auto b = std::make_unique<ast::Block>();
    b->range = Range(ctx);
    if (streaming_) {
      auto it = blocks_.find(ctx);
      if (it != blocks_.end()) {
        for (Diagnostic& d : it->second.diags) Report(std::move(d));
        b->members = std::move(it->second.members);
        blocks_.erase(it);
      }
      return b;
    }
    for (auto* m : ctx->member()) b->members.push_back(Member(m));
    return b;
  }

  // Streaming: the parser calls this as it leaves a member, an expression or a top-level item,
  // before it releases the parse tree below it. The node is built into the AST at once and kept
  // until its parent is built; the diagnostics building it reported wait with it, so that they
  // come in the same order as from a walk over the whole tree.
  void Released(antlr4::ParserRuleContext* ctx) {
    switch (ctx->getRuleIndex()) {
      case PlanParser::RuleExpr: {
        auto* e = static_cast<PlanParser::ExprContext*>(ctx);
        PendingExpr pending;
        collector_ = &pending.diags;
        pending.expr = Or(e->orExpr());
        collector_ = nullptr;
        if (IsList(ctx->parent)) {
          // An element: the parser frees the list's own nodes as it goes (see LeanParser).
          PendingList& list = lists_[ctx->parent];
          list.elements.push_back(std::move(pending.expr));
          for (Diagnostic& d : pending.diags) list.diags.push_back(std::move(d));
          collector_ = &list.diags;
          AppendRun(e, &list.elements);
          collector_ = nullptr;
        } else {
          exprs_[e] = std::move(pending);
        }
        break;
      }
      case PlanParser::RuleMember: {
        std::vector<Diagnostic> diags;
        collector_ = &diags;
        ast::Member m = Member(static_cast<PlanParser::MemberContext*>(ctx));
        collector_ = nullptr;
        PendingBlock& block = blocks_[ctx->parent];
        block.members.push_back(std::move(m));
        for (Diagnostic& d : diags) block.diags.push_back(std::move(d));
        break;
      }
      case PlanParser::RuleTopItem:
        collector_ = &item_diags_;
        Item(static_cast<PlanParser::TopItemContext*>(ctx), &items_);
        collector_ = nullptr;
        break;
      default:
        break;
    }
  }
  // Starts a streaming parse (or, with `on` false, a parse whose tree is kept whole), forgetting
  // what an earlier attempt built.
  void StartParse(bool on) {
    streaming_ = on;
    exprs_.clear();
    blocks_.clear();
    lists_.clear();
    items_ = ast::Module();
    item_diags_.clear();
    depth_.clear();
    too_deep_ = false;
  }

  ast::Member Member(PlanParser::MemberContext* ctx) {
    ast::Member m;
    m.range = Range(ctx);
    if (auto* a = dynamic_cast<PlanParser::AssignMemberContext*>(ctx)) {
      m.kind = ast::MemberKind::kAssign;
      m.path = Path(a->path());
      m.value = Expr(a->expr());
    } else if (auto* a = dynamic_cast<PlanParser::AmendMemberContext*>(ctx)) {
      m.kind = ast::MemberKind::kAmend;
      m.path = Path(a->path());
      m.block = Block(a->block());
    } else if (auto* l = dynamic_cast<PlanParser::LetMemberContext*>(ctx)) {
      m.kind = ast::MemberKind::kLet;
      m.path.push_back(NameOf(l->letDecl()->NAME()));
      m.value = Expr(l->letDecl()->expr());
    } else if (auto* r = dynamic_cast<PlanParser::RequireMemberContext*>(ctx)) {
      m.kind = ast::MemberKind::kRequire;
      m.value = Expr(r->expr());
      if (r->STRING()) {
        m.message = Unescape(r->STRING()->getSymbol());
        m.message_range = Range(r->STRING()->getSymbol());
      }
    }
    // A trailing separator is not part of the member.
    if (ctx->children.size() > 1) {
      if (auto* sep = dynamic_cast<PlanParser::SeparatorContext*>(ctx->children.back())) {
        m.range.end = Range(sep).begin;
        while (m.range.end > m.range.begin &&
               (text_[m.range.end - 1] == ' ' || text_[m.range.end - 1] == '\t')) {
          --m.range.end;
        }
      }
    }
    return m;
  }

  std::unique_ptr<ast::Expr> Binary(std::string op, std::unique_ptr<ast::Expr> a,
                                    std::unique_ptr<ast::Expr> b) {
    auto e = std::make_unique<ast::Expr>();
    e->kind = ast::ExprKind::kBinary;
    e->range = Join(a->range, b->range);
    e->text = std::move(op);
    e->operands.push_back(std::move(a));
    e->operands.push_back(std::move(b));
    return Tracked(std::move(e));
  }

  // True once an expression nested past kMaxNesting levels was reported; the builder then stops
  // growing it, and Parse refuses the buffer.
  bool too_deep() const { return too_deep_; }

  // Records the depth of `e` (1 + its deepest operand); past kMaxNesting, reports it once.
  std::unique_ptr<ast::Expr> Tracked(std::unique_ptr<ast::Expr> e) {
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

  std::unique_ptr<ast::Expr> Expr(PlanParser::ExprContext* ctx) {
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

  std::unique_ptr<ast::Expr> Or(PlanParser::OrExprContext* ctx) {
    auto parts = ctx->andExpr();
    auto e = And(parts[0]);
    for (size_t i = 1; i < parts.size() && !too_deep_; ++i)
      e = Binary("or", std::move(e), And(parts[i]));
    return e;
  }
  std::unique_ptr<ast::Expr> And(PlanParser::AndExprContext* ctx) {
    auto parts = ctx->notExpr();
    auto e = Not(parts[0]);
    for (size_t i = 1; i < parts.size() && !too_deep_; ++i)
      e = Binary("and", std::move(e), Not(parts[i]));
    return e;
  }
  std::unique_ptr<ast::Expr> Not(PlanParser::NotExprContext* ctx) {
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
  std::unique_ptr<ast::Expr> Compare(PlanParser::CompareExprContext* ctx) {
    auto parts = ctx->addExpr();
    auto e = Add(parts[0]);
    if (parts.size() > 1) e = Binary(ctx->op->getText(), std::move(e), Add(parts[1]));
    return e;
  }
  std::unique_ptr<ast::Expr> Add(PlanParser::AddExprContext* ctx) {
    auto parts = ctx->mulExpr();
    auto e = Mul(parts[0]);
    for (size_t i = 1; i < parts.size() && !too_deep_; ++i) {
      e = Binary(ctx->ops[i - 1]->getText(), std::move(e), Mul(parts[i]));
    }
    return e;
  }
  std::unique_ptr<ast::Expr> Mul(PlanParser::MulExprContext* ctx) {
    auto parts = ctx->unaryExpr();
    auto e = Unary(parts[0]);
    for (size_t i = 1; i < parts.size() && !too_deep_; ++i) {
      e = Binary(ctx->ops[i - 1]->getText(), std::move(e), Unary(parts[i]));
    }
    return e;
  }
  void ReportTooLarge(SourceRange range, const std::string& text) {
    Report(Diag(DiagKind::kNumberTooLarge,
                fmt::format("integer literal `{}` does not fit in 64 bits", text))
               .At(range, "larger than 9223372036854775807")
               .Note("integers are signed 64-bit; sizes past that are not meaningful"));
  }

  // A unary expression; 9223372036854775808 (2^63) is an error unless negated right here.
  std::unique_ptr<ast::Expr> Unary(PlanParser::UnaryExprContext* ctx) {
    auto e = UnaryOrMinLiteral(ctx);
    if (e->kind == ast::ExprKind::kInt && e->text == "min") {
      ReportTooLarge(e->range, "9223372036854775808");
      e->text.clear();
      e->out_of_range = true;
    }
    return e;
  }
  std::unique_ptr<ast::Expr> UnaryOrMinLiteral(PlanParser::UnaryExprContext* ctx) {
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

  std::vector<std::unique_ptr<ast::Expr>> Exprs(const std::vector<PlanParser::ExprContext*>& v) {
    std::vector<std::unique_ptr<ast::Expr>> out;
    for (auto* x : v) out.push_back(Expr(x));
    return out;
  }

  std::unique_ptr<ast::Expr> Primary(PlanParser::PrimaryContext* ctx) {
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

  void Number(PlanParser::NumberPrimaryContext* ctx, ast::Expr* e) {
    antlr4::Token* t = ctx->number()->getStart();
    NumberValue(t->getType(), t->getText(), Range(t), e);
    Unit(ctx, e);
  }

  // The value of an INT or REAL token with text `text` at `range`.
  void NumberValue(size_t type, const std::string& text, SourceRange range, ast::Expr* e) {
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
        Report(
            Diag(DiagKind::kNumberTooLarge, fmt::format("real literal `{}` is out of range", text))
                .At(range, "not a finite number"));
        e->real_value = 0;
        e->out_of_range = true;
      }
    }
  }

  void Unit(PlanParser::NumberPrimaryContext* ctx, ast::Expr* e) {
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

  // After list element `x`: the elements ListRunSource took out after it, if any.
  void AppendRun(PlanParser::ExprContext* x, std::vector<std::unique_ptr<ast::Expr>>* out) {
    if (runs_.empty() || x->getStart() != x->getStop()) return;
    auto it = runs_.find(x->getStart()->getStartIndex());
    if (it == runs_.end()) return;
    out->reserve(out->size() + it->second.size());
    for (const parse_internal::LiteralRef& r : it->second) out->push_back(RunElement(r));
  }

  // A literal element as Unary(Primary(...)) builds it from the parse tree.
  std::unique_ptr<ast::Expr> RunElement(const parse_internal::LiteralRef& r) {
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

  void Module(PlanParser::FileContext* ctx, ast::Module* module) {
    if (streaming_) {
      // The items were built as the parser left them (Released); their diagnostics come now,
      // in the order of the text, as a walk over the whole tree would report them.
      for (Diagnostic& d : item_diags_) Report(std::move(d));
      item_diags_.clear();
      module->imports = std::move(items_.imports);
      module->decls = std::move(items_.decls);
      return;
    }
    for (auto* item : ctx->topItem()) Item(item, module);
  }

  // Adds one top-level item to `module` (an unknown kind of record is reported and skipped).
  void Item(PlanParser::TopItemContext* item, ast::Module* module) {
    if (auto* i = dynamic_cast<PlanParser::TopImportContext*>(item)) {
      auto* d = i->importDecl();
      ast::Import imp;
      imp.range = Range(d);
      if (d->STRING()) {
        imp.file = Unescape(d->STRING()->getSymbol());
        imp.file_range = Range(d->STRING()->getSymbol());
      } else {
        for (auto* n : d->dottedName()->NAME()) imp.module.push_back(NameOf(n));
        imp.file_range = Range(d->dottedName());
      }
      module->imports.push_back(std::move(imp));
    } else if (auto* l = dynamic_cast<PlanParser::TopLetContext*>(item)) {
      ast::Decl d;
      d.kind = ast::DeclKind::kLet;
      d.range = Range(l->letDecl());
      d.keyword = NameOf(l->letDecl()->LET());
      d.name = NameOf(l->letDecl()->NAME());
      d.base = Expr(l->letDecl()->expr());
      module->decls.push_back(std::move(d));
    } else if (auto* r = dynamic_cast<PlanParser::TopRecordContext*>(item)) {
      ast::Decl d;
      d.range = Join(Range(r->kindName), Range(r->block()));
      d.keyword = NameOf(r->kindName);
      d.name = NameOf(r->recordName);
      static const std::vector<std::string_view> kKinds = {"gpu", "cluster", "model", "plan"};
      const std::string& k = d.keyword.text;
      if (k == "gpu") {
        d.kind = ast::DeclKind::kGpu;
      } else if (k == "cluster") {
        d.kind = ast::DeclKind::kCluster;
      } else if (k == "model") {
        d.kind = ast::DeclKind::kModel;
      } else if (k == "plan") {
        d.kind = ast::DeclKind::kPlan;
      } else {
        Diag diag(DiagKind::kUnknownDeclarationKind,
                  fmt::format("`{}` is not a kind of record", k));
        diag.At(d.keyword.range, "expected `gpu`, `cluster`, `model` or `plan`");
        std::string guess = ast::ClosestName(k, kKinds);
        if (!guess.empty()) diag.Help(fmt::format("did you mean `{} {}`?", guess, d.name.text));
        Report(std::move(diag));
        return;
      }
      if (r->base) {
        auto base = std::make_unique<ast::Expr>();
        base->kind = ast::ExprKind::kPath;
        base->range = Range(r->base);
        base->path = Path(r->base);
        d.base = std::move(base);
      }
      d.body = Block(r->block());
      module->decls.push_back(std::move(d));
    }
  }

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

// At most this many syntax errors are reported per buffer; parsing stops after them.
constexpr int kMaxSyntaxErrors = 20;

// Error recovery: the end (a token index, exclusive) of the text to skip after a syntax error
// at `info`. Skipping starts at info.skip_from, the member or top-level item the error is in,
// and runs to the next member or item that starts a line of its own (a name, `let`, `require`
// or `import` outside any bracket opened in the skipped text), to a `;` or `,` that ends the
// member, or to the `}` that closes the enclosing block (kept). The skipped tokens are hidden
// and the buffer parsed again, so the next error reported is one the user wrote, not an echo of
// the first. Returns the index of EOF when the rest of the buffer is skipped.
size_t RecoveryEnd(const TokenList& all, const SyntaxErrorInfo& info) {
  const size_t error_at = info.token->getTokenIndex();
  auto text_is = [](antlr4::Token* t, char c) {
    const std::string& x = t->getText();
    return t->getType() != PlanLexer::STRING && x.size() == 1 && x[0] == c;
  };
  auto starts_item = [&](antlr4::Token* t) {
    size_t type = t->getType();
    if (type == PlanLexer::NAME || type == PlanLexer::LET) return true;
    return info.in_block ? type == PlanLexer::REQUIRE : type == PlanLexer::IMPORT;
  };
  std::vector<char> open;  // brackets opened in the skipped text, innermost last
  for (size_t k = info.skip_from; k < all.size(); ++k) {
    antlr4::Token* t = all[k];
    if (t->getType() == antlr4::Token::EOF) return k;
    if (t->getChannel() != antlr4::Token::DEFAULT_CHANNEL) continue;
    const bool past_error = k >= error_at && k > info.skip_from;
    const bool line_start = k == 0 || all[k - 1]->getLine() < t->getLine();
    if (past_error && open.empty() && line_start && starts_item(t)) return k;
    if (text_is(t, '{') || text_is(t, '[') || text_is(t, '(')) {
      open.push_back(t->getText()[0]);
    } else if (text_is(t, '}') || text_is(t, ']') || text_is(t, ')')) {
      char want = t->getText()[0] == '}' ? '{' : t->getText()[0] == ']' ? '[' : '(';
      auto it = std::find(open.rbegin(), open.rend(), want);
      if (it != open.rend()) {
        open.erase(std::prev(it.base()), open.end());
      } else if (want == '{' && info.in_block) {
        return k;  // closes the block the error is in: keep it
      }
    } else if ((text_is(t, ';') || text_is(t, ',')) && open.empty() && k >= error_at) {
      return k + 1;
    }
  }
  return all.size();
}

// `tp =` at the end of a line with the value forgotten: the next line's member (`pp = 4`) is
// read as the value (`tp = pp`) and the parser stops at its `=`. Given the offending `=` of a
// syntax error between members, finds that shape: the `=` without a value and the first token
// of its member. nullopt when the error is something else.
struct MissingValue {
  size_t member_start;  // `tp`
  size_t equals;        // the `=` that ends its line
  size_t value_start;   // `pp`, read as the value
};
std::optional<MissingValue> FindMissingValue(const TokenList& all, size_t at) {
  if (at >= all.size() || all[at]->getText() != "=") return std::nullopt;
  auto visible_before = [&](size_t k) -> std::optional<size_t> {
    while (k > 0) {
      --k;
      if (all[k]->getChannel() == antlr4::Token::DEFAULT_CHANNEL) return k;
    }
    return std::nullopt;
  };
  // Walks back over a path `a.b.c` ending right before `end`; its first token.
  auto path_start = [&](size_t end) -> std::optional<size_t> {
    auto k = visible_before(end);
    if (!k || all[*k]->getType() != PlanLexer::NAME) return std::nullopt;
    size_t first = *k;
    for (;;) {
      auto dot = visible_before(first);
      if (!dot || all[*dot]->getText() != ".") return first;
      auto name = visible_before(*dot);
      if (!name || all[*name]->getType() != PlanLexer::NAME) return first;
      first = *name;
    }
  };
  auto value = path_start(at);
  if (!value) return std::nullopt;
  auto equals = visible_before(*value);
  if (!equals || all[*equals]->getText() != "=" ||
      all[*equals]->getLine() >= all[*value]->getLine()) {
    return std::nullopt;
  }
  auto member = path_start(*equals);
  if (!member) return std::nullopt;
  return MissingValue{*member, *equals, *value};
}

// The generated parser, releasing its parse tree as it goes. ANTLR keeps every node of the tree
// (a dozen contexts per `x = 1`) until the parser is destroyed; here, when the parser leaves an
// expression, a member or a top-level item, the builder turns it into AST (Builder::Released)
// and the nodes below it are freed. The parser allocates all nodes through its tracker, so each
// released rule gets a tracker of its own: from the start of its alternative to its end, which
// then holds exactly its descendants. The contexts of a finished member or item stay with the
// block or file around it (the parser is still in them when it leaves) and are freed at the
// next step of the parse. Live at any time: the rules the parser is in, the parts of them read
// so far, and the AST.
//
// Without `builder` the tree is released unbuilt (a parse that only looks for syntax errors).
// With `release` false this is the plain generated parser, which keeps the whole tree.
class LeanParser final : public PlanParser, private antlr4::tree::ParseTreeListener {
 public:
  LeanParser(antlr4::TokenStream* input, bool release, Builder* builder,
             const SyntaxErrorInfo* error)
      : PlanParser(input), release_(release), builder_(builder), error_(error) {
    if (release_) addParseListener(this);
  }
  ~LeanParser() override {
    removeParseListeners();
    Bury();
    for (Open& o : open_) o.outer.reset();
  }
  LeanParser(const LeanParser&) = delete;
  LeanParser& operator=(const LeanParser&) = delete;

  // Building a node ran out of memory (it cannot throw where it runs, inside ANTLR's exitRule).
  bool out_of_memory() const { return out_of_memory_; }

  void enterRule(antlr4::ParserRuleContext* ctx, size_t state, size_t rule) override {
    Bury();
    if (out_of_memory_) throw std::bad_alloc();
    PlanParser::enterRule(ctx, state, rule);
  }
  void enterOuterAlt(antlr4::ParserRuleContext* ctx, size_t alt) override {
    Bury();
    if (out_of_memory_) throw std::bad_alloc();
    PlanParser::enterOuterAlt(ctx, alt);
    if (!release_) return;
    const size_t rule = ctx->getRuleIndex();
    if (IsBuilt(rule) || IsContainer(ctx)) {
      open_.push_back({ctx, std::move(_tracker)});
      _tracker = antlr4::tree::ParseTreeTracker();
    }
  }

 private:
  static bool IsBuilt(size_t rule) {
    return rule == RuleExpr || rule == RuleMember || rule == RuleTopItem;
  }
  // A file, block or list: its own tracker holds only its tokens and the contexts of its items
  // (top-level items, members, elements), which the builder keeps no pointer to once built.
  static bool IsContainer(const antlr4::ParserRuleContext* ctx) {
    const size_t rule = ctx->getRuleIndex();
    return rule == RuleFile || rule == RuleBlock || IsList(ctx);
  }
  // Frees the contexts of members and items the parser has left.
  void Bury() {
    for (auto& t : graveyard_) t.reset();
    graveyard_.clear();
  }

  void visitTerminal(antlr4::tree::TerminalNode*) override { Bury(); }
  void visitErrorNode(antlr4::tree::ErrorNode*) override {}
  void enterEveryRule(antlr4::ParserRuleContext*) override {}
  // Runs inside exitRule, which goes on to read `ctx` and its parent: neither may be freed
  // here, nor may anything be thrown (exitRule also runs while an exception unwinds).
  void exitEveryRule(antlr4::ParserRuleContext* ctx) override {
    Bury();
    if (open_.empty() || open_.back().ctx != ctx) return;  // entered no alternative
    const size_t rule = ctx->getRuleIndex();
    // While an exception unwinds the parser (a syntax error, or memory running out), the rule
    // is incomplete: nothing is built.
    const bool complete = !error_->seen && !out_of_memory_ && std::uncaught_exceptions() == 0;
    if (IsBuilt(rule) && builder_ && complete) {
      try {
        builder_->Released(ctx);
      } catch (const std::bad_alloc&) {
        out_of_memory_ = true;
      }
    }
    _tracker.reset();  // the nodes below ctx
    ctx->children.clear();
    _tracker = std::move(open_.back().outer);
    open_.pop_back();
    auto* parent = static_cast<antlr4::ParserRuleContext*>(ctx->parent);
    if (parent && !open_.empty() && open_.back().ctx == parent && IsContainer(parent)) {
      // The tracker of the file, block or list around holds its tokens so far and the contexts
      // of this item: nothing the parser reads again once it has left them.
      parent->children.clear();
      graveyard_.push_back(std::move(_tracker));
      _tracker = antlr4::tree::ParseTreeTracker();
    }
  }

  struct Open {
    antlr4::ParserRuleContext* ctx;
    antlr4::tree::ParseTreeTracker outer;  // the tracker in use when ctx's alternative began
  };
  bool release_;
  Builder* builder_;
  const SyntaxErrorInfo* error_;
  bool out_of_memory_ = false;
  std::vector<Open> open_;
  std::vector<antlr4::tree::ParseTreeTracker> graveyard_;
};

// Reports the first byte of the buffer that is not UTF-8, before ANTLR sees the text. Returns
// whether there was one.
bool ReportInvalidUtf8(const SourceManager& sm, uint32_t buffer, DiagnosticSink& sink) {
  std::string_view text = sm.Text(buffer);
  const size_t bad = FirstInvalidUtf8(text);
  if (bad == std::string_view::npos) return false;
  sink.Report(Diag(DiagKind::kUnexpectedCharacter, "the text is not valid UTF-8")
                  .At({buffer, static_cast<uint32_t>(bad), static_cast<uint32_t>(bad + 1)},
                      fmt::format("byte 0x{:02X} starts no UTF-8 character",
                                  static_cast<unsigned>(static_cast<unsigned char>(text[bad]))))
                  .Help("save the file as UTF-8"));
  return true;
}

// ASCII text is read in place; other text is decoded to code points, as ANTLR indexes them.
std::unique_ptr<antlr4::CharStream> OpenCharStream(const SourceManager& sm, uint32_t buffer) {
  std::string_view text = sm.Text(buffer);
  if (parse_internal::IsAscii(text))
    return std::make_unique<parse_internal::ByteCharStream>(text, std::string(sm.Name(buffer)));
  return std::make_unique<antlr4::ANTLRInputStream>(text.data(), text.size());
}

// The lexed buffer, as the error reports below read it.
struct LexedText {
  const SourceManager& sm;
  uint32_t buffer;
  const TokenList& all;
  const Builder& builder;
};

// Reports the collected lexical and syntax errors in the order of the text.
void ReportInTextOrder(std::vector<Diagnostic>& errors, DiagnosticSink& sink) {
  std::stable_sort(errors.begin(), errors.end(), [](const Diagnostic& a, const Diagnostic& b) {
    return a.primary.begin < b.primary.begin;
  });
  for (Diagnostic& d : errors) sink.Report(std::move(d));
}

// A closed `/* ... */` is skipped by the lexer, so `/` right before `*` opens a comment that
// never closes.
std::optional<Diagnostic> UnclosedComment(const LexedText& text) {
  const TokenList& all = text.all;
  for (size_t i = 0; i + 1 < all.size(); ++i) {
    if (all[i]->getText() == "/" && all[i + 1]->getText() == "*" &&
        all[i + 1]->getStartIndex() == all[i]->getStopIndex() + 1) {
      SourceRange r = text.builder.Range(all[i]);
      r.end = text.builder.Range(all[i + 1]).end;
      return Diag(DiagKind::kSyntaxError, "this comment has no closing `*/`")
          .At(r, "the comment starts here and runs to the end of the file")
          .Help("close it with `*/`, or start a line comment with `#` or `//`")
          .Get();
    }
  }
  return std::nullopt;
}

// Adds an error for every unterminated string and unknown character; returns whether there was
// any.
bool CollectLexicalErrors(const LexedText& text, std::vector<Diagnostic>& errors) {
  bool lexical_error = false;
  for (antlr4::Token* t : text.all) {
    if (t->getType() == PlanLexer::UNTERMINATED_STRING) {
      errors.push_back(
          Diag(DiagKind::kUnterminatedString, "this string has no closing `\"`")
              .At(text.builder.Range(t), "the string starts here and runs to the end of the line")
              .Help("close it with `\"` on the same line; write `\\\"` for a quote inside")
              .Get());
      lexical_error = true;
    } else if (t->getType() == PlanLexer::UNKNOWN_CHAR) {
      std::string c = Printable(text.sm.Slice(text.builder.Range(t)));
      errors.push_back(
          Diag(DiagKind::kUnexpectedCharacter, fmt::format("unexpected character `{}`", c))
              .At(text.builder.Range(t), "no token starts with this character")
              .Note("comments start with `#` or `//`; strings are written in `\"`")
              .Get());
      lexical_error = true;
    }
  }
  return lexical_error;
}

// What the token stream says before any parse.
struct LexCheck {
  bool stop = false;           // nothing is to be parsed: report the errors and fail
  bool lexical_error = false;  // a parse may still look for syntax errors, but builds nothing
};

// The errors found before parsing: a comment that never closes, lexical errors, and brackets or
// operators nested too deep for the recursive parser.
LexCheck CheckTokens(const LexedText& text, bool recover, std::vector<Diagnostic>& errors) {
  LexCheck check;
  if (std::optional<Diagnostic> comment = UnclosedComment(text)) {
    errors.push_back(std::move(*comment));
    check.stop = true;
    return check;
  }
  check.lexical_error = CollectLexicalErrors(text, errors);
  if (check.lexical_error && !recover) {
    check.stop = true;
    return check;
  }
  if (antlr4::Token* deep = FirstTooDeep(text.all)) {
    errors.push_back(TooDeep(text.builder.Range(deep), "this text",
                             fmt::format("level {} opens here", kMaxNesting + 1))
                         .Get());
    check.stop = true;
  }
  return check;
}

// `tp =` with its value forgotten (FindMissingValue); `t` is the offending `=`.
Diagnostic MissingValueError(const LexedText& text, const MissingValue& missing, antlr4::Token* t) {
  const TokenList& all = text.all;
  std::string member, value;
  for (size_t k = missing.member_start; k < missing.equals; ++k) member += all[k]->getText();
  for (size_t k = missing.value_start; k < t->getTokenIndex(); ++k) value += all[k]->getText();
  return Diag(DiagKind::kSyntaxError, fmt::format("`{} =` has no value", member))
      .At(text.builder.Range(all[missing.equals]), "expected an expression after `=` on this line")
      .Label(text.builder.Range(t), fmt::format("so `{}` on the next line was read as the value, "
                                                "and this `=` cannot follow it",
                                                value))
      .Note("a value may continue on the next line; write it after `=`")
      .Get();
}

// A declaration keyword at the left margin inside a block: most likely a `}` is missing above.
void HelpWithMissingBrace(const LexedText& text, const SyntaxErrorInfo& info, Diag& d) {
  antlr4::Token* first = text.all[info.skip_from];
  static const std::vector<std::string> kDeclKinds = {"gpu", "cluster", "model", "plan"};
  if (first->getType() == PlanLexer::NAME && first->getCharPositionInLine() == 0 &&
      std::find(kDeclKinds.begin(), kDeclKinds.end(), first->getText()) != kDeclKinds.end()) {
    d.Help(
        fmt::format("`{}` at the left margin looks like a new declaration, but it is read "
                    "inside the block of the one above: is a `}}` missing before it?",
                    first->getText()));
  }
}

// `vocab = 1000 seq_len 128`: a name after a number is read as its unit.
void HelpWithNameReadAsUnit(const LexedText& text, antlr4::Token* t, Diag& d) {
  if (t->getTokenIndex() < 2) return;
  antlr4::Token* name = text.all[t->getTokenIndex() - 1];
  antlr4::Token* number = text.all[t->getTokenIndex() - 2];
  if (name->getType() == PlanLexer::NAME &&
      (number->getType() == PlanLexer::INT || number->getType() == PlanLexer::REAL) &&
      name->getChannel() == antlr4::Token::DEFAULT_CHANNEL && !FindUnit(name->getText())) {
    d.Label(text.builder.Range(name), fmt::format("read as the unit of `{}`", number->getText()));
    d.Help(fmt::format("is a `=` missing after `{}`?", name->getText()));
  }
}

// A syntax error at `info`: what was expected and what was found, with the likely causes.
Diagnostic SyntaxError(const LexedText& text, const antlr4::dfa::Vocabulary& vocab,
                       const SyntaxErrorInfo& info) {
  antlr4::Token* t = info.token;
  const bool at_eof = !t || t->getType() == antlr4::Token::EOF;
  std::string found = at_eof ? std::string("end of file") : fmt::format("`{}`", t->getText());
  std::string expected =
      info.expected_text.empty() ? ExpectedList(vocab, info.expected) : info.expected_text;
  Diag d(DiagKind::kSyntaxError, expected.empty()
                                     ? fmt::format("unexpected {}", found)
                                     : fmt::format("expected {}, found {}", expected, found));
  d.At(text.builder.Range(t), expected.empty() ? "unexpected here" : "expected " + expected);
  if (text.sm.Kind(text.buffer) == BufferKind::kCommandLine) {
    d.Note(
        "--set takes PATH=VALUE, the value written as in a plan: `--set parallel.tp=4`, "
        "`--set 'parallel.order=\"tp-cp-ep-pp-dp\"'`");
  }
  if (info.in_block) HelpWithMissingBrace(text, info, d);
  if (!at_eof) HelpWithNameReadAsUnit(text, t, d);
  return std::move(d).Take();
}

// Moves the tokens [from, end) to the hidden channel, stopping at end of file, so that the
// next parse does not see them.
void HideTokens(const TokenList& all, size_t from, size_t end) {
  for (size_t k = from; k < end && k < all.size(); ++k) {
    if (all[k]->getType() == antlr4::Token::EOF) break;
    if (auto* w = dynamic_cast<antlr4::WritableToken*>(all[k]))
      w->setChannel(antlr4::Token::HIDDEN_CHANNEL);
  }
}

// Hides the text of the syntax error at `info` (RecoveryEnd), at least its offending token.
// Returns false when nothing is left to parse: what a new parse would report then (a missing
// `}`) would echo the skip.
bool SkipPastError(const TokenList& all, const SyntaxErrorInfo& info) {
  const size_t at = info.token->getTokenIndex();
  size_t end = RecoveryEnd(all, info);
  const size_t from = std::min(info.skip_from, at);
  if (end <= from) end = at + 1;  // skip at least the offending token
  HideTokens(all, from, end);
  return end < all.size() && all[end]->getType() != antlr4::Token::EOF;
}

// Lexes and parses; runs `build` on the tree when the text is well-formed. Returns false when a
// lexical or syntax error was reported. With `recover`, parsing goes on after a syntax error
// (see RecoveryEnd) so that independent errors in other members and declarations are reported
// too, up to kMaxSyntaxErrors; tokens that are lexical errors (already reported) are recovered
// from without a second report.
template <typename Rule, typename Build>
bool Parse(const SourceManager& sm, uint32_t buffer, DiagnosticSink& sink, bool recover, Rule rule,
           Build build) {
  if (ReportInvalidUtf8(sm, buffer, sink)) return false;
  std::unique_ptr<antlr4::CharStream> input = OpenCharStream(sm, buffer);
  parse_internal::TokenArena arena;  // outlives the token stream, which points into it
  parse_internal::LeanLexer lexer(input.get(), &arena);
  lexer.removeErrorListeners();
  parse_internal::ListRunSource source(&lexer, {CharToken('['), CharToken(']'), CharToken(',')});
  antlr4::CommonTokenStream tokens(&source);
  tokens.fill();
  Builder builder(sm, buffer, sink, source.runs());
  const TokenList all(tokens);
  const LexedText text{sm, buffer, all, builder};
  // Lexical and syntax errors, reported in the order of the text once parsing is over.
  std::vector<Diagnostic> errors;
  auto report_all = [&] {
    ReportInTextOrder(errors, sink);
    return false;
  };
  const LexCheck lex = CheckTokens(text, recover, errors);
  if (lex.stop) return report_all();
  int syntax_errors = 0;
  // Release the parse tree while parsing (LeanParser); a too-deep expression is reported from
  // the whole tree instead, so that what follows it is reported exactly as before.
  bool release = true;
  for (;;) {
    tokens.seek(0);
    // After an error nothing is built: the parse only looks for more errors.
    const bool will_build = !lex.lexical_error && syntax_errors == 0;
    builder.StartParse(release && will_build);
    SyntaxErrorInfo info;
    LeanParser parser(&tokens, release, will_build ? &builder : nullptr, &info);
    parser.removeErrorListeners();
    parser.setErrorHandler(std::make_shared<StopAtFirstError>(&info));
    typename std::invoke_result_t<Rule, PlanParser&> tree = nullptr;
    try {
      tree = rule(parser);
    } catch (const antlr4::ParseCancellationException&) {
    } catch (const antlr4::RecognitionException&) {
      info.seen = true;
    }
    if (parser.out_of_memory()) throw std::bad_alloc();
    if (!info.seen) {
      if (!will_build) return report_all();
      if (release && builder.too_deep()) {
        release = false;
        continue;
      }
      build(builder, tree);
      return !builder.too_deep();
    }
    antlr4::Token* t = info.token;
    const bool at_eof = !t || t->getType() == antlr4::Token::EOF;
    const bool lexical = !at_eof && (t->getType() == PlanLexer::UNTERMINATED_STRING ||
                                     t->getType() == PlanLexer::UNKNOWN_CHAR);
    if (!lexical && info.in_block && info.skip_from == t->getTokenIndex()) {
      if (auto missing = FindMissingValue(all, t->getTokenIndex())) {
        errors.push_back(MissingValueError(text, *missing, t));
        ++syntax_errors;
        if (syntax_errors >= kMaxSyntaxErrors) return report_all();
        // Skip `tp =` only: the next line's member is fine.
        HideTokens(all, missing->member_start, missing->equals + 1);
        continue;
      }
    }
    if (!lexical) {
      errors.push_back(SyntaxError(text, parser.getVocabulary(), info));
      ++syntax_errors;
    }
    if (!recover || at_eof || syntax_errors >= kMaxSyntaxErrors) return report_all();
    if (!SkipPastError(all, info)) return report_all();
  }
}

}  // namespace

std::unique_ptr<ast::Module> ParseModule(const SourceManager& sm, uint32_t buffer,
                                         DiagnosticSink& sink) {
  auto module = std::make_unique<ast::Module>();
  module->buffer = buffer;
  bool ok = Parse(
      sm, buffer, sink, /*recover=*/true, [](PlanParser& p) { return p.file(); },
      [&](Builder& b, PlanParser::FileContext* tree) { b.Module(tree, module.get()); });
  if (!ok) return nullptr;
  return module;
}

std::unique_ptr<ast::Member> ParseSetOverride(const SourceManager& sm, uint32_t buffer,
                                              DiagnosticSink& sink) {
  std::unique_ptr<ast::Member> member;
  bool ok = Parse(
      sm, buffer, sink, /*recover=*/false, [](PlanParser& p) { return p.setOverride(); },
      [&](Builder& b, PlanParser::SetOverrideContext* tree) {
        member = std::make_unique<ast::Member>();
        member->kind = ast::MemberKind::kAssign;
        member->range = b.Range(tree);
        member->path = b.Path(tree->path());
        member->value = b.Expr(tree->expr());
      });
  if (!ok) return nullptr;
  return member;
}

}  // namespace paraplan
