#include "chat/jinja_parse.h"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <initializer_list>

#include "chat/jinja_text.h"

namespace qhx::jinja {
namespace {

struct Token {
  enum class Type {
    kText,
    kVarBegin,
    kVarEnd,
    kBlockBegin,
    kBlockEnd,
    kName,
    kString,
    kInt,
    kFloat,
    kOp,
    kEof
  };
  Type type;
  int line;
  std::string text;  // text, name, string value, operator
  int64_t i = 0;
  double f = 0;
};
using T = Token::Type;

bool is_ws(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}
bool is_name_start(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}
bool is_digit(char c) {
  return c >= '0' && c <= '9';
}

// str.rstrip() of text.
std::string rstrip_space(const std::string& s) {
  return text::strip(s, nullptr, false, true);
}

// Whole text is whitespace (and not empty), as re.fullmatch(r"\s+").
bool all_space(std::string_view s) {
  if (s.empty()) return false;
  const std::vector<char32_t> cps = text::decode(s);
  return std::all_of(cps.begin(), cps.end(), text::is_space);
}

class Lexer {
 public:
  Lexer(std::string source, int& line) : src_(std::move(source)), line_(line) {}

  std::vector<Token> run() {
    bool line_starting = true;
    while (pos_ < src_.size()) {
      const size_t start = next_tag(pos_);
      if (start == std::string::npos) {
        add_text(src_.substr(pos_));
        advance_to(src_.size());
        break;
      }
      std::string text = src_.substr(pos_, start - pos_);
      const char kind = src_[start + 1];
      const char mod = start + 2 < src_.size() ? src_[start + 2] : '\0';
      if (mod == '-') {
        text = rstrip_space(text);
      } else if (mod != '+' && kind != '{') {
        // lstrip_blocks: a block or comment tag alone on its line takes its indent with it.
        const size_t line_pos = text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1;
        if ((line_pos > 0 || line_starting) && all_space(std::string_view(text).substr(line_pos))) {
          text.resize(line_pos);
        }
      }
      add_text(std::move(text));
      advance_to(start + 2 + ((mod == '-' || mod == '+') ? 1 : 0));
      if (kind == '#') {
        comment();
      } else if (kind == '%' && raw_block()) {
        // handled
      } else {
        tag(kind == '{');
      }
      line_starting = pos_ > 0 && src_[pos_ - 1] == '\n';
    }
    tokens_.push_back(Token{T::kEof, line_, {}});
    return std::move(tokens_);
  }

 private:
  [[noreturn]] void error(const std::string& message) { throw_error(message); }

  size_t next_tag(size_t from) const {
    for (size_t p = src_.find('{', from); p != std::string::npos; p = src_.find('{', p + 1)) {
      if (p + 1 < src_.size() && (src_[p + 1] == '{' || src_[p + 1] == '%' || src_[p + 1] == '#')) {
        return p;
      }
    }
    return std::string::npos;
  }

  void advance_to(size_t p) {
    line_ += static_cast<int>(std::count(src_.begin() + static_cast<std::ptrdiff_t>(pos_),
                                         src_.begin() + static_cast<std::ptrdiff_t>(p), '\n'));
    pos_ = p;
  }

  void add_text(std::string text) {
    if (!text.empty()) tokens_.push_back(Token{T::kText, line_, std::move(text)});
  }

  // After a tag's closing delimiter: "-" strips all whitespace, "+" nothing, else trim_blocks.
  void after_block_end(char mod, bool trim) {
    if (mod == '-') {
      size_t p = pos_;
      while (p < src_.size()) {
        const auto lead = static_cast<unsigned char>(src_[p]);
        const size_t n = lead < 0x80 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
        if (!text::is_space(text::decode(std::string_view(src_).substr(p, n))[0])) break;
        p += n;
      }
      advance_to(p);
    } else if (mod != '+' && trim && pos_ < src_.size() && src_[pos_] == '\n') {
      advance_to(pos_ + 1);
    }
  }

  void comment() {
    const size_t end = src_.find("#}", pos_);
    if (end == std::string::npos) error("missing end of comment tag");
    const char mod = end > pos_ ? src_[end - 1] : '\0';
    advance_to(end + 2);
    after_block_end(mod, true);
  }

