// qhx serve as an OpenAI client meets it: a server started in-process on a free port, spoken to
// over HTTP. Answers have OpenAI's shape and the C API's tokens; streams carry the same text;
// slots serve concurrent clients, free themselves when a client hangs up, and reuse a resent
// conversation; every malformed request gets a 4xx with an OpenAI error body.
#include <atomic>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "support/server_fixture.h"
#include "util/base64.h"
#include "util/json_file.h"
#include "util/mapped_file.h"

namespace qhx::server {
namespace {

TEST_F(ServerTest, HealthAndModels) {
  start(2, 8, 1 << 20, "kjv");
  const Json h = health();
  EXPECT_EQ(h["status"], "ok");
  EXPECT_EQ(h["slots_idle"], 2);
  EXPECT_EQ(h["slots_processing"], 0);
  EXPECT_EQ(h["queue_length"], 0);
  const Json m = get("/v1/models");
  EXPECT_EQ(m["object"], "list");
  ASSERT_EQ(m["data"].size(), 1u);
  EXPECT_EQ(m["data"][0]["id"], "kjv");
  EXPECT_EQ(m["data"][0]["object"], "model");
  EXPECT_TRUE(m["data"][0]["created"].is_number_integer());
  // The alias is the model's name now; the directory's name is not.
  expect_error(post("/v1/completions", Json{{"model", "qwen3.5-kjv"}, {"prompt", "And"}}), 404,
               "model", "model_not_found");
  const auto ok =
      post("/v1/completions", Json{{"model", "kjv"}, {"prompt", "And"}, {"max_tokens", 2}});
  EXPECT_EQ(ok.first, 200) << ok.second;
}

TEST_F(ServerTest, CompletionMatchesTheCApi) {
  start();
  const std::string prompt = "And it came to pass, when the king";
  const auto [status, body] =
      post("/v1/completions",
           Json{{"prompt", prompt}, {"max_tokens", 12}, {"temperature", 0}, {"unknown_extra", 7}});
  ASSERT_EQ(status, 200) << body;
  const std::vector<int32_t> ids = tokenize(prompt);
  const qhx_generate_result want = direct(ids, 12);
  EXPECT_EQ(body["object"], "text_completion");
  EXPECT_TRUE(body["id"].is_string());
  EXPECT_TRUE(body["created"].is_number_integer());
  EXPECT_EQ(body["model"], "qwen3.5-kjv");
  ASSERT_EQ(body["choices"].size(), 1u);
  const Json& choice = body["choices"][0];
  EXPECT_EQ(choice["index"], 0);
  EXPECT_EQ(choice["text"], text_of(want));
  EXPECT_EQ(choice["finish_reason"], want.stop_reason == QHX_STOP_LENGTH ? "length" : "stop");
  expect_usage(body["usage"], static_cast<int64_t>(ids.size()), want.n_generated);
  const Json& t = body["timings"];
  EXPECT_EQ(t["prompt_n"].get<int64_t>() + t["cache_n"].get<int64_t>(),
            static_cast<int64_t>(ids.size()));
  EXPECT_EQ(t["predicted_n"], want.n_generated);
  EXPECT_TRUE(t["prompt_ms"].is_number() && t["predicted_per_second"].is_number()) << t;

  // A prompt of token ids is the same request.
  const auto by_ids =
      post("/v1/completions", Json{{"prompt", ids}, {"max_tokens", 12}, {"temperature", 0}});
  ASSERT_EQ(by_ids.first, 200) << by_ids.second;
  EXPECT_EQ(by_ids.second["choices"][0]["text"], text_of(want));
  qhx_string_free(want.text);
}

// A stop string cuts the text where it first appears and is not in it; a seed repeats a sample.
TEST_F(ServerTest, StopStringsAndSeeds) {
  start();
  const std::string prompt = "And the LORD said unto Moses,";
  const qhx_generate_result free_run = direct(tokenize(prompt), 16);
  const std::string text = text_of(free_run);
  qhx_string_free(free_run.text);
  ASSERT_GE(text.size(), 8u) << text;
  const std::string stop = text.substr(text.size() / 2, 3);
  const auto [status, body] = post(
      "/v1/completions",
      Json{{"prompt", prompt}, {"max_tokens", 16}, {"temperature", 0}, {"stop", {"@@@", stop}}});
  ASSERT_EQ(status, 200) << body;
  EXPECT_EQ(body["choices"][0]["text"], text.substr(0, text.find(stop)));
  EXPECT_EQ(body["choices"][0]["finish_reason"], "stop");

  const Json sampled = {
      {"prompt", prompt}, {"max_tokens", 12}, {"temperature", 1.5}, {"seed", 1234}};
  const auto first = post("/v1/completions", sampled);
  const auto again = post("/v1/completions", sampled);
  ASSERT_EQ(first.first, 200) << first.second;
  EXPECT_EQ(first.second["choices"][0]["text"], again.second["choices"][0]["text"]);
}

// With speculative decoding on, a greedy answer is the C API's without it, whole or streamed; the
// timings count the drafts; a sampled request is served too.
TEST_F(ServerTest, SpeculativeDecodingAnswersAsWithout) {
  ServerOptions o;
  o.speculative = "ngram";
  o.draft_max = 4;
  start(o);
  const std::string prompt =
      "And God said, Let there be light: and there was light. And God said, Let there be";
  const qhx_generate_result want = direct(tokenize(prompt), 24);
  const Json request = {{"prompt", prompt}, {"max_tokens", 24}, {"temperature", 0}};
  const auto [status, body] = post("/v1/completions", request);
  ASSERT_EQ(status, 200) << body;
  EXPECT_EQ(body["choices"][0]["text"], text_of(want));
  const Json& t = body["timings"];
  EXPECT_GT(t["draft_n"].get<int64_t>(), 0) << t;
  EXPECT_GT(t["draft_n_accepted"].get<int64_t>(), 0) << t;
  EXPECT_LE(t["draft_n_accepted"].get<int64_t>(), t["draft_n"].get<int64_t>()) << t;
  EXPECT_EQ(t["predicted_n"], want.n_generated);
  Json streamed = request;
  streamed["stream"] = true;
  std::string text;
  for (const std::string& event : stream("/v1/completions", streamed)) {
    if (event == "[DONE]") break;
    const Json chunk = Json::parse(event);
    if (!chunk["choices"].empty()) text += chunk["choices"][0]["text"].get<std::string>();
  }
  EXPECT_EQ(text, text_of(want));
  qhx_string_free(want.text);
  const auto sampled =
      post("/v1/completions", Json{{"prompt", prompt}, {"max_tokens", 12}, {"temperature", 1.0}});
  EXPECT_EQ(sampled.first, 200) << sampled.second;
  // "draft" needs a model opened with a draft model.
  ServerOptions without_draft;
  without_draft.speculative = "draft";
  EXPECT_THROW(Server(model_, without_draft), std::runtime_error);
}

TEST_F(ServerTest, StreamedCompletionCarriesTheSameText) {
  start();
  const Json request = {{"prompt", "In the beginning"}, {"max_tokens", 10}, {"temperature", 0}};
  const auto whole = post("/v1/completions", request);
  ASSERT_EQ(whole.first, 200) << whole.second;

  Json streamed_request = request;
  streamed_request["stream"] = true;
  streamed_request["stream_options"] = {{"include_usage", true}};
  const std::vector<std::string> events = stream("/v1/completions", streamed_request);
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events.back(), "[DONE]");
  std::string text;
  std::string finish;
  Json usage;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    const Json chunk = Json::parse(events[i], nullptr, false);
    ASSERT_TRUE(chunk.is_object()) << events[i];
    EXPECT_EQ(chunk["object"], "text_completion");
    EXPECT_EQ(chunk["id"], Json::parse(events[0])["id"]) << "one id for the whole stream";
    if (chunk["choices"].empty()) {  // the usage chunk comes last
      EXPECT_EQ(i + 2, events.size());
      usage = chunk["usage"];
      continue;
    }
    EXPECT_TRUE(finish.empty()) << "text after the finish reason";
    text += chunk["choices"][0]["text"].get<std::string>();
    if (!chunk["choices"][0]["finish_reason"].is_null()) {
      finish = chunk["choices"][0]["finish_reason"];
    }
  }
  EXPECT_EQ(text, whole.second["choices"][0]["text"]);
  EXPECT_EQ(finish, whole.second["choices"][0]["finish_reason"]);
  EXPECT_EQ(usage, whole.second["usage"]);
}

