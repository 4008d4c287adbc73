// The syntax tree of a .plan file.
//
// Made by parse/ (straight from ANTLR's parse tree, which never leaves parse/); read by check/.
// Every node carries the SourceRange of its text, so any diagnostic can point at what the user
// wrote. The tree is syntax only: names are not resolved, units not checked against fields,
// record kinds are the words written (validated by the parser: gpu, cluster, model, plan).
// Immutable after parsing; a Module owns all its nodes.
#ifndef PARAPLAN_COMPILER_AST_AST_H_
#define PARAPLAN_COMPILER_AST_AST_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "compiler/source/source.h"

namespace paraplan {
class SourceManager;
}

namespace paraplan::ast {

struct Block;

struct Name {
  std::string text;
  SourceRange range;
};

enum class ExprKind : uint8_t {
  kInt,     // int_value; unit set for a quantity (`80 GiB`)
  kReal,    // real_value; unit as for kInt
  kString,  // text
  kBool,    // bool_value
  kAuto,    // `auto`
  kPath,   // path: `hidden`, `cluster.gpus_per_node`; block set for a derivation `dgx_h100 { ... }`
  kList,   // operands: the elements
  kUnary,  // op ("-" or "not"), operands[0]
  kBinary,  // op, operands[0], operands[1]
  kCall,    // path[0] is the function name, operands the arguments
};

// The small fields come first, packed together: a large plan holds millions of these.
struct Expr {
  ExprKind kind = ExprKind::kInt;
  bool bool_value = false;
  // kInt/kReal: a literal past 64 bits or not finite (reported by the parser); it evaluates to
  // an error, so nothing else reports it.
  bool out_of_range = false;
  SourceRange range;
  int64_t int_value = 0;
  double real_value = 0;
  std::string text;  // kString: the value (escapes resolved); kUnary/kBinary: the operator
  Name unit;         // kInt/kReal: the unit as written ("GiB", "Gb/s"); empty text when none
  std::vector<Name> path;
  std::vector<std::unique_ptr<Expr>> operands;
  std::unique_ptr<Block> block;  // kPath: `base { overrides }`
};

enum class MemberKind : uint8_t {
  kAssign,   // path = value
  kAmend,    // path { block }
  kLet,      // let name = value  (path holds the one name)
  kRequire,  // require value : "message"
};

struct Member {
  MemberKind kind = MemberKind::kAssign;
  SourceRange range;
  std::vector<Name> path;
  std::unique_ptr<Expr> value;
  std::unique_ptr<Block> block;
  std::string message;  // kRequire; empty when none was written
  SourceRange message_range;
};

struct Block {
  SourceRange range;  // from `{` to `}`
  std::vector<Member> members;
};

struct Import {
  SourceRange range;
  std::vector<Name> module;  // `import std.models.llama`
  std::string file;          // `import "other.plan"`; empty for a module import
  SourceRange file_range;
};

enum class DeclKind : uint8_t { kGpu, kCluster, kModel, kPlan, kLet };

struct Decl {
  DeclKind kind = DeclKind::kPlan;
  SourceRange range;  // the whole declaration
  Name keyword;       // `model`, `plan`, ... or `let`
  Name name;
  std::unique_ptr<Expr> base;   // `extends BASE` (records) or the value (let)
  std::unique_ptr<Block> body;  // records
};

struct Module {
  uint32_t buffer = 0;
  std::vector<Import> imports;
  std::vector<Decl> decls;
};

std::string_view ToString(DeclKind k);  // "gpu", "cluster", "model", "plan", "let"

// A stable indented dump (`planc check --dump=ast`): one line per import, declaration and
// member, nested blocks indented under what they belong to (also derivations inside
// expressions), expressions fully parenthesised. With `sm`, each line ends with its range as
// `@line:col-line:col`.
std::string PrintAst(const Module& module, const SourceManager* sm = nullptr);
// Structural invariants of a module as the parser makes it: every range lies in the module's
// buffer and inside its parent's range, every node has the children its kind needs (an
// assignment a path and a value, an amendment a block, a binary operator two operands, ...).
// Returns the violations, one line each; empty when there are none.
std::vector<std::string> VerifyAst(const Module& module);
std::string PrintExpr(const Expr& e);  // the expression back as source-like text

}  // namespace paraplan::ast

#endif  // PARAPLAN_COMPILER_AST_AST_H_
