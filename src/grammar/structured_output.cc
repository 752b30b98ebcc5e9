#include "grammar/structured_output.h"

#include <dlpack/dlpack.h>

#include <xgrammar/xgrammar.h>
#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <vector>

#include "grammar/xgrammar_log.h"
#include "util/bounded_json.h"
#include "util/error.h"

namespace qhx {
namespace {

using Json = nlohmann::ordered_json;

constexpr std::string_view kThinkOpen = "<think>";
constexpr std::string_view kThinkClose = "</think>";
// What the templates put between a closed <think> block and the answer.
constexpr std::string_view kAfterThink = "\n\n";
// Whitespace between JSON tokens: none, a space, or a line break and up to this many spaces or
// tabs of indentation, as llama.cpp's schema grammars allow (cmake/xgrammar.cmake makes xgrammar's
// max_whitespace_cnt mean that). Any more, and a model can stall in whitespace.
constexpr int kMaxJsonWhitespace = 20;
// A recursive schema (a tree through $ref) is bounded: past this many $ref hops, the reference
// allows nothing (an optional child is left out, an array of them stays empty); a schema that
// cannot end within it is refused.
constexpr int kMaxRefDepth = 12;
// Compiled grammars kept per model: a JSON schema's is tens to hundreds of kB over a 248k
// vocabulary.
constexpr int64_t kCacheBytes = int64_t{64} << 20;

// xgrammar's message without its "[hh:mm:ss] file.cc:line: " prefix, first line only.
std::string xgrammar_message(const char* what) {
  std::string_view s(what);
  s = s.substr(0, s.find('\n'));
  if (s.starts_with('[')) {
    const size_t time_end = s.find("] ");
    const size_t where_end = time_end == std::string_view::npos ? time_end : s.find(": ", time_end);
    if (where_end != std::string_view::npos) s.remove_prefix(where_end + 2);
  }
  return std::string(s);
}

const Json& member(const Json& object, const char* key, const std::string& where) {
  const auto it = object.find(key);
  if (it == object.end()) fail(where + "." + key, "is missing");
  return *it;
}

const std::string& string_member(const Json& object, const char* key, const std::string& where) {
  const Json& value = member(object, key, where);
  if (!value.is_string()) fail(where + "." + key, "must be a string");
  return value.get_ref<const std::string&>();
}

Json tag(std::string begin, Json content, std::string end) {
  return {{"type", "tag"},
          {"begin", std::move(begin)},
          {"content", std::move(content)},
          {"end", std::move(end)}};
}

Json const_string(std::string_view value) {
  return {{"type", "const_string"}, {"value", value}};
}

// The schema with its local $refs ("#", "#/$defs/x", any JSON pointer into it) unrolled to
// kMaxRefDepth: the target of a hop at depth d becomes a definition of its own for depth d, whose
// references lead to depth d + 1. Past the last depth a reference admits nothing, and so does what
// must hold it: an optional property is dropped, an array of it stays empty, an anyOf loses the
// branch; nullopt when the whole schema can no longer end. Linear in the depth.
class RecursionBound {
 public:
  explicit RecursionBound(const Json& root) : root_(root) {}

  std::optional<Json> run() {
    std::optional<Json> out = rewrite(root_, 0);
    if (out && out->is_object()) {
      out->erase("$defs");
      out->erase("definitions");
      if (!defs_.empty()) (*out)["$defs"] = std::move(defs_);
    }
    return out;
  }

 private:
  using Schema = std::optional<Json>;  // nullopt: admits no value

