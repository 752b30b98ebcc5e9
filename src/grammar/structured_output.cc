#include "grammar/structured_output.h"

#include <dlpack/dlpack.h>

#include <nlohmann/json.hpp>
#include <optional>
#include <vector>
#include <xgrammar/xgrammar.h>

#include "util/bounded_json.h"
#include "util/error.h"

namespace qhx {
namespace {

using Json = nlohmann::ordered_json;

constexpr std::string_view kThinkOpen = "<think>";
constexpr std::string_view kThinkClose = "</think>";
// What the templates put between a closed <think> block and the answer.
constexpr std::string_view kAfterThink = "\n\n";
// Whitespace allowed between JSON tokens: a line break and indentation, as pretty-printed JSON has
// (llama.cpp's schema grammars allow as much). Without a bound a model can stall in whitespace.
constexpr int kMaxJsonWhitespace = 20;
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
  return {{"type", "tag"}, {"begin", std::move(begin)}, {"content", std::move(content)},
          {"end", std::move(end)}};
}

Json const_string(std::string_view value) {
  return {{"type", "const_string"}, {"value", value}};
}

Json json_schema(Json schema, std::string_view style = "json") {
  return {{"type", "json_schema"},
          {"json_schema", std::move(schema)},
          {"style", style},
          {"max_whitespace_cnt", kMaxJsonWhitespace}};
}

Json sequence(std::vector<Json> elements) {
  return {{"type", "sequence"}, {"elements", std::move(elements)}};
}

// One call of `tool` (an OpenAI tool object) as the template writes it.
Json tool_call_tag(const Json& tool, ToolCallStyle style, const std::string& where) {
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
  if (style == ToolCallStyle::kXml) {
    return tag("<tool_call>\n<function=" + name + ">\n", json_schema(parameters, "qwen_xml"),
               "\n</function>\n</tool_call>");
  }
  return tag("<tool_call>\n{\"name\": \"" + name + "\", \"arguments\": ", json_schema(parameters),
             "}\n</tool_call>");
}

// The format of the answer itself (xgrammar's structural-tag format object); null for text.
Json answer_format(const Json& format, ToolCallStyle style, const std::string& where) {
  if (!format.is_object()) fail(where, "must be an object");
  const std::string& type = string_member(format, "type", where);
  if (type == "text") return nullptr;
  if (type == "json_object") {
    return json_schema({{"type", "object"}, {"additionalProperties", true}});
  }
  if (type == "json_schema") {
    const Json& spec = member(format, "json_schema", where);
    if (!spec.is_object()) fail(where + ".json_schema", "must be an object");
    if (const auto it = spec.find("strict"); it != spec.end() && !it->is_boolean()) {
      fail(where + ".json_schema.strict", "must be a boolean");
    }
    const Json& schema = member(spec, "schema", where + ".json_schema");
    if (!schema.is_object() && !schema.is_boolean()) {
      fail(where + ".json_schema.schema", "must be a JSON schema (an object)");
    }
    return json_schema(schema);
  }
  if (type == "grammar") {
    const std::string& grammar = string_member(format, "grammar", where);
    std::string syntax = "gbnf";
    if (format.contains("syntax")) syntax = string_member(format, "syntax", where);
    if (syntax != "gbnf" && syntax != "lark") fail(where + ".syntax", "must be \"gbnf\" or \"lark\"");
    return {{"type", "grammar"},
            {"grammar", grammar},
            {"syntax", syntax == "gbnf" ? "ebnf" : "lark"}};
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
      tags.push_back(tool_call_tag(tools[i], style, where + ".tools[" + std::to_string(i) + "]"));
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
  Json block = sequence({tag(begin, free_text, std::string(kThinkClose)), const_string(kAfterThink)});
  if (start == ReplyStart::kMayThink) return {{"type", "optional"}, {"content", block}};
  return block;
}

class XgrammarConstraint final : public GrammarConstraint {
 public:
  XgrammarConstraint(const xgrammar::CompiledGrammar& grammar, std::span<const int32_t> stop_ids)
      : matcher_(grammar,
                 stop_ids.empty() ? std::nullopt
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
  std::string error;
  const auto format = parse_bounded_json(response_format, JsonBounds{}, &error);
  if (!format) fail(where, error);
  Json answer = answer_format(*format, impl_->style, where);
  if (answer.is_null()) return "";
  if (start != ReplyStart::kAnswer) answer = sequence({reasoning(start), std::move(answer)});
  return Json{{"type", "structural_tag"}, {"format", std::move(answer)}}.dump();
}

std::unique_ptr<GrammarConstraint> StructuredOutput::constraint(std::string_view response_format,
                                                                ReplyStart start,
                                                                std::span<const int32_t> stop_ids,
                                                                const std::string& where) const {
  const std::string tag = structural_tag(response_format, start, where);
  if (tag.empty()) return nullptr;
  std::optional<xgrammar::CompiledGrammar> grammar;
  try {
    std::lock_guard lock(impl_->mutex);
    grammar = impl_->compiler.CompileStructuralTag(tag);
  } catch (const std::exception& e) {
    fail(where, xgrammar_message(e.what()));
  }
  return std::make_unique<XgrammarConstraint>(*grammar, stop_ids);
}

}  // namespace qhx
