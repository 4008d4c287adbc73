#include "compiler/interop/readers.h"

namespace paraplan::interop {

std::optional<PlanDraft> ReadTorchtitan(const SourceManager& sm, uint32_t buffer,
                                        DiagnosticSink& sink) {
  sink.Report(
      Diag(DiagKind::kConfigSyntax, "torchtitan files are not read yet").At({buffer, 0, 0}));
  return std::nullopt;
}
std::optional<PlanDraft> ReadDeepSpeed(const SourceManager& sm, uint32_t buffer,
                                       DiagnosticSink& sink) {
  sink.Report(Diag(DiagKind::kConfigSyntax, "DeepSpeed files are not read yet").At({buffer, 0, 0}));
  return std::nullopt;
}
std::optional<PlanDraft> ReadNemo(const SourceManager& sm, uint32_t buffer, DiagnosticSink& sink) {
  sink.Report(Diag(DiagKind::kConfigSyntax, "NeMo files are not read yet").At({buffer, 0, 0}));
  return std::nullopt;
}

}  // namespace paraplan::interop
