// The grammar of .plan files. Purely syntactic: no actions, no predicates. compiler/parse/
// turns the parse tree into the AST (compiler/ast/) at once and decides what is an error
// beyond syntax (unknown record kinds, unknown units, literals out of range).
//
// Members of a block are separated by newlines, spaces, `;` or `,`: the grammar needs no
// separator because no expression can be followed directly by a name and `=` or `{`.
grammar Plan;

file        : topItem* EOF ;
// A single `--set PATH=VALUE` from the command line.
setOverride : path '=' expr EOF ;

topItem     : importDecl                                   # topImport
            | letDecl separator?                           # topLet
            | kindName=NAME recordName=NAME (EXTENDS base=path)? block separator?   # topRecord
            ;

importDecl  : IMPORT (dottedName | STRING) separator? ;
letDecl     : LET NAME '=' expr ;

block       : '{' member* '}' ;
member      : path '=' expr separator?                     # assignMember
            | path block separator?                        # amendMember
            | letDecl separator?                           # letMember
            | REQUIRE expr (':' STRING)? separator?        # requireMember
            ;
separator   : ';' | ',' ;

path        : NAME ('.' NAME)* ;
dottedName  : NAME ('.' NAME)* ;

expr        : orExpr ;
orExpr      : andExpr (OR andExpr)* ;
andExpr     : notExpr (AND notExpr)* ;
notExpr     : NOT notExpr | compareExpr ;
compareExpr : addExpr (op=('==' | '!=' | '<' | '<=' | '>' | '>=') addExpr)? ;
addExpr     : mulExpr (ops+=('+' | '-') mulExpr)* ;
mulExpr     : unaryExpr (ops+=('*' | '/' | '%') unaryExpr)* ;
unaryExpr   : '-' unaryExpr | primary ;
primary     : number unit?                                 # numberPrimary
            | STRING                                       # stringPrimary
            | (TRUE | FALSE)                               # boolPrimary
            | AUTO                                         # autoPrimary
            | '[' (expr (',' expr)* ','?)? ']'             # listPrimary
            | '(' expr ')'                                 # parenPrimary
            | NAME '(' (expr (',' expr)* ','?)? ')'        # callPrimary
            | path block?                                  # pathPrimary
            ;
number      : INT | REAL ;
// `GiB`, `GB/s`, `TFLOPS`, `ms`: checked by the AST builder.
unit        : NAME ('/' NAME)? ;

IMPORT  : 'import' ;
LET     : 'let' ;
REQUIRE : 'require' ;
EXTENDS : 'extends' ;
TRUE    : 'true' ;
FALSE   : 'false' ;
AUTO    : 'auto' ;
AND     : 'and' ;
OR      : 'or' ;
NOT     : 'not' ;

NAME    : [a-zA-Z_] [a-zA-Z0-9_]* ;
REAL    : DIGITS '.' DIGITS EXPONENT? | DIGITS EXPONENT ;
INT     : DIGITS ;
fragment DIGITS   : [0-9] ('_'? [0-9])* ;
fragment EXPONENT : [eE] [+-]? [0-9]+ ;
STRING  : '"' (~["\\\r\n] | '\\' ~[\r\n])* '"' ;
// An opening quote without its closing one on the same line; reported by the adapter.
UNTERMINATED_STRING : '"' (~["\\\r\n] | '\\' ~[\r\n])* '\\'? ;

LINE_COMMENT : ('#' | '//') ~[\r\n]* -> skip ;
BLOCK_COMMENT : '/*' .*? '*/' -> skip ;
WS      : [ \t\r\n\f]+ -> skip ;
// Anything else (a stray character); reported by the adapter.
UNKNOWN_CHAR : . ;
