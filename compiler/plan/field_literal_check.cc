// Compiled (syntax only) by two tests in compiler/plan/CMakeLists.txt: with a canonical path the
// literal converts to a FieldId, with a misspelt one (PARAPLAN_MISSPELT) it must not compile.
#include "compiler/plan/plan.h"

namespace paraplan {

SourceRange TensorParallelRange(const Plan& plan) {
#ifdef PARAPLAN_MISSPELT
  return plan.Range("parallel.tpp");
#else
  return plan.Range("parallel.tp");
#endif
}

}  // namespace paraplan
