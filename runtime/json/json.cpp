#include "runtime/json/json.h"

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace paraplan::json {

// ---- Writing ---------------------------------------------------------------------------------

void AppendString(std::string& out, std::string_view s) {
  static constexpr char kHex[] = "0123456789abcdef";
  out += '"';
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c < 0x20) {
          out += "\\u00";
          out += kHex[c >> 4];
          out += kHex[c & 15];
        } else {
          out += ch;
        }
    }
  }
  out += '"';
}

std::string Quote(std::string_view s) {
  std::string out;
  AppendString(out, s);
  return out;
}

void Writer::BeforeValue() {
  if (after_key_) {
    after_key_ = false;
    return;
  }
  if (!first_.empty()) {
    if (!first_.back()) out_ += style_ == Style::kSpaced ? ", " : ",";
    first_.back() = false;
  }
}

void Writer::Raw(const char* text) {
  BeforeValue();
  out_ += text;
}

Writer& Writer::BeginObject() {
  Raw("{");
  first_.push_back(true);
  return *this;
}

Writer& Writer::EndObject() {
  first_.pop_back();
  out_ += '}';
  return *this;
}

Writer& Writer::BeginArray() {
  Raw("[");
  first_.push_back(true);
  return *this;
}

Writer& Writer::EndArray() {
  first_.pop_back();
  out_ += ']';
  return *this;
}

Writer& Writer::Key(std::string_view key) {
  BeforeValue();
  AppendString(out_, key);
  out_ += style_ == Style::kSpaced ? ": " : ":";
  after_key_ = true;
  return *this;
}

Writer& Writer::String(std::string_view value) {
  BeforeValue();
  AppendString(out_, value);
  return *this;
}

Writer& Writer::Int(int64_t value) {
  BeforeValue();
  out_ += std::to_string(value);
  return *this;
}

Writer& Writer::Uint(uint64_t value) {
  BeforeValue();
  out_ += std::to_string(value);
  return *this;
}

Writer& Writer::Bool(bool value) {
  Raw(value ? "true" : "false");
  return *this;
}

Writer& Writer::Null() {
  Raw("null");
  return *this;
}

Writer& Writer::Number(double value, int significant) {
  if (!std::isfinite(value)) return Null();
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*g", significant, value);
  Raw(buf);
  return *this;
}

Writer& Writer::Fixed(double value, int decimals) {
  if (!std::isfinite(value)) return Null();
  char buf[400];  // %f of the largest double has 309 digits before the point
  std::snprintf(buf, sizeof buf, "%.*f", decimals, value);
  Raw(buf);
  return *this;
}

// ---- Values ----------------------------------------------------------------------------------

std::optional<bool> Value::AsBool() const {
  if (kind_ != Kind::kBool) return std::nullopt;
  return boolean_;
}

std::optional<std::string> Value::AsString() const {
  if (kind_ != Kind::kString) return std::nullopt;
  return text_;
}

std::optional<int64_t> Value::AsInt64() const {
  if (kind_ != Kind::kNumber) return std::nullopt;
  int64_t v = 0;
  const char* end = text_.data() + text_.size();
  auto [ptr, ec] = std::from_chars(text_.data(), end, v);
  if (ec != std::errc() || ptr != end) return std::nullopt;  // a fraction, an exponent, range
  return v;
}

std::optional<double> Value::AsDouble() const {
  if (kind_ != Kind::kNumber) return std::nullopt;
  errno = 0;
  const double v = std::strtod(text_.c_str(), nullptr);
  if (errno == ERANGE && std::isinf(v)) return std::nullopt;
  return v;
}

const std::string& Value::NumberText() const {
  static const std::string kEmpty;
  return kind_ == Kind::kNumber ? text_ : kEmpty;
}

const Value* Value::At(size_t index) const {
  if (kind_ != Kind::kArray || index >= items_.size()) return nullptr;
  return &items_[index];
}

const Value* Value::Find(std::string_view key) const {
  if (kind_ != Kind::kObject) return nullptr;
  for (auto it = members_.rbegin(); it != members_.rend(); ++it) {
    if (it->first == key) return &it->second;
  }
  return nullptr;
}