  // {% raw %}...{% endraw %}: the text in between is output as it is.
  bool raw_block() {
    size_t p = pos_;
    while (p < src_.size() && is_ws(src_[p])) ++p;
    if (src_.compare(p, 3, "raw") != 0) return false;
    p += 3;
    while (p < src_.size() && is_ws(src_[p])) ++p;
    char mod = '\0';
    if (p < src_.size() && src_[p] == '-') mod = src_[p++];
    if (src_.compare(p, 2, "%}") != 0) return false;
    advance_to(p + 2);
    after_block_end(mod, false);
    for (size_t q = src_.find("{%", pos_); q != std::string::npos; q = src_.find("{%", q + 1)) {
      size_t r = q + 2;
      const char begin_mod =
          r < src_.size() && (src_[r] == '-' || src_[r] == '+') ? src_[r++] : '\0';
      while (r < src_.size() && is_ws(src_[r])) ++r;
      if (src_.compare(r, 6, "endraw") != 0) continue;
      r += 6;
      while (r < src_.size() && is_ws(src_[r])) ++r;
      const char end_mod = r < src_.size() && (src_[r] == '-' || src_[r] == '+') ? src_[r++] : '\0';
      if (src_.compare(r, 2, "%}") != 0) continue;
      std::string body = src_.substr(pos_, q - pos_);
      add_text(begin_mod == '-' ? rstrip_space(body) : body);
      advance_to(r + 2);
      after_block_end(end_mod, true);
      return true;
    }
    error("missing end of raw directive");
  }

  void tag(bool variable) {
    tokens_.push_back(Token{variable ? T::kVarBegin : T::kBlockBegin, line_, {}});
    std::vector<char> balance;
    while (true) {
      while (pos_ < src_.size() && is_ws(src_[pos_])) advance_to(pos_ + 1);
      if (pos_ >= src_.size()) error("unexpected end of template, expected the end of the tag");
      if (balance.empty()) {
        const char* close = variable ? "}}" : "%}";
        char mod = '\0';
        size_t p = pos_;
        if ((src_[p] == '-' || src_[p] == '+') && src_.compare(p + 1, 2, close) == 0)
          mod = src_[p++];
        if (src_.compare(p, 2, close) == 0 && !(variable && mod == '+')) {
          tokens_.push_back(Token{variable ? T::kVarEnd : T::kBlockEnd, line_, {}});
          advance_to(p + 2);
          after_block_end(mod, !variable);
          return;
        }
      }
      const char c = src_[pos_];
      if (is_name_start(c)) {
        size_t e = pos_;
        while (e < src_.size() && (is_name_start(src_[e]) || is_digit(src_[e]))) ++e;
        tokens_.push_back(Token{T::kName, line_, src_.substr(pos_, e - pos_)});
        advance_to(e);
      } else if (is_digit(c)) {
        number();
      } else if (c == '\'' || c == '"') {
        string_literal(c);
      } else {
        static const char* const kOps[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*",
                                           "/",  "%",  "~",  "<",  ">",  "=",  "(", ")", "[",
                                           "]",  "{",  "}",  ",",  ".",  ":",  "|"};
        const char* op = nullptr;
        for (const char* candidate : kOps) {
          if (src_.compare(pos_, std::char_traits<char>::length(candidate), candidate) == 0) {
            op = candidate;
            break;
          }
        }
        if (!op) error(std::string("unexpected char '") + c + "'");
        const std::string o(op);
        if (o == "(" || o == "[" || o == "{") {
          balance.push_back(o == "(" ? ')' : o == "[" ? ']' : '}');
        } else if (o == ")" || o == "]" || o == "}") {
          if (balance.empty() || balance.back() != o[0]) error("unexpected '" + o + "'");
          balance.pop_back();
        }
        tokens_.push_back(Token{T::kOp, line_, o});
        advance_to(pos_ + o.size());
      }
    }
  }

