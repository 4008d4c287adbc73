// Running the real binaries from tests: a per-process scratch directory, whole-file reads, and
// a command run through the shell with stdout and stderr captured separately. Used by the CLI
// test suites under tests/ (planc compile, search, memory); header-only.
#ifndef PARAPLAN_TESTS_SUPPORT_CLI_H_
#define PARAPLAN_TESTS_SUPPORT_CLI_H_

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace paraplan::testing {

// A directory under the system's temporary directory, unique to this process and `suite`.
inline std::string ScratchDir(const std::string& suite) {
  auto dir = std::filesystem::temp_directory_path() /
             ("paraplan_" + suite + "_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  return dir.string();
}

inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

struct CommandResult {
  int status;  // the exit status; 128 when the process did not exit normally
  std::string out, err;
};

// Runs `command` through the shell (in `cwd` when given), capturing stdout and stderr in
// files under `scratch`.
// (Three strings; every call names them.)
// NOLINTNEXTLINE(bugprone-easily-swappable-parameters)
inline CommandResult RunCommand(const std::string& command, const std::string& scratch,
                                const std::string& cwd = "") {
  const std::string out = scratch + "/stdout.txt", err = scratch + "/stderr.txt";
  const std::string line =
      (cwd.empty() ? "" : "cd " + cwd + " && ") + command + " > " + out + " 2> " + err;
  const int rc = std::system(line.c_str());
  return {WIFEXITED(rc) ? WEXITSTATUS(rc) : 128, ReadFile(out), ReadFile(err)};
}

}  // namespace paraplan::testing

#endif  // PARAPLAN_TESTS_SUPPORT_CLI_H_