  Schema rewrite(const Json& node, int depth) {
    if (!node.is_object()) return node;
    if (const auto ref = node.find("$ref"); ref != node.end() && ref->is_string()) {
      const std::string pointer = ref->get<std::string>();
      if (pointer.starts_with("#")) return follow(pointer, depth);
    }
    Json out = Json::object();
    bool empty_array = false;
    for (const auto& [key, value] : node.items()) {
      if (key == "$defs" || key == "definitions") continue;  // reached through their references
      // Values, not schemas.
      if (key == "const" || key == "enum" || key == "default" || key == "examples" ||
          key == "required") {
        out[key] = value;
      } else if (key == "properties" && value.is_object()) {
        Json kept = Json::object();
        for (const auto& [name, property] : value.items()) {
          if (Schema schema = rewrite(property, depth)) {
            kept[name] = std::move(*schema);
          } else if (required(node, name)) {
            return std::nullopt;
          }
        }
        out[key] = std::move(kept);
      } else if (key == "items" && value.is_object()) {
        if (Schema schema = rewrite(value, depth)) {
          out[key] = std::move(*schema);
        } else if (node.value("minItems", 0) > 0) {
          return std::nullopt;
        } else {
          empty_array = true;
        }
      } else if ((key == "anyOf" || key == "oneOf") && value.is_array()) {
        Json kept = Json::array();
        for (const Json& branch : value) {
          if (Schema schema = rewrite(branch, depth)) kept.push_back(std::move(*schema));
        }
        if (kept.empty()) return std::nullopt;
        out[key] = std::move(kept);
      } else if (key == "additionalProperties" && value.is_object()) {
        Schema schema = rewrite(value, depth);
        out[key] = schema ? std::move(*schema) : Json(false);
      } else if (Schema schema = rewrite_any(value, depth)) {
        out[key] = std::move(*schema);
      } else {
        return std::nullopt;  // allOf, prefixItems, not, ...: no value short of the bound
      }
    }
    if (empty_array) out["maxItems"] = 0;
    return out;
  }

  // Any other keyword's value: every schema in it must stay satisfiable.
  Schema rewrite_any(const Json& value, int depth) {
    if (value.is_object()) return rewrite(value, depth);
    if (!value.is_array()) return value;
    Json out = Json::array();
    for (const Json& item : value) {
      Schema schema = rewrite_any(item, depth);
      if (!schema) return std::nullopt;
      out.push_back(std::move(*schema));
    }
    return out;
  }

  static bool required(const Json& node, const std::string& name) {
    const auto it = node.find("required");
    if (it == node.end() || !it->is_array()) return false;
    return std::find(it->begin(), it->end(), name) != it->end();
  }

  Schema follow(const std::string& pointer, int depth) {
    if (depth + 1 > kMaxRefDepth) return std::nullopt;
    const Json* target = &root_;
    if (pointer.size() > 1) {
      try {
        target = &root_.at(Json::json_pointer(pointer.substr(1)));
      } catch (const std::exception&) {
        return Json{{"$ref", pointer}};  // xgrammar says what is wrong with it
      }
    }
    auto [it, fresh] = ids_.try_emplace(pointer, static_cast<int>(ids_.size()));
    const std::string name =
        "qhx_ref" + std::to_string(it->second) + "_" + std::to_string(depth + 1);
    auto done = followed_.find(name);
    if (done == followed_.end()) {
      Schema body = rewrite(*target, depth + 1);
      if (body) defs_[name] = std::move(*body);
      done = followed_.emplace(name, body.has_value()).first;
    }
    if (!done->second) return std::nullopt;
    return Json{{"$ref", "#/$defs/" + name}};
  }