  void number() {
    size_t e = pos_;
    std::string digits;
    const auto take_digits = [&] {
      while (e < src_.size() && (is_digit(src_[e]) || (src_[e] == '_' && e + 1 < src_.size() &&
                                                       is_digit(src_[e + 1])))) {
        if (src_[e] != '_') digits += src_[e];
        ++e;
      }
    };
    take_digits();
    bool is_float = false;
    if (e + 1 < src_.size() && src_[e] == '.' && is_digit(src_[e + 1])) {
      is_float = true;
      digits += src_[e++];
      take_digits();
    }
    if (e < src_.size() && (src_[e] == 'e' || src_[e] == 'E')) {
      size_t x = e + 1;
      if (x < src_.size() && (src_[x] == '+' || src_[x] == '-')) ++x;
      if (x < src_.size() && is_digit(src_[x])) {
        is_float = true;
        digits += 'e';
        digits.append(src_, e + 1, x - e - 1);
        e = x;
        take_digits();
      }
    }
    Token t{is_float ? T::kFloat : T::kInt, line_, digits};
    if (is_float) {
      t.f = std::strtod(digits.c_str(), nullptr);
    } else {
      const auto r = std::from_chars(digits.data(), digits.data() + digits.size(), t.i);
      if (r.ec != std::errc()) error("integer literal too large: " + digits);
    }
    tokens_.push_back(std::move(t));
    advance_to(e);
  }

  // Python's unicode-escape decoding, which jinja2 applies to string literals.
  void string_literal(char quote) {
    size_t e = pos_ + 1;
    std::string value;
    while (true) {
      if (e >= src_.size()) error("unterminated string");
      const char c = src_[e];
      if (c == quote) break;
      if (c != '\\') {
        value += c;
        ++e;
        continue;
      }
      if (e + 1 >= src_.size()) error("unterminated string");
      const char n = src_[e + 1];
      e += 2;
      const auto hex = [&](int width) {
        if (e + static_cast<size_t>(width) > src_.size()) error("truncated \\x escape in string");
        uint32_t cp = 0;
        for (int k = 0; k < width; ++k) {
          const char h = src_[e + static_cast<size_t>(k)];
          const int d = is_digit(h)              ? h - '0'
                        : (h >= 'a' && h <= 'f') ? h - 'a' + 10
                        : (h >= 'A' && h <= 'F') ? h - 'A' + 10
                                                 : -1;
          if (d < 0) error("truncated escape in string");
          cp = cp * 16 + static_cast<uint32_t>(d);
        }
        e += static_cast<size_t>(width);
        if (cp > 0x10FFFF || (cp >= 0xD800 && cp < 0xE000))
          error("invalid code point escape in string");
        text::append_utf8(value, cp);
      };
      switch (n) {
        case '\n':
          break;
        case '\\':
          value += '\\';
          break;
        case '\'':
          value += '\'';
          break;
        case '"':
          value += '"';
          break;
        case 'a':
          value += '\a';
          break;
        case 'b':
          value += '\b';
          break;
        case 'f':
          value += '\f';
          break;
        case 'n':
          value += '\n';
          break;
        case 'r':
          value += '\r';
          break;
        case 't':
          value += '\t';
          break;
        case 'v':
          value += '\v';
          break;
        case 'x':
          hex(2);
          break;
        case 'u':
          hex(4);
          break;
        case 'U':
          hex(8);
          break;
        default:
          if (n >= '0' && n <= '7') {
            uint32_t cp = static_cast<uint32_t>(n - '0');
            for (int k = 0; k < 2 && e < src_.size() && src_[e] >= '0' && src_[e] <= '7'; ++k) {
              cp = cp * 8 + static_cast<uint32_t>(src_[e++] - '0');
            }
            text::append_utf8(value, cp);
          } else {
            // Unknown escapes stay as they are.
            value += '\\';
            value += n;
          }
      }
    }
    tokens_.push_back(Token{T::kString, line_, std::move(value)});
    advance_to(e + 1);
  }

  std::string src_;
  size_t pos_ = 0;
  int& line_;
  std::vector<Token> tokens_;
};

class Parser {
 public:
  Parser(std::vector<Token> tokens, int& line) : toks_(std::move(tokens)), line_(line) {}

  Body parse() {
    Body body = parse_body({}, nullptr);
    return body;
  }

