// The split of a chat answer into reasoning, content and tool calls (src/server/chat_output.h):
// both tool call styles, malformed calls left as text, <think> opened by the prompt or by the
// model, and the streamed split — fed in every way of cutting the text — equal to the whole one.
#include "server/chat_output.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace qhx::server {
namespace {

using Json = nlohmann::json;

OutputFormat format(bool reasoning, bool think_open, bool tools) {
  OutputFormat f;
  f.reasoning = reasoning;
  f.think_open = think_open;
  f.tool_calls = tools;
  return f;
}

const OutputFormat kPlain = format(true, false, false);
const OutputFormat kTools = format(true, false, true);

const std::string kTwoJsonCalls =
    "Let me look.\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"zone\": \"CET\", "
    "\"city\": \"Paris\", \"days\": 2}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", "
    "\"arguments\": {}}\n</tool_call>";

TEST(ChatOutput, TextWithoutTagsIsContent) {
  for (const OutputFormat& f : {kPlain, kTools, format(false, false, false)}) {
    const ChatOutput out = parse_chat_output("  Hello\n world <b>\n", f);
    EXPECT_FALSE(out.has_reasoning);
    EXPECT_EQ(out.reasoning, "");
    EXPECT_EQ(out.content, "  Hello\n world <b>\n");
    EXPECT_TRUE(out.tool_calls.empty());
  }
  EXPECT_EQ(parse_chat_output("", kTools).content, "");
}

TEST(ChatOutput, ThinkOpenedByTheModel) {
  const ChatOutput out = parse_chat_output(
      "<think>\nFirst, Genesis.\nThen Exodus.\n\n</think>\n\nIt is Seth.", kPlain);
  EXPECT_TRUE(out.has_reasoning);
  EXPECT_EQ(out.reasoning, "First, Genesis.\nThen Exodus.");
  EXPECT_EQ(out.content, "It is Seth.");
  // Only at the start: a <think> later in the text is text.
  const ChatOutput later = parse_chat_output("Seth. <think>x</think>", kPlain);
  EXPECT_FALSE(later.has_reasoning);
  EXPECT_EQ(later.content, "Seth. <think>x</think>");
}

TEST(ChatOutput, ThinkOpenedByThePrompt) {
  EXPECT_TRUE(prompt_opens_think("<|im_start|>assistant\n<think>\n"));
  EXPECT_TRUE(prompt_opens_think("<|im_start|>assistant\n<think>"));
  EXPECT_FALSE(prompt_opens_think("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
  EXPECT_FALSE(prompt_opens_think("<|im_start|>assistant\n"));
  EXPECT_FALSE(prompt_opens_think(""));

  const OutputFormat open = format(true, true, false);
  const ChatOutput out = parse_chat_output("Enos was Seth's son.\n</think>\n\nSeth.", open);
  EXPECT_TRUE(out.has_reasoning);
  EXPECT_EQ(out.reasoning, "Enos was Seth's son.");
  EXPECT_EQ(out.content, "Seth.");
  // An empty block (the model closes at once).
  const ChatOutput empty = parse_chat_output("\n</think>\n\nSeth.", open);
  EXPECT_TRUE(empty.has_reasoning);
  EXPECT_EQ(empty.reasoning, "");
  EXPECT_EQ(empty.content, "Seth.");
}

TEST(ChatOutput, UnclosedThinkIsAllReasoning) {
  const ChatOutput out = parse_chat_output("<think>\nStill counting the </thi", kPlain);
  EXPECT_TRUE(out.has_reasoning);
  EXPECT_EQ(out.reasoning, "Still counting the </thi");
  EXPECT_EQ(out.content, "");
  const ChatOutput open = parse_chat_output("And so <tool_call>", format(true, true, true));
  EXPECT_EQ(open.reasoning, "And so <tool_call>");
  EXPECT_TRUE(open.tool_calls.empty());
  // Message: reasoning_content present, content an empty string (no tool calls).
  const Json m = assistant_message(out, "chatcmpl-1");
  EXPECT_EQ(m["reasoning_content"], "Still counting the </thi");
  EXPECT_EQ(m["content"], "");
}

TEST(ChatOutput, ReasoningOffLeavesTheTextAlone) {
  const std::string text = "<think>\nhm\n</think>\n\nSeth.";
  const ChatOutput out = parse_chat_output(text, format(false, false, false));
  EXPECT_FALSE(out.has_reasoning);
  EXPECT_EQ(out.content, text);
  EXPECT_FALSE(assistant_message(out, "x").contains("reasoning_content"));
  EXPECT_EQ(parse_chat_output("hm\n</think>\nSeth.", format(false, true, false)).content,
            "hm\n</think>\nSeth.");
}

TEST(ChatOutput, JsonStyleToolCalls) {
  const ChatOutput out = parse_chat_output(kTwoJsonCalls, kTools);
  EXPECT_EQ(out.content, "Let me look.");
  ASSERT_EQ(out.tool_calls.size(), 2u);
  EXPECT_EQ(out.tool_calls[0].name, "get_weather");
  // The model's key order is kept.
  EXPECT_EQ(out.tool_calls[0].arguments, R"({"zone":"CET","city":"Paris","days":2})");
  EXPECT_EQ(out.tool_calls[1].name, "get_time");
  EXPECT_EQ(out.tool_calls[1].arguments, "{}");
  // Arguments given as JSON text, or left out.
  const ChatOutput text_args = parse_chat_output(
      "<tool_call>\n{\"name\": \"f\", \"arguments\": \"{\\\"a\\\": [1]}\"}\n</tool_call>"
      "<tool_call>{\"name\": \"g\"}</tool_call>",
      kTools);
  ASSERT_EQ(text_args.tool_calls.size(), 2u);
  EXPECT_EQ(text_args.tool_calls[0].arguments, R"({"a":[1]})");
  EXPECT_EQ(text_args.tool_calls[1].arguments, "{}");
  EXPECT_EQ(text_args.content, "");
}

TEST(ChatOutput, XmlStyleToolCalls) {
  OutputFormat f = kTools;
  f.tools = Json::parse(R"([{"type": "function", "function": {"name": "find_verse",
      "parameters": {"type": "object", "properties": {"book": {"type": "string"},
      "chapter": {"type": "integer"}, "code": {"type": "string"}}}}}])");
  const std::string text =
      "<tool_call>\n<function=find_verse>\n<parameter=book>\nGenesis\n</parameter>\n"
      "<parameter=chapter>\n5\n</parameter>\n<parameter=code>\n0042\n</parameter>\n"
      "<parameter=flags>\n[true, null]\n</parameter>\n<parameter=note>\ntwo\nlines\n"
      "</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=list_books>\n"
      "</function>\n</tool_call>";
  const ChatOutput out = parse_chat_output(text, f);
  EXPECT_EQ(out.content, "");
  ASSERT_EQ(out.tool_calls.size(), 2u);
  EXPECT_EQ(out.tool_calls[0].name, "find_verse");
  // Typed string by the schema; JSON where it parses; else a string.
  EXPECT_EQ(out.tool_calls[0].arguments,
            R"({"book":"Genesis","chapter":5,"code":"0042","flags":[true,null],)"
            R"("note":"two\nlines"})");
  EXPECT_EQ(out.tool_calls[1].name, "list_books");
  EXPECT_EQ(out.tool_calls[1].arguments, "{}");
  // Without the schema "0042" is not JSON either (a leading zero), but "5" is.
  f.tools = nullptr;
  const ChatOutput bare = parse_chat_output(text, f);
  EXPECT_EQ(Json::parse(bare.tool_calls[0].arguments)["code"], "0042");
  EXPECT_EQ(Json::parse(bare.tool_calls[0].arguments)["chapter"], 5);
}

