// Filters, tests, methods of str and dict, and the global functions, as jinja2 and transformers
// define them.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <map>

#include "chat/jinja_interp.h"
#include "chat/jinja_text.h"

namespace qhx::jinja {
namespace {

using Kind = Value::Kind;

// Argument `index` (positional) or `name` (keyword) of a call, or nullptr.
const Value* arg(const CallArgs& a, size_t index, std::string_view name) {
  if (index < a.positional.size()) return &a.positional[index];
  for (const auto& [k, v] : a.keyword) {
    if (k == name) return &v;
  }
  return nullptr;
}

Value arg_or(const CallArgs& a, size_t index, std::string_view name, Value fallback) {
  const Value* v = arg(a, index, name);
  return v ? *v : fallback;
}

const std::string& string_arg(const CallArgs& a, size_t index, std::string_view name) {
  const Value* v = arg(a, index, name);
  if (!v) throw_error("TypeError: missing argument '" + std::string(name) + "'");
  if (!v->is_string()) {
    throw_error("TypeError: argument '" + std::string(name) + "' must be str, not " +
                v->type_name());
  }
  return v->s;
}

int64_t int_arg(const CallArgs& a, size_t index, std::string_view name, int64_t fallback) {
  const Value* v = arg(a, index, name);
  if (!v || v->is_none()) return fallback;
  if (v->kind != Kind::kInt && v->kind != Kind::kBool) {
    throw_error("TypeError: argument '" + std::string(name) + "' must be an integer");
  }
  return v->as_int();
}

bool bool_arg(const CallArgs& a, size_t index, std::string_view name, bool fallback) {
  const Value* v = arg(a, index, name);
  return v ? v->truthy() : fallback;
}

void require_string(const Value& v, const char* what) {
  if (v.is_undefined()) throw_error(v.s);
  if (!v.is_string())
    throw_error(std::string("TypeError: ") + what + " expects a string, got " + v.type_name());
}

Value str_value(Interpreter& in, std::string s) {
  in.charge(s.size());
  return Value::string(std::move(s));
}

Value list_value(Interpreter& in, std::vector<Value> items, bool tuple = false) {
  if (items.size() > in.max_items()) throw_error("list too long");
  in.charge(items.size() * sizeof(Value));
  return Value::make_list(std::move(items), tuple);
}

size_t length_of(const Value& v) {
  switch (v.kind) {
    case Kind::kString:
      return text::length(v.s);
    case Kind::kList:
      return v.list->size();
    case Kind::kDict:
      return v.dict->items.size();
    case Kind::kUndefined:
      return 0;
    default:
      throw_error("TypeError: object of type '" + v.type_name() + "' has no len()");
  }
}

// Attribute paths of map/selectattr/sort: "a.b", with integer parts as indexes.
Value lookup_path(Interpreter& in, Value v, const std::string& path) {
  size_t start = 0;
  while (true) {
    const size_t dot = path.find('.', start);
    const std::string part = path.substr(start, dot == std::string::npos ? dot : dot - start);
    int64_t index = 0;
    const auto r = std::from_chars(part.data(), part.data() + part.size(), index);
    if (!part.empty() && r.ec == std::errc() && r.ptr == part.data() + part.size()) {
      v = in.get_item(v, Value::integer(index));
    } else {
      v = in.get_item(v, Value::string(part));
    }
    if (dot == std::string::npos) return v;
    start = dot + 1;
  }
}

// Sort key with jinja2's case folding of strings.
Value sort_key(Interpreter& in, const Value& v, const Value* attribute, bool case_sensitive) {
  Value key = attribute && !attribute->is_none() ? lookup_path(in, v, to_str(*attribute)) : v;
  if (!case_sensitive && key.is_string()) key = Value::string(text::lower(key.s));
  return key;
}

// ---- filters ----

Value f_default(Interpreter&, Value& v, CallArgs& a) {
  const bool boolean = bool_arg(a, 1, "boolean", false);
  if (v.is_undefined() || (boolean && !v.truthy()))
    return arg_or(a, 0, "default_value", Value::string(""));
  return v;
}

Value f_length(Interpreter&, Value& v, CallArgs&) {
  return Value::integer(static_cast<int64_t>(length_of(v)));
}

Value f_first(Interpreter&, Value& v, CallArgs&) {
  const std::vector<Value> items = iterate(v);
  if (items.empty()) return Value::undefined("No first item, sequence was empty.");
  return items.front();
}

Value f_last(Interpreter&, Value& v, CallArgs&) {
  const std::vector<Value> items = iterate(v);
  if (items.empty()) return Value::undefined("No last item, sequence was empty.");
  return items.back();
}

Value f_join(Interpreter& in, Value& v, CallArgs& a) {
  const std::string sep = to_str(arg_or(a, 0, "d", Value::string("")));
  const Value* attribute = arg(a, 1, "attribute");
  std::string out;
  bool first = true;
  for (const Value& item : iterate(v)) {
    if (!first) out += sep;
    first = false;
    out += to_str(attribute && !attribute->is_none() ? lookup_path(in, item, to_str(*attribute))
                                                     : item);
    in.charge(out.size());
  }
  return str_value(in, std::move(out));
}

Value f_list(Interpreter& in, Value& v, CallArgs&) {
  if (!v.is_list() && !v.is_dict() && !v.is_string() && !v.is_undefined()) {
    throw_error("TypeError: '" + v.type_name() + "' object is not iterable");
  }
  return list_value(in, iterate(v));
}

Value dict_items(Interpreter& in, const Value& v) {
  std::vector<Value> pairs;
  for (const auto& [k, item] : v.dict->items) pairs.push_back(Value::make_list({k, item}, true));
  return list_value(in, std::move(pairs));
}

Value f_items(Interpreter& in, Value& v, CallArgs&) {
  if (v.is_undefined()) return Value::make_list({});
  if (!v.is_dict()) throw_error("TypeError: Can only get item pairs from a mapping.");
  return dict_items(in, v);
}

Value f_replace(Interpreter& in, Value& v, CallArgs& a) {
  const std::string s = to_str(v);
  const std::string from = to_str(arg_or(a, 0, "old", Value::string("")));
  const std::string to = to_str(arg_or(a, 1, "new", Value::string("")));
  const int64_t count = int_arg(a, 2, "count", -1);
  if (!from.empty() && !to.empty() && to.size() > from.size()) {
    in.charge((to.size() - from.size()) * static_cast<size_t>(text::count(s, from)));
  }
  return str_value(in, text::replace(s, from, to, count));
}

Value f_string(Interpreter& in, Value& v, CallArgs&) {
  return str_value(in, to_str(v));
}

std::optional<double> parse_float(std::string s) {
  s = text::strip(s, nullptr, true, true);
  std::string clean;
  for (char c : s) {
    if (c != '_') clean += c;
  }
  const std::string l = text::lower(clean);
  if (l == "inf" || l == "+inf" || l == "infinity" || l == "+infinity") return INFINITY;
  if (l == "-inf" || l == "-infinity") return -INFINITY;
  if (l == "nan" || l == "+nan" || l == "-nan") return NAN;
  if (clean.empty() || clean.find_first_not_of("0123456789+-.eE") != std::string::npos)
    return std::nullopt;
  char* end = nullptr;
  const double d = std::strtod(clean.c_str(), &end);
  if (end != clean.c_str() + clean.size()) return std::nullopt;
  return d;
}

Value f_int(Interpreter&, Value& v, CallArgs& a) {
  const Value fallback = arg_or(a, 0, "default", Value::integer(0));
  const int64_t base = int_arg(a, 1, "base", 10);
  if (v.kind == Kind::kInt || v.kind == Kind::kBool) return Value::integer(v.as_int());
  if (v.kind == Kind::kFloat) {
    if (!std::isfinite(v.f) || std::fabs(v.f) >= 9.2e18) return fallback;
    return Value::integer(static_cast<int64_t>(v.f));
  }
  if (v.is_string()) {
    std::string s = text::strip(v.s, nullptr, true, true);
    std::string clean;
    for (char c : s) {
      if (c != '_') clean += c;
    }
    if (base >= 2 && base <= 36 && !clean.empty()) {
      size_t used = 0;
      try {
        const long long n = std::stoll(clean, &used, static_cast<int>(base));
        if (used == clean.size()) return Value::integer(n);
      } catch (const std::exception&) {
      }
    }
    if (const auto d = parse_float(v.s); d && std::isfinite(*d) && std::fabs(*d) < 9.2e18) {
      return Value::integer(static_cast<int64_t>(*d));
    }
  }
  return fallback;
}

Value f_float(Interpreter&, Value& v, CallArgs& a) {
  const Value fallback = arg_or(a, 0, "default", Value::number(0.0));
  if (v.is_number()) return Value::number(v.as_double());
  if (v.is_string()) {
    if (const auto d = parse_float(v.s)) return Value::number(*d);
  }
  return fallback;
}

Value f_abs(Interpreter&, Value& v, CallArgs&) {
  if (v.kind == Kind::kFloat) return Value::number(std::fabs(v.f));
  if (v.kind == Kind::kInt || v.kind == Kind::kBool) {
    if (v.as_int() == INT64_MIN) throw_error("OverflowError: integer result out of range");
    return Value::integer(std::llabs(v.as_int()));
  }
  if (v.is_undefined()) throw_error(v.s);
  throw_error("TypeError: bad operand type for abs(): '" + v.type_name() + "'");
}

Value f_round(Interpreter&, Value& v, CallArgs& a) {
  const int64_t precision = int_arg(a, 0, "precision", 0);
  const std::string method = to_str(arg_or(a, 1, "method", Value::string("common")));
  if (!v.is_number()) {
    if (v.is_undefined()) throw_error(v.s);
    throw_error("TypeError: round expects a number, got " + v.type_name());
  }
  if (method != "common" && method != "ceil" && method != "floor") {
    throw_error("TypeError: method must be common, ceil or floor");
  }
  if (v.kind != Kind::kFloat && method == "common" && precision >= 0)
    return Value::integer(v.as_int());
  const double x = v.as_double();
  if (!std::isfinite(x)) return Value::number(x);
  if (method == "common") {
    // printf rounds the exact binary value half to even, as Python's round does.
    char buf[400];
    std::snprintf(buf, sizeof buf, "%.*f", static_cast<int>(std::clamp<int64_t>(precision, 0, 300)),
                  x);
    double r = std::strtod(buf, nullptr);
    if (precision < 0) {
      const double p = std::pow(10.0, static_cast<double>(-precision));
      r = std::nearbyint(x / p) * p;
    }
    return Value::number(r);
  }
  const double p = std::pow(10.0, static_cast<double>(precision));
  return Value::number((method == "ceil" ? std::ceil(x * p) : std::floor(x * p)) / p);
}

Value f_safe(Interpreter&, Value& v, CallArgs&) {
  return v;
}

Value f_escape(Interpreter& in, Value& v, CallArgs&) {
  std::string out;
  for (char c : to_str(v)) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return str_value(in, std::move(out));
}

Value f_unique(Interpreter& in, Value& v, CallArgs& a) {
  const bool case_sensitive = bool_arg(a, 0, "case_sensitive", false);
  const Value* attribute = arg(a, 1, "attribute");
  std::vector<Value> out, seen;
  for (const Value& item : iterate(v)) {
    const Value key = sort_key(in, item, attribute, case_sensitive);
    if (std::none_of(seen.begin(), seen.end(), [&](const Value& s) { return equal(s, key); })) {
      seen.push_back(key);
      out.push_back(item);
    }
  }
  return list_value(in, std::move(out));
}

CallArgs rest_args(const CallArgs& a, size_t from) {
  CallArgs rest;
  for (size_t k = from; k < a.positional.size(); ++k) rest.positional.push_back(a.positional[k]);
  rest.keyword = a.keyword;
  return rest;
}

Value f_map(Interpreter& in, Value& v, CallArgs& a) {
  std::vector<Value> out;
  const Value* attribute = nullptr;
  for (const auto& [k, x] : a.keyword) {
    if (k == "attribute") attribute = &x;
  }
  if (attribute) {
    const Value* fallback = nullptr;
    for (const auto& [k, x] : a.keyword) {
      if (k == "default") fallback = &x;
    }
    for (const Value& item : iterate(v)) {
      Value got = lookup_path(in, item, to_str(*attribute));
      out.push_back(got.is_undefined() && fallback ? *fallback : got);
    }
    return list_value(in, std::move(out));
  }
  if (a.positional.empty()) throw_error("TypeError: map requires a filter argument");
  const std::string name = to_str(a.positional[0]);
  CallArgs rest = rest_args(a, 1);
  for (const Value& item : iterate(v)) out.push_back(in.apply_filter(name, item, rest));
  return list_value(in, std::move(out));
}

// select/reject/selectattr/rejectattr.
Value select_items(Interpreter& in, Value& v, CallArgs& a, bool by_attr, bool keep) {
  size_t next = 0;
  std::string attribute;
  if (by_attr) {
    if (a.positional.empty()) throw_error("TypeError: missing attribute argument");
    attribute = to_str(a.positional[next++]);
  }
  std::string test;
  if (next < a.positional.size()) test = to_str(a.positional[next++]);
  CallArgs rest = rest_args(a, next);
  std::vector<Value> out;
  for (const Value& item : iterate(v)) {
    const Value subject = by_attr ? lookup_path(in, item, attribute) : item;
    const bool pass = test.empty() ? subject.truthy() : in.apply_test(test, subject, rest);
    if (pass == keep) out.push_back(item);
  }
  return list_value(in, std::move(out));
}

Value f_select(Interpreter& in, Value& v, CallArgs& a) {
  return select_items(in, v, a, false, true);
}
Value f_reject(Interpreter& in, Value& v, CallArgs& a) {
  return select_items(in, v, a, false, false);
}
Value f_selectattr(Interpreter& in, Value& v, CallArgs& a) {
  return select_items(in, v, a, true, true);
}
Value f_rejectattr(Interpreter& in, Value& v, CallArgs& a) {
  return select_items(in, v, a, true, false);
}

Value f_sort(Interpreter& in, Value& v, CallArgs& a) {
  const bool reverse = bool_arg(a, 0, "reverse", false);
  const bool case_sensitive = bool_arg(a, 1, "case_sensitive", false);
  const Value* attribute = arg(a, 2, "attribute");
  std::vector<std::pair<Value, Value>> keyed;
  for (const Value& item : iterate(v))
    keyed.emplace_back(sort_key(in, item, attribute, case_sensitive), item);
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& x, const auto& y) {
    return reverse ? less(y.first, x.first) : less(x.first, y.first);
  });
  std::vector<Value> out;
  for (auto& [k, item] : keyed) out.push_back(std::move(item));
  return list_value(in, std::move(out));
}