 private:
  const Token& cur() const { return toks_[pos_]; }
  const Token& peek(size_t k = 1) const { return toks_[std::min(pos_ + k, toks_.size() - 1)]; }
  void next() {
    if (pos_ + 1 < toks_.size()) ++pos_;
    line_ = cur().line;
  }
  bool is_op(std::string_view op) const { return cur().type == T::kOp && cur().text == op; }
  bool is_name(std::string_view name) const { return cur().type == T::kName && cur().text == name; }
  bool accept_op(std::string_view op) {
    if (!is_op(op)) return false;
    next();
    return true;
  }
  bool accept_name(std::string_view name) {
    if (!is_name(name)) return false;
    next();
    return true;
  }
  [[noreturn]] void error(const std::string& message) {
    line_ = cur().line;
    throw_error(message);
  }
  std::string describe() const {
    switch (cur().type) {
      case T::kEof:
        return "end of template";
      case T::kVarEnd:
        return "end of print statement";
      case T::kBlockEnd:
        return "end of statement block";
      case T::kName:
      case T::kOp:
      case T::kInt:
      case T::kFloat:
        return "'" + cur().text + "'";
      case T::kString:
        return "string";
      default:
        return "text";
    }
  }
  void expect_op(std::string_view op) {
    if (!accept_op(op)) error("expected '" + std::string(op) + "', got " + describe());
  }
  std::string expect_name() {
    if (cur().type != T::kName) error("expected a name, got " + describe());
    std::string n = cur().text;
    next();
    return n;
  }
  void expect_block_end() {
    if (cur().type != T::kBlockEnd) error("expected end of statement block, got " + describe());
    next();
  }

  struct Depth {
    explicit Depth(Parser& p) : p_(p) {
      if (++p_.depth_ > kMaxNesting) p_.error("template nested too deeply");
    }
    ~Depth() { --p_.depth_; }
    Parser& p_;
  };

  std::unique_ptr<Stmt> stmt(Stmt::Kind kind, int line) {
    auto s = std::make_unique<Stmt>();
    s->kind = kind;
    s->line = line;
    return s;
  }

  // Statements up to a {% <end> %} tag named in `ends`; stops after the end keyword.
  Body parse_body(std::initializer_list<std::string_view> ends, std::string* which) {
    Depth depth(*this);
    Body body;
    while (true) {
      const Token& t = cur();
      if (t.type == T::kEof) {
        if (ends.size() == 0) return body;
        std::string names;
        for (auto e : ends) names += (names.empty() ? "'" : " or '") + std::string(e) + "'";
        error("unexpected end of template, expected " + names);
      }
      if (t.type == T::kText) {
        auto s = stmt(Stmt::Kind::kText, t.line);
        s->text = t.text;
        body.push_back(std::move(s));
        next();
      } else if (t.type == T::kVarBegin) {
        auto s = stmt(Stmt::Kind::kOutput, t.line);
        next();
        s->expr = parse_tuple(true, {});
        if (cur().type != T::kVarEnd) error("expected end of print statement, got " + describe());
        next();
        body.push_back(std::move(s));
      } else if (t.type == T::kBlockBegin) {
        next();
        if (cur().type != T::kName) error("expected a tag name, got " + describe());
        const std::string keyword = cur().text;
        if (std::find(ends.begin(), ends.end(), keyword) != ends.end()) {
          next();
          *which = keyword;
          return body;
        }
        body.push_back(parse_statement(keyword));
      } else {
        error("unexpected " + describe());
      }
    }
  }

  std::unique_ptr<Stmt> parse_statement(const std::string& keyword) {
    const int line = cur().line;
    next();
    if (keyword == "if") return parse_if(line);
    if (keyword == "for") return parse_for(line);
    if (keyword == "set") return parse_set(line);
    if (keyword == "macro") return parse_macro(line);
    if (keyword == "break" || keyword == "continue") {
      if (loops_ == 0) error("'" + keyword + "' outside of a loop");
      expect_block_end();
      return stmt(keyword == "break" ? Stmt::Kind::kBreak : Stmt::Kind::kContinue, line);
    }
    if (keyword == "filter") {
      auto s = stmt(Stmt::Kind::kFilterBlock, line);
      s->filter = parse_filters(block_body(line), true);
      expect_block_end();
      std::string which;
      s->bodies.push_back(parse_body({"endfilter"}, &which));
      expect_block_end();
      return s;
    }
    if (keyword == "generation") {
      // transformers' {% generation %} marks assistant text; rendering passes it through.
      auto s = stmt(Stmt::Kind::kBlock, line);
      expect_block_end();
      std::string which;
      s->bodies.push_back(parse_body({"endgeneration"}, &which));
      expect_block_end();
      return s;
    }
    line_ = line;
    throw_error("unknown tag '" + keyword + "'");
  }

