#include "chat/jinja_value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "chat/jinja_text.h"

namespace qhx::jinja {

void throw_error(std::string message) {
  throw TemplateError{std::move(message)};
}

Value Value::undefined(std::string message) {
  Value v;
  v.s = std::move(message);
  return v;
}
Value Value::none() {
  Value v;
  v.kind = Kind::kNone;
  return v;
}
Value Value::boolean(bool x) {
  Value v;
  v.kind = Kind::kBool;
  v.b = x;
  return v;
}
Value Value::integer(int64_t x) {
  Value v;
  v.kind = Kind::kInt;
  v.i = x;
  return v;
}
Value Value::number(double x) {
  Value v;
  v.kind = Kind::kFloat;
  v.f = x;
  return v;
}
Value Value::string(std::string x) {
  Value v;
  v.kind = Kind::kString;
  v.s = std::move(x);
  return v;
}
Value Value::make_list(std::vector<Value> items, bool tuple) {
  Value v;
  v.kind = Kind::kList;
  v.tuple = tuple;
  v.list = std::make_shared<const std::vector<Value>>(std::move(items));
  return v;
}
Value Value::make_dict(Dict d) {
  Value v;
  v.kind = Kind::kDict;
  v.dict = std::make_shared<const Dict>(std::move(d));
  return v;
}
Value Value::function(NativeFn fn) {
  Value v;
  v.kind = Kind::kNative;
  v.native = std::make_shared<const NativeFn>(std::move(fn));
  return v;
}

bool Value::truthy() const {
  switch (kind) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
      return b;
    case Kind::kInt:
      return i != 0;
    case Kind::kFloat:
      return f != 0;
    case Kind::kString:
      return !s.empty();
    case Kind::kList:
      return !list->empty();
    case Kind::kDict:
      return !dict->items.empty();
    default:
      return true;
  }
}

std::string Value::type_name() const {
  switch (kind) {
    case Kind::kUndefined:
      return "Undefined";
    case Kind::kNone:
      return "NoneType";
    case Kind::kBool:
      return "bool";
    case Kind::kInt:
      return "int";
    case Kind::kFloat:
      return "float";
    case Kind::kString:
      return "str";
    case Kind::kList:
      return tuple ? "tuple" : "list";
    case Kind::kDict:
      return "dict";
    case Kind::kNamespace:
      return "Namespace";
    case Kind::kNative:
      return "builtin_function_or_method";
    case Kind::kMacro:
      return "Macro";
  }
  return "object";
}

const Value* Dict::find(const Value& key) const {
  for (const auto& [k, v] : items) {
    if (equal(k, key)) return &v;
  }
  return nullptr;
}

const Value* Dict::find(std::string_view key) const {
  for (const auto& [k, v] : items) {
    if (k.kind == Value::Kind::kString && k.s == key) return &v;
  }
  return nullptr;
}

void Dict::set(Value key, Value value) {
  for (auto& [k, v] : items) {
    if (equal(k, key)) {
      v = std::move(value);
      return;
    }
  }
  items.emplace_back(std::move(key), std::move(value));
}

bool equal(const Value& a, const Value& b) {
  using K = Value::Kind;
  if (a.is_number() && b.is_number()) {
    if (a.kind == K::kFloat || b.kind == K::kFloat) return a.as_double() == b.as_double();
    return a.as_int() == b.as_int();
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case K::kUndefined:
    case K::kNone:
      return true;
    case K::kString:
      return a.s == b.s;
    case K::kList:
      if (a.tuple != b.tuple || a.list->size() != b.list->size()) return false;
      for (size_t k = 0; k < a.list->size(); ++k) {
        if (!equal((*a.list)[k], (*b.list)[k])) return false;
      }
      return true;
    case K::kDict:
      if (a.dict->items.size() != b.dict->items.size()) return false;
      for (const auto& [k, v] : a.dict->items) {
        const Value* other = b.dict->find(k);
        if (!other || !equal(v, *other)) return false;
      }
      return true;
    case K::kNamespace:
      return a.ns == b.ns;
    case K::kNative:
      return a.native == b.native;
    case K::kMacro:
      return a.macro == b.macro;
    default:
      return false;
  }
}