TEST_F(ServerTest, ChatMatchesTheCApiAndStreams) {
  const Json messages = Json::array({{{"role", "user"}, {"content", "Who begat Enos?"}}});
  const auto prompt = chat_tokens(messages);
  if (!prompt) GTEST_SKIP() << "no chat template engine in this build: " << qhx_last_error();
  start();
  const Json request = {{"messages", messages}, {"max_completion_tokens", 12}, {"temperature", 0}};
  const auto [status, body] = post("/v1/chat/completions", request);
  ASSERT_EQ(status, 200) << body;
  const qhx_generate_result want = direct(*prompt, 12);
  EXPECT_EQ(body["object"], "chat.completion");
  const Json& choice = body["choices"][0];
  EXPECT_EQ(choice["message"]["role"], "assistant");
  EXPECT_EQ(choice["message"]["content"], text_of(want));
  EXPECT_EQ(choice["finish_reason"], want.stop_reason == QHX_STOP_LENGTH ? "length" : "stop");
  expect_usage(body["usage"], static_cast<int64_t>(prompt->size()), want.n_generated);
  qhx_string_free(want.text);

  Json streamed_request = request;
  streamed_request["stream"] = true;
  const std::vector<std::string> events = stream("/v1/chat/completions", streamed_request);
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events.back(), "[DONE]");
  const Json first = Json::parse(events[0]);
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  std::string text;
  for (size_t i = 1; i + 1 < events.size(); ++i) {
    const Json delta = Json::parse(events[i])["choices"][0]["delta"];
    if (delta.contains("content")) text += delta["content"].get<std::string>();
  }
  EXPECT_EQ(text, choice["message"]["content"]);
  EXPECT_EQ(Json::parse(events[events.size() - 2])["choices"][0]["finish_reason"],
            choice["finish_reason"]);

  // The next turn resends the history: only what follows the first prompt is processed.
  Json history = messages;
  history.push_back(choice["message"]);
  history.push_back({{"role", "user"}, {"content", "And Seth?"}});
  const auto next = post("/v1/chat/completions",
                         Json{{"messages", history}, {"max_tokens", 4}, {"temperature", 0}});
  ASSERT_EQ(next.first, 200) << next.second;
  const Json& t = next.second["timings"];
  EXPECT_GE(t["cache_n"].get<int64_t>(), static_cast<int64_t>(prompt->size()));
  EXPECT_EQ(t["prompt_n"].get<int64_t>() + t["cache_n"].get<int64_t>(),
            next.second["usage"]["prompt_tokens"].get<int64_t>());
}

