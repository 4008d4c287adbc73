// One reader per framework: the user's file (a buffer of the SourceManager) in, a PlanDraft
// out. nullopt when the file does not parse or a value does not convert (diagnostics reported,
// pointing into the file). Called by ImportConfig (import.cpp).
#ifndef PARAPLAN_COMPILER_INTEROP_READERS_H_
#define PARAPLAN_COMPILER_INTEROP_READERS_H_

#include <optional>

#include "compiler/interop/draft.h"

namespace paraplan::interop {

// The cluster sizes the command line gives (--nodes, --gpus-per-node): a launch script's value
// for them that cannot be read is then not an error (the script's `--nnodes $SLURM_NNODES`).
struct GivenCluster {
  bool nodes = false;
  bool gpus_per_node = false;
};

std::optional<PlanDraft> ReadMegatron(const SourceManager& sm, uint32_t buffer,
                                      DiagnosticSink& sink, GivenCluster given = {});
std::optional<PlanDraft> ReadTorchtitan(const SourceManager& sm, uint32_t buffer,
                                        DiagnosticSink& sink);
std::optional<PlanDraft> ReadDeepSpeed(SourceManager& sm, uint32_t buffer, DiagnosticSink& sink,
                                       GivenCluster given = {});
std::optional<PlanDraft> ReadNemo(const SourceManager& sm, uint32_t buffer, DiagnosticSink& sink);

}  // namespace paraplan::interop

#endif  // PARAPLAN_COMPILER_INTEROP_READERS_H_
