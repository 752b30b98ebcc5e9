#include "chat/jinja.h"

#include <cmath>

#include "chat/jinja_interp.h"
#include "chat/jinja_parse.h"
#include "chat/jinja_text.h"
#include "util/error.h"
#include "util/utf8.h"

namespace qhx::jinja {

Value* Scope::find(std::string_view name) {
  for (Scope* s = this; s; s = s->parent) {
    if (const auto it = s->vars.find(name); it != s->vars.end()) return &it->second;
  }
  return nullptr;
}

void Scope::set(const std::string& name, Value v) {
  vars.insert_or_assign(name, std::move(v));
}

Interpreter::DepthGuard::DepthGuard(Interpreter& in) : in_(in) {
  if (++in_.depth_ > in_.limits_.max_depth) {
    throw_error("recursion too deep (limit " + std::to_string(in_.limits_.max_depth) + ")");
  }
}

void Interpreter::step() {
  if (++steps_ > limits_.max_steps) {
    throw_error("template exceeded the step limit (" + std::to_string(limits_.max_steps) + ")");
  }
}

void Interpreter::charge(size_t bytes) {
  allocated_ += bytes;
  if (allocated_ > limits_.max_alloc_bytes) {
    throw_error("template exceeded the memory limit (" + std::to_string(limits_.max_alloc_bytes) +
                " bytes)");
  }
}

void Interpreter::emit(std::string_view text) {
  if (out_->size() + text.size() > limits_.max_output_bytes) {
    throw_error("output exceeds the limit of " + std::to_string(limits_.max_output_bytes) +
                " bytes");
  }
  out_->append(text);
}

Value Interpreter::make_namespace(Dict d) {
  namespaces_.push_back(std::move(d));
  Value v;
  v.kind = Value::Kind::kNamespace;
  v.ns = &namespaces_.back();
  return v;
}

std::string Interpreter::run(const Body& body,
                             const std::vector<std::pair<std::string, Value>>& vars) {
  for (auto& [name, v] : builtin_globals()) globals_.set(name, std::move(v));
  for (const auto& [name, v] : vars) globals_.set(name, v);
  std::string out;
  out_ = &out;
  exec(body, globals_);
  return out;
}

Interpreter::Flow Interpreter::exec(const Body& body, Scope& scope) {
  DepthGuard guard(*this);
  for (const auto& s : body) {
    const Flow f = exec_stmt(*s, scope);
    if (f != Flow::kNormal) return f;
  }
  return Flow::kNormal;
}

Interpreter::Flow Interpreter::exec_stmt(const Stmt& s, Scope& scope) {
  step();
  line_ = s.line;
  switch (s.kind) {
    case Stmt::Kind::kText:
      emit(s.text);
      break;
    case Stmt::Kind::kOutput: {
      const Value v = eval(*s.expr, scope);
      emit(to_str(v));
      break;
    }
    case Stmt::Kind::kIf:
      for (size_t k = 0; k < s.bodies.size(); ++k) {
        if (k == s.conditions.size() || eval(*s.conditions[k], scope).truthy()) {
          return exec(s.bodies[k], scope);
        }
      }
      break;
    case Stmt::Kind::kFor: {
      Flow flow = Flow::kNormal;
      exec_for(s, scope, flow);
      break;
    }
    case Stmt::Kind::kSet:
      exec_set(s, scope, eval(*s.expr, scope));
      break;
    case Stmt::Kind::kSetBlock:
    case Stmt::Kind::kFilterBlock: {
      std::string captured;
      std::string* saved = out_;
      out_ = &captured;
      try {
        exec(s.bodies[0], scope);
      } catch (...) {
        out_ = saved;
        throw;
      }
      out_ = saved;
      Value v = Value::string(std::move(captured));
      if (s.filter) {
        // The filter chain reads the captured text through a name only the parser can write.
        Scope inner{{{std::string(kBlockBodyName), v}}, &scope};
        v = eval(*s.filter, inner);
      }
      if (s.kind == Stmt::Kind::kSetBlock) {
        scope.set(s.targets[0], std::move(v));
      } else {
        emit(to_str(v));
      }
      break;
    }
    case Stmt::Kind::kMacro: {
      Scope* closure = &scope;
      if (&scope != &globals_) {
        // A macro defined inside a loop or macro keeps a copy of what it could see there.
        closures_.emplace_back();
        Scope& copy = closures_.back();
        copy.parent = &globals_;
        for (Scope* sc = &scope; sc && sc != &globals_; sc = sc->parent) {
          for (const auto& [k, v] : sc->vars) {
            if (!copy.find(k) || copy.find(k) == globals_.find(k)) copy.vars.emplace(k, v);
          }
        }
        closure = &copy;
      }
      macros_.push_back(MacroRef{&s, closure});
      Value v;
      v.kind = Value::Kind::kMacro;
      v.macro = &macros_.back();
      scope.set(s.text, std::move(v));
      break;
    }
    case Stmt::Kind::kBreak:
      return Flow::kBreak;
    case Stmt::Kind::kContinue:
      return Flow::kContinue;
    case Stmt::Kind::kBlock:
      return exec(s.bodies[0], scope);
  }
  return Flow::kNormal;
}

namespace {

// Binds the loop targets: one name, or unpacking into several.
void bind_targets(Scope& scope, const std::vector<std::string>& targets, const Value& item) {
  if (targets.size() == 1) {
    scope.set(targets[0], item);
    return;
  }
  const std::vector<Value> parts = iterate(item);
  if (!item.is_list() && !item.is_string() && !item.is_dict()) {
    throw_error("TypeError: cannot unpack non-iterable " + item.type_name() + " object");
  }
  if (parts.size() != targets.size()) {
    throw_error(parts.size() > targets.size()
                    ? "ValueError: too many values to unpack (expected " +
                          std::to_string(targets.size()) + ")"
                    : "ValueError: not enough values to unpack (expected " +
                          std::to_string(targets.size()) + ", got " + std::to_string(parts.size()) +
                          ")");
  }
  for (size_t k = 0; k < parts.size(); ++k) scope.set(targets[k], parts[k]);
}

}  // namespace

void Interpreter::exec_for(const Stmt& s, Scope& scope, Flow& flow) {
  const Value seq = eval(*s.expr, scope);
  if (!seq.is_list() && !seq.is_dict() && !seq.is_string() && !seq.is_undefined()) {
    throw_error("TypeError: '" + seq.type_name() + "' object is not iterable");
  }
  std::vector<Value> items = iterate(seq);
  if (s.filter) {
    std::vector<Value> kept;
    for (auto& item : items) {
      Scope probe{{}, &scope};
      bind_targets(probe, s.targets, item);
      if (eval(*s.filter, probe).truthy()) kept.push_back(std::move(item));
    }
    items = std::move(kept);
  }
  const auto n = static_cast<int64_t>(items.size());
  for (int64_t k = 0; k < n; ++k) {
    step();
    Scope iteration{{}, &scope};
    bind_targets(iteration, s.targets, items[static_cast<size_t>(k)]);
    Dict loop;
    const auto put = [&](const char* key, Value v) {
      loop.items.emplace_back(Value::string(key), std::move(v));
    };
    put("index", Value::integer(k + 1));
    put("index0", Value::integer(k));
    put("revindex", Value::integer(n - k));
    put("revindex0", Value::integer(n - k - 1));
    put("first", Value::boolean(k == 0));
    put("last", Value::boolean(k == n - 1));
    put("length", Value::integer(n));
    put("depth", Value::integer(1));
    put("depth0", Value::integer(0));
    put("previtem",
        k > 0 ? items[static_cast<size_t>(k - 1)] : Value::undefined("there is no previous item"));
    put("nextitem",
        k + 1 < n ? items[static_cast<size_t>(k + 1)] : Value::undefined("there is no next item"));
    put("cycle", Value::function([k](Interpreter&, CallArgs& a) {
          if (a.positional.empty()) throw_error("TypeError: no items for cycling given");
          return a.positional[static_cast<size_t>(k) % a.positional.size()];
        }));
    iteration.set("loop", Value::make_dict(std::move(loop)));
    const Flow f = exec(s.bodies[0], iteration);
    if (f == Flow::kBreak) break;
  }
  if (n == 0 && s.bodies.size() > 1) flow = exec(s.bodies[1], scope);
}

void Interpreter::exec_set(const Stmt& s, Scope& scope, Value v) {
  if (!s.attr_owner.empty()) {
    Value* owner = scope.find(s.attr_owner);
    if (!owner || owner->kind != Value::Kind::kNamespace) {
      throw_error("cannot assign attribute on non-namespace object");
    }
    if (!s.targets[0].empty() && s.targets[0][0] == '_') {
      throw_error(
          "SecurityError: Chat templates cannot store underscore-prefixed attributes on "
          "a namespace, but got '" +
          s.targets[0] + "'");
    }
    owner->ns->set(Value::string(s.targets[0]), std::move(v));
    return;
  }
  bind_targets(scope, s.targets, v);
}

CallArgs Interpreter::eval_args(const Expr& e, Scope& scope) {
  CallArgs a;
  for (size_t k = 1; k < e.args.size(); ++k) a.positional.push_back(eval(*e.args[k], scope));
  for (const auto& [name, x] : e.kwargs) a.keyword.emplace_back(name, eval(*x, scope));
  return a;
}

Value Interpreter::call(const Value& fn, CallArgs args) {
  if (fn.kind == Value::Kind::kNative) return (*fn.native)(*this, args);
  if (fn.kind == Value::Kind::kMacro) return call_macro(*fn.macro, args);
  if (fn.is_undefined()) throw_error(fn.s);
  throw_error("TypeError: '" + fn.type_name() + "' object is not callable");
}

Value Interpreter::call_macro(const MacroRef& m, CallArgs& args) {
  DepthGuard guard(*this);
  const Stmt& def = *m.def;
  if (args.positional.size() > def.params.size()) {
    throw_error("TypeError: macro '" + def.text + "' takes not more than " +
                std::to_string(def.params.size()) + " argument(s)");
  }
  Scope local{{}, m.closure};
  for (size_t k = 0; k < def.params.size(); ++k) {
    const std::string& name = def.params[k].first;
    if (k < args.positional.size()) {
      local.set(name, args.positional[k]);
      continue;
    }
    const Value* given = nullptr;
    for (const auto& [key, v] : args.keyword) {
      if (key == name) given = &v;
    }
    if (given) {
      local.set(name, *given);
    } else if (def.params[k].second) {
      local.set(name, eval(*def.params[k].second, local));
    } else {
      local.set(name, Value::undefined("'" + name + "' is undefined"));
    }
  }
  for (const auto& [key, v] : args.keyword) {
    bool known = false;
    for (const auto& p : def.params) known = known || p.first == key;
    if (!known) {
      throw_error("TypeError: macro '" + def.text + "' takes no keyword argument '" + key + "'");
    }
  }
  std::string captured;
  std::string* saved = out_;
  const int saved_line = line_;
  out_ = &captured;
  try {
    exec(def.bodies[0], local);
  } catch (...) {
    out_ = saved;
    throw;
  }
  out_ = saved;
  line_ = saved_line;
  charge(captured.size());
  return Value::string(std::move(captured));
}

Value Interpreter::apply_filter(std::string_view name, Value target, CallArgs args) {
  const FilterFn f = find_filter(name);
  if (!f) throw_error("unknown filter '" + std::string(name) + "'");
  return f(*this, target, args);
}

bool Interpreter::apply_test(std::string_view name, const Value& v, CallArgs args) {
  const TestFn t = find_test(name);
  if (!t) throw_error("unknown test '" + std::string(name) + "'");
  return t(*this, v, args);
}

namespace {

std::string object_name(const Value& v) {
  return v.is_none() ? "None" : v.type_name() + " object";
}

int64_t normalize_index(int64_t index, size_t size) {
  return index < 0 ? index + static_cast<int64_t>(size) : index;
}

}  // namespace

Value Interpreter::get_attr(const Value& obj, const std::string& name) {
  if (obj.is_undefined()) throw_error(obj.s);
  if (!name.empty() && name[0] == '_') {
    return Value::undefined("access to attribute '" + name + "' of '" + obj.type_name() +
                            "' object is unsafe.");
  }
  if (obj.kind == Value::Kind::kNamespace) {
    if (const Value* v = obj.ns->find(name)) return *v;
  } else {
    Value method = find_method(*this, obj, name);
    if (!method.is_undefined()) return method;
    if (obj.is_dict()) {
      if (const Value* v = obj.dict->find(name)) return *v;
    }
  }
  return Value::undefined("'" + object_name(obj) + "' has no attribute '" + name + "'");
}

Value Interpreter::get_item(const Value& obj, const Value& key) {
  if (obj.is_undefined()) throw_error(obj.s);
  if (obj.is_dict()) {
    if (const Value* v = obj.dict->find(key)) return *v;
  } else if ((obj.is_list() || obj.is_string()) &&
             (key.kind == Value::Kind::kInt || key.kind == Value::Kind::kBool)) {
    if (obj.is_list()) {
      const int64_t k = normalize_index(key.as_int(), obj.list->size());
      if (k >= 0 && k < static_cast<int64_t>(obj.list->size())) {
        return (*obj.list)[static_cast<size_t>(k)];
      }
    } else {
      const std::vector<char32_t> cps = text::decode(obj.s);
      const int64_t k = normalize_index(key.as_int(), cps.size());
      if (k >= 0 && k < static_cast<int64_t>(cps.size())) {
        std::string one;
        text::append_utf8(one, cps[static_cast<size_t>(k)]);
        return Value::string(std::move(one));
      }
    }
  }
  if (key.is_string()) return get_attr(obj, key.s);
  return Value::undefined(object_name(obj) + " has no element " + to_repr(key));
}

namespace {

// Python slice bounds for a sequence of `size` items.
std::vector<size_t> slice_indices(const Value& start, const Value& stop, const Value& step,
                                  size_t size) {
  const auto as_index = [](const Value& v, const char* what) -> std::optional<int64_t> {
    if (v.is_none() || v.is_undefined()) return std::nullopt;
    if (v.kind != Value::Kind::kInt && v.kind != Value::Kind::kBool) {
      throw_error(std::string("TypeError: slice ") + what + " must be an integer or None");
    }
    return v.as_int();
  };
  const int64_t n = static_cast<int64_t>(size);
  const int64_t st = as_index(step, "step").value_or(1);
  if (st == 0) throw_error("ValueError: slice step cannot be zero");
  const auto clamp = [&](std::optional<int64_t> v, int64_t def) {
    if (!v) return def;
    int64_t x = *v < 0 ? *v + n : *v;
    if (st > 0) return std::clamp<int64_t>(x, 0, n);
    return std::clamp<int64_t>(x, -1, n - 1);
  };
  const int64_t b = clamp(as_index(start, "start"), st > 0 ? 0 : n - 1);
  const int64_t e = clamp(as_index(stop, "stop"), st > 0 ? n : -1);
  std::vector<size_t> idx;
  for (int64_t k = b; st > 0 ? k < e : k > e; k += st) idx.push_back(static_cast<size_t>(k));
  return idx;
}

bool is_int(const Value& v) {
  return v.kind == Value::Kind::kInt || v.kind == Value::Kind::kBool;
}

[[noreturn]] void unsupported(const std::string& op, const Value& a, const Value& b) {
  if (a.is_undefined()) throw_error(a.s);
  if (b.is_undefined()) throw_error(b.s);
  if (op == "+" && a.is_string()) {
    throw_error("TypeError: can only concatenate str (not \"" + b.type_name() + "\") to str");
  }
  throw_error("TypeError: unsupported operand type(s) for " + op + ": '" + a.type_name() +
              "' and '" + b.type_name() + "'");
}

Value checked_int(bool overflow, int64_t v) {
  if (overflow) throw_error("OverflowError: integer result out of range");
  return Value::integer(v);
}

}  // namespace

Value Interpreter::eval_binary(const Expr& e, Scope& scope) {
  const Value a = eval(*e.args[0], scope);
  const Value b = eval(*e.args[1], scope);
  line_ = e.line;
  const std::string& op = e.name;
  if (op == "~") {
    std::string s = to_str(a) + to_str(b);
    charge(s.size());
    return Value::string(std::move(s));
  }
  if (a.is_number() && b.is_number()) {
    const bool ints = is_int(a) && is_int(b);
    const int64_t x = a.as_int(), y = b.as_int();
    const double fx = a.as_double(), fy = b.as_double();
    if (ints && (op == "+" || op == "-" || op == "*")) {
      int64_t r = 0;
      const bool overflow = op == "+"   ? __builtin_add_overflow(x, y, &r)
                            : op == "-" ? __builtin_sub_overflow(x, y, &r)
                                        : __builtin_mul_overflow(x, y, &r);
      return checked_int(overflow, r);
    }
    if (op == "+") return Value::number(fx + fy);
    if (op == "-") return Value::number(fx - fy);
    if (op == "*") return Value::number(fx * fy);
    if (op == "/") {
      if (fy == 0) throw_error("ZeroDivisionError: division by zero");
      return Value::number(fx / fy);
    }
    if (op == "//" || op == "%") {
      if (ints) {
        if (y == 0) throw_error("ZeroDivisionError: integer division or modulo by zero");
        if (x == INT64_MIN && y == -1) {
          if (op == "%") return Value::integer(0);
          throw_error("OverflowError: integer result out of range");
        }
        int64_t q = x / y, m = x % y;
        if (m != 0 && ((m < 0) != (y < 0))) {
          --q;
          m += y;
        }
        return Value::integer(op == "//" ? q : m);
      }
      if (fy == 0) throw_error("ZeroDivisionError: float division by zero");
      // CPython's float divmod.
      double m = std::fmod(fx, fy);
      double div = (fx - m) / fy;
      if (m != 0) {
        if ((fy < 0) != (m < 0)) {
          m += fy;
          div -= 1.0;
        }
      } else {
        m = std::copysign(0.0, fy);
      }
      if (op == "%") return Value::number(m);
      double floored = std::copysign(0.0, fx / fy);
      if (div != 0) {
        floored = std::floor(div);
        if (div - floored > 0.5) floored += 1.0;
      }
      return Value::number(floored);
    }
    if (op == "**") {
      if (ints && y >= 0) {
        int64_t result = 1, base = x;
        bool overflow = false;
        for (int64_t k = y; k > 0; k >>= 1) {
          if (k & 1) overflow |= __builtin_mul_overflow(result, base, &result);
          if (k > 1) overflow |= __builtin_mul_overflow(base, base, &base);
          if (overflow) break;
        }
        return checked_int(overflow, result);
      }
      if (fx == 0 && fy < 0)
        throw_error("ZeroDivisionError: 0.0 cannot be raised to a negative power");
      return Value::number(std::pow(fx, fy));
    }
  }
  if (op == "+") {
    if (a.is_string() && b.is_string()) {
      charge(a.s.size() + b.s.size());
      return Value::string(a.s + b.s);
    }
    if (a.is_list() && b.is_list() && a.tuple == b.tuple) {
      if (a.list->size() + b.list->size() > limits_.max_items) throw_error("list too long");
      charge((a.list->size() + b.list->size()) * sizeof(Value));
      std::vector<Value> items(*a.list);
      items.insert(items.end(), b.list->begin(), b.list->end());
      return Value::make_list(std::move(items), a.tuple);
    }
  }
  if (op == "*" && ((is_int(b) && (a.is_string() || a.is_list())) ||
                    (is_int(a) && (b.is_string() || b.is_list())))) {
    const Value& seq = is_int(b) ? a : b;
    const int64_t times = std::max<int64_t>(0, (is_int(b) ? b : a).as_int());
    const size_t unit = seq.is_string() ? seq.s.size() : seq.list->size();
    if (unit > 0 && static_cast<size_t>(times) >
                        (seq.is_string() ? limits_.max_output_bytes : limits_.max_items) / unit) {
      throw_error("repetition result too large");
    }
    if (seq.is_string()) {
      charge(unit * static_cast<size_t>(times));
      std::string s;
      for (int64_t k = 0; k < times; ++k) s += seq.s;
      return Value::string(std::move(s));
    }
    charge(unit * static_cast<size_t>(times) * sizeof(Value));
    std::vector<Value> items;
    for (int64_t k = 0; k < times; ++k)
      items.insert(items.end(), seq.list->begin(), seq.list->end());
    return Value::make_list(std::move(items), seq.tuple);
  }
  if (op == "%" && a.is_string()) throw_error("printf-style string formatting is not supported");
  unsupported(op, a, b);
}

bool less(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (is_int(a) && is_int(b)) return a.as_int() < b.as_int();
    return a.as_double() < b.as_double();
  }
  if (a.is_string() && b.is_string()) return a.s < b.s;
  if (a.is_list() && b.is_list() && a.tuple == b.tuple) {
    const size_t n = std::min(a.list->size(), b.list->size());
    for (size_t k = 0; k < n; ++k) {
      if (!equal((*a.list)[k], (*b.list)[k])) return less((*a.list)[k], (*b.list)[k]);
    }
    return a.list->size() < b.list->size();
  }
  throw_error("TypeError: '<' not supported between instances of '" + a.type_name() + "' and '" +
              b.type_name() + "'");
}