  std::unique_ptr<Stmt> parse_if(int line) {
    auto s = stmt(Stmt::Kind::kIf, line);
    s->conditions.push_back(parse_tuple(false, {}));
    expect_block_end();
    while (true) {
      std::string which;
      s->bodies.push_back(parse_body({"elif", "else", "endif"}, &which));
      if (which == "elif") {
        s->conditions.push_back(parse_tuple(false, {}));
        expect_block_end();
      } else if (which == "else") {
        expect_block_end();
        std::string end;
        s->bodies.push_back(parse_body({"endif"}, &end));
        expect_block_end();
        return s;
      } else {
        expect_block_end();
        return s;
      }
    }
  }

  // Names to assign: "x", "a, b" or "(a, b)".
  std::vector<std::string> parse_targets(std::string_view stop) {
    std::vector<std::string> names;
    const bool paren = accept_op("(");
    while (true) {
      names.push_back(expect_name());
      if (!accept_op(",")) break;
      if (is_name(stop) || is_op(")") || is_op("=")) break;
    }
    if (paren) expect_op(")");
    return names;
  }

  std::unique_ptr<Stmt> parse_for(int line) {
    auto s = stmt(Stmt::Kind::kFor, line);
    s->targets = parse_targets("in");
    if (!accept_name("in")) error("expected 'in', got " + describe());
    s->expr = parse_tuple(false, {"if", "recursive"});
    if (is_name("recursive")) error("recursive loops are not supported");
    if (accept_name("if")) s->filter = parse_expression(true);
    expect_block_end();
    ++loops_;
    std::string which;
    s->bodies.push_back(parse_body({"else", "endfor"}, &which));
    --loops_;
    if (which == "else") {
      expect_block_end();
      s->bodies.push_back(parse_body({"endfor"}, &which));
    }
    expect_block_end();
    return s;
  }

  std::unique_ptr<Stmt> parse_set(int line) {
    auto s = stmt(Stmt::Kind::kSet, line);
    if (cur().type == T::kName && peek().type == T::kOp && peek().text == ".") {
      s->attr_owner = expect_name();
      next();
      s->targets.push_back(expect_name());
    } else {
      s->targets = parse_targets("");
    }
    if (accept_op("=")) {
      s->expr = parse_tuple(true, {});
      expect_block_end();
      return s;
    }
    if (!s->attr_owner.empty() || s->targets.size() != 1) error("expected '='");
    s->kind = Stmt::Kind::kSetBlock;
    if (is_op("|")) s->filter = parse_filters(block_body(line), true);
    expect_block_end();
    std::string which;
    s->bodies.push_back(parse_body({"endset"}, &which));
    expect_block_end();
    return s;
  }

  std::unique_ptr<Stmt> parse_macro(int line) {
    auto s = stmt(Stmt::Kind::kMacro, line);
    s->text = expect_name();
    expect_op("(");
    while (!accept_op(")")) {
      if (!s->params.empty()) expect_op(",");
      if (accept_op(")")) break;
      std::string name = expect_name();
      ExprPtr def;
      if (accept_op("=")) def = parse_expression(true);
      s->params.emplace_back(std::move(name), std::move(def));
    }
    expect_block_end();
    const int saved_loops = loops_;
    loops_ = 0;
    std::string which;
    s->bodies.push_back(parse_body({"endmacro"}, &which));
    loops_ = saved_loops;
    if (cur().type == T::kName) next();  // {% endmacro name %}
    expect_block_end();
    return s;
  }

