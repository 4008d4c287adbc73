#include "compiler/parse/parse.h"

#include <doctest/doctest.h>

namespace paraplan {
namespace {

struct Parsed {
  SourceManager sm;
  DiagnosticSink sink;
  std::unique_ptr<ast::Module> module;
  uint32_t buffer = 0;
  std::string Dump() const { return module ? ast::PrintAst(*module) : "<none>"; }
  std::string Slice(SourceRange r) const { return std::string(sm.Slice(r)); }
  const Diagnostic& First() const { return sink.diagnostics().at(0); }
};

std::unique_ptr<Parsed> ParseText(std::string text) {
  auto p = std::make_unique<Parsed>();
  p->buffer = p->sm.AddBuffer("test.plan", std::move(text), BufferKind::kFile);
  p->module = ParseModule(p->sm, p->buffer, p->sink);
  return p;
}

TEST_CASE("a plan with nested blocks, units and requires parses to a stable AST") {
  auto p = ParseText(R"(import std.models.llama
import "local/other.plan"
# a comment · with non-ASCII
gpu g { memory = 80 GiB  hbm_bandwidth = 3.35 TB/s  peak_bf16 = 989 TFLOPS }
let base = dgx_h100 { nodes = 16 }
plan a extends b {
  model = llama3_70b
  cluster = dgx_h100 { nodes = 8 }
  parallel { tp = 8 pp = 4 dp = auto sp = true }
  pipeline.schedule = "1f1b"; optimizer { zero = 1, lr = 3e-4 }
  let w = cluster.nodes * cluster.gpus_per_node
  require parallel.tp <= cluster.gpus_per_node and not false : "keep TP in NVLink"
  batch { global = -(2 + 3) * 4 / 2 % 7 }
  stages = [1, 2, min(3, 4),]
}
)");
  REQUIRE(p->sink.diagnostics().empty());
  REQUIRE(p->module);
  CHECK(p->Dump() == R"(module
  import std.models.llama
  import "local/other.plan"
  gpu g
    assign memory = 80 GiB
    assign hbm_bandwidth = 3.35 TB/s
    assign peak_bf16 = 989 TFLOPS
  let base = dgx_h100 { … }
    assign nodes = 16
  plan a extends b
    assign model = llama3_70b
    assign cluster = dgx_h100 { … }
      assign nodes = 8
    amend parallel
      assign tp = 8
      assign pp = 4
      assign dp = auto
      assign sp = true
    assign pipeline.schedule = "1f1b"
    amend optimizer
      assign zero = 1
      assign lr = 0.0003
    let w = (cluster.nodes * cluster.gpus_per_node)
    require ((parallel.tp <= cluster.gpus_per_node) and (not false)) : "keep TP in NVLink"
    amend batch
      assign global = ((((-(2 + 3)) * 4) / 2) % 7)
    assign stages = [1, 2, min(3, 4)]
)");
  // Ranges are bytes, also after non-ASCII text.
  const ast::Decl& g = p->module->decls[0];
  CHECK(p->Slice(g.name.range) == "g");
  CHECK(p->Slice(g.body->members[0].range) == "memory = 80 GiB");
  CHECK(p->Slice(g.body->members[0].value->range) == "80 GiB");
  CHECK(p->Slice(g.body->members[1].value->unit.range) == "TB/s");
  const ast::Decl& plan = p->module->decls[2];
  CHECK(p->Slice(plan.body->members[3].range) == "pipeline.schedule = \"1f1b\"");
  CHECK(p->Slice(plan.body->members[5].value->range) == "cluster.nodes * cluster.gpus_per_node");
  CHECK(p->Slice(plan.body->members[6].message_range) == "\"keep TP in NVLink\"");
  CHECK(ast::PrintAst(*p->module, &p->sm).find("plan a extends b @6:1-15:2") != std::string::npos);
}

TEST_CASE("a number followed by a field name on the same line is not a unit") {
  auto p = ParseText("plan x { parallel { tp = 8 sp = true } memory = 8 s }");
  REQUIRE(p->sink.diagnostics().empty());
  CHECK(p->Dump().find("assign tp = 8\n") != std::string::npos);
  CHECK(p->Dump().find("assign memory = 8 s\n") != std::string::npos);
}

TEST_CASE("syntax errors say what was expected and point at the token") {
  auto p = ParseText("plan x {\n  tp = = 4\n}\n");
  CHECK(!p->module);
  REQUIRE(p->sink.diagnostics().size() == 1);
  CHECK(p->First().kind == DiagKind::kSyntaxError);
  CHECK(p->First().message == "expected an expression, found `=`");
  CHECK(p->Slice(p->First().primary) == "=");
  CHECK(p->sm.Position(p->buffer, p->First().primary.begin).line == 2);

  p = ParseText("plan x {\n  tp 4\n}\n");
  REQUIRE(p->sink.diagnostics().size() == 1);
  CHECK(p->First().message == "expected `.`, `=` or `{`, found `4`");

  p = ParseText("plan x {\n  tp = 4\n");
  REQUIRE(p->sink.diagnostics().size() == 1);
  CHECK(p->First().message.find("found end of file") != std::string::npos);

  p = ParseText("plan x extends { }");
  REQUIRE(p->sink.diagnostics().size() == 1);
  CHECK(p->First().message == "expected a name, found `{`");
}

TEST_CASE("lexical errors") {
  auto p = ParseText("plan x { order = \"tp-dp }\n");
  REQUIRE(p->sink.diagnostics().size() == 1);
  CHECK(p->First().kind == DiagKind::kUnterminatedString);
  CHECK(p->Slice(p->First().primary) == "\"tp-dp }");

  p = ParseText("plan x { tp = 4 $ }");
  REQUIRE(p->sink.diagnostics().size() == 1);
  CHECK(p->First().kind == DiagKind::kUnexpectedCharacter);
  CHECK(p->First().message == "unexpected character `$`");

  p = ParseText("plan x { tp = 4 }\xff");
  REQUIRE(p->sink.diagnostics().size() == 1);
  CHECK(p->First().kind == DiagKind::kUnexpectedCharacter);
  CHECK(p->First().message == "the text is not valid UTF-8");
  CHECK(p->First().primary.begin == 17);
}

TEST_CASE("problems inside good syntax are reported and parsing goes on") {
  auto p = ParseText(
      "modle m { layers = 99999999999999999999 }\n"
      "gpu g { memory = 80 Gib  bad = 1 parsecs }\n"
      "model n { x = -9223372036854775808 }");
  REQUIRE(p->module);
  REQUIRE(p->sink.diagnostics().size() == 3);
  CHECK(p->sink.diagnostics()[0].kind == DiagKind::kUnknownDeclarationKind);
  CHECK(p->sink.diagnostics()[0].helps.at(0) == "did you mean `model m`?");
  CHECK(p->sink.diagnostics()[1].kind == DiagKind::kUnknownUnit);
  CHECK(p->sink.diagnostics()[1].message == "`Gib` is not a unit");
  CHECK(p->sink.diagnostics()[1].helps.at(0) == "did you mean `GiB`?");
  CHECK(p->sink.diagnostics()[2].kind == DiagKind::kUnknownUnit);
  CHECK(p->module->decls.size() == 2);
  CHECK(p->module->decls[1].body->members[0].value->int_value == INT64_MIN);

  p = ParseText("model m { layers = 99999999999999999999 }");
  REQUIRE(p->sink.diagnostics().size() == 1);
  CHECK(p->First().kind == DiagKind::kNumberTooLarge);
  CHECK(p->Slice(p->First().primary) == "99999999999999999999");
}

TEST_CASE("a block comment that never closes is named, not reported as a stray `/`") {
  auto p = ParseText("plan x { /* never closed\n  tp = 4 }\n");
  CHECK(!p->module);
  REQUIRE(p->sink.diagnostics().size() == 1);
  CHECK(p->First().message == "this comment has no closing `*/`");
  CHECK(p->Slice(p->First().primary) == "/*");
  p = ParseText("let a = 8 / 2 /* half */ * 3\n");
  CHECK(p->module);
  CHECK(p->sink.diagnostics().empty());
}

TEST_CASE("2^63 is a literal only under a minus; out-of-range literals are marked") {
  auto p =
      ParseText("model m { a = 9223372036854775808  b = -9223372036854775808  c = 1e999  d = 5 }");
  REQUIRE(p->module);
  REQUIRE(p->sink.diagnostics().size() == 2);
  CHECK(p->sink.diagnostics()[0].kind == DiagKind::kNumberTooLarge);
  CHECK(p->Slice(p->sink.diagnostics()[0].primary) == "9223372036854775808");
  CHECK(p->sink.diagnostics()[1].message == "real literal `1e999` is out of range");
  const auto& members = p->module->decls[0].body->members;
  CHECK(members[0].value->out_of_range);
  CHECK(!members[1].value->out_of_range);
  CHECK(members[1].value->int_value == INT64_MIN);
  CHECK(members[2].value->out_of_range);
  CHECK(!members[3].value->out_of_range);
}

TEST_CASE("an empty text is a module with nothing in it") {
  auto p = ParseText("");
  REQUIRE(p->module);
  CHECK(p->sink.diagnostics().empty());
  p = ParseText("  # only a comment\n");
  REQUIRE(p->module);
  CHECK(p->sink.diagnostics().empty());
}

TEST_CASE("list elements are built in order, their problems reported in the order of the text") {
  auto p = ParseText(
      "let a = [1, 99999999999999999999, \"x\\\"y\", true, auto, 2.5, 1e999, "
      "9223372036854775808, [3, 4], -5, 6, 7 MiB, 8, 1_000]\n");
  REQUIRE(p->module);
  REQUIRE(p->sink.diagnostics().size() == 3);
  CHECK(p->Slice(p->sink.diagnostics()[0].primary) == "99999999999999999999");
  CHECK(p->sink.diagnostics()[1].message == "real literal `1e999` is out of range");
  CHECK(p->Slice(p->sink.diagnostics()[2].primary) == "9223372036854775808");
  const ast::Expr& list = *p->module->decls.at(0).base;
  REQUIRE(list.operands.size() == 14);
  std::vector<std::string> slices;
  for (const auto& e : list.operands) slices.push_back(p->Slice(e->range));
  CHECK(slices == std::vector<std::string>{"1", "99999999999999999999", "\"x\\\"y\"", "true",
                                           "auto", "2.5", "1e999", "9223372036854775808", "[3, 4]",
                                           "-5", "6", "7 MiB", "8", "1_000"});
  CHECK(list.operands[1]->out_of_range);
  CHECK(list.operands[2]->text == "x\"y");
  CHECK(list.operands[3]->bool_value);
  CHECK(list.operands[4]->kind == ast::ExprKind::kAuto);
  CHECK(list.operands[5]->real_value == 2.5);
  CHECK(list.operands[6]->out_of_range);
  CHECK(list.operands[7]->out_of_range);
  CHECK(list.operands[8]->operands.size() == 2);
  CHECK(list.operands[9]->kind == ast::ExprKind::kUnary);
  CHECK(list.operands[11]->unit.text == "MiB");
  CHECK(list.operands[13]->int_value == 1000);
  CHECK(ast::VerifyAst(*p->module).empty());
}

TEST_CASE("a long list and many members parse to the same AST as written one by one") {
  std::string text = "let big = [";
  std::string block = "plan p {\n";
  for (int i = 0; i < 5000; ++i) {
    text += std::to_string(i) + (i % 2 ? ", " : ",\n");
    block += "  let f" + std::to_string(i) + " = [" + std::to_string(i) + ", \"s\"]\n";
  }
  auto p = ParseText(text + "]\n" + block + "}\n");
  REQUIRE(p->module);
  CHECK(p->sink.diagnostics().empty());
  const ast::Expr& big = *p->module->decls.at(0).base;
  REQUIRE(big.operands.size() == 5000);
  for (int i = 0; i < 5000; ++i) CHECK(big.operands[i]->int_value == i);
  const auto& members = p->module->decls.at(1).body->members;
  REQUIRE(members.size() == 5000);
  CHECK(members[4999].path.at(0).text == "f4999");
  CHECK(p->Slice(members[4999].value->range) == "[4999, \"s\"]");
  CHECK(ast::VerifyAst(*p->module).empty());
}

TEST_CASE("problems in nested blocks and lists come in the order of the text") {
  auto p = ParseText(
      "plan p { a { b = 1 foo } c = 2 bar  d = [1 baz, 2, x { y = 3 qux }] }\n"
      "modle m { x = 1 skipped }\n"
      "let z = 4 last\n");
  REQUIRE(p->module);
  std::vector<std::string> found;
  for (const Diagnostic& d : p->sink.diagnostics()) found.push_back(p->Slice(d.primary));
  CHECK(found == std::vector<std::string>{"foo", "bar", "baz", "qux", "modle", "last"});
}

TEST_CASE("after a too-deep chain of operators, what follows is reported as before") {
  std::string chain = "1";
  for (int i = 0; i < 101; ++i) chain += " + 1";
  auto p = ParseText("model m { a = 1 foo  b = " + chain + "  c = 2 bar }\n");
  CHECK(!p->module);
  REQUIRE(p->sink.diagnostics().size() == 3);
  CHECK(p->Slice(p->sink.diagnostics()[0].primary) == "foo");
  CHECK(p->sink.diagnostics()[1].kind == DiagKind::kNestingTooDeep);
  CHECK(p->Slice(p->sink.diagnostics()[2].primary) == "bar");
}

TEST_CASE("a leading byte order mark does not shift ranges") {
  auto p = ParseText("\xEF\xBB\xBFmodel m {\n  layers = 1 parsecs\n}\n");
  REQUIRE(p->sink.diagnostics().size() == 1);
  CHECK(p->First().kind == DiagKind::kUnknownUnit);
  CHECK(p->Slice(p->First().primary) == "parsecs");
}

TEST_CASE("nesting past 100 levels is an error, not a stack overflow") {
  for (const char* open : {"(", "[", "-", "not ", "m { x = "}) {
    std::string text = "let x = ";
    for (int i = 0; i < 100000; ++i) text += open;
    INFO(open);
    auto p = ParseText(text + "1\n");
    CHECK(!p->module);
    REQUIRE(p->sink.diagnostics().size() == 1);
    CHECK(p->First().kind == DiagKind::kNestingTooDeep);
    CHECK(p->First().message == "this text nests more than 100 levels deep");
  }
  std::string sum = "let x = 1";
  for (int i = 0; i < 200000; ++i) sum += " + 1";
  auto p = ParseText(sum + "\n");
  CHECK(!p->module);
  REQUIRE(p->sink.diagnostics().size() == 1);
  CHECK(p->First().message == "this expression nests more than 100 levels deep");
  std::string fine = "let x = ";
  for (int i = 0; i < 99; ++i) fine += "(";
  fine += "1";
  for (int i = 0; i < 99; ++i) fine += " + 1)";
  p = ParseText(fine + "\n");
  CHECK(p->module);
  CHECK(p->sink.diagnostics().empty());
}

TEST_CASE("a --set override parses as PATH = EXPR in its own buffer") {
  SourceManager sm;
  DiagnosticSink sink;
  uint32_t b =
      sm.AddBuffer("<command line>", "parallel.order=\"tp-cp-ep-pp-dp\"", BufferKind::kCommandLine);
  auto m = ParseSetOverride(sm, b, sink);
  REQUIRE(m);
  CHECK(m->path.size() == 2);
  CHECK(m->value->text == "tp-cp-ep-pp-dp");
  uint32_t bad = sm.AddBuffer("<command line>", "parallel.tp=", BufferKind::kCommandLine);
  CHECK(!ParseSetOverride(sm, bad, sink));
  REQUIRE(sink.diagnostics().size() == 1);
  CHECK(sink.diagnostics()[0].message == "expected an expression, found end of file");
  CHECK(!sink.diagnostics()[0].notes.empty());
}

}  // namespace
}  // namespace paraplan

