// Lean replacements for the parts of the ANTLR4 runtime that grow with the input: the character
// stream, the tokens and the lexer that makes them. The grammar and the generated lexer and
// parser are unchanged; only how the runtime is driven differs.
//
//   * ByteCharStream reads ASCII text in place. ANTLRInputStream copies the text into UTF-32
//     (4 bytes per input byte); text with any non-ASCII byte still goes through it, since ANTLR
//     indexes characters by code point.
//   * LeanToken is a token in 40 bytes, allocated from a TokenArena, against CommonToken's
//     112 bytes plus a heap block each. Its text is read from the stream on demand.
//   * LeanLexer is the generated PlanLexer emitting LeanTokens.
//
// Used by parse.cpp and parse_builder.h only; ANTLR types never leave compiler/parse/.
#ifndef PARAPLAN_COMPILER_PARSE_LEAN_RUNTIME_H_
#define PARAPLAN_COMPILER_PARSE_LEAN_RUNTIME_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <new>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "PlanLexer.h"
#include "antlr4-runtime.h"

namespace paraplan::parse_internal {

// True when every byte of `text` is below 0x80 (then code point i is byte i).
bool IsAscii(std::string_view text);

// A character stream over ASCII text it does not own (the SourceManager's buffer).
class ByteCharStream final : public antlr4::CharStream {
 public:
  ByteCharStream(std::string_view text, std::string name) : text_(text), name_(std::move(name)) {}

  void consume() override;
  size_t LA(ssize_t i) override;
  ssize_t mark() override { return -1; }
  void release(ssize_t) override {}
  size_t index() override { return p_; }
  void seek(size_t index) override { p_ = index < text_.size() ? index : text_.size(); }
  size_t size() override { return text_.size(); }
  std::string getSourceName() const override { return name_; }
  std::string getText(const antlr4::misc::Interval& interval) override;
  std::string toString() const override { return std::string(text_); }

 private:
  std::string_view text_;
  std::string name_;
  size_t p_ = 0;
};

// Memory for LeanTokens, released all at once when the arena goes (after the token stream that
// points into it). A token deleted before (one ListRunSource drops) leaves its slot for the next.
class TokenArena {
 public:
  TokenArena() = default;
  TokenArena(const TokenArena&) = delete;
  TokenArena& operator=(const TokenArena&) = delete;
  void* Allocate(size_t bytes);
  void Free(void* p, size_t bytes);

 private:
  // Chunks grow from 4 KiB (a `--set` value) to 1 MiB (a large plan).
  static constexpr size_t kFirstChunkBytes = size_t{4} << 10;
  static constexpr size_t kMaxChunkBytes = size_t{1} << 20;
  std::vector<std::unique_ptr<std::byte[]>> chunks_;
  size_t chunk_bytes_ = 0;
  size_t used_ = 0;
  struct Slot {
    Slot* next;
  };
  Slot* free_ = nullptr;  // freed slots, all of free_bytes_
  size_t free_bytes_ = 0;
};

// What every token of one lexer run shares: where it came from, and texts set on tokens
// explicitly (the lexer and parser of this grammar set none; kept for the Token contract).
struct TokenOrigin {
  TokenArena* arena = nullptr;
  antlr4::TokenSource* source = nullptr;
  antlr4::CharStream* input = nullptr;
  std::unordered_map<const void*, std::string> texts;
};

class LeanToken final : public antlr4::WritableToken {
 public:
  LeanToken(TokenOrigin* origin, size_t type, size_t channel, size_t start, size_t stop,
            size_t line, size_t column);

  static void* operator new(size_t bytes, TokenArena& arena) { return arena.Allocate(bytes); }
  // Deleting a token (the token stream does, and ListRunSource) returns its slot to the arena.
  static void operator delete(LeanToken* token, std::destroying_delete_t) {
    TokenArena* arena = token->origin_->arena;
    token->~LeanToken();
    arena->Free(token, sizeof(LeanToken));
  }
  static void operator delete(void*, TokenArena&) {}  // a constructor threw: the slot is lost

  std::string getText() const override;
  size_t getType() const override { return type_ == kEofType ? antlr4::Token::EOF : type_; }
  size_t getLine() const override { return line_; }
  size_t getCharPositionInLine() const override { return column_; }
  size_t getChannel() const override { return channel_; }
  size_t getTokenIndex() const override { return index_; }
  size_t getStartIndex() const override { return start_; }
  size_t getStopIndex() const override { return Widen(stop_); }
  antlr4::TokenSource* getTokenSource() const override { return origin_->source; }
  antlr4::CharStream* getInputStream() const override { return origin_->input; }
  std::string toString() const override;