  ExprPtr node(Expr::Kind kind, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = line;
    return e;
  }
  ExprPtr literal(Value v, int line) {
    auto e = node(Expr::Kind::kLiteral, line);
    e->value = std::move(v);
    return e;
  }
  ExprPtr block_body(int line) {
    auto e = node(Expr::Kind::kName, line);
    e->name = kBlockBodyName;
    return e;
  }
  ExprPtr binary(Expr::Kind kind, std::string op, ExprPtr a, ExprPtr b, int line) {
    auto e = node(kind, line);
    e->name = std::move(op);
    e->args.push_back(std::move(a));
    e->args.push_back(std::move(b));
    return e;
  }

  bool tuple_end(std::initializer_list<std::string_view> extra) const {
    if (cur().type == T::kVarEnd || cur().type == T::kBlockEnd || cur().type == T::kEof)
      return true;
    if (is_op(")")) return true;
    return cur().type == T::kName &&
           std::find(extra.begin(), extra.end(), cur().text) != extra.end();
  }

  ExprPtr parse_tuple(bool with_condexpr, std::initializer_list<std::string_view> extra_end,
                      bool explicit_parens = false) {
    const int line = cur().line;
    std::vector<ExprPtr> items;
    bool saw_comma = false;
    while (true) {
      if (!items.empty()) {
        if (!accept_op(",")) break;
        saw_comma = true;
      }
      if (tuple_end(extra_end)) break;
      items.push_back(parse_expression(with_condexpr));
    }
    if (!saw_comma) {
      if (!items.empty()) return std::move(items[0]);
      if (!explicit_parens) error("expected an expression, got " + describe());
    }
    auto e = node(Expr::Kind::kList, line);
    e->is_tuple = true;
    e->args = std::move(items);
    return e;
  }

  ExprPtr parse_expression(bool with_condexpr) {
    Depth depth(*this);
    if (!with_condexpr) return parse_or();
    ExprPtr e = parse_or();
    while (is_name("if")) {
      const int line = cur().line;
      next();
      ExprPtr cond = parse_or();
      ExprPtr otherwise;
      if (accept_name("else")) otherwise = parse_expression(true);
      auto c = node(Expr::Kind::kCondition, line);
      c->args.push_back(std::move(e));
      c->args.push_back(std::move(cond));
      c->args.push_back(std::move(otherwise));
      e = std::move(c);
    }
    return e;
  }

  ExprPtr parse_or() {
    ExprPtr e = parse_and();
    while (is_name("or")) {
      const int line = cur().line;
      next();
      e = binary(Expr::Kind::kOr, "or", std::move(e), parse_and(), line);
    }
    return e;
  }
  ExprPtr parse_and() {
    ExprPtr e = parse_not();
    while (is_name("and")) {
      const int line = cur().line;
      next();
      e = binary(Expr::Kind::kAnd, "and", std::move(e), parse_not(), line);
    }
    return e;
  }
  ExprPtr parse_not() {
    if (is_name("not")) {
      Depth depth(*this);
      auto e = node(Expr::Kind::kNot, cur().line);
      next();
      e->args.push_back(parse_not());
      return e;
    }
    return parse_compare();
  }
  ExprPtr parse_compare() {
    const int line = cur().line;
    ExprPtr first = parse_math1();
    ExprPtr e;
    while (true) {
      std::string op;
      if (cur().type == T::kOp && (cur().text == "==" || cur().text == "!=" || cur().text == "<" ||
                                   cur().text == "<=" || cur().text == ">" || cur().text == ">=")) {
        op = cur().text;
        next();
      } else if (is_name("in")) {
        op = "in";
        next();
      } else if (is_name("not") && peek().type == T::kName && peek().text == "in") {
        op = "not in";
        next();
        next();
      } else {
        break;
      }
      if (!e) {
        e = node(Expr::Kind::kCompare, line);
        e->args.push_back(std::move(first));
      }
      e->ops.push_back(op);
      e->args.push_back(parse_math1());
    }
    return e ? std::move(e) : std::move(first);
  }
  ExprPtr parse_math1() {
    ExprPtr e = parse_concat();
    while (is_op("+") || is_op("-")) {
      const std::string op = cur().text;
      const int line = cur().line;
      next();
      e = binary(Expr::Kind::kBinary, op, std::move(e), parse_concat(), line);
    }
    return e;
  }
  ExprPtr parse_concat() {
    ExprPtr e = parse_math2();
    while (is_op("~")) {
      const int line = cur().line;
      next();
      e = binary(Expr::Kind::kBinary, "~", std::move(e), parse_math2(), line);
    }
    return e;
  }
  ExprPtr parse_math2() {
    ExprPtr e = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const std::string op = cur().text;
      const int line = cur().line;
      next();
      e = binary(Expr::Kind::kBinary, op, std::move(e), parse_pow(), line);
    }
    return e;
  }
  ExprPtr parse_pow() {
    ExprPtr e = parse_unary(true);
    while (is_op("**")) {
      const int line = cur().line;
      next();
      e = binary(Expr::Kind::kBinary, "**", std::move(e), parse_unary(true), line);
    }
    return e;
  }
  ExprPtr parse_unary(bool with_filter) {
    Depth depth(*this);
    const int line = cur().line;
    ExprPtr e;
    if (is_op("-") || is_op("+")) {
      e = node(is_op("-") ? Expr::Kind::kNeg : Expr::Kind::kPos, line);
      next();
      e->args.push_back(parse_unary(false));
    } else {
      e = parse_postfix(parse_primary());
    }
    return with_filter ? parse_filters(std::move(e), false) : std::move(e);
  }