  const Json& root_;
  Json defs_ = Json::object();
  std::map<std::string, int> ids_;        // pointer -> its number in the definitions' names
  std::map<std::string, bool> followed_;  // definition -> whether it admits a value
};

Json json_schema(Json schema, const std::string& where, std::string_view style = "json") {
  if (schema.is_object()) {
    std::optional<Json> bounded = RecursionBound(schema).run();
    if (!bounded) {
      fail(where, "admits no value within " + std::to_string(kMaxRefDepth) +
                      " levels of $ref (recursion that cannot end)");
    }
    schema = std::move(*bounded);
  }
  return {{"type", "json_schema"},
          {"json_schema", std::move(schema)},
          {"style", style},
          {"max_whitespace_cnt", kMaxJsonWhitespace}};
}

Json sequence(std::vector<Json> elements) {
  return {{"type", "sequence"}, {"elements", std::move(elements)}};
}

// One call of `tool` (an OpenAI tool object) as the template writes it.
// The keywords xgrammar's JSON schema converter reads (and the annotations it may skip); it
// ignores any other without a word.
bool enforced_keyword(std::string_view key) {
  static constexpr std::string_view kKeywords[] = {
      "$ref", "$defs", "definitions", "type", "enum", "const", "anyOf", "oneOf", "allOf",
      "properties", "patternProperties", "additionalProperties", "unevaluatedProperties",
      "propertyNames", "required", "minProperties", "maxProperties", "items", "prefixItems",
      "unevaluatedItems", "minItems", "maxItems", "minLength", "maxLength", "pattern", "format",
      "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf",
      // annotations
      "title", "description", "default", "examples", "deprecated", "readOnly", "writeOnly",
      "$comment", "$schema", "$id", "$anchor"};
  return std::find(std::begin(kKeywords), std::end(kKeywords), key) != std::end(kKeywords);
}

// Fails naming the first keyword of `schema` (or of a schema in it) that would not be enforced.
void check_enforced(const Json& schema, const std::string& where) {
  if (!schema.is_object()) return;
  for (const auto& [key, value] : schema.items()) {
    if (!enforced_keyword(key)) {
      fail(where, "\"" + key +
                      "\" is not enforced by the grammar engine (xgrammar), so a reply could break "
                      "it (\"strict\": false accepts the schema without it)");
    }
    const std::string inner = where + "." + key;
    if (key == "properties" || key == "patternProperties" || key == "$defs" ||
        key == "definitions") {
      if (value.is_object()) {
        for (const auto& [name, property] : value.items()) {
          check_enforced(property, inner + "." + name);
        }
      }
    } else if (key == "anyOf" || key == "oneOf" || key == "allOf" || key == "prefixItems") {
      if (value.is_array()) {
        for (size_t i = 0; i < value.size(); ++i) {
          check_enforced(value[i], inner + "[" + std::to_string(i) + "]");
        }
      }
    } else if (key == "items" || key == "additionalProperties" || key == "propertyNames" ||
               key == "unevaluatedProperties" || key == "unevaluatedItems") {
      check_enforced(value, inner);
    }
  }
}

bool strict_member(const Json& object, const std::string& where) {
  const auto it = object.find("strict");
  if (it == object.end()) return true;
  if (!it->is_boolean()) fail(where + ".strict", "must be a boolean");
  return it->get<bool>();
}

// What a format's compilation needs to know beyond its JSON, and learns on the way.
struct FormatContext {
  ToolCallStyle style;
  // The first schema that asks to be held exactly (OpenAI's "strict", unless false): whatever
  // xgrammar would leave unenforced in the format (its warnings: a keyword it ignores, a bound it
  // drops) is then refused, naming this field.
  std::string strict_where;