std::string float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  const std::string sci(buf, res.ptr);  // shortest round trip: "-1.5e+00"
  const size_t e = sci.find('e');
  std::string mantissa = sci.substr(0, e);
  const int exponent = std::stoi(sci.substr(e + 1));
  std::string sign;
  if (mantissa[0] == '-') {
    sign = "-";
    mantissa.erase(0, 1);
  }
  std::string digits;
  for (char c : mantissa) {
    if (c != '.') digits += c;
  }
  // Python's repr: positional for 1e-4 <= |d| < 1e16, otherwise scientific.
  if (exponent >= -4 && exponent < 16) {
    std::string out;
    if (exponent >= 0) {
      const size_t int_len = static_cast<size_t>(exponent) + 1;
      if (digits.size() <= int_len) {
        out = digits + std::string(int_len - digits.size(), '0') + ".0";
      } else {
        out = digits.substr(0, int_len) + "." + digits.substr(int_len);
      }
    } else {
      out = "0." + std::string(static_cast<size_t>(-exponent - 1), '0') + digits;
    }
    return sign + out;
  }
  std::string out = digits.substr(0, 1);
  if (digits.size() > 1) out += "." + digits.substr(1);
  char exp_buf[16];
  std::snprintf(exp_buf, sizeof exp_buf, "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
  return sign + out + exp_buf;
}

namespace {

void append_hex(std::string& out, const char* prefix, unsigned value, int width) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%s%0*x", prefix, width, value);
  out += buf;
}

std::string string_repr(const std::string& s) {
  const bool has_single = s.find('\'') != std::string::npos;
  const char quote = has_single && s.find('"') == std::string::npos ? '"' : '\'';
  std::string out(1, quote);
  for (char32_t cp : text::decode(s)) {
    if (cp == static_cast<char32_t>(quote) || cp == '\\') {
      out += '\\';
      out += static_cast<char>(cp);
    } else if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\r') {
      out += "\\r";
    } else if (cp == '\t') {
      out += "\\t";
    } else if (text::is_printable(cp)) {
      text::append_utf8(out, cp);
    } else if (cp < 0x100) {
      append_hex(out, "\\x", cp, 2);
    } else if (cp < 0x10000) {
      append_hex(out, "\\u", cp, 4);
    } else {
      append_hex(out, "\\U", cp, 8);
    }
  }
  out += quote;
  return out;
}

std::string scalar_str(const Value& v) {
  switch (v.kind) {
    case Value::Kind::kNone:
      return "None";
    case Value::Kind::kBool:
      return v.b ? "True" : "False";
    case Value::Kind::kInt:
      return std::to_string(v.i);
    case Value::Kind::kFloat:
      return float_repr(v.f);
    case Value::Kind::kNamespace:
      return "<Namespace>";
    case Value::Kind::kNative:
      return "<built-in function>";
    case Value::Kind::kMacro:
      return "<Macro>";
    default:
      return {};
  }
}

}  // namespace

std::string to_repr(const Value& v) {
  switch (v.kind) {
    case Value::Kind::kUndefined:
      return "Undefined";
    case Value::Kind::kString:
      return string_repr(v.s);
    case Value::Kind::kList: {
      std::string out = v.tuple ? "(" : "[";
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k) out += ", ";
        out += to_repr((*v.list)[k]);
      }
      if (v.tuple && v.list->size() == 1) out += ",";
      return out + (v.tuple ? ")" : "]");
    }
    case Value::Kind::kDict: {
      std::string out = "{";
      bool first = true;
      for (const auto& [k, item] : v.dict->items) {
        if (!first) out += ", ";
        first = false;
        out += to_repr(k) + ": " + to_repr(item);
      }
      return out + "}";
    }
    default:
      return scalar_str(v);
  }
}

std::string to_str(const Value& v) {
  if (v.kind == Value::Kind::kUndefined) return {};
  if (v.kind == Value::Kind::kString) return v.s;
  if (v.kind == Value::Kind::kList || v.kind == Value::Kind::kDict) return to_repr(v);
  return scalar_str(v);
}