  ExprPtr parse_primary() {
    const Token& t = cur();
    const int line = t.line;
    switch (t.type) {
      case T::kName: {
        const std::string n = t.text;
        next();
        if (n == "true" || n == "True") return literal(Value::boolean(true), line);
        if (n == "false" || n == "False") return literal(Value::boolean(false), line);
        if (n == "none" || n == "None") return literal(Value::none(), line);
        auto e = node(Expr::Kind::kName, line);
        e->name = n;
        return e;
      }
      case T::kString: {
        std::string s;
        while (cur().type == T::kString) {
          s += cur().text;
          next();
        }
        return literal(Value::string(std::move(s)), line);
      }
      case T::kInt: {
        const int64_t v = t.i;
        next();
        return literal(Value::integer(v), line);
      }
      case T::kFloat: {
        const double v = t.f;
        next();
        return literal(Value::number(v), line);
      }
      case T::kOp:
        if (t.text == "(") {
          next();
          ExprPtr e = parse_tuple(true, {}, true);
          expect_op(")");
          return e;
        }
        if (t.text == "[") {
          next();
          auto e = node(Expr::Kind::kList, line);
          while (!accept_op("]")) {
            if (!e->args.empty()) expect_op(",");
            if (accept_op("]")) break;
            e->args.push_back(parse_expression(true));
          }
          return e;
        }
        if (t.text == "{") {
          next();
          auto e = node(Expr::Kind::kDict, line);
          while (!accept_op("}")) {
            if (!e->args.empty()) expect_op(",");
            if (accept_op("}")) break;
            e->args.push_back(parse_expression(true));
            expect_op(":");
            e->args.push_back(parse_expression(true));
          }
          return e;
        }
        break;
      default:
        break;
    }
    error("unexpected " + describe());
  }