// The KJV models never write <think> or <tool_call> of themselves: a logit bias makes them.
constexpr const char* kThinkToken = "151667";     // "<think>" in the Qwen3 vocabulary
constexpr const char* kToolCallToken = "151657";  // "<tool_call>"

// A streamed chat answer, added up: reasoning, content, tool call deltas, the finish reason.
struct StreamedChat {
  std::string reasoning, content, finish;
  Json tool_calls = Json::array();
};

StreamedChat add_up(const std::vector<std::string>& events) {
  StreamedChat s;
  EXPECT_FALSE(events.empty());
  if (events.empty()) return s;
  EXPECT_EQ(events.back(), "[DONE]");
  for (size_t i = 1; i + 1 < events.size(); ++i) {
    const Json choice = Json::parse(events[i])["choices"][0];
    const Json& delta = choice["delta"];
    EXPECT_TRUE(s.finish.empty()) << "a delta after the finish reason";
    if (delta.contains("reasoning_content")) s.reasoning += delta["reasoning_content"];
    if (delta.contains("content")) s.content += delta["content"];
    if (delta.contains("tool_calls")) s.tool_calls.push_back(delta["tool_calls"][0]);
    if (!choice["finish_reason"].is_null()) s.finish = choice["finish_reason"];
  }
  return s;
}

TEST_F(ServerTest, ReasoningIsSplitOff) {
  const Json messages = Json::array({{{"role", "user"}, {"content", "Who begat Enos?"}}});
  if (!chat_tokens(messages)) GTEST_SKIP() << "no chat template engine in this build";
  start(1);
  // The Qwen3 template leaves the <think> to the model: the first one opens the block, and the
  // answer is cut off inside it.
  const Json request = {{"messages", messages},
                        {"max_tokens", 3},
                        {"temperature", 0},
                        {"logit_bias", {{kThinkToken, 100}}}};
  const auto [status, body] = post("/v1/chat/completions", request);
  ASSERT_EQ(status, 200) << body;
  const Json& message = body["choices"][0]["message"];
  EXPECT_EQ(message["reasoning_content"], "<think><think>");
  EXPECT_EQ(message["content"], "");
  EXPECT_FALSE(message.contains("tool_calls"));
  EXPECT_EQ(body["choices"][0]["finish_reason"], "length");

  Json raw = request;
  raw["reasoning_format"] = "none";
  const auto unsplit = post("/v1/chat/completions", raw);
  ASSERT_EQ(unsplit.first, 200) << unsplit.second;
  EXPECT_EQ(unsplit.second["choices"][0]["message"]["content"], "<think><think><think>");
  EXPECT_FALSE(unsplit.second["choices"][0]["message"].contains("reasoning_content"));
  expect_error(post("/v1/chat/completions", Json{{"messages", messages}, {"reasoning_format", 1}}),
               400, "reasoning_format", "invalid_type");
  expect_error(
      post("/v1/chat/completions", Json{{"messages", messages}, {"reasoning_format", "x"}}), 400,
      "reasoning_format", "invalid_value");

  Json streamed = request;
  streamed["stream"] = true;
  const StreamedChat s = add_up(stream("/v1/chat/completions", streamed));
  EXPECT_EQ(s.reasoning, message["reasoning_content"]);
  EXPECT_EQ(s.content, "");
  EXPECT_EQ(s.finish, "length");
}

// With tools, a <tool_call> that never closes is text, streamed or not.
TEST_F(ServerTest, UnfinishedToolCallStaysContent) {
  const Json messages = Json::array({{{"role", "user"}, {"content", "Find Genesis 5."}}});
  if (!chat_tokens(messages)) GTEST_SKIP() << "no chat template engine in this build";
  start(1);
  const Json tools = Json::array(
      {{{"type", "function"},
        {"function",
         {{"name", "find_verse"}, {"parameters", {{"type", "object"}, {"properties", {}}}}}}}});
  const Json request = {{"messages", messages},
                        {"tools", tools},
                        {"max_tokens", 3},
                        {"temperature", 0},
                        {"logit_bias", {{kToolCallToken, 100}}}};
  const auto [status, body] = post("/v1/chat/completions", request);
  ASSERT_EQ(status, 200) << body;
  const Json& message = body["choices"][0]["message"];
  EXPECT_EQ(message["content"], "<tool_call><tool_call><tool_call>");
  EXPECT_FALSE(message.contains("tool_calls"));
  EXPECT_EQ(body["choices"][0]["finish_reason"], "length");

  Json streamed = request;
  streamed["stream"] = true;
  const StreamedChat s = add_up(stream("/v1/chat/completions", streamed));
  EXPECT_EQ(s.content, message["content"]);
  EXPECT_TRUE(s.tool_calls.empty());
  EXPECT_EQ(s.finish, "length");
}