namespace paraplan {
namespace {

TEST_CASE("VerifyAst accepts what the parser makes and names what is broken") {
  auto p = ParseText(R"(import std.clusters
let w = dgx_h100 { nodes = 2 }
plan a extends b {
  cluster = dgx_h100 { nodes = max(1, 2) + 1 }
  parallel { tp = 8  sp = not false }
  require min(1, 2) < 3 : "ok"
  let x = -4 GiB
}
)");
  REQUIRE(p->module);
  CHECK(ast::VerifyAst(*p->module).empty());
  // A derivation inside an operand is printed under its member too.
  CHECK(p->Dump().find("    assign cluster = dgx_h100 { … }\n      assign nodes") !=
        std::string::npos);

  ast::Decl& plan = p->module->decls[1];
  plan.body->members[1].block.reset();                   // an amendment without its block
  plan.body->members[0].range.end = plan.range.end + 5;  // past its block
  plan.body->members[2].value->operands.pop_back();      // a binary operator with one operand
  auto problems = ast::VerifyAst(*p->module);
  REQUIRE(problems.size() == 3);
  CHECK(problems[0].find("assign `cluster`: range") != std::string::npos);
  CHECK(problems[0].find("outside its parent's") != std::string::npos);
  CHECK(problems[1] == "amend `parallel`: an amendment without its block");
  CHECK(problems[2].find("1 operands, expected 2") != std::string::npos);
}

}  // namespace
}  // namespace paraplan

