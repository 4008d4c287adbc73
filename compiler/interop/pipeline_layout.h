// Megatron-Core's pipeline layout (Megatron-LM --pipeline-model-parallel-layout, Megatron-Bridge
// model.pipeline_model_parallel_layout): which layers each virtual pipeline stage holds, read
// into the plan's pipeline.stage_layers and written back from it.
//
// The string form names one layer per symbol: `E` the embedding, `t` a transformer (decoder)
// layer, `m` a multi-token-prediction module, `L` the output layer and loss; `|` ends a virtual
// stage, `X*N` repeats one symbol (`|*N` included), `(...)*N` repeats a group (no nesting), and
// commas are only for reading. Megatron-Bridge also takes a list of lists of names (`embedding`,
// `decoder`, `mtp`, `loss`, any case). Virtual stage s runs on pipeline rank s mod pp as chunk
// s / pp: the order of the plan's per-chunk stage_layers.
//
// A plan puts the embedding on virtual stage 0, and the output layer, the loss and every MTP
// module on the last one; a layout that places them elsewhere is refused (Megatron-Core itself
// takes a standalone MTP stage, which a plan cannot state).
//
// Made here; read by megatron.cpp and nemo.cpp (import) and export.cpp.
#ifndef PARAPLAN_COMPILER_INTEROP_PIPELINE_LAYOUT_H_
#define PARAPLAN_COMPILER_INTEROP_PIPELINE_LAYOUT_H_

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "compiler/interop/draft.h"

namespace paraplan::interop {

// The most layers (symbols after repetition) a layout may name; a longer one is refused before
// anything of its size is allocated.
inline constexpr int64_t kMaxLayoutSymbols = 100'000;

// One virtual stage of a layout.
struct LayoutStage {
  int64_t decoder = 0;
  int64_t mtp = 0;
  bool embedding = false;
  bool loss = false;
};

// Why a layout is refused: what was observed, the rule, and a fix.
struct LayoutProblem {
  std::string message;
  std::string note;
  std::string help;
};

struct ParsedLayout {
  std::vector<LayoutStage> stages;  // in virtual-stage order; empty when `problem` is set
  std::optional<LayoutProblem> problem;
};

// The string form ("Et|(tt|)*30mL").
ParsedLayout ParseLayoutString(std::string_view text);
// Megatron-Bridge's list form: one list of layer names per virtual stage.
ParsedLayout ParseLayoutLists(std::span<const std::vector<std::string>> stages);

// What the rest of the configuration says about the pipeline.
struct LayoutShape {
  int64_t pp = 1;
  std::optional<int64_t> vpp;     // stated by the file
  std::optional<int64_t> layers;  // model.layers, when the file states it
  int64_t mtp_layers = 0;         // model.mtp_layers
};

struct LayoutSplit {
  std::vector<int64_t> stage_layers;  // per virtual stage (chunk-major)
  int64_t vpp = 1;                    // virtual stages / pp
  std::optional<LayoutProblem> problem;
};

// The plan's split from a parsed layout, checked against the pipeline and the model.
LayoutSplit SplitFromLayout(std::span<const LayoutStage> stages, const LayoutShape& shape);

// How a stated virtual pipeline size meets the layout's.
enum class LayoutVpp : uint8_t {
  kMustMatch,  // Megatron-Core's TransformerConfig: a stated vpp other than stages / pp is an error
  kDerived,  // Megatron-LM's arguments: stages / pp replaces --virtual-pipeline-model-parallel-size
};

// Sets pipeline.stage_layers from a parsed layout (and parallel.vpp = stages / pp), checked
// against the draft's pp, vpp, model.layers and model.mtp_layers; `source` names the setting in
// the plan's comment. false, with P0902 at `range`, when the layout is refused.
bool ApplyLayout(const ParsedLayout& layout, std::string_view key, SourceRange range,
                 const std::string& source, LayoutVpp vpp_rule, PlanDraft& draft,
                 DiagnosticSink& sink);

// The layout string of a per-virtual-stage split: the embedding on the first, `mtp_layers` MTP
// modules and the loss on the last; runs of equal stages as `(...|)*N` ("Et|(tt|)*30mL").
std::string LayoutText(std::span<const int64_t> stage_layers, int64_t mtp_layers);

// A list of the language: "[1, 2, 2, 0]".
std::string LayerListText(std::span<const int64_t> counts);

}  // namespace paraplan::interop

#endif  // PARAPLAN_COMPILER_INTEROP_PIPELINE_LAYOUT_H_