// The tool call a client got back, and the tool's result, make the next turn's prompt: rendered
// by the template with the call as the model wrote it.
TEST_F(ServerTest, ToolResultTurnRendersThroughTheTemplate) {
  const Json question = {{"role", "user"}, {"content", "Who begat Enos?"}};
  if (!chat_tokens(Json::array({question}))) GTEST_SKIP() << "no chat template engine";
  start(1);
  const Json tools = Json::array(
      {{{"type", "function"},
        {"function",
         {{"name", "find_verse"},
          {"parameters",
           {{"type", "object"},
            {"properties",
             {{"book", {{"type", "string"}}}, {"chapter", {{"type", "integer"}}}}}}}}}}});
  const std::string written =
      "<tool_call>\n{\"name\": \"find_verse\", \"arguments\": {\"book\": \"Genesis\", "
      "\"chapter\": 5}}\n</tool_call>";
  const std::string rendered =
      tool_round_trip(question, tools, written, {{"book", "Genesis"}, {"chapter", 5}},
                      "And Seth lived an hundred and five years");
  EXPECT_NE(rendered.find(written), std::string::npos) << rendered;
}

TEST_F(ServerTest, EightConcurrentStreamsAllComplete) {
  start(2, 8);
  const std::vector<std::string> prompts = {"And God said",     "Blessed are the", "The LORD is my",
                                            "In the beginning", "And Moses spake", "Thus saith the",
                                            "And Jesus said",   "Now the serpent"};
  std::vector<std::string> want;
  for (const std::string& p : prompts) {
    const qhx_generate_result r = direct(tokenize(p), 6);
    want.push_back(text_of(r));
    qhx_string_free(r.text);
  }
  std::vector<std::string> got(prompts.size());
  std::vector<char> done(prompts.size());  // not vector<bool>: one thread writes each element
  std::vector<std::thread> clients;
  for (size_t i = 0; i < prompts.size(); ++i) {
    clients.emplace_back([&, i] {
      const auto events = stream(
          "/v1/completions",
          Json{{"prompt", prompts[i]}, {"max_tokens", 6}, {"temperature", 0}, {"stream", true}});
      done[i] = !events.empty() && events.back() == "[DONE]";
      for (const std::string& e : events) {
        const Json chunk = Json::parse(e, nullptr, false);
        if (chunk.is_object() && !chunk["choices"].empty()) {
          got[i] += chunk["choices"][0]["text"].get<std::string>();
        }
      }
    });
  }
  for (auto& t : clients) t.join();
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_TRUE(done[i]) << prompts[i];
    EXPECT_EQ(got[i], want[i]) << prompts[i];
  }
  EXPECT_EQ(health()["slots_idle"], 2);
}

TEST_F(ServerTest, HangingUpFreesOnlyThatSlot) {
  start(2, 8);
  const std::string prompt = "And the earth was without form";
  const qhx_generate_result want = direct(tokenize(prompt), 24);
  // The other client streams to the end meanwhile, untouched by the hang-up.
  std::string other_text;
  std::thread other([&] {
    for (const std::string& e : stream(
             "/v1/completions",
             Json{{"prompt", prompt}, {"max_tokens", 24}, {"temperature", 0}, {"stream", true}})) {
      const Json chunk = Json::parse(e, nullptr, false);
      if (chunk.is_object()) other_text += chunk["choices"][0]["text"].get<std::string>();
    }
  });
  stream("/v1/completions", endless("And it came to pass"),
         [](size_t events) { return events < 3; });
  other.join();
  EXPECT_EQ(other_text, text_of(want));
  qhx_string_free(want.text);
  // ~4000 tokens would take far longer than this if the generation went on.
  EXPECT_TRUE(wait_for_health([](const Json& h) { return h["slots_idle"] == 2; }, 3s)) << health();
  const auto next = post("/v1/completions", Json{{"prompt", "And"}, {"max_tokens", 2}});
  EXPECT_EQ(next.first, 200) << next.second;
}

TEST_F(ServerTest, NonStreamingClientThatLeavesFreesTheSlot) {
  start(1, 8);
  std::thread leaver([&] {
    auto c = client();
    c.set_read_timeout(300ms);  // gives up long before the answer
    Json request = endless("And it came to pass");
    request.erase("stream");
    c.Post("/v1/completions", request.dump(), "application/json");
  });
  leaver.join();
  EXPECT_TRUE(wait_for_health([](const Json& h) { return h["slots_idle"] == 1; }, 3s)) << health();
}

