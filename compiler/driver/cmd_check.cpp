// planc check: placeholder until its phase lands; reports an internal error rather than pretending.
#include <cstdio>

#include "compiler/driver/commands.h"

namespace paraplan {

int RunCheck(const std::vector<std::string>& args) {
  std::fputs("planc check: not available in this build yet\n", stderr);
  return kExitInternal;
}

}  // namespace paraplan