namespace paraplan {
namespace {

std::vector<std::string> Messages(const Parsed& p) {
  std::vector<std::string> out;
  for (const Diagnostic& d : p.sink.diagnostics()) {
    out.push_back(std::to_string(p.sm.Position(p.buffer, d.primary.begin).line) + ": " + d.message);
  }
  return out;
}

TEST_CASE(
    "after a syntax error, independent errors in other members and declarations are reported") {
  auto p = ParseText(R"(model m {
  layers = 4  hidden = = 512
  heads = 8
}
plan p {
  model = m
  cluster = dgx_h100 { nodes = }
  parallel { tp = 2  pp = 2 }
  batch { global = 8  micro = (1 + }
  pipeline.schedule = "1f1b" extra stuff
  precision = bf16
}
model n extends { layers = 2 }
plan q { model = n; cluster = dgx_h100; parallel { tp = 1 * } }
)");
  CHECK(!p->module);  // a file with syntax errors is not evaluated
  CHECK(Messages(*p) == std::vector<std::string>{
                            "2: expected an expression, found `=`",
                            "7: expected an expression, found `}`",
                            "9: expected an expression, found `}`",
                            "10: expected `.`, `=` or `{`, found `stuff`",
                            "13: expected a name, found `{`",
                            "14: expected an expression, found `}`",
                        });
}

TEST_CASE(
    "recovery skips to the next line's member, a separator or the closing brace, never echoing") {
  // A multi-line value: the continuation lines are skipped with the broken member.
  auto p = ParseText("plan a {\n  x = [1, 2\n    3, 4]\n  y = 1 * * 2\n  z = 3\n}\n");
  CHECK(Messages(*p) == std::vector<std::string>{"3: expected `,` or `]`, found `3`",
                                                 "4: expected an expression, found `*`"});
  // A separator ends the skipped member on the same line.
  p = ParseText("plan a { x = = 1; y = = 2, z = 3 }");
  CHECK(Messages(*p) == std::vector<std::string>{"1: expected an expression, found `=`",
                                                 "1: expected an expression, found `=`"});
  // Stray text between members and between declarations.
  p = ParseText("}\nplan a {\n  tp = \n  pp = 4\n}\n= 5\nplan b { v = 1 }}\n");
  CHECK(Messages(*p) ==
        std::vector<std::string>{"1: expected a declaration or `import`, found `}`",
                                 "3: `tp =` has no value",
                                 "6: expected a declaration or `import`, found `=`",
                                 "7: expected a declaration or `import`, found `}`"});
}

TEST_CASE(
    "a value forgotten at the end of a line is named, and the next line's member still parses") {
  auto p = ParseText("plan a {\n  tp =\n  pp = 4 4\n  cluster.nodes =\n  model.layers = 8\n}\n");
  CHECK(Messages(*p) == std::vector<std::string>{"2: `tp =` has no value",
                                                 "3: expected `}` or another member, found `4`",
                                                 "4: `cluster.nodes =` has no value"});
  const Diagnostic& d = p->sink.diagnostics()[0];
  CHECK(p->Slice(d.primary) == "=");
  REQUIRE(d.labels.size() == 1);
  CHECK(p->sm.Position(p->buffer, d.labels[0].range.begin).line == 3);
  // An error in the next line's member is its own. A value on the next line is still a value.
  p = ParseText("plan a {\n  tp =\n    4\n}\n");
  CHECK(p->sink.diagnostics().empty());
}

TEST_CASE("a field name after a number, read as its unit, gets a help") {
  auto p = ParseText("model m {\n  vocab = 1000 seq_len 128\n}\n");
  REQUIRE(p->sink.diagnostics().size() == 1);
  CHECK(p->First().message == "expected `}` or another member, found `128`");
  REQUIRE(p->First().labels.size() == 1);
  CHECK(p->Slice(p->First().labels[0].range) == "seq_len");
  CHECK(p->First().labels[0].message == "read as the unit of `1000`");
  REQUIRE(p->First().helps.size() == 1);
  CHECK(p->First().helps[0] == "is a `=` missing after `seq_len`?");
  // A real unit gets no such help.
  p = ParseText("gpu g {\n  memory = 80 GiB 5\n}\n");
  REQUIRE(p->sink.diagnostics().size() == 1);
  CHECK(p->First().helps.empty());
}

TEST_CASE("a missing closing brace is one error, with a help when a declaration follows") {
  auto p = ParseText(
      "plan a {\n  parallel { tp = 4\n  batch { global = 8 }\n}\n\nplan b { batch { global = = 1 } "
      "}\n");
  REQUIRE(p->sink.diagnostics().size() == 1);
  CHECK(p->First().message == "expected `.`, `=` or `{`, found `b`");
  REQUIRE(p->First().helps.size() == 1);
  CHECK(p->First().helps[0].find("is a `}` missing before it?") != std::string::npos);

  p = ParseText("plan a {\n  tp = 4\n");
  REQUIRE(p->sink.diagnostics().size() == 1);
  CHECK(p->First().message.find("found end of file") != std::string::npos);
}

TEST_CASE("lexical errors and syntax errors are all reported, in the order of the text") {
  auto p = ParseText("plan a {\n  z = = 1\n  x = \"abc\n  y = 4 $ 5\n  w = 2 +\n}\n");
  REQUIRE(p->sink.diagnostics().size() == 4);
  CHECK(p->sink.diagnostics()[0].kind == DiagKind::kSyntaxError);
  CHECK(p->sink.diagnostics()[1].kind == DiagKind::kUnterminatedString);
  CHECK(p->sink.diagnostics()[2].kind == DiagKind::kUnexpectedCharacter);
  CHECK(Messages(*p)[3] == "6: expected an expression, found `}`");
}

TEST_CASE("at most 20 syntax errors are reported; a --set value reports its first") {
  std::string text = "plan a {\n";
  for (int i = 0; i < 30; ++i) text += "  x" + std::to_string(i) + " = = 1\n";
  text += "}\n";
  auto p = ParseText(text);
  CHECK(p->sink.diagnostics().size() == 20);

  SourceManager sm;
  DiagnosticSink sink;
  uint32_t b = sm.AddBuffer("<command line>", "parallel.tp = = 4 = 5", BufferKind::kCommandLine);
  CHECK(!ParseSetOverride(sm, b, sink));
  CHECK(sink.diagnostics().size() == 1);
}

}  // namespace
}  // namespace paraplan
