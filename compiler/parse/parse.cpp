// The parse driver (parse.h): the checks on the text and its tokens before any parse, LeanParser,
// and the loop that parses, reports syntax errors and recovers from them (Parse), behind
// ParseModule and ParseSetOverride.
#include "compiler/parse/parse.h"

#include <fmt/format.h>

#include <algorithm>
#include <exception>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "PlanLexer.h"
#include "PlanParser.h"
#include "antlr4-runtime.h"
#include "compiler/parse/lean_runtime.h"
#include "compiler/parse/parse_builder.h"
#include "compiler/parse/parse_internal.h"

namespace paraplan::parse_internal {
namespace {

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

std::string Printable(std::string_view s) {
  if (s.size() == 1 && (static_cast<unsigned char>(s[0]) < 0x20 || s[0] == 0x7F)) {
    return fmt::format("U+{:04X}", static_cast<unsigned>(static_cast<unsigned char>(s[0])));
  }
  return std::string(s);
}

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

// At most this many syntax errors are reported per buffer; parsing stops after them.
constexpr int kMaxSyntaxErrors = 20;

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
}  // namespace paraplan::parse_internal

namespace paraplan {
namespace {

using paraplan_grammar::PlanParser;
using parse_internal::Builder;
using parse_internal::Parse;

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