TEST_F(ServerTest, FullQueueAnswers429) {
  start(1, 1);
  std::atomic<bool> hang_up{false};
  const auto until_hang_up = [&](size_t) { return !hang_up.load(); };
  std::thread running([&] { stream("/v1/completions", endless("And God said"), until_hang_up); });
  ASSERT_TRUE(wait_for_health([](const Json& h) { return h["slots_processing"] == 1; }, 10s));
  std::thread queued([&] { stream("/v1/completions", endless("Thus saith"), until_hang_up); });
  ASSERT_TRUE(wait_for_health([](const Json& h) { return h["queue_length"] == 1; }, 10s));

  auto c = client();
  const auto r = c.Post("/v1/completions", Json{{"prompt", "And"}, {"max_tokens", 2}}.dump(),
                        "application/json");
  ASSERT_TRUE(r);
  expect_error({r->status, Json::parse(r->body, nullptr, false)}, 429);
  EXPECT_TRUE(r->has_header("Retry-After"));

  hang_up = true;
  running.join();
  queued.join();
  EXPECT_TRUE(wait_for_health(
      [](const Json& h) { return h["slots_idle"] == 1 && h["queue_length"] == 0; }, 5s))
      << health();
}

TEST_F(ServerTest, BadRequestsGetOpenAiErrors) {
  start(1, 8, 65536);
  expect_error(post("/v1/completions", std::string("{\"prompt\": ")), 400);
  expect_error(post("/v1/completions", std::string("[1, 2]")), 400);
  expect_error(post("/v1/completions", std::string(200, '[') + std::string(200, ']')), 400);
  expect_error(post("/v1/completions", Json{{"prompt", "And"}, {"max_tokens", "ten"}}), 400,
               "max_tokens", "invalid_type");
  expect_error(post("/v1/completions", Json{{"prompt", "And"}, {"max_tokens", 0}}), 400,
               "max_tokens");
  expect_error(post("/v1/chat/completions", Json{{"messages", 5}}), 400, "messages",
               "invalid_type");
  expect_error(post("/v1/chat/completions", Json{{"max_tokens", 3}}), 400, "messages");
  expect_error(post("/v1/completions", Json{{"prompt", "And"}, {"temperature", "hot"}}), 400,
               "temperature", "invalid_type");
  expect_error(post("/v1/completions", Json{{"prompt", "And"}, {"top_p", 1.5}}), 400, "top_p");
  expect_error(post("/v1/completions", Json{{"prompt", "And"}, {"n", 2}}), 400, "n");
  expect_error(post("/v1/completions", Json{{"prompt", "And"}, {"stream", "yes"}}), 400, "stream");
  expect_error(post("/v1/completions", Json{{"prompt", "And"}, {"stop", 5}}), 400, "stop");
  expect_error(post("/v1/completions", Json{{"prompt", "And"}, {"logit_bias", {{"x", 1}}}}), 400,
               "logit_bias");
  expect_error(post("/v1/completions", Json{{"prompt", "And"}, {"seed", 1.5}}), 400, "seed");
  // Integers written as doubles beyond int64's range (the fuzzer's find: converting them was
  // undefined) are out of range like any other.
  for (const double huge : {1e300, -1e300, 9223372036854775808.0}) {
    expect_error(post("/v1/completions", Json{{"prompt", "And"}, {"max_tokens", huge}}), 400,
                 "max_tokens");
  }
  expect_error(post("/v1/completions", Json{{"prompt", Json::array({-1, 5})}}), 400, "prompt");
  expect_error(post("/v1/completions", Json{{"prompt", {{"a", 1}}}}), 400, "prompt");
  expect_error(post("/v1/completions", Json{{"prompt", ""}}), 400, "prompt");
  // The prompt plus the tokens asked for must fit the context; a prompt alone over it too.
  const std::vector<int32_t> long_prompt(kContext - 4, 785);
  expect_error(post("/v1/completions", Json{{"prompt", long_prompt}, {"max_tokens", 8}}), 400,
               "prompt", "context_length_exceeded");
  expect_error(post("/v1/completions", Json{{"prompt", std::vector<int32_t>(kContext + 1, 785)}}),
               400, "prompt", "context_length_exceeded");
  // The body limit (64 KiB here), and routes that do not exist.
  expect_error(post("/v1/completions", Json{{"prompt", std::string(70000, 'a')}}), 413);
  auto c = client();
  const auto missing = c.Get("/v1/nothing");
  ASSERT_TRUE(missing);
  expect_error({missing->status, Json::parse(missing->body, nullptr, false)}, 404);
  // Still serving after all that.
  EXPECT_EQ(post("/v1/completions", Json{{"prompt", "And"}, {"max_tokens", 2}}).first, 200);
  EXPECT_EQ(health()["slots_idle"], 1);
}

