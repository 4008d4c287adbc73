#include "compiler/diagnostics/render.h"

#include <doctest/doctest.h>

#include "llvm/Support/JSON.h"

namespace paraplan {
namespace {

std::string S(llvm::Optional<llvm::StringRef> v) { return v ? v->str() : "<none>"; }
int64_t I(llvm::Optional<int64_t> v) { return v ? *v : -1; }

SourceRange Find(const SourceManager& sm, uint32_t buffer, std::string_view needle,
                 size_t nth = 0) {
  std::string_view text = sm.Text(buffer);
  size_t pos = text.find(needle);
  while (nth-- > 0 && pos != std::string_view::npos) pos = text.find(needle, pos + 1);
  REQUIRE(pos != std::string_view::npos);
  return {buffer, static_cast<uint32_t>(pos), static_cast<uint32_t>(pos + needle.size())};
}

struct Fixture {
  SourceManager sm;
  uint32_t plan = sm.AddBuffer("a.plan",
                               "plan p {\n"
                               "  cluster = dgx_h100 { nodes = 16 }\n"
                               "  parallel { tp = 4  pp = 4  ep = 32 }\n"
                               "}\n",
                               BufferKind::kFile);
  uint32_t cli = sm.AddBuffer("<command line>", "parallel.tp=4", BufferKind::kCommandLine);

