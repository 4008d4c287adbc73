#include "compiler/driver/commands.h"

namespace paraplan {
int RunExport(const std::vector<std::string>& args) { return kExitUsage; }
}  // namespace paraplan