Value f_dictsort(Interpreter& in, Value& v, CallArgs& a) {
  if (!v.is_dict()) throw_error("TypeError: dictsort expects a mapping");
  const bool case_sensitive = bool_arg(a, 0, "case_sensitive", false);
  const std::string by = to_str(arg_or(a, 1, "by", Value::string("key")));
  const bool reverse = bool_arg(a, 2, "reverse", false);
  std::vector<Value> pairs;
  for (const auto& [k, item] : v.dict->items) pairs.push_back(Value::make_list({k, item}, true));
  const size_t pos = by == "value" ? 1 : 0;
  std::stable_sort(pairs.begin(), pairs.end(), [&](const Value& x, const Value& y) {
    const Value kx = sort_key(in, (*x.list)[pos], nullptr, case_sensitive);
    const Value ky = sort_key(in, (*y.list)[pos], nullptr, case_sensitive);
    return reverse ? less(ky, kx) : less(kx, ky);
  });
  return list_value(in, std::move(pairs));
}

Value f_reverse(Interpreter& in, Value& v, CallArgs&) {
  if (v.is_string()) {
    std::vector<char32_t> cps = text::decode(v.s);
    std::reverse(cps.begin(), cps.end());
    return str_value(in, text::encode(cps));
  }
  std::vector<Value> items = iterate(v);
  std::reverse(items.begin(), items.end());
  return list_value(in, std::move(items));
}

