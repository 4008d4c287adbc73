// Pieces the two renderer sources share: render.cpp (text and short forms, no LLVM) and
// render_json.cpp (JSON and SARIF through llvm::json, and the RenderDiagnostics dispatcher).
// Split so that the text renderers build without LLVM's JSON header, which clang cannot
// compile against GCC 12's standard library in C++20 mode (the libFuzzer build).
#ifndef PARAPLAN_COMPILER_DIAGNOSTICS_RENDER_INTERNAL_H_
#define PARAPLAN_COMPILER_DIAGNOSTICS_RENDER_INTERNAL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "compiler/diagnostics/render.h"

namespace paraplan::render_internal {

// A kind outside the registry (only from corrupted data) renders as the first kind rather
// than reading out of bounds.
const DiagKindInfo& SafeInfo(DiagKind kind);

// A range made safe to draw: the buffer exists, begin <= end <= size.
struct SafeRange {
  bool valid = false;
  uint32_t buffer = 0;
  uint32_t begin = 0;
  uint32_t end = 0;
};

SafeRange Repair(const SourceManager& sm, SourceRange r);

std::string RenderText(const std::vector<Diagnostic>& diags, const SourceManager& sm,
                       const RenderOptions& options);
std::string RenderShort(const std::vector<Diagnostic>& diags, const SourceManager& sm,
                        const RenderOptions& options);

}  // namespace paraplan::render_internal

#endif  // PARAPLAN_COMPILER_DIAGNOSTICS_RENDER_INTERNAL_H_
