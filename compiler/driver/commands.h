// planc's subcommands. Each lives in its own cmd_<name>.cpp and takes the arguments after the
// subcommand name. Return value is the process exit status (DESIGN.md): 0 success (warnings
// allowed), 1 the input has errors, 2 bad usage, 70 internal error.
#ifndef PARAPLAN_COMPILER_DRIVER_COMMANDS_H_
#define PARAPLAN_COMPILER_DRIVER_COMMANDS_H_

#include <string>
#include <vector>

namespace paraplan {

inline constexpr int kExitOk = 0;
inline constexpr int kExitInputError = 1;
inline constexpr int kExitUsage = 2;
inline constexpr int kExitInternal = 70;

int RunCheck(const std::vector<std::string>& args);
int RunExplain(const std::vector<std::string>& args);
int RunSearch(const std::vector<std::string>& args);
int RunCompile(const std::vector<std::string>& args);
int RunDump(const std::vector<std::string>& args);
int RunImport(const std::vector<std::string>& args);
int RunExport(const std::vector<std::string>& args);

}  // namespace paraplan

#endif  // PARAPLAN_COMPILER_DRIVER_COMMANDS_H_