Value f_upper(Interpreter& in, Value& v, CallArgs&) {
  return str_value(in, text::upper(to_str(v)));
}
Value f_lower(Interpreter& in, Value& v, CallArgs&) {
  return str_value(in, text::lower(to_str(v)));
}
Value f_capitalize(Interpreter& in, Value& v, CallArgs&) {
  return str_value(in, text::capitalize(to_str(v)));
}
Value f_title(Interpreter& in, Value& v, CallArgs&) {
  return str_value(in, text::title(to_str(v)));
}

Value f_trim(Interpreter& in, Value& v, CallArgs& a) {
  const Value* chars = arg(a, 0, "chars");
  const std::string set = chars && !chars->is_none() ? to_str(*chars) : std::string();
  return str_value(in,
                   text::strip(to_str(v), chars && !chars->is_none() ? &set : nullptr, true, true));
}

Value f_indent(Interpreter& in, Value& v, CallArgs& a) {
  const Value width = arg_or(a, 0, "width", Value::integer(4));
  const bool first = bool_arg(a, 1, "first", false);
  const bool blank = bool_arg(a, 2, "blank", false);
  const std::string pad =
      width.is_string()
          ? width.s
          : std::string(static_cast<size_t>(std::clamp<int64_t>(width.as_int(), 0, 1 << 16)), ' ');
  std::string s = to_str(v);
  std::string out;
  // jinja2 splits with str.splitlines semantics on "\n"; a trailing newline ends with it.
  std::vector<std::string> lines;
  size_t start = 0;
  for (size_t p = s.find('\n'); p != std::string::npos; p = s.find('\n', start)) {
    lines.push_back(s.substr(start, p - start));
    start = p + 1;
  }
  const bool trailing = start == s.size() && !s.empty();
  if (!trailing) lines.push_back(s.substr(start));
  for (size_t k = 0; k < lines.size(); ++k) {
    if (k > 0) out += '\n';
    const bool indent_it =
        k == 0 ? first : (blank || !text::strip(lines[k], nullptr, true, true).empty());
    if (indent_it && (k > 0 || !lines[k].empty() || blank)) out += pad;
    out += lines[k];
  }
  if (trailing) out += '\n';
  return str_value(in, std::move(out));
}

