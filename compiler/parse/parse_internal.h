// What the parser's files share besides Builder (parse_builder.h): the record of a syntax error
// and the error strategy that stops at it, the lexed tokens, and the syntax-error reports and
// recovery (parse_errors.cpp) that the lexing and parse driver (parse.cpp) calls. Internal to
// compiler/parse: ANTLR's types never leave it.
#ifndef PARAPLAN_COMPILER_PARSE_PARSE_INTERNAL_H_
#define PARAPLAN_COMPILER_PARSE_PARSE_INTERNAL_H_

#include <cstddef>
#include <cstdint>
#include <exception>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "antlr4-runtime.h"
#include "compiler/diagnostics/diagnostic.h"
#include "compiler/parse/parse_builder.h"
#include "compiler/source/source.h"

namespace paraplan::parse_internal {

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
size_t CharToken(char c);

class StopAtFirstError : public antlr4::DefaultErrorStrategy {
 public:
  explicit StopAtFirstError(SyntaxErrorInfo* info) : info_(info) {}
  void reportError(antlr4::Parser* parser, const antlr4::RecognitionException& e) override;
  void recover(antlr4::Parser*, std::exception_ptr) override {
    throw antlr4::ParseCancellationException();
  }
  antlr4::Token* recoverInline(antlr4::Parser* parser) override;
  void sync(antlr4::Parser*) override {}

 private:
  static std::optional<std::vector<size_t>> AfterPrefix(antlr4::Parser* parser,
                                                        const antlr4::NoViableAltException* e,
                                                        antlr4::Token* offending);
  static size_t Literal(std::string_view literal);
  static size_t DotToken() { return Literal("'.'"); }
  static const antlr4::dfa::Vocabulary& VocabularyOf();

  void Record(antlr4::Parser* parser, antlr4::Token* token,
              const antlr4::misc::IntervalSet& expected);
  SyntaxErrorInfo* info_;
};

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

// The lexed buffer, as the error reports read it.
struct LexedText {
  const SourceManager& sm;
  uint32_t buffer;
  const TokenList& all;
  const Builder& builder;
};

// `tp =` at the end of a line with the value forgotten: the next line's member (`pp = 4`) is
// read as the value (`tp = pp`) and the parser stops at its `=`. Given the offending `=` of a
// syntax error between members, finds that shape: the `=` without a value and the first token
// of its member. nullopt when the error is something else.
struct MissingValue {
  size_t member_start;  // `tp`
  size_t equals;        // the `=` that ends its line
  size_t value_start;   // `pp`, read as the value
};
std::optional<MissingValue> FindMissingValue(const TokenList& all, size_t at);

// `tp =` with its value forgotten (FindMissingValue); `t` is the offending `=`.
Diagnostic MissingValueError(const LexedText& text, const MissingValue& missing, antlr4::Token* t);

// A syntax error at `info`: what was expected and what was found, with the likely causes.
Diagnostic SyntaxError(const LexedText& text, const antlr4::dfa::Vocabulary& vocab,
                       const SyntaxErrorInfo& info);

// Moves the tokens [from, end) to the hidden channel, stopping at end of file, so that the
// next parse does not see them.
void HideTokens(const TokenList& all, size_t from, size_t end);

// Hides the text of the syntax error at `info` (RecoveryEnd), at least its offending token.
// Returns false when nothing is left to parse: what a new parse would report then (a missing
// `}`) would echo the skip.
bool SkipPastError(const TokenList& all, const SyntaxErrorInfo& info);

}  // namespace paraplan::parse_internal

#endif  // PARAPLAN_COMPILER_PARSE_PARSE_INTERNAL_H_