namespace {

bool contains(const Value& container, const Value& item) {
  if (container.is_string()) {
    if (!item.is_string()) {
      throw_error("TypeError: 'in <string>' requires string as left operand, not " +
                  item.type_name());
    }
    return container.s.find(item.s) != std::string::npos;
  }
  if (container.is_list()) {
    for (const auto& v : *container.list) {
      if (equal(v, item)) return true;
    }
    return false;
  }
  if (container.is_dict()) return container.dict->find(item) != nullptr;
  if (container.is_undefined()) return false;
  throw_error("TypeError: argument of type '" + container.type_name() + "' is not iterable");
}

}  // namespace

Value Interpreter::eval_compare(const Expr& e, Scope& scope) {
  Value left = eval(*e.args[0], scope);
  for (size_t k = 0; k < e.ops.size(); ++k) {
    Value right = eval(*e.args[k + 1], scope);
    line_ = e.line;
    const std::string& op = e.ops[k];
    bool r = false;
    if (op == "==") {
      r = equal(left, right);
    } else if (op == "!=") {
      r = !equal(left, right);
    } else if (op == "in") {
      r = contains(right, left);
    } else if (op == "not in") {
      r = !contains(right, left);
    } else {
      if (!((left.is_number() && right.is_number()) || (left.is_string() && right.is_string()) ||
            (left.is_list() && right.is_list()))) {
        throw_error("TypeError: '" + op + "' not supported between instances of '" +
                    left.type_name() + "' and '" + right.type_name() + "'");
      }
      if (op == "<") r = less(left, right);
      if (op == ">") r = less(right, left);
      if (op == "<=") r = !less(right, left);
      if (op == ">=") r = !less(left, right);
    }
    if (!r) return Value::boolean(false);
    left = std::move(right);
  }
  return Value::boolean(true);
}

