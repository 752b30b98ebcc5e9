// A chat answer's raw text split the way OpenAI-compatible servers for Qwen split it: the
// <think>…</think> block into `reasoning_content`, <tool_call>…</tool_call> blocks (Qwen3's JSON
// style and Qwen3.5's XML style) into `tool_calls`, the rest into `content`. Pure functions over
// text, so that streamed and whole answers come from the same code (docs/server.md).
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace qhx::server {

struct OutputFormat {
  bool reasoning = true;    // split a <think> block off into reasoning
  bool think_open = false;  // the prompt ends inside a <think> block (prompt_opens_think)
  bool tool_calls = false;  // the request has tools: parse <tool_call> blocks
  nlohmann::json tools;     // the request's tools: their schemas type XML-style parameters
};

// Whether a rendered chat prompt leaves a <think> block open for the model to go on with.
bool prompt_opens_think(std::string_view prompt);

struct ToolCall {
  std::string name;
  std::string arguments;  // a JSON object, as text (OpenAI's form)
};

// One classified piece of the answer.
struct OutputDelta {
  enum class Kind { kReasoning, kContent, kToolCall };
  Kind kind = Kind::kContent;
  std::string text;  // kReasoning, kContent
  ToolCall call;     // kToolCall
};

// Splits text fed piece by piece (as tokens come). Text that may still turn out to be a tag, and
// a whole <tool_call> block until it closes, are held back; finish() tells what is left.
class OutputParser {
 public:
  explicit OutputParser(OutputFormat format);

  std::vector<OutputDelta> push(std::string_view piece);
  std::vector<OutputDelta> finish();  // the text is over

  bool saw_think() const { return saw_think_; }  // a reasoning block was opened
  size_t tool_call_count() const { return n_calls_; }

 private:
  enum class State { kStart, kReasoningStart, kReasoning, kAfterThink, kContent, kToolCall };
  void run(bool final, std::vector<OutputDelta>& out);
  void emit(OutputDelta::Kind kind, std::string text, std::vector<OutputDelta>& out);

  OutputFormat format_;
  State state_;
  std::string held_;  // not yet classified
  std::string gap_;   // whitespace before the open <tool_call>: dropped if the call parses
  bool strip_leading_space_ = false;  // right after a parsed call
  bool saw_think_ = false;
  size_t n_calls_ = 0;
};

// The whole answer at once: the same parser, fed the whole text.
struct ChatOutput {
  bool has_reasoning = false;
  std::string reasoning;
  std::string content;
  std::vector<ToolCall> tool_calls;
};
ChatOutput parse_chat_output(std::string_view text, const OutputFormat& format);

// The id of a request's `index`th tool call: unique per request id, the same streamed or not.
std::string tool_call_id(std::string_view request_id, size_t index);

// "tool_calls" when the model called a tool and was not cut off, else the stop reason's name.
const char* chat_finish_reason(bool length, size_t n_tool_calls);

// The answer's `message`: role, content (null when empty beside tool calls), reasoning_content
// (when a <think> block was opened), tool_calls (when there are any).
nlohmann::json assistant_message(const ChatOutput& output, std::string_view request_id);

// A streamed chunk's `delta` for one piece; `call_index` counts the request's tool calls.
nlohmann::json delta_message(const OutputDelta& delta, size_t call_index,
                             std::string_view request_id);

}  // namespace qhx::server