// ---- Reading ---------------------------------------------------------------------------------

class Parser {
 public:
  explicit Parser(std::string_view text) : text_(text) {}

  std::optional<Value> Document(std::string* error) {
    Value v;
    SkipSpace();
    if (ParseValue(v, 0)) {
      SkipSpace();
      if (pos_ == text_.size()) return v;
      Fail("unexpected text after the value");
    }
    if (error) *error = Where() + ": " + error_;
    return std::nullopt;
  }

 private:
  static constexpr int kMaxDepth = 256;

  bool Fail(const std::string& what) {
    if (error_.empty()) {
      error_ = what;
      error_at_ = pos_;
    }
    return false;
  }

  std::string Where() const {
    int line = 1, column = 1;
    for (size_t i = 0; i < error_at_ && i < text_.size(); ++i) {
      if (text_[i] == '\n') {
        ++line;
        column = 1;
      } else {
        ++column;
      }
    }
    return "line " + std::to_string(line) + ", column " + std::to_string(column);
  }

  bool AtEnd() const { return pos_ >= text_.size(); }
  char Peek() const { return AtEnd() ? '\0' : text_[pos_]; }

  void SkipSpace() {
    while (!AtEnd() && (text_[pos_] == ' ' || text_[pos_] == '\t' || text_[pos_] == '\n' ||
                        text_[pos_] == '\r')) {
      ++pos_;
    }
  }

  bool Literal(std::string_view word) {
    if (text_.substr(pos_, word.size()) != word) return Fail("expected a value");
    pos_ += word.size();
    return true;
  }

  bool ParseValue(Value& v, int depth) {
    if (depth > kMaxDepth) return Fail("nesting deeper than 256 levels");
    switch (Peek()) {
      case '{':
        return ParseObject(v, depth);
      case '[':
        return ParseArray(v, depth);
      case '"':
        v.kind_ = Value::Kind::kString;
        return ParseString(v.text_);
      case 't':
        v.kind_ = Value::Kind::kBool;
        v.boolean_ = true;
        return Literal("true");
      case 'f':
        v.kind_ = Value::Kind::kBool;
        v.boolean_ = false;
        return Literal("false");
      case 'n':
        v.kind_ = Value::Kind::kNull;
        return Literal("null");
      default:
        if (Peek() == '-' || (Peek() >= '0' && Peek() <= '9')) return ParseNumber(v);
        return Fail(AtEnd() ? "the text ends where a value should be" : "expected a value");
    }
  }

  bool ParseObject(Value& v, int depth) {
    v.kind_ = Value::Kind::kObject;
    ++pos_;  // {
    SkipSpace();
    if (Peek() == '}') {
      ++pos_;
      return true;
    }
    while (true) {
      SkipSpace();
      if (Peek() != '"') return Fail("expected a string key");
      std::string key;
      if (!ParseString(key)) return false;
      SkipSpace();
      if (Peek() != ':') return Fail("expected `:` after the key");
      ++pos_;
      SkipSpace();
      Value member;
      if (!ParseValue(member, depth + 1)) return false;
      v.members_.emplace_back(std::move(key), std::move(member));
      SkipSpace();
      if (Peek() == ',') {
        ++pos_;
        continue;
      }
      if (Peek() == '}') {
        ++pos_;
        return true;
      }
      return Fail("expected `,` or `}` in an object");
    }
  }

  bool ParseArray(Value& v, int depth) {
    v.kind_ = Value::Kind::kArray;
    ++pos_;  // [
    SkipSpace();
    if (Peek() == ']') {
      ++pos_;
      return true;
    }
    while (true) {
      SkipSpace();
      Value item;
      if (!ParseValue(item, depth + 1)) return false;
      v.items_.push_back(std::move(item));
      SkipSpace();
      if (Peek() == ',') {
        ++pos_;
        continue;
      }
      if (Peek() == ']') {
        ++pos_;
        return true;
      }
      return Fail("expected `,` or `]` in an array");
    }
  }