// A client that resends its conversation is served by the slot that holds it: only the new
// tokens go through the model, even after another conversation took the other slot.
TEST_F(ServerTest, ResentConversationReusesItsSlot) {
  start(2, 8);
  const auto turn = [&](const std::vector<int32_t>& prompt) {
    const auto [status, body] =
        post("/v1/completions", Json{{"prompt", prompt}, {"max_tokens", 6}, {"temperature", 0}});
    EXPECT_EQ(status, 200) << body;
    return body;
  };
  const std::vector<int32_t> a = tokenize("And the LORD spake unto Moses, saying,");
  const std::vector<int32_t> b = tokenize("Blessed are the poor in spirit: for theirs");
  const Json a1 = turn(a);
  const Json b1 = turn(b);
  EXPECT_EQ(b1["timings"]["cache_n"], 0);
  // b's second turn: its history, the reply, and more. The least recently used slot is a's.
  std::vector<int32_t> b2 = b;
  for (const int32_t id : tokenize(b1["choices"][0]["text"].get<std::string>())) b2.push_back(id);
  for (const int32_t id : tokenize(" And he said")) b2.push_back(id);
  const Json b2_answer = turn(b2);
  const int64_t reused = b2_answer["timings"]["cache_n"];
  EXPECT_GE(reused, static_cast<int64_t>(b.size()));
  EXPECT_EQ(b2_answer["timings"]["prompt_n"], static_cast<int64_t>(b2.size()) - reused);
  EXPECT_EQ(b2_answer["usage"]["prompt_tokens"], static_cast<int64_t>(b2.size()));
  // a's slot still holds a.
  std::vector<int32_t> a2 = a;
  for (const int32_t id : tokenize(" Speak unto the children")) a2.push_back(id);
  EXPECT_GE(turn(a2)["timings"]["cache_n"], static_cast<int64_t>(a.size()));
}

// The same server on a model with the real Qwen3.5 vocabulary and chat template.
class Qwen35ServerTest : public ServerTest {
 protected:
  static void SetUpTestSuite() {
    open_model((test::source_dir() / "models/qwen3.5-tiny-random").string());
  }
};

// Qwen3.5's XML tool calls: what the model writes becomes OpenAI tool_calls (arguments typed by
// the tool's schema), and sent back with the tool's result it renders as the model wrote it.
TEST_F(Qwen35ServerTest, XmlToolCallRoundTrip) {
  start(1);
  const Json question = {{"role", "user"}, {"content", "Weather in Paris for 3 days?"}};
  const Json tools =
      Json::array({{{"type", "function"},
                    {"function",
                     {{"name", "get_weather"},
                      {"parameters",
                       {{"type", "object"},
                        {"properties",
                         {{"city", {{"type", "string"}}}, {"days", {{"type", "integer"}}}}}}}}}}});
  const std::string written =
      "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
      "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>";
  const std::string rendered =
      tool_round_trip(question, tools, written, {{"city", "Paris"}, {"days", 3}}, "Sunny, 21 C");
  // After the query the call gets an (empty) think block, and the response a user turn.
  EXPECT_NE(rendered.find("<think>\n\n</think>\n\n" + written + "<|im_end|>"), std::string::npos)
      << rendered;
  EXPECT_NE(rendered.find("<|im_start|>user\n<tool_response>\nSunny, 21 C"), std::string::npos)
      << rendered;
}

// Qwen3.5's template opens the think block itself when thinking is asked for (the prompt ends in
// "<think>\n"), and closes it empty otherwise: the reasoning is split off in the first case only.
TEST_F(Qwen35ServerTest, ReasoningFollowsEnableThinking) {
  start(1);
  const Json messages = Json::array({{{"role", "user"}, {"content", "Hello"}}});
  Json request = {{"messages", messages},
                  {"max_tokens", 2},
                  {"temperature", 0},
                  {"logit_bias", {{"248069", 100}}}};  // "</think>"
  request["chat_template_kwargs"] = {{"enable_thinking", true}};
  const auto thinking = post("/v1/chat/completions", request);
  ASSERT_EQ(thinking.first, 200) << thinking.second;
  const Json& opened = thinking.second["choices"][0]["message"];
  EXPECT_EQ(opened["reasoning_content"], "") << opened;
  EXPECT_EQ(opened["content"], "</think>") << opened;
  EXPECT_EQ(thinking.second["usage"]["prompt_tokens"],
            static_cast<int64_t>(tokenize("<|im_start|>user\nHello<|im_end|>\n"
                                          "<|im_start|>assistant\n<think>\n")
                                     .size()));

  request.erase("chat_template_kwargs");
  const auto plain = post("/v1/chat/completions", request);
  ASSERT_EQ(plain.first, 200) << plain.second;
  const Json& closed = plain.second["choices"][0]["message"];
  EXPECT_FALSE(closed.contains("reasoning_content")) << closed;
  EXPECT_EQ(closed["content"], "</think></think>") << closed;
}

