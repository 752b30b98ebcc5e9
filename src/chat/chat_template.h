// Chat templates rendered exactly as transformers' apply_chat_template(..., tokenize=False) does:
// the same variables, the same message preprocessing, the same jinja2 configuration.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "chat/jinja.h"

namespace qhx {

class Tokenizer;

// JSON with its key order kept: templates iterate dicts and tojson prints them in that order.
struct ChatTemplateInputs {
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  nlohmann::ordered_json tools;  // null or an array
  bool add_generation_prompt = true;
  std::optional<bool> enable_thinking;  // passed only when set, so `is defined` sees the same
  nlohmann::ordered_json extra_context = nlohmann::ordered_json::object();  // other kwargs

  // Sets enable_thinking over whatever the request's kwargs said (a non-boolean one included).
  void set_enable_thinking(bool on) {
    enable_thinking = on;
    extra_context.erase("enable_thinking");
  }
};

// A request {"messages": [...], "tools": [...], "chat_template_kwargs": {...}} (tools and kwargs
// optional) as JSON text. The kwargs are what apply_chat_template(**kwargs) takes:
// add_generation_prompt and enable_thinking set those inputs, any other name becomes a template
// variable (add_vision_id, ...). Any other key, or a "messages" that is not an array, throws Error
// naming `where`.
ChatTemplateInputs parse_chat_request(std::string_view json, const std::string& where);

class ChatTemplate {
 public:
  // `special_tokens`: the named special tokens (bos_token, eos_token, pad_token, ...) that
  // transformers passes to the template; an empty value means the tokenizer has none.
  ChatTemplate(std::string source, std::string origin,
               std::vector<std::pair<std::string, std::string>> special_tokens);
  ChatTemplate(std::string source, std::string origin, std::string bos_token,
               std::string eos_token);
  // The tokenizer's template and special tokens; throws Error if it has no template.
  static ChatTemplate from_tokenizer(const Tokenizer& tokenizer, std::string origin);

  // Throws Error "<origin>:<line>: <message>" for errors in the template (raise_exception
  // included) and "<origin>: <message>" for malformed inputs.
  std::string render(const ChatTemplateInputs& inputs, const jinja::Limits& limits = {}) const;

 private:
  jinja::Template template_;
  std::vector<std::pair<std::string, std::string>> special_tokens_;
};

}  // namespace qhx