  Diagnostic Mesh() {
    return Diag(DiagKind::kExpertMeshWorld,
                "expert mesh `etp · ep · pp` needs 512 GPUs but the cluster has 128")
        .At(Find(sm, plan, "32"), "`ep = 32` set here")
        .Label(Find(sm, plan, "4"), "`tp = 4` set here")
        .Label(Find(sm, plan, "4", 1), "`pp = 4` set here")
        .Label(Find(sm, plan, "16"), "`nodes = 16` set here")
        .Label(Find(sm, cli, "4"), "from --set")
        .Value("etp · ep · pp", "4 · 32 · 4 = 512")
        .Note("Megatron-Core builds the expert mesh etp × ep × edp × pp")
        .Help("set `etp = 1`")
        .Get();
  }
};

TEST_CASE("format names") {
  CHECK(ParseDiagFormat("text") == DiagFormat::kText);
  CHECK(ParseDiagFormat("short") == DiagFormat::kShort);
  CHECK(ParseDiagFormat("json") == DiagFormat::kJson);
  CHECK(ParseDiagFormat("sarif") == DiagFormat::kSarif);
  CHECK(!ParseDiagFormat("xml"));
  CHECK(!ParseDiagFormat(""));
}

TEST_CASE("text frame: header, carets, hanging labels, other buffers, tail, summary") {
  Fixture f;
  std::string text = RenderDiagnostics({f.Mesh()}, f.sm, DiagFormat::kText);
  const char* expected =
      "error[P0303]: expert mesh `etp · ep · pp` needs 512 GPUs but the cluster has 128\n"
      "  ┌─ a.plan:3:35\n"
      "  │\n"
      "2 │   cluster = dgx_h100 { nodes = 16 }\n"
      "  │                                -- `nodes = 16` set here\n"
      "3 │   parallel { tp = 4  pp = 4  ep = 32 }\n"
      "  │                   -       -       ^^ `ep = 32` set here\n"
      "  │                   │       │\n"
      "  │                   │       `pp = 4` set here\n"
      "  │                   `tp = 4` set here\n"
      "  │\n"
      "  ┌─ <command line>:1:13\n"
      "  │\n"
      "1 │ parallel.tp=4\n"
      "  │             - from --set\n"
      "  │\n"
      "  = value: etp · ep · pp = 4 · 32 · 4 = 512\n"
      "  = note: Megatron-Core builds the expert mesh etp × ep × edp × pp\n"
      "  = help: set `etp = 1`\n"
      "\n"
      "error: aborting due to 1 error\n";
  CHECK(text == expected);
}

TEST_CASE("summary line") {
  CHECK(SummaryLine(2, 1) == "error: aborting due to 2 errors; 1 warning emitted");
  CHECK(SummaryLine(0, 2) == "warning: 2 warnings emitted");
  CHECK(SummaryLine(0, 0).empty());
}

TEST_CASE("short form: one line per fact") {
  Fixture f;
  std::string s = RenderDiagnostics({f.Mesh()}, f.sm, DiagFormat::kShort);
  CHECK(s.find("a.plan:3:35: error[P0303]: expert mesh") == 0);
  CHECK(s.find("a.plan:3:19: note: `tp = 4` set here\n") != std::string::npos);
  CHECK(s.find("<command line>:1:13: note: from --set\n") != std::string::npos);
  CHECK(s.find("a.plan:3:35: note: etp · ep · pp = 4 · 32 · 4 = 512\n") != std::string::npos);
  CHECK(s.find("a.plan:3:35: help: set `etp = 1`\n") != std::string::npos);
}

TEST_CASE("json: versioned, stable fields") {
  Fixture f;
  std::string s = RenderDiagnostics({f.Mesh()}, f.sm, DiagFormat::kJson);
  auto parsed = llvm::json::parse(s);
  REQUIRE(bool(parsed));
  auto* doc = parsed->getAsObject();
  REQUIRE(doc);
  CHECK(I(doc->getInteger("version")) == 1);
  auto* list = doc->getArray("diagnostics");
  REQUIRE(list);
  REQUIRE(list->size() == 1);
  auto* d = (*list)[0].getAsObject();
  CHECK(S(d->getString("code")) == "P0303");
  CHECK(S(d->getString("name")) == "expert-mesh-does-not-divide-world");
  CHECK(S(d->getString("level")) == "error");
  CHECK(I(d->getObject("primary")->getInteger("line")) == 3);
  CHECK(I(d->getObject("primary")->getInteger("column")) == 35);
  CHECK(S(d->getObject("primary")->getString("text")) == "32");
  CHECK(d->getArray("labels")->size() == 4);
  CHECK(S((*d->getArray("labels"))[3]
              .getAsObject()
              ->getObject("location")
              ->getString("buffer_kind")) == "command_line");
  CHECK(I(doc->getObject("summary")->getInteger("errors")) == 1);
}

TEST_CASE("sarif 2.1.0 shape") {
  Fixture f;
  RenderOptions o;
  o.tool_version = "0.1.0";
  std::string s = RenderDiagnostics({f.Mesh()}, f.sm, DiagFormat::kSarif, o);
  auto parsed = llvm::json::parse(s);
  REQUIRE(bool(parsed));
  auto* doc = parsed->getAsObject();
  CHECK(S(doc->getString("version")) == "2.1.0");
  CHECK(doc->getString("$schema").hasValue());
  auto* run = (*doc->getArray("runs"))[0].getAsObject();
  auto* driver = run->getObject("tool")->getObject("driver");
  CHECK(S(driver->getString("name")) == "planc");
  CHECK(S(driver->getString("version")) == "0.1.0");
  auto* rule = (*driver->getArray("rules"))[0].getAsObject();
  CHECK(S(rule->getString("id")) == "P0303");
  CHECK(S(rule->getString("name")) == "expert-mesh-does-not-divide-world");
  CHECK(rule->getObject("shortDescription")->getString("text").hasValue());
  CHECK(S(rule->getString("helpUri")) == "docs/diagnostics/P0303.md");
  auto* result = (*run->getArray("results"))[0].getAsObject();
  CHECK(S(result->getString("ruleId")) == "P0303");
  CHECK(S(result->getString("level")) == "error");
  CHECK(result->getObject("message")->getString("text").hasValue());
  auto* region = (*result->getArray("locations"))[0]
                     .getAsObject()
                     ->getObject("physicalLocation")
                     ->getObject("region");
  CHECK(I(region->getInteger("startLine")) == 3);
  CHECK(I(region->getInteger("startColumn")) == 35);
  CHECK(I(region->getInteger("endColumn")) == 37);
  CHECK(result->getArray("relatedLocations")->size() == 4);
}

TEST_CASE("sarif: a stdlib module is a uri relative to the STDLIB base, never a machine path") {
  SourceManager sm;
  uint32_t lib = sm.AddBuffer("<stdlib>/clusters.plan", "cluster dgx_h100 { nodes = 1 }\n",
                              BufferKind::kStdlib);
  uint32_t file = sm.AddBuffer("dir/a b.plan", "plan p {}\n", BufferKind::kFile);
  Diagnostic d = Diag(DiagKind::kExpertMeshWorld, "x")
                     .At(Find(sm, file, "p"), "here")
                     .Label(Find(sm, lib, "1"), "from the stdlib")
                     .Get();
  std::string s = RenderDiagnostics({d}, sm, DiagFormat::kSarif, RenderOptions{});
  auto parsed = llvm::json::parse(s);
  REQUIRE(bool(parsed));
  auto* run = (*parsed->getAsObject()->getArray("runs"))[0].getAsObject();
  auto* result = (*run->getArray("results"))[0].getAsObject();
  auto* main = (*result->getArray("locations"))[0].getAsObject()->getObject("physicalLocation");
  CHECK(S(main->getObject("artifactLocation")->getString("uri")) == "dir/a%20b.plan");
  CHECK(!main->getObject("artifactLocation")->getString("uriBaseId"));
  auto* related =
      (*result->getArray("relatedLocations"))[0].getAsObject()->getObject("physicalLocation");
  CHECK(S(related->getObject("artifactLocation")->getString("uri")) == "clusters.plan");
  CHECK(S(related->getObject("artifactLocation")->getString("uriBaseId")) == "STDLIB");
  REQUIRE(run->getObject("originalUriBaseIds"));
  CHECK(run->getObject("originalUriBaseIds")->getObject("STDLIB"));
  // Text and short forms show the same name.
  std::string short_form = RenderDiagnostics({d}, sm, DiagFormat::kShort, RenderOptions{});
  INFO(short_form);
  CHECK(short_form.find("<stdlib>/clusters.plan:1:14: note: from the stdlib") != std::string::npos);
}

TEST_CASE("odd input never crashes and is repaired") {
  SourceManager sm;
  uint32_t empty = sm.AddBuffer("empty.plan", "", BufferKind::kFile);
  uint32_t odd = sm.AddBuffer("odd.plan", "\ta = \"\xC3\xA9t\xC3\xA9\"\r\n\tb\x01 = \xFF\xFE 1\r\n",
                              BufferKind::kFile);
  std::vector<Diagnostic> diags;
  diags.push_back(Diag(DiagKind::kFileNotReadable, "past the end").At({empty, 5, 9}, "here").Get());
  diags.push_back(Diag(DiagKind::kFileNotReadable, "no buffer")
                      .At({99, 0, 1}, "x")
                      .Label({0, 3, 1}, "y")
                      .Get());
  diags.push_back(Diag(DiagKind::kFileNotReadable, "reversed").At({odd, 9, 2}, "rev").Get());
  diags.push_back(Diag(DiagKind::kFileNotReadable, "multi-line\nmessage")
                      .At({odd, 1, 30}, "spans lines")
                      .Label({odd, 14, 16}, "after tab")
                      .Label({odd, 16, 17}, "control")
                      .Note("a\nb")
                      .Get());
  Diagnostic bogus;
  bogus.kind = static_cast<DiagKind>(60000);
  bogus.level = static_cast<DiagLevel>(7);
  bogus.message = std::string("nul\0byte", 8);
  bogus.primary = {odd, UINT32_MAX, UINT32_MAX};
  diags.push_back(bogus);
  for (DiagFormat f :
       {DiagFormat::kText, DiagFormat::kShort, DiagFormat::kJson, DiagFormat::kSarif}) {
    std::string out = RenderDiagnostics(diags, sm, f);
    CHECK(!out.empty());
    if (f == DiagFormat::kJson || f == DiagFormat::kSarif) CHECK(bool(llvm::json::parse(out)));
  }
  std::string text = RenderDiagnostics({diags[3]}, sm, DiagFormat::kText);
  // The tab is drawn as four spaces and the é as one column, so the caret sits under "é".
  CHECK(text.find("1 │     a = \"été\"\n") != std::string::npos);
  CHECK(text.find("  │     ^^^^^^^^^ spans lines\n") != std::string::npos);
  CHECK(text.find("error[P0001]: multi-line message\n") == 0);
  CHECK(text.find("2 │     b\xEF\xBF\xBD = \xEF\xBF\xBD\xEF\xBF\xBD 1\n") != std::string::npos);
  CHECK(text.find("  = note: a\n          b\n") != std::string::npos);
}

TEST_CASE("a diagnostic without any location renders header and tail") {
  SourceManager sm;
  std::string text = RenderDiagnostics({Diag(DiagKind::kPlanNotFound, "no plan named `x`")
                                            .Help("plans in the file: `a`, `b`")
                                            .Get()},
                                       sm, DiagFormat::kText);
  CHECK(text ==
        "error[P0002]: no plan named `x`\n"
        "  = help: plans in the file: `a`, `b`\n"
        "\n"
        "error: aborting due to 1 error\n");
}

}  // namespace
}  // namespace paraplan