// A 4-turn chat over HTTP: each turn processes only what the slot has not seen (the template
// drops the empty think block of earlier replies, so the last reply is rerun from its header).
TEST_F(Qwen35ServerTest, FourTurnChatProcessesOnlyNewTokens) {
  start(1);
  Json messages = Json::array();
  int64_t previous_prompt = 0;
  for (const char* question : {"Hello", "Name a colour.", "And another?", "Thanks."}) {
    messages.push_back({{"role", "user"}, {"content", question}});
    const auto [status, body] =
        post("/v1/chat/completions",
             Json{{"messages", messages}, {"max_tokens", 8}, {"temperature", 0}});
    ASSERT_EQ(status, 200) << body;
    const int64_t prompt = body["usage"]["prompt_tokens"], reused = body["timings"]["cache_n"];
    EXPECT_EQ(body["timings"]["prompt_n"], prompt - reused);
    if (previous_prompt > 0) {
      // Up to the previous generation prompt's "<|im_start|>assistant\n<think>\n\n</think>\n\n".
      EXPECT_EQ(reused, previous_prompt - 7) << body;
    }
    previous_prompt = prompt;
    messages.push_back(body["choices"][0]["message"]);
    messages.back().erase("reasoning_content");
  }
}

// /v1/embeddings on the tiny Qwen3-Embedding fixture: the C API's vectors, to the bit.
class EmbeddingServerTest : public ServerTest {
 protected:
  static void SetUpTestSuite() {
    open_model((test::source_dir() / "tests/fixtures/embedding/qwen3_tiny").string(), 512);
  }
  // qhx_embed's vectors on a fresh session.
  static std::vector<float> direct_embed(const std::vector<std::string>& texts,
                                         const char* prompt_name) {
    qhx_session* session = nullptr;
    EXPECT_EQ(qhx_session_create(model_, nullptr, &session), QHX_OK) << qhx_last_error();
    qhx_embed_options o;
    qhx_embed_options_default(&o);
    o.prompt_name = prompt_name;
    std::vector<const char*> pointers;
    for (const std::string& t : texts) pointers.push_back(t.c_str());
    std::vector<float> out(texts.size() * 64);
    EXPECT_EQ(qhx_embed(session, pointers.data(), nullptr, texts.size(), &o, out.data(), out.size(),
                        nullptr),
              QHX_OK)
        << qhx_last_error();
    qhx_session_destroy(session);
    return out;
  }
};

std::vector<float> decode_base64_floats(const std::string& text) {
  static const std::string alphabet =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string bytes;
  uint32_t bits = 0;
  int n = 0;
  for (const char c : text) {
    if (c == '=') break;
    bits = (bits << 6) | static_cast<uint32_t>(alphabet.find(c));
    if ((n += 6) >= 8) bytes += static_cast<char>((bits >> (n -= 8)) & 0xff);
  }
  std::vector<float> out(bytes.size() / sizeof(float));
  std::memcpy(out.data(), bytes.data(), out.size() * sizeof(float));
  return out;
}

TEST_F(EmbeddingServerTest, VectorsAreTheCApis) {
  start(2);
  const std::vector<std::string> queries = {"What is the capital of China?", "Explain gravity"};
  const std::vector<float> want = direct_embed(queries, "query");
  const auto [status, body] =
      post("/v1/embeddings", Json{{"input", queries}, {"prompt_name", "query"}});
  ASSERT_EQ(status, 200) << body;
  EXPECT_EQ(body["object"], "list");
  EXPECT_EQ(body["model"], "qwen3_tiny");
  ASSERT_EQ(body["data"].size(), 2u);
  std::vector<float> got;
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(body["data"][i]["index"], i);
    EXPECT_EQ(body["data"][i]["object"], "embedding");
    for (const auto& v : body["data"][i]["embedding"]) got.push_back(v.get<float>());
  }
  EXPECT_EQ(got, want);
  EXPECT_GT(body["usage"]["prompt_tokens"].get<int64_t>(), 40);
  EXPECT_EQ(body["usage"]["total_tokens"], body["usage"]["prompt_tokens"]);

  // What the openai client asks for by default: base64 of the float32 bytes.
  const auto [status64, body64] =
      post("/v1/embeddings",
           Json{{"input", queries}, {"prompt_name", "query"}, {"encoding_format", "base64"}});
  ASSERT_EQ(status64, 200) << body64;
  std::vector<float> decoded;
  for (const auto& d : body64["data"]) {
    const std::vector<float> v = decode_base64_floats(d["embedding"].get<std::string>());
    decoded.insert(decoded.end(), v.begin(), v.end());
  }
  EXPECT_EQ(decoded, want);

  // One string; its token ids (as the tokenizer gives them, <|endoftext|> included) alone.
  const std::vector<float> document = direct_embed({"The capital of China is Beijing."}, nullptr);
  const auto [status1, one] =
      post("/v1/embeddings", Json{{"input", "The capital of China is Beijing."}});
  ASSERT_EQ(status1, 200) << one;
  EXPECT_EQ(one["data"][0]["embedding"].get<std::vector<float>>(), document);
  const Json ids = read_json_file(test::source_dir() /
                                  "tests/fixtures/embedding/qwen3_tiny/golden.json")["ids"][2];
  const auto [status_ids, by_ids] = post("/v1/embeddings", Json{{"input", Json::array({ids})}});
  ASSERT_EQ(status_ids, 200) << by_ids;
  EXPECT_EQ(by_ids["data"][0]["embedding"].get<std::vector<float>>(), document);
  const auto [status_cut, cut] = post("/v1/embeddings", Json{{"input", "x"}, {"dimensions", 8}});
  ASSERT_EQ(status_cut, 200) << cut;
  EXPECT_EQ(cut["data"][0]["embedding"].size(), 8u);
}

