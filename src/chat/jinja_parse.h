// Lexer and parser of the Jinja2 subset chat templates use, configured as transformers
// configures jinja2 (trim_blocks and lstrip_blocks on, one trailing newline dropped).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "chat/jinja_value.h"

namespace qhx::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    kLiteral,   // value
    kName,      // name
    kList,      // args (tuple: is_tuple)
    kDict,      // args: key, value, key, value, ...
    kAttr,      // args[0].name
    kItem,      // args[0][args[1]]
    kSlice,     // args[0][args[1]:args[2]:args[3]], absent parts null
    kCall,      // args[0](args[1:], kwargs)
    kFilter,    // args[0]|name(args[1:], kwargs)
    kTest,      // args[0] is [not: negate] name(args[1:])
    kNot,       // not args[0]
    kNeg,       // -args[0]
    kPos,       // +args[0]
    kBinary,    // args[0] name args[1]: + - * / // % ** ~
    kCompare,   // args[0] ops[0] args[1] ops[1] args[2] ...
    kAnd,       // args[0] and args[1]
    kOr,        // args[0] or args[1]
    kCondition  // args[0] if args[1] else args[2] (args[2] may be null)
  };
  Kind kind;
  int line = 0;
  std::string name;
  Value value;
  bool is_tuple = false;
  bool negate = false;
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  std::vector<std::string> ops;
};

struct Stmt;
using Body = std::vector<std::unique_ptr<Stmt>>;

struct Stmt {
  enum class Kind {
    kText,      // text
    kOutput,    // {{ expr }}
    kIf,        // conditions[i] -> bodies[i]; a trailing extra body is the else
    kFor,       // for targets in expr [if filter]: bodies[0], else bodies[1]
    kSet,       // set targets (or attr_owner.attr) = expr
    kSetBlock,  // set targets[0] %} bodies[0] {% endset
    kMacro,     // macro name(params) bodies[0]
    kBreak,
    kContinue,
    kFilterBlock,  // filter expr (a kFilter over a placeholder) bodies[0]
    kBlock,        // bodies[0] rendered in place (generation blocks)
  };
  Kind kind;
  int line = 0;
  std::string text;
  ExprPtr expr;
  ExprPtr filter;
  std::vector<ExprPtr> conditions;
  std::vector<Body> bodies;
  std::vector<std::string> targets;
  std::string attr_owner;  // set ns.attr: "ns", with targets[0] = "attr"
  std::vector<std::pair<std::string, ExprPtr>> params;  // macro parameters and defaults
};

// Parses a whole template. On a syntax error throws TemplateError, with `error_line` set to the
// line of the fault. Unknown filters and tests are syntax errors, as in jinja2.
Body parse_template(std::string_view source, int& error_line);

// The builtins (jinja_builtins.cc), known at parse time.
bool is_known_filter(std::string_view name);
bool is_known_test(std::string_view name);

// The variable through which {% filter %} and {% set x | f %} pass their body to the filters
// (no template can name it).
inline constexpr std::string_view kBlockBodyName = "\x01body";

// Parse limits that keep a hostile template from exhausting the stack.
inline constexpr int kMaxNesting = 200;

}  // namespace qhx::jinja
