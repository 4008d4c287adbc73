// Import and export of framework configurations: Megatron-LM / Megatron-Core launch scripts,
// torchtitan TOML job files, DeepSpeed JSON (with Megatron-DeepSpeed arguments) and NeMo /
// Megatron-Bridge YAML.
//
// Import reads a framework's file into the SourceManager (so diagnostics point into it), maps
// each setting to a canonical plan path through a per-framework table (flag -> plan path ->
// conversion), and writes a readable .plan text: a stdlib model where the shape matches one, a
// comment naming the source setting on each line, and a note listing every setting that has no
// plan field. The ImportedPlan also carries where each plan field came from in the user's file,
// so `planc check --from=KIND FILE` evaluates the generated text and then points diagnostics at
// the user's own flags (ApplyImportedOrigins, RemapImportedDiagnostic).
//
// Export writes the arguments, TOML, JSON or YAML that run a checked Plan on a framework, with
// the settings paraplan derived (dp, padded vocabulary, microbatches) explicit; what the target
// cannot express is an error (P0905), never an approximate file.
//
// Made by the driver (planc import, export, --from); reads check/ (to evaluate stdlib models).
#ifndef PARAPLAN_COMPILER_INTEROP_INTEROP_H_
#define PARAPLAN_COMPILER_INTEROP_INTEROP_H_

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "compiler/diagnostics/diagnostic.h"
#include "compiler/plan/plan.h"
#include "compiler/source/source.h"

namespace paraplan {

enum class ConfigKind : uint8_t { kMegatron, kTorchtitan, kDeepSpeed, kNemo };
// "megatron", "torchtitan", "deepspeed", "nemo"; nullopt for anything else.
std::optional<ConfigKind> ParseConfigKind(std::string_view text);
std::string_view ToString(ConfigKind kind);
// The framework's name as people write it: "Megatron-LM", "torchtitan", ...
std::string_view FrameworkName(ConfigKind kind);

// The GPU names `--gpu` takes, each a stdlib cluster: "h100", "h200", "h800", "a100" (the 80 GB
// A100, also "a100_80gb"), "a100_40gb".
std::span<const std::string_view> ImportGpuNames();
// Those names as a message lists them: "h100, h200, ... or a100_40gb".
std::string ImportGpuNamesText();

struct ImportOptions {
  // The cluster where the file does not say (command line of planc import / --from).
  std::optional<int64_t> nodes;
  std::optional<int64_t> gpus_per_node;
  std::string gpu;         // one of ImportGpuNames(); empty: from the file, or h100
  std::string plan_name;   // empty: derived from the file name
  std::string stdlib_dir;  // to match the model against stdlib shapes
};

struct ImportedPlan {
  std::string plan_name;
  std::string text;  // the .plan text
  // Canonical path -> the setting in the user's file it came from.
  std::vector<std::pair<std::string, SourceRange>> field_origins;
  // 1-based line of `text` -> the setting it came from (to remap diagnostics on the text).
  std::vector<std::pair<uint32_t, SourceRange>> line_origins;
  uint32_t config_buffer = 0;  // the user's file in the SourceManager
};

// Reads `file` as a configuration of `kind`. nullopt when it cannot be read, does not parse or
// lacks a setting a plan needs (diagnostics reported, pointing into the file); settings with no
// plan field are reported as one note (P0903) and listed in the written plan.
std::optional<ImportedPlan> ImportConfig(ConfigKind kind, const std::string& file,
                                         const ImportOptions& options, SourceManager& sm,
                                         DiagnosticSink& sink);
// The same for a text in memory (tests); `name` names the buffer.
std::optional<ImportedPlan> ImportConfigText(ConfigKind kind, std::string name, std::string text,
                                             const ImportOptions& options, SourceManager& sm,
                                             DiagnosticSink& sink);

// After evaluating `imported.text` (loaded as buffer `plan_buffer`): every field whose value
// was written in that text gets the user's setting as its origin.
void ApplyImportedOrigins(const ImportedPlan& imported, uint32_t plan_buffer,
                          const SourceManager& sm, Plan& plan);
// A diagnostic whose ranges lie on a line of the generated text that came from a setting now
// points at that setting in the user's file.
Diagnostic RemapImportedDiagnostic(const ImportedPlan& imported, uint32_t plan_buffer,
                                   const SourceManager& sm, Diagnostic d);

struct ExportResult {
  std::string text;  // empty when the plan cannot be expressed (errors reported)
  // A second file the first one names (DeepSpeed: the launch script's ds_config.json), written
  // beside it; empty name when there is none.
  std::string companion_name;
  std::string companion_text;
};
// Writes what runs `plan` on `kind`. Errors (P0905) for settings the target cannot express.
ExportResult ExportPlan(ConfigKind kind, const Plan& plan, DiagnosticSink& sink);

}  // namespace paraplan

#endif  // PARAPLAN_COMPILER_INTEROP_INTEROP_H_
