// JSON for every file and line paraplan writes by hand (checkpoint manifests, planrun's metrics
// lines, planc explain's document) and reads back (manifests, metrics lines on resume): one
// string escaper, one writer, one reader. Used by the runtime and the compiler alike, so it
// depends on the standard library only (the runtime links no LLVM; llvm::json stays in the
// compiler's diagnostics and dump renderers).
//
// Writing: AppendString escapes `"`, `\` and every control character (\n, \t, ... or \u00XX);
// other bytes pass through, so UTF-8 text stays UTF-8. Writer builds one document into a
// string, placing the commas and colons; numbers that are not finite are written as null (JSON
// has no NaN). Reading: Parse accepts exactly RFC 8259 JSON (one value, surrounded by
// whitespace only) and reports the first error with its line and column; nesting deeper than
// 256 levels is refused rather than overflowing the stack. Numbers keep their source text, so
// a reader can refuse an integer that does not fit instead of rounding it.
//
// Made by: the code that writes or reads those files. Invariant: a Value's accessors are valid
// for its kind only (Find/At return nullptr, the As* functions return nullopt otherwise).
#ifndef PARAPLAN_RUNTIME_JSON_JSON_H_
#define PARAPLAN_RUNTIME_JSON_JSON_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace paraplan::json {

// Appends `s` as a JSON string literal, quotes included.
void AppendString(std::string& out, std::string_view s);
std::string Quote(std::string_view s);

class Writer {
 public:
  // kSpaced: `{"a": 1, "b": [1, 2]}` (one-line files people read); kCompact: `{"a":1,"b":[1,2]}`.
  enum class Style : uint8_t { kSpaced, kCompact };
  explicit Writer(Style style = Style::kSpaced) : style_(style) {}

  Writer& BeginObject();
  Writer& EndObject();
  Writer& BeginArray();
  Writer& EndArray();
  // The key of the next value inside an object.
  Writer& Key(std::string_view key);

  Writer& String(std::string_view value);
  Writer& Int(int64_t value);
  Writer& Uint(uint64_t value);
  Writer& Bool(bool value);
  Writer& Null();
  // `significant` digits, shortest form (printf %.*g); null when not finite.
  Writer& Number(double value, int significant = 17);
  // `decimals` digits after the point (printf %.*f); null when not finite.
  Writer& Fixed(double value, int decimals);

  const std::string& Text() const { return out_; }

 private:
  void BeforeValue();
  void Raw(const char* text);

  Style style_;
  std::string out_;
  std::vector<bool> first_;  // per open container: no element written yet
  bool after_key_ = false;
};

class Value {
 public:
  enum class Kind : uint8_t { kNull, kBool, kNumber, kString, kArray, kObject };

  Kind kind() const { return kind_; }
  bool IsNull() const { return kind_ == Kind::kNull; }

  std::optional<bool> AsBool() const;
  // The string's decoded text.
  std::optional<std::string> AsString() const;
  // A number exactly representable as int64 (no fraction, no exponent, in range).
  std::optional<int64_t> AsInt64() const;
  std::optional<double> AsDouble() const;
  // A number's text as written ("-12", "1.5e3"); empty for other kinds.
  const std::string& NumberText() const;

  // Arrays.
  size_t Size() const { return kind_ == Kind::kArray ? items_.size() : members_.size(); }
  const Value* At(size_t index) const;
  // Objects: the value of `key` (the last one when a key repeats), or nullptr.
  const Value* Find(std::string_view key) const;
  const std::vector<std::pair<std::string, Value>>& Members() const { return members_; }

 private:
  friend class Parser;
  Kind kind_ = Kind::kNull;
  bool boolean_ = false;
  std::string text_;  // a string's decoded text, a number's source text
  std::vector<Value> items_;
  std::vector<std::pair<std::string, Value>> members_;
};

// The value `text` holds, or nullopt with `*error` set to "line L, column C: what".
std::optional<Value> Parse(std::string_view text, std::string* error);

}  // namespace paraplan::json

#endif  // PARAPLAN_RUNTIME_JSON_JSON_H_
