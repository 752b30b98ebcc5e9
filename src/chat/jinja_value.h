// Values of the Jinja2 template engine (src/chat/jinja.h) and their Python-compatible printing:
// str(), repr() and json.dumps() as jinja2 and transformers produce them.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace qhx::jinja {

struct Value;
struct Dict;
struct MacroRef;
class Interpreter;

struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
};

// A builtin function or bound method. Errors are thrown as TemplateError.
using NativeFn = std::function<Value(Interpreter&, CallArgs&)>;

struct Value {
  enum class Kind : uint8_t {
    kUndefined,
    kNone,
    kBool,
    kInt,
    kFloat,
    kString,
    kList,
    kDict,
    kNamespace,
    kNative,
    kMacro,
  };
  Kind kind = Kind::kUndefined;
  bool tuple = false;  // a kList made by (a, b) or items(): printed as (a, b)
  bool b = false;
  int64_t i = 0;
  double f = 0;
  // kString: the text; kUndefined: what to say when it is used ("'x' is undefined").
  std::string s;
  // Lists and dicts never change once built (the sandbox is immutable), so copies share them.
  std::shared_ptr<const std::vector<Value>> list;
  std::shared_ptr<const Dict> dict;
  // Namespaces are mutable and owned by the render (no reference cycles to leak).
  Dict* ns = nullptr;
  std::shared_ptr<const NativeFn> native;
  const MacroRef* macro = nullptr;  // owned by the render

  static Value undefined(std::string message = {});
  static Value none();
  static Value boolean(bool v);
  static Value integer(int64_t v);
  static Value number(double v);
  static Value string(std::string v);
  static Value make_list(std::vector<Value> items, bool tuple = false);
  static Value make_dict(Dict d);
  static Value function(NativeFn fn);

  bool is_undefined() const { return kind == Kind::kUndefined; }
  bool is_none() const { return kind == Kind::kNone; }
  bool is_string() const { return kind == Kind::kString; }
  bool is_list() const { return kind == Kind::kList; }
  bool is_dict() const { return kind == Kind::kDict; }
  bool is_number() const {
    return kind == Kind::kInt || kind == Kind::kFloat || kind == Kind::kBool;
  }
  bool is_callable() const { return kind == Kind::kNative || kind == Kind::kMacro; }
  double as_double() const { return kind == Kind::kFloat ? f : static_cast<double>(as_int()); }
  int64_t as_int() const { return kind == Kind::kBool ? (b ? 1 : 0) : i; }

  bool truthy() const;
  // Python's type name for messages: "str", "int", "dict", ...
  std::string type_name() const;
};

// Insertion-ordered mapping (Python dict).
struct Dict {
  std::vector<std::pair<Value, Value>> items;
  const Value* find(const Value& key) const;
  const Value* find(std::string_view key) const;
  void set(Value key, Value value);
};

// Python ==: 1 == 1.0 == True, deep on lists and dicts.
bool equal(const Value& a, const Value& b);

// str(v) as jinja2 prints it ({{ v }}): None, True, 1.0, [1, 'a'], {'k': 'v'}; undefined is empty.
std::string to_str(const Value& v);
// repr(v).
std::string to_repr(const Value& v);
// Python's repr of a float: shortest round trip, 1e-05, 1e+16, inf, nan.
std::string float_repr(double d);

struct JsonOptions {
  bool ensure_ascii = false;
  std::string indent;  // with has_indent: the text of one level
  bool has_indent = false;
  std::string item_separator = ", ";
  std::string key_separator = ": ";
  bool sort_keys = false;
};
// json.dumps(v, ...) as transformers' tojson filter calls it. Throws TemplateError for values
// JSON cannot hold.
std::string to_json(const Value& v, const JsonOptions& options);

// JSON input (messages, tools) as template values, key order kept.
Value from_json(const nlohmann::ordered_json& j);

// Raised by the engine; the interpreter adds the template origin and line.
struct TemplateError {
  std::string message;
};
[[noreturn]] void throw_error(std::string message);

}  // namespace qhx::jinja