namespace {

void json_string(std::string& out, const std::string& s, bool ensure_ascii) {
  out += '"';
  for (char32_t cp : text::decode(s)) {
    switch (cp) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (cp < 0x20 || (ensure_ascii && cp > 0x7E && cp < 0x10000)) {
          append_hex(out, "\\u", cp, 4);
        } else if (ensure_ascii && cp >= 0x10000) {
          const char32_t c = cp - 0x10000;
          append_hex(out, "\\u", 0xD800 + (c >> 10), 4);
          append_hex(out, "\\u", 0xDC00 + (c & 0x3FF), 4);
        } else {
          text::append_utf8(out, cp);
        }
    }
  }
  out += '"';
}

std::string json_key(const Value& k) {
  switch (k.kind) {
    case Value::Kind::kString:
      return k.s;
    case Value::Kind::kNone:
      return "null";
    case Value::Kind::kBool:
      return k.b ? "true" : "false";
    case Value::Kind::kInt:
      return std::to_string(k.i);
    case Value::Kind::kFloat:
      return float_repr(k.f);
    default:
      throw_error("TypeError: keys must be str, int, float, bool or None, not " + k.type_name());
  }
}

void json_value(std::string& out, const Value& v, const JsonOptions& o, int level) {
  if (level > 512) throw_error("ValueError: nesting too deep for tojson");
  const auto newline = [&](int depth) {
    if (!o.has_indent) return;
    out += '\n';
    for (int k = 0; k < depth; ++k) out += o.indent;
  };
  switch (v.kind) {
    case Value::Kind::kNone:
      out += "null";
      return;
    case Value::Kind::kBool:
      out += v.b ? "true" : "false";
      return;
    case Value::Kind::kInt:
      out += std::to_string(v.i);
      return;
    case Value::Kind::kFloat:
      out += std::isnan(v.f)   ? "NaN"
             : std::isinf(v.f) ? (v.f < 0 ? "-Infinity" : "Infinity")
                               : float_repr(v.f);
      return;
    case Value::Kind::kString:
      json_string(out, v.s, o.ensure_ascii);
      return;
    case Value::Kind::kList: {
      if (v.list->empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k) out += o.item_separator;
        newline(level + 1);
        json_value(out, (*v.list)[k], o, level + 1);
      }
      newline(level);
      out += ']';
      return;
    }
    case Value::Kind::kDict: {
      if (v.dict->items.empty()) {
        out += "{}";
        return;
      }
      std::vector<std::pair<std::string, const Value*>> entries;
      for (const auto& [k, item] : v.dict->items) entries.emplace_back(json_key(k), &item);
      if (o.sort_keys) {
        std::stable_sort(entries.begin(), entries.end(),
                         [](const auto& a, const auto& b) { return a.first < b.first; });
      }
      out += '{';
      for (size_t k = 0; k < entries.size(); ++k) {
        if (k) out += o.item_separator;
        newline(level + 1);
        json_string(out, entries[k].first, o.ensure_ascii);
        out += o.key_separator;
        json_value(out, *entries[k].second, o, level + 1);
      }
      newline(level);
      out += '}';
      return;
    }
    default:
      throw_error("TypeError: Object of type " + v.type_name() + " is not JSON serializable");
  }
}

}  // namespace

std::string to_json(const Value& v, const JsonOptions& options) {
  std::string out;
  json_value(out, v, options, 0);
  return out;
}

Value from_json(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null:
      return Value::none();
    case nlohmann::ordered_json::value_t::boolean:
      return Value::boolean(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
      return Value::integer(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      const auto u = j.get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) return Value::number(static_cast<double>(u));
      return Value::integer(static_cast<int64_t>(u));
    }
    case nlohmann::ordered_json::value_t::number_float:
      return Value::number(j.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return Value::string(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      std::vector<Value> items;
      items.reserve(j.size());
      for (const auto& item : j) items.push_back(from_json(item));
      return Value::make_list(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      Dict d;
      // ordered_json keeps one entry per key already.
      for (const auto& [k, item] : j.items())
        d.items.emplace_back(Value::string(k), from_json(item));
      return Value::make_dict(std::move(d));
    }
    default:
      throw_error("unsupported JSON value");
  }
}

}  // namespace qhx::jinja
