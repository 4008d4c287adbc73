// Writing planc's output files (programs, traces, SVG pictures) so that nothing is lost.
//
// WriteOutputFile(path, bytes, error):
//  - a new or regular file is written atomically: PATH.tmp-PID beside it, flushed and closed
//    with every error checked, then renamed over PATH. On any failure the temporary file is
//    removed and PATH keeps its old content (a full disk never leaves a truncated program);
//  - a symbolic link is followed: its target is replaced, the link stays;
//  - anything else that is not a directory (a device such as /dev/null or /dev/stdout, a FIFO)
//    is written in place and never replaced by a regular file;
//  - a directory is refused.
// SameFile(a, b): whether two paths name one existing file; SourceFileAt: whether an output path
// names a loaded source file (so `-o PLAN` is refused before it destroys the plan text).
//
// Used by planc compile (-o, --trace) and planc explain (--svg).
#ifndef PARAPLAN_COMPILER_DRIVER_OUTPUT_FILE_H_
#define PARAPLAN_COMPILER_DRIVER_OUTPUT_FILE_H_

#include <string>
#include <string_view>

#include "compiler/source/source.h"

namespace paraplan {

bool WriteOutputFile(const std::string& path, std::string_view bytes, std::string* error);
bool SameFile(const std::string& a, const std::string& b);
// The name of the source file (the plan or a file it imports) that `path` would overwrite, or "".
std::string SourceFileAt(const SourceManager& sm, const std::string& path);

}  // namespace paraplan

#endif  // PARAPLAN_COMPILER_DRIVER_OUTPUT_FILE_H_