TEST(ChatOutput, MalformedCallsStayText) {
  const std::vector<std::string> malformed = {
      "<tool_call>\nnot json\n</tool_call>",
      "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": }\n</tool_call>",
      "<tool_call>\n{\"arguments\": {}}\n</tool_call>",
      "<tool_call>\n{\"name\": \"f\", \"arguments\": [1]}\n</tool_call>",
      "<tool_call>\n<function=f>\n<parameter=a>\n1\n</function>\n</tool_call>",
      "<tool_call>\n<function=f>\n</function>\ntrailing\n</tool_call>",
      "<tool_call>\n<function=>\n</function>\n</tool_call>",
      "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}",  // cut off
  };
  for (const std::string& call : malformed) {
    const std::string text = "Before.\n" + call + "\nafter";
    const ChatOutput out = parse_chat_output(text, kTools);
    EXPECT_TRUE(out.tool_calls.empty()) << call;
    EXPECT_EQ(out.content, text) << call;
  }
  // A good call beside a bad one: the good one parses, the bad one is text.
  const ChatOutput mixed = parse_chat_output(
      "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>\n<tool_call>\nbad\n"
      "</tool_call>",
      kTools);
  ASSERT_EQ(mixed.tool_calls.size(), 1u);
  EXPECT_EQ(mixed.content, "<tool_call>\nbad\n</tool_call>");
  // Without tools in the request nothing is parsed.
  EXPECT_EQ(parse_chat_output(kTwoJsonCalls, kPlain).content, kTwoJsonCalls);
}