  bool ParseNumber(Value& v) {
    const size_t start = pos_;
    auto digits = [&] {
      const size_t from = pos_;
      while (Peek() >= '0' && Peek() <= '9') ++pos_;
      return pos_ > from;
    };
    if (Peek() == '-') ++pos_;
    if (Peek() == '0') {
      ++pos_;
    } else if (!digits()) {
      return Fail("expected digits in a number");
    }
    if (Peek() == '.') {
      ++pos_;
      if (!digits()) return Fail("expected digits after the decimal point");
    }
    if (Peek() == 'e' || Peek() == 'E') {
      ++pos_;
      if (Peek() == '+' || Peek() == '-') ++pos_;
      if (!digits()) return Fail("expected digits in the exponent");
    }
    v.kind_ = Value::Kind::kNumber;
    v.text_ = std::string(text_.substr(start, pos_ - start));
    return true;
  }

  bool Hex4(uint32_t& out) {
    if (pos_ + 4 > text_.size()) return Fail("a \\u escape needs four hex digits");
    out = 0;
    for (int i = 0; i < 4; ++i) {
      const char c = text_[pos_++];
      out <<= 4;
      if (c >= '0' && c <= '9') {
        out |= static_cast<uint32_t>(c - '0');
      } else if (c >= 'a' && c <= 'f') {
        out |= static_cast<uint32_t>(c - 'a' + 10);
      } else if (c >= 'A' && c <= 'F') {
        out |= static_cast<uint32_t>(c - 'A' + 10);
      } else {
        --pos_;
        return Fail("a \\u escape needs four hex digits");
      }
    }
    return true;
  }

  static void AppendUtf8(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xc0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3f));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xe0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
      out += static_cast<char>(0x80 | (cp & 0x3f));
    } else {
      out += static_cast<char>(0xf0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
      out += static_cast<char>(0x80 | (cp & 0x3f));
    }
  }

  bool Escape(std::string& out) {
    if (AtEnd()) return Fail("a string is not closed");
    const char c = Peek();
    ++pos_;
    switch (c) {
      case '"':
      case '\\':
      case '/':
        out += c;
        return true;
      case 'b':
        out += '\b';
        return true;
      case 'f':
        out += '\f';
        return true;
      case 'n':
        out += '\n';
        return true;
      case 'r':
        out += '\r';
        return true;
      case 't':
        out += '\t';
        return true;
      case 'u': {
        uint32_t cp = 0;
        if (!Hex4(cp)) return false;
        if (cp >= 0xd800 && cp < 0xdc00) {  // a high surrogate needs its low half
          uint32_t low = 0;
          if (text_.substr(pos_, 2) != "\\u") return Fail("a lone UTF-16 surrogate in \\u");
          pos_ += 2;
          if (!Hex4(low)) return false;
          if (low < 0xdc00 || low >= 0xe000) return Fail("a lone UTF-16 surrogate in \\u");
          cp = 0x10000 + ((cp - 0xd800) << 10) + (low - 0xdc00);
        } else if (cp >= 0xdc00 && cp < 0xe000) {
          return Fail("a lone UTF-16 surrogate in \\u");
        }
        AppendUtf8(out, cp);
        return true;
      }
      default:
        --pos_;
        return Fail("an unknown escape in a string");
    }
  }

  bool ParseString(std::string& out) {
    ++pos_;  // "
    while (true) {
      if (AtEnd()) return Fail("a string is not closed");
      const char c = text_[pos_];
      if (c == '"') {
        ++pos_;
        return true;
      }
      if (static_cast<unsigned char>(c) < 0x20) return Fail("a control character in a string");
      ++pos_;
      if (c == '\\') {
        if (!Escape(out)) return false;
      } else {
        out += c;
      }
    }
  }

  std::string_view text_;
  size_t pos_ = 0;
  std::string error_;
  size_t error_at_ = 0;
};

std::optional<Value> Parse(std::string_view text, std::string* error) {
  return Parser(text).Document(error);
}

}  // namespace paraplan::json
