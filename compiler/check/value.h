// Values of the plan language during evaluation (internal to check/).
//
// A Value is what an expression evaluates to: an integer or real with an optional dimension
// (bytes, bandwidth, compute, time), a boolean, a string (also an enum spelling), a list, a
// record, `auto`, or an error. An error value is "poisoned": its diagnostic was reported where
// it arose and every operation on it yields an error without reporting again.
#ifndef PARAPLAN_COMPILER_CHECK_VALUE_H_
#define PARAPLAN_COMPILER_CHECK_VALUE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "compiler/plan/plan.h"

namespace paraplan::eval {

struct Record;

enum class VType : uint8_t { kError, kInt, kReal, kBool, kString, kList, kRecord, kAuto };

struct Value {
  VType type = VType::kError;
  std::optional<UnitDimension> dim;  // kInt / kReal quantities
  int64_t i = 0;
  double r = 0;
  bool b = false;
  bool enum_name = false;  // a kString written as a bare name (`interleaved_1f1b`)
  std::string s;
  std::shared_ptr<const std::vector<Value>> list;
  Record* rec = nullptr;

  static Value Error() { return {}; }
  static Value Int(int64_t v, std::optional<UnitDimension> d = std::nullopt) {
    Value x;
    x.type = VType::kInt;
    x.i = v;
    x.dim = d;
    return x;
  }
  static Value Real(double v, std::optional<UnitDimension> d = std::nullopt) {
    Value x;
    x.type = VType::kReal;
    x.r = v;
    x.dim = d;
    return x;
  }
  static Value Bool(bool v) {
    Value x;
    x.type = VType::kBool;
    x.b = v;
    return x;
  }
  static Value String(std::string v) {
    Value x;
    x.type = VType::kString;
    x.s = std::move(v);
    return x;
  }
  static Value Auto() {
    Value x;
    x.type = VType::kAuto;
    return x;
  }
  static Value OfRecord(Record* r) {
    Value x;
    x.type = VType::kRecord;
    x.rec = r;
    return x;
  }

  bool IsError() const { return type == VType::kError; }
  bool IsNumber() const { return type == VType::kInt || type == VType::kReal; }
  double AsReal() const { return type == VType::kInt ? static_cast<double>(i) : r; }
};

// "an integer", "bytes", "a bandwidth", "a list", "a `model` record", ...
std::string Describe(const Value& v);
// The value as the language would print it: `8`, `80 GiB` is printed as bytes with its
// unit suffix "B", `true`, `"x"`, `[1, 2]`, `llama3_70b`.
std::string Format(const Value& v);
// The value as SetFieldText takes it back (no unit suffix).
std::string FormatForSet(const Value& v);

}  // namespace paraplan::eval

#endif  // PARAPLAN_COMPILER_CHECK_VALUE_H_
