#include "compiler/interop/draft.h"
#include "compiler/interop/readers.h"

namespace paraplan {

std::optional<ConfigKind> ParseConfigKind(std::string_view text) {
  if (text == "megatron") return ConfigKind::kMegatron;
  if (text == "torchtitan") return ConfigKind::kTorchtitan;
  if (text == "deepspeed") return ConfigKind::kDeepSpeed;
  if (text == "nemo") return ConfigKind::kNemo;
  return std::nullopt;
}

std::string_view ToString(ConfigKind kind) {
  switch (kind) {
    case ConfigKind::kMegatron:
      return "megatron";
    case ConfigKind::kTorchtitan:
      return "torchtitan";
    case ConfigKind::kDeepSpeed:
      return "deepspeed";
    case ConfigKind::kNemo:
      return "nemo";
  }
  return "?";
}

std::string_view FrameworkName(ConfigKind kind) {
  switch (kind) {
    case ConfigKind::kMegatron:
      return "Megatron-LM";
    case ConfigKind::kTorchtitan:
      return "torchtitan";
    case ConfigKind::kDeepSpeed:
      return "DeepSpeed";
    case ConfigKind::kNemo:
      return "NeMo";
  }
  return "?";
}

namespace {

std::optional<ImportedPlan> ImportBuffer(ConfigKind kind, uint32_t buffer,
                                         const ImportOptions& options, SourceManager& sm,
                                         DiagnosticSink& sink) {
  std::optional<interop::PlanDraft> draft;
  const interop::GivenCluster given{options.nodes.has_value(), options.gpus_per_node.has_value()};
  switch (kind) {
    case ConfigKind::kMegatron:
      draft = interop::ReadMegatron(sm, buffer, sink, given);
      break;
    case ConfigKind::kTorchtitan:
      draft = interop::ReadTorchtitan(sm, buffer, sink);
      break;
    case ConfigKind::kDeepSpeed:
      draft = interop::ReadDeepSpeed(sm, buffer, sink, given);
      break;
    case ConfigKind::kNemo:
      draft = interop::ReadNemo(sm, buffer, sink);
      break;
  }
  if (!draft) return std::nullopt;
  return interop::WriteImportedPlan(*draft, options, buffer, sm, sink);
}

}  // namespace

std::optional<ImportedPlan> ImportConfig(ConfigKind kind, const std::string& file,
                                         const ImportOptions& options, SourceManager& sm,
                                         DiagnosticSink& sink) {
  std::string error;
  auto buffer = sm.AddFile(file, BufferKind::kFile, &error);
  if (!buffer) {
    sink.Report(Diag(DiagKind::kFileNotReadable, "cannot read '" + file + "': " + error));
    return std::nullopt;
  }
  return ImportBuffer(kind, *buffer, options, sm, sink);
}

std::optional<ImportedPlan> ImportConfigText(ConfigKind kind, std::string name, std::string text,
                                             const ImportOptions& options, SourceManager& sm,
                                             DiagnosticSink& sink) {
  uint32_t buffer = sm.AddBuffer(std::move(name), std::move(text), BufferKind::kFile);
  return ImportBuffer(kind, buffer, options, sm, sink);
}

}  // namespace paraplan
