// Syntax errors (parse_internal.h): the strategy that stops a parse at its first error and finds
// where recovery starts, the expected-token lists, the reports with their likely causes (a
// missing value, a missing `}`, a name read as a unit), and the recovery that hides the text of
// an error so that the next parse finds the next one.
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "PlanLexer.h"
#include "PlanParser.h"
#include "antlr4-runtime.h"
#include "compiler/parse/parse_internal.h"
#include "compiler/plan/plan.h"

namespace paraplan::parse_internal {

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

namespace {

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

}  // namespace

void StopAtFirstError::reportError(antlr4::Parser* parser, const antlr4::RecognitionException& e) {
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

antlr4::Token* StopAtFirstError::recoverInline(antlr4::Parser* parser) {
  Record(parser, parser->getCurrentToken(), parser->getExpectedTokens());
  throw antlr4::ParseCancellationException();
}

std::optional<std::vector<size_t>> StopAtFirstError::AfterPrefix(
    antlr4::Parser* parser, const antlr4::NoViableAltException* e, antlr4::Token* offending) {
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

size_t StopAtFirstError::Literal(std::string_view literal) {
  const auto& vocab = VocabularyOf();
  for (size_t t = 1; t <= vocab.getMaxTokenType(); ++t) {
    if (vocab.getLiteralName(t) == literal) return t;
  }
  return 0;
}

const antlr4::dfa::Vocabulary& StopAtFirstError::VocabularyOf() {
  static antlr4::ANTLRInputStream empty("");
  static PlanLexer lexer(&empty);
  return lexer.getVocabulary();
}

void StopAtFirstError::Record(antlr4::Parser* parser, antlr4::Token* token,
                              const antlr4::misc::IntervalSet& expected) {
  if (info_->seen) return;
  info_->seen = true;
  info_->token = token;
  for (ssize_t t : expected.toList()) info_->expected.push_back(static_cast<size_t>(t));
  FindRecoverySite(parser, token, info_);
}

namespace {

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

}  // namespace

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

namespace {

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

}  // namespace

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

void HideTokens(const TokenList& all, size_t from, size_t end) {
  for (size_t k = from; k < end && k < all.size(); ++k) {
    if (all[k]->getType() == antlr4::Token::EOF) break;
    if (auto* w = dynamic_cast<antlr4::WritableToken*>(all[k]))
      w->setChannel(antlr4::Token::HIDDEN_CHANNEL);
  }
}

bool SkipPastError(const TokenList& all, const SyntaxErrorInfo& info) {
  const size_t at = info.token->getTokenIndex();
  size_t end = RecoveryEnd(all, info);
  const size_t from = std::min(info.skip_from, at);
  if (end <= from) end = at + 1;  // skip at least the offending token
  HideTokens(all, from, end);
  return end < all.size() && all[end]->getType() != antlr4::Token::EOF;
}

}  // namespace paraplan::parse_internal