Value f_wordcount(Interpreter&, Value& v, CallArgs&) {
  // jinja2 counts \w+ runs.
  int64_t n = 0;
  bool in_word = false;
  for (char32_t cp : text::decode(to_str(v))) {
    const bool w = cp == '_' || (cp < 0x80 ? std::isalnum(static_cast<int>(cp)) != 0
                                           : !text::is_space(cp) && text::is_printable(cp));
    if (w && !in_word) ++n;
    in_word = w;
  }
  return Value::integer(n);
}

Value f_batch(Interpreter& in, Value& v, CallArgs& a) {
  const int64_t size = int_arg(a, 0, "linecount", 1);
  if (size <= 0) throw_error("ValueError: batch size must be positive");
  const Value* fill = arg(a, 1, "fill_with");
  std::vector<Value> out, row;
  for (const Value& item : iterate(v)) {
    row.push_back(item);
    if (static_cast<int64_t>(row.size()) == size) {
      out.push_back(list_value(in, std::move(row)));
      row.clear();
    }
  }
  if (!row.empty()) {
    while (fill && !fill->is_none() && static_cast<int64_t>(row.size()) < size)
      row.push_back(*fill);
    out.push_back(list_value(in, std::move(row)));
  }
  return list_value(in, std::move(out));
}

// transformers' override: json.dumps(x, ensure_ascii=False, indent=None, separators=None,
// sort_keys=False).
Value f_tojson(Interpreter& in, Value& v, CallArgs& a) {
  JsonOptions o;
  o.ensure_ascii = bool_arg(a, 0, "ensure_ascii", false);
  if (const Value* indent = arg(a, 1, "indent"); indent && !indent->is_none()) {
    o.has_indent = true;
    o.indent =
        indent->is_string()
            ? indent->s
            : std::string(static_cast<size_t>(std::clamp<int64_t>(indent->as_int(), 0, 1 << 10)),
                          ' ');
    o.item_separator = ",";
  }
  if (const Value* sep = arg(a, 2, "separators"); sep && !sep->is_none()) {
    if (!sep->is_list() || sep->list->size() != 2 || !(*sep->list)[0].is_string() ||
        !(*sep->list)[1].is_string()) {
      throw_error("TypeError: separators must be a pair of strings");
    }
    o.item_separator = (*sep->list)[0].s;
    o.key_separator = (*sep->list)[1].s;
  }
  o.sort_keys = bool_arg(a, 3, "sort_keys", false);
  return str_value(in, to_json(v, o));
}

Value f_sum(Interpreter& in, Value& v, CallArgs& a) {
  const Value* attribute = arg(a, 0, "attribute");
  Value total = arg_or(a, 1, "start", Value::integer(0));
  for (const Value& item : iterate(v)) {
    const Value x =
        attribute && !attribute->is_none() ? lookup_path(in, item, to_str(*attribute)) : item;
    if (!x.is_number() || !total.is_number()) throw_error("TypeError: sum of non-numbers");
    if (x.kind == Kind::kFloat || total.kind == Kind::kFloat) {
      total = Value::number(total.as_double() + x.as_double());
    } else {
      int64_t r = 0;
      if (__builtin_add_overflow(total.as_int(), x.as_int(), &r))
        throw_error("OverflowError: integer result out of range");
      total = Value::integer(r);
    }
  }
  return total;
}