  // `spec` holds "strict", `schema` is what it applies to.
  void schema(const Json& spec, const Json& schema, const std::string& spec_where,
              const std::string& schema_where) {
    if (!strict_member(spec, spec_where)) return;
    if (strict_where.empty()) strict_where = schema_where;
    check_enforced(schema, schema_where);
  }
};

Json tool_call_tag(const Json& tool, FormatContext& context, const std::string& where) {
  if (!tool.is_object()) fail(where, "must be an object");
  const std::string type = tool.contains("type") && tool["type"].is_string()
                               ? tool["type"].get<std::string>()
                               : "function";
  if (type != "function") fail(where + ".type", "must be \"function\"");
  const Json& function = member(tool, "function", where);
  if (!function.is_object()) fail(where + ".function", "must be an object");
  const std::string& name = string_member(function, "name", where + ".function");
  if (name.empty() || name.find_first_of("<>\"\n") != std::string::npos) {
    fail(where + ".function.name", "must be non-empty, without <, >, \" or a line break");
  }
  Json parameters = {{"type", "object"}};
  if (const auto it = function.find("parameters"); it != function.end() && !it->is_null()) {
    if (!it->is_object()) fail(where + ".function.parameters", "must be a JSON schema object");
    parameters = *it;
  }
  context.schema(function, parameters, where + ".function", where + ".function.parameters");
  if (context.style == ToolCallStyle::kXml) {
    return tag("<tool_call>\n<function=" + name + ">\n",
               json_schema(parameters, where + ".function.parameters", "qwen_xml"),
               "\n</function>\n</tool_call>");
  }
  return tag("<tool_call>\n{\"name\": \"" + name + "\", \"arguments\": ",
             json_schema(parameters, where + ".function.parameters"), "}\n</tool_call>");
}

// The format of the answer itself (xgrammar's structural-tag format object); null for text.
Json answer_format(const Json& format, FormatContext& context, const std::string& where) {
  if (!format.is_object()) fail(where, "must be an object");
  const std::string& type = string_member(format, "type", where);
  if (type == "text") return nullptr;
  if (type == "json_object") {
    return json_schema({{"type", "object"}, {"additionalProperties", true}}, where);
  }
  if (type == "json_schema") {
    const Json& spec = member(format, "json_schema", where);
    if (!spec.is_object()) fail(where + ".json_schema", "must be an object");
    const Json& schema = member(spec, "schema", where + ".json_schema");
    if (!schema.is_object() && !schema.is_boolean()) {
      fail(where + ".json_schema.schema", "must be a JSON schema (an object)");
    }
    context.schema(spec, schema, where + ".json_schema", where + ".json_schema.schema");
    return json_schema(schema, where + ".json_schema.schema");
  }
  if (type == "grammar") {
    const std::string& grammar = string_member(format, "grammar", where);
    std::string syntax = "gbnf";
    if (format.contains("syntax")) syntax = string_member(format, "syntax", where);
    if (syntax != "gbnf" && syntax != "lark")
      fail(where + ".syntax", "must be \"gbnf\" or \"lark\"");
    return {
        {"type", "grammar"}, {"grammar", grammar}, {"syntax", syntax == "gbnf" ? "ebnf" : "lark"}};
  }
  if (type == "regex") {
    return {{"type", "regex"}, {"pattern", string_member(format, "pattern", where)}};
  }
  if (type == "structural_tag") {
    const Json& inner = member(format, "format", where);
    if (!inner.is_object()) fail(where + ".format", "must be an object");
    return inner;
  }
  if (type == "tool_calls") {
    const Json& tools = member(format, "tools", where);
    if (!tools.is_array() || tools.empty()) fail(where + ".tools", "must be a non-empty array");
    bool parallel = false;
    if (const auto it = format.find("parallel"); it != format.end()) {
      if (!it->is_boolean()) fail(where + ".parallel", "must be a boolean");
      parallel = it->get<bool>();
    }
    Json tags = Json::array();
    for (size_t i = 0; i < tools.size(); ++i) {
      tags.push_back(tool_call_tag(tools[i], context, where + ".tools[" + std::to_string(i) + "]"));
    }
    if (tags.size() == 1 && !parallel) return tags[0];
    // One call, or several, each on its own line as the templates write them.
    return {{"type", "tags_with_separator"},
            {"tags", tags},
            {"separator", "\n"},
            {"at_least_one", true},
            {"stop_after_first", !parallel}};
  }
  fail(where + ".type",
       "\"" + type +
           "\" is not one of text, json_object, json_schema, grammar, regex, structural_tag, "
           "tool_calls");
}

// The reasoning a chat reply may give first, left free up to its end.
Json reasoning(ReplyStart start) {
  const Json free_text = {{"type", "any_text"},
                          {"excludes", {std::string(kThinkOpen), std::string(kThinkClose)}}};
  const std::string begin = start == ReplyStart::kInThink ? "" : std::string(kThinkOpen);
  Json block =
      sequence({tag(begin, free_text, std::string(kThinkClose)), const_string(kAfterThink)});
  if (start == ReplyStart::kMayThink) return {{"type", "optional"}, {"content", block}};
  return block;
}

class XgrammarConstraint final : public GrammarConstraint {
 public:
  XgrammarConstraint(const xgrammar::CompiledGrammar& grammar, std::span<const int32_t> stop_ids)
      : matcher_(grammar,
                 stop_ids.empty()
                     ? std::nullopt
                     : std::optional(std::vector<int>(stop_ids.begin(), stop_ids.end())),
                 /*terminate_without_stop_token=*/stop_ids.empty()) {}

  bool allowed_next(std::span<uint32_t> words) override {
    int64_t shape[1] = {static_cast<int64_t>(words.size())};
    DLTensor tensor{};
    tensor.data = words.data();
    tensor.device = DLDevice{kDLCPU, 0};
    tensor.ndim = 1;
    tensor.dtype = xgrammar::GetBitmaskDLType();
    tensor.shape = shape;
    return matcher_.FillNextTokenBitmask(&tensor);
  }

  void accept(int32_t token) override {
    if (!matcher_.AcceptToken(token)) {
      fail("constraint", "token " + std::to_string(token) + " does not follow the format here");
    }
  }

  bool finished() const override { return matcher_.IsTerminated(); }
  void reset() override { matcher_.Reset(); }
  bool accepts_text(std::string_view text) const override {
    xgrammar::GrammarMatcher fork = matcher_.Fork();
    return fork.AcceptString(std::string(text));
  }

