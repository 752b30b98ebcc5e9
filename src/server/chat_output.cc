#include "server/chat_output.h"

#include <algorithm>
#include <optional>
#include <utility>

namespace qhx::server {
namespace {

using Json = nlohmann::json;
using OrderedJson = nlohmann::ordered_json;  // arguments keep the model's key order

constexpr std::string_view kThinkOpen = "<think>";
constexpr std::string_view kThinkClose = "</think>";
constexpr std::string_view kCallOpen = "<tool_call>";
constexpr std::string_view kCallClose = "</tool_call>";
constexpr std::string_view kFunctionOpen = "<function=";
constexpr std::string_view kFunctionClose = "</function>";
constexpr std::string_view kParameterOpen = "<parameter=";
constexpr std::string_view kParameterClose = "</parameter>";
constexpr std::string_view kSpace = " \t\r\n";

std::string_view trim(std::string_view s) {
  const size_t begin = s.find_first_not_of(kSpace);
  if (begin == std::string_view::npos) return {};
  return s.substr(begin, s.find_last_not_of(kSpace) - begin + 1);
}

// How many characters at the end of `text` to hold back while streaming: the longest proper
// prefix of `tag` it ends with, and the run of `spaces` before that (dropped if the tag follows).
size_t held_back(std::string_view text, std::string_view tag, std::string_view spaces) {
  size_t keep = 0;
  for (size_t n = std::min(text.size(), tag.size() - 1); n > 0; --n) {
    if (text.substr(text.size() - n) == tag.substr(0, n)) {
      keep = n;
      break;
    }
  }
  while (keep < text.size() &&
         spaces.find(text[text.size() - keep - 1]) != std::string_view::npos) {
    ++keep;
  }
  return keep;
}

std::string dump(const OrderedJson& j) {
  return j.dump(-1, ' ', false, OrderedJson::error_handler_t::replace);
}

// An XML-style parameter's value: a string where the tool's schema says so, else JSON when it
// parses as JSON (numbers, booleans, objects), else the text as a string.
OrderedJson parameter_value(const std::string& function, const std::string& parameter,
                            std::string_view value, const Json& tools) {
  if (tools.is_array()) {
    for (const Json& tool : tools) {
      const Json& f = tool.is_object() && tool.contains("function") ? tool["function"] : tool;
      if (!f.is_object() || f.value("name", Json()) != function) continue;
      const auto params = f.find("parameters");
      if (params == f.end() || !params->is_object()) continue;
      const auto properties = params->find("properties");
      if (properties == params->end() || !properties->is_object()) continue;
      const auto schema = properties->find(parameter);
      if (schema != properties->end() && schema->is_object() &&
          schema->value("type", Json()) == "string") {
        return std::string(value);
      }
    }
  }
  OrderedJson parsed = OrderedJson::parse(value, nullptr, /*allow_exceptions=*/false);
  return parsed.is_discarded() ? OrderedJson(std::string(value)) : parsed;
}

// Qwen3.5's <function=NAME><parameter=ARG>VALUE</parameter>…</function>.
std::optional<ToolCall> parse_xml_call(std::string_view body, const Json& tools) {
  body.remove_prefix(kFunctionOpen.size());
  const size_t name_end = body.find('>');
  if (name_end == std::string_view::npos) return std::nullopt;
  ToolCall call{std::string(trim(body.substr(0, name_end))), ""};
  if (call.name.empty()) return std::nullopt;
  body.remove_prefix(name_end + 1);
  OrderedJson arguments = OrderedJson::object();
  for (;;) {
    body = trim(body);
    if (body.starts_with(kFunctionClose)) {
      if (!trim(body.substr(kFunctionClose.size())).empty()) return std::nullopt;
      break;
    }
    if (!body.starts_with(kParameterOpen)) return std::nullopt;
    body.remove_prefix(kParameterOpen.size());
    const size_t key_end = body.find('>');
    const size_t value_end = body.find(kParameterClose);
    if (key_end == std::string_view::npos || value_end == std::string_view::npos ||
        value_end < key_end) {
      return std::nullopt;
    }
    const std::string key(trim(body.substr(0, key_end)));
    if (key.empty()) return std::nullopt;
    // The template writes "\n" + value + "\n" between the tags.
    std::string_view value = body.substr(key_end + 1, value_end - key_end - 1);
    if (value.starts_with('\n')) value.remove_prefix(1);
    if (value.ends_with('\n')) value.remove_suffix(1);
    arguments[key] = parameter_value(call.name, key, value, tools);
    body.remove_prefix(value_end + kParameterClose.size());
  }
  call.arguments = dump(arguments);
  return call;
}

// Qwen3's (hermes) {"name": NAME, "arguments": {...}}; arguments may also come as JSON text.
std::optional<ToolCall> parse_json_call(std::string_view body) {
  const OrderedJson j = OrderedJson::parse(body, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("name") || !j["name"].is_string()) return std::nullopt;
  ToolCall call{j["name"].get<std::string>(), ""};
  if (call.name.empty()) return std::nullopt;
  OrderedJson arguments = j.value("arguments", OrderedJson::object());
  if (arguments.is_null()) arguments = OrderedJson::object();
  if (arguments.is_string()) {
    arguments = OrderedJson::parse(arguments.get<std::string>(), nullptr, false);
  }
  if (!arguments.is_object()) return std::nullopt;
  call.arguments = dump(arguments);
  return call;
}

// The text between <tool_call> and </tool_call>, in either style; nothing if it is neither.
std::optional<ToolCall> parse_tool_call(std::string_view body, const Json& tools) {
  body = trim(body);
  if (body.starts_with('{')) return parse_json_call(body);
  if (body.starts_with(kFunctionOpen)) return parse_xml_call(body, tools);
  return std::nullopt;
}

Json call_json(const ToolCall& call, std::string_view request_id, size_t index) {
  return {{"id", tool_call_id(request_id, index)},
          {"type", "function"},
          {"function", {{"name", call.name}, {"arguments", call.arguments}}}};
}

}  // namespace

bool prompt_opens_think(std::string_view prompt) {
  const size_t end = prompt.find_last_not_of(kSpace);
  return end != std::string_view::npos && prompt.substr(0, end + 1).ends_with(kThinkOpen);
}

OutputParser::OutputParser(OutputFormat format)
    : format_(std::move(format)), state_(State::kStart) {}

std::vector<OutputDelta> OutputParser::push(std::string_view piece) {
  held_.append(piece);
  std::vector<OutputDelta> out;
  run(false, out);
  return out;
}

std::vector<OutputDelta> OutputParser::finish() {
  std::vector<OutputDelta> out;
  run(true, out);
  return out;
}

void OutputParser::emit(OutputDelta::Kind kind, std::string text, std::vector<OutputDelta>& out) {
  if (text.empty()) return;
  if (!out.empty() && out.back().kind == kind) {
    out.back().text += text;
  } else {
    out.push_back({kind, std::move(text), {}});
  }
}

// Classifies as much of held_ as can be told; `final`: no more text will come.
void OutputParser::run(bool final, std::vector<OutputDelta>& out) {
  using Kind = OutputDelta::Kind;
  for (;;) {
    switch (state_) {
      case State::kStart: {
        if (!format_.reasoning) {
          state_ = State::kContent;
          break;
        }
        if (format_.think_open) {
          saw_think_ = true;
          state_ = State::kReasoningStart;
          break;
        }
        // Qwen3 in thinking mode opens the block itself, first thing.
        const size_t first = held_.find_first_not_of(kSpace);
        const std::string_view rest =
            first == std::string::npos ? std::string_view() : std::string_view(held_).substr(first);
        if (rest.starts_with(kThinkOpen)) {
          held_.erase(0, first + kThinkOpen.size());
          saw_think_ = true;
          state_ = State::kReasoningStart;
          break;
        }
        if (!final && kThinkOpen.starts_with(rest)) return;
        state_ = State::kContent;
        break;
      }
      case State::kReasoningStart:
      case State::kAfterThink: {
        // Newlines that follow a tag are the tag's (the templates strip them when re-rendering).
        const size_t first = held_.find_first_not_of('\n');
        held_.erase(0, first);
        if (held_.empty()) return;
        state_ = state_ == State::kReasoningStart ? State::kReasoning : State::kContent;
        break;
      }
      case State::kReasoning: {
        const size_t close = held_.find(kThinkClose);
        if (close != std::string::npos) {
          std::string reasoning = held_.substr(0, close);
          while (!reasoning.empty() && reasoning.back() == '\n') reasoning.pop_back();
          emit(Kind::kReasoning, std::move(reasoning), out);
          held_.erase(0, close + kThinkClose.size());
          state_ = State::kAfterThink;
          break;
        }
        const size_t keep = final ? 0 : held_back(held_, kThinkClose, "\n");
        emit(Kind::kReasoning, held_.substr(0, held_.size() - keep), out);
        held_.erase(0, held_.size() - keep);
        return;
      }
      case State::kContent: {
        if (!format_.tool_calls) {
          emit(Kind::kContent, std::move(held_), out);
          held_.clear();
          return;
        }
        if (strip_leading_space_) {
          held_.erase(0, held_.find_first_not_of(kSpace));
          if (held_.empty()) return;
          strip_leading_space_ = false;
        }
        const size_t open = held_.find(kCallOpen);
        if (open != std::string::npos) {
          // Whitespace between the text and the call goes with the call.
          const size_t text_end = std::string_view(held_).substr(0, open).find_last_not_of(kSpace);
          const size_t gap_begin = text_end == std::string::npos ? 0 : text_end + 1;
          emit(Kind::kContent, held_.substr(0, gap_begin), out);
          gap_ = held_.substr(gap_begin, open - gap_begin);
          held_.erase(0, open + kCallOpen.size());
          state_ = State::kToolCall;
          break;
        }
        const size_t keep = final ? 0 : held_back(held_, kCallOpen, kSpace);
        emit(Kind::kContent, held_.substr(0, held_.size() - keep), out);
        held_.erase(0, held_.size() - keep);
        return;
      }
      case State::kToolCall: {
        const size_t close = held_.find(kCallClose);
        if (close == std::string::npos) {
          if (!final) return;
          // Cut off inside the call: it stays text.
          emit(Kind::kContent, gap_ + std::string(kCallOpen) + held_, out);
          gap_.clear();
          held_.clear();
          state_ = State::kContent;
          return;
        }
        const std::string_view body = std::string_view(held_).substr(0, close);
        if (std::optional<ToolCall> call = parse_tool_call(body, format_.tools)) {
          out.push_back({Kind::kToolCall, "", std::move(*call)});
          ++n_calls_;
          strip_leading_space_ = true;
        } else {
          // Malformed: the client sees what the model wrote.
          emit(Kind::kContent,
               gap_ + std::string(kCallOpen) + std::string(body) + std::string(kCallClose), out);
        }
        gap_.clear();
        held_.erase(0, close + kCallClose.size());
        state_ = State::kContent;
        break;
      }
    }
  }
}

ChatOutput parse_chat_output(std::string_view text, const OutputFormat& format) {
  OutputParser parser(format);
  std::vector<OutputDelta> deltas = parser.push(text);
  for (OutputDelta& d : parser.finish()) deltas.push_back(std::move(d));
  ChatOutput output;
  output.has_reasoning = parser.saw_think();
  for (OutputDelta& d : deltas) {
    switch (d.kind) {
      case OutputDelta::Kind::kReasoning:
        output.reasoning += d.text;
        break;
      case OutputDelta::Kind::kContent:
        output.content += d.text;
        break;
      case OutputDelta::Kind::kToolCall:
        output.tool_calls.push_back(std::move(d.call));
        break;
    }
  }
  return output;
}

std::string tool_call_id(std::string_view request_id, size_t index) {
  const size_t dash = request_id.rfind('-');
  const std::string_view unique =
      dash == std::string_view::npos ? request_id : request_id.substr(dash + 1);
  return "call_" + std::string(unique) + "_" + std::to_string(index);
}

const char* chat_finish_reason(bool length, size_t n_tool_calls) {
  if (length) return "length";
  return n_tool_calls > 0 ? "tool_calls" : "stop";
}

Json assistant_message(const ChatOutput& output, std::string_view request_id) {
  Json message = {{"role", "assistant"}};
  message["content"] =
      output.content.empty() && !output.tool_calls.empty() ? Json(nullptr) : Json(output.content);
  if (output.has_reasoning) message["reasoning_content"] = output.reasoning;
  if (!output.tool_calls.empty()) {
    Json calls = Json::array();
    for (size_t i = 0; i < output.tool_calls.size(); ++i) {
      calls.push_back(call_json(output.tool_calls[i], request_id, i));
    }
    message["tool_calls"] = std::move(calls);
  }
  return message;
}

Json delta_message(const OutputDelta& delta, size_t call_index, std::string_view request_id) {
  switch (delta.kind) {
    case OutputDelta::Kind::kReasoning:
      return {{"reasoning_content", delta.text}};
    case OutputDelta::Kind::kContent:
      return {{"content", delta.text}};
    case OutputDelta::Kind::kToolCall: {
      Json call = call_json(delta.call, request_id, call_index);
      call["index"] = call_index;
      return {{"tool_calls", Json::array({std::move(call)})}};
    }
  }
  return Json::object();
}

}  // namespace qhx::server