Value Interpreter::eval(const Expr& e, Scope& scope) {
  DepthGuard guard(*this);
  step();
  line_ = e.line;
  switch (e.kind) {
    case Expr::Kind::kLiteral:
      return e.value;
    case Expr::Kind::kName: {
      if (const Value* v = scope.find(e.name)) return *v;
      return Value::undefined("'" + e.name + "' is undefined");
    }
    case Expr::Kind::kList: {
      std::vector<Value> items;
      for (const auto& x : e.args) items.push_back(eval(*x, scope));
      charge(items.size() * sizeof(Value));
      return Value::make_list(std::move(items), e.is_tuple);
    }
    case Expr::Kind::kDict: {
      Dict d;
      for (size_t k = 0; k + 1 < e.args.size(); k += 2) {
        Value key = eval(*e.args[k], scope);
        if (key.is_list() && !key.tuple) throw_error("TypeError: unhashable type: 'list'");
        if (key.is_dict()) throw_error("TypeError: unhashable type: 'dict'");
        d.set(std::move(key), eval(*e.args[k + 1], scope));
      }
      charge(d.items.size() * 2 * sizeof(Value));
      return Value::make_dict(std::move(d));
    }
    case Expr::Kind::kAttr: {
      const Value obj = eval(*e.args[0], scope);
      line_ = e.line;
      return get_attr(obj, e.name);
    }
    case Expr::Kind::kItem: {
      const Value obj = eval(*e.args[0], scope);
      const Value key = eval(*e.args[1], scope);
      line_ = e.line;
      return get_item(obj, key);
    }
    case Expr::Kind::kSlice: {
      const Value obj = eval(*e.args[0], scope);
      Value parts[3];
      for (int k = 0; k < 3; ++k) {
        if (e.args[static_cast<size_t>(k) + 1])
          parts[k] = eval(*e.args[static_cast<size_t>(k) + 1], scope);
      }
      line_ = e.line;
      if (obj.is_undefined()) throw_error(obj.s);
      if (obj.is_string()) {
        const std::vector<char32_t> cps = text::decode(obj.s);
        std::string out;
        for (size_t k : slice_indices(parts[0], parts[1], parts[2], cps.size())) {
          text::append_utf8(out, cps[k]);
        }
        charge(out.size());
        return Value::string(std::move(out));
      }
      if (obj.is_list()) {
        std::vector<Value> items;
        for (size_t k : slice_indices(parts[0], parts[1], parts[2], obj.list->size())) {
          items.push_back((*obj.list)[k]);
        }
        charge(items.size() * sizeof(Value));
        return Value::make_list(std::move(items), obj.tuple);
      }
      throw_error("TypeError: '" + obj.type_name() + "' object is not subscriptable");
    }
    case Expr::Kind::kCall: {
      const Value fn = eval(*e.args[0], scope);
      CallArgs args = eval_args(e, scope);
      line_ = e.line;
      return call(fn, std::move(args));
    }
    case Expr::Kind::kFilter: {
      Value target = eval(*e.args[0], scope);
      CallArgs args = eval_args(e, scope);
      line_ = e.line;
      return apply_filter(e.name, std::move(target), std::move(args));
    }
    case Expr::Kind::kTest: {
      const Value target = eval(*e.args[0], scope);
      CallArgs args = eval_args(e, scope);
      line_ = e.line;
      return Value::boolean(apply_test(e.name, target, std::move(args)) != e.negate);
    }
    case Expr::Kind::kNot:
      return Value::boolean(!eval(*e.args[0], scope).truthy());
    case Expr::Kind::kNeg:
    case Expr::Kind::kPos: {
      const Value v = eval(*e.args[0], scope);
      line_ = e.line;
      if (v.is_undefined()) throw_error(v.s);
      const bool neg = e.kind == Expr::Kind::kNeg;
      if (is_int(v)) {
        if (neg && v.as_int() == INT64_MIN)
          throw_error("OverflowError: integer result out of range");
        return Value::integer(neg ? -v.as_int() : v.as_int());
      }
      if (v.kind == Value::Kind::kFloat) return Value::number(neg ? -v.f : v.f);
      throw_error(std::string("TypeError: bad operand type for unary ") + (neg ? "-" : "+") +
                  ": '" + v.type_name() + "'");
    }
    case Expr::Kind::kBinary:
      return eval_binary(e, scope);
    case Expr::Kind::kCompare:
      return eval_compare(e, scope);
    case Expr::Kind::kAnd: {
      Value a = eval(*e.args[0], scope);
      return a.truthy() ? eval(*e.args[1], scope) : a;
    }
    case Expr::Kind::kOr: {
      Value a = eval(*e.args[0], scope);
      return a.truthy() ? a : eval(*e.args[1], scope);
    }
    case Expr::Kind::kCondition: {
      if (eval(*e.args[1], scope).truthy()) return eval(*e.args[0], scope);
      if (e.args[2]) return eval(*e.args[2], scope);
      return Value::undefined("the inline if-expression on line " + std::to_string(e.line) +
                              " evaluated to false and no else section was defined.");
    }
  }
  return Value::undefined();
}

Template::Template(std::string_view source, std::string origin) : origin_(std::move(origin)) {
  if (const size_t bad = find_invalid_utf8(source); bad != std::string_view::npos) {
    fail(origin_, "invalid UTF-8 at byte " + std::to_string(bad));
  }
  int line = 1;
  try {
    body_ = std::make_unique<Body>(parse_template(source, line));
  } catch (const TemplateError& e) {
    fail(origin_ + ":" + std::to_string(line), e.message);
  }
}

Template::~Template() = default;
Template::Template(Template&&) noexcept = default;
Template& Template::operator=(Template&&) noexcept = default;

std::string Template::render(const std::vector<std::pair<std::string, Value>>& vars,
                             const Limits& limits) const {
  Interpreter in(limits);
  try {
    return in.run(*body_, vars);
  } catch (const TemplateError& e) {
    fail(origin_ + ":" + std::to_string(in.line()), e.message);
  } catch (const std::bad_alloc&) {
    fail(origin_ + ":" + std::to_string(in.line()), "out of memory");
  }
}

}  // namespace qhx::jinja