  void setText(const std::string& text) override { origin_->texts[this] = text; }
  void setType(size_t type) override { type_ = NarrowType(type); }
  void setLine(size_t line) override { line_ = Narrow(line); }
  void setCharPositionInLine(size_t pos) override { column_ = Narrow(pos); }
  void setChannel(size_t channel) override { channel_ = static_cast<uint16_t>(channel); }
  void setTokenIndex(size_t index) override { index_ = Narrow(index); }

 private:
  // Positions fit in 32 bits (inputs are at most 64 MiB); SIZE_MAX (ANTLR's "none", the stop of
  // an empty token at offset 0) maps to UINT32_MAX and back.
  static uint32_t Narrow(size_t v) {
    return v >= UINT32_MAX ? UINT32_MAX : static_cast<uint32_t>(v);
  }
  static size_t Widen(uint32_t v) { return v == UINT32_MAX ? SIZE_MAX : v; }
  // Token types are small; EOF (SIZE_MAX; the lexer emits it as a token of its own for an
  // empty text) is kept as kEofType.
  static constexpr uint16_t kEofType = UINT16_MAX;
  static uint16_t NarrowType(size_t type) {
    return type >= kEofType ? kEofType : static_cast<uint16_t>(type);
  }

  TokenOrigin* origin_;
  uint32_t start_, stop_, index_ = UINT32_MAX, line_, column_;
  uint16_t type_, channel_;
};

// The generated lexer, emitting LeanTokens from `arena`.
class LeanLexer final : public paraplan_grammar::PlanLexer {
 public:
  LeanLexer(antlr4::CharStream* input, TokenArena* arena);
  antlr4::Token* emit() override;

 private:
  TokenArena* arena_;
  TokenOrigin origin_;
};

// One list element dropped from the token stream by ListRunSource: a literal token.
struct LiteralRef {
  uint32_t start;  // code point index of its first character
  uint32_t stop;   // of its last character
  uint16_t type;   // INT, REAL, STRING, TRUE, FALSE or AUTO
};

// The token types ListRunSource needs to know.
struct ListTokenTypes {
  size_t open_bracket, close_bracket, comma;
};

// Sits between the lexer and the token stream and takes runs of literal list elements out of
// it: in `[1, 2, 3, "x"]` the parser sees `[1]`, and the elements after the first wait in
// runs() under the first one's start index, for the builder to add after it. A list of a
// million numbers then costs the parser, the tree and the token stream nothing per element.
//
// Only a run that starts the list is taken: elements that are one literal token each (a number
// without a unit, a string, `true`, `false`, `auto`), the first right after `[`, each ended by
// `,` or `]`. `[` always starts a list, so such a run parses as list elements and nothing else,
// and dropping it changes neither the AST nor where and how a syntax error is found.
class ListRunSource final : public antlr4::TokenSource {
 public:
  ListRunSource(antlr4::Lexer* lexer, ListTokenTypes types) : lexer_(lexer), types_(types) {}

  std::unique_ptr<antlr4::Token> nextToken() override;
  size_t getLine() const override { return lexer_->getLine(); }
  size_t getCharPositionInLine() override { return lexer_->getCharPositionInLine(); }
  antlr4::CharStream* getInputStream() override { return lexer_->getInputStream(); }
  std::string getSourceName() override { return lexer_->getSourceName(); }
  antlr4::TokenFactory<antlr4::CommonToken>* getTokenFactory() override {
    return lexer_->getTokenFactory();
  }

  const std::unordered_map<size_t, std::vector<LiteralRef>>& runs() const { return runs_; }

 private:
  static bool IsLiteral(size_t type);
  antlr4::Token* Peek(size_t k);
  std::unique_ptr<antlr4::Token> Take();

  antlr4::Lexer* lexer_;
  ListTokenTypes types_;
  std::deque<std::unique_ptr<antlr4::Token>> ahead_;
  size_t previous_ = 0;  // the type of the token passed on last
  std::unordered_map<size_t, std::vector<LiteralRef>> runs_;
};

}  // namespace paraplan::parse_internal

#endif  // PARAPLAN_COMPILER_PARSE_LEAN_RUNTIME_H_