TEST_F(EmbeddingServerTest, BadRequestsGetOpenAiErrors) {
  start(1);
  const auto error_of = [&](const Json& body) {
    const auto [status, answer] = post("/v1/embeddings", body);
    return std::to_string(status) + " " + answer["error"]["message"].get<std::string>();
  };
  EXPECT_EQ(error_of(Json::object()), "400 'input' is required");
  EXPECT_EQ(error_of({{"input", Json::array()}}),
            "400 'input' must be a string, or a non-empty array of strings or of token ids");
  EXPECT_EQ(error_of({{"input", {"a", Json::array({1})}}}),
            "400 'input[1]' must be of the same kind as input[0] (a string, or an array of ids)");
  EXPECT_EQ(error_of({{"input", {1, 99999}}}), "400 'input' must hold token ids from 0 to 2111");
  EXPECT_EQ(error_of({{"input", "x"}, {"dimensions", 65}}),
            "400 'dimensions' must be an integer from 1 to 64");
  EXPECT_EQ(error_of({{"input", "x"}, {"encoding_format", "int8"}}),
            "400 'encoding_format' must be \"float\" or \"base64\"");
  EXPECT_EQ(error_of({{"input", {1, 2}}, {"prompt_name", "query"}}),
            "400 'prompt' applies to text inputs, not to token ids");
  EXPECT_EQ(error_of({{"input", "x"}, {"prompt_name", "passage"}}),
            "400 prompt_name: 'passage' is not one of the model's prompts (document, query)");
  EXPECT_EQ(error_of({{"input", "x"}, {"model", "other"}}).substr(0, 4), "404 ");
  // A long text is cut to max_seq_length (512), as sentence-transformers cuts it.
  const auto [long_status, long_answer] =
      post("/v1/embeddings", Json{{"input", std::string(20000, 'a')}});
  EXPECT_EQ(long_status, 200) << long_answer;
  EXPECT_EQ(long_answer["usage"]["prompt_tokens"], 512);
  EXPECT_EQ(error_of({{"input", std::vector<std::string>(2049, "a")}}),
            "400 'input' has 2049 inputs, more than 2048");
  // One input of ids is bounded by the context alone.
  EXPECT_EQ(error_of({{"input", std::vector<int>(600, 5)}}),
            "400 input[0] has 600 tokens, more than the context length (512)");
  auto c = client();
  const auto r = c.Get("/v1/embeddings");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 405);
}

// A Qwen3.5 checkpoint with a vision tower (tests/fixtures/vision): image_url parts with data:
// URLs are read as transformers' processor reads the conversation.
class VisionServerTest : public ServerTest {
 protected:
  static void SetUpTestSuite() { open_model(kVision.string(), 512); }
  static inline const std::filesystem::path kVision =
      test::source_dir() / "tests/fixtures/vision/tied_bf16";
};

TEST_F(VisionServerTest, AnImageUrlDataUrlIsReadAsTheProcessorReadsIt) {
  start(1);
  const Json golden = read_json_file(kVision / "chat.json");
  const Json& chat = golden["chats"]["one_image"];
  const MappedFile png(kVision.parent_path() / "images/rgb_256x320.png");
  const std::string url = "data:image/png;base64," + base64_encode(png.bytes());
  const auto ask = [&](const std::string& image_url) {
    return post(
        "/v1/chat/completions",
        Json{{"messages",
              {{{"role", "user"},
                {"content",
                 {{{"type", "image_url"}, {"image_url", {{"url", image_url}}}},
                  {{"type", "text"}, {"text", chat["messages"][0]["content"][1]["text"]}}}}}}},
             {"temperature", 0},
             {"max_tokens", golden["max_new_tokens"]}});
  };
  const auto [status, body] = ask(url);
  ASSERT_EQ(status, 200) << body;
  EXPECT_EQ(body["choices"][0]["message"]["content"], chat["reply_text"]) << body;
  expect_usage(body["usage"], static_cast<int64_t>(chat["ids"].size()),
               static_cast<int64_t>(chat["greedy"].size()));
  // The same conversation again reuses its state, the image's tokens included.
  const auto [again_status, again] = ask(url);
  ASSERT_EQ(again_status, 200) << again;
  EXPECT_EQ(again["choices"][0]["message"], body["choices"][0]["message"]);
  EXPECT_GT(again["timings"]["cache_n"].get<int64_t>(), 12) << again["timings"];

  expect_error(ask("https://example.com/a.png"), 400, "messages[0].content[0].image_url.url",
               "invalid_value");
  expect_error(ask("data:image/png;base64," + base64_encode(png.bytes().first(100))), 400,
               "messages[0].content[0]");
}

}  // namespace
}  // namespace qhx::server