TEST(ChatOutput, ReasoningThenToolCall) {
  const ChatOutput out = parse_chat_output(
      "<think>\nA call is needed.\n</think>\n\n<tool_call>\n{\"name\": \"f\", \"arguments\": "
      "{\"x\": 1}}\n</tool_call>",
      kTools);
  EXPECT_EQ(out.reasoning, "A call is needed.");
  EXPECT_EQ(out.content, "");
  ASSERT_EQ(out.tool_calls.size(), 1u);
  // Calls inside the reasoning are the model thinking, not calling.
  const ChatOutput thought =
      parse_chat_output("<think><tool_call>{\"name\": \"f\"}</tool_call></think>ok", kTools);
  EXPECT_TRUE(thought.tool_calls.empty());
  EXPECT_EQ(thought.reasoning, "<tool_call>{\"name\": \"f\"}</tool_call>");
  EXPECT_EQ(thought.content, "ok");
}

TEST(ChatOutput, MessageAndDeltaJson) {
  const ChatOutput out = parse_chat_output(kTwoJsonCalls, kTools);
  const Json m = assistant_message(out, "chatcmpl-00ab");
  EXPECT_EQ(m["role"], "assistant");
  EXPECT_EQ(m["content"], "Let me look.");
  EXPECT_FALSE(m.contains("reasoning_content"));
  ASSERT_EQ(m["tool_calls"].size(), 2u);
  const Json& call = m["tool_calls"][0];
  EXPECT_EQ(call["id"], "call_00ab_0");
  EXPECT_EQ(call["type"], "function");
  EXPECT_EQ(call["function"]["name"], "get_weather");
  EXPECT_EQ(Json::parse(call["function"]["arguments"].get<std::string>())["city"], "Paris");
  EXPECT_EQ(m["tool_calls"][1]["id"], "call_00ab_1");
  // Calls and no text: content is null.
  ChatOutput calls_only = out;
  calls_only.content.clear();
  EXPECT_TRUE(assistant_message(calls_only, "chatcmpl-1")["content"].is_null());
  // Nothing at all: an empty string.
  EXPECT_EQ(assistant_message(ChatOutput{}, "chatcmpl-1")["content"], "");

  OutputDelta d{OutputDelta::Kind::kToolCall, "", out.tool_calls[1]};
  const Json delta = delta_message(d, 1, "chatcmpl-00ab");
  ASSERT_EQ(delta["tool_calls"].size(), 1u);
  EXPECT_EQ(delta["tool_calls"][0]["index"], 1);
  EXPECT_EQ(delta["tool_calls"][0]["id"], m["tool_calls"][1]["id"]);
  EXPECT_EQ(delta["tool_calls"][0]["function"], m["tool_calls"][1]["function"]);
  EXPECT_EQ(delta_message({OutputDelta::Kind::kReasoning, "r", {}}, 0, "x"),
            Json({{"reasoning_content", "r"}}));
  EXPECT_EQ(delta_message({OutputDelta::Kind::kContent, "c", {}}, 0, "x"),
            Json({{"content", "c"}}));

  EXPECT_STREQ(chat_finish_reason(false, 2), "tool_calls");
  EXPECT_STREQ(chat_finish_reason(false, 0), "stop");
  EXPECT_STREQ(chat_finish_reason(true, 2), "length");
}

// What a stream of deltas adds up to.
ChatOutput add_up(OutputParser& parser, const std::vector<std::string>& pieces) {
  std::vector<OutputDelta> deltas;
  for (const std::string& piece : pieces) {
    for (OutputDelta& d : parser.push(piece)) deltas.push_back(std::move(d));
  }
  for (OutputDelta& d : parser.finish()) deltas.push_back(std::move(d));
  ChatOutput out;
  out.has_reasoning = parser.saw_think();
  for (const OutputDelta& d : deltas) {
    EXPECT_TRUE(d.kind == OutputDelta::Kind::kToolCall || !d.text.empty()) << "an empty delta";
    if (d.kind == OutputDelta::Kind::kReasoning) out.reasoning += d.text;
    if (d.kind == OutputDelta::Kind::kContent) out.content += d.text;
    if (d.kind == OutputDelta::Kind::kToolCall) out.tool_calls.push_back(d.call);
  }
  return out;
}

