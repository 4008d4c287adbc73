// The parser: .plan text to AST (compiler/ast/). ANTLR's lexer, parser and parse tree stay
// inside this folder; the tree is converted to the AST at once.
//
// Syntax errors become P01xx diagnostics pointing at the offending token with the tokens
// that were expected ("expected `=` or `{`, found `8`"). After a syntax error the parser skips
// the member or declaration it is in (to the next one that starts a line, a `;` or `,`, or the
// `}` closing the block) and goes on, so independent errors in other members and declarations
// are reported too, without follow-on errors that echo the first; a file with any syntax error
// yields no module (it is not evaluated). Nothing is written to the console. Problems inside
// well-formed syntax (an unknown unit, an integer literal past 64 bits, an unknown declaration
// kind) are reported too, and parsing goes on.
//
// Called by check/ for every file it loads and for every `--set` value.
#ifndef PARAPLAN_COMPILER_PARSE_PARSE_H_
#define PARAPLAN_COMPILER_PARSE_PARSE_H_

#include <memory>

#include "compiler/ast/ast.h"
#include "compiler/diagnostics/diagnostic.h"
#include "compiler/source/source.h"

namespace paraplan {

// Parses buffer `buffer` as a module. nullptr when the text has syntax errors (all reported);
// otherwise the module, possibly with some problems reported (see above).
std::unique_ptr<ast::Module> ParseModule(const SourceManager& sm, uint32_t buffer,
                                         DiagnosticSink& sink);

// Parses buffer `buffer` as one `--set` override `PATH = EXPR` into an assignment member.
// nullptr on a syntax error (the first one reported; an override is one line).
std::unique_ptr<ast::Member> ParseSetOverride(const SourceManager& sm, uint32_t buffer,
                                              DiagnosticSink& sink);

}  // namespace paraplan

#endif  // PARAPLAN_COMPILER_PARSE_PARSE_H_
