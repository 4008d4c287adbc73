// The parser: .plan text to AST (compiler/ast/). ANTLR's lexer, parser and parse tree stay
// inside this folder; the tree is converted to the AST at once.
//
// Syntax errors become P01xx diagnostics pointing at the offending token with the tokens
// that were expected ("expected `=` or `{`, found `8`"). Only the first syntax error of a
// buffer is reported (later ones are usually consequences of it); nothing is written to the
// console. Problems inside well-formed syntax (an unknown unit, an integer literal past 64
// bits, an unknown declaration kind) are reported too, and parsing goes on.
//
// Called by check/ for every file it loads and for every `--set` value.
#ifndef PARAPLAN_COMPILER_PARSE_PARSE_H_
#define PARAPLAN_COMPILER_PARSE_PARSE_H_

#include <memory>

#include "compiler/ast/ast.h"
#include "compiler/diagnostics/diagnostic.h"
#include "compiler/source/source.h"

namespace paraplan {

// Parses buffer `buffer` as a module. nullptr when the text has a syntax error (reported);
// otherwise the module, possibly with some problems reported (see above).
std::unique_ptr<ast::Module> ParseModule(const SourceManager& sm, uint32_t buffer,
                                         DiagnosticSink& sink);

// Parses buffer `buffer` as one `--set` override `PATH = EXPR` into an assignment member.
// nullptr on a syntax error (reported).
std::unique_ptr<ast::Member> ParseSetOverride(const SourceManager& sm, uint32_t buffer,
                                              DiagnosticSink& sink);

}  // namespace paraplan

#endif  // PARAPLAN_COMPILER_PARSE_PARSE_H_