Value min_max(Interpreter& in, Value& v, CallArgs& a, bool want_max) {
  const bool case_sensitive = bool_arg(a, 0, "case_sensitive", false);
  const Value* attribute = arg(a, 1, "attribute");
  const std::vector<Value> items = iterate(v);
  if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
  size_t best = 0;
  for (size_t k = 1; k < items.size(); ++k) {
    const Value kb = sort_key(in, items[best], attribute, case_sensitive);
    const Value kk = sort_key(in, items[k], attribute, case_sensitive);
    if (want_max ? less(kb, kk) : less(kk, kb)) best = k;
  }
  return items[best];
}
Value f_min(Interpreter& in, Value& v, CallArgs& a) {
  return min_max(in, v, a, false);
}
Value f_max(Interpreter& in, Value& v, CallArgs& a) {
  return min_max(in, v, a, true);
}

Value f_attr(Interpreter& in, Value& v, CallArgs& a) {
  return in.get_attr(v, string_arg(a, 0, "name"));
}

const std::map<std::string, FilterFn, std::less<>>& filters() {
  static const std::map<std::string, FilterFn, std::less<>> table = {
      {"abs", f_abs},
      {"attr", f_attr},
      {"batch", f_batch},
      {"capitalize", f_capitalize},
      {"count", f_length},
      {"d", f_default},
      {"default", f_default},
      {"dictsort", f_dictsort},
      {"e", f_escape},
      {"escape", f_escape},
      {"first", f_first},
      {"float", f_float},
      {"indent", f_indent},
      {"int", f_int},
      {"items", f_items},
      {"join", f_join},
      {"last", f_last},
      {"length", f_length},
      {"list", f_list},
      {"lower", f_lower},
      {"map", f_map},
      {"max", f_max},
      {"min", f_min},
      {"reject", f_reject},
      {"rejectattr", f_rejectattr},
      {"replace", f_replace},
      {"reverse", f_reverse},
      {"round", f_round},
      {"safe", f_safe},
      {"select", f_select},
      {"selectattr", f_selectattr},
      {"sort", f_sort},
      {"string", f_string},
      {"sum", f_sum},
      {"title", f_title},
      {"tojson", f_tojson},
      {"trim", f_trim},
      {"unique", f_unique},
      {"upper", f_upper},
      {"wordcount", f_wordcount},
  };
  return table;
}

// ---- tests ----

const Value& test_arg(const CallArgs& a) {
  const Value* v = arg(a, 0, "other");
  if (!v) throw_error("TypeError: test expects an argument");
  return *v;
}

bool t_defined(Interpreter&, const Value& v, CallArgs&) {
  return !v.is_undefined();
}
bool t_undefined(Interpreter&, const Value& v, CallArgs&) {
  return v.is_undefined();
}
bool t_none(Interpreter&, const Value& v, CallArgs&) {
  return v.is_none();
}
bool t_boolean(Interpreter&, const Value& v, CallArgs&) {
  return v.kind == Kind::kBool;
}
bool t_true(Interpreter&, const Value& v, CallArgs&) {
  return v.kind == Kind::kBool && v.b;
}
bool t_false(Interpreter&, const Value& v, CallArgs&) {
  return v.kind == Kind::kBool && !v.b;
}
bool t_integer(Interpreter&, const Value& v, CallArgs&) {
  return v.kind == Kind::kInt;
}
bool t_float(Interpreter&, const Value& v, CallArgs&) {
  return v.kind == Kind::kFloat;
}
bool t_number(Interpreter&, const Value& v, CallArgs&) {
  return v.is_number();
}
bool t_string(Interpreter&, const Value& v, CallArgs&) {
  return v.is_string();
}
bool t_mapping(Interpreter&, const Value& v, CallArgs&) {
  return v.is_dict();
}
bool t_iterable(Interpreter&, const Value& v, CallArgs&) {
  return v.is_list() || v.is_dict() || v.is_string() || v.is_undefined();
}
bool t_sequence(Interpreter&, const Value& v, CallArgs&) {
  return v.is_list() || v.is_dict() || v.is_string() || v.is_undefined();
}
bool t_callable(Interpreter&, const Value& v, CallArgs&) {
  return v.is_callable();
}
int64_t int_subject(const Value& v) {
  if (v.is_undefined()) throw_error(v.s);
  if (v.kind != Kind::kInt && v.kind != Kind::kBool)
    throw_error("TypeError: expected an integer, got " + v.type_name());
  return v.as_int();
}
bool t_even(Interpreter&, const Value& v, CallArgs&) {
  return int_subject(v) % 2 == 0;
}
bool t_odd(Interpreter&, const Value& v, CallArgs&) {
  return int_subject(v) % 2 != 0;
}
bool t_divisibleby(Interpreter&, const Value& v, CallArgs& a) {
  const int64_t d = int_arg(a, 0, "num", 0);
  if (d == 0) throw_error("ZeroDivisionError: integer division or modulo by zero");
  return int_subject(v) % d == 0;
}
bool t_eq(Interpreter&, const Value& v, CallArgs& a) {
  return equal(v, test_arg(a));
}
bool t_ne(Interpreter&, const Value& v, CallArgs& a) {
  return !equal(v, test_arg(a));
}
bool t_lt(Interpreter&, const Value& v, CallArgs& a) {
  return less(v, test_arg(a));
}
bool t_gt(Interpreter&, const Value& v, CallArgs& a) {
  return less(test_arg(a), v);
}
bool t_le(Interpreter&, const Value& v, CallArgs& a) {
  return !less(test_arg(a), v);
}
bool t_ge(Interpreter&, const Value& v, CallArgs& a) {
  return !less(v, test_arg(a));
}
bool t_in(Interpreter&, const Value& v, CallArgs& a) {
  const Value& seq = test_arg(a);
  if (seq.is_string()) {
    if (!v.is_string())
      throw_error("TypeError: 'in <string>' requires string as left operand, not " + v.type_name());
    return seq.s.find(v.s) != std::string::npos;
  }
  if (seq.is_dict()) return seq.dict->find(v) != nullptr;
  const std::vector<Value> items = iterate(seq);
  return std::any_of(items.begin(), items.end(), [&](const Value& x) { return equal(x, v); });
}
bool t_sameas(Interpreter&, const Value& v, CallArgs& a) {
  const Value& o = test_arg(a);
  if (v.kind != o.kind) return false;
  if (v.is_list()) return v.list == o.list;
  if (v.is_dict()) return v.dict == o.dict;
  return equal(v, o);
}
bool t_lower(Interpreter&, const Value& v, CallArgs&) {
  return v.is_string() && text::lower(v.s) == v.s && text::upper(v.s) != v.s;
}
bool t_upper(Interpreter&, const Value& v, CallArgs&) {
  return v.is_string() && text::upper(v.s) == v.s && text::lower(v.s) != v.s;
}
bool t_escaped(Interpreter&, const Value&, CallArgs&) {
  return false;
}

