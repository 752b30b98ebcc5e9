// The tree-walking interpreter behind jinja::Template (internal to src/chat). One Interpreter
// serves one render: it owns the render's namespaces, macro closures and counters.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "chat/jinja.h"
#include "chat/jinja_parse.h"
#include "chat/jinja_value.h"

namespace qhx::jinja {

// Variables by name, looked up without building a string from a view.
struct NameHash {
  using is_transparent = void;
  size_t operator()(std::string_view name) const { return std::hash<std::string_view>{}(name); }
};
using Variables = std::unordered_map<std::string, Value, NameHash, std::equal_to<>>;

// A hash map, not a list: a request may pass 100,000s of template variables (its kwargs).
struct Scope {
  Variables vars;
  Scope* parent = nullptr;
  Value* find(std::string_view name);
  void set(const std::string& name, Value v);
};

struct MacroRef {
  const Stmt* def;
  Scope* closure;
};

class Interpreter {
 public:
  explicit Interpreter(const Limits& limits) : limits_(limits) {}

  // Renders the template body with `vars` visible (over the builtin globals).
  std::string run(const Body& body, const std::vector<std::pair<std::string, Value>>& vars);
  int line() const { return line_; }

  // For the builtins.
  Value call(const Value& fn, CallArgs args);
  Value apply_filter(std::string_view name, Value target, CallArgs args);
  bool apply_test(std::string_view name, const Value& v, CallArgs args);
  Value get_attr(const Value& obj, const std::string& name);
  Value get_item(const Value& obj, const Value& key);
  Value make_namespace(Dict d);
  // Accounts for `bytes` of new strings or list storage against the limits.
  void charge(size_t bytes);
  size_t max_items() const { return limits_.max_items; }

 private:
  enum class Flow { kNormal, kBreak, kContinue };

  Flow exec(const Body& body, Scope& scope);
  Flow exec_stmt(const Stmt& s, Scope& scope);
  void exec_for(const Stmt& s, Scope& scope, Flow& flow);
  void exec_set(const Stmt& s, Scope& scope, Value v);
  Value eval(const Expr& e, Scope& scope);
  Value eval_binary(const Expr& e, Scope& scope);
  Value eval_compare(const Expr& e, Scope& scope);
  CallArgs eval_args(const Expr& e, Scope& scope);
  Value call_macro(const MacroRef& m, CallArgs& args);
  void emit(std::string_view text);
  void step();

  struct DepthGuard {
    explicit DepthGuard(Interpreter& in);
    ~DepthGuard() { --in_.depth_; }
    Interpreter& in_;
  };

  const Limits& limits_;
  std::string* out_ = nullptr;
  int line_ = 1;
  int depth_ = 0;
  int64_t steps_ = 0;
  size_t allocated_ = 0;
  Scope globals_;
  std::deque<Dict> namespaces_;
  std::deque<Scope> closures_;
  std::deque<MacroRef> macros_;
};

// Builtins (jinja_builtins.cc).
using FilterFn = Value (*)(Interpreter&, Value&, CallArgs&);
using TestFn = bool (*)(Interpreter&, const Value&, CallArgs&);
FilterFn find_filter(std::string_view name);
TestFn find_test(std::string_view name);
// A method of a string or dict (s.strip, d.items), or undefined when there is none.
Value find_method(Interpreter& in, const Value& self, const std::string& name);
// range, namespace, raise_exception, strftime_now, dict.
std::vector<std::pair<std::string, Value>> builtin_globals();
// The items of an iterable: list items, dict keys, string characters; undefined is empty.
std::vector<Value> iterate(const Value& v);
// Python's <, for sort and comparisons; throws TypeError for unordered types.
bool less(const Value& a, const Value& b);

}  // namespace qhx::jinja