 private:
  xgrammar::GrammarMatcher matcher_;
};

xgrammar::TokenizerInfo tokenizer_info(const Tokenizer& tokenizer, int64_t vocab_size) {
  // Raw bytes per id; "" marks what is never text (special tokens, ids without a token), which
  // xgrammar allows only as stop tokens.
  const int32_t n = std::min<int32_t>(tokenizer.size(), static_cast<int32_t>(vocab_size));
  std::vector<std::string> vocab(static_cast<size_t>(n));
  for (int32_t id = 0; id < n; ++id) {
    if (tokenizer.is_special(id)) continue;
    try {
      vocab[static_cast<size_t>(id)] = tokenizer.token_bytes(id);
    } catch (const Error&) {
      // a hole in the ids: stays ""
    }
  }
  return xgrammar::TokenizerInfo(vocab, xgrammar::VocabType::RAW, static_cast<int>(vocab_size),
                                 std::vector<int32_t>{});
}

}  // namespace

ToolCallStyle tool_call_style(std::string_view chat_template) {
  return chat_template.find("<function=") != std::string_view::npos ? ToolCallStyle::kXml
                                                                    : ToolCallStyle::kJson;
}

ReplyStart chat_reply_start(std::string_view prompt) {
  const size_t end = prompt.find_last_not_of(" \t\r\n");
  if (end == std::string_view::npos) return ReplyStart::kMayThink;
  const std::string_view text = prompt.substr(0, end + 1);
  if (text.ends_with(kThinkOpen)) return ReplyStart::kInThink;
  if (text.ends_with(kThinkClose)) return ReplyStart::kAnswer;  // thinking turned off
  return ReplyStart::kMayThink;
}

struct StructuredOutput::Impl {
  Impl(const Tokenizer& tokenizer, int64_t vocab_size, ToolCallStyle style_)
      : info(tokenizer_info(tokenizer, vocab_size)),
        compiler(info, /*max_threads=*/2, /*cache_enabled=*/true, kCacheBytes),
        style(style_) {}
  xgrammar::TokenizerInfo info;
  mutable std::mutex mutex;  // one compile at a time: each uses the compiler's threads
  mutable xgrammar::GrammarCompiler compiler;
  ToolCallStyle style;
};

StructuredOutput::StructuredOutput(const Tokenizer& tokenizer, int64_t vocab_size,
                                   ToolCallStyle style)
    : impl_(std::make_unique<Impl>(tokenizer, vocab_size, style)) {}

StructuredOutput::~StructuredOutput() = default;

std::string StructuredOutput::structural_tag(std::string_view response_format, ReplyStart start,
                                             const std::string& where) const {
  return format_tag(response_format, start, where).tag;
}

StructuredOutput::FormatTag StructuredOutput::format_tag(std::string_view response_format,
                                                         ReplyStart start,
                                                         const std::string& where) const {
  std::string error;
  const auto format = parse_bounded_json(response_format, JsonBounds{}, &error);
  if (!format) fail(where, error);
  FormatContext context{impl_->style, {}};
  Json answer = answer_format(*format, context, where);
  if (answer.is_null()) return {};
  if (start != ReplyStart::kAnswer) answer = sequence({reasoning(start), std::move(answer)});
  return {Json{{"type", "structural_tag"}, {"format", std::move(answer)}}.dump(),
          context.strict_where};
}

std::unique_ptr<GrammarConstraint> StructuredOutput::constraint(std::string_view response_format,
                                                                ReplyStart start,
                                                                std::span<const int32_t> stop_ids,
                                                                const std::string& where) const {
  const FormatTag format = format_tag(response_format, start, where);
  if (format.tag.empty()) return nullptr;
  // The grammar is made here on every call (milliseconds), so that its warnings are seen each
  // time; the token masks, the costly part, come from the compiler's cache.
  std::optional<xgrammar::Grammar> grammar;
  std::optional<xgrammar::CompiledGrammar> compiled;
  try {
    XgrammarWarnings warnings;
    auto made = xgrammar::Grammar::FromStructuralTag(format.tag, impl_->info);
    if (auto* made_error = std::get_if<xgrammar::StructuralTagError>(&made)) {
      fail(where,
           xgrammar_message(std::visit([](const auto& e) { return e.what(); }, *made_error)));
    }
    if (!format.strict_where.empty() && !warnings.messages().empty()) {
      fail(format.strict_where,
           warnings.messages().front() +
               ": xgrammar cannot hold a reply to it (\"strict\": false accepts the schema so)");
    }
    grammar = std::move(std::get<xgrammar::Grammar>(made));
    std::lock_guard lock(impl_->mutex);
    compiled = impl_->compiler.CompileGrammar(*grammar);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    fail(where, xgrammar_message(e.what()));
  }
  return std::make_unique<XgrammarConstraint>(*compiled, stop_ids);
}

}  // namespace qhx
