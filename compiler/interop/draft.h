// A plan under construction by an importer: canonical path -> value (an expression of the
// language), each with the setting of the user's file it came from. Every importer fills one
// through its table (flag -> plan path -> conversion); WriteImportedPlan turns it into the
// .plan text, matching the model against the stdlib's shapes.
//
// Made by the readers (megatron.cpp, torchtitan.cpp, deepspeed.cpp, nemo.cpp); read by
// WriteImportedPlan (draft.cpp).
#ifndef PARAPLAN_COMPILER_INTEROP_DRAFT_H_
#define PARAPLAN_COMPILER_INTEROP_DRAFT_H_

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "compiler/interop/interop.h"
#include "compiler/plan/plan.h"

namespace paraplan::interop {

struct DraftSetting {
  std::string path;    // canonical path: "parallel.tp", "model.layers", "cluster.nodes"
  std::string value;   // an expression of the language: "4", "true", "interleaved_1f1b"
  SourceRange origin;  // the setting in the user's file; invalid for a framework default
  std::string source;  // what the comment names: "--tensor-model-parallel-size 4"
};

// A setting of the user's file that has no plan field, or that planc does not know.
struct DraftSkip {
  std::string text;  // "--log-interval 1"
  SourceRange range;
  std::string reason;  // "not a layout setting", "not recognised"
};

class PlanDraft {
 public:
  // Sets `field`, replacing an earlier value of the same field (a later flag wins, as in
  // argparse). A path literal converts to FieldId and is checked while compiling.
  void Set(FieldId field, std::string value, SourceRange origin, std::string source);
  const DraftSetting* Find(FieldId field) const { return FindPath(field.path); }
  const DraftSetting* FindPath(std::string_view path) const;
  bool Has(FieldId field) const { return Find(field) != nullptr; }
  void Erase(FieldId field);
  void Skip(std::string text, SourceRange range, std::string reason);
  // Forgets the skipped settings whose text is `text` or starts with `text` and a space (a
  // reader that reads them after all).
  void Unskip(std::string_view text);

  const std::vector<DraftSetting>& Settings() const { return settings_; }
  const std::vector<DraftSkip>& Skipped() const { return skipped_; }

  ConfigKind kind = ConfigKind::kMegatron;
  // The GPU as the file names it ("h100", "A100-80GB"); empty when it does not.
  std::string gpu;
  SourceRange gpu_origin;
  std::string gpu_source;
  // A model named by the file (torchtitan's flavor, a NeMo recipe): a stdlib model record; the
  // model.* settings then override it.
  std::string stdlib_model;
  SourceRange stdlib_model_origin;
  std::string stdlib_model_source;
  // How to state the vocabulary when the file does not (the framework's own words).
  std::string vocab_help;

 private:
  std::vector<DraftSetting> settings_;
  std::vector<DraftSkip> skipped_;
};

// Writes the plan text. nullopt, with a diagnostic, when a setting a plan needs is missing or a
// value does not convert.
std::optional<ImportedPlan> WriteImportedPlan(const PlanDraft& draft, const ImportOptions& options,
                                              uint32_t config_buffer, SourceManager& sm,
                                              DiagnosticSink& sink);

// Integer and real values as the frameworks write them ("4", "1_000", "3e-4", "1.5e-4").
std::optional<int64_t> ParseInteger(std::string_view text);
std::optional<double> ParseReal(std::string_view text);
// The leading dense layers of Megatron's --moe-layer-freq (model.moe_layer_freq): K, as written,
// of a pattern `([0]*K+[1]*N)`; the count of a list `[0,0,1,1]`. nullopt for other text, or a
// list where a dense layer follows an MoE layer.
std::optional<std::string> MoePatternDenseLayers(std::string_view text);
std::optional<int64_t> MoeListDenseLayers(std::string_view text);
// A real written back as an expression of the language ("0.0003", "1e-08").
std::string RealText(double v);
// A string literal of the language.
std::string QuoteString(std::string_view text);

}  // namespace paraplan::interop

#endif  // PARAPLAN_COMPILER_INTEROP_DRAFT_H_
