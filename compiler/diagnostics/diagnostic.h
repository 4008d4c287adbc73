// Diagnostics as data.
//
// A Diagnostic is what a phase reports: a registered kind (stable code such as `P0301`, a
// kebab-case name, a level), a message, a primary range, labelled secondary ranges (every
// declaration that took part, including `--set` values, stdlib records and `auto` solutions),
// the evaluated numbers of the failing rule, notes (the rule in one sentence) and helps
// (concrete fixes). Phases hand diagnostics to a DiagnosticSink; renderers (text, short, json,
// sarif) turn the collected list into output at the very end.
//
// Kinds are registered in kinds.def (one include file per area, see there); every kind has a
// page docs/diagnostics/<code>.md and a test that produces it.
#ifndef PARAPLAN_COMPILER_DIAGNOSTICS_DIAGNOSTIC_H_
#define PARAPLAN_COMPILER_DIAGNOSTICS_DIAGNOSTIC_H_

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "compiler/source/source.h"

namespace paraplan {

enum class DiagLevel : uint8_t { kNote, kWarning, kError };

enum class DiagKind : uint16_t {
#define PARAPLAN_DIAG(ID, CODE, NAME, LEVEL, SUMMARY) ID,
#include "compiler/diagnostics/kinds.def"
#undef PARAPLAN_DIAG
  kCount
};

struct DiagKindInfo {
  DiagKind kind;
  std::string_view code;  // "P0301"
  std::string_view name;  // "expert-mesh-does-not-divide-world"
  DiagLevel level;
  std::string_view summary;  // one line for docs and --list
  std::string_view id;  // the enumerator's name, "kExpertMeshWorld" (coverage scans tests for it)
};

const DiagKindInfo& GetDiagKindInfo(DiagKind kind);
std::span<const DiagKindInfo> AllDiagKinds();
// nullptr when no kind has this code or name.
const DiagKindInfo* FindDiagKind(std::string_view code_or_name);
std::string_view LevelName(DiagLevel level);  // "error", "warning", "note"

struct DiagLabel {
  SourceRange range;
  std::string message;
};

struct Diagnostic {
  DiagKind kind{};
  DiagLevel level{};  // the kind's level unless the reporter overrides it
  std::string message;
  SourceRange primary;  // may be invalid (a whole-plan fact)
  std::string primary_label;
  std::vector<DiagLabel> labels;
  // The evaluated numbers of the failing rule: {"tp · ep · pp", "4 · 32 · 4 = 512"}.
  std::vector<std::pair<std::string, std::string>> values;
  std::vector<std::string> notes;
  std::vector<std::string> helps;
};

// Builder, so reporting reads like the diagnostic:
//   sink.Report(Diag(DiagKind::kExpertMeshWorld, "...").At(r, "...").Note("...").Help("..."));
class Diag {
 public:
  Diag(DiagKind kind, std::string message);
  Diag& At(SourceRange range, std::string label = {});
  Diag& Label(SourceRange range, std::string message);
  Diag& Value(std::string expression, std::string value);
  Diag& Note(std::string note);
  Diag& Help(std::string help);
  Diag& Level(DiagLevel level);
  Diagnostic Take() && { return std::move(d_); }
  const Diagnostic& Get() const { return d_; }

 private:
  Diagnostic d_;
};

// Collects diagnostics in report order. Counts errors so phases can decide whether to go on.
class DiagnosticSink {
 public:
  void Report(Diagnostic d);
  void Report(Diag d) { Report(std::move(d).Take()); }
  const std::vector<Diagnostic>& diagnostics() const { return diagnostics_; }
  int error_count() const { return errors_; }
  int warning_count() const { return warnings_; }
  bool has_errors() const { return errors_ > 0; }
  void Clear();

 private:
  std::vector<Diagnostic> diagnostics_;
  int errors_ = 0;
  int warnings_ = 0;
};

}  // namespace paraplan

#endif  // PARAPLAN_COMPILER_DIAGNOSTICS_DIAGNOSTIC_H_