  ExprPtr parse_postfix(ExprPtr e) {
    while (true) {
      const int line = cur().line;
      if (is_op(".")) {
        next();
        if (cur().type == T::kInt) {
          auto item = node(Expr::Kind::kItem, line);
          item->args.push_back(std::move(e));
          item->args.push_back(literal(Value::integer(cur().i), line));
          next();
          e = std::move(item);
        } else {
          auto attr = node(Expr::Kind::kAttr, line);
          attr->name = expect_name();
          attr->args.push_back(std::move(e));
          e = std::move(attr);
        }
      } else if (is_op("[")) {
        next();
        e = parse_subscript(std::move(e), line);
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr target, int line) {
    ExprPtr parts[3];
    bool is_slice = false;
    int part = 0;
    while (!is_op("]")) {
      if (accept_op(":")) {
        is_slice = true;
        if (++part > 2) error("invalid slice");
        continue;
      }
      if (parts[part]) error("expected ']' or ':', got " + describe());
      parts[part] = parse_expression(true);
      if (!is_slice && is_op(",")) error("tuple subscripts are not supported");
    }
    next();
    if (!is_slice) {
      if (!parts[0]) error("expected a subscript");
      auto e = node(Expr::Kind::kItem, line);
      e->args.push_back(std::move(target));
      e->args.push_back(std::move(parts[0]));
      return e;
    }
    auto e = node(Expr::Kind::kSlice, line);
    e->args.push_back(std::move(target));
    for (auto& p : parts) e->args.push_back(std::move(p));
    return e;
  }

  // "(args, name=value)" into e->args (after whatever is there) and e->kwargs.
  void parse_args(Expr& e) {
    expect_op("(");
    bool first = true;
    while (!accept_op(")")) {
      if (!first) expect_op(",");
      first = false;
      if (accept_op(")")) break;
      if (is_op("*") || is_op("**")) error("*args and **kwargs in calls are not supported");
      if (cur().type == T::kName && peek().type == T::kOp && peek().text == "=") {
        std::string key = expect_name();
        next();
        e.kwargs.emplace_back(std::move(key), parse_expression(true));
      } else {
        if (!e.kwargs.empty()) error("positional argument after keyword argument");
        e.args.push_back(parse_expression(true));
      }
    }
  }

  ExprPtr parse_call(ExprPtr callee) {
    auto e = node(Expr::Kind::kCall, cur().line);
    e->args.push_back(std::move(callee));
    parse_args(*e);
    return e;
  }

  std::string dotted_name() {
    std::string n = expect_name();
    while (is_op(".") && peek().type == T::kName) {
      next();
      n += '.';
      n += expect_name();
    }
    return n;
  }

  // Filters (|f(args)), tests (is [not] t args) and calls after a unary expression.
  // `only_filters` parses the chain of a {% filter %} or {% set x | f %}, which starts with "|"
  // or a bare name.
  ExprPtr parse_filters(ExprPtr e, bool only_filters) {
    bool first = only_filters;
    while (true) {
      const int line = cur().line;
      if (is_op("|") || first) {
        if (!first || is_op("|")) next();
        first = false;
        auto f = node(Expr::Kind::kFilter, line);
        f->name = dotted_name();
        if (!is_known_filter(f->name)) {
          line_ = line;
          throw_error("unknown filter '" + f->name + "'");
        }
        f->args.push_back(std::move(e));
        if (is_op("(")) parse_args(*f);
        e = std::move(f);
      } else if (only_filters) {
        return e;
      } else if (is_name("is")) {
        next();
        auto t = node(Expr::Kind::kTest, line);
        t->negate = accept_name("not");
        t->name = dotted_name();
        if (!is_known_test(t->name)) {
          line_ = line;
          throw_error("unknown test '" + t->name + "'");
        }
        t->args.push_back(std::move(e));
        if (is_op("(")) {
          parse_args(*t);
        } else if ((cur().type == T::kName || cur().type == T::kString || cur().type == T::kInt ||
                    cur().type == T::kFloat || is_op("[") || is_op("{")) &&
                   !is_name("else") && !is_name("or") && !is_name("and")) {
          // jinja2: a test takes one argument without parentheses ("is sameas false").
          t->args.push_back(parse_postfix(parse_primary()));
        }
        e = std::move(t);
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  std::vector<Token> toks_;
  size_t pos_ = 0;
  int& line_;
  int depth_ = 0;
  int loops_ = 0;
};

}  // namespace

Body parse_template(std::string_view source, int& error_line) {
  // As jinja2: newlines normalized to \n and one trailing newline dropped.
  std::string src;
  src.reserve(source.size());
  for (size_t k = 0; k < source.size(); ++k) {
    if (source[k] == '\r') {
      src += '\n';
      if (k + 1 < source.size() && source[k + 1] == '\n') ++k;
    } else {
      src += source[k];
    }
  }
  if (!src.empty() && src.back() == '\n') src.pop_back();
  error_line = 1;
  std::vector<Token> tokens = Lexer(std::move(src), error_line).run();
  error_line = tokens.empty() ? 1 : tokens[0].line;
  return Parser(std::move(tokens), error_line).parse();
}

}  // namespace qhx::jinja