const std::map<std::string, TestFn, std::less<>>& tests() {
  static const std::map<std::string, TestFn, std::less<>> table = {
      {"!=", t_ne},
      {"<", t_lt},
      {"<=", t_le},
      {"==", t_eq},
      {">", t_gt},
      {">=", t_ge},
      {"boolean", t_boolean},
      {"callable", t_callable},
      {"defined", t_defined},
      {"divisibleby", t_divisibleby},
      {"eq", t_eq},
      {"equalto", t_eq},
      {"escaped", t_escaped},
      {"even", t_even},
      {"false", t_false},
      {"float", t_float},
      {"ge", t_ge},
      {"greaterthan", t_gt},
      {"gt", t_gt},
      {"in", t_in},
      {"integer", t_integer},
      {"iterable", t_iterable},
      {"le", t_le},
      {"lessthan", t_lt},
      {"lower", t_lower},
      {"lt", t_lt},
      {"mapping", t_mapping},
      {"ne", t_ne},
      {"none", t_none},
      {"number", t_number},
      {"odd", t_odd},
      {"sameas", t_sameas},
      {"sequence", t_sequence},
      {"string", t_string},
      {"true", t_true},
      {"undefined", t_undefined},
      {"upper", t_upper},
  };
  return table;
}

// ---- methods ----

// str.startswith/endswith with a string or a tuple of strings.
bool affix_match(const std::string& s, const Value& affix, bool start) {
  const auto one = [&](const Value& x) {
    if (!x.is_string())
      throw_error("TypeError: startswith/endswith first arg must be str or a tuple of str");
    if (x.s.size() > s.size()) return false;
    return start ? s.compare(0, x.s.size(), x.s) == 0
                 : s.compare(s.size() - x.s.size(), x.s.size(), x.s) == 0;
  };
  if (affix.is_list() && affix.tuple) {
    return std::any_of(affix.list->begin(), affix.list->end(), one);
  }
  return one(affix);
}

// str.format with {} / {0} / {name} fields and no format specs.
std::string format_string(const std::string& fmt, const CallArgs& a) {
  std::string out;
  size_t auto_index = 0;
  for (size_t k = 0; k < fmt.size(); ++k) {
    const char c = fmt[k];
    if (c == '}') {
      if (k + 1 < fmt.size() && fmt[k + 1] == '}')
        ++k;
      else
        throw_error("ValueError: Single '}' encountered in format string");
      out += '}';
      continue;
    }
    if (c != '{') {
      out += c;
      continue;
    }
    if (k + 1 < fmt.size() && fmt[k + 1] == '{') {
      out += '{';
      ++k;
      continue;
    }
    const size_t close = fmt.find('}', k);
    if (close == std::string::npos)
      throw_error("ValueError: Single '{' encountered in format string");
    const std::string field = fmt.substr(k + 1, close - k - 1);
    if (field.find_first_of(":!.[") != std::string::npos)
      throw_error("str.format specs are not supported");
    const Value* v = nullptr;
    if (field.empty()) {
      v = arg(a, auto_index++, "\x01");
    } else if (field.find_first_not_of("0123456789") == std::string::npos) {
      v = arg(a, static_cast<size_t>(std::stoul(field)), "\x01");
    } else {
      v = arg(a, SIZE_MAX, field);
    }
    if (!v) throw_error("IndexError: Replacement index out of range for str.format");
    out += to_str(*v);
    k = close;
  }
  return out;
}

std::string py_title(const std::string& s) {
  std::string out;
  bool prev_cased = false;
  for (char32_t cp : text::decode(s)) {
    std::string one;
    text::append_utf8(one, cp);
    const bool cased = text::upper(one) != text::lower(one);
    out += cased ? (prev_cased ? text::lower(one) : text::upper(one)) : one;
    prev_cased = cased;
  }
  return out;
}

