// Structured output: the formats a reply can be held to (OpenAI's response_format, tool calls,
// a GBNF or Lark grammar, a regex) compiled with xgrammar into token constraints over one model's
// vocabulary (docs/structured_output.md).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>

#include "runtime/token_constraint.h"
#include "tokenizer/tokenizer.h"

namespace qhx {

// Where the reply a constraint holds begins.
enum class ReplyStart {
  kAnswer,    // a completion: the format from the first token
  kMayThink,  // a chat reply: a <think> block may come first, free, then "\n\n" and the format
  kInThink,   // the prompt left <think> open: free text to </think>, then "\n\n" and the format
};

// How the model's chat template writes tool calls: Qwen3's JSON ({"name": .., "arguments": ..})
// or Qwen3.5's XML (<function=name><parameter=key>value</parameter></function>).
enum class ToolCallStyle { kJson, kXml };
ToolCallStyle tool_call_style(std::string_view chat_template);

// Where a chat reply starts after the rendered prompt (or its last few tokens' text): inside a
// <think> block it opened, past one it closed (thinking turned off), or before the reply.
ReplyStart chat_reply_start(std::string_view prompt);

// A TokenConstraint that can be reset and that says what it allows, for tests and benchmarks.
class GrammarConstraint : public TokenConstraint {
 public:
  virtual void reset() = 0;
  // Whether the text so far plus `text` is still on the grammar's path (does not advance).
  virtual bool accepts_text(std::string_view text) const = 0;
};

// The compiler of one model's constraints. Compiled grammars are cached (keyed by their text);
// safe to use from several threads.
class StructuredOutput {
 public:
  // vocab_size: the model's rows of logits (ids the tokenizer lacks are never allowed).
  StructuredOutput(const Tokenizer& tokenizer, int64_t vocab_size, ToolCallStyle style);
  ~StructuredOutput();
  StructuredOutput(const StructuredOutput&) = delete;
  StructuredOutput& operator=(const StructuredOutput&) = delete;

  // The constraint for an OpenAI-shaped response_format (JSON text), or nullptr for
  // {"type": "text"}. The types: "json_object"; "json_schema" ({"json_schema": {"name",
  // "schema", "strict"}}); "grammar" ({"grammar": text, "syntax": "gbnf" (default) | "lark"});
  // "regex" ({"pattern"}); "structural_tag" (xgrammar's {"format": ...}); "tool_calls"
  // ({"tools": OpenAI tools, "parallel": bool}: one call of one of them, or several in a row with
  // parallel). `stop_ids` end the reply once the format is complete (none: it ends there).
  // A schema is held exactly unless its "strict" (json_schema's, or a tool function's) is false:
  // one with a keyword xgrammar would not enforce (uniqueItems, not, if/then, multipleOf on
  // numbers, ...) is refused then, and accepted without it with "strict": false. Recursion through
  // $ref is unrolled 12 levels deep. Throws Error naming the field: "<where>.json_schema.schema:
  // ...".
  std::unique_ptr<GrammarConstraint> constraint(std::string_view response_format, ReplyStart start,
                                                std::span<const int32_t> stop_ids,
                                                const std::string& where = "response_format") const;

  // The structural tag (xgrammar's JSON) a response_format becomes; "" for text.
  std::string structural_tag(std::string_view response_format, ReplyStart start,
                             const std::string& where = "response_format") const;

 private:
  struct FormatTag {
    std::string tag;           // "" for text
    std::string strict_where;  // the field of the first schema held strictly, if any
  };
  FormatTag format_tag(std::string_view response_format, ReplyStart start,
                       const std::string& where) const;

  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace qhx
