// Chat templates: every golden case transformers rendered (tests/fixtures/chat, and the shared
// Qwen3 chat cases with their token ids), the engine's features one by one, its errors (with
// line numbers) and limits, and `qhx template`.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>

#include "chat/chat_template.h"
#include "chat/jinja.h"
#include "support/cli_run.h"
#include "support/fixtures.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"

namespace qhx {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;

const fs::path kQwen3Dir = test::tokenizer_fixture_dir("qwen3");
const fs::path kQwen35Dir = test::tokenizer_fixture_dir("qwen3_5");

using test::read_file;

std::vector<Json> read_jsonl(const fs::path& p) {
  std::vector<Json> cases;
  std::ifstream in(p);
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) cases.push_back(Json::parse(line));
  }
  return cases;
}

const Tokenizer& qwen3_tokenizer() {
  static const Tokenizer tokenizer = Tokenizer::load(kQwen3Dir);
  return tokenizer;
}

const Tokenizer& qwen35_tokenizer() {
  static const Tokenizer tokenizer = Tokenizer::load(kQwen35Dir);
  return tokenizer;
}

// The keyword arguments of apply_chat_template a case passed besides the named inputs.
constexpr const char* kTemplateKwargs[] = {"add_vision_id"};

ChatTemplateInputs inputs_of(const Json& c) {
  ChatTemplateInputs in;
  in.messages = c.at("messages");
  if (c.contains("tools")) in.tools = c["tools"];
  in.add_generation_prompt = c.value("add_generation_prompt", true);
  if (c.contains("enable_thinking")) in.enable_thinking = c["enable_thinking"].get<bool>();
  for (const char* kwarg : kTemplateKwargs) {
    if (c.contains(kwarg)) in.extra_context[kwarg] = c[kwarg];
  }
  return in;
}

// Renders every case of tests/fixtures/chat/<name>.jsonl and compares with transformers.
void check_golden(const std::string& name, const ChatTemplate& chat) {
  const auto cases = read_jsonl(test::source_dir() / "tests/fixtures/chat" / (name + ".jsonl"));
  ASSERT_GE(cases.size(), 20u);
  for (const Json& c : cases) {
    SCOPED_TRACE(name + ": " + c.at("name").get<std::string>());
    if (c.contains("error")) {
      try {
        chat.render(inputs_of(c));
        ADD_FAILURE() << "rendered, expected the error " << c["error"];
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find(c["error"].get<std::string>()), std::string::npos)
            << e.what();
      }
    } else {
      EXPECT_EQ(chat.render(inputs_of(c)), c.at("text").get<std::string>());
    }
  }
}

TEST(ChatGolden, Qwen3Template) {
  check_golden("qwen3", ChatTemplate::from_tokenizer(qwen3_tokenizer(), "qwen3"));
}

TEST(ChatGolden, Qwen35StyleTemplate) {
  const fs::path path = test::source_dir() / "tests/fixtures/chat/qwen3_5_style.jinja";
  check_golden("qwen3_5_style", ChatTemplate(read_file(path), path.filename().string(),
                                             qwen3_tokenizer().special_token_strings()));
}

TEST(ChatGolden, FeaturesTemplate) {
  const fs::path path = test::source_dir() / "tests/fixtures/chat/features.jinja";
  check_golden("features", ChatTemplate(read_file(path), path.filename().string(),
                                        qwen3_tokenizer().special_token_strings()));
}

// The genuine checkpoints' chat cases (made by transformers): the text and, through the
// tokenizer, the ids.
void check_genuine_cases(const Tokenizer& tokenizer, const fs::path& dir, size_t at_least) {
  const ChatTemplate chat = ChatTemplate::from_tokenizer(tokenizer, dir.filename().string());
  const auto cases = read_jsonl(dir / "chat.jsonl");
  ASSERT_GE(cases.size(), at_least);
  for (const Json& c : cases) {
    SCOPED_TRACE(c.at("name").get<std::string>());
    const std::string text = chat.render(inputs_of(c));
    EXPECT_EQ(text, c.at("text").get<std::string>());
    EXPECT_EQ(tokenizer.encode(text), c.at("ids").get<std::vector<int32_t>>());
  }
}

TEST(ChatGolden, Qwen3CasesTextAndIds) {
  check_genuine_cases(qwen3_tokenizer(), kQwen3Dir, 18);
}

