// Renderers: turn a list of Diagnostics (data) into text for people and tools.
//
//   kText   rustc/Carbon-style reports: a header line with level, code and message, one frame
//           per diagnostic holding every labelled range (in any buffer: plan files, stdlib
//           modules, "<command line>" buffers from --set), the evaluated values, `= note:` and
//           `= help:` lines, and a closing summary line.
//   kShort  one line per fact, for build logs: `file:line:col: error[P0301]: message`, then a
//           line per label, value, note and help.
//   kJson   {"version": 1, "diagnostics": [...], "summary": {...}}: every field of Diagnostic
//           under stable names, each location with file, line, column (1-based) and byte offsets.
//   kSarif  SARIF 2.1.0 (one run; tool.driver.rules for the kinds used, results with ruleId,
//           level, message, locations, relatedLocations).
//
// Rendering never fails and never crashes: invalid or out-of-range ranges are clamped or
// dropped, tabs are expanded, control bytes and invalid UTF-8 are replaced, CRLF is handled.
// Pure functions of their inputs (no environment, no clock), so golden tests compare them.
//
// Called by every planc subcommand at the very end; tests and the renderer fuzzer call it too.
#ifndef PARAPLAN_COMPILER_DIAGNOSTICS_RENDER_H_
#define PARAPLAN_COMPILER_DIAGNOSTICS_RENDER_H_

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "compiler/diagnostics/diagnostic.h"
#include "compiler/source/source.h"

namespace paraplan {

enum class DiagFormat { kText, kShort, kJson, kSarif };

// "text", "short", "json", "sarif"; nullopt for anything else.
std::optional<DiagFormat> ParseDiagFormat(std::string_view name);

struct RenderOptions {
  bool color = false;   // ANSI colours in text and short forms
  bool ascii = false;   // draw frames with ASCII only (`-->`, `|`) instead of box characters
  bool summary = true;  // text form: the closing "aborting due to ..." line
  std::string tool_name = "planc";
  std::string tool_version;  // SARIF tool.driver.version; omitted when empty
  // Where the per-code pages live: helpUri = docs_uri_base + CODE + ".md". Empty: the
  // repository-relative "docs/diagnostics/".
  std::string docs_uri_base;
};

// Renders all diagnostics in the given order. Text and short forms end with a newline (and
// are empty for an empty list, except that json and sarif always produce a document).
std::string RenderDiagnostics(const std::vector<Diagnostic>& diagnostics,
                              const SourceManager& sources, DiagFormat format,
                              const RenderOptions& options = {});

// One diagnostic's text frame, without the summary line (JSON's "rendered" field uses it).
std::string RenderDiagnosticText(const Diagnostic& diagnostic, const SourceManager& sources,
                                 const RenderOptions& options = {});

// "aborting due to 2 errors; 1 warning emitted" and friends; empty when nothing is worth saying.
std::string SummaryLine(int errors, int warnings, bool color = false);

}  // namespace paraplan

#endif  // PARAPLAN_COMPILER_DIAGNOSTICS_RENDER_H_
