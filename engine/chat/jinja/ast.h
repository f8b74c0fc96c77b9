// The parsed form of a template: statements (text, output, if, for, set, loop controls) over
// expressions.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "engine/chat/jinja/value.h"

namespace inferd::jinja {

struct Expr {
  enum class Kind {
    kLiteral,  // value
    kName,     // name
    kList,     // args
    kDict,     // keys (names), args (values)
    kAttr,     // args[0].name
    kIndex,    // args[0][args[1]]
    kSlice,    // args[0][args[1]:args[2]:args[3]]; an absent bound is a kLiteral undefined
    kCall,     // args[0](args[1..]) with keyword arguments in keys / kwargs
    kFilter,   // args[0] | name(args[1..]) with keyword arguments
    kTest,     // args[0] is [not] name(args[1..]); negate
    kUnary,    // op args[0]: "not", "-", "+"
    kBinary,   // args[0] op args[1]: or and == != < > <= >= in notin + - ~ * / // % **
    kTernary,  // args[0] if args[1] else args[2] (args[2] may be absent)
  };
  Kind kind = Kind::kLiteral;
  Value value;
  std::string name;  // kName, kAttr, kFilter, kTest; op for kUnary and kBinary
  bool negate = false;
  std::vector<std::unique_ptr<Expr>> args;
  std::vector<std::string> keys;              // kDict keys; kCall/kFilter keyword names
  std::vector<std::unique_ptr<Expr>> kwargs;  // kCall/kFilter keyword values
  int line = 0;
};

struct Stmt {
  enum class Kind { kText, kOutput, kIf, kFor, kSet, kBreak, kContinue, kBlock };
  Kind kind = Kind::kText;
  std::string text;            // kText
  std::unique_ptr<Expr> expr;  // kOutput, kSet value, kFor iterable
  // kIf: conditions[i] guards bodies[i]; a trailing body without a condition is the else branch.
  std::vector<std::unique_ptr<Expr>> conditions;
  std::vector<std::vector<std::unique_ptr<Stmt>>> bodies;
  // kFor: loop variables, optional filter (conditions[0]), bodies[0] the body, bodies[1] the else branch.
  std::vector<std::string> targets;
  // kSet: targets[0] is the name; with an attribute (ns.attr) it is targets[1].
  int line = 0;
};

using Body = std::vector<std::unique_ptr<Stmt>>;

}  // namespace inferd::jinja
