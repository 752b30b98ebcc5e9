#include "chat/chat_template.h"

#include "tokenizer/tokenizer.h"
#include "util/bounded_json.h"
#include "util/error.h"
#include "util/utf8.h"

namespace qhx {

namespace {

using jinja::Dict;
using jinja::Value;
using Json = nlohmann::ordered_json;

// Names transformers reads a message's reasoning from; the first is what templates read.
constexpr const char* kReasoningFields[] = {"reasoning_content", "thinking", "reasoning"};

// One message as transformers hands it to the template: keys holding null dropped, and
// reasoning copied to "thinking" (first) and "reasoning_content".
Value prepare_message(const Json& message, const std::string& where) {
  if (!message.is_object()) fail(where, "each message must be a JSON object");
  Dict d;
  for (const auto& [k, v] : message.items()) {
    if (!v.is_null()) d.items.emplace_back(Value::string(k), jinja::from_json(v));
  }
  const Value* reasoning = nullptr;
  for (const char* field : kReasoningFields) {
    if ((reasoning = d.find(std::string_view(field)))) break;
  }
  if (!reasoning) return Value::make_dict(std::move(d));
  // Built in one pass (the keys are a JSON object's, so unique): Dict::set looks each key up
  // from the start, and a message may carry 100,000s of keys.
  const Value r = *reasoning;
  Dict aliased;
  aliased.items.reserve(d.items.size() + 2);
  aliased.items.emplace_back(Value::string("thinking"), r);
  bool has_reasoning_content = false;
  for (auto& [k, v] : d.items) {
    if (k.s == "thinking") {
      aliased.items[0].second = std::move(v);
      continue;
    }
    if (k.s == "reasoning_content") {
      has_reasoning_content = true;
      v = r;
    }
    aliased.items.emplace_back(std::move(k), std::move(v));
  }
  if (!has_reasoning_content) aliased.items.emplace_back(Value::string("reasoning_content"), r);
  return Value::make_dict(std::move(aliased));
}

}  // namespace

ChatTemplate::ChatTemplate(std::string source, std::string origin,
                           std::vector<std::pair<std::string, std::string>> special_tokens)
    : template_(source, std::move(origin)), special_tokens_(std::move(special_tokens)) {}

ChatTemplate::ChatTemplate(std::string source, std::string origin, std::string bos_token,
                           std::string eos_token)
    : ChatTemplate(std::move(source), std::move(origin), [&] {
        std::vector<std::pair<std::string, std::string>> tokens;
        if (!bos_token.empty()) tokens.emplace_back("bos_token", std::move(bos_token));
        if (!eos_token.empty()) tokens.emplace_back("eos_token", std::move(eos_token));
        return tokens;
      }()) {}

ChatTemplate ChatTemplate::from_tokenizer(const Tokenizer& tokenizer, std::string origin) {
  if (tokenizer.chat_template().empty()) fail(origin, "the tokenizer has no chat template");
  return ChatTemplate(tokenizer.chat_template(), std::move(origin),
                      tokenizer.special_token_strings());
}

std::string ChatTemplate::render(const ChatTemplateInputs& inputs,
                                 const jinja::Limits& limits) const {
  const std::string& origin = template_.origin();
  if (!inputs.messages.is_array() || inputs.messages.empty()) {
    fail(origin, "messages: cannot apply a chat template to an empty conversation");
  }
  if (!inputs.tools.is_null() && !inputs.tools.is_array()) {
    fail(origin, "tools: expected an array of JSON schemas");
  }
  std::vector<Value> messages;
  for (size_t k = 0; k < inputs.messages.size(); ++k) {
    messages.push_back(prepare_message(inputs.messages[k], "messages[" + std::to_string(k) + "]"));
  }
  std::vector<std::pair<std::string, Value>> vars;
  vars.emplace_back("messages", Value::make_list(std::move(messages)));
  vars.emplace_back("tools", jinja::from_json(inputs.tools));
  vars.emplace_back("documents", Value::none());
  vars.emplace_back("add_generation_prompt", Value::boolean(inputs.add_generation_prompt));
  for (const auto& [name, text] : special_tokens_) vars.emplace_back(name, Value::string(text));
  if (inputs.enable_thinking) {
    vars.emplace_back("enable_thinking", Value::boolean(*inputs.enable_thinking));
  }
  if (!inputs.extra_context.is_object()) fail(origin, "extra context: expected a JSON object");
  for (const auto& [name, v] : inputs.extra_context.items()) {
    if (name == "messages" || name == "tools" || name == "documents" ||
        name == "add_generation_prompt") {
      fail(origin, "extra context: '" + name + "' is set by its own input");
    }
    vars.emplace_back(name, jinja::from_json(v));
  }
  return template_.render(vars, limits);
}

ChatTemplateInputs parse_chat_request(std::string_view json, const std::string& where) {
  std::string error;
  std::optional<nlohmann::ordered_json> parsed = parse_bounded_json(json, JsonBounds{}, &error);
  if (!parsed) fail(where, error);
  nlohmann::ordered_json request = std::move(*parsed);
  if (!request.is_object()) fail(where, "expected a JSON object with \"messages\"");
  for (const auto& [key, value] : request.items()) {
    if (key != "messages" && key != "tools" && key != "chat_template_kwargs") {
      fail(where, "unknown key '" + key +
                      "' (expected \"messages\", \"tools\" and \"chat_template_kwargs\")");
    }
  }
  if (!request.contains("messages")) fail(where, "missing \"messages\"");
  ChatTemplateInputs inputs;
  inputs.messages = std::move(request["messages"]);
  if (!inputs.messages.is_array()) fail(where + ": messages", "expected an array");
  if (request.contains("tools")) inputs.tools = std::move(request["tools"]);
  if (request.contains("chat_template_kwargs")) {
    // apply_chat_template(**kwargs): its own arguments by name, the rest template variables.
    const nlohmann::ordered_json& kwargs = request["chat_template_kwargs"];
    const std::string at = where + ": chat_template_kwargs";
    if (!kwargs.is_object()) fail(at, "expected a JSON object");
    for (const auto& [name, value] : kwargs.items()) {
      if (name == "add_generation_prompt") {
        if (!value.is_boolean()) fail(at + "." + name, "expected true or false");
        inputs.add_generation_prompt = value.get<bool>();
      } else if (name == "enable_thinking" && value.is_boolean()) {
        inputs.enable_thinking = value.get<bool>();
      } else if (name == "messages" || name == "tools" || name == "documents") {
        fail(at + "." + name, "not a keyword argument here (\"" + name + "\" is its own input)");
      }
    }
    // The rest are template variables: taken whole (a key at a time, an ordered_json object
    // looks each up from the start: 100,000s of them would take minutes).
    inputs.extra_context = std::move(request["chat_template_kwargs"]);
    inputs.extra_context.erase("add_generation_prompt");
    if (inputs.enable_thinking) inputs.extra_context.erase("enable_thinking");
  }
  return inputs;
}

}  // namespace qhx