// Qwen3.5-0.8B's template: XML tool calls, tool responses, reasoning dropped before the last
// query, thinking off unless enable_thinking is true, content as parts, add_vision_id.
TEST(ChatGolden, Qwen35CasesTextAndIds) {
  check_genuine_cases(qwen35_tokenizer(), kQwen35Dir, 21);
}

// ---- the engine, feature by feature ----

std::string render(const std::string& source, const Json& vars = Json::object(),
                   const jinja::Limits& limits = {}) {
  const jinja::Template t(source, "t.jinja");
  std::vector<std::pair<std::string, jinja::Value>> values;
  for (const auto& [k, v] : vars.items()) values.emplace_back(k, jinja::from_json(v));
  return t.render(values, limits);
}

std::string error_of(const std::string& source, const Json& vars = Json::object(),
                     const jinja::Limits& limits = {}) {
  try {
    render(source, vars, limits);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Jinja, WhitespaceControlAsTransformersConfiguresIt) {
  // trim_blocks drops the newline after a block tag, lstrip_blocks the indent before it.
  EXPECT_EQ(render("a\n  {% if true %}\n  b\n  {% endif %}\nc\n"), "a\n  b\nc");
  EXPECT_EQ(render("x  {{- ' y ' -}}  z"), "x y z");
  EXPECT_EQ(render("a {%- if true -%} b {%- endif %}"), "ab");
  EXPECT_EQ(render("  {%+ if true %}k{% endif %}"), "  k");
  EXPECT_EQ(render("{# c #}\nv"), "v");
  EXPECT_EQ(render("{{ 1 }}\n"), "1");  // one trailing newline dropped, as jinja2 does
  EXPECT_EQ(render("{% raw %}{{ x }}{% endraw %}"), "{{ x }}");
}

TEST(Jinja, PrintsValuesAsPython) {
  EXPECT_EQ(render("{{ [1, 'a', none, true, 1.0, {'k': (1,)}] }}"),
            "[1, 'a', None, True, 1.0, {'k': (1,)}]");
  EXPECT_EQ(render("{{ 1e20 }} {{ 1e-5 }} {{ 0.1 + 0.2 }} {{ 10 / 4 }} {{ 2.0 }}"),
            "1e+20 1e-05 0.30000000000000004 2.5 2.0");
  EXPECT_EQ(render("{{ \"it's\" }}|{{ [\"it's\", 'a\"b', 'x\\ny'] }}"),
            "it's|[\"it's\", 'a\"b', 'x\\ny']");
  EXPECT_EQ(render("{{ missing }}|{{ 'a' if false }}|{{ none }}"), "||None");
}

TEST(Jinja, Arithmetic) {
  EXPECT_EQ(
      render("{{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 7.5 // 2 }} {{ 2 ** 10 }} {{ 'a' ~ 1 }}"),
      "3 -4 2 3.0 1024 a1");
  EXPECT_EQ(render("{{ 1 < 2 < 3 }} {{ 3 > 2 > 5 }} {{ 'b' in 'abc' }} {{ 4 not in [1] }}"),
            "True False True True");
  EXPECT_EQ(render("{{ [] or 'e' }} {{ 0 and 1 }} {{ not 0 }} {{ -(2) }}"), "e 0 True -2");
}

TEST(Jinja, LoopsAndLoopVariables) {
  EXPECT_EQ(render("{% for x in 'abc' %}{{ loop.index }}{{ x }}{{ loop.revindex0 }}"
                   "{{ loop.first }}{{ loop.last }}{{ loop.length }},{% endfor %}"),
            "1a2TrueFalse3,2b1FalseFalse3,3c0FalseTrue3,");
  EXPECT_EQ(render("{% for x in [1,2,3] if x != 2 %}{{ loop.index }}:{{ x }}"
                   "{{ loop.previtem }}{% endfor %}"),
            "1:12:31");
  EXPECT_EQ(render("{% for x in [] %}a{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(render("{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}{{ v }}{% endfor %}"), "a1b2");
  EXPECT_EQ(render("{% for i in range(9) %}{% if i == 1 %}{% continue %}{% endif %}"
                   "{% if i == 4 %}{% break %}{% endif %}{{ i }}{% endfor %}"),
            "023");
  // A loop body's assignments stay inside it; a namespace carries values out.
  EXPECT_EQ(render("{% set x = 1 %}{% set ns = namespace(y=0) %}{% for i in [5] %}"
                   "{% set x = i %}{% set ns.y = i %}{% endfor %}{{ x }}{{ ns.y }}"),
            "15");
}

TEST(Jinja, MacrosSetBlocksAndFilters) {
  EXPECT_EQ(
      render("{% macro m(a, b='d') %}{{ a }}-{{ b }}{% endmacro %}{{ m(1) }} {{ m(1, b=2) }}"),
      "1-d 1-2");
  EXPECT_EQ(render("{% set x %}in {{ 1 }}{% endset %}{{ x | upper }}"), "IN 1");
  EXPECT_EQ(render("{% filter upper %}ab{% endfilter %}"), "AB");
  EXPECT_EQ(
      render("{{ ' x ' | trim }}|{{ [3,1,2] | sort | join(',') }}|{{ 'aXa' | replace('X','y') }}"
             "|{{ [{'a': 1}, {'a': 2}] | map(attribute='a') | list }}"
             "|{{ [1, 2, 3] | select('odd') | list }}|{{ 2.5 | round }}|{{ '7' | int + 1 }}"),
      "x|1,2,3|aya|[1, 2]|[1, 3]|2.0|8");
  EXPECT_EQ(render("{{ {'k': 'é\"\\n', 'n': [1, 2.5]} | tojson }}"),
            "{\"k\": \"é\\\"\\n\", \"n\": [1, 2.5]}");
  EXPECT_EQ(render("{{ {'a': [1]} | tojson(indent=2) }}"), "{\n  \"a\": [\n    1\n  ]\n}");
}

TEST(Jinja, StringMethodsAndTests) {
  EXPECT_EQ(
      render(
          "{{ 'a,b,c'.split(',', 1) }} {{ '  x '.strip() }} {{ 'xxhixx'.lstrip('x') }}"
          " {{ 'hello'.startswith(('he', 'z')) }} {{ 'ab'.upper() }} {{ '{} {}'.format(1, 'b') }}"),
      "['a', 'b,c'] x hixx True AB 1 b");
  EXPECT_EQ(render("{{ 'héllo'[1] }}{{ 'héllo'[::-1] }}{{ 'héllo' | length }}"), "éolléh5");
  EXPECT_EQ(render("{{ x is defined }} {{ 1 is integer }} {{ 1.0 is float }} {{ {} is mapping }} "
                   "{{ 'a' is not string }} {{ 3 is divisibleby 3 }} {{ none is none }}"),
            "False True True True False True True");
  EXPECT_EQ(render("{{ d.key }}|{{ d['key'] }}|{{ d.other is defined }}|{{ d.get('z', 0) }}",
                   {{"d", {{"key", "v"}}}}),
            "v|v|False|0");
}

// ---- errors: origin and line, never a crash ----

TEST(JinjaErrors, NameTheOriginAndLine) {
  EXPECT_EQ(error_of("a\nb\n{{ x | nosuch }}"), "t.jinja:3: unknown filter 'nosuch'");
  EXPECT_EQ(error_of("{% if true %}\n{{ raise_exception('stop here') }}\n{% endif %}"),
            "t.jinja:2: stop here");
  EXPECT_EQ(error_of("\n\n{% for x in [1] %}"),
            "t.jinja:3: unexpected end of template, expected 'else' or 'endfor'");
  EXPECT_EQ(error_of("{{ 'a' + 1 }}"),
            "t.jinja:1: TypeError: can only concatenate str (not \"int\") to str");
  EXPECT_EQ(error_of("\n{{ x.y }}"), "t.jinja:2: 'x' is undefined");
  EXPECT_EQ(error_of("{{ {'a': 1}.b.c }}"), "t.jinja:1: 'dict object' has no attribute 'b'");
  EXPECT_EQ(error_of("{{ [1].append(2) }}"),
            "t.jinja:1: SecurityError: access to attribute 'append' of 'list' object is unsafe.");
  EXPECT_EQ(error_of("{% foo %}"), "t.jinja:1: unknown tag 'foo'");
  EXPECT_EQ(error_of("{{ 1 / 0 }}"), "t.jinja:1: ZeroDivisionError: division by zero");
  EXPECT_EQ(error_of("{% break %}"), "t.jinja:1: 'break' outside of a loop");
  EXPECT_NE(error_of("{{ 'abc").find("t.jinja:1: "), std::string::npos);
}

TEST(JinjaErrors, HostileTemplatesHitLimits) {
  jinja::Limits small;
  small.max_steps = 10000;
  small.max_output_bytes = 1000;
  EXPECT_NE(error_of("{% for i in range(100000) %}{% endfor %}", {}, small).find("step limit"),
            std::string::npos);
  EXPECT_NE(error_of("{% for i in range(100) %}0123456789abcdef{% endfor %}", {}, small)
                .find("output exceeds"),
            std::string::npos);
  EXPECT_NE(error_of("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}").find("recursion too deep"),
            std::string::npos);
  EXPECT_NE(error_of("{{ 'x' * 100000000000 }}").find("too large"), std::string::npos);
  EXPECT_NE(error_of("{{ " + std::string(5000, '(') + std::string(5000, ')') + " }}")
                .find("nested too deeply"),
            std::string::npos);
}

TEST(ChatTemplate, EnableThinkingOnlyWhenGiven) {
  const ChatTemplate chat("{{ enable_thinking is defined }}{{ tools is none }}{{ eos_token }}", "t",
                          "", "<eos>");
  ChatTemplateInputs in;
  in.messages = Json::array({{{"role", "user"}, {"content", "hi"}}});
  EXPECT_EQ(chat.render(in), "FalseTrue<eos>");
  in.enable_thinking = false;
  EXPECT_EQ(chat.render(in), "TrueTrue<eos>");
  in.messages = Json::array();
  EXPECT_THROW(chat.render(in), Error);
}

// ---- qhx template ----

test::CliRun qhx_template(const std::string& args, const std::string& input) {
  return test::run_qhx("template " + args, input);
}

// Qwen3's cases with the flags, Qwen3.5's with every argument in "chat_template_kwargs".
TEST(ChatCli, PrintsTheRenderedTextExactly) {
  for (const Json& c : read_jsonl(kQwen3Dir / "chat.jsonl")) {
    SCOPED_TRACE(c.at("name").get<std::string>());
    Json request = {{"messages", c["messages"]}};
    if (c.contains("tools")) request["tools"] = c["tools"];
    std::string args = "--model " + kQwen3Dir.string();
    if (!c.value("add_generation_prompt", true)) args += " --no-generation-prompt";
    if (c.contains("enable_thinking")) {
      args += std::string(" --enable-thinking ") +
              (c["enable_thinking"].get<bool>() ? "true" : "false");
    }
    const test::CliRun r = qhx_template(args, request.dump());
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out, c.at("text").get<std::string>());
  }
  for (const Json& c : read_jsonl(kQwen35Dir / "chat.jsonl")) {
    SCOPED_TRACE(c.at("name").get<std::string>());
    Json request = {{"messages", c["messages"]}};
    if (c.contains("tools")) request["tools"] = c["tools"];
    Json kwargs = {{"add_generation_prompt", c.at("add_generation_prompt")}};
    for (const char* name : {"enable_thinking", "add_vision_id"}) {
      if (c.contains(name)) kwargs[name] = c[name];
    }
    request["chat_template_kwargs"] = kwargs;
    const test::CliRun r = qhx_template("--model " + kQwen35Dir.string(), request.dump());
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out, c.at("text").get<std::string>());
  }
}

TEST(ChatCli, RejectsBadInputWithOneLine) {
  const std::string model = "--model " + kQwen3Dir.string();
  for (const auto& [input, part] : std::vector<std::pair<std::string, std::string>>{
           {"{\"messages\": [], \"extra\": 1}", "unknown key 'extra'"},
           {"{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], "
            "\"chat_template_kwargs\": {\"add_generation_prompt\": 1}}",
            "stdin: chat_template_kwargs.add_generation_prompt: expected true or false"},
           {"{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], "
            "\"chat_template_kwargs\": {\"tools\": []}}",
            "chat_template_kwargs.tools: not a keyword argument here"},
           {"{\"messages\": [], \"chat_template_kwargs\": []}",
            "chat_template_kwargs: expected a JSON object"},
           {"not json", "invalid JSON"},
           {"{\"tools\": []}", "missing \"messages\""},
           {"{\"messages\": []}", "empty conversation"}}) {
    const test::CliRun r = qhx_template(model, input);
    EXPECT_EQ(r.exit_code, 1) << input;
    EXPECT_EQ(r.out, "");
    EXPECT_NE(r.err.find(part), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << r.err;
  }
}

}  // namespace
}  // namespace qhx
