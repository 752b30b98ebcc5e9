// Fuzz target: any bytes as a chat template, rendered for a fixed small conversation with small
// limits. Parsing and rendering may fail only with qhx::Error; never crash, hang or blow memory.
#include <cstddef>
#include <cstdint>
#include <string>

#include "chat/chat_template.h"
#include "util/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const qhx::ChatTemplateInputs inputs = [] {
    qhx::ChatTemplateInputs in;
    in.messages = nlohmann::ordered_json::parse(
        R"([{"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Hi 😀"}]},
            {"role": "assistant", "content": "<think>x</think>ok",
             "tool_calls": [{"function": {"name": "f", "arguments": {"a": 1}}}]},
            {"role": "tool", "content": "{\"r\": 2}"}])");
    in.tools =
        nlohmann::ordered_json::parse(R"([{"type": "function", "function": {"name": "f"}}])");
    in.enable_thinking = false;
    return in;
  }();
  qhx::jinja::Limits limits;
  limits.max_steps = 200000;
  limits.max_output_bytes = 1 << 20;
  limits.max_alloc_bytes = 64 << 20;
  limits.max_items = 1 << 16;
  try {
    const qhx::ChatTemplate chat(std::string(reinterpret_cast<const char*>(data), size), "fuzz",
                                 "<s>", "</s>");
    chat.render(inputs, limits);
  } catch (const qhx::Error&) {
  }
  return 0;
}
