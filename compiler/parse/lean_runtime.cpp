#include "compiler/parse/lean_runtime.h"

#include <fmt/format.h>

#include <algorithm>

namespace paraplan::parse_internal {

bool IsAscii(std::string_view text) {
  for (char c : text) {
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  }
  return true;
}

void ByteCharStream::consume() {
  if (p_ >= text_.size()) throw antlr4::IllegalStateException("cannot consume EOF");
  ++p_;
}

size_t ByteCharStream::LA(ssize_t i) {
  if (i == 0) return 0;  // undefined, as in ANTLRInputStream
  if (i < 0) {
    ++i;  // LA(-1) is the character before p_
    if (static_cast<ssize_t>(p_) + i - 1 < 0) return antlr4::IntStream::EOF;
  }
  const ssize_t at = static_cast<ssize_t>(p_) + i - 1;
  if (at >= static_cast<ssize_t>(text_.size())) return antlr4::IntStream::EOF;
  return static_cast<unsigned char>(text_[static_cast<size_t>(at)]);
}

std::string ByteCharStream::getText(const antlr4::misc::Interval& interval) {
  if (interval.a < 0 || interval.b < 0) return {};
  size_t start = static_cast<size_t>(interval.a);
  size_t stop = static_cast<size_t>(interval.b);
  if (text_.empty() || start >= text_.size()) return {};
  if (stop >= text_.size()) stop = text_.size() - 1;
  if (stop < start) return {};
  return std::string(text_.substr(start, stop - start + 1));
}

void* TokenArena::Allocate(size_t bytes) {
  bytes = (bytes + alignof(void*) - 1) & ~(alignof(void*) - 1);  // tokens need no more
  if (free_ && bytes == free_bytes_) {
    Slot* s = free_;
    free_ = s->next;
    return s;
  }
  if (used_ + bytes > chunk_bytes_) {
    chunk_bytes_ =
        chunk_bytes_ == 0 ? kFirstChunkBytes : std::min(2 * chunk_bytes_, kMaxChunkBytes);
    chunk_bytes_ = std::max(chunk_bytes_, bytes);
    chunks_.emplace_back(new std::byte[chunk_bytes_]);  // not zeroed: slots are constructed
    used_ = 0;
  }
  void* p = chunks_.back().get() + used_;
  used_ += bytes;
  return p;
}

void TokenArena::Free(void* p, size_t bytes) {
  bytes = (bytes + alignof(void*) - 1) & ~(alignof(void*) - 1);
  if (free_ && bytes != free_bytes_) return;  // one size of slot is kept (all are tokens)
  free_bytes_ = bytes;
  free_ = new (p) Slot{free_};
}

// The fields of ANTLR's CommonToken, in its order (the token factory's interface).
// NOLINTNEXTLINE(bugprone-easily-swappable-parameters)
LeanToken::LeanToken(TokenOrigin* origin, size_t type, size_t channel, size_t start, size_t stop,
                     size_t line, size_t column)
    : origin_(origin),
      start_(Narrow(start)),
      stop_(Narrow(stop)),
      line_(Narrow(line)),
      column_(Narrow(column)),
      type_(NarrowType(type)),
      channel_(static_cast<uint16_t>(channel)) {}

std::string LeanToken::getText() const {
  if (!origin_->texts.empty()) {
    auto it = origin_->texts.find(this);
    if (it != origin_->texts.end()) return it->second;
  }
  antlr4::CharStream* input = origin_->input;
  if (!input) return {};
  const size_t n = input->size();
  const size_t stop = getStopIndex();
  if (start_ < n && stop < n) {
    return input->getText(
        antlr4::misc::Interval(static_cast<ssize_t>(start_), static_cast<ssize_t>(stop)));
  }
  return "<EOF>";
}

std::string LeanToken::toString() const {
  return fmt::format("[@{},{}:{}='{}',<{}>,{}:{}]", static_cast<ssize_t>(getTokenIndex()), start_,
                     static_cast<ssize_t>(getStopIndex()), getText(), type_, line_, column_);
}

LeanLexer::LeanLexer(antlr4::CharStream* input, TokenArena* arena)
    : PlanLexer(input), arena_(arena) {
  origin_.arena = arena;
  origin_.source = this;
  origin_.input = input;
}

antlr4::Token* LeanLexer::emit() {
  std::unique_ptr<antlr4::Token> t(
      new (*arena_) LeanToken(&origin_, type, channel, tokenStartCharIndex, getCharIndex() - 1,
                              tokenStartLine, tokenStartCharPositionInLine));
  antlr4::Lexer::emit(std::move(t));
  return token.get();
}

bool ListRunSource::IsLiteral(size_t type) {
  using paraplan_grammar::PlanLexer;
  return type == PlanLexer::INT || type == PlanLexer::REAL || type == PlanLexer::STRING ||
         type == PlanLexer::TRUE || type == PlanLexer::FALSE || type == PlanLexer::AUTO;
}

antlr4::Token* ListRunSource::Peek(size_t k) {
  while (ahead_.size() <= k) ahead_.push_back(lexer_->nextToken());
  return ahead_[k].get();
}

std::unique_ptr<antlr4::Token> ListRunSource::Take() {
  if (ahead_.empty()) return lexer_->nextToken();
  std::unique_ptr<antlr4::Token> t = std::move(ahead_.front());
  ahead_.pop_front();
  return t;
}

std::unique_ptr<antlr4::Token> ListRunSource::nextToken() {
  std::unique_ptr<antlr4::Token> t = Take();
  auto ends_element = [&](antlr4::Token* next) {
    return next->getType() == types_.comma || next->getType() == types_.close_bracket;
  };
  // `[` starts a list wherever it stands (or is itself the syntax error), so a literal right
  // after it, ended by `,` or `]`, is the list's first element; so is each `, literal` after it
  // that a `,` or `]` ends.
  if (previous_ == types_.open_bracket && IsLiteral(t->getType()) && ends_element(Peek(0))) {
    std::vector<LiteralRef>* run = nullptr;
    while (Peek(0)->getType() == types_.comma && IsLiteral(Peek(1)->getType()) &&
           ends_element(Peek(2))) {
      if (!run) run = &runs_[t->getStartIndex()];
      antlr4::Token* literal = Peek(1);
      run->push_back({static_cast<uint32_t>(literal->getStartIndex()),
                      static_cast<uint32_t>(literal->getStopIndex()),
                      static_cast<uint16_t>(literal->getType())});
      ahead_.pop_front();  // the `,`
      ahead_.pop_front();  // the literal
    }
  }
  previous_ = t->getType();
  return t;
}

}  // namespace paraplan::parse_internal
