#include "runtime/json/json.h"

#include <doctest/doctest.h>

#include <cmath>
#include <limits>

namespace paraplan::json {
namespace {

TEST_CASE("strings are escaped: quotes, backslashes and every control character") {
  CHECK(Quote("plain") == "\"plain\"");
  CHECK(Quote("a\"b\\c") == "\"a\\\"b\\\\c\"");
  CHECK(Quote("\n\t\r\b\f") == "\"\\n\\t\\r\\b\\f\"");
  CHECK(Quote(std::string_view("\x01\x1f\0", 3)) == "\"\\u0001\\u001f\\u0000\"");
  CHECK(Quote("gr\xc3\xbc\xc3\x9f") == "\"gr\xc3\xbc\xc3\x9f\"");  // UTF-8 passes through
  CHECK(Quote("") == "\"\"");
}

TEST_CASE("the writer places commas and colons, in both styles") {
  Writer w;
  w.BeginObject().Key("version").Int(2).Key("plan").String("a \"b\"").Key("shards").BeginArray();
  w.String("x").String("y").EndArray().Key("empty").BeginObject().EndObject();
  w.Key("list").BeginArray().EndArray().Key("ok").Bool(true).Key("none").Null().EndObject();
  CHECK(w.Text() ==
        "{\"version\": 2, \"plan\": \"a \\\"b\\\"\", \"shards\": [\"x\", \"y\"], \"empty\": {}, "
        "\"list\": [], \"ok\": true, \"none\": null}");

  Writer c(Writer::Style::kCompact);
  c.BeginArray().Int(-1).Uint(18446744073709551615ull).BeginObject().Key("k").Int(0);
  c.EndObject().EndArray();
  CHECK(c.Text() == "[-1,18446744073709551615,{\"k\":0}]");
}

TEST_CASE("numbers: significant digits, fixed decimals, non-finite values as null") {
  Writer w(Writer::Style::kCompact);
  w.BeginArray().Number(static_cast<double>(0.1f), 9).Number(2.5).Fixed(1.23456, 3).Fixed(-0.5, 0);
  w.Number(std::nan("")).Fixed(std::numeric_limits<double>::infinity(), 2).Fixed(1e300, 1);
  w.EndArray();
  const std::string& t = w.Text();
  CHECK(t.rfind("[0.100000001,2.5,1.235,-0,null,null,1", 0) == 0);  // %.0f of -0.5 rounds to -0
  CHECK(t.back() == ']');
  const auto back = Parse(t, nullptr);
  REQUIRE(back);
  CHECK(back->At(6)->AsDouble() == doctest::Approx(1e300));
}

TEST_CASE("parse: every kind of value, and what was written reads back") {
  std::string error;
  const auto v = Parse(
      " {\"a\": [1, -2.5e3, true, false, null], \"s\": \"x\\u00e9\\ud83d\\ude00\\n\\/\", "
      "\"o\": {}, \"a\": 7}\n",
      &error);
  REQUIRE_MESSAGE(v, error);
  CHECK(v->kind() == Value::Kind::kObject);
  CHECK(v->Find("a")->AsInt64() == 7);  // the last of a repeated key
  const Value& first = v->Members()[0].second;
  CHECK(first.Size() == 5);
  CHECK(first.At(0)->AsInt64() == 1);
  CHECK(first.At(1)->AsDouble() == -2500.0);
  CHECK_FALSE(first.At(1)->AsInt64());
  CHECK(first.At(1)->NumberText() == "-2.5e3");
  CHECK(first.At(2)->AsBool() == true);
  CHECK(first.At(4)->IsNull());
  CHECK(first.At(5) == nullptr);
  CHECK(v->Find("s")->AsString() == "x\xc3\xa9\xf0\x9f\x98\x80\n/");
  CHECK(v->Find("o")->Size() == 0);
  CHECK(v->Find("missing") == nullptr);
  CHECK_FALSE(v->Find("s")->AsInt64());
  CHECK(v->Find("s")->NumberText().empty());

  Writer w;
  w.BeginObject().Key("name\x01").String("tab\there \"q\" \\ \xe2\x82\xac").EndObject();
  const auto back = Parse(w.Text(), &error);
  REQUIRE_MESSAGE(back, error);
  CHECK(back->Find("name\x01")->AsString() == "tab\there \"q\" \\ \xe2\x82\xac");
}

TEST_CASE("integers that do not fit int64 are not rounded") {
  const auto v =
      Parse("[9223372036854775807, -9223372036854775808, 99999999999999999999]", nullptr);
  REQUIRE(v);
  CHECK(v->At(0)->AsInt64() == std::numeric_limits<int64_t>::max());
  CHECK(v->At(1)->AsInt64() == std::numeric_limits<int64_t>::min());
  CHECK_FALSE(v->At(2)->AsInt64());
  CHECK(v->At(2)->NumberText() == "99999999999999999999");
  CHECK_FALSE(Parse("[1e999]", nullptr)->At(0)->AsDouble());
}

TEST_CASE("malformed text is refused with the line and column of the first error") {
  auto error_of = [](std::string_view text) {
    std::string error;
    CHECK_FALSE(Parse(text, &error));
    return error;
  };
  CHECK(error_of("") == "line 1, column 1: the text ends where a value should be");
  CHECK(error_of("{\"a\": 1,\n \"b\" 2}") == "line 2, column 6: expected `:` after the key");
  CHECK(error_of("[1 2]") == "line 1, column 4: expected `,` or `]` in an array");
  CHECK(error_of("{\"a\": 1") == "line 1, column 8: expected `,` or `}` in an object");
  CHECK(error_of("{1: 2}") == "line 1, column 2: expected a string key");
  CHECK(error_of("[01]") == "line 1, column 3: expected `,` or `]` in an array");
  CHECK(error_of("[-]") == "line 1, column 3: expected digits in a number");
  CHECK(error_of("[1.]") == "line 1, column 4: expected digits after the decimal point");
  CHECK(error_of("[1e]") == "line 1, column 4: expected digits in the exponent");
  CHECK(error_of("\"abc") == "line 1, column 5: a string is not closed");
  CHECK(error_of("\"a\\") == "line 1, column 4: a string is not closed");
  CHECK(error_of("\"a\nb\"") == "line 1, column 3: a control character in a string");
  CHECK(error_of("\"\\x\"") == "line 1, column 3: an unknown escape in a string");
  CHECK(error_of("\"\\u12g4\"") == "line 1, column 6: a \\u escape needs four hex digits");
  CHECK(error_of("\"\\ud800x\"") == "line 1, column 8: a lone UTF-16 surrogate in \\u");
  CHECK(error_of("\"\\udc00\"") == "line 1, column 8: a lone UTF-16 surrogate in \\u");
  CHECK(error_of("tru") == "line 1, column 1: expected a value");
  CHECK(error_of("nul") == "line 1, column 1: expected a value");
  CHECK(error_of("{} {}") == "line 1, column 4: unexpected text after the value");
  CHECK(error_of("'a'") == "line 1, column 1: expected a value");
  CHECK(Parse("null", nullptr)->IsNull());
  CHECK_FALSE(Parse("[1,]", nullptr));
  CHECK_FALSE(Parse("NaN", nullptr));
}

TEST_CASE("deep nesting is refused, not a stack overflow") {
  const std::string ok = std::string(200, '[') + std::string(200, ']');
  CHECK(Parse(ok, nullptr));
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  std::string error;
  CHECK_FALSE(Parse(deep, &error));
  CHECK(error.find("nesting deeper than 256 levels") != std::string::npos);
}

}  // namespace
}  // namespace paraplan::json
