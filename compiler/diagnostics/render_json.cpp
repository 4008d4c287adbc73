// JSON and SARIF 2.1.0 renderers (llvm::json), and RenderDiagnostics, which dispatches to
// every format. The text and short forms live in render.cpp.
#include <algorithm>
#include <cstdint>
#include <map>
#include <string>

#include "compiler/diagnostics/render.h"
#include "compiler/diagnostics/render_internal.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/raw_ostream.h"

namespace paraplan {
using namespace render_internal;
namespace {

// --- JSON and SARIF -------------------------------------------------------------------------

namespace json = llvm::json;

json::Value Str(std::string_view s) {
  return json::Value(json::fixUTF8(llvm::StringRef(s.data(), s.size())));
}

std::string_view BufferKindName(BufferKind k) {
  switch (k) {
    case BufferKind::kFile:
      return "file";
    case BufferKind::kStdlib:
      return "stdlib";
    case BufferKind::kCommandLine:
      return "command_line";
    case BufferKind::kMemory:
      return "memory";
  }
  return "memory";
}

json::Value JsonLocation(const SourceManager& sm, SourceRange raw) {
  SafeRange r = Repair(sm, raw);
  if (!r.valid) return nullptr;
  LineColumn b = sm.Position(r.buffer, r.begin);
  LineColumn e = sm.Position(r.buffer, r.end);
  return json::Object{
      {"file", Str(sm.Name(r.buffer))},
      {"buffer_kind", Str(BufferKindName(sm.Kind(r.buffer)))},
      {"line", static_cast<int64_t>(b.line)},
      {"column", static_cast<int64_t>(b.column)},
      {"end_line", static_cast<int64_t>(e.line)},
      {"end_column", static_cast<int64_t>(e.column)},
      {"begin_offset", static_cast<int64_t>(r.begin)},
      {"end_offset", static_cast<int64_t>(r.end)},
      {"text", Str(sm.Slice({r.buffer, r.begin, r.end}))},
  };
}

std::string Pretty(const json::Value& v) {
  std::string s;
  llvm::raw_string_ostream os(s);
  os << llvm::formatv("{0:2}", v);
  os.flush();
  s += "\n";
  return s;
}

std::string RenderJson(const std::vector<Diagnostic>& diags, const SourceManager& sm,
                       const RenderOptions& options) {
  json::Array list;
  int errors = 0, warnings = 0, notes = 0;
  RenderOptions plain = options;
  plain.color = false;
  for (const Diagnostic& d : diags) {
    const DiagKindInfo& info = SafeInfo(d.kind);
    json::Array labels, values, note_list, help_list;
    for (const DiagLabel& l : d.labels) {
      labels.push_back(
          json::Object{{"location", JsonLocation(sm, l.range)}, {"message", Str(l.message)}});
    }
    for (const auto& [expr, value] : d.values) {
      values.push_back(json::Object{{"expression", Str(expr)}, {"value", Str(value)}});
    }
    for (const std::string& n : d.notes) note_list.push_back(Str(n));
    for (const std::string& h : d.helps) help_list.push_back(Str(h));
    list.push_back(json::Object{
        {"code", Str(info.code)},
        {"name", Str(info.name)},
        {"level", Str(LevelName(d.level))},
        {"message", Str(d.message)},
        {"primary", JsonLocation(sm, d.primary)},
        {"primary_label", Str(d.primary_label)},
        {"labels", std::move(labels)},
        {"values", std::move(values)},
        {"notes", std::move(note_list)},
        {"helps", std::move(help_list)},
        {"rendered", Str(RenderDiagnosticText(d, sm, plain))},
    });
    errors += d.level == DiagLevel::kError;
    warnings += d.level == DiagLevel::kWarning;
    notes += d.level == DiagLevel::kNote;
  }
  json::Object doc{
      {"version", 1},
      {"tool", Str(options.tool_name)},
      {"diagnostics", std::move(list)},
      {"summary", json::Object{{"errors", errors}, {"warnings", warnings}, {"notes", notes}}},
  };
  if (!options.tool_version.empty()) doc["tool_version"] = Str(options.tool_version);
  return Pretty(json::Value(std::move(doc)));
}

std::string UriEncode(std::string_view path) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : path) {
    if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' ||
        c == '.' || c == '_' || c == '~' || c == '/') {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

std::string_view SarifLevel(DiagLevel level) {
  switch (level) {
    case DiagLevel::kError:
      return "error";
    case DiagLevel::kWarning:
      return "warning";
    case DiagLevel::kNote:
      return "note";
  }
  return "error";
}

// 1-based column in Unicode code points (the run declares columnKind unicodeCodePoints).
int64_t CodePointColumn(const SourceManager& sm, uint32_t buffer, uint32_t offset) {
  LineColumn lc = sm.Position(buffer, offset);
  std::string_view text = sm.Text(buffer);
  size_t line_start = offset - (lc.column - 1);
  int64_t col = 1;
  for (size_t i = line_start; i < offset && i < text.size(); ++i) {
    if ((static_cast<unsigned char>(text[i]) & 0xC0) != 0x80) ++col;
  }
  return col;
}

struct SarifArtifacts {
  std::vector<uint32_t> buffers;
  int64_t Index(uint32_t buffer) {
    for (size_t i = 0; i < buffers.size(); ++i) {
      if (buffers[i] == buffer) return static_cast<int64_t>(i);
    }
    buffers.push_back(buffer);
    return static_cast<int64_t>(buffers.size() - 1);
  }
};

constexpr std::string_view kStdlibPrefix = "<stdlib>/";
constexpr std::string_view kStdlibBase = "STDLIB";

// The uri of a file buffer; a stdlib module shown as `<stdlib>/x.plan` is `x.plan` relative to
// the base id STDLIB (run.originalUriBaseIds), never a path on the machine that built planc.
void SarifUri(const SourceManager& sm, uint32_t buffer, json::Object& location) {
  std::string_view name = sm.Name(buffer);
  if (sm.Kind(buffer) == BufferKind::kStdlib &&
      name.substr(0, kStdlibPrefix.size()) == kStdlibPrefix) {
    location["uri"] = Str(UriEncode(name.substr(kStdlibPrefix.size())));
    location["uriBaseId"] = Str(kStdlibBase);
    return;
  }
  location["uri"] = Str(UriEncode(name));
}

json::Value SarifPhysical(const SourceManager& sm, const SafeRange& r, SarifArtifacts& arts) {
  LineColumn b = sm.Position(r.buffer, r.begin);
  LineColumn e = sm.Position(r.buffer, r.end);
  json::Object artifact{{"index", arts.Index(r.buffer)}};
  BufferKind kind = sm.Kind(r.buffer);
  if (kind == BufferKind::kFile || kind == BufferKind::kStdlib) SarifUri(sm, r.buffer, artifact);
  json::Object region{
      {"startLine", static_cast<int64_t>(b.line)},
      {"startColumn", CodePointColumn(sm, r.buffer, r.begin)},
      {"endLine", static_cast<int64_t>(e.line)},
      {"endColumn", CodePointColumn(sm, r.buffer, r.end)},
      {"charOffset", static_cast<int64_t>(r.begin)},
      {"charLength", static_cast<int64_t>(r.end - r.begin)},
  };
  return json::Object{{"artifactLocation", std::move(artifact)}, {"region", std::move(region)}};
}

std::string RenderSarif(const std::vector<Diagnostic>& diags, const SourceManager& sm,
                        const RenderOptions& options) {
  std::string base = options.docs_uri_base.empty() ? "docs/diagnostics/" : options.docs_uri_base;
  json::Array rules;
  std::vector<DiagKind> rule_kinds;
  auto rule_index = [&](DiagKind kind) -> int64_t {
    for (size_t i = 0; i < rule_kinds.size(); ++i) {
      if (rule_kinds[i] == kind) return static_cast<int64_t>(i);
    }
    const DiagKindInfo& info = SafeInfo(kind);
    rule_kinds.push_back(kind);
    rules.push_back(json::Object{
        {"id", Str(info.code)},
        {"name", Str(info.name)},
        {"shortDescription", json::Object{{"text", Str(info.summary)}}},
        {"helpUri", Str(base + std::string(info.code) + ".md")},
        {"defaultConfiguration", json::Object{{"level", Str(SarifLevel(info.level))}}},
    });
    return static_cast<int64_t>(rule_kinds.size() - 1);
  };
  SarifArtifacts arts;
  json::Array results;
  for (const Diagnostic& d : diags) {
    const DiagKindInfo& info = SafeInfo(d.kind);
    json::Object result{
        {"ruleId", Str(info.code)},
        {"ruleIndex", rule_index(d.kind)},
        {"level", Str(SarifLevel(d.level))},
        {"message", json::Object{{"text", Str(d.message)}}},
    };
    SafeRange primary = Repair(sm, d.primary);
    json::Array locations;
    if (primary.valid) {
      json::Object loc{{"physicalLocation", SarifPhysical(sm, primary, arts)}};
      if (!d.primary_label.empty()) loc["message"] = json::Object{{"text", Str(d.primary_label)}};
      locations.push_back(std::move(loc));
    }
    result["locations"] = std::move(locations);
    json::Array related;
    int64_t id = 0;
    for (const DiagLabel& l : d.labels) {
      SafeRange r = Repair(sm, l.range);
      if (!r.valid) continue;
      related.push_back(json::Object{{"id", id++},
                                     {"physicalLocation", SarifPhysical(sm, r, arts)},
                                     {"message", json::Object{{"text", Str(l.message)}}}});
    }
    if (!related.empty()) result["relatedLocations"] = std::move(related);
    json::Array values, notes, helps;
    for (const auto& [expr, value] : d.values) {
      values.push_back(Str(value.empty() ? expr : expr + " = " + value));
    }
    for (const std::string& n : d.notes) notes.push_back(Str(n));
    for (const std::string& h : d.helps) helps.push_back(Str(h));
    result["properties"] = json::Object{{"name", Str(info.name)},
                                        {"values", std::move(values)},
                                        {"notes", std::move(notes)},
                                        {"helps", std::move(helps)}};
    results.push_back(std::move(result));
  }
  json::Array artifacts;
  bool stdlib_base = false;
  for (uint32_t buffer : arts.buffers) {
    BufferKind kind = sm.Kind(buffer);
    json::Object a{{"sourceLanguage", "paraplan"}};
    if (kind == BufferKind::kFile || kind == BufferKind::kStdlib) {
      json::Object location;
      SarifUri(sm, buffer, location);
      stdlib_base |= location.find("uriBaseId") != location.end();
      a["location"] = std::move(location);
    } else {
      a["description"] = json::Object{{"text", Str(sm.Name(buffer))}};
      a["contents"] = json::Object{{"text", Str(sm.Text(buffer))}};
    }
    artifacts.push_back(std::move(a));
  }
  json::Object driver{{"name", Str(options.tool_name)},
                      {"informationUri", Str(base + "README.md")},
                      {"rules", std::move(rules)}};
  if (!options.tool_version.empty()) driver["version"] = Str(options.tool_version);
  json::Object run{{"tool", json::Object{{"driver", std::move(driver)}}},
                   {"columnKind", "unicodeCodePoints"},
                   {"results", std::move(results)}};
  if (!artifacts.empty()) run["artifacts"] = std::move(artifacts);
  if (stdlib_base) {
    run["originalUriBaseIds"] = json::Object{
        {std::string(kStdlibBase),
         json::Object{{"description", json::Object{{"text",
                                                    "the paraplan standard library (planc's "
                                                    "stdlib directory, PARAPLAN_STDLIB)"}}}}}};
  }
  json::Object doc{{"$schema", "https://json.schemastore.org/sarif-2.1.0.json"},
                   {"version", "2.1.0"},
                   {"runs", json::Array{std::move(run)}}};
  return Pretty(json::Value(std::move(doc)));
}

}  // namespace

std::string RenderDiagnostics(const std::vector<Diagnostic>& diagnostics,
                              const SourceManager& sources, DiagFormat format,
                              const RenderOptions& options) {
  // Each case calls a different renderer (the check takes same-shaped calls for clones).
  // NOLINTBEGIN(bugprone-branch-clone)
  switch (format) {
    case DiagFormat::kText:
      return RenderText(diagnostics, sources, options);
    case DiagFormat::kShort:
      return RenderShort(diagnostics, sources, options);
    case DiagFormat::kJson:
      return RenderJson(diagnostics, sources, options);
    case DiagFormat::kSarif:
      return RenderSarif(diagnostics, sources, options);
  }
  // NOLINTEND(bugprone-branch-clone)
  return RenderText(diagnostics, sources, options);
}

}  // namespace paraplan
