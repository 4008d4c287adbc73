#include "compiler/check/evaluate.h"

namespace paraplan {

// Placeholder until the evaluator lands: loads nothing.
struct PlanSource::Impl {};

PlanSource::PlanSource(SourceManager& sm) : sm_(sm) {}
PlanSource::~PlanSource() = default;

std::unique_ptr<PlanSource> PlanSource::Load(const std::string& file, const LoadOptions& options,
                                             SourceManager& sm, DiagnosticSink& sink) {
  return nullptr;
}

std::unique_ptr<PlanSource> PlanSource::FromText(std::string name, std::string text,
                                                 const LoadOptions& options, SourceManager& sm,
                                                 DiagnosticSink& sink) {
  return nullptr;
}

std::optional<SetOverride> PlanSource::ParseSet(std::string_view text, SourceManager& sm,
                                                DiagnosticSink& sink) {
  return std::nullopt;
}

std::vector<std::string> PlanSource::PlanNames() const { return {}; }

std::optional<Plan> PlanSource::Evaluate(std::string_view plan_name,
                                         std::span<const SetOverride> sets,
                                         const EvalOptions& options, DiagnosticSink& sink) const {
  return std::nullopt;
}

int EvaluateAllRecords(const PlanSource& source, DiagnosticSink& sink) { return 0; }

}  // namespace paraplan