Value string_method(Interpreter& in, const std::string& self, const std::string& name,
                    CallArgs& a) {
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    const Value* chars = arg(a, 0, "chars");
    const bool given = chars && !chars->is_none();
    if (given) require_string(*chars, name.c_str());
    return str_value(
        in, text::strip(self, given ? &chars->s : nullptr, name != "rstrip", name != "lstrip"));
  }
  if (name == "split" || name == "rsplit") {
    const Value* sep = arg(a, 0, "sep");
    const bool given = sep && !sep->is_none();
    if (given) require_string(*sep, "split");
    const int64_t maxsplit = int_arg(a, 1, "maxsplit", -1);
    if (name == "rsplit" && maxsplit >= 0) throw_error("rsplit with maxsplit is not supported");
    std::vector<Value> parts;
    for (auto& p : text::split(self, given ? &sep->s : nullptr, maxsplit))
      parts.push_back(Value::string(std::move(p)));
    return list_value(in, std::move(parts));
  }
  if (name == "startswith" || name == "endswith") {
    const Value* affix = arg(a, 0, "prefix");
    if (!affix) throw_error("TypeError: " + name + " takes at least 1 argument");
    return Value::boolean(affix_match(self, *affix, name == "startswith"));
  }
  if (name == "replace") {
    Value target = Value::string(self);
    return f_replace(in, target, a);
  }
  if (name == "upper") return str_value(in, text::upper(self));
  if (name == "lower") return str_value(in, text::lower(self));
  if (name == "title") return str_value(in, py_title(self));
  if (name == "capitalize") return str_value(in, text::capitalize(self));
  if (name == "find") return Value::integer(text::find(self, string_arg(a, 0, "sub")));
  if (name == "count") return Value::integer(text::count(self, string_arg(a, 0, "sub")));
  if (name == "format") return str_value(in, format_string(self, a));
  if (name == "join") {
    const Value* items = arg(a, 0, "iterable");
    if (!items) throw_error("TypeError: join takes exactly one argument");
    std::string out;
    bool first = true;
    for (const Value& item : iterate(*items)) {
      if (!item.is_string())
        throw_error("TypeError: sequence item: expected str instance, " + item.type_name() +
                    " found");
      if (!first) out += self;
      first = false;
      out += item.s;
      in.charge(out.size());
    }
    return str_value(in, std::move(out));
  }
  if (name == "splitlines") {
    std::vector<Value> lines;
    size_t start = 0;
    for (size_t k = 0; k < self.size(); ++k) {
      if (self[k] == '\n' || self[k] == '\r') {
        lines.push_back(Value::string(self.substr(start, k - start)));
        if (self[k] == '\r' && k + 1 < self.size() && self[k + 1] == '\n') ++k;
        start = k + 1;
      }
    }
    if (start < self.size()) lines.push_back(Value::string(self.substr(start)));
    return list_value(in, std::move(lines));
  }
  // is* predicates: non-empty and every code point of the class.
  const std::vector<char32_t> cps = text::decode(self);
  const auto all = [&](auto pred) {
    return Value::boolean(!cps.empty() && std::all_of(cps.begin(), cps.end(), pred));
  };
  if (name == "isspace") return all(text::is_space);
  if (name == "isdigit") return all([](char32_t c) { return c >= '0' && c <= '9'; });
  if (name == "isalpha")
    return all([](char32_t c) {
      std::string o;
      text::append_utf8(o, c);
      return text::upper(o) != text::lower(o);
    });
  if (name == "isalnum")
    return all([](char32_t c) {
      std::string o;
      text::append_utf8(o, c);
      return (c >= '0' && c <= '9') || text::upper(o) != text::lower(o);
    });
  if (name == "islower")
    return Value::boolean(text::lower(self) == self && text::upper(self) != self);
  if (name == "isupper")
    return Value::boolean(text::upper(self) == self && text::lower(self) != self);
  throw_error("unknown method");
}

bool is_string_method(const std::string& name) {
  static const char* const kNames[] = {"strip",      "lstrip",     "rstrip",  "split",   "rsplit",
                                       "startswith", "endswith",   "replace", "upper",   "lower",
                                       "title",      "capitalize", "find",    "count",   "format",
                                       "join",       "splitlines", "isspace", "isdigit", "isalpha",
                                       "isalnum",    "islower",    "isupper"};
  return std::find(std::begin(kNames), std::end(kNames), name) != std::end(kNames);
}

// d.update(from): a copy when d is empty (Dict::set looks each key up from the start, and a
// template may copy a message of 100,000s of keys).
void update(Dict& d, const Dict& from) {
  if (d.items.empty()) {
    d.items = from.items;
    return;
  }
  for (const auto& [k, v] : from.items) d.set(k, v);
}

}  // namespace

std::vector<Value> iterate(const Value& v) {
  switch (v.kind) {
    case Kind::kList:
      return *v.list;
    case Kind::kDict: {
      std::vector<Value> keys;
      for (const auto& [k, item] : v.dict->items) keys.push_back(k);
      return keys;
    }
    case Kind::kString: {
      std::vector<Value> chars;
      for (char32_t cp : text::decode(v.s)) {
        std::string one;
        text::append_utf8(one, cp);
        chars.push_back(Value::string(std::move(one)));
      }
      return chars;
    }
    case Kind::kUndefined:
      return {};
    default:
      throw_error("TypeError: '" + v.type_name() + "' object is not iterable");
  }
}

