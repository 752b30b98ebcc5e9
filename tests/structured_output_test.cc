// Structured output's constraints over the genuine Qwen3 and Qwen3.5 vocabularies: documents
// walked token by token through the masks, the reasoning a chat reply may give first, tool calls in
// both templates' styles, and the errors a bad format gets.
#include "grammar/structured_output.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "util/error.h"

namespace qhx {
namespace {

constexpr int64_t kQwen3Vocab = 151936;  // the models' rows of logits (the tokenizer has fewer)
constexpr int64_t kQwen35Vocab = 248320;

const Tokenizer& qwen3() {
  static const Tokenizer t = Tokenizer::load("tests/fixtures/tokenizer/qwen3");
  return t;
}

const Tokenizer& qwen35() {
  static const Tokenizer t = Tokenizer::load("tests/fixtures/tokenizer/qwen3_5");
  return t;
}

int32_t id_of(const Tokenizer& t, const char* token) {
  const auto id = t.token_to_id(token);
  EXPECT_TRUE(id.has_value()) << token;
  return id.value_or(0);
}

bool allows(TokenConstraint& c, int64_t vocab, int32_t token) {
  std::vector<uint32_t> words(static_cast<size_t>((vocab + 31) / 32));
  if (!c.allowed_next(words)) return true;
  return ((words[static_cast<size_t>(token) / 32] >> (token % 32)) & 1u) != 0;
}

// Feeds `text`'s tokens through the masks: the index of the first one refused, or -1.
int first_refused(TokenConstraint& c, const Tokenizer& t, int64_t vocab, const std::string& text) {
  const std::vector<int32_t> ids = t.encode(text);
  for (size_t i = 0; i < ids.size(); ++i) {
    if (!allows(c, vocab, ids[i])) return static_cast<int>(i);
    c.accept(ids[i]);
  }
  return -1;
}

std::string schema_format(const nlohmann::ordered_json& schema) {
  return nlohmann::ordered_json{
      {"type", "json_schema"},
      {"json_schema", {{"name", "t"}, {"schema", schema}, {"strict", true}}}}
      .dump();
}

const nlohmann::ordered_json kPerson = {{"type", "object"},
                                        {"properties",
                                         {{"name", {{"type", "string"}}},
                                          {"age", {{"type", "integer"}, {"minimum", 0}}},
                                          {"role", {{"enum", {"admin", "user"}}}}}},
                                        {"required", {"name", "age"}}};

TEST(StructuredOutput, ASchemasDocumentPassesTokenByTokenThenOnlyTheStopId) {
  const StructuredOutput so(qwen3(), kQwen3Vocab, ToolCallStyle::kJson);
  const int32_t im_end = id_of(qwen3(), "<|im_end|>");
  const std::vector<int32_t> stops = {im_end};
  auto c = so.constraint(schema_format(kPerson), ReplyStart::kAnswer, stops);
  ASSERT_NE(c, nullptr);
  EXPECT_FALSE(allows(*c, kQwen3Vocab, im_end));  // not before the document is complete
  EXPECT_EQ(first_refused(*c, qwen3(), kQwen3Vocab, R"({"name": "Ann", "age": 7, "role": "user"})"),
            -1);
  EXPECT_FALSE(c->finished());
  // Complete: the stop id, and nothing else (no more text after the closing brace).
  std::vector<uint32_t> words(static_cast<size_t>((kQwen3Vocab + 31) / 32));
  ASSERT_TRUE(c->allowed_next(words));
  int allowed = 0;
  for (int64_t id = 0; id < kQwen3Vocab; ++id) allowed += (words[id / 32] >> (id % 32)) & 1u;
  EXPECT_EQ(allowed, 1);
  c->accept(im_end);
  EXPECT_TRUE(c->finished());
}

TEST(StructuredOutput, WhatTheSchemaForbidsIsMaskedAndRefused) {
  const StructuredOutput so(qwen3(), kQwen3Vocab, ToolCallStyle::kJson);
  const std::vector<int32_t> stops = {id_of(qwen3(), "<|im_end|>")};
  for (const char* bad :
       {R"({"name": 7})", R"({"age": 1, "name": "A"})", R"({"name": "A", "age": -1})",
        R"({"name": "A", "age": 1, "role": "root"})", R"([1])"}) {
    auto c = so.constraint(schema_format(kPerson), ReplyStart::kAnswer, stops);
    const int at = first_refused(*c, qwen3(), kQwen3Vocab, bad);
    EXPECT_GE(at, 0) << bad;
    if (at >= 0) {
      const int32_t token = qwen3().encode(bad)[static_cast<size_t>(at)];
      EXPECT_THROW(c->accept(token), Error) << bad;
    }
  }
}

TEST(StructuredOutput, SpecialTokensAndIdsPastTheTokenizerAreNeverText) {
  // Qwen3.5's vocabulary: 248,320 rows of logits, fewer tokens; json_object takes any object.
  const StructuredOutput so(qwen35(), kQwen35Vocab, ToolCallStyle::kXml);
  const int32_t im_end = id_of(qwen35(), "<|im_end|>");
  const std::vector<int32_t> stops = {im_end};
  auto c = so.constraint(R"({"type": "json_object"})", ReplyStart::kAnswer, stops);
  EXPECT_EQ(first_refused(*c, qwen35(), kQwen35Vocab, R"({"a": [1, {"b": null}], "c": ")"), -1);
  EXPECT_FALSE(allows(*c, kQwen35Vocab, im_end));
  EXPECT_FALSE(allows(*c, kQwen35Vocab, id_of(qwen35(), "<|im_start|>")));
  EXPECT_FALSE(allows(*c, kQwen35Vocab, static_cast<int32_t>(kQwen35Vocab - 1)));
  EXPECT_TRUE(allows(*c, kQwen35Vocab, qwen35().encode("x")[0]));
}

TEST(StructuredOutput, AChatReplyReasonsFreelyFirst) {
  const StructuredOutput so(qwen3(), kQwen3Vocab, ToolCallStyle::kJson);
  const std::vector<int32_t> stops = {id_of(qwen3(), "<|im_end|>")};
  const std::string format = schema_format(kPerson);
  const std::string answer = R"({"name": "A", "age": 1})";
  // The prompt left <think> open: any text, its end, then the answer.
  auto in = so.constraint(format, ReplyStart::kInThink, stops);
  EXPECT_EQ(first_refused(*in, qwen3(), kQwen3Vocab,
                          "Let me see: {\"name\" 7 is wrong.\n</think>\n\n" + answer),
            -1);
  // A reply that may think: with a block or without one.
  auto may = so.constraint(format, ReplyStart::kMayThink, stops);
  EXPECT_EQ(first_refused(*may, qwen3(), kQwen3Vocab, "<think>\nhm\n</think>\n\n" + answer), -1);
  may = so.constraint(format, ReplyStart::kMayThink, stops);
  EXPECT_EQ(first_refused(*may, qwen3(), kQwen3Vocab, answer), -1);
  // A completion does not.
  auto none = so.constraint(format, ReplyStart::kAnswer, stops);
  EXPECT_EQ(first_refused(*none, qwen3(), kQwen3Vocab, "<think>"), 0);
  // Where the rendered prompt leaves the reply.
  EXPECT_EQ(chat_reply_start("<|im_start|>assistant\n<think>\n"), ReplyStart::kInThink);
  EXPECT_EQ(chat_reply_start("assistant\n<think>\n\n</think>\n\n"), ReplyStart::kAnswer);
  EXPECT_EQ(chat_reply_start("<|im_start|>assistant\n"), ReplyStart::kMayThink);
}

const nlohmann::ordered_json kWeatherTool = {
    {"type", "function"},
    {"function",
     {{"name", "get_weather"},
      {"parameters",
       {{"type", "object"},
        {"properties", {{"city", {{"type", "string"}}}, {"days", {{"type", "integer"}}}}},
        {"required", {"city"}}}}}}};

std::string tool_calls_format(bool parallel) {
  return nlohmann::ordered_json{
      {"type", "tool_calls"}, {"tools", {kWeatherTool}}, {"parallel", parallel}}
      .dump();
}

TEST(StructuredOutput, ToolCallsAsQwen3WritesThem) {
  const StructuredOutput so(qwen3(), kQwen3Vocab, ToolCallStyle::kJson);
  const std::vector<int32_t> stops = {id_of(qwen3(), "<|im_end|>")};
  const std::string call =
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": "
      "2}}\n</tool_call>";
  auto c = so.constraint(tool_calls_format(false), ReplyStart::kAnswer, stops);
  EXPECT_EQ(first_refused(*c, qwen3(), kQwen3Vocab, call), -1);
  EXPECT_TRUE(allows(*c, kQwen3Vocab, stops[0]));
  EXPECT_FALSE(c->accepts_text("\n<tool_call>"));  // one call only
  auto two = so.constraint(tool_calls_format(true), ReplyStart::kAnswer, stops);
  EXPECT_EQ(first_refused(*two, qwen3(), kQwen3Vocab, call + "\n" + call), -1);
  auto wrong = so.constraint(tool_calls_format(false), ReplyStart::kAnswer, stops);
  EXPECT_GE(first_refused(*wrong, qwen3(), kQwen3Vocab,
                          "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>"),
            0);
  auto text = so.constraint(tool_calls_format(false), ReplyStart::kAnswer, stops);
  EXPECT_EQ(first_refused(*text, qwen3(), kQwen3Vocab, "It is sunny."), 0);
}

TEST(StructuredOutput, ToolCallsAsQwen35WritesThem) {
  const StructuredOutput so(qwen35(), kQwen35Vocab, ToolCallStyle::kXml);
  const std::vector<int32_t> stops = {id_of(qwen35(), "<|im_end|>")};
  auto c = so.constraint(tool_calls_format(false), ReplyStart::kAnswer, stops);
  EXPECT_EQ(first_refused(*c, qwen35(), kQwen35Vocab,
                          "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
                          "</parameter>\n<parameter=days>\n2\n</parameter>\n</function>\n"
                          "</tool_call>"),
            -1);
  EXPECT_TRUE(allows(*c, kQwen35Vocab, stops[0]));
  // Which style a template writes.
  EXPECT_EQ(tool_call_style("...<tool_call>\\n<function=' + tool_call.name + '>..."),
            ToolCallStyle::kXml);
  EXPECT_EQ(tool_call_style(qwen3().chat_template()), ToolCallStyle::kJson);
  EXPECT_EQ(tool_call_style(qwen35().chat_template()), ToolCallStyle::kXml);
}

TEST(StructuredOutput, GrammarsRegexesAndText) {
  const StructuredOutput so(qwen3(), kQwen3Vocab, ToolCallStyle::kJson);
  const std::vector<int32_t> stops = {id_of(qwen3(), "<|im_end|>")};
  // GBNF as llama.cpp writes it: rules, alternatives, character classes, repetition.
  auto gbnf = so.constraint(
      R"({"type": "grammar", "grammar": "root ::= answer (\", \" answer)*\nanswer ::= (\"yes\" | \"no\") [0-9]{1,2}"})",
      ReplyStart::kAnswer, stops);
  EXPECT_EQ(first_refused(*gbnf, qwen3(), kQwen3Vocab, "yes1, no22"), -1);
  EXPECT_FALSE(gbnf->accepts_text("3"));
  auto lark = so.constraint(
      R"({"type": "grammar", "syntax": "lark", "grammar": "start: (\"a\" | \"b\")+"})",
      ReplyStart::kAnswer, stops);
  EXPECT_EQ(first_refused(*lark, qwen3(), kQwen3Vocab, "abba"), -1);
  EXPECT_FALSE(lark->accepts_text("c"));
  auto regex = so.constraint(R"({"type": "regex", "pattern": "[A-Z]{3}-[0-9]{2}"})",
                             ReplyStart::kAnswer, stops);
  EXPECT_EQ(first_refused(*regex, qwen3(), kQwen3Vocab, "ABC-12"), -1);
  EXPECT_TRUE(allows(*regex, kQwen3Vocab, stops[0]));
  EXPECT_EQ(so.constraint(R"({"type": "text"})", ReplyStart::kAnswer, stops), nullptr);
}

TEST(StructuredOutput, WithoutStopIdsTheReplyEndsWithTheFormat) {
  const StructuredOutput so(qwen3(), kQwen3Vocab, ToolCallStyle::kJson);
  auto c = so.constraint(R"({"type": "regex", "pattern": "(yes|no)\\."})", ReplyStart::kAnswer, {});
  EXPECT_EQ(first_refused(*c, qwen3(), kQwen3Vocab, "yes."), -1);
  EXPECT_TRUE(c->finished());
}

std::string nested(int depth) {
  return depth == 0 ? R"({"v": 1})" : R"({"v": 1, "kids": [)" + nested(depth - 1) + "]}";
}

TEST(StructuredOutput, RecursiveSchemasAreBoundedOrRefused) {
  const StructuredOutput so(qwen3(), kQwen3Vocab, ToolCallStyle::kJson);
  const std::vector<int32_t> stops = {id_of(qwen3(), "<|im_end|>")};
  const std::string tree =
      schema_format({{"$defs",
                      {{"node",
                        {{"type", "object"},
                         {"properties",
                          {{"v", {{"type", "integer"}}},
                           {"kids", {{"type", "array"}, {"items", {{"$ref", "#/$defs/node"}}}}}}},
                         {"required", {"v"}}}}}},
                     {"$ref", "#/$defs/node"}});
  // Twelve $ref hops: the root's into the node, then eleven levels of children.
  auto deep = so.constraint(tree, ReplyStart::kAnswer, stops);
  EXPECT_EQ(first_refused(*deep, qwen3(), kQwen3Vocab, nested(11)), -1);
  EXPECT_TRUE(allows(*deep, kQwen3Vocab, stops[0]));
  auto deeper = so.constraint(tree, ReplyStart::kAnswer, stops);
  EXPECT_FALSE(deeper->accepts_text(nested(12)));
  EXPECT_TRUE(deeper->accepts_text(nested(11).substr(0, 40)));
  // "#" itself, through properties: the same bound.
  const std::string list = schema_format({{"type", "object"},
                                          {"properties", {{"next", {{"$ref", "#"}}}}},
                                          {"additionalProperties", false}});
  auto chain = so.constraint(list, ReplyStart::kAnswer, stops);
  std::string doc = "{}";
  for (int i = 0; i < 12; ++i) doc = R"({"next": )" + doc + "}";
  EXPECT_TRUE(chain->accepts_text(doc));
  EXPECT_FALSE(chain->accepts_text(R"({"next": )" + doc + "}"));
}

void expect_error(const StructuredOutput& so, const std::string& format, const std::string& start) {
  try {
    so.constraint(format, ReplyStart::kAnswer, {});
    ADD_FAILURE() << format << " was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).substr(0, start.size()), start) << e.what();
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
  }
}

TEST(StructuredOutput, ABadFormatIsAnErrorNamingItsField) {
  const StructuredOutput so(qwen3(), kQwen3Vocab, ToolCallStyle::kJson);
  expect_error(so, "{", "response_format: invalid JSON");
  expect_error(so, "[]", "response_format: must be an object");
  expect_error(so, R"({"type": "yaml"})", "response_format.type: \"yaml\" is not one of");
  expect_error(so, R"({"type": "json_schema"})", "response_format.json_schema: is missing");
  expect_error(so, R"({"type": "json_schema", "json_schema": {"name": "x"}})",
               "response_format.json_schema.schema: is missing");
  expect_error(so, R"({"type": "json_schema", "json_schema": {"schema": {"$ref": "#/nope"}}})",
               "response_format: ");
  // Recursion that cannot end: refused, not left to run to max_tokens.
  expect_error(so,
               R"({"type": "json_schema", "json_schema": {"schema": {"type": "object",
                   "properties": {"next": {"$ref": "#"}}, "required": ["next"]}}})",
               "response_format.json_schema.schema: admits no value within 12 levels of $ref");
  // What xgrammar would not enforce is refused in a strict schema, and dropped on request.
  const std::string unique =
      R"({"type": "object", "properties": {"tags": {"type": "array", "uniqueItems": true}}})";
  expect_error(
      so, R"({"type": "json_schema", "json_schema": {"schema": )" + unique + "}}",
      "response_format.json_schema.schema.properties.tags: \"uniqueItems\" is not enforced");
  EXPECT_NE(so.constraint(R"({"type": "json_schema", "json_schema": {"strict": false, "schema": )" +
                              unique + "}}",
                          ReplyStart::kAnswer, {}),
            nullptr);
  expect_error(
      so, R"({"type": "tool_calls", "tools": [{"type": "function", "function":
                   {"name": "f", "parameters": {"type": "object", "properties": {"n":
                   {"type": "number", "multipleOf": 0.5}}}}}]})",
      "response_format.tools[0].function.parameters: multipleOf is not supported for type:number");
  expect_error(so, R"({"type": "grammar", "grammar": "root ::= foo"})",
               "response_format: EBNF parser error");
  expect_error(so, R"({"type": "grammar", "grammar": "x", "syntax": "peg"})",
               "response_format.syntax: must be");
  expect_error(so, R"({"type": "tool_calls", "tools": []})", "response_format.tools: must be");
  expect_error(so, R"({"type": "tool_calls", "tools": [{"type": "function", "function": {}}]})",
               "response_format.tools[0].function.name: is missing");
}

}  // namespace
}  // namespace qhx
