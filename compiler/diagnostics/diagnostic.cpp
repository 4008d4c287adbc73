#include "compiler/diagnostics/diagnostic.h"

#include <array>

namespace paraplan {
namespace {

constexpr DiagLevel kError = DiagLevel::kError;
constexpr DiagLevel kWarning = DiagLevel::kWarning;
constexpr DiagLevel kNote = DiagLevel::kNote;

constexpr std::array<DiagKindInfo, static_cast<size_t>(DiagKind::kCount)> kKinds = {{
#define PARAPLAN_DIAG(ID, CODE, NAME, LEVEL, SUMMARY) \
  {DiagKind::ID, CODE, NAME, LEVEL, SUMMARY, #ID},
#include "compiler/diagnostics/kinds.def"
#undef PARAPLAN_DIAG
}};

}  // namespace

const DiagKindInfo& GetDiagKindInfo(DiagKind kind) { return kKinds[static_cast<size_t>(kind)]; }

std::span<const DiagKindInfo> AllDiagKinds() { return kKinds; }

const DiagKindInfo* FindDiagKind(std::string_view code_or_name) {
  for (const DiagKindInfo& k : kKinds) {
    if (k.code == code_or_name || k.name == code_or_name) return &k;
  }
  return nullptr;
}

std::string_view LevelName(DiagLevel level) {
  switch (level) {
    case DiagLevel::kNote:
      return "note";
    case DiagLevel::kWarning:
      return "warning";
    case DiagLevel::kError:
      return "error";
  }
  return "error";
}

Diag::Diag(DiagKind kind, std::string message) {
  d_.kind = kind;
  d_.level = GetDiagKindInfo(kind).level;
  d_.message = std::move(message);
}

Diag& Diag::At(SourceRange range, std::string label) {
  d_.primary = range;
  d_.primary_label = std::move(label);
  return *this;
}

Diag& Diag::Label(SourceRange range, std::string message) {
  d_.labels.push_back({range, std::move(message)});
  return *this;
}

Diag& Diag::Value(std::string expression, std::string value) {
  d_.values.emplace_back(std::move(expression), std::move(value));
  return *this;
}

Diag& Diag::Note(std::string note) {
  d_.notes.push_back(std::move(note));
  return *this;
}

Diag& Diag::Help(std::string help) {
  d_.helps.push_back(std::move(help));
  return *this;
}

Diag& Diag::Level(DiagLevel level) {
  d_.level = level;
  return *this;
}

void DiagnosticSink::Report(Diagnostic d) {
  if (d.level == DiagLevel::kError) ++errors_;
  if (d.level == DiagLevel::kWarning) ++warnings_;
  diagnostics_.push_back(std::move(d));
}

void DiagnosticSink::Clear() {
  diagnostics_.clear();
  errors_ = 0;
  warnings_ = 0;
}

}  // namespace paraplan