FilterFn find_filter(std::string_view name) {
  const auto it = filters().find(name);
  return it == filters().end() ? nullptr : it->second;
}

TestFn find_test(std::string_view name) {
  const auto it = tests().find(name);
  return it == tests().end() ? nullptr : it->second;
}

bool is_known_filter(std::string_view name) {
  return find_filter(name) != nullptr;
}
bool is_known_test(std::string_view name) {
  return find_test(name) != nullptr;
}

Value find_method(Interpreter&, const Value& self, const std::string& name) {
  if (self.is_string() && is_string_method(name)) {
    const std::string s = self.s;
    return Value::function(
        [s, name](Interpreter& in, CallArgs& a) { return string_method(in, s, name, a); });
  }
  if (self.is_dict() && (name == "items" || name == "keys" || name == "values" || name == "get")) {
    const Value d = self;
    return Value::function([d, name](Interpreter& in, CallArgs& a) -> Value {
      if (name == "items") return dict_items(in, d);
      if (name == "get") {
        const Value* key = arg(a, 0, "key");
        if (!key) throw_error("TypeError: get expected at least 1 argument");
        const Value* found = d.dict->find(*key);
        return found ? *found : arg_or(a, 1, "default", Value::none());
      }
      std::vector<Value> out;
      for (const auto& [k, v] : d.dict->items) out.push_back(name == "keys" ? k : v);
      return list_value(in, std::move(out));
    });
  }
  // The sandbox refuses the methods that would change a list or dict.
  static const char* const kMutators[] = {"append", "extend",     "insert", "pop",
                                          "remove", "clear",      "sort",   "reverse",
                                          "update", "setdefault", "popitem"};
  if ((self.is_list() || self.is_dict()) &&
      std::find(std::begin(kMutators), std::end(kMutators), name) != std::end(kMutators)) {
    const std::string type = self.type_name();
    return Value::function([name, type](Interpreter&, CallArgs&) -> Value {
      throw_error("SecurityError: access to attribute '" + name + "' of '" + type +
                  "' object is unsafe.");
    });
  }
  return Value::undefined();
}

std::vector<std::pair<std::string, Value>> builtin_globals() {
  std::vector<std::pair<std::string, Value>> g;
  g.emplace_back("range", Value::function([](Interpreter& in, CallArgs& a) {
                   int64_t start = 0, stop = 0, step = 1;
                   const auto n = [&](size_t k) { return int_arg(a, k, "\x01", 0); };
                   if (a.positional.size() == 1) {
                     stop = n(0);
                   } else if (a.positional.size() == 2 || a.positional.size() == 3) {
                     start = n(0);
                     stop = n(1);
                     if (a.positional.size() == 3) step = n(2);
                   } else {
                     throw_error("TypeError: range expected 1 to 3 arguments");
                   }
                   if (step == 0) throw_error("ValueError: range() arg 3 must not be zero");
                   std::vector<Value> items;
                   for (int64_t k = start; step > 0 ? k < stop : k > stop; k += step) {
                     if (items.size() >= in.max_items()) throw_error("range too large");
                     items.push_back(Value::integer(k));
                     if ((step > 0 && k > INT64_MAX - step) || (step < 0 && k < INT64_MIN - step))
                       break;
                   }
                   return list_value(in, std::move(items));
                 }));
  g.emplace_back("namespace", Value::function([](Interpreter& in, CallArgs& a) {
                   Dict d;
                   for (const Value& init : a.positional) {
                     if (!init.is_dict()) throw_error("TypeError: namespace() takes a mapping");
                     update(d, *init.dict);
                   }
                   for (const auto& [k, v] : a.keyword) {
                     if (!k.empty() && k[0] == '_') {
                       throw_error(
                           "SecurityError: Chat templates cannot store underscore-prefixed "
                           "attributes on a namespace, but got '" +
                           k + "'");
                     }
                     d.set(Value::string(k), v);
                   }
                   return in.make_namespace(std::move(d));
                 }));
  g.emplace_back("raise_exception", Value::function([](Interpreter&, CallArgs& a) -> Value {
                   throw_error(a.positional.empty() ? std::string() : to_str(a.positional[0]));
                 }));
  g.emplace_back("strftime_now", Value::function([](Interpreter& in, CallArgs& a) {
                   const std::string& fmt = string_arg(a, 0, "format");
                   const std::time_t now = std::time(nullptr);
                   std::tm local{};
                   localtime_r(&now, &local);
                   char buf[512];
                   const size_t n =
                       fmt.size() < 128 ? std::strftime(buf, sizeof buf, fmt.c_str(), &local) : 0;
                   return str_value(in, std::string(buf, n));
                 }));
  g.emplace_back(
      "dict", Value::function([](Interpreter& in, CallArgs& a) {
        Dict d;
        for (const Value& init : a.positional) {
          if (init.is_dict()) {
            update(d, *init.dict);
          } else {
            for (const Value& pair : iterate(init)) {
              if (!pair.is_list() || pair.list->size() != 2)
                throw_error("ValueError: dictionary update sequence element has wrong length");
              d.set((*pair.list)[0], (*pair.list)[1]);
            }
          }
        }
        for (const auto& [k, v] : a.keyword) d.set(Value::string(k), v);
        in.charge(d.items.size() * 2 * sizeof(Value));
        return Value::make_dict(std::move(d));
      }));
  return g;
}

}  // namespace qhx::jinja
