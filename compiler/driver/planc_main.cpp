// planc: the plan compiler. Dispatches to one subcommand (compiler/driver/cmd_*.cpp).
#include <cstdio>
#include <exception>
#include <new>
#include <string>
#include <string_view>
#include <vector>

#include "compiler/driver/commands.h"

namespace {

constexpr const char* kUsage =
    "usage: planc <command> [options]\n"
    "\n"
    "commands:\n"
    "  check   FILE [--plan NAME] [--set PATH=VALUE]... [--diagnostics=text|short|json|sarif]\n"
    "  explain FILE [--plan NAME] [--set ...] [--rank R] [--format=text|json] [--svg OUT]\n"
    "  search  FILE [--plan NAME] [--set ...] [--top K] [--format=text|json]\n"
    "  compile FILE [--plan NAME] [--set ...] -o PROGRAM [--trace OUT.json]\n"
    "  dump    PROGRAM [--rank R] [--format=text|json]\n"
    "  import  --from=megatron|torchtitan|deepspeed|nemo FILE [--nodes N] [--gpus-per-node G]\n"
    "          [--gpu NAME] [-o OUT.plan]\n"
    "  export  FILE [--plan NAME] [--set ...] --to=megatron|torchtitan|deepspeed|nemo [-o OUT]\n"
    "\n"
    "check, explain, search and compile read a framework's file directly with --from=KIND\n"
    "\n"
    "exit status: 0 ok (warnings allowed), 1 the input has errors, 2 bad usage, 70 internal "
    "error\n";

}  // namespace

int main(int argc, char** argv) {
  using namespace paraplan;
  if (argc < 2) {
    std::fputs(kUsage, stderr);
    return kExitUsage;
  }
  std::string_view command = argv[1];
  std::vector<std::string> args(argv + 2, argv + argc);
  if (command == "-h" || command == "--help" || command == "help") {
    std::fputs(kUsage, stdout);
    return kExitOk;
  }
  try {
    if (command == "check") return RunCheck(args);
    if (command == "explain") return RunExplain(args);
    if (command == "search") return RunSearch(args);
    if (command == "compile") return RunCompile(args);
    if (command == "dump") return RunDump(args);
    if (command == "import") return RunImport(args);
    if (command == "export") return RunExport(args);
  } catch (const std::bad_alloc&) {
    // Everything the command held is freed by the time this runs, so the message can be
    // written. Plans are at most 64 MiB, which planc checks in well under 8 GB; this is a
    // process limited to less, or a search or compilation far larger than plans need.
    std::fprintf(stderr,
                 "planc: error: out of memory: '%.*s' needs more memory than this process may "
                 "use\n",
                 static_cast<int>(command.size()), command.data());
    return kExitInputError;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "planc: internal error: %s\n", e.what());
    return kExitInternal;
  }
  std::fprintf(stderr, "planc: unknown command '%.*s'\n\n%s", static_cast<int>(command.size()),
               command.data(), kUsage);
  return kExitUsage;
}
