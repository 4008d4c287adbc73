// The words of a shell launch script, as far as a launch script needs: comments, `\` line
// continuations, single and double quotes, variables set in the script (`TP=4`, `export
// NODES=${SLURM_NNODES:-2}`, arrays `ARGS=( ... )`) and their expansion (`$TP`, `${TP}`,
// `${X:-default}` and the other default, alternative and error operators, nested), and
// `#SBATCH` directives. Nothing is executed: a quoted string that holds
// several words (`GPT_ARGS="--num-layers 24 --hidden-size 1024"`) is split where it is written,
// so every flag keeps its own range in the file, and an expansion of such a list is skipped
// (its flags were already seen where the list was written).
//
// Made and read by the Megatron importer (megatron.cpp).
#ifndef PARAPLAN_COMPILER_INTEROP_SHELL_WORDS_H_
#define PARAPLAN_COMPILER_INTEROP_SHELL_WORDS_H_

#include <map>
#include <string>
#include <vector>

#include "compiler/source/source.h"

namespace paraplan::interop {

struct ShellWord {
  std::string text;   // after quote removal and expansion
  SourceRange range;  // the word as written
  // What its value comes from that planc cannot read: a variable the script does not set,
  // `$(...)`, or an expansion planc does not evaluate (`${A%.*}`, `${A:?msg}` with A unset).
  std::string unresolved;
  // Why, when it is not a variable the script does not set: "a suffix removal (`%`) that planc
  // does not evaluate".
  std::string why;
  bool sbatch = false;          // a word of a `#SBATCH` line
  bool list_expansion = false;  // the expansion of a variable holding several words
};

struct ShellScript {
  std::vector<ShellWord> words;
  std::map<std::string, std::string> variables;  // as set at the end of the script
  // An unterminated quote or `${`: where it starts; invalid when none.
  SourceRange unterminated;
};

ShellScript ScanShellScript(const SourceManager& sm, uint32_t buffer);

}  // namespace paraplan::interop

#endif  // PARAPLAN_COMPILER_INTEROP_SHELL_WORDS_H_
