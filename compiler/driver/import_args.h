// The options that name a framework configuration and the cluster it runs on, shared by
// `planc import` and the --from mode of check, explain, search and compile:
//   --from=KIND (or --from KIND), --nodes N, --gpus-per-node G, --gpu NAME.
#ifndef PARAPLAN_COMPILER_DRIVER_IMPORT_ARGS_H_
#define PARAPLAN_COMPILER_DRIVER_IMPORT_ARGS_H_

#include <optional>
#include <string>
#include <vector>

#include "compiler/interop/interop.h"

namespace paraplan {

struct ImportArgs {
  std::optional<ConfigKind> kind;
  ImportOptions options;
};

// If args[i] is one of the options above, takes it (and its value, advancing i) and returns 1;
// returns 0 when it is not one of them, -1 with *error on bad usage.
int TakeImportArg(const std::vector<std::string>& args, size_t& i, ImportArgs* out,
                  std::string* error);

}  // namespace paraplan

#endif  // PARAPLAN_COMPILER_DRIVER_IMPORT_ARGS_H_