void expect_same(const ChatOutput& got, const ChatOutput& want, const std::string& what) {
  EXPECT_EQ(got.has_reasoning, want.has_reasoning) << what;
  EXPECT_EQ(got.reasoning, want.reasoning) << what;
  EXPECT_EQ(got.content, want.content) << what;
  ASSERT_EQ(got.tool_calls.size(), want.tool_calls.size()) << what;
  for (size_t i = 0; i < got.tool_calls.size(); ++i) {
    EXPECT_EQ(got.tool_calls[i].name, want.tool_calls[i].name) << what;
    EXPECT_EQ(got.tool_calls[i].arguments, want.tool_calls[i].arguments) << what;
  }
}

TEST(ChatOutput, StreamedPiecesAddUpToTheWhole) {
  const std::vector<std::pair<std::string, OutputFormat>> cases = {
      {"<think>\nFirst.\n\n</think>\n\nSeth. <think>no</think>", kPlain},
      {"  \n<think>\nFirst.\n</think>\n\n" + kTwoJsonCalls + "\n\n Done.\n", kTools},
      {"Reasoning.\n</think>\n\nText\n\n<tool_call>\n<function=f>\n<parameter=a>\n1\n"
       "</parameter>\n</function>\n</tool_call> tail <tool_call>bad</tool_call> \n",
       format(true, true, true)},
      {"Cut <thi", kPlain},
      {"<thin", kPlain},
      {"<think>\nunclosed </thi", kTools},
      {"x <tool_call>\n{\"name\": \"f\"", kTools},
      {"<tool_call>\n{\"name\": \"f\"}\n</tool_call>   ", kTools},
      {"a </tool_call> <tool_ b", kTools},
      {"<think>\nhm\n</think>\n\nSeth.", format(false, false, true)},
  };
  for (const auto& [text, f] : cases) {
    const ChatOutput whole = parse_chat_output(text, f);
    // Every way of cutting it in two, then pieces of each size up to 8.
    for (size_t cut = 0; cut <= text.size(); ++cut) {
      OutputParser parser(f);
      expect_same(add_up(parser, {text.substr(0, cut), text.substr(cut)}), whole,
                  text + " cut at " + std::to_string(cut));
    }
    for (size_t size = 1; size <= 8; ++size) {
      std::vector<std::string> pieces;
      for (size_t at = 0; at < text.size(); at += size) pieces.push_back(text.substr(at, size));
      OutputParser parser(f);
      expect_same(add_up(parser, pieces), whole, text + " in pieces of " + std::to_string(size));
    }
  }
}

// Held-back text is only what may still be a tag: the rest goes out as it comes.
TEST(ChatOutput, StreamingHoldsBackOnlyPossibleTags) {
  OutputParser parser(kTools);
  auto deltas = parser.push("<think>\nPond");
  ASSERT_EQ(deltas.size(), 1u);
  EXPECT_EQ(deltas[0].kind, OutputDelta::Kind::kReasoning);
  EXPECT_EQ(deltas[0].text, "Pond");
  deltas = parser.push("er.\n</th");
  ASSERT_EQ(deltas.size(), 1u);
  EXPECT_EQ(deltas[0].text, "er.");
  deltas = parser.push("ink>\n\nHello <tool_");
  ASSERT_EQ(deltas.size(), 1u);
  EXPECT_EQ(deltas[0].kind, OutputDelta::Kind::kContent);
  EXPECT_EQ(deltas[0].text, "Hello");
  EXPECT_TRUE(parser.push("call>\n{\"name\": \"f\", \"arguments\": {}}\n").empty());
  deltas = parser.push("</tool_call>\nMore");
  ASSERT_EQ(deltas.size(), 2u);
  EXPECT_EQ(deltas[0].kind, OutputDelta::Kind::kToolCall);
  EXPECT_EQ(deltas[0].call.name, "f");
  EXPECT_EQ(deltas[1].text, "More");
  EXPECT_EQ(parser.tool_call_count(), 1u);
  EXPECT_TRUE(parser.finish().empty());
}

}  // namespace
}  // namespace qhx::server
