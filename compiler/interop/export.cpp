#include "compiler/interop/interop.h"

namespace paraplan {

ExportResult ExportPlan(ConfigKind kind, const Plan& plan, DiagnosticSink& sink) {
  sink.Report(Diag(DiagKind::kExportNotExpressible, "export is not written yet"));
  return {};
}

}  // namespace paraplan
